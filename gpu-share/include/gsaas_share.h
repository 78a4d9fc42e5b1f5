/*
 * gsaas_share.h: the share state, the contract between the GSaaS host agent (Rust, rodvr-agent)
 * and libgsaas-share.so, the interposer preloaded into every GPU server process it starts.
 *
 * One share state belongs to one GPU server (for instance one lupine_driver_server and every
 * child it forks or execs). It is a file of exactly GSAAS_SHARE_SIZE (4160) bytes, created,
 * sized and given its header by the agent (root). Every process of the server maps it
 * MAP_SHARED, read-write, and all of them draw from the one limit it holds.
 *
 * Byte order little-endian; every field naturally aligned; no padding anywhere:
 *
 *   offset  size  field
 *        0     4  u32 magic                 GSAAS_SHARE_MAGIC, 0x48535347 ("GSSH" as bytes)
 *        4     4  u32 version               GSAAS_SHARE_VERSION, 1
 *        8     8  u64 limit_bytes           device memory all processes may hold together;
 *                                           UINT64_MAX = no limit (an exclusive cGPU),
 *                                           0 = nothing (a spare server, no cGPU yet)
 *       16     8  u64 pinned_limit_bytes    page-locked host memory (cuMemHostAlloc,
 *                                           cuMemAllocHost, cuMemHostRegister), same conventions
 *       24     4  u32 lock                  0 free, else the holder's pid
 *       28     4  u32 nslots                GSAAS_SHARE_NSLOTS, 128
 *       32     8  u64 refused_allocations   +1 at every allocation refused for the limit
 *       40     8  u64 refused_sharing       +1 at every sharing (IPC/export/import) call refused
 *       48     8  u64 peak_bytes            highest device total seen
 *       56     8  u64 reserved              0
 *       64  4096  128 slots of 32 bytes:
 *                   +0  i32 pid             0 = free slot
 *                   +4  u32 reserved        0
 *                   +8  u64 start_time      field 22 of /proc/<pid>/stat, as the kernel gives it
 *                  +16  u64 device_bytes    device memory this process holds (counted)
 *                  +24  u64 pinned_bytes    page-locked host memory this process holds (counted)
 *
 * Who writes what:
 *  - The agent writes the whole header once (magic, version, limits, nslots = 128, the rest 0)
 *    before it starts the server, and may later change limit_bytes / pinned_limit_bytes at any
 *    time with 8-byte aligned atomic stores; the next allocation sees the new value. A lowered
 *    limit takes nothing away: it refuses new allocations until the total is under it.
 *  - The agent may read everything at any time without the lock (each u64 is stored atomically;
 *    a sum over slots read without the lock may be momentarily inconsistent).
 *  - The interposer changes slots, peak_bytes and the counters, only while it holds the lock
 *    (counters are also bumped with atomic adds).
 *
 * The lock: a process takes it by compare-and-swap of 0 -> its pid, and frees it by storing 0.
 * It is held for a few microseconds (a sum over 128 slots). A waiter that finds the holder dead
 * (no such pid, or a zombie) takes it over by compare-and-swap of holder -> its own pid; so does
 * one that has seen the same live holder for more than GSAAS_SHARE_LOCK_STALE_MS (only a
 * stopped process or a reused pid can hold it that long).
 *
 * Slots: a process takes a free slot (pid == 0) at its first counted allocation, writing
 * start_time and zeroed byte counts before the pid. A slot whose pid is dead (or a zombie), or
 * whose start_time no longer matches that pid's, is stale: its bytes stop counting when whoever
 * next holds the lock and needs room (a slot, or bytes under the limit) reclaims it. A process
 * frees its slot when it exits normally. An exec'd image (same pid, same start_time) finds the
 * slot of its former image and zeroes it: the driver freed that memory at exec. No free slot
 * after reclaiming means the allocation is refused.
 *
 * Finding it: the interposer reads GSAAS_SHARE_FD=<fd> (a descriptor the agent opened
 * read-write and lets the server inherit; the interposer never closes it, so exec'd descendants
 * map it again) or, for tests and manual use, GSAAS_SHARE_FILE=<path>. It maps the file once, in
 * its constructor, before any fork. With neither, or with a state that is not valid (wrong
 * size, magic, version or nslots, a descriptor not open read-write), it fails closed: every
 * counted allocation is refused and cuMemGetInfo reports 0 free.
 */
#ifndef GSAAS_SHARE_H
#define GSAAS_SHARE_H

#include <stddef.h>
#include <stdint.h>

#define GSAAS_SHARE_MAGIC 0x48535347u /* "GSSH" in little-endian bytes */
#define GSAAS_SHARE_VERSION 1u
#define GSAAS_SHARE_NSLOTS 128u
#define GSAAS_SHARE_SIZE 4160u
#define GSAAS_SHARE_UNLIMITED UINT64_MAX

#define GSAAS_SHARE_FD_ENV "GSAAS_SHARE_FD"
#define GSAAS_SHARE_FILE_ENV "GSAAS_SHARE_FILE"

/* A live holder seen holding the lock this long is taken over (see above). */
#define GSAAS_SHARE_LOCK_STALE_MS 5000u

struct gsaas_share_slot {
    int32_t pid;
    uint32_t reserved;
    uint64_t start_time;
    uint64_t device_bytes;
    uint64_t pinned_bytes;
};

struct gsaas_share {
    uint32_t magic;
    uint32_t version;
    uint64_t limit_bytes;
    uint64_t pinned_limit_bytes;
    uint32_t lock;
    uint32_t nslots;
    uint64_t refused_allocations;
    uint64_t refused_sharing;
    uint64_t peak_bytes;
    uint64_t reserved;
    struct gsaas_share_slot slots[GSAAS_SHARE_NSLOTS];
};

_Static_assert(sizeof(struct gsaas_share_slot) == 32, "slot is 32 bytes");
_Static_assert(sizeof(struct gsaas_share) == GSAAS_SHARE_SIZE, "share state is 4160 bytes");
_Static_assert(offsetof(struct gsaas_share, limit_bytes) == 8, "limit_bytes at 8");
_Static_assert(offsetof(struct gsaas_share, pinned_limit_bytes) == 16, "pinned_limit_bytes at 16");
_Static_assert(offsetof(struct gsaas_share, lock) == 24, "lock at 24");
_Static_assert(offsetof(struct gsaas_share, nslots) == 28, "nslots at 28");
_Static_assert(offsetof(struct gsaas_share, refused_allocations) == 32, "refused_allocations at 32");
_Static_assert(offsetof(struct gsaas_share, refused_sharing) == 40, "refused_sharing at 40");
_Static_assert(offsetof(struct gsaas_share, peak_bytes) == 48, "peak_bytes at 48");
_Static_assert(offsetof(struct gsaas_share, reserved) == 56, "reserved at 56");
_Static_assert(offsetof(struct gsaas_share, slots) == 64, "slots at 64");
_Static_assert(offsetof(struct gsaas_share_slot, start_time) == 8, "slot start_time at 8");
_Static_assert(offsetof(struct gsaas_share_slot, device_bytes) == 16, "slot device_bytes at 16");
_Static_assert(offsetof(struct gsaas_share_slot, pinned_bytes) == 24, "slot pinned_bytes at 24");

#endif /* GSAAS_SHARE_H */
