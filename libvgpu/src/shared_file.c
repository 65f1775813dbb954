/* SPDX-License-Identifier: Apache-2.0 */
/*
 * shared_file.c - create a file that several processes map, atomically.
 *
 * Slice regions (SHARED mode) and scheduling regions are made by whichever
 * process needs them first. The file is sized, mapped and filled under a
 * temporary name and then link()ed into place: racing creators agree on one
 * file (the losers get EEXIST and open the winner's), and no reader ever maps
 * a half-made one.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vgpu_internal.h"

void *vg_create_linked(const char *path, size_t size, mode_t mode, int exact_mode, void (*fill)(void *, void *),
                       void *arg)
{
    char tmp[512];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp)) {
        errno = ENAMETOOLONG;
        return NULL;
    }
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0)
        return NULL;
    if (exact_mode)
        fchmod(fd, mode); /* whatever the creator's umask */
    void *m = ftruncate(fd, (off_t)size) == 0 ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                                             : MAP_FAILED;
    int err = errno;
    close(fd);
    if (m == MAP_FAILED) {
        unlink(tmp);
        errno = err;
        return NULL;
    }
    fill(m, arg);
    int rc = link(tmp, path);
    err = errno;
    unlink(tmp);
    if (rc == 0)
        return m;
    munmap(m, size);
    errno = err;
    return NULL;
}
