/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vg_glibc.h: what libvgpu.so asks of glibc, bound to the oldest versions that have it.
 *
 * libvgpu.so is preloaded into every process of a workload image, whatever glibc that
 * image has (UBI 8 has 2.28, Ubuntu 20.04 2.31), while it is built on the image's Debian 12
 * (2.36). Linked as is, it asks for dlopen@GLIBC_2.34, pthread_create@GLIBC_2.34,
 * stat@GLIBC_2.33 ... and the dynamic loader of an older glibc refuses the library, so
 * every process of the container fails to start. The Makefile force-includes this header
 * (-include) in libvgpu.so's sources: each symbol whose current default version is newer
 * than the baseline (the Makefile's GLIBC_BASELINE, checked by scripts/check-glibc.py)
 * is bound here to the version older glibcs export, which newer ones keep as a compat
 * symbol with the same behaviour; the link names libdl.so.2 and libpthread.so.0, where
 * those versions lived before 2.34. stat and fstat have no older symbol (before 2.33 they
 * were inline wrappers of __xstat): they are made here with the system calls glibc's own
 * use, on the same struct stat (64-bit x86 and Arm: the kernel's layout is glibc's).
 *
 * On an architecture listed here only; elsewhere it changes nothing and the baseline
 * check says what a build needs.
 */
#ifndef VG_GLIBC_H
#define VG_GLIBC_H

#include <features.h>

#if defined(__GLIBC__) && (defined(__x86_64__) || defined(__aarch64__))

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define VG_GLIBC_BASE "GLIBC_2.2.5"
#define VG_GLIBC_CLOCKATTR "GLIBC_2.3.3"
#else
#define VG_GLIBC_BASE "GLIBC_2.17" /* aarch64's first glibc */
#define VG_GLIBC_CLOCKATTR "GLIBC_2.17"
#endif

/* Only what libvgpu.so references (a version named for a symbol it defines, such as its
 * own dlsym, fails the link); scripts/check-glibc.py names any new one. */
__asm__(".symver dlopen,dlopen@" VG_GLIBC_BASE);
__asm__(".symver dlvsym,dlvsym@" VG_GLIBC_BASE);
__asm__(".symver pthread_create,pthread_create@" VG_GLIBC_BASE);
__asm__(".symver pthread_once,pthread_once@" VG_GLIBC_BASE);
__asm__(".symver pthread_sigmask,pthread_sigmask@" VG_GLIBC_BASE);
__asm__(".symver pthread_condattr_setclock,pthread_condattr_setclock@" VG_GLIBC_CLOCKATTR);

static inline int vg_glibc_stat(const char *path, struct stat *st)
{
    return (int)syscall(SYS_newfstatat, AT_FDCWD, path, st, 0);
}

static inline int vg_glibc_fstat(int fd, struct stat *st)
{
    return (int)syscall(SYS_fstat, fd, st);
}

/* Function-like: `struct stat` (no parenthesis after the name) is left alone. */
#define stat(path, st) vg_glibc_stat(path, st)
#define fstat(fd, st) vg_glibc_fstat(fd, st)

#endif
#endif
