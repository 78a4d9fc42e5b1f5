/*
 * A stand-in for NVIDIA's libnvidia-ml.so.1 with the calls rodvr-agent's NVML discovery and
 * health watch make, so that path (the nvml-wrapper crate loading the library, every call, and
 * the agent's reading of the answers) runs on machines without a GPU. Written for GSaaS from
 * NVML's documented C interface; it is no part of NVIDIA's library.
 *
 * The GPUs come from FAKE_NVML_GPUS: entries separated by ';', each
 *     name:memory_mib:major.minor:uuid:mig_instances:ecc_uncorrected:pages_pending:xid:lost
 * mig_instances > 0 puts the GPU in MIG mode with that many instances ("<name> MIG 1g.<n>gb",
 * memory_mib / (mig_instances + 1) each); xid > 0 is delivered once as a critical XID event;
 * lost = 1 makes the GPU answer NVML_ERROR_GPU_IS_LOST. FAKE_NVML_CUDA sets the driver's
 * CUDA version (default 12040, that is 12.4).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
};

#define MAX_GPUS 16
#define MAX_MIG 7

struct fake_device {
    int index;      /* its place among the GPUs */
    int mig;        /* -1: a whole GPU; else the instance's number */
    struct fake_device *parent;
    char name[160];
    char uuid[128];
    unsigned long long memory_mib;
    int major, minor;
    int mig_instances;
    unsigned long long ecc;
    int pending;
    unsigned long long xid;
    int lost;
    struct fake_device *instances[MAX_MIG];
};

static struct fake_device gpus[MAX_GPUS];
static int gpu_count = -1;

static void load(void) {
    const char *spec = getenv("FAKE_NVML_GPUS");
    gpu_count = 0;
    if (spec == NULL) return;
    char *copy = strdup(spec);
    char *save = NULL;
    for (char *entry = strtok_r(copy, ";", &save); entry && gpu_count < MAX_GPUS;
         entry = strtok_r(NULL, ";", &save)) {
        struct fake_device *g = &gpus[gpu_count];
        memset(g, 0, sizeof *g);
        char name[96] = {0}, uuid[80] = {0};
        int fields = sscanf(entry, "%95[^:]:%llu:%d.%d:%79[^:]:%d:%llu:%d:%llu:%d", name,
                            &g->memory_mib, &g->major, &g->minor, uuid, &g->mig_instances,
                            &g->ecc, &g->pending, &g->xid, &g->lost);
        if (fields != 10) {
            fprintf(stderr, "fake NVML: bad entry %s\n", entry);
            continue;
        }
        g->index = gpu_count;
        g->mig = -1;
        snprintf(g->name, sizeof g->name, "%s", name);
        snprintf(g->uuid, sizeof g->uuid, "%s", uuid);
        if (g->mig_instances > MAX_MIG) g->mig_instances = MAX_MIG;
        for (int m = 0; m < g->mig_instances; m++) {
            struct fake_device *i = calloc(1, sizeof *i);
            i->index = g->index;
            i->mig = m;
            i->parent = g;
            i->memory_mib = g->memory_mib / (unsigned long long)(g->mig_instances + 1);
            snprintf(i->name, sizeof i->name, "%s MIG 1g.%llugb", g->name, i->memory_mib / 1024);
            snprintf(i->uuid, sizeof i->uuid, "MIG-%d-%s", m, g->uuid);
            g->instances[m] = i;
        }
        gpu_count++;
    }
    free(copy);
}

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length) {
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

static int initialized;

nvmlReturn_t nvmlInit_v2(void) {
    if (gpu_count < 0) load();
    initialized = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void) {
    initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return copy_text("fake-nvml (GSaaS tests)", version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    const char *cuda = getenv("FAKE_NVML_CUDA");
    *version = cuda ? atoi(cuda) : 12040;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    return nvmlSystemGetCudaDriverVersion_v2(version);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *count = (unsigned int)gpu_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, struct fake_device **device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (index >= (unsigned int)gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpus[index].lost) return NVML_ERROR_GPU_IS_LOST;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

static struct fake_device *whole(struct fake_device *d) {
    return d->parent ? d->parent : d;
}

nvmlReturn_t nvmlDeviceGetUUID(struct fake_device *d, char *uuid, unsigned int length) {
    if (whole(d)->lost) return NVML_ERROR_GPU_IS_LOST;
    return copy_text(d->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(struct fake_device *d, char *name, unsigned int length) {
    return copy_text(d->name, name, length);
}

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(struct fake_device *d, nvmlMemory_v2_t *memory) {
    unsigned long long bytes = d->memory_mib << 20;
    memory->total = bytes;
    memory->reserved = 0;
    memory->free = bytes;
    memory->used = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(struct fake_device *d, int *major, int *minor) {
    *major = whole(d)->major;
    *minor = whole(d)->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(struct fake_device *d, unsigned int *current,
                                  unsigned int *pending) {
    if (d->parent) return NVML_ERROR_NOT_SUPPORTED;
    *current = d->mig_instances > 0;
    *pending = *current;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(struct fake_device *d, unsigned int *count) {
    *count = d->mig_instances > 0 ? MAX_MIG : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(struct fake_device *d, unsigned int *is_mig) {
    *is_mig = d->parent != NULL;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(struct fake_device *d, unsigned int index,
                                                 struct fake_device **instance) {
    if (index >= MAX_MIG || index >= (unsigned int)d->mig_instances) return NVML_ERROR_NOT_FOUND;
    *instance = d->instances[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(struct fake_device *d, int error_type, int counter_type,
                                         unsigned long long *count) {
    (void)counter_type;
    *count = error_type == 1 ? d->ecc : 0; /* 1: NVML_MEMORY_ERROR_TYPE_UNCORRECTED */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(struct fake_device *d, int *pending) {
    *pending = d->pending;
    return NVML_SUCCESS;
}

/* Events: one set per registration (the agent makes one per GPU). */
struct fake_event_set {
    struct fake_device *device;
    int delivered;
};

typedef struct {
    struct fake_device *device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

#define NVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x0000000000000008LL

nvmlReturn_t nvmlEventSetCreate(struct fake_event_set **set) {
    *set = calloc(1, sizeof **set);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(struct fake_device *d, unsigned long long types,
                                      struct fake_event_set *set) {
    if (!(types & NVML_EVENT_TYPE_XID_CRITICAL_ERROR)) return NVML_ERROR_NOT_SUPPORTED;
    set->device = d;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(struct fake_event_set *set, nvmlEventData_t *data,
                                 unsigned int timeout_ms) {
    if (set->device && set->device->xid && !set->delivered) {
        set->delivered = 1;
        memset(data, 0, sizeof *data);
        data->device = set->device;
        data->eventType = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
        data->eventData = set->device->xid;
        data->gpuInstanceId = 0xFFFFFFFF;
        data->computeInstanceId = 0xFFFFFFFF;
        return NVML_SUCCESS;
    }
    usleep((useconds_t)(timeout_ms > 1000 ? 1000 : timeout_ms) * 1000);
    return NVML_ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetFree(struct fake_event_set *set) {
    free(set);
    return NVML_SUCCESS;
}

/*
 * The compute processes on each GPU, from the file FAKE_NVML_PROCESSES_FILE (read at every call,
 * so a test changes them while the agent runs): lines "<GPU index> <host PID> <MiB>". As NVML:
 * with too small a buffer (or none), the count needed and NVML_ERROR_INSUFFICIENT_SIZE.
 */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(struct fake_device *d, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (whole(d)->lost) return NVML_ERROR_GPU_IS_LOST;
    const char *path = getenv("FAKE_NVML_PROCESSES_FILE");
    unsigned int found = 0, capacity = infos ? *count : 0;
    FILE *f = path ? fopen(path, "r") : NULL;
    if (f) {
        int gpu;
        unsigned int pid;
        unsigned long long mib;
        while (fscanf(f, "%d %u %llu", &gpu, &pid, &mib) == 3) {
            if (gpu != whole(d)->index || d->mig >= 0) continue;
            if (found < capacity) {
                infos[found].pid = pid;
                infos[found].usedGpuMemory = mib << 20;
                infos[found].gpuInstanceId = 0xFFFFFFFF;
                infos[found].computeInstanceId = 0xFFFFFFFF;
            }
            found++;
        }
        fclose(f);
    }
    *count = found;
    return found > capacity ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}
