/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvml_client - an NVML client for tests: prints one JSON object on stdout.
 *
 *   nvml_client info [LAST_SEEN_US]   everything a monitoring tool asks for, per device
 *   nvml_client errors                return codes of misuse (before init, bad handles, ...)
 *   nvml_client layout                sizes/offsets of the NVML structs in vgpu_cuda.h
 *
 * Linked against libnvidia-ml.so.1 by symbol like an old-style client; at run
 * time LD_LIBRARY_PATH picks simgpu or a real driver, and LD_PRELOAD may add
 * libvgpu. A section whose call fails reads {"error": CODE, "message": STR}
 * and the exit status is then 1, so a test sees what failed and where.
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vgpu_cuda.h"

static int g_failed;

/* Strings from NVML are ids and names; escape what JSON requires anyway. */
static void put_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void put_error(nvmlReturn_t rc)
{
    printf("{\"error\": %d, \"message\": ", rc);
    put_str(nvmlErrorString(rc));
    putchar('}');
    g_failed = 1;
}

static void put_key(const char *key)
{
    put_str(key);
    fputs(": ", stdout);
}

static void put_memory(nvmlDevice_t h)
{
    nvmlMemory_t m;
    nvmlReturn_t rc = nvmlDeviceGetMemoryInfo(h, &m);
    put_key("memory");
    if (rc != NVML_SUCCESS)
        put_error(rc);
    else
        printf("{\"total\": %llu, \"free\": %llu, \"used\": %llu}", m.total, m.free, m.used);
    fputs(", ", stdout);

    nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
    rc = nvmlDeviceGetMemoryInfo_v2(h, &m2);
    put_key("memory_v2");
    if (rc != NVML_SUCCESS)
        put_error(rc);
    else
        printf("{\"total\": %llu, \"reserved\": %llu, \"free\": %llu, \"used\": %llu}", m2.total, m2.reserved,
               m2.free, m2.used);
}

static void put_processes(nvmlDevice_t h)
{
    put_key("processes");
    /* The usual two-step: ask for the count, then fetch with room to spare. */
    unsigned n = 0;
    nvmlReturn_t rc = nvmlDeviceGetComputeRunningProcesses_v3(h, &n, NULL);
    if (rc == NVML_SUCCESS) {
        fputs("[]", stdout);
        return;
    }
    if (rc != NVML_ERROR_INSUFFICIENT_SIZE) {
        put_error(rc);
        return;
    }
    n = n * 2 + 5;
    nvmlProcessInfo_t *p = calloc(n, sizeof(*p));
    rc = p ? nvmlDeviceGetComputeRunningProcesses_v3(h, &n, p) : NVML_ERROR_MEMORY;
    if (rc != NVML_SUCCESS) {
        put_error(rc);
    } else {
        putchar('[');
        for (unsigned i = 0; i < n; i++)
            printf("%s{\"pid\": %u, \"used_memory\": %llu}", i ? ", " : "", p[i].pid, p[i].usedGpuMemory);
        putchar(']');
    }
    free(p);
}

static void put_process_utilization(nvmlDevice_t h, unsigned long long last_seen_us)
{
    put_key("process_utilization");
    unsigned n = 0;
    nvmlReturn_t rc = nvmlDeviceGetProcessUtilization(h, NULL, &n, last_seen_us);
    if (rc == NVML_ERROR_NOT_FOUND || (rc == NVML_SUCCESS && n == 0)) {
        fputs("[]", stdout); /* no sample since last_seen: nothing ran */
        return;
    }
    if (rc != NVML_ERROR_INSUFFICIENT_SIZE) {
        put_error(rc);
        return;
    }
    n += 4;
    nvmlProcessUtilizationSample_t *s = calloc(n, sizeof(*s));
    rc = s ? nvmlDeviceGetProcessUtilization(h, s, &n, last_seen_us) : NVML_ERROR_MEMORY;
    if (rc == NVML_ERROR_NOT_FOUND) {
        fputs("[]", stdout);
    } else if (rc != NVML_SUCCESS) {
        put_error(rc);
    } else {
        putchar('[');
        for (unsigned i = 0; i < n; i++)
            printf("%s{\"pid\": %u, \"timestamp\": %llu, \"sm_util\": %u, \"mem_util\": %u}", i ? ", " : "",
                   s[i].pid, s[i].timeStamp, s[i].smUtil, s[i].memUtil);
        putchar(']');
    }
    free(s);
}

/* Index of the device a lookup by UUID (pci = 0) or PCI bus id returned, or -1. */
static int index_of(const char *id, int pci)
{
    nvmlDevice_t h;
    unsigned idx;
    nvmlReturn_t rc = pci ? nvmlDeviceGetHandleByPciBusId_v2(id, &h) : nvmlDeviceGetHandleByUUID(id, &h);
    if (rc != NVML_SUCCESS || nvmlDeviceGetIndex(h, &idx) != NVML_SUCCESS)
        return -1;
    return (int)idx;
}

static void put_device(unsigned i, unsigned long long last_seen_us)
{
    nvmlDevice_t h;
    nvmlReturn_t rc = nvmlDeviceGetHandleByIndex_v2(i, &h);
    if (rc != NVML_SUCCESS) {
        put_error(rc);
        return;
    }
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = "", name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = "";
    unsigned index = 0, minor = 0;
    nvmlPciInfo_t pci = {0};
    nvmlReturn_t r[5] = {
        nvmlDeviceGetUUID(h, uuid, sizeof(uuid)),
        nvmlDeviceGetName(h, name, sizeof(name)),
        nvmlDeviceGetIndex(h, &index),
        nvmlDeviceGetMinorNumber(h, &minor),
        nvmlDeviceGetPciInfo_v3(h, &pci),
    };
    for (int k = 0; k < 5; k++) {
        if (r[k] != NVML_SUCCESS) {
            put_error(r[k]);
            return;
        }
    }
    printf("{\"index\": %u, \"uuid\": ", index);
    put_str(uuid);
    fputs(", \"name\": ", stdout);
    put_str(name);
    printf(", \"minor\": %u, \"pci_bus_id\": ", minor);
    put_str(pci.busId);

    printf(", \"by_uuid\": %d", index_of(uuid, 0));
    printf(", \"by_pci_bus_id\": %d, ", index_of(pci.busId, 1));

    put_memory(h);

    fputs(", ", stdout);
    put_key("utilization");
    nvmlUtilization_t u;
    rc = nvmlDeviceGetUtilizationRates(h, &u);
    if (rc != NVML_SUCCESS)
        put_error(rc);
    else
        printf("{\"gpu\": %u, \"memory\": %u}", u.gpu, u.memory);

    fputs(", ", stdout);
    put_key("compute_capability");
    int major, minor_cc;
    rc = nvmlDeviceGetCudaComputeCapability(h, &major, &minor_cc);
    if (rc != NVML_SUCCESS)
        put_error(rc);
    else
        printf("[%d, %d]", major, minor_cc);

    fputs(", ", stdout);
    put_processes(h);
    fputs(", ", stdout);
    put_process_utilization(h, last_seen_us);
    putchar('}');
}

static int cmd_info(unsigned long long last_seen_us)
{
    nvmlReturn_t rc = nvmlInit_v2();
    if (rc != NVML_SUCCESS) {
        printf("{\"pid\": %d, \"init\": ", (int)getpid());
        put_error(rc);
        puts("}");
        return 1;
    }
    char ver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = "";
    int cuda = 0;
    unsigned count = 0, count_v1 = 0;
    printf("{\"pid\": %d, \"driver_version\": ", (int)getpid());
    rc = nvmlSystemGetDriverVersion(ver, sizeof(ver));
    if (rc != NVML_SUCCESS)
        put_error(rc);
    else
        put_str(ver);
    fputs(", \"cuda_driver_version\": ", stdout);
    rc = nvmlSystemGetCudaDriverVersion_v2(&cuda);
    if (rc != NVML_SUCCESS)
        put_error(rc);
    else
        printf("%d", cuda);
    rc = nvmlDeviceGetCount(&count_v1);
    if (rc != NVML_SUCCESS)
        g_failed = 1;
    rc = nvmlDeviceGetCount_v2(&count);
    if (rc != NVML_SUCCESS)
        g_failed = 1;
    printf(", \"count\": %u, \"count_v1\": %u, \"devices\": [", count, count_v1);
    for (unsigned i = 0; i < count; i++) {
        if (i)
            fputs(", ", stdout);
        put_device(i, last_seen_us);
    }
    puts("]}");
    rc = nvmlShutdown();
    if (rc != NVML_SUCCESS)
        g_failed = 1;
    return g_failed;
}

/* ---- errors: each entry is the return code of one misuse ---- */

static int g_first = 1;
static void put_rc(const char *what, nvmlReturn_t rc)
{
    printf("%s\n  ", g_first ? "" : ",");
    g_first = 0;
    put_key(what);
    printf("%d", rc);
}

static int cmd_errors(void)
{
    nvmlDevice_t h = NULL;
    unsigned n = 0;
    char buf[128];
    nvmlMemory_t m;
    fputs("{", stdout);

    put_rc("before_init_count", nvmlDeviceGetCount_v2(&n));
    put_rc("before_init_driver_version", nvmlSystemGetDriverVersion(buf, sizeof(buf)));
    put_rc("before_init_handle", nvmlDeviceGetHandleByIndex_v2(0, &h));
    put_rc("before_init_memory", nvmlDeviceGetMemoryInfo(h, &m));
    put_rc("before_init_shutdown", nvmlShutdown());

    put_rc("init", nvmlInit_v2());
    put_rc("count", nvmlDeviceGetCount_v2(&n));
    put_rc("count_null", nvmlDeviceGetCount_v2(NULL));
    put_rc("handle_out_of_range", nvmlDeviceGetHandleByIndex_v2(n, &h));
    put_rc("handle_null_out", nvmlDeviceGetHandleByIndex_v2(0, NULL));
    put_rc("uuid_unknown", nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000", &h));
    put_rc("uuid_null", nvmlDeviceGetHandleByUUID(NULL, &h));
    put_rc("pci_unknown", nvmlDeviceGetHandleByPciBusId_v2("00000000:FF:00.0", &h));
    put_rc("pci_garbage", nvmlDeviceGetHandleByPciBusId_v2("not-a-bus-id", &h));

    /* A handle that was never returned by NVML must be refused, not followed. */
    struct { unsigned long long junk[8]; } fake = {{0}};
    put_rc("bogus_handle_memory", nvmlDeviceGetMemoryInfo((nvmlDevice_t)(void *)&fake, &m));
    put_rc("null_handle_memory", nvmlDeviceGetMemoryInfo(NULL, &m));
    put_rc("null_handle_name", nvmlDeviceGetName(NULL, buf, sizeof(buf)));

    put_rc("handle", nvmlDeviceGetHandleByIndex_v2(0, &h));
    put_rc("memory_null", nvmlDeviceGetMemoryInfo(h, NULL));
    nvmlMemory_v2_t m2 = {.version = 0};
    put_rc("memory_v2_version_0", nvmlDeviceGetMemoryInfo_v2(h, &m2));
    m2.version = (unsigned)(sizeof(nvmlMemory_v2_t) | (1u << 24));
    put_rc("memory_v2_version_1", nvmlDeviceGetMemoryInfo_v2(h, &m2));
    m2.version = nvmlMemory_v2;
    put_rc("memory_v2_ok", nvmlDeviceGetMemoryInfo_v2(h, &m2));
    put_rc("name_short_buffer", nvmlDeviceGetName(h, buf, 4));
    put_rc("uuid_short_buffer", nvmlDeviceGetUUID(h, buf, 8));
    put_rc("driver_version_short_buffer", nvmlSystemGetDriverVersion(buf, 2));
    put_rc("utilization_null", nvmlDeviceGetUtilizationRates(h, NULL));
    put_rc("procs_null_count", nvmlDeviceGetComputeRunningProcesses_v3(h, NULL, NULL));
    n = 0;
    put_rc("procs_query_idle", nvmlDeviceGetComputeRunningProcesses_v3(h, &n, NULL));
    printf(",\n  \"procs_query_idle_count\": %u", n);
    put_rc("process_utilization_null_count", nvmlDeviceGetProcessUtilization(h, NULL, NULL, 0));
    n = 0;
    put_rc("process_utilization_idle", nvmlDeviceGetProcessUtilization(h, NULL, &n, 0));

    /* Looked up by name: a function simgpu leaves to its NOT_SUPPORTED stubs. */
    nvmlReturn_t (*fan)(nvmlDevice_t, unsigned *) =
        (nvmlReturn_t (*)(nvmlDevice_t, unsigned *))dlsym(RTLD_DEFAULT, "nvmlDeviceGetFanSpeed");
    put_rc("unimplemented_fan_speed", fan ? fan(h, &n) : NVML_ERROR_FUNCTION_NOT_FOUND);

    /* Reference counted: the library stays up until the last shutdown. */
    put_rc("init_again", nvmlInitWithFlags(0));
    put_rc("shutdown_1", nvmlShutdown());
    put_rc("count_after_one_shutdown", nvmlDeviceGetCount_v2(&n));
    put_rc("shutdown_2", nvmlShutdown());
    put_rc("count_after_shutdown", nvmlDeviceGetCount_v2(&n));
    put_rc("memory_after_shutdown", nvmlDeviceGetMemoryInfo(h, &m));
    put_rc("shutdown_3", nvmlShutdown());

    printf(",\n  \"string_2\": ");
    put_str(nvmlErrorString(NVML_ERROR_INVALID_ARGUMENT));
    printf(",\n  \"string_25\": ");
    put_str(nvmlErrorString(NVML_ERROR_ARGUMENT_VERSION_MISMATCH));
    printf(",\n  \"string_unknown\": ");
    put_str(nvmlErrorString(12345));
    puts("\n}");
    return 0;
}

/* ---- layout: sizes and offsets of the NVML structs, for tests that pin
 * vgpu_cuda.h to the bindings' own declarations ---- */

#define FIELD(T, f) printf("%s\"%s\": [%zu, %zu]", first ? "" : ", ", #f, offsetof(T, f), sizeof(((T *)0)->f)), first = 0
#define STRUCT(T, name, fields)                                   \
    do {                                                          \
        int first = 1;                                            \
        printf("%s\"%s\": {\"size\": %zu, \"fields\": {", sep, name, sizeof(T)); \
        fields;                                                   \
        fputs("}}", stdout);                                      \
        sep = ",\n  ";                                            \
    } while (0)

static int cmd_layout(void)
{
    const char *sep = "";
    fputs("{", stdout);
    STRUCT(nvmlMemory_t, "c_nvmlMemory_t", (FIELD(nvmlMemory_t, total), FIELD(nvmlMemory_t, free),
                                            FIELD(nvmlMemory_t, used)));
    STRUCT(nvmlMemory_v2_t, "c_nvmlMemory_v2_t",
           (FIELD(nvmlMemory_v2_t, version), FIELD(nvmlMemory_v2_t, total), FIELD(nvmlMemory_v2_t, reserved),
            FIELD(nvmlMemory_v2_t, free), FIELD(nvmlMemory_v2_t, used)));
    STRUCT(nvmlUtilization_t, "c_nvmlUtilization_t",
           (FIELD(nvmlUtilization_t, gpu), FIELD(nvmlUtilization_t, memory)));
    STRUCT(nvmlProcessInfo_t, "c_nvmlProcessInfo_v3_t",
           (FIELD(nvmlProcessInfo_t, pid), FIELD(nvmlProcessInfo_t, usedGpuMemory),
            FIELD(nvmlProcessInfo_t, gpuInstanceId), FIELD(nvmlProcessInfo_t, computeInstanceId)));
    STRUCT(nvmlProcessUtilizationSample_t, "c_nvmlProcessUtilizationSample_t",
           (FIELD(nvmlProcessUtilizationSample_t, pid), FIELD(nvmlProcessUtilizationSample_t, timeStamp),
            FIELD(nvmlProcessUtilizationSample_t, smUtil), FIELD(nvmlProcessUtilizationSample_t, memUtil),
            FIELD(nvmlProcessUtilizationSample_t, encUtil), FIELD(nvmlProcessUtilizationSample_t, decUtil)));
    STRUCT(nvmlPciInfo_t, "nvmlPciInfo_t",
           (FIELD(nvmlPciInfo_t, busIdLegacy), FIELD(nvmlPciInfo_t, domain), FIELD(nvmlPciInfo_t, bus),
            FIELD(nvmlPciInfo_t, device), FIELD(nvmlPciInfo_t, pciDeviceId), FIELD(nvmlPciInfo_t, pciSubSystemId),
            FIELD(nvmlPciInfo_t, busId)));
    printf("%s\"nvmlMemory_v2\": %u}\n", sep, nvmlMemory_v2);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "info") == 0 && argc <= 3)
        return cmd_info(argc == 3 ? strtoull(argv[2], NULL, 10) : 0);
    if (argc == 2 && strcmp(argv[1], "errors") == 0)
        return cmd_errors();
    if (argc == 2 && strcmp(argv[1], "layout") == 0)
        return cmd_layout();
    fprintf(stderr, "usage: nvml_client info [LAST_SEEN_US] | nvml_client errors | nvml_client layout\n");
    return 2;
}
