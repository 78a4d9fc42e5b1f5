/*
 * share_test: the tests of libgsaas-share.so against the stand-in driver.
 *
 * Run without arguments it is the harness: for every case it writes a fresh share state file
 * (its own limits, sometimes a broken header or prepared slots), starts the case in a child
 * process (fork, then execve of this very program with "--case <name>") with
 * LD_PRELOAD=build/libgsaas-share.so and LD_LIBRARY_PATH=build/standin, waits for it (with a
 * timeout), and checks its exit status, its stderr (the interposer's one-line complaints) and
 * the share state it left behind. Its last line is "N passed, M failed"; it exits 1 on any
 * failure. An argument other than --case selects the cases whose names contain it.
 *
 * Every case is an attacker trying to get past its share; see README.md for what each group
 * proves.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "gsaas_share.h"
#include "gsaas_standin.h"

extern char **environ;

#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define UNLIMITED GSAAS_SHARE_UNLIMITED
#define OOM CUDA_ERROR_OUT_OF_MEMORY
#define NOTSUP CUDA_ERROR_NOT_SUPPORTED
#define SHARE_FD_NUM 37
#define STANDIN_SMS 132
#define STANDIN_THREADS 2048

/* ============================================================================================
 * Checks inside a case (child side)
 * ============================================================================================ */
static int g_fails;

#define EXPECT(cond, ...)                                          \
    do {                                                           \
        if (!(cond)) {                                             \
            g_fails++;                                             \
            printf("  line %d: (%s) ", __LINE__, #cond);           \
            printf(__VA_ARGS__);                                   \
            printf("\n");                                          \
            fflush(stdout);                                        \
        }                                                          \
    } while (0)

#define EXPECT_R(expr, want)                                                              \
    do {                                                                                  \
        CUresult r_ = (expr);                                                             \
        if (r_ != (CUresult)(want)) {                                                     \
            g_fails++;                                                                    \
            printf("  line %d: %s = %d, want %d\n", __LINE__, #expr, (int)r_, (int)(want)); \
            fflush(stdout);                                                               \
        }                                                                                 \
    } while (0)

#define EXPECT_EQ(a, b)                                                                      \
    do {                                                                                     \
        unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b);       \
        if (a_ != b_) {                                                                      \
            g_fails++;                                                                       \
            printf("  line %d: %s = %llu, want %s = %llu\n", __LINE__, #a, a_, #b, b_);      \
            fflush(stdout);                                                                  \
        }                                                                                    \
    } while (0)

/* The share state as the case sees it: its own read-write mapping of the file (the harness
 * passes the path in GSAAS_TEST_SHARE), used to read totals and, where a case plays the
 * agent, to change limits. */
static struct gsaas_share *S;

static void map_test_share(void)
{
    const char *p = getenv("GSAAS_TEST_SHARE");
    if (p == NULL)
        return;
    int fd = open(p, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_size == GSAAS_SHARE_SIZE) {
        void *m = mmap(NULL, GSAAS_SHARE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED)
            S = m;
    }
    close(fd);
}

static uint64_t used(int pinned)
{
    uint64_t t = 0;
    for (unsigned i = 0; i < GSAAS_SHARE_NSLOTS; i++) {
        if (__atomic_load_n(&S->slots[i].pid, __ATOMIC_ACQUIRE) == 0)
            continue;
        t += __atomic_load_n(pinned ? &S->slots[i].pinned_bytes : &S->slots[i].device_bytes,
                             __ATOMIC_RELAXED);
    }
    return t;
}

static uint64_t refused(void) { return __atomic_load_n(&S->refused_allocations, __ATOMIC_ACQUIRE); }
static uint64_t refused_sharing(void) { return __atomic_load_n(&S->refused_sharing, __ATOMIC_ACQUIRE); }

static int slot_of(pid_t pid)
{
    for (unsigned i = 0; i < GSAAS_SHARE_NSLOTS; i++)
        if (__atomic_load_n(&S->slots[i].pid, __ATOMIC_ACQUIRE) == (int32_t)pid)
            return (int)i;
    return -1;
}

static void set_limit(uint64_t v) { __atomic_store_n(&S->limit_bytes, v, __ATOMIC_RELEASE); }
static void set_pinned_limit(uint64_t v) { __atomic_store_n(&S->pinned_limit_bytes, v, __ATOMIC_RELEASE); }

static uint64_t driver_used(int pinned)
{
    return pinned ? gsaas_standin_pinned_used() : gsaas_standin_device_used();
}

static CUcontext g_ctx;
static CUmemoryPool g_pool;

static void ctx_init(void)
{
    CUdevice dev;
    EXPECT_R(cuInit(0), CUDA_SUCCESS);
    EXPECT_R(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    EXPECT_R(cuCtxCreate_v2(&g_ctx, 0, dev), CUDA_SUCCESS);
    CUmemPoolProps pp;
    memset(&pp, 0, sizeof pp);
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    EXPECT_R(cuMemPoolCreate(&g_pool, &pp), CUDA_SUCCESS);
}

static int is_zombie_or_gone(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    return p == NULL || p[2] == 'Z' || p[2] == 'X';
}

static uint64_t proc_start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return 0;
    p += 2;
    for (int field = 3; field < 22 && p != NULL; field++) {
        p = strchr(p, ' ');
        if (p != NULL)
            p++;
    }
    return p != NULL ? strtoull(p, NULL, 10) : 0;
}

/* A pid that no process wears: a child that has exited and been reaped. */
static pid_t dead_pid(void)
{
    fflush(stdout);
    pid_t p = fork();
    if (p == 0)
        _exit(0);
    waitpid(p, NULL, 0);
    return p;
}

/* ============================================================================================
 * The ways an entry point is reached
 * ============================================================================================ */
enum { W_DIRECT, W_GPA, W_GPA_V2, W_DLSYM, W_DLSYM_GPA, W_GPA_INTERNAL, W_COUNT };
static const char *const way_names[W_COUNT] = {"direct", "gpa", "gpa_v2", "dlsym", "dlsym_gpa",
                                               "gpa_internal"};
static int g_way = W_DIRECT;

struct sym {
    const char *name;
    void *addr;
};
#define SYM(n) {#n, (void *)n}
/* The exported names, as an application linked against libcuda binds them. */
static const struct sym direct_syms[] = {
    SYM(cuMemAlloc), SYM(cuMemAlloc_v2), SYM(cuMemAllocPitch), SYM(cuMemAllocPitch_v2),
    SYM(cuMemAllocManaged), SYM(cuMemFree), SYM(cuMemFree_v2), SYM(cuMemGetInfo),
    SYM(cuMemGetInfo_v2), SYM(cuMemAllocAsync), SYM(cuMemAllocAsync_ptsz),
    SYM(cuMemAllocFromPoolAsync), SYM(cuMemAllocFromPoolAsync_ptsz), SYM(cuMemFreeAsync),
    SYM(cuMemFreeAsync_ptsz), SYM(cuMemCreate), SYM(cuMemRelease), SYM(cuMemMap),
    SYM(cuMemUnmap), SYM(cuMemRetainAllocationHandle), SYM(cuGraphAddMemAllocNode),
    SYM(cuGraphAddNode), SYM(cuGraphAddNode_v2), SYM(cuGraphDestroy), SYM(cuCtxSetLimit),
    SYM(cuCtxDestroy), SYM(cuCtxDestroy_v2), SYM(cuMemHostAlloc), SYM(cuMemAllocHost),
    SYM(cuMemAllocHost_v2), SYM(cuMemFreeHost), SYM(cuMemHostRegister),
    SYM(cuMemHostRegister_v2), SYM(cuMemHostUnregister), SYM(cuGetProcAddress),
    SYM(cuGetProcAddress_v2), SYM(cuIpcGetMemHandle), SYM(cuIpcOpenMemHandle),
    SYM(cuIpcOpenMemHandle_v2), SYM(cuIpcCloseMemHandle), SYM(cuIpcGetEventHandle),
    SYM(cuIpcOpenEventHandle), SYM(cuMemExportToShareableHandle),
    SYM(cuMemImportFromShareableHandle), SYM(cuMemPoolExportToShareableHandle),
    SYM(cuMemPoolImportFromShareableHandle), SYM(cuMemPoolExportPointer),
    SYM(cuMemPoolImportPointer), SYM(cuImportExternalMemory), SYM(cuImportExternalSemaphore),
    SYM(cuMemGetHandleForAddressRange), SYM(cuArrayCreate), SYM(cuArrayCreate_v2),
    SYM(cuArray3DCreate), SYM(cuArray3DCreate_v2), SYM(cuMipmappedArrayCreate),
    SYM(cuArrayDestroy), SYM(cuMipmappedArrayDestroy),
};

static void *cuda_handle(void)
{
    static void *h;
    if (h == NULL)
        h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    return h;
}

/* Whether p is the interposer's wrapper exported as `name`. */
static int is_wrapper(void *p, const char *name)
{
    Dl_info di;
    if (p == NULL || dladdr(p, &di) == 0 || di.dli_fname == NULL || di.dli_sname == NULL)
        return 0;
    return strstr(di.dli_fname, "libgsaas-share.so") != NULL && strcmp(di.dli_sname, name) == 0 &&
           di.dli_saddr == p;
}

static const char *describe(void *p)
{
    static char buf[512];
    Dl_info di;
    if (p == NULL)
        return "NULL";
    if (dladdr(p, &di) == 0)
        return "(no object)";
    snprintf(buf, sizeof buf, "%s in %s", di.dli_sname ? di.dli_sname : "(unnamed)",
             di.dli_fname ? di.dli_fname : "?");
    return buf;
}

/* Look up an entry point the current way: `exported` is the driver's exported name, `base`
 * with `ver` and `ptsz` what cuGetProcAddress is asked for. Checks that what comes back is the
 * interposer's wrapper for exactly that variant. */
static void *resolve(const char *exported, const char *base, int ver, int ptsz)
{
    void *p = NULL;
    cuuint64_t flags = ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
    CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)99;
    switch (g_way) {
    case W_DIRECT:
        for (size_t i = 0; i < sizeof direct_syms / sizeof direct_syms[0]; i++)
            if (strcmp(direct_syms[i].name, exported) == 0)
                p = direct_syms[i].addr;
        break;
    case W_GPA:
        EXPECT_R(cuGetProcAddress(base, &p, ver, flags), CUDA_SUCCESS);
        break;
    case W_GPA_V2:
    case W_GPA_INTERNAL:
        EXPECT_R(cuGetProcAddress_v2(base, &p, ver, flags, &st), CUDA_SUCCESS);
        EXPECT(st == CU_GET_PROC_ADDRESS_SUCCESS, "status %d for %s", (int)st, base);
        break;
    case W_DLSYM:
        p = dlsym(cuda_handle(), exported);
        break;
    case W_DLSYM_GPA: {
        /* What the CUDA runtime does: cuGetProcAddress found by dlsym, asked for the CUDA 12
         * cuGetProcAddress, that one asked for the function. */
        __typeof__(&cuGetProcAddress) gpa = (__typeof__(&cuGetProcAddress))dlsym(cuda_handle(), "cuGetProcAddress");
        void *v2 = NULL;
        EXPECT(gpa != NULL, "dlsym cuGetProcAddress");
        if (gpa == NULL)
            break;
        EXPECT_R(gpa("cuGetProcAddress", &v2, 12000, 0), CUDA_SUCCESS);
        EXPECT(is_wrapper(v2, "cuGetProcAddress_v2"), "cuGetProcAddress(12000) gave %s", describe(v2));
        if (v2 == NULL)
            break;
        EXPECT_R(((__typeof__(&cuGetProcAddress_v2))v2)(base, &p, ver, flags, &st), CUDA_SUCCESS);
        break;
    }
    }
    EXPECT(is_wrapper(p, exported), "%s reached %s way gives %s", exported, way_names[g_way], describe(p));
    return p;
}

#define R(T, exported, base, ver, ptsz) ((__typeof__(&T))resolve(exported, base, ver, ptsz))

/* ============================================================================================
 * The counted paths: an allocation and its free, each reached the current way
 * ============================================================================================ */
enum {
    K_V2, K_V1, K_PITCH2, K_PITCH1, K_MANAGED, K_ASYNC, K_POOL, K_VMM, K_GNODE, K_GADD, K_GADD2,
    K_HOSTALLOC, K_ALLOCHOST2, K_ALLOCHOST1, K_HOSTREG, K_ARRAY2, K_ARRAY1, K_ARRAY3D2,
    K_ARRAY3D1, K_MIPMAP
};

struct path {
    const char *a_exp, *a_base;
    int a_ver, ptsz;
    const char *f_exp, *f_base;
    int f_ver;
    int kind;
    int pinned;
    int driver_counts; /* the stand-in keeps its own count of this memory */
};

static const struct path paths[] = {
    {"cuMemAlloc_v2", "cuMemAlloc", 12040, 0, "cuMemFree_v2", "cuMemFree", 12040, K_V2, 0, 1},
    {"cuMemAlloc", "cuMemAlloc", 2000, 0, "cuMemFree", "cuMemFree", 2000, K_V1, 0, 1},
    {"cuMemAllocPitch_v2", "cuMemAllocPitch", 12040, 0, "cuMemFree_v2", "cuMemFree", 12040, K_PITCH2, 0, 1},
    {"cuMemAllocPitch", "cuMemAllocPitch", 2000, 0, "cuMemFree", "cuMemFree", 2000, K_PITCH1, 0, 1},
    {"cuMemAllocManaged", "cuMemAllocManaged", 12040, 0, "cuMemFree_v2", "cuMemFree", 12040, K_MANAGED, 0, 1},
    {"cuMemAllocAsync", "cuMemAllocAsync", 12040, 0, "cuMemFreeAsync", "cuMemFreeAsync", 12040, K_ASYNC, 0, 1},
    {"cuMemAllocAsync_ptsz", "cuMemAllocAsync", 12040, 1, "cuMemFreeAsync_ptsz", "cuMemFreeAsync", 12040, K_ASYNC, 0, 1},
    {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", 12040, 0, "cuMemFreeAsync", "cuMemFreeAsync", 12040, K_POOL, 0, 1},
    {"cuMemAllocFromPoolAsync_ptsz", "cuMemAllocFromPoolAsync", 12040, 1, "cuMemFreeAsync_ptsz", "cuMemFreeAsync", 12040, K_POOL, 0, 1},
    {"cuMemCreate", "cuMemCreate", 12040, 0, "cuMemRelease", "cuMemRelease", 12040, K_VMM, 0, 1},
    {"cuGraphAddMemAllocNode", "cuGraphAddMemAllocNode", 12040, 0, "cuGraphDestroy", "cuGraphDestroy", 12040, K_GNODE, 0, 0},
    {"cuGraphAddNode", "cuGraphAddNode", 12020, 0, "cuGraphDestroy", "cuGraphDestroy", 12040, K_GADD, 0, 0},
    {"cuGraphAddNode_v2", "cuGraphAddNode", 12040, 0, "cuGraphDestroy", "cuGraphDestroy", 12040, K_GADD2, 0, 0},
    {"cuMemHostAlloc", "cuMemHostAlloc", 12040, 0, "cuMemFreeHost", "cuMemFreeHost", 12040, K_HOSTALLOC, 1, 1},
    {"cuMemAllocHost_v2", "cuMemAllocHost", 12040, 0, "cuMemFreeHost", "cuMemFreeHost", 12040, K_ALLOCHOST2, 1, 1},
    {"cuMemAllocHost", "cuMemAllocHost", 2000, 0, "cuMemFreeHost", "cuMemFreeHost", 12040, K_ALLOCHOST1, 1, 1},
    {"cuMemHostRegister_v2", "cuMemHostRegister", 12040, 0, "cuMemHostUnregister", "cuMemHostUnregister", 12040, K_HOSTREG, 1, 1},
    {"cuMemHostRegister", "cuMemHostRegister", 4000, 0, "cuMemHostUnregister", "cuMemHostUnregister", 12040, K_HOSTREG, 1, 1},
    {"cuArrayCreate_v2", "cuArrayCreate", 12040, 0, "cuArrayDestroy", "cuArrayDestroy", 12040, K_ARRAY2, 0, 1},
    {"cuArrayCreate", "cuArrayCreate", 2000, 0, "cuArrayDestroy", "cuArrayDestroy", 2000, K_ARRAY1, 0, 1},
    {"cuArray3DCreate_v2", "cuArray3DCreate", 12040, 0, "cuArrayDestroy", "cuArrayDestroy", 12040, K_ARRAY3D2, 0, 1},
    {"cuArray3DCreate", "cuArray3DCreate", 2000, 0, "cuArrayDestroy", "cuArrayDestroy", 2000, K_ARRAY3D1, 0, 1},
    {"cuMipmappedArrayCreate", "cuMipmappedArrayCreate", 12040, 0, "cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy", 12040, K_MIPMAP, 0, 1},
};
#define NPATHS ((int)(sizeof paths / sizeof paths[0]))

static void *g_fa, *g_ff; /* the path's allocation and free, resolved */

static void resolve_path(const struct path *p)
{
    g_fa = resolve(p->a_exp, p->a_base, p->a_ver, p->ptsz);
    g_ff = resolve(p->f_exp, p->f_base, p->f_ver, p->ptsz);
}

static CUmemAllocationProp vmm_prop(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    return prop;
}

static CUgraphNodeParams alloc_node_params(uint64_t bytes)
{
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    np.u.alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    np.u.alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    np.u.alloc.bytesize = bytes;
    return np;
}

static CUresult do_free(const struct path *p, uint64_t h);

/* Allocate `bytes` (for pitch: width x height whose product is bytes) the path's way. */
static CUresult do_alloc(const struct path *p, uint64_t bytes, uint64_t *h)
{
    CUresult r = CUDA_ERROR_UNKNOWN;
    *h = 0;
    if (g_fa == NULL || g_ff == NULL)
        return CUDA_ERROR_NOT_FOUND;
    switch (p->kind) {
    case K_V2: {
        CUdeviceptr d = 0;
        r = ((__typeof__(&cuMemAlloc_v2))g_fa)(&d, bytes);
        *h = d;
        break;
    }
    case K_V1: {
        CUdeviceptr_v1 d = 0;
        r = ((__typeof__(&cuMemAlloc))g_fa)(&d, (unsigned int)bytes);
        *h = d;
        break;
    }
    case K_PITCH2:
    case K_PITCH1: {
        uint64_t w = bytes, ht = 1;
        if (bytes >= 4096 && bytes % 4096 == 0) {
            w = 4096;
            ht = bytes / 4096;
        }
        if (p->kind == K_PITCH2) {
            CUdeviceptr d = 0;
            size_t pitch = 0;
            r = ((__typeof__(&cuMemAllocPitch_v2))g_fa)(&d, &pitch, w, ht, 4);
            *h = d;
        } else {
            CUdeviceptr_v1 d = 0;
            unsigned int pitch = 0;
            r = ((__typeof__(&cuMemAllocPitch))g_fa)(&d, &pitch, (unsigned)w, (unsigned)ht, 4);
            *h = d;
        }
        break;
    }
    case K_MANAGED: {
        CUdeviceptr d = 0;
        r = ((__typeof__(&cuMemAllocManaged))g_fa)(&d, bytes, CU_MEM_ATTACH_GLOBAL);
        *h = d;
        break;
    }
    case K_ASYNC: {
        CUdeviceptr d = 0;
        r = ((__typeof__(&cuMemAllocAsync))g_fa)(&d, bytes, NULL);
        *h = d;
        break;
    }
    case K_POOL: {
        CUdeviceptr d = 0;
        r = ((__typeof__(&cuMemAllocFromPoolAsync))g_fa)(&d, bytes, g_pool, NULL);
        *h = d;
        break;
    }
    case K_VMM: {
        CUmemAllocationProp prop = vmm_prop();
        CUmemGenericAllocationHandle hd = 0;
        r = ((__typeof__(&cuMemCreate))g_fa)(&hd, bytes, &prop, 0);
        *h = hd;
        break;
    }
    case K_GNODE:
    case K_GADD:
    case K_GADD2: {
        CUgraph g = NULL;
        CUgraphNode n = NULL;
        if (cuGraphCreate(&g, 0) != CUDA_SUCCESS)
            return CUDA_ERROR_UNKNOWN;
        CUgraphNodeParams np = alloc_node_params(bytes);
        if (p->kind == K_GNODE)
            r = ((__typeof__(&cuGraphAddMemAllocNode))g_fa)(&n, g, NULL, 0, &np.u.alloc);
        else if (p->kind == K_GADD)
            r = ((__typeof__(&cuGraphAddNode))g_fa)(&n, g, NULL, 0, &np);
        else
            r = ((__typeof__(&cuGraphAddNode_v2))g_fa)(&n, g, NULL, NULL, 0, &np);
        *h = (uint64_t)(uintptr_t)g;
        if (r != CUDA_SUCCESS) {
            do_free(p, *h);
            *h = 0;
        }
        break;
    }
    case K_HOSTALLOC: {
        void *q = NULL;
        r = ((__typeof__(&cuMemHostAlloc))g_fa)(&q, bytes, CU_MEMHOSTALLOC_PORTABLE);
        *h = (uint64_t)(uintptr_t)q;
        break;
    }
    case K_ALLOCHOST2: {
        void *q = NULL;
        r = ((__typeof__(&cuMemAllocHost_v2))g_fa)(&q, bytes);
        *h = (uint64_t)(uintptr_t)q;
        break;
    }
    case K_ALLOCHOST1: {
        void *q = NULL;
        r = ((__typeof__(&cuMemAllocHost))g_fa)(&q, (unsigned int)bytes);
        *h = (uint64_t)(uintptr_t)q;
        break;
    }
    case K_ARRAY2:
    case K_ARRAY1:
    case K_ARRAY3D2:
    case K_ARRAY3D1:
    case K_MIPMAP: {
        /* One-byte texels: width x height (x 1) is the bytes asked for. */
        uint64_t w = bytes, ht = 1;
        if (bytes >= 4096 && bytes % 4096 == 0) {
            w = 4096;
            ht = bytes / 4096;
        }
        CUarray a = NULL;
        CUmipmappedArray m = NULL;
        CUarray_format u8 = CU_AD_FORMAT_UNSIGNED_INT8;
        if (p->kind == K_ARRAY2) {
            CUDA_ARRAY_DESCRIPTOR d = {w, ht, u8, 1};
            r = ((__typeof__(&cuArrayCreate_v2))g_fa)(&a, &d);
        } else if (p->kind == K_ARRAY1) {
            CUDA_ARRAY_DESCRIPTOR_v1 d = {(unsigned)w, (unsigned)ht, u8, 1};
            r = ((__typeof__(&cuArrayCreate))g_fa)(&a, &d);
        } else if (p->kind == K_ARRAY3D2) {
            CUDA_ARRAY3D_DESCRIPTOR d = {w, ht, 1, u8, 1, 0};
            r = ((__typeof__(&cuArray3DCreate_v2))g_fa)(&a, &d);
        } else if (p->kind == K_ARRAY3D1) {
            CUDA_ARRAY3D_DESCRIPTOR_v1 d = {(unsigned)w, (unsigned)ht, 1, u8, 1, 0};
            r = ((__typeof__(&cuArray3DCreate))g_fa)(&a, &d);
        } else {
            CUDA_ARRAY3D_DESCRIPTOR d = {w, ht, 0, u8, 1, 0};
            r = ((__typeof__(&cuMipmappedArrayCreate))g_fa)(&m, &d, 1);
        }
        *h = p->kind == K_MIPMAP ? (uint64_t)(uintptr_t)m : (uint64_t)(uintptr_t)a;
        break;
    }
    case K_HOSTREG: {
        void *q = NULL;
        if (posix_memalign(&q, 4096, (bytes + 4095) / 4096 * 4096) != 0)
            return CUDA_ERROR_UNKNOWN;
        r = ((__typeof__(&cuMemHostRegister_v2))g_fa)(q, bytes, 0);
        if (r != CUDA_SUCCESS)
            free(q);
        else
            *h = (uint64_t)(uintptr_t)q;
        break;
    }
    }
    return r;
}

static CUresult do_free(const struct path *p, uint64_t h)
{
    CUresult r = CUDA_ERROR_UNKNOWN;
    switch (p->kind) {
    case K_V2:
    case K_PITCH2:
    case K_MANAGED:
        r = ((__typeof__(&cuMemFree_v2))g_ff)(h);
        break;
    case K_V1:
    case K_PITCH1:
        r = ((__typeof__(&cuMemFree))g_ff)((CUdeviceptr_v1)h);
        break;
    case K_ASYNC:
    case K_POOL:
        r = ((__typeof__(&cuMemFreeAsync))g_ff)(h, NULL);
        break;
    case K_VMM:
        r = ((__typeof__(&cuMemRelease))g_ff)(h);
        break;
    case K_GNODE:
    case K_GADD:
    case K_GADD2:
        r = ((__typeof__(&cuGraphDestroy))g_ff)((CUgraph)(uintptr_t)h);
        break;
    case K_HOSTALLOC:
    case K_ALLOCHOST2:
    case K_ALLOCHOST1:
        r = ((__typeof__(&cuMemFreeHost))g_ff)((void *)(uintptr_t)h);
        break;
    case K_HOSTREG:
        r = ((__typeof__(&cuMemHostUnregister))g_ff)((void *)(uintptr_t)h);
        if (r == CUDA_SUCCESS)
            free((void *)(uintptr_t)h);
        break;
    case K_ARRAY2:
    case K_ARRAY1:
    case K_ARRAY3D2:
    case K_ARRAY3D1:
        r = ((__typeof__(&cuArrayDestroy))g_ff)((CUarray)(uintptr_t)h);
        break;
    case K_MIPMAP:
        r = ((__typeof__(&cuMipmappedArrayDestroy))g_ff)((CUmipmappedArray)(uintptr_t)h);
        break;
    }
    return r;
}

/* ============================================================================================
 * The cases (child side)
 * ============================================================================================ */
struct tcase;
typedef void (*run_fn)(const struct tcase *);
typedef int (*host_fn)(const struct tcase *, const char *share, char *why, size_t n);

enum {
    SETUP_FILE, SETUP_FD, SETUP_FD_RDONLY, SETUP_FD_CLOSED, SETUP_FD_GARBAGE, SETUP_NONE,
    SETUP_MISSING
};
enum { BODY_OK, BODY_BADMAGIC, BODY_BADVERSION, BODY_BADNSLOTS, BODY_SHORT, BODY_LONG };

struct tcase {
    char name[80];
    run_fn run;
    int path, way;
    uint64_t limit, pinned;
    int setup, body;
    const char *expect_msg;      /* exactly one interposer line containing this; NULL: none */
    long long want_refused;      /* refused_allocations afterwards, -1 unchecked */
    long long want_sharing;      /* refused_sharing afterwards, -1 unchecked */
    int internal;                /* GSAAS_STANDIN_PROC_INTERNAL=1 */
    int timeout_s;
    host_fn prep, post;          /* harness-side, before and after */
    uint64_t want_used;          /* device bytes left in live slots afterwards */
};

/* ---- every counted path, each way: up to the limit, one byte more, the room given back ---- */
static void case_path(const struct tcase *c)
{
    const struct path *p = &paths[c->path];
    g_way = c->way;
    ctx_init();
    resolve_path(p);
    uint64_t L = p->pinned ? c->pinned : c->limit, unit = L / 4;
    uint64_t r0 = refused(), h1 = 0, h2 = 0, h3 = 0, hx = 0;
    EXPECT_R(do_alloc(p, L - unit, &h1), CUDA_SUCCESS);
    EXPECT_R(do_alloc(p, unit, &h2), CUDA_SUCCESS);
    EXPECT_EQ(used(p->pinned), L);
    EXPECT(slot_of(getpid()) >= 0, "no slot of its own");
    if (p->driver_counts)
        EXPECT_EQ(driver_used(p->pinned), L);
    unsigned long long calls = gsaas_standin_calls(p->a_exp);
    EXPECT_R(do_alloc(p, 1, &hx), OOM);
    EXPECT_EQ(refused(), r0 + 1);
    EXPECT_EQ(gsaas_standin_calls(p->a_exp), calls); /* refused before the driver saw it */
    EXPECT_EQ(used(p->pinned), L);
    if (p->driver_counts)
        EXPECT_EQ(driver_used(p->pinned), L);
    EXPECT_R(do_free(p, h2), CUDA_SUCCESS);
    EXPECT_EQ(used(p->pinned), L - unit);
    EXPECT_R(do_alloc(p, unit, &h3), CUDA_SUCCESS);
    EXPECT_EQ(used(p->pinned), L);
    EXPECT_R(do_free(p, h3), CUDA_SUCCESS);
    EXPECT_R(do_free(p, h1), CUDA_SUCCESS);
    EXPECT_EQ(used(p->pinned), 0);
    EXPECT_EQ(used(!p->pinned), 0);
    if (p->driver_counts)
        EXPECT_EQ(driver_used(p->pinned), 0);
    /* A free of something never allocated gives nothing back. */
    EXPECT_R(do_alloc(p, unit, &h1), CUDA_SUCCESS);
    if (p->kind != K_GNODE && p->kind != K_GADD && p->kind != K_GADD2 && p->kind != K_HOSTREG) {
        CUresult r = do_free(p, 0x7777000ull);
        EXPECT(r != CUDA_SUCCESS, "bogus free succeeded");
        EXPECT_EQ(used(p->pinned), unit);
    }
    EXPECT_R(do_free(p, h1), CUDA_SUCCESS);
    EXPECT_EQ(used(p->pinned), 0);
}

/* ---- arrays: counted at their texels (channels, mipmap levels, layers); a sparse one not
 * until mapped; a format this library does not know at the widest texel, refused past the
 * limit before the driver sees it ---- */
static void case_array_sizes(const struct tcase *c)
{
    (void)c;
    ctx_init();
    CUarray a = NULL;
    CUmipmappedArray m = NULL;
    CUDA_ARRAY3D_DESCRIPTOR rgba = {64, 64, 0, CU_AD_FORMAT_FLOAT, 4, 0};
    EXPECT_R(cuArray3DCreate_v2(&a, &rgba), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 64 * 64 * 16);
    EXPECT_EQ(driver_used(0), 64 * 64 * 16);
    EXPECT_R(cuArrayDestroy(a), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);
    /* Three levels of 8 x 8 one-byte texels: 64 + 16 + 4. */
    CUDA_ARRAY3D_DESCRIPTOR mip = {8, 8, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
    EXPECT_R(cuMipmappedArrayCreate(&m, &mip, 3), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 84);
    EXPECT_EQ(driver_used(0), 84);
    EXPECT_R(cuMipmappedArrayDestroy(m), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);
    /* Three layers of 16 x 16 half2, two levels: layers do not shrink, (256 + 64) x 3 x 4. */
    CUDA_ARRAY3D_DESCRIPTOR layered = {16, 16, 3, CU_AD_FORMAT_HALF, 2, CUDA_ARRAY3D_LAYERED};
    EXPECT_R(cuMipmappedArrayCreate(&m, &layered, 2), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 3840);
    EXPECT_EQ(driver_used(0), 3840);
    /* A mipmapped array is not an array: the wrong free gives nothing back. */
    EXPECT(cuArrayDestroy((CUarray)(uintptr_t)m) != CUDA_SUCCESS, "an array free took a mipmap");
    EXPECT_EQ(used(0), 3840);
    EXPECT_R(cuMipmappedArrayDestroy(m), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);
    /* Sparse: no memory until cuMemMapArrayAsync maps a cuMemCreate'd handle (counted there). */
    CUDA_ARRAY3D_DESCRIPTOR sparse = {4096, 4096, 0, CU_AD_FORMAT_FLOAT, 4, CUDA_ARRAY3D_SPARSE};
    EXPECT_R(cuArray3DCreate_v2(&a, &sparse), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);
    EXPECT_R(cuArrayDestroy(a), CUDA_SUCCESS);
    /* The same without the flag is far past the limit: refused before the driver. */
    sparse.Flags = 0;
    unsigned long long calls = gsaas_standin_calls("cuArray3DCreate_v2");
    EXPECT_R(cuArray3DCreate_v2(&a, &sparse), OOM);
    /* An unknown format counts 16 bytes a texel: 65,537 of them pass 1 MiB. */
    CUDA_ARRAY3D_DESCRIPTOR unknown = {65537, 0, 0, (CUarray_format)0x7f, 1, 0};
    EXPECT_R(cuArray3DCreate_v2(&a, &unknown), OOM);
    EXPECT_EQ(gsaas_standin_calls("cuArray3DCreate_v2"), calls);
    EXPECT_EQ(used(0), 0);
    /* The legacy 32-bit descriptor. */
    CUDA_ARRAY_DESCRIPTOR_v1 legacy = {16, 16, CU_AD_FORMAT_FLOAT, 1};
    EXPECT_R(cuArrayCreate(&a, &legacy), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 1024);
    EXPECT_R(cuArrayDestroy(a), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);
    EXPECT_EQ(driver_used(0), 0);
}

/* ---- pitch: the padding is counted; padding past the limit is freed and refused ---- */
static void case_pitch_padding(const struct tcase *c)
{
    (void)c;
    ctx_init();
    CUdeviceptr d = 0;
    size_t pitch = 0;
    /* limit 1 MiB: 1000-byte rows are padded to 1024 by the stand-in */
    EXPECT_R(cuMemAllocPitch_v2(&d, &pitch, 1000, 1024, 4), CUDA_SUCCESS);
    EXPECT_EQ(pitch, 1024);
    EXPECT_EQ(used(0), 1024 * 1024);
    EXPECT_R(cuMemFree_v2(d), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);
    unsigned long long frees = gsaas_standin_calls("cuMemFree_v2");
    d = 1;
    /* 1000 x 1025 = 1025000 fits; 1024 x 1025 = 1049600 does not: called, freed, refused */
    EXPECT_R(cuMemAllocPitch_v2(&d, &pitch, 1000, 1025, 4), OOM);
    EXPECT_EQ(d, 0);
    EXPECT_EQ(gsaas_standin_calls("cuMemFree_v2"), frees + 1);
    EXPECT_EQ(used(0), 0);
    EXPECT_EQ(driver_used(0), 0);
    EXPECT_EQ(refused(), 1);
    /* a lower bound past the limit never reaches the driver */
    unsigned long long calls = gsaas_standin_calls("cuMemAllocPitch_v2");
    EXPECT_R(cuMemAllocPitch_v2(&d, &pitch, 4096, 257, 4), OOM);
    EXPECT_EQ(gsaas_standin_calls("cuMemAllocPitch_v2"), calls);
    EXPECT_EQ(refused(), 2);
}

/* ---- cuCtxSetLimit: heap and FIFO at their value, stack at value x SMs x threads/SM ---- */
static void case_ctxlimit(const struct tcase *c)
{
    g_way = c->way;
    ctx_init();
    __typeof__(&cuCtxSetLimit) setlim = R(cuCtxSetLimit, "cuCtxSetLimit", "cuCtxSetLimit", 12040, 0);
    __typeof__(&cuMemAlloc_v2) alloc = R(cuMemAlloc_v2, "cuMemAlloc_v2", "cuMemAlloc", 12040, 0);
    __typeof__(&cuMemFree_v2) mfree = R(cuMemFree_v2, "cuMemFree_v2", "cuMemFree", 12040, 0);
    __typeof__(&cuCtxDestroy_v2) destroy = R(cuCtxDestroy_v2, "cuCtxDestroy_v2", "cuCtxDestroy", 12040, 0);
    if (setlim == NULL || alloc == NULL || mfree == NULL || destroy == NULL)
        return;
    const uint64_t L = c->limit; /* 64 MiB */
    CUdeviceptr d = 0;
    size_t v = 0;
    uint64_t r0 = refused();

    /* heap */
    EXPECT_R(setlim(CU_LIMIT_MALLOC_HEAP_SIZE, 32 * MiB), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 32 * MiB);
    EXPECT_R(setlim(CU_LIMIT_MALLOC_HEAP_SIZE, L), CUDA_SUCCESS); /* replaces: L, not L + 32 */
    EXPECT_EQ(used(0), L);
    EXPECT_R(setlim(CU_LIMIT_MALLOC_HEAP_SIZE, L + 1), OOM);
    EXPECT_EQ(refused(), r0 + 1);
    EXPECT_R(cuCtxGetLimit(&v, CU_LIMIT_MALLOC_HEAP_SIZE), CUDA_SUCCESS);
    EXPECT_EQ(v, L); /* the refused value never reached the driver */
    EXPECT_R(alloc(&d, 1), OOM);
    EXPECT_EQ(refused(), r0 + 2);
    EXPECT_R(setlim(CU_LIMIT_MALLOC_HEAP_SIZE, 16 * MiB), CUDA_SUCCESS); /* lowering gives back */
    EXPECT_EQ(used(0), 16 * MiB);
    EXPECT_R(alloc(&d, L - 16 * MiB), CUDA_SUCCESS);
    EXPECT_EQ(used(0), L);
    EXPECT_R(mfree(d), CUDA_SUCCESS);
    EXPECT_R(setlim(CU_LIMIT_MALLOC_HEAP_SIZE, 0), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);

    /* printf FIFO */
    EXPECT_R(setlim(CU_LIMIT_PRINTF_FIFO_SIZE, L), CUDA_SUCCESS);
    EXPECT_EQ(used(0), L);
    EXPECT_R(setlim(CU_LIMIT_PRINTF_FIFO_SIZE, L + 1), OOM);
    EXPECT_R(setlim(CU_LIMIT_PRINTF_FIFO_SIZE, 8 * MiB), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 8 * MiB);
    EXPECT_R(setlim(CU_LIMIT_PRINTF_FIFO_SIZE, 0), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);

    /* stack: per thread, times every resident thread */
    const uint64_t per = (uint64_t)STANDIN_SMS * STANDIN_THREADS;
    const uint64_t most = L / per;
    EXPECT_R(setlim(CU_LIMIT_STACK_SIZE, most), CUDA_SUCCESS);
    EXPECT_EQ(used(0), most * per);
    EXPECT_R(setlim(CU_LIMIT_STACK_SIZE, most + 1), OOM);
    EXPECT_R(setlim(CU_LIMIT_STACK_SIZE, most / 2), CUDA_SUCCESS);
    EXPECT_EQ(used(0), most / 2 * per);
    EXPECT_R(alloc(&d, L - most / 2 * per), CUDA_SUCCESS);
    EXPECT_EQ(used(0), L);
    EXPECT_R(mfree(d), CUDA_SUCCESS);

    /* a limit that is no memory is not counted */
    EXPECT_R(setlim(CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, 1u << 30), CUDA_SUCCESS);
    EXPECT_EQ(used(0), most / 2 * per);

    /* destroying the context gives every limit back */
    EXPECT_R(setlim(CU_LIMIT_MALLOC_HEAP_SIZE, 8 * MiB), CUDA_SUCCESS);
    EXPECT_R(setlim(CU_LIMIT_PRINTF_FIFO_SIZE, 4 * MiB), CUDA_SUCCESS);
    EXPECT_EQ(used(0), most / 2 * per + 12 * MiB);
    EXPECT_R(destroy(g_ctx), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);
    EXPECT_EQ(refused(), r0 + 4);
}

/* ---- VMM: a released handle stays counted while any mapping of it lives (HAMi-core's hole) ---- */
static void case_vmm_mapped(const struct tcase *c)
{
    g_way = c->way;
    ctx_init();
    __typeof__(&cuMemCreate) create = R(cuMemCreate, "cuMemCreate", "cuMemCreate", 12040, 0);
    __typeof__(&cuMemRelease) release = R(cuMemRelease, "cuMemRelease", "cuMemRelease", 12040, 0);
    __typeof__(&cuMemMap) map = R(cuMemMap, "cuMemMap", "cuMemMap", 12040, 0);
    __typeof__(&cuMemUnmap) unmap = R(cuMemUnmap, "cuMemUnmap", "cuMemUnmap", 12040, 0);
    __typeof__(&cuMemRetainAllocationHandle) retain =
        R(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle", 12040, 0);
    __typeof__(&cuMemAlloc_v2) alloc = R(cuMemAlloc_v2, "cuMemAlloc_v2", "cuMemAlloc", 12040, 0);
    __typeof__(&cuMemFree_v2) mfree = R(cuMemFree_v2, "cuMemFree_v2", "cuMemFree", 12040, 0);
    if (!create || !release || !map || !unmap || !retain || !alloc || !mfree)
        return;
    const uint64_t L = c->limit; /* 8 MiB */
    CUmemAllocationProp prop = vmm_prop();
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    CUdeviceptr va = 0, d = 0;
    EXPECT_R(cuMemAddressReserve(&va, 2 * L, 0, 0, 0), CUDA_SUCCESS);

    /* two mappings of one handle, then the handle released */
    EXPECT_R(create(&h, L, &prop, 0), CUDA_SUCCESS);
    EXPECT_EQ(used(0), L);
    EXPECT_R(map(va, L, 0, h, 0), CUDA_SUCCESS);
    EXPECT_R(map(va + L, L, 0, h, 0), CUDA_SUCCESS);
    EXPECT_R(release(h), CUDA_SUCCESS);
    EXPECT_EQ(driver_used(0), L);          /* the driver still holds it ... */
    EXPECT_EQ(used(0), L);                 /* ... so it still counts */
    EXPECT_R(alloc(&d, 1), OOM);           /* with HAMi-core's accounting this succeeded */
    EXPECT_R(unmap(va, L), CUDA_SUCCESS);
    EXPECT_EQ(used(0), L);                 /* one mapping left */
    EXPECT_EQ(driver_used(0), L);
    EXPECT_R(alloc(&d, 1), OOM);
    EXPECT_R(unmap(va + L, L), CUDA_SUCCESS);
    EXPECT_EQ(driver_used(0), 0);          /* last mapping gone: the driver freed it ... */
    EXPECT_EQ(used(0), 0);                 /* ... and it stops counting */
    EXPECT_R(alloc(&d, L), CUDA_SUCCESS);
    EXPECT_R(mfree(d), CUDA_SUCCESS);

    /* unmapped first, released last: freed at the release */
    EXPECT_R(create(&h, L, &prop, 0), CUDA_SUCCESS);
    EXPECT_R(map(va, L, 0, h, 0), CUDA_SUCCESS);
    EXPECT_R(unmap(va, L), CUDA_SUCCESS);
    EXPECT_EQ(used(0), L);
    EXPECT_R(release(h), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);

    /* a retained handle keeps it alive after the creator's release and the unmap */
    EXPECT_R(create(&h, L, &prop, 0), CUDA_SUCCESS);
    EXPECT_R(map(va, L, 0, h, 0), CUDA_SUCCESS);
    EXPECT_R(retain(&h2, (void *)(uintptr_t)(va + 4096)), CUDA_SUCCESS);
    EXPECT_EQ(h2, h);
    EXPECT_R(release(h), CUDA_SUCCESS);
    EXPECT_R(unmap(va, L), CUDA_SUCCESS);
    EXPECT_EQ(driver_used(0), L);
    EXPECT_EQ(used(0), L);
    EXPECT_R(release(h2), CUDA_SUCCESS);
    EXPECT_EQ(driver_used(0), 0);
    EXPECT_EQ(used(0), 0);

    /* a mapping the driver refuses is no mapping */
    EXPECT_R(create(&h, L / 4, &prop, 0), CUDA_SUCCESS);
    CUresult r = map(va, L, 0, h, 0); /* larger than the handle */
    EXPECT(r != CUDA_SUCCESS, "oversized map succeeded");
    EXPECT_R(release(h), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);

    /* a release the driver refuses (double release) uncounts nothing */
    EXPECT_R(create(&h, L / 2, &prop, 0), CUDA_SUCCESS);
    EXPECT_R(map(va, L / 2, 0, h, 0), CUDA_SUCCESS);
    EXPECT_R(release(h), CUDA_SUCCESS);
    r = release(h);
    EXPECT(r != CUDA_SUCCESS, "double release succeeded");
    EXPECT_EQ(used(0), L / 2);
    EXPECT_R(unmap(va, L / 2), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);
    EXPECT_R(cuMemAddressFree(va, 2 * L), CUDA_SUCCESS);
}

/* ---- graph memory nodes: counted from the node until cuGraphDestroy ---- */
static void case_graph(const struct tcase *c)
{
    (void)c;
    ctx_init();
    const uint64_t L = c->limit; /* 48 MiB */
    CUgraph g = NULL, g2 = NULL;
    CUgraphNode n1, n2, n3, nf, ne, nx;
    EXPECT_R(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    CUgraphNodeParams a = alloc_node_params(16 * MiB), b = alloc_node_params(16 * MiB),
                      cc = alloc_node_params(16 * MiB), x = alloc_node_params(1);
    EXPECT_R(cuGraphAddMemAllocNode(&n1, g, NULL, 0, &a.u.alloc), CUDA_SUCCESS);
    EXPECT_R(cuGraphAddNode(&n2, g, &n1, 1, &b), CUDA_SUCCESS);
    EXPECT_R(cuGraphAddNode_v2(&n3, g, &n2, NULL, 1, &cc), CUDA_SUCCESS);
    EXPECT_EQ(used(0), L);
    EXPECT_R(cuGraphAddMemAllocNode(&nx, g, NULL, 0, &x.u.alloc), OOM);
    /* a free node does not end the count: the graph may run again */
    EXPECT_R(cuGraphAddMemFreeNode(&nf, g, &n3, 1, a.u.alloc.dptr), CUDA_SUCCESS);
    EXPECT_EQ(used(0), L);
    /* nodes that allocate nothing are not counted */
    CUgraphNodeParams e;
    memset(&e, 0, sizeof e);
    e.type = CU_GRAPH_NODE_TYPE_EMPTY;
    EXPECT_R(cuGraphAddNode(&ne, g, NULL, 0, &e), CUDA_SUCCESS);
    EXPECT_EQ(used(0), L);
    EXPECT_R(cuGraphCreate(&g2, 0), CUDA_SUCCESS);
    EXPECT_R(cuGraphAddNode(&nx, g2, NULL, 0, &x), OOM);
    EXPECT_EQ(refused(), 2);
    EXPECT_R(cuGraphDestroy(g), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);
    CUgraphNodeParams big = alloc_node_params(L);
    EXPECT_R(cuGraphAddNode(&nx, g2, NULL, 0, &big), CUDA_SUCCESS);
    EXPECT_EQ(used(0), L);
    EXPECT_R(cuGraphDestroy(g2), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);
}

/* ---- sharing calls: refused with 801, every way, whatever the limit ---- */
static const struct {
    const char *exp, *base;
    int ver;
} sharing_calls[] = {
    {"cuIpcGetMemHandle", "cuIpcGetMemHandle", 12040},
    {"cuIpcOpenMemHandle", "cuIpcOpenMemHandle", 4010},
    {"cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle", 12040},
    {"cuIpcCloseMemHandle", "cuIpcCloseMemHandle", 12040},
    {"cuIpcGetEventHandle", "cuIpcGetEventHandle", 12040},
    {"cuIpcOpenEventHandle", "cuIpcOpenEventHandle", 12040},
    {"cuMemExportToShareableHandle", "cuMemExportToShareableHandle", 12040},
    {"cuMemImportFromShareableHandle", "cuMemImportFromShareableHandle", 12040},
    {"cuMemPoolExportToShareableHandle", "cuMemPoolExportToShareableHandle", 12040},
    {"cuMemPoolImportFromShareableHandle", "cuMemPoolImportFromShareableHandle", 12040},
    {"cuMemPoolExportPointer", "cuMemPoolExportPointer", 12040},
    {"cuMemPoolImportPointer", "cuMemPoolImportPointer", 12040},
    {"cuImportExternalMemory", "cuImportExternalMemory", 12040},
    {"cuImportExternalSemaphore", "cuImportExternalSemaphore", 12040},
    {"cuMemGetHandleForAddressRange", "cuMemGetHandleForAddressRange", 12040},
};
#define NSHARING ((int)(sizeof sharing_calls / sizeof sharing_calls[0]))

/* Call every sharing entry point the current way; returns how many answered 801. */
static int try_sharing(int check_wrapper)
{
    void *f[NSHARING];
    for (int i = 0; i < NSHARING; i++) {
        if (check_wrapper) {
            f[i] = resolve(sharing_calls[i].exp, sharing_calls[i].base, sharing_calls[i].ver, 0);
        } else {
            f[i] = NULL;
            for (size_t j = 0; j < sizeof direct_syms / sizeof direct_syms[0]; j++)
                if (strcmp(direct_syms[j].name, sharing_calls[i].exp) == 0)
                    f[i] = direct_syms[j].addr;
        }
        if (f[i] == NULL)
            return -1;
    }
    CUdeviceptr d = 0x100000000000ull, out = 0; /* no allocation: refusals would count */
    CUipcMemHandle mh;
    CUipcEventHandle eh;
    CUevent ev = NULL;
    CUmemGenericAllocationHandle gh = 0;
    CUmemoryPool pool = NULL;
    CUmemPoolPtrExportData pd;
    CUexternalMemory em = NULL;
    CUexternalSemaphore es = NULL;
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC emd;
    CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC esd;
    int fd = -1;
    memset(&mh, 0, sizeof mh);
    memset(&eh, 0, sizeof eh);
    memset(&pd, 0, sizeof pd);
    memset(&emd, 0, sizeof emd);
    memset(&esd, 0, sizeof esd);
    emd.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
    emd.handle.fd = 0;
    emd.size = 1 * MiB;
    esd.type = CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD;
    CUresult r[NSHARING];
    int i = 0;
    r[i] = ((__typeof__(&cuIpcGetMemHandle))f[i])(&mh, d), i++;
    r[i] = ((__typeof__(&cuIpcOpenMemHandle))f[i])(&out, mh, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), i++;
    r[i] = ((__typeof__(&cuIpcOpenMemHandle_v2))f[i])(&out, mh, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), i++;
    r[i] = ((__typeof__(&cuIpcCloseMemHandle))f[i])(d), i++;
    r[i] = ((__typeof__(&cuIpcGetEventHandle))f[i])(&eh, ev), i++;
    r[i] = ((__typeof__(&cuIpcOpenEventHandle))f[i])(&ev, eh), i++;
    r[i] = ((__typeof__(&cuMemExportToShareableHandle))f[i])(&fd, gh, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), i++;
    r[i] = ((__typeof__(&cuMemImportFromShareableHandle))f[i])(&gh, (void *)(intptr_t)0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), i++;
    r[i] = ((__typeof__(&cuMemPoolExportToShareableHandle))f[i])(&fd, g_pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), i++;
    r[i] = ((__typeof__(&cuMemPoolImportFromShareableHandle))f[i])(&pool, (void *)(intptr_t)0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), i++;
    r[i] = ((__typeof__(&cuMemPoolExportPointer))f[i])(&pd, d), i++;
    r[i] = ((__typeof__(&cuMemPoolImportPointer))f[i])(&out, g_pool, &pd), i++;
    r[i] = ((__typeof__(&cuImportExternalMemory))f[i])(&em, &emd), i++;
    r[i] = ((__typeof__(&cuImportExternalSemaphore))f[i])(&es, &esd), i++;
    r[i] = ((__typeof__(&cuMemGetHandleForAddressRange))f[i])(&fd, d, 4096, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0), i++;
    int n = 0;
    for (i = 0; i < NSHARING; i++) {
        EXPECT(r[i] == NOTSUP, "%s answered %d, want 801", sharing_calls[i].exp, (int)r[i]);
        EXPECT(gsaas_standin_calls(sharing_calls[i].exp) == 0, "%s reached the driver", sharing_calls[i].exp);
        n += r[i] == NOTSUP;
    }
    return n;
}

static void case_sharing(const struct tcase *c)
{
    g_way = c->way;
    ctx_init();
    uint64_t s0 = refused_sharing();
    EXPECT_EQ(try_sharing(1), NSHARING);
    EXPECT_EQ(refused_sharing(), s0 + NSHARING);
    EXPECT_EQ(refused(), 0);
}

/* ---- fork: parent and child draw from one limit; the child inherits no records or slot ---- */
static void case_fork(const struct tcase *c)
{
    const uint64_t L = c->limit; /* 64 MiB */
    ctx_init();
    CUdeviceptr d = 0, d2 = 0;
    EXPECT_R(cuMemAlloc_v2(&d, L / 2), CUDA_SUCCESS);
    int ps = slot_of(getpid());
    EXPECT(ps >= 0, "no slot for the parent");
    int up[2], down[2];
    if (pipe(up) != 0 || pipe(down) != 0)
        return;
    fflush(stdout);
    pid_t kid = fork();
    if (kid == 0) {
        g_fails = 0;
        CUcontext cx;
        CUdevice dev;
        EXPECT_R(cuInit(0), CUDA_SUCCESS);
        EXPECT_R(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
        EXPECT_R(cuCtxCreate_v2(&cx, 0, dev), CUDA_SUCCESS);
        /* The parent's pointer is not the child's: freeing it gives nothing back. */
        CUresult r = cuMemFree_v2(d);
        EXPECT(r != CUDA_SUCCESS, "child freed the parent's pointer");
        EXPECT_EQ(used(0), L / 2);
        EXPECT_EQ(S->slots[ps].device_bytes, L / 2);
        EXPECT_R(cuMemAlloc_v2(&d2, L / 2), CUDA_SUCCESS);
        int cs = slot_of(getpid());
        EXPECT(cs >= 0 && cs != ps, "child slot %d, parent slot %d", cs, ps);
        EXPECT_EQ(S->slots[ps].device_bytes, L / 2);
        EXPECT_EQ(used(0), L);
        EXPECT_R(cuMemAlloc_v2(&d2, 1), OOM);
        char ch = 'x';
        if (write(up[1], &ch, 1) != 1 || read(down[0], &ch, 1) != 1)
            g_fails++;
        fflush(stdout);
        exit(g_fails ? 1 : 0); /* exits holding L/2: its slot is freed at exit */
    }
    char ch;
    EXPECT(read(up[0], &ch, 1) == 1, "child did not report");
    EXPECT_R(cuMemAlloc_v2(&d2, 1), OOM); /* the child's half counts against the parent */
    EXPECT_EQ(used(0), L);
    EXPECT_EQ(refused(), 2);
    ch = 'y';
    EXPECT(write(down[1], &ch, 1) == 1, "pipe");
    int st = 0;
    waitpid(kid, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed (status 0x%x)", st);
    EXPECT_EQ(used(0), L / 2);
    EXPECT(slot_of(kid) < 0, "child slot still held");
    EXPECT_R(cuMemAlloc_v2(&d2, L / 2), CUDA_SUCCESS);
    EXPECT_R(cuMemFree_v2(d2), CUDA_SUCCESS);
    EXPECT_R(cuMemFree_v2(d), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);
}

/* ---- a SIGKILLed child holding memory stops counting once its slot is reclaimed ---- */
static void case_sigkill(const struct tcase *c)
{
    const uint64_t L = c->limit; /* 64 MiB */
    ctx_init();
    int up[2];
    if (pipe(up) != 0)
        return;
    fflush(stdout);
    pid_t kid = fork();
    if (kid == 0) {
        CUcontext cx;
        CUdeviceptr d;
        cuInit(0);
        cuCtxCreate_v2(&cx, 0, 0);
        char ch = cuMemAlloc_v2(&d, 48 * MiB) == CUDA_SUCCESS ? 'k' : 'f';
        if (write(up[1], &ch, 1) != 1)
            _exit(2);
        for (;;)
            pause();
    }
    char ch = 0;
    EXPECT(read(up[0], &ch, 1) == 1 && ch == 'k', "child could not allocate");
    CUdeviceptr d = 0;
    EXPECT_R(cuMemAlloc_v2(&d, L / 2), OOM); /* the child's 48 MiB count */
    EXPECT(slot_of(kid) >= 0, "child has no slot");
    kill(kid, SIGKILL);
    for (int i = 0; i < 2000 && !is_zombie_or_gone(kid); i++)
        usleep(1000);
    /* not reaped yet: a zombie holds no GPU memory */
    EXPECT_R(cuMemAlloc_v2(&d, L / 2), CUDA_SUCCESS);
    EXPECT(slot_of(kid) < 0, "killed child's slot not reclaimed");
    EXPECT_EQ(used(0), L / 2);
    waitpid(kid, NULL, 0);
    EXPECT_R(cuMemFree_v2(d), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);
}

/* ---- stale slots left in the file: dead pid, reused pid (start time differs) ---- */
static int prep_stale(const struct tcase *c, const char *share, char *why, size_t n)
{
    (void)c, (void)why, (void)n;
    struct gsaas_share s;
    int fd = open(share, O_RDWR);
    if (fd < 0 || pread(fd, &s, sizeof s, 0) != (ssize_t)sizeof s)
        return 0;
    pid_t me = getpid();
    uint64_t st = proc_start_time(me);
    s.slots[5] = (struct gsaas_share_slot){dead_pid(), 0, 12345, 40 * MiB, 512 * 1024};
    s.slots[6] = (struct gsaas_share_slot){me, 0, st + 777, 40 * MiB, 0}; /* a former wearer of our pid */
    s.slots[7] = (struct gsaas_share_slot){me, 0, st, 10 * MiB, 0};       /* us: alive, counts */
    int ok = pwrite(fd, &s, sizeof s, 0) == (ssize_t)sizeof s;
    close(fd);
    return ok;
}

static void case_stale(const struct tcase *c)
{
    const uint64_t L = c->limit; /* 64 MiB */
    ctx_init();
    EXPECT_EQ(used(0), 90 * MiB);
    CUdeviceptr d = 0, d2 = 0;
    EXPECT_R(cuMemAlloc_v2(&d, L - 10 * MiB), CUDA_SUCCESS);
    EXPECT_EQ(S->slots[5].pid, 0);
    EXPECT_EQ(S->slots[6].pid, 0);
    EXPECT_EQ(S->slots[7].device_bytes, 10 * MiB);
    EXPECT_EQ(used(0), L);
    EXPECT_R(cuMemAlloc_v2(&d2, 1), OOM);
    EXPECT_R(cuMemFree_v2(d), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 10 * MiB);
}

static int post_stale(const struct tcase *c, const char *share, char *why, size_t n)
{
    (void)c, (void)share;
    struct gsaas_share s;
    int fd = open(share, O_RDONLY);
    int ok = fd >= 0 && pread(fd, &s, sizeof s, 0) == (ssize_t)sizeof s;
    if (fd >= 0)
        close(fd);
    if (!ok || s.slots[7].pid != getpid() || s.slots[7].device_bytes != 10 * MiB) {
        snprintf(why, n, "the live harness slot was disturbed");
        return 0;
    }
    return 1;
}

/* ---- every slot held by live processes: refused; one dies: reclaimed ---- */
static int prep_full(const struct tcase *c, const char *share, char *why, size_t n)
{
    (void)c, (void)why, (void)n;
    struct gsaas_share s;
    int fd = open(share, O_RDWR);
    if (fd < 0 || pread(fd, &s, sizeof s, 0) != (ssize_t)sizeof s)
        return 0;
    uint64_t st = proc_start_time(getpid());
    for (unsigned i = 0; i < GSAAS_SHARE_NSLOTS; i++)
        s.slots[i] = (struct gsaas_share_slot){getpid(), 0, st, 0, 0};
    int ok = pwrite(fd, &s, sizeof s, 0) == (ssize_t)sizeof s;
    close(fd);
    return ok;
}

static void case_full(const struct tcase *c)
{
    (void)c;
    ctx_init();
    CUdeviceptr d = 0;
    EXPECT_R(cuMemAlloc_v2(&d, 1 * MiB), OOM);
    EXPECT_EQ(refused(), 1);
    EXPECT_EQ(driver_used(0), 0);
    __atomic_store_n(&S->slots[3].pid, dead_pid(), __ATOMIC_RELEASE);
    EXPECT_R(cuMemAlloc_v2(&d, 1 * MiB), CUDA_SUCCESS);
    EXPECT_EQ(slot_of(getpid()), 3);
    EXPECT_R(cuMemFree_v2(d), CUDA_SUCCESS);
}

static int post_full(const struct tcase *c, const char *share, char *why, size_t n)
{
    (void)c;
    struct gsaas_share s;
    int fd = open(share, O_RDONLY);
    int ok = fd >= 0 && pread(fd, &s, sizeof s, 0) == (ssize_t)sizeof s;
    if (fd >= 0)
        close(fd);
    int live = 0;
    for (unsigned i = 0; ok && i < GSAAS_SHARE_NSLOTS; i++)
        live += s.slots[i].pid == getpid();
    if (!ok || live != 127 || s.slots[3].pid != 0) {
        snprintf(why, n, "%d harness slots left (want 127), slot 3 pid %d", live, ok ? s.slots[3].pid : -1);
        return 0;
    }
    return 1;
}

/* ---- the lock: a dead holder's lock is taken over; so is a stopped holder's, after 5 s ---- */
static int prep_lock_dead(const struct tcase *c, const char *share, char *why, size_t n)
{
    (void)c, (void)why, (void)n;
    int fd = open(share, O_RDWR);
    uint32_t pid = (uint32_t)dead_pid();
    int ok = fd >= 0 && pwrite(fd, &pid, 4, offsetof(struct gsaas_share, lock)) == 4;
    if (fd >= 0)
        close(fd);
    return ok;
}

static void case_lock_dead(const struct tcase *c)
{
    (void)c;
    ctx_init();
    CUdeviceptr d = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    EXPECT_R(cuMemAlloc_v2(&d, 1 * MiB), CUDA_SUCCESS);
    clock_gettime(CLOCK_MONOTONIC, &b);
    EXPECT(b.tv_sec - a.tv_sec < 3, "took %lds to take over a dead holder's lock", (long)(b.tv_sec - a.tv_sec));
    EXPECT_EQ(S->lock, 0);
    EXPECT_R(cuMemFree_v2(d), CUDA_SUCCESS);
}

static void case_lock_stopped(const struct tcase *c)
{
    (void)c;
    ctx_init();
    fflush(stdout);
    pid_t helper = fork();
    if (helper == 0) {
        for (;;)
            pause();
    }
    kill(helper, SIGSTOP);
    __atomic_store_n(&S->lock, (uint32_t)helper, __ATOMIC_RELEASE);
    CUdeviceptr d = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    EXPECT_R(cuMemAlloc_v2(&d, 1 * MiB), CUDA_SUCCESS);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double t = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    EXPECT(t >= GSAAS_SHARE_LOCK_STALE_MS / 1000.0 - 0.1 && t < 15, "took over after %.2fs", t);
    EXPECT_R(cuMemFree_v2(d), CUDA_SUCCESS);
    kill(helper, SIGKILL);
    waitpid(helper, NULL, 0);
}

/* ---- cuMemGetInfo shows the share, every way ---- */
static void info_both(size_t *f, size_t *t)
{
    /* every way of reaching both ABIs must agree */
    static const int ways[] = {W_DIRECT, W_GPA, W_GPA_V2, W_DLSYM, W_DLSYM_GPA};
    int saved = g_way;
    *f = *t = 0;
    for (size_t i = 0; i < sizeof ways / sizeof ways[0]; i++) {
        g_way = ways[i];
        __typeof__(&cuMemGetInfo_v2) v2 = R(cuMemGetInfo_v2, "cuMemGetInfo_v2", "cuMemGetInfo", 12040, 0);
        __typeof__(&cuMemGetInfo) v1 = R(cuMemGetInfo, "cuMemGetInfo", "cuMemGetInfo", 2000, 0);
        size_t ff = 0, tt = 0;
        unsigned int f1 = 0, t1 = 0;
        if (v2 == NULL || v1 == NULL)
            continue;
        EXPECT_R(v2(&ff, &tt), CUDA_SUCCESS);
        EXPECT_R(v1(&f1, &t1), CUDA_SUCCESS);
        if (i == 0) {
            *f = ff;
            *t = tt;
        } else {
            EXPECT(ff == *f && tt == *t, "%s way: free %zu total %zu, direct %zu %zu", way_names[ways[i]], ff, tt, *f, *t);
        }
        EXPECT_EQ(f1, ff > UINT_MAX ? UINT_MAX : ff);
        EXPECT_EQ(t1, tt > UINT_MAX ? UINT_MAX : tt);
    }
    g_way = saved;
}

static void case_meminfo(const struct tcase *c)
{
    const uint64_t L = c->limit; /* 1 GiB; the stand-in has 4 GiB */
    const uint64_t REAL = 4096 * MiB;
    ctx_init();
    size_t f, t;
    info_both(&f, &t);
    EXPECT_EQ(t, L);
    EXPECT_EQ(f, L);
    CUdeviceptr d = 0;
    EXPECT_R(cuMemAlloc_v2(&d, 256 * MiB), CUDA_SUCCESS);
    info_both(&f, &t);
    EXPECT_EQ(t, L);
    EXPECT_EQ(f, L - 256 * MiB);
    /* another process of the server: its memory is gone from this one's free */
    int up[2], down[2];
    if (pipe(up) != 0 || pipe(down) != 0)
        return;
    fflush(stdout);
    pid_t kid = fork();
    if (kid == 0) {
        CUcontext cx;
        CUdeviceptr d2;
        cuInit(0);
        cuCtxCreate_v2(&cx, 0, 0);
        char ch = cuMemAlloc_v2(&d2, 256 * MiB) == CUDA_SUCCESS ? 'k' : 'f';
        if (write(up[1], &ch, 1) != 1 || read(down[0], &ch, 1) != 1)
            _exit(2);
        exit(0);
    }
    char ch = 0;
    EXPECT(read(up[0], &ch, 1) == 1 && ch == 'k', "child could not allocate");
    info_both(&f, &t);
    EXPECT_EQ(t, L);
    EXPECT_EQ(f, L - 512 * MiB);
    EXPECT(write(down[1], &ch, 1) == 1, "pipe");
    waitpid(kid, NULL, 0);
    info_both(&f, &t);
    EXPECT_EQ(f, L - 256 * MiB);
    /* a limit above the GPU: the GPU's own numbers */
    set_limit(8 * GiB);
    info_both(&f, &t);
    EXPECT_EQ(t, REAL);
    EXPECT_EQ(f, REAL - 256 * MiB);
    /* used past a lowered limit: nothing free, never negative */
    set_limit(128 * MiB);
    info_both(&f, &t);
    EXPECT_EQ(t, 128 * MiB);
    EXPECT_EQ(f, 0);
    set_limit(UNLIMITED);
    info_both(&f, &t);
    EXPECT_EQ(t, REAL);
    EXPECT_EQ(f, REAL - 256 * MiB);
    set_limit(0);
    info_both(&f, &t);
    EXPECT_EQ(t, 0);
    EXPECT_EQ(f, 0);
    EXPECT_R(cuMemFree_v2(d), CUDA_SUCCESS);
}

/* ---- pinned and device limits are separate ---- */
static void case_pinned_separate(const struct tcase *c)
{
    ctx_init();
    void *p = NULL, *q = NULL;
    CUdeviceptr d = 0;
    EXPECT_R(cuMemHostAlloc(&p, c->pinned, 0), CUDA_SUCCESS);
    EXPECT_R(cuMemAllocHost_v2(&q, 1), OOM);
    EXPECT_R(cuMemAlloc_v2(&d, c->limit), CUDA_SUCCESS); /* the device limit is untouched */
    EXPECT_EQ(used(1), c->pinned);
    EXPECT_EQ(used(0), c->limit);
    EXPECT_R(cuMemFreeHost(p), CUDA_SUCCESS);
    EXPECT_R(cuMemAllocHost_v2(&q, c->pinned), CUDA_SUCCESS);
    EXPECT_R(cuMemFreeHost(q), CUDA_SUCCESS);
    EXPECT_R(cuMemFree_v2(d), CUDA_SUCCESS);
    /* registering the same range twice: the driver refuses the second, nothing double-counted */
    void *buf = NULL;
    EXPECT(posix_memalign(&buf, 4096, 64 * 1024) == 0, "memalign");
    EXPECT_R(cuMemHostRegister_v2(buf, 64 * 1024, 0), CUDA_SUCCESS);
    EXPECT_R(cuMemHostRegister_v2(buf, 64 * 1024, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    EXPECT_EQ(used(1), 64 * 1024);
    EXPECT_R(cuMemHostUnregister(buf), CUDA_SUCCESS);
    EXPECT_EQ(used(1), 0);
    free(buf);
}

/* ---- fail closed: no valid share state, nothing counted is given ---- */
static void case_failclosed(const struct tcase *c)
{
    (void)c;
    ctx_init();
    CUdeviceptr d = 0;
    CUdeviceptr_v1 d1 = 0;
    void *p = NULL;
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop = vmm_prop();
    CUgraph g = NULL;
    CUgraphNode n;
    CUgraphNodeParams np = alloc_node_params(1 * MiB);
    size_t pitch = 0, f = 1, t = 0;
    EXPECT_R(cuMemAlloc_v2(&d, 1), OOM);
    EXPECT_R(cuMemAlloc(&d1, 1), OOM);
    EXPECT_R(cuMemAllocPitch_v2(&d, &pitch, 512, 1, 4), OOM);
    EXPECT_R(cuMemAllocManaged(&d, 1, CU_MEM_ATTACH_GLOBAL), OOM);
    EXPECT_R(cuMemAllocAsync(&d, 1, NULL), OOM);
    EXPECT_R(cuMemAllocFromPoolAsync_ptsz(&d, 1, g_pool, NULL), OOM);
    EXPECT_R(cuMemCreate(&h, 2 * MiB, &prop, 0), OOM);
    EXPECT_R(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    EXPECT_R(cuGraphAddMemAllocNode(&n, g, NULL, 0, &np.u.alloc), OOM);
    EXPECT_R(cuGraphDestroy(g), CUDA_SUCCESS);
    EXPECT_R(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 1 * MiB), OOM);
    EXPECT_R(cuMemHostAlloc(&p, 1, 0), OOM);
    EXPECT_R(cuMemAllocHost_v2(&p, 1), OOM);
    char buf[64];
    EXPECT_R(cuMemHostRegister_v2(buf, sizeof buf, 0), OOM);
    EXPECT_R(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    EXPECT_EQ(f, 0);
    EXPECT_EQ(driver_used(0), 0);
    EXPECT_EQ(driver_used(1), 0);
    EXPECT_EQ(gsaas_standin_calls("cuMemAlloc_v2"), 0);
    EXPECT_EQ(gsaas_standin_calls("cuMemCreate"), 0);
    EXPECT_EQ(gsaas_standin_calls("cuMemHostAlloc"), 0);
    /* and through cuGetProcAddress too */
    g_way = W_GPA_V2;
    __typeof__(&cuMemAlloc_v2) alloc = R(cuMemAlloc_v2, "cuMemAlloc_v2", "cuMemAlloc", 12040, 0);
    if (alloc != NULL)
        EXPECT_R(alloc(&d, 1), OOM);
    g_way = W_DIRECT;
    /* sharing is refused as well */
    EXPECT_EQ(try_sharing(0), NSHARING);
}

/* ---- the state turning invalid while running, and valid again ---- */
static void case_becomes_invalid(const struct tcase *c)
{
    ctx_init();
    CUdeviceptr d = 0, d2 = 0;
    EXPECT_R(cuMemAlloc_v2(&d, c->limit / 2), CUDA_SUCCESS);
    __atomic_store_n(&S->magic, 0xdeadbeefu, __ATOMIC_RELEASE);
    EXPECT_R(cuMemAlloc_v2(&d2, 1), OOM);
    EXPECT_R(cuMemAlloc_v2(&d2, 1), OOM);
    size_t f = 1, t = 0;
    EXPECT_R(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    EXPECT_EQ(f, 0);
    __atomic_store_n(&S->magic, GSAAS_SHARE_MAGIC, __ATOMIC_RELEASE);
    EXPECT_R(cuMemAlloc_v2(&d2, 1), CUDA_SUCCESS);
    EXPECT_R(cuMemFree_v2(d2), CUDA_SUCCESS);
    EXPECT_R(cuMemFree_v2(d), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);
}

/* ---- the agent changes the limit while the server runs: the next allocation sees it ---- */
static void case_limit_change(const struct tcase *c)
{
    const uint64_t L = c->limit; /* 64 MiB */
    ctx_init();
    CUdeviceptr a = 0, b = 0;
    void *p = NULL, *q = NULL;
    EXPECT_R(cuMemAlloc_v2(&a, L / 2), CUDA_SUCCESS);
    set_limit(L / 4); /* lowered under what is held: nothing taken away, nothing new given */
    EXPECT_R(cuMemAlloc_v2(&b, 1), OOM);
    EXPECT_EQ(used(0), L / 2);
    EXPECT_R(cuMemFree_v2(a), CUDA_SUCCESS);
    EXPECT_R(cuMemAlloc_v2(&a, L / 4), CUDA_SUCCESS);
    EXPECT_R(cuMemAlloc_v2(&b, 1), OOM);
    set_limit(2 * L); /* raised */
    EXPECT_R(cuMemAlloc_v2(&b, L + L / 2), CUDA_SUCCESS);
    EXPECT_R(cuMemFree_v2(b), CUDA_SUCCESS);
    set_limit(UNLIMITED);
    EXPECT_R(cuMemAlloc_v2(&b, 2 * GiB), CUDA_SUCCESS);
    EXPECT_R(cuMemFree_v2(b), CUDA_SUCCESS);
    set_limit(0);
    EXPECT_R(cuMemAlloc_v2(&b, 1), OOM);
    EXPECT_R(cuMemFree_v2(a), CUDA_SUCCESS);
    EXPECT_R(cuMemAlloc_v2(&b, 1), OOM);
    /* the pinned limit likewise */
    EXPECT_R(cuMemHostAlloc(&p, 64 * 1024, 0), CUDA_SUCCESS);
    set_pinned_limit(32 * 1024);
    EXPECT_R(cuMemHostAlloc(&q, 1, 0), OOM);
    set_pinned_limit(UNLIMITED);
    EXPECT_R(cuMemHostAlloc(&q, 1 * MiB, 0), CUDA_SUCCESS);
    EXPECT_R(cuMemFreeHost(q), CUDA_SUCCESS);
    EXPECT_R(cuMemFreeHost(p), CUDA_SUCCESS);
    EXPECT_EQ(refused(), 5);
}

/* ---- UINT64_MAX: nothing refused for the limit (only by the driver), sharing still refused ---- */
static void case_unlimited(const struct tcase *c)
{
    (void)c;
    ctx_init();
    CUdeviceptr a = 0, b = 0, e = 0;
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp prop = vmm_prop();
    void *p = NULL;
    EXPECT_R(cuMemAlloc_v2(&a, 3 * GiB), CUDA_SUCCESS);
    EXPECT_R(cuMemAllocManaged(&b, 512 * MiB, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    EXPECT_R(cuMemCreate(&h, 256 * MiB, &prop, 0), CUDA_SUCCESS);
    EXPECT_R(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 1 * GiB), CUDA_SUCCESS);
    EXPECT_R(cuMemHostAlloc(&p, 8 * MiB, 0), CUDA_SUCCESS);
    EXPECT_R(cuMemAlloc_v2(&e, 1 * GiB), OOM); /* the stand-in's 4 GiB are used up: the driver says so */
    EXPECT_EQ(refused(), 0);                   /* not counted as a refusal for the limit */
    size_t f = 0, t = 0;
    EXPECT_R(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    EXPECT_EQ(t, 4096 * MiB);
    EXPECT_EQ(f, 4096 * MiB - 3 * GiB - 768 * MiB);
    EXPECT_EQ(try_sharing(1), NSHARING);
    EXPECT_R(cuMemFree_v2(a), CUDA_SUCCESS);
    EXPECT_R(cuMemFree_v2(b), CUDA_SUCCESS);
    EXPECT_R(cuMemRelease(h), CUDA_SUCCESS);
    EXPECT_R(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 0), CUDA_SUCCESS);
    EXPECT_R(cuMemFreeHost(p), CUDA_SUCCESS);
    EXPECT_EQ(used(0), 0);
    EXPECT_EQ(used(1), 0);
}

/* ---- 0: every counted path refused before the driver, sharing refused ---- */
static void case_zero(const struct tcase *c)
{
    (void)c;
    ctx_init();
    uint64_t n = 0;
    for (int i = 0; i < NPATHS; i++) {
        const struct path *p = &paths[i];
        uint64_t h = 0;
        resolve_path(p);
        EXPECT(do_alloc(p, p->kind == K_VMM ? 2 * MiB : 4096, &h) == OOM, "%s not refused", p->a_exp);
        EXPECT(gsaas_standin_calls(p->a_exp) == 0, "%s reached the driver", p->a_exp);
        n++;
    }
    EXPECT_R(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 1), OOM);
    EXPECT_R(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 1), OOM);
    n += 2;
    size_t f = 1, t = 1;
    EXPECT_R(cuMemGetInfo_v2(&f, &t), CUDA_SUCCESS);
    EXPECT_EQ(f, 0);
    EXPECT_EQ(t, 0);
    EXPECT_EQ(refused(), n);
    EXPECT_EQ(driver_used(0), 0);
    EXPECT_EQ(driver_used(1), 0);
    EXPECT_EQ(try_sharing(1), NSHARING);
}

/* ---- GSAAS_SHARE_FD: an inherited descriptor works like the file, is never closed, and an
 * exec'd image of the same process starts with its former image's slot zeroed ---- */
static void case_fd(const struct tcase *c)
{
    const uint64_t L = c->limit; /* 64 MiB */
    EXPECT(getenv("GSAAS_SHARE_FILE") == NULL, "GSAAS_SHARE_FILE set");
    EXPECT(fcntl(SHARE_FD_NUM, F_GETFD) >= 0, "descriptor %d closed by the interposer", SHARE_FD_NUM);
    ctx_init();
    CUdeviceptr a = 0, b = 0;
    EXPECT_R(cuMemAlloc_v2(&a, L), CUDA_SUCCESS);
    EXPECT_R(cuMemAlloc_v2(&b, 1), OOM);
    EXPECT_EQ(used(0), L);
    EXPECT_EQ(refused(), 1);
    EXPECT_R(cuMemFree_v2(a), CUDA_SUCCESS);
    EXPECT_R(cuMemAlloc_v2(&a, L / 2), CUDA_SUCCESS);
    EXPECT(fcntl(SHARE_FD_NUM, F_GETFD) >= 0, "descriptor %d closed", SHARE_FD_NUM);
    if (g_fails)
        return;
    /* exec with L/2 still held: the driver frees it, the new image must not count it */
    fflush(stdout);
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return;
    self[n] = '\0';
    char *argv[] = {self, "--case", "fd_exec_stage2", NULL};
    execve(self, argv, environ);
    EXPECT(0, "execve: %s", strerror(errno));
}

static void case_fd_stage2(const struct tcase *c)
{
    const uint64_t L = c->limit;
    EXPECT_EQ(used(0), 0); /* the constructor zeroed the former image's slot */
    EXPECT(fcntl(SHARE_FD_NUM, F_GETFD) >= 0, "descriptor %d not inherited", SHARE_FD_NUM);
    ctx_init();
    CUdeviceptr a = 0, b = 0;
    EXPECT_R(cuMemAlloc_v2(&a, L), CUDA_SUCCESS);
    EXPECT_R(cuMemAlloc_v2(&b, 1), OOM);
    EXPECT_EQ(refused(), 2);
    EXPECT_R(cuMemFree_v2(a), CUDA_SUCCESS);
}

/* ---- cuGetProcAddress: variants by version and flags, and what is not ours ---- */
static void case_gpa_variants(const struct tcase *c)
{
    (void)c;
    ctx_init();
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    struct {
        const char *base;
        int ver;
        cuuint64_t flags;
        const char *want;
    } t[] = {
        {"cuMemAlloc", 2000, 0, "cuMemAlloc"},
        {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
        {"cuMemAlloc", 12040, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAlloc_v2"},
        {"cuMemAllocAsync", 12040, 0, "cuMemAllocAsync"},
        {"cuMemAllocAsync", 12040, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemAllocAsync"},
        {"cuMemAllocAsync", 12040, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAllocAsync_ptsz"},
        {"cuMemFreeAsync", 12040, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemFreeAsync_ptsz"},
        {"cuMemAllocFromPoolAsync", 12040, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAllocFromPoolAsync_ptsz"},
        {"cuMemMapArrayAsync", 12040, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemMapArrayAsync_ptsz"},
        {"cuMemGetInfo", 2000, 0, "cuMemGetInfo"},
        {"cuMemGetInfo", 12040, 0, "cuMemGetInfo_v2"},
        {"cuMemHostRegister", 4000, 0, "cuMemHostRegister"},
        {"cuMemHostRegister", 6050, 0, "cuMemHostRegister_v2"},
        {"cuGraphAddNode", 12020, 0, "cuGraphAddNode"},
        {"cuGraphAddNode", 12030, 0, "cuGraphAddNode_v2"},
        {"cuCtxDestroy", 2000, 0, "cuCtxDestroy"},
        {"cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2"},
        {"cuIpcOpenMemHandle", 11000, 0, "cuIpcOpenMemHandle_v2"},
        {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
        {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        p = NULL;
        EXPECT_R(cuGetProcAddress(t[i].base, &p, t[i].ver, t[i].flags), CUDA_SUCCESS);
        EXPECT(is_wrapper(p, t[i].want), "gpa(%s, %d, %llu) gave %s, want %s", t[i].base, t[i].ver,
               (unsigned long long)t[i].flags, describe(p), t[i].want);
        p = NULL;
        EXPECT_R(cuGetProcAddress_v2(t[i].base, &p, t[i].ver, t[i].flags, &st), CUDA_SUCCESS);
        EXPECT(is_wrapper(p, t[i].want), "gpa_v2(%s, %d, %llu) gave %s, want %s", t[i].base, t[i].ver,
               (unsigned long long)t[i].flags, describe(p), t[i].want);
    }
    /* functions the interposer does not take over come back as the driver's own */
    p = NULL;
    EXPECT_R(cuGetProcAddress_v2("cuCtxCreate", &p, 12040, 0, &st), CUDA_SUCCESS);
    Dl_info di;
    EXPECT(p != NULL && dladdr(p, &di) && strstr(di.dli_fname, "standin") != NULL, "cuCtxCreate gave %s", describe(p));
    /* unknown names stay unknown */
    p = (void *)1;
    EXPECT_R(cuGetProcAddress_v2("cuNoSuchFunction", &p, 12040, 0, &st), CUDA_SUCCESS);
    EXPECT(p == NULL && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "unknown name gave %p status %d", p, (int)st);
}

/* ---- dlsym: handles, RTLD_DEFAULT, RTLD_NEXT keeps the caller's meaning ---- */
static void case_dlsym(const struct tcase *c)
{
    (void)c;
    ctx_init();
    void *h = cuda_handle();
    EXPECT(is_wrapper(dlsym(h, "cuMemAlloc_v2"), "cuMemAlloc_v2"), "handle lookup");
    EXPECT(is_wrapper(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"), "cuMemAlloc_v2"), "RTLD_DEFAULT lookup");
    EXPECT(is_wrapper(dlsym(RTLD_NEXT, "cuMemAllocAsync_ptsz"), "cuMemAllocAsync_ptsz"), "RTLD_NEXT lookup");
    EXPECT(is_wrapper(dlsym(h, "cuIpcGetMemHandle"), "cuIpcGetMemHandle"), "sharing lookup");
    /* a name the driver has but the interposer does not take: the driver's */
    void *p = dlsym(h, "cuCtxCreate_v2");
    Dl_info di;
    EXPECT(p != NULL && dladdr(p, &di) && strstr(di.dli_fname, "standin") != NULL, "cuCtxCreate_v2 gave %s", describe(p));
    /* a handle without the name: still nothing */
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    EXPECT(libc != NULL, "libc handle");
    if (libc != NULL)
        EXPECT(dlsym(libc, "cuMemAlloc_v2") == NULL, "libc handle gave a CUDA function");
    EXPECT(dlsym(h, "cuNoSuchFunction") == NULL, "unknown name found");
    /* RTLD_NEXT from this program: the next object after it is the interposer, whose dlsym
     * this is; had the wrapper not passed our return address through, glibc would have
     * searched after the interposer and found libc's */
    EXPECT(dlsym(RTLD_NEXT, "dlsym") == (void *)dlsym, "RTLD_NEXT lost the caller (got %s)", describe(dlsym(RTLD_NEXT, "dlsym")));
    /* and through the dlsym'd pointer, counting works */
    __typeof__(&cuMemAlloc_v2) alloc = (__typeof__(&cuMemAlloc_v2))dlsym(h, "cuMemAlloc_v2");
    CUdeviceptr d = 0;
    if (alloc != NULL) {
        EXPECT_R(alloc(&d, 1 * MiB), CUDA_SUCCESS);
        EXPECT_EQ(used(0), 1 * MiB);
        EXPECT_R(cuMemFree_v2(d), CUDA_SUCCESS);
    }
}

/* ---- stress: 8 processes x 4 threads allocating and freeing against one limit ---- */
#define STRESS_PROCS 8
#define STRESS_THREADS 4
#define STRESS_ITERS 400
static uint64_t *g_stress_refusals; /* shared between the workers: [0] refusals, [1] ready, [2] go */
static CUcontext g_wctx;

static void *stress_thread(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    struct {
        uint64_t h;
        int kind;
    } live[4];
    int nlive = 0;
    cuCtxSetCurrent(g_wctx);
    CUmemAllocationProp prop = vmm_prop();
    /* every thread of every worker starts together, so they really contend */
    __atomic_add_fetch(&g_stress_refusals[1], 1, __ATOMIC_ACQ_REL);
    while (__atomic_load_n(&g_stress_refusals[2], __ATOMIC_ACQUIRE) == 0)
        sched_yield();
    for (int it = 0; it < STRESS_ITERS + 4; it++) {
        int do_alloc_now = it < STRESS_ITERS && nlive < 4 && (nlive == 0 || rand_r(&seed) % 2);
        if (do_alloc_now) {
            int kind = rand_r(&seed) % 4;
            uint64_t size = (uint64_t)(rand_r(&seed) % (8 * MiB)) + 1;
            CUresult r = CUDA_ERROR_UNKNOWN;
            uint64_t h = 0;
            if (kind == 0) {
                CUdeviceptr d;
                r = cuMemAlloc_v2(&d, size);
                h = d;
            } else if (kind == 1) {
                CUdeviceptr d;
                r = cuMemAllocAsync(&d, size, NULL);
                h = d;
            } else if (kind == 2) {
                CUdeviceptr d;
                r = cuMemAllocManaged(&d, size, CU_MEM_ATTACH_GLOBAL);
                h = d;
            } else {
                CUmemGenericAllocationHandle g;
                r = cuMemCreate(&g, (size + 2 * MiB - 1) / (2 * MiB) * (2 * MiB), &prop, 0);
                h = g;
            }
            if (r == CUDA_SUCCESS) {
                live[nlive].h = h;
                live[nlive].kind = kind;
                nlive++;
            } else if (r == OOM) {
                __atomic_add_fetch(g_stress_refusals, 1, __ATOMIC_RELAXED);
            } else {
                EXPECT(0, "allocation kind %d answered %d", kind, (int)r);
            }
        } else if (nlive > 0) {
            int i = (int)(rand_r(&seed) % (unsigned)nlive);
            CUresult r;
            if (live[i].kind == 1)
                r = cuMemFreeAsync(live[i].h, NULL);
            else if (live[i].kind == 3)
                r = cuMemRelease(live[i].h);
            else
                r = cuMemFree_v2(live[i].h);
            EXPECT_R(r, CUDA_SUCCESS);
            live[i] = live[--nlive];
        }
        if (it % 16 == 0)
            sched_yield(); /* let the other processes in, even on few cores */
    }
    return NULL;
}

static void case_stress(const struct tcase *c)
{
    (void)c;
    g_stress_refusals = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_stress_refusals == MAP_FAILED)
        return;
    pid_t kids[STRESS_PROCS];
    fflush(stdout);
    for (int k = 0; k < STRESS_PROCS; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            g_fails = 0;
            CUdevice dev;
            EXPECT_R(cuInit(0), CUDA_SUCCESS);
            EXPECT_R(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
            EXPECT_R(cuCtxCreate_v2(&g_wctx, 0, dev), CUDA_SUCCESS);
            pthread_t th[STRESS_THREADS];
            for (int t = 0; t < STRESS_THREADS; t++)
                pthread_create(&th[t], NULL, stress_thread, (void *)(uintptr_t)(k * 131 + t * 7 + 1));
            for (int t = 0; t < STRESS_THREADS; t++)
                pthread_join(th[t], NULL);
            int s = slot_of(getpid());
            if (s >= 0)
                EXPECT_EQ(S->slots[s].device_bytes, 0);
            EXPECT_EQ(gsaas_standin_device_used(), 0);
            fflush(stdout);
            exit(g_fails ? 1 : 0);
        }
    }
    for (int i = 0; i < 20000 && __atomic_load_n(&g_stress_refusals[1], __ATOMIC_ACQUIRE) <
                                     STRESS_PROCS * STRESS_THREADS; i++)
        usleep(500);
    __atomic_store_n(&g_stress_refusals[2], 1, __ATOMIC_RELEASE);
    for (int k = 0; k < STRESS_PROCS; k++) {
        int st = 0;
        waitpid(kids[k], &st, 0);
        EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker %d failed (0x%x)", k, st);
    }
    uint64_t refusals = __atomic_load_n(g_stress_refusals, __ATOMIC_RELAXED);
    EXPECT(refusals > 0, "no contention: the limit was never reached");
    EXPECT_EQ(refused(), refusals);
    EXPECT(S->peak_bytes <= c->limit, "peak %llu over the limit %llu", (unsigned long long)S->peak_bytes,
           (unsigned long long)c->limit);
    EXPECT(S->peak_bytes > c->limit / 2, "peak %llu: barely used", (unsigned long long)S->peak_bytes);
    EXPECT_EQ(used(0), 0);
    printf("  stress: %llu refusals, peak %llu of %llu\n", (unsigned long long)refusals,
           (unsigned long long)S->peak_bytes, (unsigned long long)c->limit);
}

/* ============================================================================================
 * The case list
 * ============================================================================================ */
static struct tcase g_cases[320];
static int g_ncases;

static struct tcase *add_case(const char *name, run_fn run, uint64_t limit, uint64_t pinned)
{
    struct tcase *c = &g_cases[g_ncases++];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->run = run;
    c->limit = limit;
    c->pinned = pinned;
    c->setup = SETUP_FILE;
    c->body = BODY_OK;
    c->want_refused = -1;
    c->want_sharing = 0;
    c->timeout_s = 30;
    return c;
}

static void build_cases(void)
{
    char name[80];
    struct tcase *c;
    for (int w = 0; w < W_COUNT; w++) {
        for (int i = 0; i < NPATHS; i++) {
            snprintf(name, sizeof name, "count/%s/%s", paths[i].a_exp, way_names[w]);
            c = add_case(name, case_path, 64 * MiB, 1 * MiB);
            c->path = i;
            c->way = w;
            c->internal = w == W_GPA_INTERNAL;
            c->want_refused = 1;
        }
    }
    for (int w = 0; w < W_COUNT; w++) {
        snprintf(name, sizeof name, "ctxlimit/%s", way_names[w]);
        c = add_case(name, case_ctxlimit, 64 * MiB, 1 * MiB);
        c->way = w;
        c->internal = w == W_GPA_INTERNAL;
        c->want_refused = 4;
        snprintf(name, sizeof name, "vmm_release_while_mapped/%s", way_names[w]);
        c = add_case(name, case_vmm_mapped, 8 * MiB, 1 * MiB);
        c->way = w;
        c->internal = w == W_GPA_INTERNAL;
        c->want_refused = 2;
        snprintf(name, sizeof name, "sharing_refused/%s", way_names[w]);
        c = add_case(name, case_sharing, UNLIMITED, UNLIMITED);
        c->way = w;
        c->internal = w == W_GPA_INTERNAL;
        c->want_refused = 0;
        c->want_sharing = NSHARING;
    }
    c = add_case("pitch_padding", case_pitch_padding, 1 * MiB, 1 * MiB);
    c->want_refused = 2;
    c = add_case("array_sizes", case_array_sizes, 1 * MiB, 1 * MiB);
    c->want_refused = 2;
    c = add_case("graph_mem_nodes", case_graph, 48 * MiB, 1 * MiB);
    c->want_refused = 2;
    c = add_case("fork_shares_one_limit", case_fork, 64 * MiB, 1 * MiB);
    c->want_refused = 2;
    c = add_case("sigkilled_child_reclaimed", case_sigkill, 64 * MiB, 1 * MiB);
    c->want_refused = 1;
    c = add_case("stale_slots_reclaimed", case_stale, 64 * MiB, 1 * MiB);
    c->want_refused = 1;
    c->prep = prep_stale;
    c->post = post_stale;
    c->want_used = 10 * MiB;
    c = add_case("all_slots_taken", case_full, 64 * MiB, 1 * MiB);
    c->want_refused = 1;
    c->prep = prep_full;
    c->post = post_full;
    c = add_case("lock_dead_holder", case_lock_dead, 64 * MiB, 1 * MiB);
    c->prep = prep_lock_dead;
    c->want_refused = 0;
    c = add_case("lock_stopped_holder", case_lock_stopped, 64 * MiB, 1 * MiB);
    c->want_refused = 0;
    c = add_case("meminfo_shows_share", case_meminfo, 1 * GiB, 1 * MiB);
    c->want_refused = 0;
    c = add_case("pinned_limit_separate", case_pinned_separate, 64 * MiB, 1 * MiB);
    c->want_refused = 1;
    c = add_case("limit_changed_while_running", case_limit_change, 64 * MiB, 1 * MiB);
    c->want_refused = 5;
    c = add_case("unlimited", case_unlimited, UNLIMITED, UNLIMITED);
    c->want_refused = 0;
    c->want_sharing = NSHARING;
    c = add_case("zero_limit", case_zero, 0, 0);
    c->want_refused = NPATHS + 2;
    c->want_sharing = NSHARING;
    c = add_case("share_fd_inherited", case_fd, 64 * MiB, 1 * MiB);
    c->setup = SETUP_FD;
    c->want_refused = 2;
    add_case("fd_exec_stage2", case_fd_stage2, 64 * MiB, 1 * MiB)->timeout_s = -1; /* not run alone */
    c = add_case("gpa_variants", case_gpa_variants, 64 * MiB, 1 * MiB);
    c->want_refused = 0;
    c = add_case("dlsym_lookups", case_dlsym, 64 * MiB, 1 * MiB);
    c->want_refused = 0;
    c = add_case("stress_8x4", case_stress, 64 * MiB, 1 * MiB);
    c->timeout_s = 120;

    struct {
        const char *name;
        int setup, body;
        const char *msg;
    } fc[] = {
        {"failclosed/no_share_state", SETUP_NONE, BODY_OK, "no share state"},
        {"failclosed/missing_file", SETUP_MISSING, BODY_OK, "cannot open read-write"},
        {"failclosed/bad_magic", SETUP_FILE, BODY_BADMAGIC, "bad magic"},
        {"failclosed/bad_version", SETUP_FILE, BODY_BADVERSION, "unsupported version"},
        {"failclosed/bad_nslots", SETUP_FILE, BODY_BADNSLOTS, "nslots"},
        {"failclosed/short_file", SETUP_FILE, BODY_SHORT, "4159 bytes, want 4160"},
        {"failclosed/long_file", SETUP_FILE, BODY_LONG, "4161 bytes, want 4160"},
        {"failclosed/fd_not_open", SETUP_FD_CLOSED, BODY_OK, "cannot stat"},
        {"failclosed/fd_read_only", SETUP_FD_RDONLY, BODY_OK, "cannot map read-write"},
        {"failclosed/fd_garbage", SETUP_FD_GARBAGE, BODY_OK, "not a descriptor number"},
    };
    for (size_t i = 0; i < sizeof fc / sizeof fc[0]; i++) {
        c = add_case(fc[i].name, case_failclosed, 64 * MiB, 1 * MiB);
        c->setup = fc[i].setup;
        c->body = fc[i].body;
        c->expect_msg = fc[i].msg;
        c->want_refused = -1;
        c->want_sharing = -1;
    }
    c = add_case("failclosed/became_invalid", case_becomes_invalid, 64 * MiB, 1 * MiB);
    c->expect_msg = "share state became invalid (bad magic";
    c->want_refused = 0;
}

static const struct tcase *find_case(const char *name)
{
    for (int i = 0; i < g_ncases; i++)
        if (strcmp(g_cases[i].name, name) == 0)
            return &g_cases[i];
    return NULL;
}

/* ============================================================================================
 * The harness
 * ============================================================================================ */
static char g_self[PATH_MAX], g_build[PATH_MAX], g_tmp[PATH_MAX];

static int write_share(const char *path, const struct tcase *c)
{
    struct gsaas_share s;
    memset(&s, 0, sizeof s);
    s.magic = GSAAS_SHARE_MAGIC;
    s.version = GSAAS_SHARE_VERSION;
    s.limit_bytes = c->limit;
    s.pinned_limit_bytes = c->pinned;
    s.nslots = GSAAS_SHARE_NSLOTS;
    size_t len = sizeof s;
    char extra = 0;
    switch (c->body) {
    case BODY_BADMAGIC: s.magic = 0x48535348u; break;
    case BODY_BADVERSION: s.version = 2; break;
    case BODY_BADNSLOTS: s.nslots = 64; break;
    case BODY_SHORT: len = sizeof s - 1; break;
    default: break;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return 0;
    int ok = write(fd, &s, len) == (ssize_t)len;
    if (ok && c->body == BODY_LONG)
        ok = write(fd, &extra, 1) == 1;
    close(fd);
    return ok;
}

static int read_share(const char *path, struct gsaas_share *s)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int ok = pread(fd, s, sizeof *s, 0) == (ssize_t)sizeof *s;
    close(fd);
    return ok;
}

static int env_skip(const char *e)
{
    return strncmp(e, "LD_PRELOAD=", 11) == 0 || strncmp(e, "LD_LIBRARY_PATH=", 16) == 0 ||
           strncmp(e, "GSAAS_", 6) == 0;
}

static void print_file(const char *path, const char *prefix)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f) != NULL && n++ < 60)
        printf("%s%s", prefix, line);
    fclose(f);
}

/* The interposer's lines in the case's stderr: how many, and whether one holds `msg`. */
static int interposer_lines(const char *path, const char *msg, int *matched)
{
    FILE *f = fopen(path, "r");
    int n = 0;
    *matched = 0;
    if (f == NULL)
        return 0;
    char line[2048];
    while (fgets(line, sizeof line, f) != NULL) {
        if (strstr(line, "gsaas-share[") == NULL)
            continue;
        n++;
        if (msg != NULL && strstr(line, msg) != NULL)
            (*matched)++;
    }
    fclose(f);
    return n;
}

static int run_case(const struct tcase *c)
{
    char share[PATH_MAX + 32], out[PATH_MAX + 32], err[PATH_MAX + 32], why[512] = "";
    snprintf(share, sizeof share, "%s/share", g_tmp);
    snprintf(out, sizeof out, "%s/out", g_tmp);
    snprintf(err, sizeof err, "%s/err", g_tmp);
    int ok = 1;
    int has_file = c->setup == SETUP_FILE || c->setup == SETUP_FD || c->setup == SETUP_FD_RDONLY;
    if (has_file && !write_share(share, c)) {
        printf("FAIL %s: cannot write the share file\n", c->name);
        return 0;
    }
    if (c->prep != NULL && !c->prep(c, share, why, sizeof why)) {
        printf("FAIL %s: preparation failed %s\n", c->name, why);
        unlink(share);
        return 0;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        printf("FAIL %s: fork: %s\n", c->name, strerror(errno));
        return 0;
    }
    if (pid == 0) {
        setpgid(0, 0);
        int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (o < 0 || e < 0)
            _exit(126);
        dup2(o, 1);
        dup2(e, 2);
        close(o);
        close(e);
        static char *envp[512];
        static char buf[8][PATH_MAX + 64];
        int n = 0;
        for (char **ep = environ; *ep != NULL && n < 480; ep++)
            if (!env_skip(*ep))
                envp[n++] = *ep;
        snprintf(buf[0], sizeof buf[0], "LD_PRELOAD=%s/libgsaas-share.so", g_build);
        snprintf(buf[1], sizeof buf[1], "LD_LIBRARY_PATH=%s/standin", g_build);
        envp[n++] = buf[0];
        envp[n++] = buf[1];
        if (has_file) {
            snprintf(buf[2], sizeof buf[2], "GSAAS_TEST_SHARE=%s", share);
            envp[n++] = buf[2];
        }
        close(SHARE_FD_NUM);
        switch (c->setup) {
        case SETUP_FILE:
            snprintf(buf[3], sizeof buf[3], "GSAAS_SHARE_FILE=%s", share);
            envp[n++] = buf[3];
            break;
        case SETUP_FD:
        case SETUP_FD_RDONLY: {
            int fd = open(share, c->setup == SETUP_FD ? O_RDWR : O_RDONLY);
            if (fd < 0 || dup2(fd, SHARE_FD_NUM) != SHARE_FD_NUM)
                _exit(126);
            close(fd);
            snprintf(buf[3], sizeof buf[3], "GSAAS_SHARE_FD=%d", SHARE_FD_NUM);
            envp[n++] = buf[3];
            break;
        }
        case SETUP_FD_CLOSED:
            snprintf(buf[3], sizeof buf[3], "GSAAS_SHARE_FD=%d", SHARE_FD_NUM);
            envp[n++] = buf[3];
            break;
        case SETUP_FD_GARBAGE:
            envp[n++] = "GSAAS_SHARE_FD=3x";
            break;
        case SETUP_MISSING:
            snprintf(buf[3], sizeof buf[3], "GSAAS_SHARE_FILE=%s/no-such-share", g_tmp);
            envp[n++] = buf[3];
            break;
        default:
            break;
        }
        if (c->internal)
            envp[n++] = "GSAAS_STANDIN_PROC_INTERNAL=1";
        envp[n] = NULL;
        char *argv[] = {g_self, "--case", (char *)c->name, NULL};
        execve(g_self, argv, envp);
        _exit(127);
    }
    setpgid(pid, pid);
    int st = 0, done = 0;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) {
            done = 1;
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (t1.tv_sec - t0.tv_sec > c->timeout_s)
            break;
        usleep(2000);
    }
    kill(-pid, SIGKILL); /* whatever the case left behind */
    if (!done) {
        waitpid(pid, &st, 0);
        snprintf(why, sizeof why, "timed out after %ds", c->timeout_s);
        ok = 0;
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        if (WIFSIGNALED(st))
            snprintf(why, sizeof why, "killed by signal %d", WTERMSIG(st));
        else
            snprintf(why, sizeof why, "exit status %d", WEXITSTATUS(st));
        ok = 0;
    }
    int matched = 0, lines = interposer_lines(err, c->expect_msg, &matched);
    if (ok && c->expect_msg != NULL && (lines != 1 || matched != 1)) {
        snprintf(why, sizeof why, "want exactly one interposer line naming \"%s\", got %d (%d matching)",
                 c->expect_msg, lines, matched);
        ok = 0;
    } else if (ok && c->expect_msg == NULL && lines != 0) {
        snprintf(why, sizeof why, "unexpected interposer complaint on stderr");
        ok = 0;
    }
    struct gsaas_share s;
    if (ok && has_file && c->body == BODY_OK && read_share(share, &s)) {
        uint64_t dev = 0, pin = 0;
        int live = 0;
        for (unsigned i = 0; i < GSAAS_SHARE_NSLOTS; i++) {
            if (s.slots[i].pid == 0)
                continue;
            live++;
            dev += s.slots[i].device_bytes;
            pin += s.slots[i].pinned_bytes;
        }
        if (dev != c->want_used || pin != 0) {
            snprintf(why, sizeof why, "left %llu device / %llu pinned bytes counted (want %llu / 0)",
                     (unsigned long long)dev, (unsigned long long)pin, (unsigned long long)c->want_used);
            ok = 0;
        } else if (c->post == NULL && live != 0) {
            snprintf(why, sizeof why, "%d slots still held after every process exited", live);
            ok = 0;
        } else if (s.lock != 0) {
            snprintf(why, sizeof why, "lock left held by %u", s.lock);
            ok = 0;
        } else if (c->want_refused >= 0 && s.refused_allocations != (uint64_t)c->want_refused) {
            snprintf(why, sizeof why, "refused_allocations %llu, want %lld",
                     (unsigned long long)s.refused_allocations, c->want_refused);
            ok = 0;
        } else if (c->want_sharing >= 0 && s.refused_sharing != (uint64_t)c->want_sharing) {
            snprintf(why, sizeof why, "refused_sharing %llu, want %lld",
                     (unsigned long long)s.refused_sharing, c->want_sharing);
            ok = 0;
        } else if (c->limit != UNLIMITED && s.limit_bytes == c->limit && s.peak_bytes > c->limit) {
            snprintf(why, sizeof why, "peak_bytes %llu over the limit %llu",
                     (unsigned long long)s.peak_bytes, (unsigned long long)c->limit);
            ok = 0;
        } else if (c->post != NULL && !c->post(c, share, why, sizeof why)) {
            ok = 0;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    if (ok) {
        printf("ok   %s (%.2fs)\n", c->name, secs);
        if (c->run == case_stress)
            print_file(out, "");
    } else {
        printf("FAIL %s: %s\n", c->name, why);
        print_file(out, "     out| ");
        print_file(err, "     err| ");
    }
    unlink(share);
    unlink(out);
    unlink(err);
    return ok;
}

static int run_child(const char *name)
{
    const struct tcase *c = find_case(name);
    if (c == NULL) {
        printf("no case %s\n", name);
        return 2;
    }
    map_test_share();
    if (S == NULL && c->run != case_failclosed) {
        printf("  no share state to check against\n");
        return 1;
    }
    /* The direct way must reach the interposer, or nothing here tests it. */
    EXPECT(is_wrapper((void *)cuMemAlloc_v2, "cuMemAlloc_v2"), "not preloaded: cuMemAlloc_v2 is %s",
           describe((void *)cuMemAlloc_v2));
    c->run(c);
    fflush(stdout);
    return g_fails ? 1 : 0;
}

static void cleanup_tmp(void)
{
    if (g_tmp[0] != '\0')
        rmdir(g_tmp);
}

int main(int argc, char **argv)
{
    build_cases();
    if (argc >= 3 && strcmp(argv[1], "--case") == 0)
        return run_child(argv[2]);
    setvbuf(stdout, NULL, _IOLBF, 0);
    ssize_t n = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    if (n <= 0) {
        printf("cannot find myself\n0 passed, 1 failed\n");
        return 1;
    }
    g_self[n] = '\0';
    /* build/tests/share_test -> build */
    snprintf(g_build, sizeof g_build, "%s", g_self);
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(g_build, '/');
        if (slash != NULL)
            *slash = '\0';
    }
    const char *tmpdir = getenv("TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/gsaas-share-test.XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    if (mkdtemp(g_tmp) == NULL) {
        printf("mkdtemp: %s\n0 passed, 1 failed\n", strerror(errno));
        return 1;
    }
    atexit(cleanup_tmp);
    const char *filter = argc >= 2 ? argv[1] : NULL;
    int passed = 0, failed = 0;
    for (int i = 0; i < g_ncases; i++) {
        const struct tcase *c = &g_cases[i];
        if (c->timeout_s < 0 || (filter != NULL && strstr(c->name, filter) == NULL))
            continue;
        if (run_case(c))
            passed++;
        else
            failed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
