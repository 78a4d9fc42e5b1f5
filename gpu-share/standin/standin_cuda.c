/*
 * A stand-in for NVIDIA's libcuda.so.1 with the calls GSaaS's share interposer takes over (and
 * what its tests need), so the interposer and its tests run on machines without a GPU. Written
 * for GSaaS from the CUDA Driver API's documented C interface (include/cuda_abi.h); it is no
 * part of NVIDIA's library.
 *
 * Device memory is bookkeeping only: fake, distinct, aligned addresses out of a capacity of
 * GSAAS_STANDIN_MEMORY_MIB (default 4096) MiB per process, CUDA_ERROR_OUT_OF_MEMORY past it.
 * Page-locked host memory is real memory (posix_memalign), limited only by
 * GSAAS_STANDIN_PINNED_MIB when set. Virtual memory management keeps the driver's rule: a
 * cuMemCreate'd allocation is freed when every reference is released and every mapping
 * unmapped. The sharing calls (IPC, export/import, external memory, dma-buf) all succeed with
 * dummy handles, so a refusal in the tests can only come from the interposer.
 *
 * cuGetProcAddress (CUDA 11.3 ABI) and cuGetProcAddress_v2 (CUDA 12 ABI) resolve a base name to
 * the variant for the requested version, the _ptsz one under the per-thread-default-stream
 * flag. With GSAAS_STANDIN_PROC_INTERNAL=1 they hand out, for some functions, an internal
 * address that is no exported symbol (as a driver may), to exercise the interposer's fallback.
 * A forked child starts as a real driver's would: uninitialised, holding nothing.
 *
 * Built with -Bsymbolic: calls and addresses inside bind to this library's own functions.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "gsaas_standin.h"

#define EXPORT __attribute__((visibility("default")))
#define DRIVER_VERSION 12040
#define SM_COUNT 132
#define THREADS_PER_SM 2048
#define VMM_GRANULARITY (2ull << 20)
#define ALLOC_ALIGN 512ull
#define PITCH_ALIGN 512ull

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static uint64_t capacity, used, pinned_capacity, pinned_used;
static uint64_t next_va = 0x100000000000ull; /* 64-bit fake addresses */
static uint32_t next_va32 = 0x10000000u;     /* legacy 32-bit fake addresses */
static uint64_t next_handle = 0x1000;
static int proc_internal;
static __thread CUcontext current;

/* ---- call counters ---- */
static pthread_mutex_t count_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const char *name;
    unsigned long long n;
} counters[256];
static int ncounters;
static unsigned long long internal_calls;

static void called(const char *fn)
{
    pthread_mutex_lock(&count_mu);
    int i;
    for (i = 0; i < ncounters; i++)
        if (counters[i].name == fn || strcmp(counters[i].name, fn) == 0)
            break;
    if (i == ncounters && ncounters < (int)(sizeof counters / sizeof counters[0]))
        counters[ncounters++].name = fn;
    if (i < ncounters)
        counters[i].n++;
    pthread_mutex_unlock(&count_mu);
}
#define CALLED() called(__func__)

EXPORT unsigned long long gsaas_standin_calls(const char *name)
{
    unsigned long long n = 0;
    pthread_mutex_lock(&count_mu);
    for (int i = 0; i < ncounters; i++)
        if (strcmp(counters[i].name, name) == 0)
            n = counters[i].n;
    pthread_mutex_unlock(&count_mu);
    return n;
}

EXPORT unsigned long long gsaas_standin_internal_calls(void)
{
    return __atomic_load_n(&internal_calls, __ATOMIC_RELAXED);
}

EXPORT unsigned long long gsaas_standin_device_used(void)
{
    pthread_mutex_lock(&mu);
    uint64_t u = used;
    pthread_mutex_unlock(&mu);
    return u;
}

EXPORT unsigned long long gsaas_standin_pinned_used(void)
{
    pthread_mutex_lock(&mu);
    uint64_t u = pinned_used;
    pthread_mutex_unlock(&mu);
    return u;
}

/* ---- bookkeeping: (kind, key) -> entry ---- */
enum { E_DEV = 1, E_HOST, E_REG, E_HANDLE, E_MAP, E_RESV, E_ARRAYMAP, E_ARRAY, E_MIPMAP };

struct entry {
    struct entry *next;
    int kind;
    uint64_t key;
    uint64_t size;
    uint64_t handle; /* E_MAP, E_ARRAYMAP: the handle mapped */
    uint32_t refs;   /* E_HANDLE */
    uint32_t maps;   /* E_HANDLE */
};

#define NBUCKETS 4096
static struct entry *buckets[NBUCKETS];

static size_t bucket(int kind, uint64_t key)
{
    return (size_t)(((key ^ ((uint64_t)kind << 58)) * 0x9E3779B97F4A7C15ull) >> 40) % NBUCKETS;
}

static struct entry *find(int kind, uint64_t key)
{
    for (struct entry *e = buckets[bucket(kind, key)]; e != NULL; e = e->next)
        if (e->kind == kind && e->key == key)
            return e;
    return NULL;
}

static struct entry *add(int kind, uint64_t key, uint64_t size)
{
    struct entry *e = calloc(1, sizeof *e);
    if (e == NULL)
        return NULL;
    e->kind = kind;
    e->key = key;
    e->size = size;
    size_t b = bucket(kind, key);
    e->next = buckets[b];
    buckets[b] = e;
    return e;
}

static void del(struct entry *victim)
{
    struct entry **pp = &buckets[bucket(victim->kind, victim->key)];
    for (; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == victim) {
            *pp = victim->next;
            free(victim);
            return;
        }
    }
}

static uint64_t env_mib(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return dflt;
    return strtoull(v, NULL, 10) << 20;
}

static void reset_state(void)
{
    for (size_t i = 0; i < NBUCKETS; i++)
        buckets[i] = NULL; /* a forked child's copy: abandoned, not freed */
    initialized = 0;
    used = pinned_used = 0;
    current = NULL;
    ncounters = 0;
    internal_calls = 0;
}

static void atfork_prepare(void)
{
    pthread_mutex_lock(&mu);
    pthread_mutex_lock(&count_mu);
}
static void atfork_parent(void)
{
    pthread_mutex_unlock(&count_mu);
    pthread_mutex_unlock(&mu);
}
static void atfork_child(void)
{
    reset_state();
    pthread_mutex_unlock(&count_mu);
    pthread_mutex_unlock(&mu);
}

__attribute__((constructor)) static void standin_init(void)
{
    capacity = env_mib("GSAAS_STANDIN_MEMORY_MIB", 4096ull << 20);
    pinned_capacity = env_mib("GSAAS_STANDIN_PINNED_MIB", UINT64_MAX);
    const char *pi = getenv("GSAAS_STANDIN_PROC_INTERNAL");
    proc_internal = pi != NULL && strcmp(pi, "1") == 0;
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* ---- contexts ---- */
#define CTX_MAGIC 0x43545853u
struct ctx {
    uint32_t magic;
    size_t limits[7];
};

static int ctx_ok(CUcontext c) { return c != NULL && ((struct ctx *)c)->magic == CTX_MAGIC; }

EXPORT CUresult cuInit(unsigned int Flags)
{
    CALLED();
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    initialized = 1;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *driverVersion)
{
    CALLED();
    if (driverVersion == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = DRIVER_VERSION;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    CALLED();
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    CALLED();
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *count = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    CALLED();
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (pi == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = SM_COUNT; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *pi = THREADS_PER_SM; break;
    default: *pi = 1; break;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CALLED();
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = capacity;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CALLED();
    (void)flags;
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    struct ctx *c = calloc(1, sizeof *c);
    if (c == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->magic = CTX_MAGIC;
    c->limits[CU_LIMIT_STACK_SIZE] = 1024;
    c->limits[CU_LIMIT_PRINTF_FIFO_SIZE] = 1u << 20;
    c->limits[CU_LIMIT_MALLOC_HEAP_SIZE] = 8u << 20;
    *pctx = (CUcontext)c;
    current = *pctx;
    return CUDA_SUCCESS;
}

static CUresult ctx_destroy(CUcontext ctx)
{
    if (!ctx_ok(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    ((struct ctx *)ctx)->magic = 0;
    if (current == ctx)
        current = NULL;
    free(ctx);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CALLED();
    return ctx_destroy(ctx);
}

EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    CALLED();
    return ctx_destroy(ctx);
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CALLED();
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = current;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CALLED();
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx != NULL && !ctx_ok(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    current = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
    CALLED();
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ctx_ok(current))
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    CALLED();
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx_ok(current))
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((unsigned)limit > CU_LIMIT_PERSISTING_L2_CACHE_SIZE)
        return CUDA_ERROR_INVALID_VALUE;
    ((struct ctx *)current)->limits[limit] = value;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit)
{
    CALLED();
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx_ok(current))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (pvalue == NULL || (unsigned)limit > CU_LIMIT_PERSISTING_L2_CACHE_SIZE)
        return CUDA_ERROR_INVALID_VALUE;
    *pvalue = ((struct ctx *)current)->limits[limit];
    return CUDA_SUCCESS;
}

/* ---- streams, pools, graphs: opaque dummies ---- */
#define OBJ_STREAM 0x5354524du
#define OBJ_POOL 0x504f4f4cu
#define OBJ_GRAPH 0x47524148u
#define OBJ_NODE 0x4e4f4445u
#define OBJ_OTHER 0x4f544852u

static void *obj_new(uint32_t magic)
{
    uint32_t *o = malloc(16);
    if (o != NULL)
        *o = magic;
    return o;
}

static int obj_ok(const void *o, uint32_t magic) { return o != NULL && *(const uint32_t *)o == magic; }

static void obj_free(void *o)
{
    *(uint32_t *)o = 0;
    free(o);
}

EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    CALLED();
    (void)Flags;
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (phStream == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *phStream = obj_new(OBJ_STREAM);
    return *phStream ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream hStream)
{
    CALLED();
    if (!obj_ok(hStream, OBJ_STREAM))
        return CUDA_ERROR_INVALID_HANDLE;
    obj_free(hStream);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    CALLED();
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (pool == NULL || poolProps == NULL || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    *pool = obj_new(OBJ_POOL);
    return *pool ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    CALLED();
    if (!obj_ok(pool, OBJ_POOL))
        return CUDA_ERROR_INVALID_VALUE;
    obj_free(pool);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    CALLED();
    if (phGraph == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    *phGraph = obj_new(OBJ_GRAPH);
    return *phGraph ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuGraphDestroy(CUgraph hGraph)
{
    CALLED();
    if (!obj_ok(hGraph, OBJ_GRAPH))
        return CUDA_ERROR_INVALID_VALUE;
    obj_free(hGraph);
    return CUDA_SUCCESS;
}

static uint64_t fake_va(uint64_t size, uint64_t align)
{
    next_va = round_up(next_va, align);
    uint64_t va = next_va;
    next_va += round_up(size ? size : 1, align);
    return va;
}

static CUresult graph_alloc_node(CUgraphNode *node, CUgraph g, CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
    if (node == NULL || !obj_ok(g, OBJ_GRAPH) || p == NULL || p->bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    p->dptr = fake_va(p->bytesize, ALLOC_ALIGN); /* graph memory is backed at launch, not here */
    pthread_mutex_unlock(&mu);
    *node = obj_new(OBJ_NODE);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                       const CUgraphNode *dependencies, size_t numDependencies,
                                       CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    CALLED();
    (void)dependencies, (void)numDependencies;
    return graph_alloc_node(phGraphNode, hGraph, nodeParams);
}

EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                      const CUgraphNode *dependencies, size_t numDependencies,
                                      CUdeviceptr dptr)
{
    CALLED();
    (void)dependencies, (void)numDependencies;
    if (phGraphNode == NULL || !obj_ok(hGraph, OBJ_GRAPH) || dptr == 0)
        return CUDA_ERROR_INVALID_VALUE;
    *phGraphNode = obj_new(OBJ_NODE);
    return CUDA_SUCCESS;
}

static CUresult graph_add_node(CUgraphNode *node, CUgraph g, CUgraphNodeParams *p)
{
    if (p == NULL || node == NULL || !obj_ok(g, OBJ_GRAPH))
        return CUDA_ERROR_INVALID_VALUE;
    if (p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        return graph_alloc_node(node, g, &p->u.alloc);
    *node = obj_new(OBJ_NODE);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                               const CUgraphNode *dependencies, size_t numDependencies,
                               CUgraphNodeParams *nodeParams)
{
    CALLED();
    (void)dependencies, (void)numDependencies;
    return graph_add_node(phGraphNode, hGraph, nodeParams);
}

EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                  const CUgraphNode *dependencies,
                                  const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                  CUgraphNodeParams *nodeParams)
{
    CALLED();
    (void)dependencies, (void)dependencyData, (void)numDependencies;
    return graph_add_node(phGraphNode, hGraph, nodeParams);
}

/* ---- device memory ---- */
/* Books `size` bytes of device memory under a new entry of `kind` (an address below 4 GiB for
 * the legacy 32-bit symbols); out of memory past the capacity. */
static CUresult book(int kind, uint64_t size, uint64_t *out, int legacy32)
{
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    if (size > capacity - used) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    uint64_t va;
    if (legacy32) {
        uint64_t want = round_up(size, ALLOC_ALIGN);
        if (want > 0xF0000000ull - next_va32) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        va = next_va32;
        next_va32 += (uint32_t)want;
    } else {
        va = fake_va(size ? size : 1, ALLOC_ALIGN);
    }
    if (add(kind, va, size) == NULL) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    used += size;
    *out = va;
out:
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult dev_alloc(uint64_t size, uint64_t *out, int legacy32)
{
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx_ok(current))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return book(E_DEV, size, out, legacy32);
}

/* Frees the device memory of the entry (kind, key); `unknown` when there is none. */
static CUresult entry_free(int kind, uint64_t key, CUresult unknown)
{
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&mu);
    struct entry *e = find(kind, key);
    CUresult r = unknown;
    if (e != NULL) {
        used -= e->size;
        del(e);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult dev_free(uint64_t va)
{
    return entry_free(E_DEV, va, CUDA_ERROR_INVALID_VALUE);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    CALLED();
    if (dptr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t va;
    CUresult r = dev_alloc(bytesize, &va, 0);
    if (r == CUDA_SUCCESS)
        *dptr = va;
    return r;
}

EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    CALLED();
    if (dptr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t va;
    CUresult r = dev_alloc(bytesize, &va, 1);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)va;
    return r;
}

static CUresult pitch_alloc(uint64_t width, uint64_t height, unsigned int esz, uint64_t *va,
                            uint64_t *pitch, int legacy32)
{
    if (width == 0 || height == 0 || (esz != 4 && esz != 8 && esz != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t p = round_up(width, PITCH_ALIGN);
    if (height > UINT64_MAX / p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = dev_alloc(p * height, va, legacy32);
    if (r == CUDA_SUCCESS)
        *pitch = p;
    return r;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                   size_t Height, unsigned int ElementSizeBytes)
{
    CALLED();
    if (dptr == NULL || pPitch == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t va, pitch;
    CUresult r = pitch_alloc(WidthInBytes, Height, ElementSizeBytes, &va, &pitch, 0);
    if (r == CUDA_SUCCESS) {
        *dptr = va;
        *pPitch = pitch;
    }
    return r;
}

EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch,
                                unsigned int WidthInBytes, unsigned int Height,
                                unsigned int ElementSizeBytes)
{
    CALLED();
    if (dptr == NULL || pPitch == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t va, pitch;
    CUresult r = pitch_alloc(WidthInBytes, Height, ElementSizeBytes, &va, &pitch, 1);
    if (r == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr_v1)va;
        *pPitch = (unsigned int)pitch;
    }
    return r;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    CALLED();
    if (dptr == NULL || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t va;
    CUresult r = dev_alloc(bytesize, &va, 0);
    if (r == CUDA_SUCCESS)
        *dptr = va;
    return r;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CALLED();
    return dev_free(dptr);
}

EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    CALLED();
    return dev_free(dptr);
}

/* ---- arrays: device memory of their texels' size (a real driver adds its layout's padding) ---- */
static uint64_t standin_texel(CUarray_format format, unsigned int channels)
{
    if (channels != 1 && channels != 2 && channels != 4)
        return 0;
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return channels;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2ull * channels;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4ull * channels;
    default:
        return 0;
    }
}

static CUresult array_alloc(int kind, uint64_t w, uint64_t h, uint64_t d, CUarray_format format,
                            unsigned int channels, unsigned int flags, unsigned int levels,
                            uint64_t *out)
{
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx_ok(current))
        return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t texel = standin_texel(format, channels);
    if (w == 0 || texel == 0 || levels == 0 || levels > 32)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t size = 0;
    if (!(flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING))) {
        int keeps_depth = (flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
        for (unsigned int l = 0; l < levels; l++) {
            uint64_t lw = w >> l, lh = h >> l, ld = keeps_depth ? d : d >> l;
            lw = lw ? lw : 1, lh = lh ? lh : 1, ld = ld ? ld : 1;
            if (lw > UINT64_MAX / lh || lw * lh > UINT64_MAX / ld || lw * lh * ld > UINT64_MAX / texel)
                return CUDA_ERROR_OUT_OF_MEMORY;
            uint64_t level = lw * lh * ld * texel;
            if (size > UINT64_MAX - level)
                return CUDA_ERROR_OUT_OF_MEMORY;
            size += level;
        }
    }
    return book(kind, size, out, 0);
}


/* cuArrayCreate and cuArray3DCreate, each ABI: `depth` and `flags` read from `d`. */
#define STANDIN_ARRAY_CREATE(fn, desc_type, depth, flags)                                    \
    EXPORT CUresult fn(CUarray *pHandle, const desc_type *d)                                 \
    {                                                                                        \
        CALLED();                                                                            \
        if (pHandle == NULL || d == NULL)                                                    \
            return CUDA_ERROR_INVALID_VALUE;                                                 \
        uint64_t key;                                                                        \
        CUresult r = array_alloc(E_ARRAY, d->Width, d->Height, (depth), d->Format,           \
                                 d->NumChannels, (flags), 1, &key);                          \
        if (r == CUDA_SUCCESS)                                                               \
            *pHandle = (CUarray)(uintptr_t)key;                                              \
        return r;                                                                            \
    }

STANDIN_ARRAY_CREATE(cuArrayCreate_v2, CUDA_ARRAY_DESCRIPTOR, 1, 0)
STANDIN_ARRAY_CREATE(cuArrayCreate, CUDA_ARRAY_DESCRIPTOR_v1, 1, 0)
STANDIN_ARRAY_CREATE(cuArray3DCreate_v2, CUDA_ARRAY3D_DESCRIPTOR, d->Depth, d->Flags)
STANDIN_ARRAY_CREATE(cuArray3DCreate, CUDA_ARRAY3D_DESCRIPTOR_v1, d->Depth, d->Flags)

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                       unsigned int numMipmapLevels)
{
    CALLED();
    if (pHandle == NULL || d == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t key;
    CUresult r = array_alloc(E_MIPMAP, d->Width, d->Height, d->Depth, d->Format, d->NumChannels,
                             d->Flags, numMipmapLevels, &key);
    if (r == CUDA_SUCCESS)
        *pHandle = (CUmipmappedArray)(uintptr_t)key;
    return r;
}

EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    CALLED();
    return entry_free(E_ARRAY, (uint64_t)(uintptr_t)hArray, CUDA_ERROR_INVALID_HANDLE);
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    CALLED();
    return entry_free(E_MIPMAP, (uint64_t)(uintptr_t)hMipmappedArray, CUDA_ERROR_INVALID_HANDLE);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_out, size_t *total_out)
{
    CALLED();
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (free_out == NULL || total_out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *free_out = capacity - used;
    *total_out = capacity;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo(unsigned int *free_out, unsigned int *total_out)
{
    CALLED();
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (free_out == NULL || total_out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    uint64_t f = capacity - used, t = capacity;
    pthread_mutex_unlock(&mu);
    *free_out = (unsigned int)(f > UINT32_MAX ? UINT32_MAX : f);
    *total_out = (unsigned int)(t > UINT32_MAX ? UINT32_MAX : t);
    return CUDA_SUCCESS;
}

/* ---- stream-ordered (completes at once here) ---- */
static CUresult async_alloc(CUdeviceptr *dptr, size_t bytesize)
{
    if (dptr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t va;
    CUresult r = dev_alloc(bytesize, &va, 0);
    if (r == CUDA_SUCCESS)
        *dptr = va;
    return r;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    CALLED();
    (void)hStream;
    return async_alloc(dptr, bytesize);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    CALLED();
    (void)hStream;
    return async_alloc(dptr, bytesize);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream hStream)
{
    CALLED();
    (void)hStream;
    if (!obj_ok(pool, OBJ_POOL))
        return CUDA_ERROR_INVALID_VALUE;
    return async_alloc(dptr, bytesize);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                             CUmemoryPool pool, CUstream hStream)
{
    CALLED();
    (void)hStream;
    if (!obj_ok(pool, OBJ_POOL))
        return CUDA_ERROR_INVALID_VALUE;
    return async_alloc(dptr, bytesize);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    CALLED();
    (void)hStream;
    return dev_free(dptr);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    CALLED();
    (void)hStream;
    return dev_free(dptr);
}

/* ---- virtual memory management ---- */
EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option)
{
    CALLED();
    (void)option;
    if (granularity == NULL || prop == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags)
{
    CALLED();
    (void)alignment, (void)addr, (void)flags;
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ptr == NULL || size == 0 || size % VMM_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    uint64_t va = fake_va(size, VMM_GRANULARITY);
    CUresult r = add(E_RESV, va, size) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&mu);
    if (r == CUDA_SUCCESS)
        *ptr = va;
    return r;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CALLED();
    pthread_mutex_lock(&mu);
    struct entry *e = find(E_RESV, ptr);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (e != NULL && e->size == size) {
        del(e);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* Under mu: free the physical memory once nothing holds it. */
static void handle_maybe_free(struct entry *h)
{
    if (h->refs == 0 && h->maps == 0) {
        used -= h->size;
        del(h);
    }
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    CALLED();
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx_ok(current))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (handle == NULL || prop == NULL || flags != 0 || size == 0 ||
        size % VMM_GRANULARITY != 0 || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    if (size > capacity - used) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        struct entry *e = add(E_HANDLE, next_handle, size);
        if (e == NULL) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            e->refs = 1;
            used += size;
            *handle = next_handle++;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CALLED();
    pthread_mutex_lock(&mu);
    struct entry *h = find(E_HANDLE, handle);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (h != NULL && h->refs > 0) {
        h->refs--;
        handle_maybe_free(h);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    CALLED();
    if (flags != 0 || offset != 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct entry *h = find(E_HANDLE, handle);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (h != NULL && h->refs > 0 && size <= h->size && find(E_MAP, ptr) == NULL) {
        struct entry *m = add(E_MAP, ptr, size);
        if (m != NULL) {
            m->handle = handle;
            h->maps++;
            r = CUDA_SUCCESS;
        } else {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CALLED();
    pthread_mutex_lock(&mu);
    int n = 0;
    for (size_t b = 0; b < NBUCKETS; b++) {
        struct entry *e = buckets[b];
        while (e != NULL) {
            struct entry *next = e->next;
            if (e->kind == E_MAP && e->key >= ptr && e->size <= size && e->key - ptr <= size - e->size) {
                struct entry *h = find(E_HANDLE, e->handle);
                del(e);
                if (h != NULL && h->maps > 0) {
                    h->maps--;
                    handle_maybe_free(h);
                }
                n++;
            }
            e = next;
        }
    }
    pthread_mutex_unlock(&mu);
    return n > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count)
{
    CALLED();
    (void)ptr, (void)size;
    return desc != NULL && count > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    CALLED();
    if (handle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t a = (uint64_t)(uintptr_t)addr;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    for (size_t b = 0; b < NBUCKETS && r != CUDA_SUCCESS; b++) {
        for (struct entry *e = buckets[b]; e != NULL; e = e->next) {
            if (e->kind == E_MAP && a >= e->key && a - e->key < e->size) {
                struct entry *h = find(E_HANDLE, e->handle);
                if (h != NULL) {
                    h->refs++;
                    *handle = e->handle;
                    r = CUDA_SUCCESS;
                }
                break;
            }
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult map_array(CUarrayMapInfo *list, unsigned int count)
{
    if (list == NULL || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = CUDA_SUCCESS;
    for (unsigned int i = 0; i < count && r == CUDA_SUCCESS; i++) {
        uint64_t arr = (uint64_t)(uintptr_t)list[i].resource.array;
        if (list[i].memOperationType == CU_MEM_OPERATION_TYPE_MAP) {
            struct entry *h = find(E_HANDLE, list[i].memHandle.memHandle);
            if (h == NULL || h->refs == 0 || find(E_ARRAYMAP, arr) != NULL) {
                r = CUDA_ERROR_INVALID_VALUE;
                break;
            }
            struct entry *m = add(E_ARRAYMAP, arr, 0);
            if (m == NULL) {
                r = CUDA_ERROR_OUT_OF_MEMORY;
                break;
            }
            m->handle = h->key;
            h->maps++;
        } else if (list[i].memOperationType == CU_MEM_OPERATION_TYPE_UNMAP) {
            struct entry *m = find(E_ARRAYMAP, arr);
            if (m == NULL) {
                r = CUDA_ERROR_INVALID_VALUE;
                break;
            }
            struct entry *h = find(E_HANDLE, m->handle);
            del(m);
            if (h != NULL && h->maps > 0) {
                h->maps--;
                handle_maybe_free(h);
            }
        } else {
            r = CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemMapArrayAsync(CUarrayMapInfo *mapInfoList, unsigned int count,
                                   CUstream hStream)
{
    CALLED();
    (void)hStream;
    return map_array(mapInfoList, count);
}

EXPORT CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo *mapInfoList, unsigned int count,
                                        CUstream hStream)
{
    CALLED();
    (void)hStream;
    return map_array(mapInfoList, count);
}

/* ---- page-locked host memory: real memory ---- */
static CUresult host_alloc(void **pp, uint64_t size)
{
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx_ok(current))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (pp == NULL || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    if (size > pinned_capacity - pinned_used) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    void *p = NULL;
    if (posix_memalign(&p, 4096, (size_t)size) != 0 || add(E_HOST, (uint64_t)(uintptr_t)p, size) == NULL) {
        free(p);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    pinned_used += size;
    *pp = p;
out:
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    CALLED();
    if (Flags & ~(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    return host_alloc(pp, bytesize);
}

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    CALLED();
    return host_alloc(pp, bytesize);
}

EXPORT CUresult cuMemAllocHost(void **pp, unsigned int bytesize)
{
    CALLED();
    return host_alloc(pp, bytesize);
}

EXPORT CUresult cuMemFreeHost(void *p)
{
    CALLED();
    pthread_mutex_lock(&mu);
    struct entry *e = find(E_HOST, (uint64_t)(uintptr_t)p);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (e != NULL) {
        pinned_used -= e->size;
        del(e);
        free(p);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult host_register(void *p, size_t size)
{
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx_ok(current))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (p == NULL || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    if (find(E_REG, (uint64_t)(uintptr_t)p) != NULL)
        r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    else if (size > pinned_capacity - pinned_used)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    else if (add(E_REG, (uint64_t)(uintptr_t)p, size) == NULL)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    else
        pinned_used += size;
    pthread_mutex_unlock(&mu);
    return r;
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    CALLED();
    (void)Flags;
    return host_register(p, bytesize);
}

EXPORT CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    CALLED();
    (void)Flags;
    return host_register(p, bytesize);
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
    CALLED();
    pthread_mutex_lock(&mu);
    struct entry *e = find(E_REG, (uint64_t)(uintptr_t)p);
    CUresult r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    if (e != NULL) {
        pinned_used -= e->size;
        del(e);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* ---- sharing between processes: all succeed, with dummies ---- */
static int dummy_fd(void) { return open("/dev/null", O_RDONLY | O_CLOEXEC); }

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    CALLED();
    if (pHandle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    memset(pHandle, 0x5a, sizeof *pHandle);
    memcpy(pHandle->reserved, &dptr, sizeof dptr);
    return CUDA_SUCCESS;
}

static CUresult ipc_open(CUdeviceptr *pdptr)
{
    if (pdptr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *pdptr = fake_va(1u << 20, ALLOC_ALIGN);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    CALLED();
    (void)handle, (void)Flags;
    return ipc_open(pdptr);
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    CALLED();
    (void)handle, (void)Flags;
    return ipc_open(pdptr);
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    CALLED();
    (void)dptr;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent event)
{
    CALLED();
    (void)event;
    if (pHandle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    memset(pHandle, 0xa5, sizeof *pHandle);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle)
{
    CALLED();
    (void)handle;
    if (phEvent == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *phEvent = obj_new(OBJ_OTHER);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType handleType,
                                             unsigned long long flags)
{
    CALLED();
    (void)handle, (void)flags;
    if (shareableHandle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (handleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        *(int *)shareableHandle = dummy_fd();
    else
        memset(shareableHandle, 0, 8);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                               CUmemAllocationHandleType shHandleType)
{
    CALLED();
    (void)osHandle, (void)shHandleType;
    if (handle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *handle = next_handle++; /* someone else's memory: nothing counted here */
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                                 CUmemAllocationHandleType handleType,
                                                 unsigned long long flags)
{
    CALLED();
    (void)pool, (void)handleType, (void)flags;
    if (handle_out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *(int *)handle_out = dummy_fd();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                                   CUmemAllocationHandleType handleType,
                                                   unsigned long long flags)
{
    CALLED();
    (void)handle, (void)handleType, (void)flags;
    if (pool_out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pool_out = obj_new(OBJ_POOL);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr)
{
    CALLED();
    if (shareData_out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    memset(shareData_out, 0x3c, sizeof *shareData_out);
    memcpy(shareData_out->reserved, &ptr, sizeof ptr);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                                       CUmemPoolPtrExportData *shareData)
{
    CALLED();
    (void)pool, (void)shareData;
    return ipc_open(ptr_out);
}

EXPORT CUresult cuImportExternalMemory(CUexternalMemory *extMem_out,
                                       const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *memHandleDesc)
{
    CALLED();
    if (extMem_out == NULL || memHandleDesc == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *extMem_out = obj_new(OBJ_OTHER);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuImportExternalSemaphore(CUexternalSemaphore *extSem_out,
                                          const CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC *semHandleDesc)
{
    CALLED();
    if (extSem_out == NULL || semHandleDesc == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *extSem_out = obj_new(OBJ_OTHER);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                              CUmemRangeHandleType handleType,
                                              unsigned long long flags)
{
    CALLED();
    (void)dptr, (void)size, (void)flags;
    if (handle == NULL || handleType != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)
        return CUDA_ERROR_INVALID_VALUE;
    *(int *)handle = dummy_fd();
    return CUDA_SUCCESS;
}

/* ---- internal entry points (GSAAS_STANDIN_PROC_INTERNAL=1): no exported symbol ---- */
static CUresult i_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    __atomic_add_fetch(&internal_calls, 1, __ATOMIC_RELAXED);
    return cuMemAlloc_v2(dptr, bytesize);
}
static CUresult i_cuMemFree_v2(CUdeviceptr dptr)
{
    __atomic_add_fetch(&internal_calls, 1, __ATOMIC_RELAXED);
    return cuMemFree_v2(dptr);
}
static CUresult i_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
    __atomic_add_fetch(&internal_calls, 1, __ATOMIC_RELAXED);
    return cuMemAllocAsync(dptr, bytesize, s);
}
static CUresult i_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
    __atomic_add_fetch(&internal_calls, 1, __ATOMIC_RELAXED);
    return cuMemAllocAsync_ptsz(dptr, bytesize, s);
}
static CUresult i_cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
    __atomic_add_fetch(&internal_calls, 1, __ATOMIC_RELAXED);
    return cuMemFreeAsync(dptr, s);
}
static CUresult i_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
    __atomic_add_fetch(&internal_calls, 1, __ATOMIC_RELAXED);
    return cuMemFreeAsync_ptsz(dptr, s);
}
static CUresult i_cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                              const CUmemAllocationProp *prop, unsigned long long flags)
{
    __atomic_add_fetch(&internal_calls, 1, __ATOMIC_RELAXED);
    return cuMemCreate(h, size, prop, flags);
}
static CUresult i_cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
    __atomic_add_fetch(&internal_calls, 1, __ATOMIC_RELAXED);
    return cuMemHostAlloc(pp, bytesize, flags);
}
static CUresult i_cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr dptr)
{
    __atomic_add_fetch(&internal_calls, 1, __ATOMIC_RELAXED);
    return cuIpcGetMemHandle(h, dptr);
}
static CUresult i_cuMemGetInfo_v2(size_t *f, size_t *t)
{
    __atomic_add_fetch(&internal_calls, 1, __ATOMIC_RELAXED);
    return cuMemGetInfo_v2(f, t);
}

/* ---- cuGetProcAddress ---- */
struct proc {
    const char *base;
    int version;
    int ptsz;
    void *fn;
    void *internal;
};

#define P(base, fn, ver, ptsz) {base, ver, ptsz, (void *)fn, NULL}
#define PI(base, fn, ver, ptsz) {base, ver, ptsz, (void *)fn, (void *)i_##fn}
static const struct proc procs[] = {
    P("cuInit", cuInit, 2000, 0),
    P("cuDriverGetVersion", cuDriverGetVersion, 2020, 0),
    P("cuDeviceGet", cuDeviceGet, 2000, 0),
    P("cuDeviceGetCount", cuDeviceGetCount, 2000, 0),
    P("cuDeviceGetAttribute", cuDeviceGetAttribute, 2000, 0),
    P("cuDeviceTotalMem", cuDeviceTotalMem_v2, 3020, 0),
    P("cuCtxCreate", cuCtxCreate_v2, 3020, 0),
    P("cuCtxDestroy", cuCtxDestroy, 2000, 0),
    P("cuCtxDestroy", cuCtxDestroy_v2, 4000, 0),
    P("cuCtxGetCurrent", cuCtxGetCurrent, 4000, 0),
    P("cuCtxSetCurrent", cuCtxSetCurrent, 4000, 0),
    P("cuCtxGetDevice", cuCtxGetDevice, 2000, 0),
    P("cuCtxSetLimit", cuCtxSetLimit, 3010, 0),
    P("cuCtxGetLimit", cuCtxGetLimit, 3010, 0),
    P("cuStreamCreate", cuStreamCreate, 2000, 0),
    P("cuStreamDestroy", cuStreamDestroy_v2, 4000, 0),
    P("cuMemPoolCreate", cuMemPoolCreate, 11020, 0),
    P("cuMemPoolDestroy", cuMemPoolDestroy, 11020, 0),
    P("cuGetProcAddress", cuGetProcAddress, 11030, 0),
    P("cuGetProcAddress", cuGetProcAddress_v2, 12000, 0),
    P("cuMemGetInfo", cuMemGetInfo, 2000, 0),
    PI("cuMemGetInfo", cuMemGetInfo_v2, 3020, 0),
    P("cuMemAlloc", cuMemAlloc, 2000, 0),
    PI("cuMemAlloc", cuMemAlloc_v2, 3020, 0),
    P("cuMemAllocPitch", cuMemAllocPitch, 2000, 0),
    P("cuMemAllocPitch", cuMemAllocPitch_v2, 3020, 0),
    P("cuMemAllocManaged", cuMemAllocManaged, 6000, 0),
    P("cuArrayCreate", cuArrayCreate, 2000, 0),
    P("cuArrayCreate", cuArrayCreate_v2, 3020, 0),
    P("cuArray3DCreate", cuArray3DCreate, 2000, 0),
    P("cuArray3DCreate", cuArray3DCreate_v2, 3020, 0),
    P("cuMipmappedArrayCreate", cuMipmappedArrayCreate, 5000, 0),
    P("cuArrayDestroy", cuArrayDestroy, 2000, 0),
    P("cuMipmappedArrayDestroy", cuMipmappedArrayDestroy, 5000, 0),
    P("cuMemFree", cuMemFree, 2000, 0),
    PI("cuMemFree", cuMemFree_v2, 3020, 0),
    PI("cuMemAllocAsync", cuMemAllocAsync, 11020, 0),
    PI("cuMemAllocAsync", cuMemAllocAsync_ptsz, 11020, 1),
    P("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync, 11020, 0),
    P("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync_ptsz, 11020, 1),
    PI("cuMemFreeAsync", cuMemFreeAsync, 11020, 0),
    PI("cuMemFreeAsync", cuMemFreeAsync_ptsz, 11020, 1),
    P("cuMemGetAllocationGranularity", cuMemGetAllocationGranularity, 10020, 0),
    P("cuMemAddressReserve", cuMemAddressReserve, 10020, 0),
    P("cuMemAddressFree", cuMemAddressFree, 10020, 0),
    PI("cuMemCreate", cuMemCreate, 10020, 0),
    P("cuMemRelease", cuMemRelease, 10020, 0),
    P("cuMemMap", cuMemMap, 10020, 0),
    P("cuMemUnmap", cuMemUnmap, 10020, 0),
    P("cuMemSetAccess", cuMemSetAccess, 10020, 0),
    P("cuMemRetainAllocationHandle", cuMemRetainAllocationHandle, 11000, 0),
    P("cuMemMapArrayAsync", cuMemMapArrayAsync, 11010, 0),
    P("cuMemMapArrayAsync", cuMemMapArrayAsync_ptsz, 11010, 1),
    P("cuGraphCreate", cuGraphCreate, 10000, 0),
    P("cuGraphDestroy", cuGraphDestroy, 10000, 0),
    P("cuGraphAddMemAllocNode", cuGraphAddMemAllocNode, 11040, 0),
    P("cuGraphAddMemFreeNode", cuGraphAddMemFreeNode, 11040, 0),
    P("cuGraphAddNode", cuGraphAddNode, 12020, 0),
    P("cuGraphAddNode", cuGraphAddNode_v2, 12030, 0),
    PI("cuMemHostAlloc", cuMemHostAlloc, 2020, 0),
    P("cuMemAllocHost", cuMemAllocHost, 2000, 0),
    P("cuMemAllocHost", cuMemAllocHost_v2, 3020, 0),
    P("cuMemFreeHost", cuMemFreeHost, 2000, 0),
    P("cuMemHostRegister", cuMemHostRegister, 4000, 0),
    P("cuMemHostRegister", cuMemHostRegister_v2, 6050, 0),
    P("cuMemHostUnregister", cuMemHostUnregister, 4000, 0),
    PI("cuIpcGetMemHandle", cuIpcGetMemHandle, 4010, 0),
    P("cuIpcOpenMemHandle", cuIpcOpenMemHandle, 4010, 0),
    P("cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2, 11000, 0),
    P("cuIpcCloseMemHandle", cuIpcCloseMemHandle, 4010, 0),
    P("cuIpcGetEventHandle", cuIpcGetEventHandle, 4010, 0),
    P("cuIpcOpenEventHandle", cuIpcOpenEventHandle, 4010, 0),
    P("cuMemExportToShareableHandle", cuMemExportToShareableHandle, 10020, 0),
    P("cuMemImportFromShareableHandle", cuMemImportFromShareableHandle, 10020, 0),
    P("cuMemPoolExportToShareableHandle", cuMemPoolExportToShareableHandle, 11020, 0),
    P("cuMemPoolImportFromShareableHandle", cuMemPoolImportFromShareableHandle, 11020, 0),
    P("cuMemPoolExportPointer", cuMemPoolExportPointer, 11020, 0),
    P("cuMemPoolImportPointer", cuMemPoolImportPointer, 11020, 0),
    P("cuImportExternalMemory", cuImportExternalMemory, 10000, 0),
    P("cuImportExternalSemaphore", cuImportExternalSemaphore, 10000, 0),
    P("cuMemGetHandleForAddressRange", cuMemGetHandleForAddressRange, 11070, 0),
};

static CUresult proc_lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status)
{
    if (symbol == NULL || pfn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (cudaVersion > DRIVER_VERSION)
        return CUDA_ERROR_INVALID_VALUE;
    int ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1, named = 0;
    for (int i = 0; i < (int)(sizeof procs / sizeof procs[0]); i++) {
        const struct proc *p = &procs[i];
        if (strcmp(p->base, symbol) != 0)
            continue;
        named = 1;
        if (p->version > cudaVersion || (p->ptsz && !ptds))
            continue;
        if (best < 0 || p->ptsz > procs[best].ptsz ||
            (p->ptsz == procs[best].ptsz && p->version > procs[best].version))
            best = i;
    }
    if (best < 0) {
        if (status != NULL)
            *status = named ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = proc_internal && procs[best].internal != NULL ? procs[best].internal : procs[best].fn;
    if (status != NULL)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    CALLED();
    return proc_lookup(symbol, pfn, cudaVersion, flags, NULL);
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    CALLED();
    CUresult r = proc_lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
    /* CUDA 12: a missing symbol is CUDA_SUCCESS with a NULL pointer and a status. */
    return r == CUDA_ERROR_NOT_FOUND ? CUDA_SUCCESS : r;
}
