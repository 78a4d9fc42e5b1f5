/*
 * libgsaas-share.so: holds one GPU server (all its processes together) to its share of GPU
 * memory, and refuses the driver calls that share memory between processes.
 *
 * The GSaaS agent preloads it (LD_PRELOAD) into each GPU server process and gives it a share
 * state (include/gsaas_share.h). It exports the CUDA driver's names for every call it counts or
 * refuses, so the dynamic linker binds an application's calls to it; it wraps cuGetProcAddress
 * and cuGetProcAddress_v2 so that a looked-up entry point is its wrapper too; and it wraps
 * dlsym, so that dlopen("libcuda.so.1") + dlsym hands out its wrappers as well. It reaches the
 * real driver through its own dlopen("libcuda.so.1") handle and the real dlsym.
 *
 * Counting is check-then-reserve under the share state's lock: a request that would take the
 * sum of every live process's bytes past the limit is refused with CUDA_ERROR_OUT_OF_MEMORY
 * before the driver sees it; a reservation whose driver call fails is given back. Each process
 * keeps its own record of what it holds (pointer, handle, graph, context limit -> bytes), so a
 * free gives back exactly what its allocation took; a forked child starts with no records and
 * no slot. See README.md for what is counted, what is refused, and the known holes.
 *
 * Written for GSaaS; plain C11 with GNU extensions (dlvsym, RTLD_NEXT, dladdr, aliases).
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
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "gsaas_share.h"

#define EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------------------------------
 * The entry points this library takes over: exported name, base name (what cuGetProcAddress
 * is asked for), the CUDA version that introduced that ABI variant, and whether it is the
 * per-thread-default-stream (_ptsz) variant.
 * ------------------------------------------------------------------------------------------ */
#define GSAAS_HOOKS(X)                                                      \
    /* device memory */                                                     \
    X(cuMemAlloc, "cuMemAlloc", 2000, 0)                                    \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, 0)                                 \
    X(cuMemAllocPitch, "cuMemAllocPitch", 2000, 0)                          \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0)                       \
    X(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0)                      \
    X(cuMemFree, "cuMemFree", 2000, 0)                                      \
    X(cuMemFree_v2, "cuMemFree", 3020, 0)                                   \
    X(cuMemGetInfo, "cuMemGetInfo", 2000, 0)                                \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0)                             \
    /* stream-ordered */                                                    \
    X(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0)                         \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1)                    \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0)         \
    X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1)    \
    X(cuMemFreeAsync, "cuMemFreeAsync", 11020, 0)                           \
    X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1)                      \
    /* virtual memory management */                                         \
    X(cuMemCreate, "cuMemCreate", 10020, 0)                                 \
    X(cuMemRelease, "cuMemRelease", 10020, 0)                               \
    X(cuMemMap, "cuMemMap", 10020, 0)                                       \
    X(cuMemUnmap, "cuMemUnmap", 10020, 0)                                   \
    X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", 11000, 0) \
    X(cuMemMapArrayAsync, "cuMemMapArrayAsync", 11010, 0)                   \
    X(cuMemMapArrayAsync_ptsz, "cuMemMapArrayAsync", 11010, 1)              \
    /* arrays */                                                            \
    X(cuArrayCreate, "cuArrayCreate", 2000, 0)                              \
    X(cuArrayCreate_v2, "cuArrayCreate", 3020, 0)                           \
    X(cuArray3DCreate, "cuArray3DCreate", 2000, 0)                          \
    X(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0)                       \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0)            \
    X(cuArrayDestroy, "cuArrayDestroy", 2000, 0)                            \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0)          \
    /* graph memory nodes */                                                \
    X(cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode", 11040, 0)           \
    X(cuGraphAddNode, "cuGraphAddNode", 12020, 0)                           \
    X(cuGraphAddNode_v2, "cuGraphAddNode", 12030, 0)                        \
    X(cuGraphDestroy, "cuGraphDestroy", 10000, 0)                           \
    /* context limits */                                                    \
    X(cuCtxSetLimit, "cuCtxSetLimit", 3010, 0)                              \
    X(cuCtxDestroy, "cuCtxDestroy", 2000, 0)                                \
    X(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0)                             \
    /* page-locked host memory */                                           \
    X(cuMemHostAlloc, "cuMemHostAlloc", 2020, 0)                            \
    X(cuMemAllocHost, "cuMemAllocHost", 2000, 0)                            \
    X(cuMemAllocHost_v2, "cuMemAllocHost", 3020, 0)                         \
    X(cuMemFreeHost, "cuMemFreeHost", 2000, 0)                              \
    X(cuMemHostRegister, "cuMemHostRegister", 4000, 0)                      \
    X(cuMemHostRegister_v2, "cuMemHostRegister", 6050, 0)                   \
    X(cuMemHostUnregister, "cuMemHostUnregister", 4000, 0)                  \
    /* entry points */                                                      \
    X(cuGetProcAddress, "cuGetProcAddress", 11030, 0)                       \
    X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0)                    \
    /* sharing between processes: refused */                                \
    X(cuIpcGetMemHandle, "cuIpcGetMemHandle", 4010, 0)                      \
    X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle", 4010, 0)                    \
    X(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", 11000, 0)                \
    X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 4010, 0)                  \
    X(cuIpcGetEventHandle, "cuIpcGetEventHandle", 4010, 0)                  \
    X(cuIpcOpenEventHandle, "cuIpcOpenEventHandle", 4010, 0)                \
    X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 10020, 0) \
    X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020, 0) \
    X(cuMemPoolExportToShareableHandle, "cuMemPoolExportToShareableHandle", 11020, 0) \
    X(cuMemPoolImportFromShareableHandle, "cuMemPoolImportFromShareableHandle", 11020, 0) \
    X(cuMemPoolExportPointer, "cuMemPoolExportPointer", 11020, 0)           \
    X(cuMemPoolImportPointer, "cuMemPoolImportPointer", 11020, 0)           \
    X(cuImportExternalMemory, "cuImportExternalMemory", 10000, 0)           \
    X(cuImportExternalSemaphore, "cuImportExternalSemaphore", 10000, 0)     \
    X(cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange", 11070, 0)

/* Driver functions used but not taken over. */
#define GSAAS_AUX(X)   \
    X(cuCtxGetCurrent) \
    X(cuCtxGetDevice)  \
    X(cuDeviceGetAttribute)

enum {
#define X_ENUM(n, b, v, p) H_##n,
    GSAAS_HOOKS(X_ENUM)
#undef X_ENUM
    H_COUNT
};

enum {
#define X_AUX_ENUM(n) A_##n,
    GSAAS_AUX(X_AUX_ENUM)
#undef X_AUX_ENUM
    A_COUNT
};

struct hook {
    const char *name;
    const char *base;
    int version;
    int ptsz;
};

static const struct hook g_hooks[H_COUNT] = {
#define X_INFO(n, b, v, p) {#n, b, v, p},
    GSAAS_HOOKS(X_INFO)
#undef X_INFO
};

static const char *const g_aux_names[A_COUNT] = {
#define X_AUX_NAME(n) #n,
    GSAAS_AUX(X_AUX_NAME)
#undef X_AUX_NAME
};

/* Every wrapper is a static function w_<name>, exported under <name> by an alias at the end of
 * this file; the tables use the local address, which no other library can interpose. */
#define X_DECL(n, b, v, p) static __typeof__(n) w_##n;
GSAAS_HOOKS(X_DECL)
#undef X_DECL

static void *const g_wrappers[H_COUNT] = {
#define X_WRAP(n, b, v, p) (void *)w_##n,
    GSAAS_HOOKS(X_WRAP)
#undef X_WRAP
};

static int wrapper_index(const void *p)
{
    for (int i = 0; i < H_COUNT; i++)
        if (g_wrappers[i] == p)
            return i;
    return -1;
}

static int hook_index(const char *name)
{
    for (int i = 0; i < H_COUNT; i++)
        if (strcmp(g_hooks[i].name, name) == 0)
            return i;
    return -1;
}

/* ------------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------------ */
static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    if (a != 0 && b > UINT64_MAX / a)
        return UINT64_MAX;
    return a * b;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char buf[512];
    int n = snprintf(buf, sizeof buf, "gsaas-share[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof buf)
        n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof buf - 1)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(2, buf, (size_t)n); /* one write: one line, even with other writers */
    (void)w;
}

/* ------------------------------------------------------------------------------------------
 * The real dlsym and the real driver
 * ------------------------------------------------------------------------------------------ */
typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn g_real_dlsym;

static dlsym_fn real_dlsym(void)
{
    dlsym_fn f = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    if (f != NULL)
        return f;
    /* dlsym moved into libc at glibc 2.34 (GLIBC_2.34); before, libdl's GLIBC_2.2.5 (x86-64)
     * or GLIBC_2.17 (aarch64). dlvsym is not taken over, so this reaches the next object. */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", NULL};
    for (int i = 0; versions[i] != NULL && f == NULL; i++)
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (f != NULL)
        __atomic_store_n(&g_real_dlsym, f, __ATOMIC_RELEASE);
    return f;
}

static void *g_real[H_COUNT];
static void *g_aux[A_COUNT];
static int g_load_state;  /* 0 not loaded, 2 loaded (driver found or not) */
static int g_driver_found;
static __thread int t_loading;
static pthread_mutex_t g_load_mu = PTHREAD_MUTEX_INITIALIZER;

static void load_real(void)
{
    if (__atomic_load_n(&g_load_state, __ATOMIC_ACQUIRE) == 2 || t_loading)
        return; /* t_loading: a constructor run by our own dlopen came back here */
    pthread_mutex_lock(&g_load_mu);
    if (g_load_state != 2) {
        t_loading = 1;
        dlsym_fn rd = real_dlsym();
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (h != NULL && rd != NULL) {
            g_driver_found = 1;
            for (int i = 0; i < H_COUNT; i++) {
                void *p = rd(h, g_hooks[i].name);
                if (p != NULL && wrapper_index(p) < 0)
                    __atomic_store_n(&g_real[i], p, __ATOMIC_RELEASE);
            }
            for (int i = 0; i < A_COUNT; i++)
                __atomic_store_n(&g_aux[i], rd(h, g_aux_names[i]), __ATOMIC_RELEASE);
        }
        __atomic_store_n(&g_load_state, 2, __ATOMIC_RELEASE);
        t_loading = 0;
    }
    pthread_mutex_unlock(&g_load_mu);
}

static void *real_at(int i)
{
    load_real();
    return __atomic_load_n(&g_real[i], __ATOMIC_ACQUIRE);
}

static void *aux_at(int i)
{
    load_real();
    return __atomic_load_n(&g_aux[i], __ATOMIC_ACQUIRE);
}

#define REAL(n) ((__typeof__(&n))real_at(H_##n))
#define AUX(n) ((__typeof__(&n))aux_at(A_##n))

static CUresult missing(void)
{
    return g_driver_found ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_NOT_INITIALIZED;
}

/* ------------------------------------------------------------------------------------------
 * The share state
 * ------------------------------------------------------------------------------------------ */
static struct gsaas_share *g_share; /* NULL: no valid state, fail closed */
static char g_problem[256];
static int g_problem_logged;
static int g_variant_logged;

static void problem(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void problem(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_problem, sizeof g_problem, fmt, ap);
    va_end(ap);
}

static void log_problem_once(void)
{
    if (__atomic_exchange_n(&g_problem_logged, 1, __ATOMIC_ACQ_REL) == 0)
        say("%s; refusing every counted allocation", g_problem);
}

static int header_valid(const struct gsaas_share *s, char *why, size_t n)
{
    uint32_t magic = __atomic_load_n(&s->magic, __ATOMIC_ACQUIRE);
    uint32_t version = __atomic_load_n(&s->version, __ATOMIC_ACQUIRE);
    uint32_t nslots = __atomic_load_n(&s->nslots, __ATOMIC_ACQUIRE);
    if (magic != GSAAS_SHARE_MAGIC) {
        snprintf(why, n, "bad magic 0x%08x (want 0x%08x)", magic, GSAAS_SHARE_MAGIC);
        return 0;
    }
    if (version != GSAAS_SHARE_VERSION) {
        snprintf(why, n, "unsupported version %u (want %u)", version, GSAAS_SHARE_VERSION);
        return 0;
    }
    if (nslots != GSAAS_SHARE_NSLOTS) {
        snprintf(why, n, "nslots %u (want %u)", nslots, GSAAS_SHARE_NSLOTS);
        return 0;
    }
    return 1;
}

static int parse_fd(const char *s, int *fd)
{
    if (*s == '\0')
        return 0;
    long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return 0;
        v = v * 10 + (*p - '0');
        if (v > INT_MAX)
            return 0;
    }
    *fd = (int)v;
    return 1;
}

static struct gsaas_share *map_fd(int fd, const char *what)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        problem("%s: cannot stat (%s)", what, strerror(errno));
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        problem("%s: not a regular file", what);
        return NULL;
    }
    if (st.st_size != (off_t)GSAAS_SHARE_SIZE) {
        problem("%s: %lld bytes, want %u", what, (long long)st.st_size, GSAAS_SHARE_SIZE);
        return NULL;
    }
    void *m = mmap(NULL, GSAAS_SHARE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        problem("%s: cannot map read-write (%s)", what, strerror(errno));
        return NULL;
    }
    char why[128];
    if (!header_valid(m, why, sizeof why)) {
        problem("%s: %s", what, why);
        munmap(m, GSAAS_SHARE_SIZE);
        return NULL;
    }
    return m;
}

static void map_share(void)
{
    const char *fdv = getenv(GSAAS_SHARE_FD_ENV);
    const char *path = getenv(GSAAS_SHARE_FILE_ENV);
    char what[PATH_MAX + 32];
    if (fdv != NULL && *fdv != '\0') {
        int fd;
        snprintf(what, sizeof what, "%s=%s", GSAAS_SHARE_FD_ENV, fdv);
        if (!parse_fd(fdv, &fd)) {
            problem("%s: not a descriptor number", what);
            return;
        }
        /* The descriptor stays open: exec'd descendants map it again. */
        g_share = map_fd(fd, what);
        return;
    }
    if (path != NULL && *path != '\0') {
        snprintf(what, sizeof what, "%s=%s", GSAAS_SHARE_FILE_ENV, path);
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            problem("%s: cannot open read-write (%s)", what, strerror(errno));
            return;
        }
        g_share = map_fd(fd, what);
        close(fd);
        return;
    }
    problem("no share state (neither %s nor %s is set)", GSAAS_SHARE_FD_ENV, GSAAS_SHARE_FILE_ENV);
}

/* ---- /proc ---- */
static int g_have_proc;

/* The state letter (field 3) and start time (field 22) of /proc/<pid>/stat. */
static int proc_stat(pid_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    int e = errno;
    close(fd);
    if (n <= 0) {
        errno = n < 0 ? e : EIO;
        return -1;
    }
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold anything, ')' included */
    if (p == NULL || p[1] != ' ') {
        errno = EIO;
        return -1;
    }
    p += 2;
    *state = *p;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (p == NULL) {
            errno = EIO;
            return -1;
        }
        p++;
    }
    *start = strtoull(p, NULL, 10);
    return 0;
}

/* Whether pid no longer holds GPU memory: no such process, a zombie, or (check_start) a
 * different process now wearing that pid. Unknown counts as alive. */
static int pid_gone(int32_t pid, uint64_t start_time, int check_start)
{
    if (pid <= 0)
        return 1;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        return 1;
    char state;
    uint64_t start;
    if (proc_stat((pid_t)pid, &state, &start) != 0)
        return errno == ENOENT && g_have_proc;
    if (state == 'Z' || state == 'X' || state == 'x')
        return 1;
    return check_start && start != start_time;
}

/* ---- per-process state (under g_mu) ---- */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;       /* records, slot, pid */
static pthread_mutex_t g_limit_mu = PTHREAD_MUTEX_INITIALIZER; /* cuCtxSetLimit/destroy */
static pid_t g_pid;           /* the process the records belong to; 0 after fork */
static uint64_t g_start_time; /* its start time */
static int g_slot = -1;       /* its slot, -1 none yet */

static void records_clear(void);

static void ensure_proc(void)
{
    pid_t p = getpid();
    if (p == g_pid)
        return;
    /* First call, or a forked child: what the parent held is not ours. */
    records_clear();
    g_slot = -1;
    g_pid = p;
    char state;
    uint64_t start = 0;
    if (proc_stat(p, &state, &start) == 0)
        g_have_proc = 1;
    g_start_time = start;
}

/* ---- the cross-process lock ---- */
static void cpu_relax(void)
{
#if defined(__x86_64__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int holder_reused(const struct gsaas_share *s, uint32_t holder)
{
    /* A dead holder's pid now worn by another process: its slot's start time tells. */
    for (unsigned i = 0; i < GSAAS_SHARE_NSLOTS; i++) {
        if ((uint32_t)__atomic_load_n(&s->slots[i].pid, __ATOMIC_RELAXED) != holder)
            continue;
        return pid_gone((int32_t)holder, __atomic_load_n(&s->slots[i].start_time, __ATOMIC_RELAXED), 1);
    }
    return 0;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void share_lock(struct gsaas_share *s)
{
    uint32_t me = (uint32_t)getpid();
    uint32_t seen = 0;   /* the holder being waited on */
    uint64_t since = 0;  /* when it was first seen holding the lock */
    for (unsigned spins = 0;; spins++) {
        uint32_t cur = 0;
        if (__atomic_compare_exchange_n(&s->lock, &cur, me, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return;
        if (cur == me)
            return; /* left by this pid's former image (we only take it under g_mu) */
        if (spins >= 256 && spins % 64 == 0) {
            uint64_t t = now_ms();
            if (cur != seen) {
                seen = cur;
                since = t;
            }
            /* A dead holder, its pid now worn by another process, or a live holder seen for
             * longer than any real critical section (stopped): take the lock over. */
            if (pid_gone((int32_t)cur, 0, 0) || holder_reused(s, cur) ||
                t - since > GSAAS_SHARE_LOCK_STALE_MS) {
                if (__atomic_compare_exchange_n(&s->lock, &cur, me, 0, __ATOMIC_ACQUIRE,
                                                __ATOMIC_RELAXED))
                    return;
                continue;
            }
        }
        if (spins < 16) {
            cpu_relax();
        } else if (spins < 256) {
            sched_yield();
        } else {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

static void share_unlock(struct gsaas_share *s) { __atomic_store_n(&s->lock, 0, __ATOMIC_RELEASE); }

/* ---- slots (under the lock) ---- */
static void slot_clear(struct gsaas_share_slot *sl)
{
    __atomic_store_n(&sl->pid, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&sl->device_bytes, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&sl->pinned_bytes, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&sl->start_time, 0, __ATOMIC_RELAXED);
    sl->reserved = 0;
}

static int reclaim_stale(struct gsaas_share *s)
{
    int n = 0;
    for (int i = 0; i < (int)GSAAS_SHARE_NSLOTS; i++) {
        struct gsaas_share_slot *sl = &s->slots[i];
        int32_t pid = __atomic_load_n(&sl->pid, __ATOMIC_RELAXED);
        if (pid == 0 || (pid == g_pid && i == g_slot))
            continue;
        /* Our own pid in another slot: a former image of this process (exec), or an older
         * process that wore this pid; either way its memory is gone. */
        if (pid == g_pid || pid_gone(pid, sl->start_time, 1)) {
            slot_clear(sl);
            n++;
        }
    }
    return n;
}

static int claim_free_slot(struct gsaas_share *s)
{
    for (int i = 0; i < (int)GSAAS_SHARE_NSLOTS; i++) {
        struct gsaas_share_slot *sl = &s->slots[i];
        if (__atomic_load_n(&sl->pid, __ATOMIC_RELAXED) != 0)
            continue;
        sl->reserved = 0;
        __atomic_store_n(&sl->start_time, g_start_time, __ATOMIC_RELAXED);
        __atomic_store_n(&sl->device_bytes, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&sl->pinned_bytes, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&sl->pid, (int32_t)g_pid, __ATOMIC_RELEASE);
        return i;
    }
    return -1;
}

static struct gsaas_share_slot *my_slot(struct gsaas_share *s)
{
    if (g_slot < 0)
        return NULL;
    struct gsaas_share_slot *sl = &s->slots[g_slot];
    if (sl->pid != (int32_t)g_pid || sl->start_time != g_start_time)
        return NULL;
    return sl;
}

static int ensure_slot(struct gsaas_share *s)
{
    if (my_slot(s) != NULL)
        return g_slot;
    g_slot = -1;
    int i = claim_free_slot(s);
    if (i < 0 && reclaim_stale(s) > 0)
        i = claim_free_slot(s);
    g_slot = i;
    return i;
}

static uint64_t slots_sum(const struct gsaas_share *s, int pinned)
{
    uint64_t t = 0;
    for (unsigned i = 0; i < GSAAS_SHARE_NSLOTS; i++) {
        const struct gsaas_share_slot *sl = &s->slots[i];
        if (__atomic_load_n(&sl->pid, __ATOMIC_RELAXED) == 0)
            continue;
        t = sat_add(t, pinned ? sl->pinned_bytes : sl->device_bytes);
    }
    return t;
}

static int fits(uint64_t total, uint64_t bytes, uint64_t limit)
{
    if (limit == GSAAS_SHARE_UNLIMITED)
        return 1;
    return bytes <= limit && total <= limit - bytes;
}

enum { CLS_DEV = 0, CLS_PIN = 1 };

/* Check-then-reserve: CUDA_SUCCESS when `bytes` more fit under the limit (and are now counted
 * for this process), CUDA_ERROR_OUT_OF_MEMORY when not. */
static CUresult reserve(int cls, uint64_t bytes)
{
    struct gsaas_share *s = g_share;
    if (s == NULL) {
        log_problem_once();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_mu);
    ensure_proc();
    share_lock(s);
    char why[128];
    if (!header_valid(s, why, sizeof why)) {
        if (__atomic_exchange_n(&g_problem_logged, 1, __ATOMIC_ACQ_REL) == 0)
            say("share state became invalid (%s); refusing every counted allocation", why);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    if (ensure_slot(s) < 0) {
        __atomic_add_fetch(&s->refused_allocations, 1, __ATOMIC_RELAXED);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    uint64_t limit = __atomic_load_n(cls == CLS_PIN ? &s->pinned_limit_bytes : &s->limit_bytes,
                                     __ATOMIC_ACQUIRE);
    uint64_t total = slots_sum(s, cls);
    if (!fits(total, bytes, limit)) {
        if (reclaim_stale(s) > 0)
            total = slots_sum(s, cls);
        if (!fits(total, bytes, limit)) {
            __atomic_add_fetch(&s->refused_allocations, 1, __ATOMIC_RELAXED);
            r = CUDA_ERROR_OUT_OF_MEMORY;
            goto out;
        }
    }
    struct gsaas_share_slot *sl = &s->slots[g_slot];
    if (cls == CLS_PIN) {
        __atomic_store_n(&sl->pinned_bytes, sat_add(sl->pinned_bytes, bytes), __ATOMIC_RELAXED);
    } else {
        __atomic_store_n(&sl->device_bytes, sat_add(sl->device_bytes, bytes), __ATOMIC_RELAXED);
        uint64_t now = sat_add(total, bytes);
        if (now > s->peak_bytes)
            __atomic_store_n(&s->peak_bytes, now, __ATOMIC_RELAXED);
    }
out:
    share_unlock(s);
    pthread_mutex_unlock(&g_mu);
    return r;
}

static void unreserve(int cls, uint64_t bytes)
{
    struct gsaas_share *s = g_share;
    if (s == NULL || bytes == 0)
        return;
    pthread_mutex_lock(&g_mu);
    ensure_proc();
    if (g_slot >= 0) {
        share_lock(s);
        struct gsaas_share_slot *sl = my_slot(s);
        if (sl != NULL) {
            uint64_t *field = cls == CLS_PIN ? &sl->pinned_bytes : &sl->device_bytes;
            uint64_t cur = *field;
            __atomic_store_n(field, cur > bytes ? cur - bytes : 0, __ATOMIC_RELAXED);
        }
        share_unlock(s);
    }
    pthread_mutex_unlock(&g_mu);
}

/* ------------------------------------------------------------------------------------------
 * Per-process records: what this process holds, so a free gives back what was taken
 * ------------------------------------------------------------------------------------------ */
enum rec_kind {
    K_DEV = 1,     /* device pointer (alloc, pitch, managed, async) */
    K_HOSTALLOC,   /* cuMemHostAlloc / cuMemAllocHost pointer */
    K_HOSTREG,     /* cuMemHostRegister pointer */
    K_VMM,         /* cuMemCreate handle */
    K_GRAPH,       /* graph with memory alloc nodes */
    K_ARRAY,       /* CUDA array handle */
    K_MIPMAP,      /* mipmapped CUDA array handle */
    K_LIM_STACK,   /* context limits, keyed by context */
    K_LIM_FIFO,
    K_LIM_HEAP,
};

static int kind_cls(int kind) { return kind == K_HOSTALLOC || kind == K_HOSTREG ? CLS_PIN : CLS_DEV; }

struct rec {
    struct rec *next;
    uint64_t key;
    uint64_t bytes;
    int kind;
    uint32_t refs;    /* K_VMM: unreleased references (cuMemCreate, cuMemRetainAllocationHandle) */
    uint32_t maps;    /* K_VMM: live cuMemMap mappings */
    int forever;      /* K_VMM: mapped into a sparse array, counted until the process ends */
};

static struct rec **g_tab;
static size_t g_tab_size;
static size_t g_tab_count;

struct vmap {
    uint64_t va;
    uint64_t size;
    uint64_t handle;
};
static struct vmap *g_maps;
static size_t g_nmaps, g_capmaps;

static size_t rec_bucket(int kind, uint64_t key, size_t size)
{
    uint64_t h = (key ^ ((uint64_t)kind << 56)) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (size - 1);
}

static struct rec *rec_find(int kind, uint64_t key)
{
    if (g_tab == NULL)
        return NULL;
    for (struct rec *r = g_tab[rec_bucket(kind, key, g_tab_size)]; r != NULL; r = r->next)
        if (r->kind == kind && r->key == key)
            return r;
    return NULL;
}

static void rec_grow(void)
{
    size_t nsize = g_tab_size ? g_tab_size * 2 : 1024;
    struct rec **nt = calloc(nsize, sizeof *nt);
    if (nt == NULL)
        return; /* keep the old table: longer chains, still correct */
    for (size_t i = 0; i < g_tab_size; i++) {
        struct rec *r = g_tab[i];
        while (r != NULL) {
            struct rec *next = r->next;
            size_t b = rec_bucket(r->kind, r->key, nsize);
            r->next = nt[b];
            nt[b] = r;
            r = next;
        }
    }
    free(g_tab);
    g_tab = nt;
    g_tab_size = nsize;
}

static struct rec *rec_insert(int kind, uint64_t key, uint64_t bytes)
{
    if (g_tab == NULL || g_tab_count >= g_tab_size)
        rec_grow();
    if (g_tab == NULL)
        return NULL;
    struct rec *r = calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    r->kind = kind;
    r->key = key;
    r->bytes = bytes;
    size_t b = rec_bucket(kind, key, g_tab_size);
    r->next = g_tab[b];
    g_tab[b] = r;
    g_tab_count++;
    return r;
}

static struct rec *rec_unlink(int kind, uint64_t key)
{
    if (g_tab == NULL)
        return NULL;
    struct rec **pp = &g_tab[rec_bucket(kind, key, g_tab_size)];
    for (; *pp != NULL; pp = &(*pp)->next) {
        struct rec *r = *pp;
        if (r->kind == kind && r->key == key) {
            *pp = r->next;
            g_tab_count--;
            return r;
        }
    }
    return NULL;
}

static void records_clear(void)
{
    for (size_t i = 0; i < g_tab_size; i++) {
        struct rec *r = g_tab[i];
        while (r != NULL) {
            struct rec *next = r->next;
            free(r);
            r = next;
        }
    }
    free(g_tab);
    g_tab = NULL;
    g_tab_size = g_tab_count = 0;
    free(g_maps);
    g_maps = NULL;
    g_nmaps = g_capmaps = 0;
}

static int vmap_add(uint64_t va, uint64_t size, uint64_t handle)
{
    if (g_nmaps == g_capmaps) {
        size_t ncap = g_capmaps ? g_capmaps * 2 : 64;
        struct vmap *n = realloc(g_maps, ncap * sizeof *n);
        if (n == NULL)
            return -1;
        g_maps = n;
        g_capmaps = ncap;
    }
    g_maps[g_nmaps++] = (struct vmap){va, size, handle};
    return 0;
}

static int vmm_dead(const struct rec *r) { return r->refs == 0 && r->maps == 0 && !r->forever; }

/* After a successful allocation: record it. A record already under that key is one whose free
 * never came through here (the driver would not hand out a live address twice): drop it. */
static void commit(CUresult r, int kind, uint64_t key, uint64_t bytes)
{
    int cls = kind_cls(kind);
    if (r != CUDA_SUCCESS) {
        unreserve(cls, bytes);
        return;
    }
    if (g_share == NULL)
        return;
    uint64_t stale = 0;
    pthread_mutex_lock(&g_mu);
    ensure_proc();
    struct rec *old = rec_unlink(kind, key);
    if (old != NULL) {
        stale = old->bytes;
        free(old);
    }
    struct rec *n = rec_insert(kind, key, bytes);
    if (n != NULL && kind == K_VMM)
        n->refs = 1;
    /* n == NULL (no host memory): the bytes stay counted until the process ends. */
    pthread_mutex_unlock(&g_mu);
    unreserve(cls, stale);
}

/* Before a free: take the record out (its bytes stay counted until the driver has freed). */
static int take(int kind, uint64_t key, uint64_t *bytes)
{
    if (g_share == NULL)
        return 0;
    pthread_mutex_lock(&g_mu);
    ensure_proc();
    struct rec *r = rec_unlink(kind, key);
    if (r != NULL) {
        *bytes = r->bytes;
        free(r);
    }
    pthread_mutex_unlock(&g_mu);
    return r != NULL;
}

/* After a free: give the bytes back, or put the record back if the driver refused. */
static void settle(CUresult r, int had, int kind, uint64_t key, uint64_t bytes)
{
    if (!had)
        return;
    if (r == CUDA_SUCCESS) {
        unreserve(kind_cls(kind), bytes);
        return;
    }
    pthread_mutex_lock(&g_mu);
    ensure_proc();
    struct rec *cur = rec_find(kind, key);
    if (cur != NULL)
        cur->bytes = sat_add(cur->bytes, bytes);
    else
        rec_insert(kind, key, bytes);
    pthread_mutex_unlock(&g_mu);
}

/* ------------------------------------------------------------------------------------------
 * Device memory
 * ------------------------------------------------------------------------------------------ */
static CUresult w_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    __typeof__(&cuMemAlloc_v2) real = REAL(cuMemAlloc_v2);
    if (real == NULL)
        return missing();
    if (dptr == NULL)
        return real(dptr, bytesize);
    CUresult r = reserve(CLS_DEV, bytesize);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(dptr, bytesize);
    commit(r, K_DEV, r == CUDA_SUCCESS ? *dptr : 0, bytesize);
    return r;
}

static CUresult w_cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    __typeof__(&cuMemAlloc) real = REAL(cuMemAlloc);
    if (real == NULL)
        return missing();
    if (dptr == NULL)
        return real(dptr, bytesize);
    CUresult r = reserve(CLS_DEV, bytesize);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(dptr, bytesize);
    commit(r, K_DEV, r == CUDA_SUCCESS ? *dptr : 0, bytesize);
    return r;
}

static CUresult w_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    __typeof__(&cuMemAllocManaged) real = REAL(cuMemAllocManaged);
    if (real == NULL)
        return missing();
    if (dptr == NULL)
        return real(dptr, bytesize, flags);
    CUresult r = reserve(CLS_DEV, bytesize);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(dptr, bytesize, flags);
    commit(r, K_DEV, r == CUDA_SUCCESS ? *dptr : 0, bytesize);
    return r;
}

/* Pitch: the size is known only after the call. The lower bound (width * height) is checked
 * first, so a request that cannot fit never reaches the driver; the padding is reserved after
 * the call, and an allocation whose padding does not fit is freed and refused. */
static CUresult pitch_settle(CUresult r, uint64_t ptr, uint64_t lower, uint64_t bytes,
                             int (*release)(uint64_t))
{
    if (r != CUDA_SUCCESS) {
        unreserve(CLS_DEV, lower);
        return r;
    }
    if (bytes > lower) {
        CUresult r2 = reserve(CLS_DEV, bytes - lower);
        if (r2 != CUDA_SUCCESS) {
            release(ptr);
            unreserve(CLS_DEV, lower);
            return r2;
        }
    } else if (bytes < lower) {
        unreserve(CLS_DEV, lower - bytes);
    }
    commit(CUDA_SUCCESS, K_DEV, ptr, bytes);
    return CUDA_SUCCESS;
}

static int release_v2(uint64_t p)
{
    __typeof__(&cuMemFree_v2) f = REAL(cuMemFree_v2);
    return f != NULL ? (int)f((CUdeviceptr)p) : -1;
}

static int release_v1(uint64_t p)
{
    __typeof__(&cuMemFree) f = REAL(cuMemFree);
    return f != NULL ? (int)f((CUdeviceptr_v1)p) : -1;
}

static CUresult w_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                     size_t Height, unsigned int ElementSizeBytes)
{
    __typeof__(&cuMemAllocPitch_v2) real = REAL(cuMemAllocPitch_v2);
    if (real == NULL)
        return missing();
    if (dptr == NULL || pPitch == NULL)
        return real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    uint64_t lower = sat_mul(WidthInBytes, Height);
    CUresult r = reserve(CLS_DEV, lower);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    uint64_t bytes = r == CUDA_SUCCESS ? sat_mul(*pPitch, Height) : 0;
    r = pitch_settle(r, r == CUDA_SUCCESS ? *dptr : 0, lower, bytes, release_v2);
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        *dptr = 0;
    return r;
}

static CUresult w_cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch,
                                  unsigned int WidthInBytes, unsigned int Height,
                                  unsigned int ElementSizeBytes)
{
    __typeof__(&cuMemAllocPitch) real = REAL(cuMemAllocPitch);
    if (real == NULL)
        return missing();
    if (dptr == NULL || pPitch == NULL)
        return real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    uint64_t lower = (uint64_t)WidthInBytes * Height;
    CUresult r = reserve(CLS_DEV, lower);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    uint64_t bytes = r == CUDA_SUCCESS ? (uint64_t)*pPitch * Height : 0;
    r = pitch_settle(r, r == CUDA_SUCCESS ? *dptr : 0, lower, bytes, release_v1);
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        *dptr = 0;
    return r;
}

static CUresult w_cuMemFree_v2(CUdeviceptr dptr)
{
    __typeof__(&cuMemFree_v2) real = REAL(cuMemFree_v2);
    if (real == NULL)
        return missing();
    uint64_t bytes = 0;
    int had = take(K_DEV, dptr, &bytes);
    CUresult r = real(dptr);
    settle(r, had, K_DEV, dptr, bytes);
    return r;
}

static CUresult w_cuMemFree(CUdeviceptr_v1 dptr)
{
    __typeof__(&cuMemFree) real = REAL(cuMemFree);
    if (real == NULL)
        return missing();
    uint64_t bytes = 0;
    int had = take(K_DEV, dptr, &bytes);
    CUresult r = real(dptr);
    settle(r, had, K_DEV, dptr, bytes);
    return r;
}

/* ---- stream-ordered ---- */
static CUresult alloc_async(__typeof__(&cuMemAllocAsync) real, CUdeviceptr *dptr,
                            size_t bytesize, CUstream hStream)
{
    if (real == NULL)
        return missing();
    if (dptr == NULL)
        return real(dptr, bytesize, hStream);
    CUresult r = reserve(CLS_DEV, bytesize);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(dptr, bytesize, hStream);
    commit(r, K_DEV, r == CUDA_SUCCESS ? *dptr : 0, bytesize);
    return r;
}

static CUresult w_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(REAL(cuMemAllocAsync), dptr, bytesize, hStream);
}

static CUresult w_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(REAL(cuMemAllocAsync_ptsz), dptr, bytesize, hStream);
}

static CUresult alloc_pool(__typeof__(&cuMemAllocFromPoolAsync) real, CUdeviceptr *dptr,
                           size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    if (real == NULL)
        return missing();
    if (dptr == NULL)
        return real(dptr, bytesize, pool, hStream);
    CUresult r = reserve(CLS_DEV, bytesize);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(dptr, bytesize, pool, hStream);
    commit(r, K_DEV, r == CUDA_SUCCESS ? *dptr : 0, bytesize);
    return r;
}

static CUresult w_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                          CUstream hStream)
{
    return alloc_pool(REAL(cuMemAllocFromPoolAsync), dptr, bytesize, pool, hStream);
}

static CUresult w_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                               CUmemoryPool pool, CUstream hStream)
{
    return alloc_pool(REAL(cuMemAllocFromPoolAsync_ptsz), dptr, bytesize, pool, hStream);
}

static CUresult free_async(__typeof__(&cuMemFreeAsync) real, CUdeviceptr dptr, CUstream hStream)
{
    if (real == NULL)
        return missing();
    uint64_t bytes = 0;
    int had = take(K_DEV, dptr, &bytes);
    CUresult r = real(dptr, hStream);
    settle(r, had, K_DEV, dptr, bytes);
    return r;
}

static CUresult w_cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(REAL(cuMemFreeAsync), dptr, hStream);
}

static CUresult w_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(REAL(cuMemFreeAsync_ptsz), dptr, hStream);
}

/* ---- arrays ----
 * A CUDA array's memory is laid out by the driver (tiled, aligned), and nothing reports its
 * size for an array with memory of its own. It is counted at what its texels need: width x
 * height x depth (layers and cube faces included) x the texel's bytes, each mipmap level at its
 * own size. A format not known here counts as the widest texel, 16 bytes a channel, so a newer
 * format is never counted short; the driver's padding is the agent's NVML watch's (its slack).
 * A sparse or deferred-mapping array has no memory until cuMemMapArrayAsync maps a cuMemCreate'd
 * handle into it, counted there. */
static uint64_t at_least_1(uint64_t n) { return n == 0 ? 1 : n; }

static uint64_t texel_bytes(CUarray_format format, unsigned int channels)
{
    uint64_t ch = at_least_1(channels);
    unsigned int f = (unsigned int)format;
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return ch;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2 * ch;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4 * ch;
    case CU_AD_FORMAT_NV12: /* 1.5 bytes a pixel */
        return 2;
    default:
        break;
    }
    if (f >= CU_AD_FORMAT_UNORM_INT8X1 && f <= CU_AD_FORMAT_SNORM_INT16X4) {
        /* UNORM/SNORM int8 x1, x2, x4 then int16 x1, x2, x4: the format says its channels. */
        static const uint64_t bytes[6] = {1, 2, 4, 2, 4, 8};
        return bytes[(f - CU_AD_FORMAT_UNORM_INT8X1) % 6];
    }
    if (f >= CU_AD_FORMAT_BC1_UNORM && f <= CU_AD_FORMAT_BC7_UNORM_SRGB)
        return 1; /* block-compressed: at most 16 bytes a 4 x 4 block */
    return sat_mul(16, ch);
}

static uint64_t array_bytes(uint64_t width, uint64_t height, uint64_t depth,
                            CUarray_format format, unsigned int channels, unsigned int flags,
                            unsigned int levels)
{
    if (flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING))
        return 0;
    uint64_t texel = texel_bytes(format, channels);
    /* Layers and cube faces do not shrink from one mipmap level to the next. */
    int keeps_depth = (flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
    levels = levels == 0 ? 1 : levels > 64 ? 64 : levels;
    uint64_t total = 0;
    for (unsigned int l = 0; l < levels; l++) {
        uint64_t w = at_least_1(width >> l), h = at_least_1(height >> l);
        uint64_t d = keeps_depth ? at_least_1(depth) : at_least_1(depth >> l);
        total = sat_add(total, sat_mul(sat_mul(sat_mul(w, h), d), texel));
    }
    return total;
}

/* Reserves `bytes`, creates through `create`, records the handle under `kind`. */
#define ARRAY_CREATE(kind, handle, bytes, call)                                         \
    do {                                                                                \
        CUresult r_ = reserve(CLS_DEV, (bytes));                                        \
        if (r_ != CUDA_SUCCESS)                                                         \
            return r_;                                                                  \
        r_ = (call);                                                                    \
        commit(r_, (kind), r_ == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*(handle) : 0, (bytes)); \
        return r_;                                                                      \
    } while (0)

/* cuArrayCreate and cuArray3DCreate, each ABI: `depth` and `flags` read from `desc`. */
#define ARRAY_WRAPPER(fn, desc_type, depth, flags)                                          \
    static CUresult w_##fn(CUarray *pHandle, const desc_type *desc)                         \
    {                                                                                       \
        __typeof__(&fn) real = REAL(fn);                                                    \
        if (real == NULL)                                                                   \
            return missing();                                                               \
        if (pHandle == NULL || desc == NULL)                                                \
            return real(pHandle, desc);                                                     \
        uint64_t bytes = array_bytes(desc->Width, desc->Height, (depth), desc->Format,      \
                                     desc->NumChannels, (flags), 1);                        \
        ARRAY_CREATE(K_ARRAY, pHandle, bytes, real(pHandle, desc));                         \
    }

ARRAY_WRAPPER(cuArrayCreate_v2, CUDA_ARRAY_DESCRIPTOR, 1, 0)
ARRAY_WRAPPER(cuArrayCreate, CUDA_ARRAY_DESCRIPTOR_v1, 1, 0)
ARRAY_WRAPPER(cuArray3DCreate_v2, CUDA_ARRAY3D_DESCRIPTOR, desc->Depth, desc->Flags)
ARRAY_WRAPPER(cuArray3DCreate, CUDA_ARRAY3D_DESCRIPTOR_v1, desc->Depth, desc->Flags)

static CUresult w_cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                         const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                         unsigned int numMipmapLevels)
{
    __typeof__(&cuMipmappedArrayCreate) real = REAL(cuMipmappedArrayCreate);
    if (real == NULL)
        return missing();
    if (pHandle == NULL || desc == NULL)
        return real(pHandle, desc, numMipmapLevels);
    uint64_t bytes = array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                                 desc->NumChannels, desc->Flags, numMipmapLevels);
    ARRAY_CREATE(K_MIPMAP, pHandle, bytes, real(pHandle, desc, numMipmapLevels));
}

static CUresult w_cuArrayDestroy(CUarray hArray)
{
    __typeof__(&cuArrayDestroy) real = REAL(cuArrayDestroy);
    if (real == NULL)
        return missing();
    uint64_t key = (uint64_t)(uintptr_t)hArray, bytes = 0;
    int had = take(K_ARRAY, key, &bytes);
    CUresult r = real(hArray);
    settle(r, had, K_ARRAY, key, bytes);
    return r;
}

static CUresult w_cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    __typeof__(&cuMipmappedArrayDestroy) real = REAL(cuMipmappedArrayDestroy);
    if (real == NULL)
        return missing();
    uint64_t key = (uint64_t)(uintptr_t)hMipmappedArray, bytes = 0;
    int had = take(K_MIPMAP, key, &bytes);
    CUresult r = real(hMipmappedArray);
    settle(r, had, K_MIPMAP, key, bytes);
    return r;
}

/* ---- virtual memory management ----
 * A cuMemCreate'd handle's physical memory stays counted while any reference to it is
 * unreleased (cuMemCreate and each cuMemRetainAllocationHandle add one, cuMemRelease takes
 * one) or any cuMemMap of it is still mapped: that is when the driver frees it. Releasing a
 * handle that is still mapped keeps it counted until the last cuMemUnmap. */
static CUresult w_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                              const CUmemAllocationProp *prop, unsigned long long flags)
{
    __typeof__(&cuMemCreate) real = REAL(cuMemCreate);
    if (real == NULL)
        return missing();
    if (handle == NULL)
        return real(handle, size, prop, flags);
    CUresult r = reserve(CLS_DEV, size);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(handle, size, prop, flags);
    commit(r, K_VMM, r == CUDA_SUCCESS ? *handle : 0, size);
    return r;
}

static CUresult w_cuMemRelease(CUmemGenericAllocationHandle handle)
{
    __typeof__(&cuMemRelease) real = REAL(cuMemRelease);
    if (real == NULL)
        return missing();
    int touched = 0;
    uint64_t freed = 0;
    if (g_share != NULL) {
        pthread_mutex_lock(&g_mu);
        ensure_proc();
        struct rec *rec = rec_find(K_VMM, handle);
        if (rec != NULL && rec->refs > 0) {
            rec->refs--;
            touched = 1;
            if (vmm_dead(rec)) {
                freed = rec->bytes;
                free(rec_unlink(K_VMM, handle));
            }
        }
        pthread_mutex_unlock(&g_mu);
    }
    CUresult r = real(handle);
    if (r != CUDA_SUCCESS && touched) {
        pthread_mutex_lock(&g_mu);
        ensure_proc();
        struct rec *rec = rec_find(K_VMM, handle);
        if (rec == NULL && freed != 0)
            rec = rec_insert(K_VMM, handle, freed);
        if (rec != NULL)
            rec->refs++;
        pthread_mutex_unlock(&g_mu);
        return r;
    }
    if (r == CUDA_SUCCESS)
        unreserve(CLS_DEV, freed);
    return r;
}

static CUresult w_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                           CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    __typeof__(&cuMemMap) real = REAL(cuMemMap);
    if (real == NULL)
        return missing();
    if (g_share == NULL)
        return real(ptr, size, offset, handle, flags);
    /* Count the mapping before the call, so a release racing with it cannot uncount. */
    pthread_mutex_lock(&g_mu);
    ensure_proc();
    struct rec *rec = rec_find(K_VMM, handle);
    if (rec != NULL)
        rec->maps++;
    pthread_mutex_unlock(&g_mu);
    CUresult r = real(ptr, size, offset, handle, flags);
    uint64_t freed = 0;
    pthread_mutex_lock(&g_mu);
    ensure_proc();
    rec = rec_find(K_VMM, handle);
    if (rec != NULL) {
        if (r == CUDA_SUCCESS) {
            if (vmap_add(ptr, size, handle) != 0)
                rec->forever = 1; /* cannot track the mapping: keep it counted */
        } else if (rec->maps > 0) {
            rec->maps--;
            if (vmm_dead(rec)) {
                freed = rec->bytes;
                free(rec_unlink(K_VMM, handle));
            }
        }
    }
    pthread_mutex_unlock(&g_mu);
    unreserve(CLS_DEV, freed);
    return r;
}

static CUresult w_cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    __typeof__(&cuMemUnmap) real = REAL(cuMemUnmap);
    if (real == NULL)
        return missing();
    if (g_share == NULL)
        return real(ptr, size);
    /* The mappings lying wholly inside [ptr, ptr + size) end with this call. */
    struct vmap local[16], *gone = local;
    size_t ngone = 0, capgone = 16;
    pthread_mutex_lock(&g_mu);
    ensure_proc();
    for (size_t i = 0; i < g_nmaps;) {
        struct vmap m = g_maps[i];
        int inside = m.va >= ptr && m.size <= size && m.va - ptr <= size - m.size;
        if (!inside) {
            i++;
            continue;
        }
        if (ngone == capgone) {
            struct vmap *n = malloc(capgone * 2 * sizeof *n);
            if (n == NULL)
                break; /* the rest stay recorded: counted longer, never less */
            memcpy(n, gone, ngone * sizeof *n);
            if (gone != local)
                free(gone);
            gone = n;
            capgone *= 2;
        }
        gone[ngone++] = m;
        g_maps[i] = g_maps[--g_nmaps];
    }
    pthread_mutex_unlock(&g_mu);
    CUresult r = real(ptr, size);
    uint64_t freed = 0;
    pthread_mutex_lock(&g_mu);
    ensure_proc();
    for (size_t i = 0; i < ngone; i++) {
        if (r != CUDA_SUCCESS) {
            if (vmap_add(gone[i].va, gone[i].size, gone[i].handle) != 0) {
                struct rec *rec = rec_find(K_VMM, gone[i].handle);
                if (rec != NULL)
                    rec->forever = 1;
            }
            continue;
        }
        struct rec *rec = rec_find(K_VMM, gone[i].handle);
        if (rec == NULL || rec->maps == 0)
            continue;
        rec->maps--;
        if (vmm_dead(rec)) {
            freed = sat_add(freed, rec->bytes);
            free(rec_unlink(K_VMM, gone[i].handle));
        }
    }
    pthread_mutex_unlock(&g_mu);
    if (gone != local)
        free(gone);
    unreserve(CLS_DEV, freed);
    return r;
}

static CUresult w_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    __typeof__(&cuMemRetainAllocationHandle) real = REAL(cuMemRetainAllocationHandle);
    if (real == NULL)
        return missing();
    if (g_share == NULL)
        return real(handle, addr);
    /* Take the reference before the call (found through the mapping that holds addr), so a
     * racing release and unmap cannot uncount memory the new reference keeps alive. */
    uint64_t a = (uint64_t)(uintptr_t)addr, guess = 0;
    int have_guess = 0;
    pthread_mutex_lock(&g_mu);
    ensure_proc();
    for (size_t i = 0; i < g_nmaps; i++) {
        if (a >= g_maps[i].va && a - g_maps[i].va < g_maps[i].size) {
            struct rec *rec = rec_find(K_VMM, g_maps[i].handle);
            if (rec != NULL) {
                rec->refs++;
                guess = g_maps[i].handle;
                have_guess = 1;
            }
            break;
        }
    }
    pthread_mutex_unlock(&g_mu);
    CUresult r = real(handle, addr);
    if (r == CUDA_SUCCESS && handle != NULL && have_guess && *handle == guess)
        return r;
    pthread_mutex_lock(&g_mu);
    ensure_proc();
    if (have_guess) {
        struct rec *rec = rec_find(K_VMM, guess);
        if (rec != NULL && rec->refs > 0)
            rec->refs--; /* dead is impossible here: its mapping is still recorded */
    }
    if (r == CUDA_SUCCESS && handle != NULL) {
        struct rec *rec = rec_find(K_VMM, *handle);
        if (rec != NULL)
            rec->refs++;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* A handle mapped into a sparse CUDA array stays counted until the process ends: array
 * mappings are not tracked one by one (conservative). */
static CUresult map_array(__typeof__(&cuMemMapArrayAsync) real, CUarrayMapInfo *list,
                          unsigned int count, CUstream hStream)
{
    if (real == NULL)
        return missing();
    if (list != NULL && g_share != NULL) {
        pthread_mutex_lock(&g_mu);
        ensure_proc();
        for (unsigned int i = 0; i < count; i++) {
            if (list[i].memOperationType != CU_MEM_OPERATION_TYPE_MAP ||
                list[i].memHandleType != CU_MEM_HANDLE_TYPE_GENERIC)
                continue;
            struct rec *rec = rec_find(K_VMM, list[i].memHandle.memHandle);
            if (rec != NULL)
                rec->forever = 1;
        }
        pthread_mutex_unlock(&g_mu);
    }
    return real(list, count, hStream);
}

static CUresult w_cuMemMapArrayAsync(CUarrayMapInfo *list, unsigned int count, CUstream hStream)
{
    return map_array(REAL(cuMemMapArrayAsync), list, count, hStream);
}

static CUresult w_cuMemMapArrayAsync_ptsz(CUarrayMapInfo *list, unsigned int count,
                                          CUstream hStream)
{
    return map_array(REAL(cuMemMapArrayAsync_ptsz), list, count, hStream);
}

/* ---- graph memory nodes ----
 * A memory alloc node's bytes are counted from the node's creation until its graph is
 * destroyed, whether or not the graph ever runs and whatever free nodes it has: conservative. */
static void graph_add(CUgraph g, uint64_t bytes)
{
    if (g_share == NULL)
        return;
    pthread_mutex_lock(&g_mu);
    ensure_proc();
    struct rec *rec = rec_find(K_GRAPH, (uint64_t)(uintptr_t)g);
    if (rec != NULL)
        rec->bytes = sat_add(rec->bytes, bytes);
    else
        rec_insert(K_GRAPH, (uint64_t)(uintptr_t)g, bytes);
    pthread_mutex_unlock(&g_mu);
}

static CUresult w_cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                         const CUgraphNode *dependencies, size_t numDependencies,
                                         CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    __typeof__(&cuGraphAddMemAllocNode) real = REAL(cuGraphAddMemAllocNode);
    if (real == NULL)
        return missing();
    if (nodeParams == NULL)
        return real(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
    uint64_t bytes = nodeParams->bytesize;
    CUresult r = reserve(CLS_DEV, bytes);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
    if (r != CUDA_SUCCESS)
        unreserve(CLS_DEV, bytes);
    else
        graph_add(hGraph, bytes);
    return r;
}

static CUresult w_cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                 const CUgraphNode *dependencies, size_t numDependencies,
                                 CUgraphNodeParams *nodeParams)
{
    __typeof__(&cuGraphAddNode) real = REAL(cuGraphAddNode);
    if (real == NULL)
        return missing();
    if (nodeParams == NULL || nodeParams->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        return real(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
    uint64_t bytes = nodeParams->u.alloc.bytesize;
    CUresult r = reserve(CLS_DEV, bytes);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
    if (r != CUDA_SUCCESS)
        unreserve(CLS_DEV, bytes);
    else
        graph_add(hGraph, bytes);
    return r;
}

static CUresult w_cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                    const CUgraphNode *dependencies,
                                    const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                    CUgraphNodeParams *nodeParams)
{
    __typeof__(&cuGraphAddNode_v2) real = REAL(cuGraphAddNode_v2);
    if (real == NULL)
        return missing();
    if (nodeParams == NULL || nodeParams->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        return real(phGraphNode, hGraph, dependencies, dependencyData, numDependencies,
                    nodeParams);
    uint64_t bytes = nodeParams->u.alloc.bytesize;
    CUresult r = reserve(CLS_DEV, bytes);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(phGraphNode, hGraph, dependencies, dependencyData, numDependencies, nodeParams);
    if (r != CUDA_SUCCESS)
        unreserve(CLS_DEV, bytes);
    else
        graph_add(hGraph, bytes);
    return r;
}

static CUresult w_cuGraphDestroy(CUgraph hGraph)
{
    __typeof__(&cuGraphDestroy) real = REAL(cuGraphDestroy);
    if (real == NULL)
        return missing();
    uint64_t bytes = 0;
    int had = take(K_GRAPH, (uint64_t)(uintptr_t)hGraph, &bytes);
    CUresult r = real(hGraph);
    settle(r, had, K_GRAPH, (uint64_t)(uintptr_t)hGraph, bytes);
    return r;
}

/* ---- context limits ----
 * The malloc heap and the printf FIFO are reserved at their new size (replacing the old:
 * raising is checked, lowering gives back); the stack at size * multiprocessors * threads per
 * multiprocessor, which is what the driver backs for every resident thread. The defaults a
 * context starts with are not counted (see README). */
static int limit_kind(CUlimit limit)
{
    switch (limit) {
    case CU_LIMIT_STACK_SIZE: return K_LIM_STACK;
    case CU_LIMIT_PRINTF_FIFO_SIZE: return K_LIM_FIFO;
    case CU_LIMIT_MALLOC_HEAP_SIZE: return K_LIM_HEAP;
    default: return 0;
    }
}

static CUresult stack_bytes(size_t per_thread, uint64_t *out)
{
    __typeof__(&cuCtxGetDevice) getdev = AUX(cuCtxGetDevice);
    __typeof__(&cuDeviceGetAttribute) attr = AUX(cuDeviceGetAttribute);
    if (getdev == NULL || attr == NULL)
        return missing();
    CUdevice dev;
    int sms = 0, threads = 0;
    CUresult r = getdev(&dev);
    if (r == CUDA_SUCCESS)
        r = attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    if (r == CUDA_SUCCESS)
        r = attr(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev);
    if (r != CUDA_SUCCESS)
        return r;
    *out = sat_mul(sat_mul(per_thread, (uint64_t)(sms > 0 ? sms : 0)), (uint64_t)(threads > 0 ? threads : 0));
    return CUDA_SUCCESS;
}

static CUresult w_cuCtxSetLimit(CUlimit limit, size_t value)
{
    __typeof__(&cuCtxSetLimit) real = REAL(cuCtxSetLimit);
    if (real == NULL)
        return missing();
    int kind = limit_kind(limit);
    __typeof__(&cuCtxGetCurrent) getcur = AUX(cuCtxGetCurrent);
    CUcontext ctx = NULL;
    if (kind == 0 || getcur == NULL || getcur(&ctx) != CUDA_SUCCESS || ctx == NULL)
        return real(limit, value); /* not a memory limit, or no context: the driver answers */
    uint64_t want = value;
    if (kind == K_LIM_STACK) {
        CUresult r = stack_bytes(value, &want);
        if (r != CUDA_SUCCESS)
            return r;
    }
    uint64_t key = (uint64_t)(uintptr_t)ctx;
    pthread_mutex_lock(&g_limit_mu);
    uint64_t old = 0;
    if (g_share != NULL) {
        pthread_mutex_lock(&g_mu);
        ensure_proc();
        struct rec *rec = rec_find(kind, key);
        old = rec != NULL ? rec->bytes : 0;
        pthread_mutex_unlock(&g_mu);
    }
    CUresult r;
    if (want > old) {
        r = reserve(CLS_DEV, want - old);
        if (r == CUDA_SUCCESS) {
            r = real(limit, value);
            if (r != CUDA_SUCCESS)
                unreserve(CLS_DEV, want - old);
        }
    } else {
        r = real(limit, value);
        if (r == CUDA_SUCCESS)
            unreserve(CLS_DEV, old - want);
    }
    if (r == CUDA_SUCCESS && g_share != NULL) {
        pthread_mutex_lock(&g_mu);
        ensure_proc();
        struct rec *rec = rec_find(kind, key);
        if (want == 0)
            free(rec_unlink(kind, key));
        else if (rec != NULL)
            rec->bytes = want;
        else
            rec_insert(kind, key, want);
        pthread_mutex_unlock(&g_mu);
    }
    pthread_mutex_unlock(&g_limit_mu);
    return r;
}

static CUresult ctx_destroy(__typeof__(&cuCtxDestroy_v2) real, CUcontext ctx)
{
    if (real == NULL)
        return missing();
    static const int kinds[3] = {K_LIM_STACK, K_LIM_FIFO, K_LIM_HEAP};
    uint64_t key = (uint64_t)(uintptr_t)ctx, bytes[3] = {0, 0, 0};
    int had[3] = {0, 0, 0};
    pthread_mutex_lock(&g_limit_mu);
    for (int i = 0; i < 3; i++)
        had[i] = take(kinds[i], key, &bytes[i]);
    CUresult r = real(ctx);
    for (int i = 0; i < 3; i++)
        settle(r, had[i], kinds[i], key, bytes[i]);
    pthread_mutex_unlock(&g_limit_mu);
    return r;
}

static CUresult w_cuCtxDestroy_v2(CUcontext ctx) { return ctx_destroy(REAL(cuCtxDestroy_v2), ctx); }
static CUresult w_cuCtxDestroy(CUcontext ctx) { return ctx_destroy(REAL(cuCtxDestroy), ctx); }

/* ---- page-locked host memory (against pinned_limit_bytes) ---- */
static CUresult w_cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    __typeof__(&cuMemHostAlloc) real = REAL(cuMemHostAlloc);
    if (real == NULL)
        return missing();
    if (pp == NULL)
        return real(pp, bytesize, Flags);
    CUresult r = reserve(CLS_PIN, bytesize);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(pp, bytesize, Flags);
    commit(r, K_HOSTALLOC, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pp : 0, bytesize);
    return r;
}

static CUresult w_cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    __typeof__(&cuMemAllocHost_v2) real = REAL(cuMemAllocHost_v2);
    if (real == NULL)
        return missing();
    if (pp == NULL)
        return real(pp, bytesize);
    CUresult r = reserve(CLS_PIN, bytesize);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(pp, bytesize);
    commit(r, K_HOSTALLOC, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pp : 0, bytesize);
    return r;
}

static CUresult w_cuMemAllocHost(void **pp, unsigned int bytesize)
{
    __typeof__(&cuMemAllocHost) real = REAL(cuMemAllocHost);
    if (real == NULL)
        return missing();
    if (pp == NULL)
        return real(pp, bytesize);
    CUresult r = reserve(CLS_PIN, bytesize);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(pp, bytesize);
    commit(r, K_HOSTALLOC, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pp : 0, bytesize);
    return r;
}

static CUresult w_cuMemFreeHost(void *p)
{
    __typeof__(&cuMemFreeHost) real = REAL(cuMemFreeHost);
    if (real == NULL)
        return missing();
    uint64_t key = (uint64_t)(uintptr_t)p, bytes = 0;
    int had = take(K_HOSTALLOC, key, &bytes);
    CUresult r = real(p);
    settle(r, had, K_HOSTALLOC, key, bytes);
    return r;
}

static CUresult host_register(__typeof__(&cuMemHostRegister_v2) real, void *p, size_t bytesize,
                              unsigned int Flags)
{
    if (real == NULL)
        return missing();
    CUresult r = reserve(CLS_PIN, bytesize);
    if (r != CUDA_SUCCESS)
        return r;
    r = real(p, bytesize, Flags);
    commit(r, K_HOSTREG, (uint64_t)(uintptr_t)p, bytesize);
    return r;
}

static CUresult w_cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    return host_register(REAL(cuMemHostRegister_v2), p, bytesize, Flags);
}

static CUresult w_cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    return host_register(REAL(cuMemHostRegister), p, bytesize, Flags);
}

static CUresult w_cuMemHostUnregister(void *p)
{
    __typeof__(&cuMemHostUnregister) real = REAL(cuMemHostUnregister);
    if (real == NULL)
        return missing();
    uint64_t key = (uint64_t)(uintptr_t)p, bytes = 0;
    int had = take(K_HOSTREG, key, &bytes);
    CUresult r = real(p);
    settle(r, had, K_HOSTREG, key, bytes);
    return r;
}

/* ---- cuMemGetInfo: the share, not the GPU ---- */
static void adjust_info(uint64_t *freep, uint64_t *totalp)
{
    struct gsaas_share *s = g_share;
    if (s == NULL) {
        log_problem_once();
        *freep = 0;
        return;
    }
    pthread_mutex_lock(&g_mu);
    ensure_proc();
    share_lock(s);
    char why[128];
    if (!header_valid(s, why, sizeof why)) {
        *freep = 0;
    } else {
        uint64_t limit = __atomic_load_n(&s->limit_bytes, __ATOMIC_ACQUIRE);
        if (limit != GSAAS_SHARE_UNLIMITED) {
            reclaim_stale(s);
            uint64_t used = slots_sum(s, CLS_DEV);
            uint64_t avail = limit > used ? limit - used : 0;
            if (*totalp > limit)
                *totalp = limit;
            if (*freep > avail)
                *freep = avail;
        }
    }
    share_unlock(s);
    pthread_mutex_unlock(&g_mu);
}

static CUresult w_cuMemGetInfo_v2(size_t *free_out, size_t *total_out)
{
    __typeof__(&cuMemGetInfo_v2) real = REAL(cuMemGetInfo_v2);
    if (real == NULL)
        return missing();
    CUresult r = real(free_out, total_out);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t f = free_out ? *free_out : 0, t = total_out ? *total_out : 0;
    adjust_info(&f, &t);
    if (free_out)
        *free_out = f;
    if (total_out)
        *total_out = t;
    return r;
}

static CUresult w_cuMemGetInfo(unsigned int *free_out, unsigned int *total_out)
{
    __typeof__(&cuMemGetInfo) real = REAL(cuMemGetInfo);
    if (real == NULL)
        return missing();
    CUresult r = real(free_out, total_out);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t f = free_out ? *free_out : 0, t = total_out ? *total_out : 0;
    adjust_info(&f, &t);
    if (free_out)
        *free_out = (unsigned int)(f > UINT_MAX ? UINT_MAX : f);
    if (total_out)
        *total_out = (unsigned int)(t > UINT_MAX ? UINT_MAX : t);
    return r;
}

/* ------------------------------------------------------------------------------------------
 * Sharing between processes: refused, whatever the limit
 * ------------------------------------------------------------------------------------------ */
static CUresult refuse_sharing(void)
{
    struct gsaas_share *s = g_share;
    if (s != NULL)
        __atomic_add_fetch(&s->refused_sharing, 1, __ATOMIC_RELAXED);
    return CUDA_ERROR_NOT_SUPPORTED;
}

static CUresult w_cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    (void)pHandle, (void)dptr;
    return refuse_sharing();
}

static CUresult w_cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    (void)pdptr, (void)handle, (void)Flags;
    return refuse_sharing();
}

static CUresult w_cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                        unsigned int Flags)
{
    (void)pdptr, (void)handle, (void)Flags;
    return refuse_sharing();
}

static CUresult w_cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    (void)dptr;
    return refuse_sharing();
}

static CUresult w_cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent event)
{
    (void)pHandle, (void)event;
    return refuse_sharing();
}

static CUresult w_cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle)
{
    (void)phEvent, (void)handle;
    return refuse_sharing();
}

static CUresult w_cuMemExportToShareableHandle(void *shareableHandle,
                                               CUmemGenericAllocationHandle handle,
                                               CUmemAllocationHandleType handleType,
                                               unsigned long long flags)
{
    (void)shareableHandle, (void)handle, (void)handleType, (void)flags;
    return refuse_sharing();
}

static CUresult w_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                 void *osHandle,
                                                 CUmemAllocationHandleType shHandleType)
{
    (void)handle, (void)osHandle, (void)shHandleType;
    return refuse_sharing();
}

static CUresult w_cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                                   CUmemAllocationHandleType handleType,
                                                   unsigned long long flags)
{
    (void)handle_out, (void)pool, (void)handleType, (void)flags;
    return refuse_sharing();
}

static CUresult w_cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                                     CUmemAllocationHandleType handleType,
                                                     unsigned long long flags)
{
    (void)pool_out, (void)handle, (void)handleType, (void)flags;
    return refuse_sharing();
}

static CUresult w_cuMemPoolExportPointer(CUmemPoolPtrExportData *shareData_out, CUdeviceptr ptr)
{
    (void)shareData_out, (void)ptr;
    return refuse_sharing();
}

static CUresult w_cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
                                         CUmemPoolPtrExportData *shareData)
{
    (void)ptr_out, (void)pool, (void)shareData;
    return refuse_sharing();
}

static CUresult w_cuImportExternalMemory(CUexternalMemory *extMem_out,
                                         const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *memHandleDesc)
{
    (void)extMem_out, (void)memHandleDesc;
    return refuse_sharing();
}

static CUresult w_cuImportExternalSemaphore(CUexternalSemaphore *extSem_out,
                                            const CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC *semHandleDesc)
{
    (void)extSem_out, (void)semHandleDesc;
    return refuse_sharing();
}

static CUresult w_cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                                CUmemRangeHandleType handleType,
                                                unsigned long long flags)
{
    (void)handle, (void)dptr, (void)size, (void)handleType, (void)flags;
    return refuse_sharing();
}

/* ------------------------------------------------------------------------------------------
 * cuGetProcAddress: whatever the driver hands out for a name we take over becomes our wrapper
 * ------------------------------------------------------------------------------------------ */

/* The wrapper for the function the driver returned as `p` for (symbol, version, flags), p if it
 * is not one we take over, or NULL to refuse (an ABI variant of a counted function this
 * library does not know). */
static void *wrap_proc(const char *symbol, void *p, int version, cuuint64_t flags)
{
    load_real();
    if (wrapper_index(p) >= 0)
        return p;
    /* 1. The very function we dlsym'd by its versioned name. */
    for (int i = 0; i < H_COUNT; i++)
        if (__atomic_load_n(&g_real[i], __ATOMIC_ACQUIRE) == p)
            return g_wrappers[i];
    /* 2. An exported driver function, named by the dynamic symbol table. */
    Dl_info info;
    if (dladdr(p, &info) != 0 && info.dli_sname != NULL && info.dli_saddr == p) {
        int i = hook_index(info.dli_sname);
        if (i >= 0) {
            void *expected = NULL;
            __atomic_compare_exchange_n(&g_real[i], &expected, p, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
            return g_wrappers[i];
        }
        for (int j = 0; j < H_COUNT; j++) {
            size_t n = strlen(g_hooks[j].base);
            if (strncmp(info.dli_sname, g_hooks[j].base, n) == 0 &&
                (strncmp(info.dli_sname + n, "_v", 2) == 0 || strncmp(info.dli_sname + n, "_pt", 3) == 0)) {
                if (__atomic_exchange_n(&g_variant_logged, 1, __ATOMIC_ACQ_REL) == 0)
                    say("the driver returned %s for %s: a variant this library does not know; refused",
                        info.dli_sname, symbol);
                return NULL;
            }
        }
        return p;
    }
    /* 3. An unnamed (internal) pointer: the variant for this name, version and flags. */
    int ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1;
    for (int i = 0; i < H_COUNT; i++) {
        const struct hook *h = &g_hooks[i];
        if (strcmp(h->base, symbol) != 0 || h->version > version || (h->ptsz && !ptds))
            continue;
        if (best < 0 || h->ptsz > g_hooks[best].ptsz ||
            (h->ptsz == g_hooks[best].ptsz && h->version > g_hooks[best].version))
            best = i;
    }
    if (best < 0)
        best = hook_index(symbol); /* asked by a full versioned name */
    if (best < 0)
        return p;
    void *expected = NULL;
    __atomic_compare_exchange_n(&g_real[best], &expected, p, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return g_wrappers[best];
}

static CUresult w_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    __typeof__(&cuGetProcAddress) real = REAL(cuGetProcAddress);
    if (real == NULL)
        return missing();
    CUresult r = real(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && symbol != NULL && pfn != NULL && *pfn != NULL) {
        void *w = wrap_proc(symbol, *pfn, cudaVersion, flags);
        *pfn = w;
        if (w == NULL)
            return CUDA_ERROR_NOT_SUPPORTED;
    }
    return r;
}

static CUresult w_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                      cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
    __typeof__(&cuGetProcAddress_v2) real = REAL(cuGetProcAddress_v2);
    if (real == NULL)
        return missing();
    CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && symbol != NULL && pfn != NULL && *pfn != NULL) {
        void *w = wrap_proc(symbol, *pfn, cudaVersion, flags);
        *pfn = w;
        if (w == NULL) {
            if (symbolStatus != NULL)
                *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
            return CUDA_ERROR_NOT_SUPPORTED;
        }
    }
    return r;
}

/* ------------------------------------------------------------------------------------------
 * dlsym: a handle-based lookup of a name we take over gets our wrapper
 * ------------------------------------------------------------------------------------------ */
static void *dlsym_hooked(dlsym_fn real, void *handle, const char *symbol)
{
    int i = hook_index(symbol);
    if (i < 0)
        return NULL;
    if (handle != RTLD_NEXT) {
        /* Only where the name exists behind that handle. */
        void *p = real(handle, symbol);
        if (p == NULL)
            return NULL;
        load_real();
        if (wrapper_index(p) < 0) {
            void *expected = NULL;
            __atomic_compare_exchange_n(&g_real[i], &expected, p, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        }
        return g_wrappers[i];
    }
    /* RTLD_NEXT cannot be evaluated here for the caller; the driver has the name or not. */
    return real_at(i) != NULL ? g_wrappers[i] : NULL;
}

EXPORT void *dlsym(void *handle, const char *symbol)
{
    dlsym_fn real = real_dlsym();
    if (real == NULL)
        return NULL;
    if (symbol[0] == 'c' && symbol[1] == 'u') { /* glibc declares symbol non-null */
        void *w = dlsym_hooked(real, handle, symbol);
        if (w != NULL)
            return w;
    }
    /* A sibling call (built with -O2): the real dlsym sees our caller's return address, so
     * RTLD_NEXT keeps meaning "after the caller". The dlsym_lookups test checks it. */
    return real(handle, symbol);
}

/* ------------------------------------------------------------------------------------------
 * Process life: constructor, fork, exit
 * ------------------------------------------------------------------------------------------ */
static void atfork_prepare(void)
{
    pthread_mutex_lock(&g_load_mu);
    pthread_mutex_lock(&g_limit_mu);
    pthread_mutex_lock(&g_mu);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_unlock(&g_limit_mu);
    pthread_mutex_unlock(&g_load_mu);
}

static void atfork_child(void)
{
    g_pid = 0; /* the next call starts this process afresh: no records, no slot */
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_unlock(&g_limit_mu);
    pthread_mutex_unlock(&g_load_mu);
}

__attribute__((constructor)) static void gsaas_init(void)
{
    (void)real_dlsym();
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    map_share();
    if (g_share == NULL)
        return;
    /* An exec'd image keeps its pid and start time: the slot of its former image holds memory
     * the driver freed at exec. */
    pthread_mutex_lock(&g_mu);
    ensure_proc();
    share_lock(g_share);
    for (unsigned i = 0; i < GSAAS_SHARE_NSLOTS; i++)
        if (g_share->slots[i].pid == (int32_t)g_pid)
            slot_clear(&g_share->slots[i]);
    share_unlock(g_share);
    pthread_mutex_unlock(&g_mu);
}

__attribute__((destructor)) static void gsaas_fini(void)
{
    struct gsaas_share *s = g_share;
    if (s == NULL || pthread_mutex_trylock(&g_mu) != 0)
        return; /* busy: the slot goes stale at exit and is reclaimed */
    if (g_pid == getpid() && g_slot >= 0) {
        share_lock(s);
        struct gsaas_share_slot *sl = my_slot(s);
        if (sl != NULL)
            slot_clear(sl);
        share_unlock(s);
        g_slot = -1;
    }
    pthread_mutex_unlock(&g_mu);
}

/* ------------------------------------------------------------------------------------------
 * The exported names
 * ------------------------------------------------------------------------------------------ */
#define X_EXPORT(n, b, v, p) extern __typeof__(n) n __attribute__((alias("w_" #n), visibility("default")));
GSAAS_HOOKS(X_EXPORT)
#undef X_EXPORT
