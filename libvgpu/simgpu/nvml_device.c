/* SPDX-License-Identifier: Apache-2.0 */
/* nvml_device.c - finding devices and their static properties (ids, PCI, capabilities). */
#include <stdio.h>
#include <strings.h>

#include "nvml_internal.h"

/* A plausible Hopper-class PCI identity: (device << 16) | NVIDIA's vendor id. */
#define SIMGPU_PCI_DEVICE_ID 0x233010deu
#define SIMGPU_PCI_SUBSYS_ID 0x16c110deu

SIMGPU_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    struct simgpu_state *st = vg_nvml_state();
    if (!st)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= st->ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (atomic_load(&st->dev[index].lost))
        return NVML_ERROR_GPU_IS_LOST; /* like the driver: not even a handle */
    *device = vg_nvml_handle(index);
    return NVML_SUCCESS;
}

/* simgpu's own control, not an NVML call: mark device index lost (1) or back (0)
 * for every process on the state file. Needs no nvmlInit. */
SIMGPU_API nvmlReturn_t simgpuDeviceSetLost(unsigned int index, int lost)
{
    struct simgpu_state *st = simgpu_state();
    if (!st)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (index >= st->ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    atomic_store(&st->dev[index].lost, lost ? 1u : 0u);
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    struct simgpu_state *st = vg_nvml_state();
    if (!st)
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < st->ndev; i++) {
        if (strcasecmp(uuid, st->dev[i].uuid) == 0) {
            *device = vg_nvml_handle(i);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* Accepts "domain:bus:device.function" (either domain width) and "bus:device.function". */
static int parse_bus_id(const char *s, unsigned *domain, unsigned *bus, unsigned *dev)
{
    unsigned fn;
    if (sscanf(s, "%x:%x:%x.%x", domain, bus, dev, &fn) == 4)
        return 0;
    *domain = 0;
    if (sscanf(s, "%x:%x.%x", bus, dev, &fn) == 3)
        return 0;
    return -1;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    struct simgpu_state *st = vg_nvml_state();
    if (!st)
        return NVML_ERROR_UNINITIALIZED;
    unsigned domain, bus, dev;
    if (!pciBusId || !device || parse_bus_id(pciBusId, &domain, &bus, &dev) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < st->ndev; i++) {
        if (domain == 0 && dev == 0 && bus == st->dev[i].pci_bus) {
            *device = vg_nvml_handle(i);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    struct simgpu_device *d;
    nvmlReturn_t rc = vg_nvml_device(device, &d, NULL);
    return rc != NVML_SUCCESS ? rc : vg_nvml_copy_str(uuid, length, d->uuid);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    struct simgpu_device *d;
    nvmlReturn_t rc = vg_nvml_device(device, &d, NULL);
    return rc != NVML_SUCCESS ? rc : vg_nvml_copy_str(name, length, d->name);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    unsigned i;
    nvmlReturn_t rc = vg_nvml_device(device, NULL, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = i;
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    struct simgpu_device *d;
    nvmlReturn_t rc = vg_nvml_device(device, &d, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!minorNumber)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minorNumber = d->minor;
    return NVML_SUCCESS;
}

/* The v1 struct ended with reserved words where v2 has the 32-byte busId, and is
 * shorter, so the v1 call fills only the common first 36 bytes. */
static nvmlReturn_t pci_info(nvmlDevice_t device, nvmlPciInfo_t *pci, int v1)
{
    struct simgpu_device *d;
    nvmlReturn_t rc = vg_nvml_device(device, &d, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", 0u, d->pci_bus, 0u);
    pci->domain = 0;
    pci->bus = d->pci_bus;
    pci->device = 0;
    pci->pciDeviceId = SIMGPU_PCI_DEVICE_ID;
    pci->pciSubSystemId = SIMGPU_PCI_SUBSYS_ID;
    if (!v1)
        snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.0", 0u, d->pci_bus, 0u);
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return pci_info(device, pci, 1);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return pci_info(device, pci, 0);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return pci_info(device, pci, 0);
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
    nvmlReturn_t rc = vg_nvml_device(device, NULL, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = NVML_COMPUTEMODE_DEFAULT; /* time-sliced sharing is the whole point */
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    nvmlReturn_t rc = vg_nvml_device(device, NULL, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = 9;
    *minor = 0;
    return NVML_SUCCESS;
}

/* Temperature and power follow the engine's load so dashboards move with it. */
SIMGPU_API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                                 unsigned int *temp)
{
    struct simgpu_device *d;
    nvmlReturn_t rc = vg_nvml_device(device, &d, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!temp || sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = 35 + vg_nvml_gpu_percent(d) * 35 / 100; /* degrees C */
    return NVML_SUCCESS;
}

SIMGPU_API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    struct simgpu_device *d;
    nvmlReturn_t rc = vg_nvml_device(device, &d, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!power)
        return NVML_ERROR_INVALID_ARGUMENT;
    *power = 70000 + vg_nvml_gpu_percent(d) * 6300; /* milliwatts, 70 W idle .. 700 W */
    return NVML_SUCCESS;
}
