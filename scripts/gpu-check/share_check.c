/*
 * share_check: one tenant's process on a GPU held to its share by libgsaas-share.so, for
 * scripts/gpu-check.sh (issue [1/5]: two tenants' shares on one real GPU). Each subcommand is
 * one thing a tenant does; the script runs two of them at once, each under its own share state.
 *
 *   share_check mkshare PATH DEVICE_MIB PINNED_MIB   writes a share state (as the agent does)
 *   share_check fill DEVICE_MIB PINNED_MIB           every allocation path up to the share:
 *                                                    held to it, refused one chunk past it
 *   share_check ipc                                  cuIpcGetMemHandle and the exports: refused
 *   share_check hold MIB                             holds MIB with a pattern, prints its
 *                                                    pointer, waits for stdin to close
 *   share_check peek POINTER                         reads another process's pointer: must fail
 *   share_check fault                                a kernel that writes to address 0
 *   share_check work ROUNDS                          adds 1 to 64 Mi numbers ROUNDS times and
 *                                                    checks every one (right under a neighbour's
 *                                                    fault)
 *   share_check spin SECONDS                         busy kernels; prints how many per second
 *                                                    (compute shares under MPS)
 *   share_check bench                                copy bandwidth and kernel time (what the
 *                                                    interposer costs, with and without it)
 *
 * The driver is reached through dlopen("libcuda.so.1") + dlsym, as the CUDA runtime does, so
 * the interposer's wrappers are what it gets; a function the driver lacks (the stand-in driver
 * of gpu-share/ has no kernels) makes its subcommand exit 77 ("skipped"). Exit 0: as it should
 * be; 1: a share or an isolation did not hold; 2: the check itself could not run.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "gsaas_share.h"

#define MiB ((uint64_t)1 << 20)
#define SKIPPED 77

typedef void *CUmodule;
typedef void *CUfunction;
typedef CUresult (*module_load_fn)(CUmodule *, const void *);
typedef CUresult (*get_function_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);
typedef CUresult (*sync_fn)(void);
typedef CUresult (*memset32_fn)(CUdeviceptr, unsigned int, size_t);

static void *g_cuda;

static void *sym(const char *name)
{
    return g_cuda != NULL ? dlsym(g_cuda, name) : NULL;
}

/* `name`, the driver's, as a local of `type`; the subcommand is skipped where it lacks it. */
#define NEED(type, name)                                                                 \
    typedef type name##_fn;                                                              \
    name##_fn name = (name##_fn)sym(#name);                                              \
    if (name == NULL) {                                                                  \
        printf("skipped: the driver has no %s\n", #name);                                \
        exit(SKIPPED);                                                                   \
    }

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "share_check: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A context on device 0. */
static void init(void)
{
    g_cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (g_cuda == NULL)
        die("no libcuda.so.1: %s", dlerror());
    NEED(__typeof__(&cuInit), cuInit);
    NEED(__typeof__(&cuDeviceGet), cuDeviceGet);
    NEED(__typeof__(&cuCtxCreate_v2), cuCtxCreate_v2);
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuCtxCreate_v2(&ctx, 0, dev) != CUDA_SUCCESS)
        die("no CUDA context on device 0");
}

/* ---------------------------------------------------------------------------------------- */

static int cmd_mkshare(const char *path, uint64_t dev_mib, uint64_t pin_mib)
{
    struct gsaas_share s;
    memset(&s, 0, sizeof s);
    s.magic = GSAAS_SHARE_MAGIC;
    s.version = GSAAS_SHARE_VERSION;
    s.limit_bytes = dev_mib * MiB;
    s.pinned_limit_bytes = pin_mib * MiB;
    s.nslots = GSAAS_SHARE_NSLOTS;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, &s, sizeof s) != (ssize_t)sizeof s || close(fd) != 0)
        die("cannot write %s", path);
    return 0;
}

/* ---- fill: each path up to the share ---- */
enum path { P_ALLOC, P_PITCH, P_MANAGED, P_ASYNC, P_POOL, P_VMM, P_ARRAY, P_MIPMAP, P_HOST, NPATHS };
static const char *path_names[NPATHS] = {"cuMemAlloc",     "cuMemAllocPitch",
                                         "cuMemAllocManaged", "cuMemAllocAsync",
                                         "cuMemAllocFromPoolAsync", "cuMemCreate",
                                         "cuArray3DCreate", "cuMipmappedArrayCreate",
                                         "cuMemHostAlloc"};

#define MAX_HELD 4096
struct held {
    uint64_t h;
};

static CUmemoryPool g_pool;

static CUresult alloc_one(int p, uint64_t chunk, uint64_t *h)
{
    CUresult r = CUDA_ERROR_NOT_FOUND;
    switch (p) {
    case P_ALLOC: {
        __typeof__(&cuMemAlloc_v2) f = (__typeof__(f))sym("cuMemAlloc_v2");
        CUdeviceptr d = 0;
        if (f != NULL)
            r = f(&d, chunk);
        *h = d;
        break;
    }
    case P_PITCH: {
        __typeof__(&cuMemAllocPitch_v2) f = (__typeof__(f))sym("cuMemAllocPitch_v2");
        CUdeviceptr d = 0;
        size_t pitch = 0;
        if (f != NULL)
            r = f(&d, &pitch, 4096, chunk / 4096, 4);
        *h = d;
        break;
    }
    case P_MANAGED: {
        __typeof__(&cuMemAllocManaged) f = (__typeof__(f))sym("cuMemAllocManaged");
        CUdeviceptr d = 0;
        if (f != NULL)
            r = f(&d, chunk, CU_MEM_ATTACH_GLOBAL);
        *h = d;
        break;
    }
    case P_ASYNC:
    case P_POOL: {
        CUdeviceptr d = 0;
        if (p == P_ASYNC) {
            __typeof__(&cuMemAllocAsync) f = (__typeof__(f))sym("cuMemAllocAsync");
            if (f != NULL)
                r = f(&d, chunk, NULL);
        } else {
            __typeof__(&cuMemAllocFromPoolAsync) f =
                (__typeof__(f))sym("cuMemAllocFromPoolAsync");
            if (f != NULL && g_pool != NULL)
                r = f(&d, chunk, g_pool, NULL);
        }
        *h = d;
        break;
    }
    case P_VMM: {
        __typeof__(&cuMemCreate) f = (__typeof__(f))sym("cuMemCreate");
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        CUmemGenericAllocationHandle hd = 0;
        if (f != NULL)
            r = f(&hd, chunk, &prop, 0);
        *h = hd;
        break;
    }
    case P_ARRAY: {
        __typeof__(&cuArray3DCreate_v2) f = (__typeof__(f))sym("cuArray3DCreate_v2");
        CUDA_ARRAY3D_DESCRIPTOR d = {4096, chunk / 4096 / 4, 0, CU_AD_FORMAT_FLOAT, 1, 0};
        CUarray a = NULL;
        if (f != NULL)
            r = f(&a, &d);
        *h = (uint64_t)(uintptr_t)a;
        break;
    }
    case P_MIPMAP: {
        __typeof__(&cuMipmappedArrayCreate) f = (__typeof__(f))sym("cuMipmappedArrayCreate");
        CUDA_ARRAY3D_DESCRIPTOR d = {4096, chunk / 4096, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
        CUmipmappedArray m = NULL;
        if (f != NULL)
            r = f(&m, &d, 1);
        *h = (uint64_t)(uintptr_t)m;
        break;
    }
    case P_HOST: {
        __typeof__(&cuMemHostAlloc) f = (__typeof__(f))sym("cuMemHostAlloc");
        void *q = NULL;
        if (f != NULL)
            r = f(&q, chunk, 0);
        *h = (uint64_t)(uintptr_t)q;
        break;
    }
    }
    return r;
}

static void free_one(int p, uint64_t h)
{
    CUresult r = CUDA_ERROR_NOT_FOUND;
    switch (p) {
    case P_ALLOC:
    case P_PITCH:
    case P_MANAGED:
        r = ((__typeof__(&cuMemFree_v2))sym("cuMemFree_v2"))(h);
        break;
    case P_ASYNC:
    case P_POOL:
        r = ((__typeof__(&cuMemFreeAsync))sym("cuMemFreeAsync"))(h, NULL);
        break;
    case P_VMM:
        r = ((__typeof__(&cuMemRelease))sym("cuMemRelease"))(h);
        break;
    case P_ARRAY:
        r = ((__typeof__(&cuArrayDestroy))sym("cuArrayDestroy"))((CUarray)(uintptr_t)h);
        break;
    case P_MIPMAP:
        r = ((__typeof__(&cuMipmappedArrayDestroy))sym("cuMipmappedArrayDestroy"))(
            (CUmipmappedArray)(uintptr_t)h);
        break;
    case P_HOST:
        r = ((__typeof__(&cuMemFreeHost))sym("cuMemFreeHost"))((void *)(uintptr_t)h);
        break;
    }
    if (r != CUDA_SUCCESS)
        die("%s: freeing failed (%d)", path_names[p], r);
}

static int cmd_fill(uint64_t dev_mib, uint64_t pin_mib)
{
    init();
    __typeof__(&cuMemPoolCreate) pool_create = (__typeof__(pool_create))sym("cuMemPoolCreate");
    if (pool_create != NULL) {
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        if (pool_create(&g_pool, &props) != CUDA_SUCCESS)
            g_pool = NULL;
    }
    sync_fn ctx_sync = (sync_fn)sym("cuCtxSynchronize");
    static uint64_t held[MAX_HELD];
    int bad = 0;
    for (int p = 0; p < NPATHS; p++) {
        uint64_t limit = (p == P_HOST ? pin_mib : dev_mib) * MiB;
        uint64_t chunk = p == P_HOST ? 16 * MiB : 64 * MiB;
        int n = 0;
        CUresult r = CUDA_SUCCESS;
        while (n < MAX_HELD && (r = alloc_one(p, chunk, &held[n])) == CUDA_SUCCESS)
            n++;
        uint64_t total = (uint64_t)n * chunk;
        int ok = r == CUDA_ERROR_OUT_OF_MEMORY && total <= limit && total + chunk > limit;
        if (r == CUDA_ERROR_NOT_FOUND) {
            printf("  %-24s not in this driver (skipped)\n", path_names[p]);
            continue;
        }
        printf("  %-24s held %5" PRIu64 " MiB of a %5" PRIu64 " MiB share, the next %" PRIu64
               " MiB: %s%s\n",
               path_names[p], total / MiB, limit / MiB, chunk / MiB,
               r == CUDA_ERROR_OUT_OF_MEMORY ? "refused" : "error",
               ok ? "" : "   <-- NOT HELD TO THE SHARE");
        if (!ok) {
            if (r != CUDA_ERROR_OUT_OF_MEMORY)
                printf("    (the allocation ended with CUresult %d)\n", r);
            bad = 1;
        }
        for (int i = n - 1; i >= 0; i--)
            free_one(p, held[i]);
        if (ctx_sync != NULL)
            ctx_sync();
    }
    return bad;
}

/* ---- sharing between processes: refused ---- */
static int cmd_ipc(void)
{
    init();
    NEED(__typeof__(&cuIpcGetMemHandle), cuIpcGetMemHandle);
    NEED(__typeof__(&cuMemAlloc_v2), cuMemAlloc_v2);
    CUdeviceptr d = 0;
    if (cuMemAlloc_v2(&d, MiB) != CUDA_SUCCESS)
        die("cannot allocate 1 MiB");
    CUipcMemHandle handle;
    CUresult r = cuIpcGetMemHandle(&handle, d);
    printf("  cuIpcGetMemHandle: CUresult %d (%s)\n", r,
           r == CUDA_ERROR_NOT_SUPPORTED ? "refused" : "NOT REFUSED");
    int bad = r != CUDA_ERROR_NOT_SUPPORTED;
    __typeof__(&cuMemExportToShareableHandle) exp =
        (__typeof__(exp))sym("cuMemExportToShareableHandle");
    if (exp != NULL) {
        int fd = -1;
        r = exp(&fd, 1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        printf("  cuMemExportToShareableHandle: CUresult %d (%s)\n", r,
               r == CUDA_ERROR_NOT_SUPPORTED ? "refused" : "NOT REFUSED");
        bad |= r != CUDA_ERROR_NOT_SUPPORTED;
    }
    return bad;
}

/* ---- another tenant's pointer ---- */
static int cmd_hold(uint64_t mib)
{
    init();
    NEED(__typeof__(&cuMemAlloc_v2), cuMemAlloc_v2);
    NEED(memset32_fn, cuMemsetD32_v2);
    NEED(sync_fn, cuCtxSynchronize);
    CUdeviceptr d = 0;
    if (cuMemAlloc_v2(&d, mib * MiB) != CUDA_SUCCESS)
        die("cannot allocate %" PRIu64 " MiB", mib);
    if (cuMemsetD32_v2(d, 0x5ec2e7u, mib * MiB / 4) != CUDA_SUCCESS || cuCtxSynchronize() != 0)
        die("cannot write the pattern");
    printf("pointer 0x%llx pid %d\n", (unsigned long long)d, (int)getpid());
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}

static int cmd_peek(const char *pointer)
{
    init();
    NEED(dtoh_fn, cuMemcpyDtoH_v2);
    unsigned int word = 0;
    CUdeviceptr d = strtoull(pointer, NULL, 0);
    CUresult r = cuMemcpyDtoH_v2(&word, d, sizeof word);
    if (r == CUDA_SUCCESS && word == 0x5ec2e7u) {
        printf("  read the other tenant's memory at %s: NOT ISOLATED\n", pointer);
        return 1;
    }
    printf("  reading the other tenant's pointer %s: CUresult %d, nothing of it read\n", pointer, r);
    return 0;
}

/* ---- kernels (PTX, compiled by the driver for whatever GPU it is) ---- */
static const char PTX[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry add_one(.param .u64 data, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %p1;\n"
    "  .reg .b32 %r<7>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [data];\n"
    "  ld.param.u32 %r1, [n];\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  mov.u32 %r3, %ntid.x;\n"
    "  mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r5, %r2, %r3, %r4;\n"
    "  setp.ge.u32 %p1, %r5, %r1;\n"
    "  @%p1 bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.u32 %rd3, %r5, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.u32 %r6, [%rd4];\n"
    "  add.s32 %r6, %r6, 1;\n"
    "  st.global.u32 [%rd4], %r6;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n"
    "\n"
    ".visible .entry write_null()\n"
    "{\n"
    "  .reg .b32 %r<2>;\n"
    "  .reg .b64 %rd<2>;\n"
    "  mov.u64 %rd1, 0;\n"
    "  mov.u32 %r1, 1;\n"
    "  st.global.u32 [%rd1], %r1;\n"
    "  ret;\n"
    "}\n"
    "\n"
    ".visible .entry spin(.param .u64 out, .param .u32 iters)\n"
    "{\n"
    "  .reg .pred %p1;\n"
    "  .reg .b32 %r<8>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [out];\n"
    "  ld.param.u32 %r1, [iters];\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  mov.u32 %r3, %ntid.x;\n"
    "  mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r5, %r2, %r3, %r4;\n"
    "  mov.u32 %r6, %r5;\n"
    "  mov.u32 %r7, 0;\n"
    "LOOP:\n"
    "  mad.lo.s32 %r6, %r6, 1664525, 1013904223;\n"
    "  add.s32 %r7, %r7, 1;\n"
    "  setp.lt.u32 %p1, %r7, %r1;\n"
    "  @%p1 bra LOOP;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.u32 %rd3, %r5, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  st.global.u32 [%rd4], %r6;\n"
    "  ret;\n"
    "}\n";

static CUfunction kernel(const char *name)
{
    NEED(module_load_fn, cuModuleLoadData);
    NEED(get_function_fn, cuModuleGetFunction);
    static CUmodule module;
    if (module == NULL && cuModuleLoadData(&module, PTX) != CUDA_SUCCESS)
        die("the driver did not load the PTX");
    CUfunction f;
    if (cuModuleGetFunction(&f, module, name) != CUDA_SUCCESS)
        die("no kernel %s", name);
    return f;
}

static CUresult launch(CUfunction f, unsigned blocks, unsigned threads, void **args)
{
    launch_fn cuLaunchKernel = (launch_fn)sym("cuLaunchKernel");
    if (cuLaunchKernel == NULL)
        die("no cuLaunchKernel");
    return cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, 0, NULL, args, NULL);
}

static int cmd_fault(void)
{
    init();
    NEED(sync_fn, cuCtxSynchronize);
    CUfunction f = kernel("write_null");
    CUresult r = launch(f, 1, 1, NULL);
    if (r == CUDA_SUCCESS)
        r = cuCtxSynchronize();
    printf("  a kernel writing to address 0: CUresult %d%s\n", r,
           r == 700 ? " (illegal address), as it should" : "");
    return r == CUDA_SUCCESS;
}

static int cmd_work(int rounds)
{
    init();
    NEED(__typeof__(&cuMemAlloc_v2), cuMemAlloc_v2);
    NEED(htod_fn, cuMemcpyHtoD_v2);
    NEED(dtoh_fn, cuMemcpyDtoH_v2);
    NEED(sync_fn, cuCtxSynchronize);
    const unsigned n = 64u << 20;
    unsigned int *host = malloc((size_t)n * 4);
    if (host == NULL)
        die("no host memory");
    for (unsigned i = 0; i < n; i++)
        host[i] = i;
    CUdeviceptr d;
    if (cuMemAlloc_v2(&d, (size_t)n * 4) != CUDA_SUCCESS || cuMemcpyHtoD_v2(d, host, (size_t)n * 4) != 0)
        die("cannot set up 256 MiB");
    CUfunction f = kernel("add_one");
    unsigned nn = n;
    void *args[] = {&d, &nn};
    for (int k = 0; k < rounds; k++)
        if (launch(f, n / 256, 256, args) != CUDA_SUCCESS)
            die("launch %d failed", k);
    CUresult r = cuCtxSynchronize();
    if (r != CUDA_SUCCESS || cuMemcpyDtoH_v2(host, d, (size_t)n * 4) != CUDA_SUCCESS) {
        printf("  %d rounds over 64 Mi numbers: CUresult %d: FAILED\n", rounds, r);
        return 1;
    }
    unsigned wrong = 0;
    for (unsigned i = 0; i < n; i++)
        wrong += host[i] != i + (unsigned)rounds;
    printf("  %d rounds over 64 Mi numbers: %u wrong%s\n", rounds, wrong,
           wrong == 0 ? ", all right" : "   <-- WRONG");
    return wrong != 0;
}

static int cmd_spin(double seconds)
{
    init();
    NEED(__typeof__(&cuMemAlloc_v2), cuMemAlloc_v2);
    NEED(sync_fn, cuCtxSynchronize);
    /* Enough blocks to fill any GPU's SMs many times over. */
    const unsigned blocks = 4096, threads = 256;
    CUdeviceptr out;
    if (cuMemAlloc_v2(&out, (size_t)blocks * threads * 4) != CUDA_SUCCESS)
        die("cannot allocate");
    CUfunction f = kernel("spin");
    unsigned iters = 20000;
    void *args[] = {&out, &iters};
    double start = now_s();
    long done = 0;
    while (now_s() - start < seconds) {
        if (launch(f, blocks, threads, args) != CUDA_SUCCESS || cuCtxSynchronize() != CUDA_SUCCESS)
            die("spin kernel failed");
        done++;
    }
    printf("  %.1f kernels/s\n", (double)done / (now_s() - start));
    return 0;
}

static int cmd_bench(void)
{
    init();
    NEED(__typeof__(&cuMemAlloc_v2), cuMemAlloc_v2);
    NEED(htod_fn, cuMemcpyHtoD_v2);
    NEED(dtoh_fn, cuMemcpyDtoH_v2);
    NEED(sync_fn, cuCtxSynchronize);
    __typeof__(&cuMemAllocHost_v2) host_alloc = (__typeof__(host_alloc))sym("cuMemAllocHost_v2");
    const size_t bytes = 256 * MiB;
    void *host = NULL;
    if (host_alloc == NULL || host_alloc(&host, bytes) != CUDA_SUCCESS)
        die("no pinned host memory");
    CUdeviceptr d;
    if (cuMemAlloc_v2(&d, bytes) != CUDA_SUCCESS)
        die("cannot allocate 256 MiB");
    memset(host, 1, bytes);
    double t0 = now_s();
    for (int i = 0; i < 8; i++)
        cuMemcpyHtoD_v2(d, host, bytes);
    cuCtxSynchronize();
    double t1 = now_s();
    for (int i = 0; i < 8; i++)
        cuMemcpyDtoH_v2(host, d, bytes);
    cuCtxSynchronize();
    double t2 = now_s();
    CUfunction f = kernel("add_one");
    unsigned n = (unsigned)(bytes / 4);
    void *args[] = {&d, &n};
    launch(f, n / 256, 256, args);
    cuCtxSynchronize();
    double t3 = now_s();
    for (int i = 0; i < 100; i++)
        launch(f, n / 256, 256, args);
    cuCtxSynchronize();
    double t4 = now_s();
    /* Allocation itself, which the interposer wraps: 1,000 of 1 MiB. */
    static CUdeviceptr small[1000];
    __typeof__(&cuMemFree_v2) mem_free = (__typeof__(mem_free))sym("cuMemFree_v2");
    double t5 = now_s();
    for (int i = 0; i < 1000; i++)
        if (cuMemAlloc_v2(&small[i], MiB) != CUDA_SUCCESS)
            die("cannot allocate 1 MiB");
    for (int i = 0; i < 1000; i++)
        mem_free(small[i]);
    double t6 = now_s();
    printf("  host->device %.2f GB/s, device->host %.2f GB/s, add_one over 256 MiB %.3f ms, "
           "cuMemAlloc+cuMemFree of 1 MiB %.1f us\n",
           8.0 * (double)bytes / (t1 - t0) / 1e9, 8.0 * (double)bytes / (t2 - t1) / 1e9,
           (t4 - t3) / 100 * 1e3, (t6 - t5) / 1000 * 1e6);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 5 && strcmp(argv[1], "mkshare") == 0)
        return cmd_mkshare(argv[2], strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10));
    if (argc >= 4 && strcmp(argv[1], "fill") == 0)
        return cmd_fill(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10));
    if (argc >= 2 && strcmp(argv[1], "ipc") == 0)
        return cmd_ipc();
    if (argc >= 3 && strcmp(argv[1], "hold") == 0)
        return cmd_hold(strtoull(argv[2], NULL, 10));
    if (argc >= 3 && strcmp(argv[1], "peek") == 0)
        return cmd_peek(argv[2]);
    if (argc >= 2 && strcmp(argv[1], "fault") == 0)
        return cmd_fault();
    if (argc >= 3 && strcmp(argv[1], "work") == 0)
        return cmd_work(atoi(argv[2]));
    if (argc >= 3 && strcmp(argv[1], "spin") == 0)
        return cmd_spin(atof(argv[2]));
    if (argc >= 2 && strcmp(argv[1], "bench") == 0)
        return cmd_bench();
    fprintf(stderr, "usage: see the top of scripts/gpu-check/share_check.c\n");
    return 2;
}
