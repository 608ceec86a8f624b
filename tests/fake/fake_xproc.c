/* The fake NCCL across processes (fake_cuda_nccl.h, "What the fake emulates"): the ranks of
 * a clique meet in a POSIX shared-memory segment named from its unique id; each call
 * publishes its input there under its sequence number, and each rank computes its own output
 * from every rank's input with the host backend's kernels. Every function runs under
 * fake_cuda_nccl.c's lock, so the process-local state below needs no lock of its own. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* robust mutexes, futex, clock_gettime; also when built outside tests/ */
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "backends/host/reduce.h"
#include "fake/fake_cuda_nccl.h"
#include "fake/fake_xproc.h"

#define XP_MAGIC              0x63637166u /* "ccqf": the creator has initialised the segment */
#define XP_SLOTS              256         /* collective sequence numbers in flight per clique */
#define XP_PSLOTS             32          /* sends in flight per ordered pair of ranks */
#define XP_DEFAULT_TIMEOUT_MS 30000
/* The longest futex sleep: waits re-check deadlines and dead peers at least this often, and
 * a wake for another segment (waits sleep on one) is never needed for progress. */
#define XP_NAP_NS 5000000ll
/* A segment nobody ever registered in is stale after this long (fake_xproc_cleanup). */
#define XP_STALE_NS (600ll * 1000000000ll)

/* One rank's call for one sequence number: what the ranks must agree on, and the size of
 * its input in its data file. */
typedef struct xp_desc {
    int32_t kind, dtype, op, root;
    uint64_t count, bytes;
    /* The rank's group on this clique (collectives only): the sequence number of its first
     * collective, how many it held, and its bytes per (function, op, type) as one hash. */
    uint64_t gseq, gsig;
    uint32_t gtasks;
} xp_desc;

/* Sequence number s of a clique's collectives lives in slots[s % XP_SLOTS] until every rank
 * has read every input (done), then the last reader frees it. */
typedef struct xp_slot {
    uint64_t tag;             /* s + 1; 0: free */
    uint32_t published, done; /* ranks, as bits */
    xp_desc d[FAKE_XP_MAX_RANKS];
} xp_slot;

/* Send number s from rank a to rank b lives in pairs[a][b][s % XP_PSLOTS]: published by the
 * sender, consumed by the receiver, freed by the sender. */
enum { PS_FREE, PS_PUBLISHED, PS_CONSUMED };
typedef struct xp_pslot {
    uint64_t tag; /* s + 1; 0: free */
    uint32_t state;
    xp_desc d;
} xp_pslot;

typedef struct xp_shm {
    _Atomic uint32_t ready;
    _Atomic uint32_t futex; /* bumped and woken at every change */
    pthread_mutex_t mu;     /* robust and process-shared: a peer may die holding it */
    ncclUniqueId id;
    int32_t nranks, nproc; /* nproc: processes attached */
    uint32_t joined;       /* ranks registered, as bits */
    uint32_t launched;     /* ranks that launched a group with a call on the clique, as bits */
    int32_t pid[FAKE_XP_MAX_RANKS], dev[FAKE_XP_MAX_RANKS];
    int32_t cc[FAKE_XP_MAX_RANKS]; /* each rank's device's compute capability major */
    xp_slot slots[XP_SLOTS];
    xp_pslot pairs[FAKE_XP_MAX_RANKS][FAKE_XP_MAX_RANKS][XP_PSLOTS];
} xp_shm;

struct fake_xp_clique {
    ncclUniqueId id;
    char name[64]; /* "/ccqfake-<hash of id>-<uid>"; data files add "-..." */
    xp_shm *h;     /* NULL once every local rank left */
    int nranks, local;
    struct {
        bool in, joining;
        long long deadline;
        uint64_t seq, sent[FAKE_XP_MAX_RANKS], recvd[FAKE_XP_MAX_RANKS];
        /* The next sequence number to publish (collectives, sends per peer). */
        uint64_t pub_seq, pub_sent[FAKE_XP_MAX_RANKS];
        ncclResult_t err; /* sticky, as NCCL's asynchronous error */
    } r[FAKE_XP_MAX_RANKS];
    struct fake_xp_clique *next;
};

/* A launched call whose input is not published yet (its slot still held an older call),
 * or whose output (for a send: the receiver's copy) is not there yet. */
typedef struct xp_pend {
    fake_xp_op op;
    uint64_t seq, ticket;
    uint64_t gseq, gsig; /* its group's signature on its clique (see xp_desc) */
    uint32_t gtasks;
    long long deadline;
    bool published; /* its input is in the segment (a recv has none to publish) */
    bool staged;    /* its input's data is written, its slot not filled yet */
    bool computed;  /* its result is written (a recv: copied), its slot not released yet */
    size_t bytes[FAKE_XP_MAX_RANKS]; /* a computed collective's inputs' sizes */
    bool failed; /* it failed (its rank holds the error): as NCCL's kernels of a failed
                    collective, it never finishes, and the events after it never complete,
                    until its rank is aborted or destroyed (fake_xp_leave) */
    struct xp_pend *next;
} xp_pend;

/* The last record of an event: it waits for the calls of its stream up to ticket. */
typedef struct xp_event {
    const void *event, *stream;
    uint64_t ticket;
    struct xp_event *next;
} xp_event;

static struct {
    fake_xp_clique *cliques;
    xp_pend *pend;
    xp_event *events;
    uint64_t tickets;
} X;

static _Atomic long xp_timeout = -1; /* ms; -1: CCQ_FAKE_XPROC_TIMEOUT_MS or the default */

static const struct {
    const char *fn;
    bool reduces, rooted;
} xk[] = {
    [FAKE_XP_SEND] = {"ncclSend", false, false},
    [FAKE_XP_RECV] = {"ncclRecv", false, false},
    [FAKE_XP_ALLREDUCE] = {"ncclAllReduce", true, false},
    [FAKE_XP_BROADCAST] = {"ncclBroadcast", false, true},
    [FAKE_XP_REDUCE] = {"ncclReduce", true, true},
    [FAKE_XP_ALLGATHER] = {"ncclAllGather", false, false},
    [FAKE_XP_REDUCESCATTER] = {"ncclReduceScatter", true, false},
    [FAKE_XP_ALLTOALL] = {"ncclAlltoAll", false, false},
    [FAKE_XP_GATHER] = {"ncclGather", false, true},
    [FAKE_XP_SCATTER] = {"ncclScatter", false, true},
};

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static long long timeout_ns(void)
{
    long ms = atomic_load(&xp_timeout);
    if (ms < 0) {
        const char *env = getenv("CCQ_FAKE_XPROC_TIMEOUT_MS");
        ms = env != NULL && *env != '\0' ? strtol(env, NULL, 10) : XP_DEFAULT_TIMEOUT_MS;
    }
    return (long long)ms * 1000000ll;
}

static bool alive(int32_t pid)
{
    return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

static void shm_lock(xp_shm *h)
{
    int e = pthread_mutex_lock(&h->mu);
    if (e == EOWNERDEAD)
        pthread_mutex_consistent(&h->mu); /* a peer died inside: at worst its step is lost */
    else if (e != 0)
        abort();
}

/* The lock's holder keeps it this long before releasing it (CCQ_FAKE_XPROC_LOCK_HOLD_US,
 * tests only): makes a peer stopped inside the lock likely, for the drills that check no
 * other process waits on it. */
static long hold_us(void)
{
    static _Atomic long v = -1;
    long x = atomic_load(&v);
    if (x < 0) {
        const char *env = getenv("CCQ_FAKE_XPROC_LOCK_HOLD_US");
        x = env != NULL ? strtol(env, NULL, 10) : 0;
        atomic_store(&v, x < 0 ? 0 : x);
    }
    return x;
}

static void shm_unlock(xp_shm *h)
{
    long us = hold_us();
    struct timespec hold = {us / 1000000, (us % 1000000) * 1000};
    if (us > 0)
        nanosleep(&hold, NULL);
    pthread_mutex_unlock(&h->mu);
    /* ...and then stays out of it as long, so that the others get it: a mutex is not fair,
     * and the thread that just released it, still on its core, won nearly every race
     * against peers polling with shm_try (asleep between tries, and waiting for a core with
     * a busy thread beside them). Without this, one busy thread on the 2-core machine
     * starved a rank's publish until the drill's timeout_ms (5 runs in 5). */
    if (us > 0)
        nanosleep(&hold, NULL);
}

/*
 * Take the lock if it comes within XP_TRY_NS. A peer process holds it only for a few
 * loads and stores, unless it was stopped (SIGSTOP) inside them: then it holds it until it
 * is continued. Real NCCL has no lock a stopped process can hold against another's host
 * thread (its kernels and proxies talk through lock-free FIFOs), so no call a ccq thread
 * makes may wait for it: the progress paths take it with this and, without it, do what they
 * can (report no progress, retry at the next poll); only a blocking init waits (as NCCL's).
 * Without this, a process stopped inside the lock stopped every peer's scheduler thread with
 * it, and job health could not act on the loss it had declared (drill_health under TSan).
 */
#define XP_TRY_NS 2000000ll
static bool shm_try(xp_shm *h)
{
    /* Polled with trylock, not pthread_mutex_timedlock: ThreadSanitizer's interceptor of the
     * latter does not record EOWNERDEAD (a peer killed inside) as taking the lock, and then
     * reports our unlock of it as an unlock of an unlocked mutex. */
    long long until = 0;
    for (;;) {
        int e = pthread_mutex_trylock(&h->mu);
        if (e == EOWNERDEAD) {
            pthread_mutex_consistent(&h->mu); /* a peer died inside: at worst its step is lost */
            return true;
        }
        if (e == 0)
            return true;
        if (e != EBUSY)
            abort();
        if (until == 0)
            until = now_ns() + XP_TRY_NS;
        else if (now_ns() >= until)
            return false;
        nanosleep(&(struct timespec){0, 20000}, NULL);
    }
}

static void shm_wake(xp_shm *h)
{
    atomic_fetch_add(&h->futex, 1);
    syscall(SYS_futex, (uint32_t *)&h->futex, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Sleep until the segment changes after `seen`, XP_NAP_NS or the deadline, whichever is
 * first (the fake's lock stays held: see the header's note on blocking waits). */
static void shm_nap(xp_shm *h, uint32_t seen, long long deadline)
{
    long long left = deadline - now_ns();
    if (left <= 0)
        return;
    if (left > XP_NAP_NS)
        left = XP_NAP_NS;
    struct timespec ts = {(time_t)(left / 1000000000ll), (long)(left % 1000000000ll)};
    syscall(SYS_futex, (uint32_t *)&h->futex, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static uint32_t all_ranks(int n)
{
    return n >= 32 ? UINT32_MAX : (1u << n) - 1u;
}

static void data_name(char *buf, size_t len, const fake_xp_clique *q, bool coll, uint64_t seq,
                      int a, int b)
{
    if (coll)
        snprintf(buf, len, "%s-c%" PRIu64 "-%d", q->name, seq, a);
    else
        snprintf(buf, len, "%s-p%d-%d-%" PRIu64, q->name, a, b, seq);
}

static bool write_data(const char *name, const void *src, size_t bytes)
{
    int fd = shm_open(name, O_CREAT | O_RDWR | O_TRUNC, 0600);
    bool ok = fd >= 0 && ftruncate(fd, (off_t)bytes) == 0;
    if (ok) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ok = p != MAP_FAILED;
        if (ok) {
            memcpy(p, src, bytes);
            munmap(p, bytes);
        }
    }
    if (fd >= 0)
        close(fd);
    if (!ok)
        fake_error("fake_xproc: cannot write %s (%zu bytes): %s", name, bytes, strerror(errno));
    return ok;
}

static const void *map_data(const char *name, size_t bytes)
{
    int fd = shm_open(name, O_RDONLY, 0);
    void *p = fd < 0 ? MAP_FAILED : mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (fd >= 0)
        close(fd);
    if (p == MAP_FAILED) {
        fake_error("fake_xproc: cannot read %s (%zu bytes): %s", name, bytes, strerror(errno));
        return NULL;
    }
    return p;
}

/* Unlink every data file of the segment `name` (and, with control, the segment too). */
static int unlink_prefix(const char *name, bool control)
{
    DIR *d = opendir("/dev/shm");
    size_t len = strlen(name + 1);
    int n = 0;
    char path[300];
    if (d != NULL) {
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            if (strncmp(e->d_name, name + 1, len) != 0 || e->d_name[len] != '-')
                continue;
            snprintf(path, sizeof path, "/%s", e->d_name);
            n += shm_unlink(path) == 0;
        }
        closedir(d);
    }
    if (control)
        n += shm_unlink(name) == 0;
    return n;
}

static uint64_t id_hash(const ncclUniqueId *id)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof id->internal; i++)
        h = (h ^ (unsigned char)id->internal[i]) * 1099511628211ull;
    return h;
}

/* A call's failure: sticky for the rank, reported by ncclCommGetAsyncError. A peer that
 * never comes or died is not a misuse of this process, so no fake_error. */
static void rank_fail(fake_xp_clique *q, int rank, ncclResult_t e, const char *what)
{
    if (q->r[rank].err == ncclSuccess)
        q->r[rank].err = e;
    fprintf(stderr, "fake_cuda_nccl: pid %d, rank %d of %s: %s\n", (int)getpid(), rank,
            q->id.internal, what);
}

/* ---- Opening and closing the segment ---- */

static bool open_segment(fake_xp_clique *q)
{
    long long deadline = now_ns() + timeout_ns();
    struct stat stt;
    xp_shm *h;
    bool created;
    int fd = shm_open(q->name, O_CREAT | O_EXCL | O_RDWR, 0600);

    created = fd >= 0;
    if (!created && errno == EEXIST)
        fd = shm_open(q->name, O_RDWR, 0);
    if (fd < 0) {
        fake_error("fake_xproc: shm_open %s: %s", q->name, strerror(errno));
        return false;
    }
    if (created) {
        if (ftruncate(fd, (off_t)sizeof *h) != 0) {
            fake_error("fake_xproc: ftruncate %s: %s", q->name, strerror(errno));
            close(fd);
            shm_unlink(q->name);
            return false;
        }
    } else {
        /* The creator sizes it right after creating it. */
        while (fstat(fd, &stt) == 0 && (size_t)stt.st_size < sizeof *h && now_ns() < deadline)
            nanosleep(&(struct timespec){0, 1000000}, NULL);
        if (fstat(fd, &stt) != 0 || (size_t)stt.st_size != sizeof *h) {
            fake_error("fake_xproc: %s has %lld bytes, not %zu", q->name, (long long)stt.st_size,
                       sizeof *h);
            close(fd);
            return false;
        }
    }
    h = mmap(NULL, sizeof *h, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (h == MAP_FAILED) {
        fake_error("fake_xproc: mmap %s: %s", q->name, strerror(errno));
        return false;
    }
    if (created) {
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&h->mu, &a);
        pthread_mutexattr_destroy(&a);
        h->id = q->id;
        h->nranks = q->nranks;
        atomic_store_explicit(&h->ready, XP_MAGIC, memory_order_release);
    } else {
        while (atomic_load_explicit(&h->ready, memory_order_acquire) != XP_MAGIC &&
               now_ns() < deadline)
            nanosleep(&(struct timespec){0, 1000000}, NULL);
        if (atomic_load_explicit(&h->ready, memory_order_acquire) != XP_MAGIC) {
            fake_error("fake_xproc: %s was never initialised by its creator", q->name);
            munmap(h, sizeof *h);
            return false;
        }
    }
    shm_lock(h);
    if (memcmp(&h->id, &q->id, sizeof q->id) != 0 || h->nranks != q->nranks) {
        int n = h->nranks;
        shm_unlock(h);
        fake_error("ncclCommInitRankConfig: %s has %d ranks in another process, %d here (or "
                   "another id with the same hash)",
                   q->id.internal, n, q->nranks);
        munmap(h, sizeof *h);
        return false;
    }
    h->nproc++;
    shm_unlock(h);
    q->h = h;
    return true;
}

/* Drop the pending calls of (q, rank), or of every rank of q when rank < 0. */
static void drop_pending(const fake_xp_clique *q, int rank)
{
    for (xp_pend **pp = &X.pend; *pp != NULL;) {
        xp_pend *p = *pp;
        if (p->op.q == q && (rank < 0 || p->op.rank == rank)) {
            *pp = p->next;
            free(p);
        } else {
            pp = &p->next;
        }
    }
}

static void close_segment(fake_xp_clique *q)
{
    xp_shm *h = q->h;
    bool last;
    if (h == NULL)
        return;
    if (shm_try(h)) {
        last = --h->nproc == 0;
        shm_unlock(h);
    } else {
        last = false; /* a stopped peer holds it: leave the count (fake_xproc_cleanup) */
    }
    shm_wake(h);
    munmap(h, sizeof *h);
    q->h = NULL;
    if (last)
        unlink_prefix(q->name, true); /* a peer that crashed leaves it: fake_xproc_cleanup */
}

/* ---- Progress ---- */

static size_t input_bytes(const fake_xp_op *o, int n)
{
    size_t blk = o->count * ccq_dtype_size(o->dtype);
    switch (o->kind) {
    case FAKE_XP_BROADCAST:
        return o->rank == o->root ? blk : 0;
    case FAKE_XP_SCATTER:
        return o->rank == o->root ? blk * (size_t)n : 0;
    case FAKE_XP_REDUCESCATTER:
    case FAKE_XP_ALLTOALL:
        return blk * (size_t)n;
    case FAKE_XP_RECV:
        return 0;
    default:
        return blk;
    }
}

static xp_desc make_desc(const xp_pend *p, int n)
{
    const fake_xp_op *o = &p->op;
    return (xp_desc){.kind = o->kind,
                     .dtype = o->nccl_dtype,
                     .op = xk[o->kind].reduces ? o->nccl_op : -1,
                     .root = xk[o->kind].rooted ? o->root : -1,
                     .count = o->count,
                     .bytes = input_bytes(o, n),
                     .gseq = p->gseq,
                     .gsig = p->gsig,
                     .gtasks = p->gtasks};
}

/* Rank `rank`'s output of a collective from every rank's input (NCCL's definitions). */
static void compute(const fake_xp_op *o, int n, const void *const *in)
{
    size_t blk = o->count * ccq_dtype_size(o->dtype);
    const void *src[FAKE_XP_MAX_RANKS];
    void *dst = o->dst;
    int r = o->rank, root = o->root;

    if (blk == 0)
        return;
    switch (o->kind) {
    case FAKE_XP_ALLREDUCE:
        ccq_host_reduce_range(o->dtype, o->op, (uint32_t)n, in, 1, &dst, 0, o->count, 0);
        break;
    case FAKE_XP_BROADCAST:
        memcpy(dst, in[root], blk);
        break;
    case FAKE_XP_REDUCE:
        if (r == root)
            ccq_host_reduce_range(o->dtype, o->op, (uint32_t)n, in, 1, &dst, 0, o->count, 0);
        break;
    case FAKE_XP_ALLGATHER:
        for (int k = 0; k < n; k++)
            memcpy((char *)dst + (size_t)k * blk, in[k], blk);
        break;
    case FAKE_XP_REDUCESCATTER:
        for (int k = 0; k < n; k++)
            src[k] = (const char *)in[k] + (size_t)r * blk;
        ccq_host_reduce_range(o->dtype, o->op, (uint32_t)n, src, 1, &dst, 0, o->count, 0);
        break;
    case FAKE_XP_ALLTOALL:
        for (int k = 0; k < n; k++)
            memcpy((char *)dst + (size_t)k * blk, (const char *)in[k] + (size_t)r * blk, blk);
        break;
    case FAKE_XP_GATHER:
        for (int k = 0; r == root && k < n; k++)
            memcpy((char *)dst + (size_t)k * blk, in[k], blk);
        break;
    case FAKE_XP_SCATTER:
        memcpy(dst, (const char *)in[root] + (size_t)r * blk, blk);
        break;
    default:
        abort();
    }
}

/* The ranks of `mask` whose registered process is gone. */
static uint32_t dead_ranks(const fake_xp_clique *q, uint32_t mask)
{
    int32_t pid[FAKE_XP_MAX_RANKS];
    uint32_t dead = 0;
    if (!shm_try(q->h))
        return 0; /* none known now: asked again at the next poll */
    memcpy(pid, q->h->pid, sizeof pid);
    shm_unlock(q->h);
    for (int k = 0; k < q->nranks; k++)
        if ((mask & (1u << k)) && pid[k] != 0 && !alive(pid[k]))
            dead |= 1u << k;
    return dead;
}

/*
 * The ranks in `missing` had not done their part at a read of the segment made after the
 * ranks in `dead` were seen gone: fail with ncclRemoteError if one of those is missing (it
 * never will do it), with ncclSystemError past the deadline, else keep waiting (false).
 * The order matters: a peer may do its part and exit between a read and a look at it.
 */
static bool fail_waiting(fake_xp_clique *q, const xp_pend *p, uint32_t missing, uint32_t dead,
                         const char *what)
{
    char msg[256];
    int32_t pid;
    for (int k = 0; k < q->nranks; k++) {
        if (!(missing & dead & (1u << k)))
            continue;
        pid = -1;
        if (shm_try(q->h)) {
            pid = q->h->pid[k];
            shm_unlock(q->h);
        }
        snprintf(msg, sizeof msg, "%s %" PRIu64 ": rank %d's process %d exited", what, p->seq, k,
                 (int)pid);
        rank_fail(q, p->op.rank, ncclRemoteError, msg);
        return true;
    }
    if (now_ns() < p->deadline)
        return false;
    for (int k = 0; k < q->nranks; k++) {
        if (missing & (1u << k)) {
            snprintf(msg, sizeof msg,
                     "%s %" PRIu64 ": rank %d did not take part within the fake's timeout", what,
                     p->seq, k);
            break;
        }
    }
    rank_fail(q, p->op.rank, ncclSystemError, msg);
    return true;
}

static bool mark_done(fake_xp_clique *q, xp_pend *p);

static bool coll_progress(fake_xp_clique *q, xp_pend *p)
{
    const fake_xp_op *o = &p->op;
    xp_shm *h = q->h;
    xp_slot *sl = &h->slots[p->seq % XP_SLOTS];
    int n = q->nranks;
    uint32_t all = all_ranks(n), published;
    xp_desc d[FAKE_XP_MAX_RANKS];
    int32_t pid[FAKE_XP_MAX_RANKS];
    const void *in[FAKE_XP_MAX_RANKS] = {0};
    char name[128];
    bool same = true, ok = true;

    if (p->computed)
        return mark_done(q, p); /* the result is written: only the slot's release is left */
    for (uint32_t dead = 0, attempt = 0;; attempt++) {
        if (!shm_try(h))
            return false;
        published = sl->tag == p->seq + 1 ? sl->published : 0;
        memcpy(d, sl->d, sizeof d);
        memcpy(pid, h->pid, sizeof pid);
        shm_unlock(h);
        if (published == all)
            break;
        if (attempt == 1 || (dead = dead_ranks(q, all & ~published)) == 0)
            return fail_waiting(q, p, all & ~published, dead, xk[o->kind].fn);
    }

    /* NCCL's ordering contract: the same collective at the same position on every rank. */
    for (int k = 0; k < n && same; k++) {
        same = d[k].kind == d[o->rank].kind && d[k].count == d[o->rank].count &&
               d[k].dtype == d[o->rank].dtype && d[k].op == d[o->rank].op &&
               d[k].root == d[o->rank].root;
        if (!same) {
            fake_error("%s of %s, sequence %" PRIu64 ": rank %d (process %d) called %s "
                       "(count %" PRIu64 ", dtype %d, op %d, root %d), rank %d (process %d) %s "
                       "(count %zu, dtype %d, op %d, root %d)",
                       xk[o->kind].fn, q->id.internal, p->seq, k, (int)pid[k], xk[d[k].kind].fn,
                       d[k].count, d[k].dtype, d[k].op, d[k].root, o->rank, (int)getpid(),
                       xk[o->kind].fn, o->count, o->nccl_dtype, d[o->rank].op, d[o->rank].root);
            rank_fail(q, o->rank, ncclInvalidUsage, "collectives differ across processes");
        }
    }
    /*
     * NCCL plans a group per communicator from all its collectives together: it aggregates
     * those within 4x of each other's size to pick algorithm and protocol (enqueue.cc,
     * ncclPrepareTasks) and splits channels by the group's total traffic, so the same
     * collective in differently cut groups can run on different channels or protocols on
     * two ranks: a hang or wrong data on a GPU. Every rank's group holding this collective
     * must be the same: same first sequence number, task count, bytes per function/op/type.
     */
    for (int k = 0; k < n && same; k++) {
        same = d[k].gseq == d[o->rank].gseq && d[k].gtasks == d[o->rank].gtasks &&
               d[k].gsig == d[o->rank].gsig;
        if (!same) {
            fake_error("%s of %s, sequence %" PRIu64 ": rank %d (process %d) ran it in a group "
                       "of %u collectives on this communicator from sequence %" PRIu64
                       ", rank %d (process %d) in one of %u from sequence %" PRIu64
                       " (NCCL plans each group per communicator: ranks must group alike)",
                       xk[o->kind].fn, q->id.internal, p->seq, k, (int)pid[k], d[k].gtasks,
                       d[k].gseq, o->rank, (int)getpid(), d[o->rank].gtasks, d[o->rank].gseq);
            rank_fail(q, o->rank, ncclInternalError,
                      "ranks grouped a communicator's collectives differently");
        }
    }
    for (int k = 0; k < n && same && ok; k++) {
        data_name(name, sizeof name, q, true, p->seq, k, 0);
        if (d[k].bytes > 0)
            ok = (in[k] = map_data(name, d[k].bytes)) != NULL;
    }
    if (same && ok)
        compute(o, n, in);
    else if (!ok)
        rank_fail(q, o->rank, ncclSystemError, "an input could not be read");
    for (int k = 0; k < n; k++)
        if (in[k] != NULL)
            munmap((void *)in[k], d[k].bytes);
    p->computed = true;
    for (int k = 0; k < n; k++)
        p->bytes[k] = d[k].bytes;
    return mark_done(q, p);
}

/* A collective's result is written: mark its part of the slot done, the last rank freeing
 * the slot and its inputs; false (asked again at the next poll) while the lock is held. */
static bool mark_done(fake_xp_clique *q, xp_pend *p)
{
    xp_shm *h = q->h;
    xp_slot *sl = &h->slots[p->seq % XP_SLOTS];
    int n = q->nranks;
    char name[128];
    bool last;

    if (!shm_try(h))
        return false;
    sl->done |= 1u << p->op.rank;
    last = sl->done == all_ranks(n);
    if (last)
        memset(sl, 0, sizeof *sl);
    shm_unlock(h);
    if (last) {
        for (int k = 0; k < n; k++) {
            data_name(name, sizeof name, q, true, p->seq, k, 0);
            if (p->bytes[k] > 0)
                shm_unlink(name);
        }
        shm_wake(h);
    }
    return true;
}

static bool send_progress(fake_xp_clique *q, xp_pend *p)
{
    xp_shm *h = q->h;
    xp_pslot *ps = &h->pairs[p->op.rank][p->op.peer][p->seq % XP_PSLOTS];
    uint32_t peer = 1u << p->op.peer;
    for (uint32_t dead = 0, attempt = 0;; attempt++) {
        bool consumed;
        if (!shm_try(h))
            return false;
        consumed = ps->tag == p->seq + 1 && ps->state == PS_CONSUMED;
        if (consumed)
            memset(ps, 0, sizeof *ps);
        shm_unlock(h);
        if (consumed)
            break;
        if (attempt == 1 || (dead = dead_ranks(q, peer)) == 0)
            return fail_waiting(q, p, peer, dead, "ncclSend");
    }
    shm_wake(h);
    return true;
}

static bool recv_progress(fake_xp_clique *q, xp_pend *p)
{
    const fake_xp_op *o = &p->op;
    xp_shm *h = q->h;
    xp_pslot *ps = &h->pairs[o->peer][o->rank][p->seq % XP_PSLOTS];
    size_t bytes = o->count * ccq_dtype_size(o->dtype);
    char name[128];
    bool published;
    xp_desc d;

    if (p->computed)
        goto consumed; /* the data is copied: only telling the sender is left */
    for (uint32_t dead = 0, attempt = 0;; attempt++) {
        if (!shm_try(h))
            return false;
        published = ps->tag == p->seq + 1 && ps->state == PS_PUBLISHED;
        d = ps->d;
        shm_unlock(h);
        if (published)
            break;
        if (attempt == 1 || (dead = dead_ranks(q, 1u << o->peer)) == 0)
            return fail_waiting(q, p, 1u << o->peer, dead, "ncclRecv");
    }
    data_name(name, sizeof name, q, false, p->seq, o->peer, o->rank);
    if (d.count != o->count || d.dtype != o->nccl_dtype) {
        fake_error("ncclRecv of %s: rank %d (process %d) receives %zu elements of dtype %d from "
                   "rank %d (process %d), which sends %" PRIu64 " of dtype %d",
                   q->id.internal, o->rank, (int)getpid(), o->count, o->nccl_dtype, o->peer,
                   (int)h->pid[o->peer], d.count, d.dtype);
        rank_fail(q, o->rank, ncclInvalidUsage, "send/recv sizes differ across processes");
    } else if (bytes > 0) {
        const void *src = map_data(name, bytes);
        if (src != NULL) {
            memcpy(o->dst, src, bytes);
            munmap((void *)src, bytes);
        } else {
            rank_fail(q, o->rank, ncclSystemError, "the sent data could not be read");
        }
    }
    if (d.bytes > 0)
        shm_unlink(name);
    p->computed = true;
consumed:
    if (!shm_try(h))
        return false;
    ps->state = PS_CONSUMED;
    shm_unlock(h);
    shm_wake(h);
    return true;
}

/*
 * Publish a call's input into its slot: 1 done, 0 the slot still holds an older call (for
 * a collective, one some rank has not finished; for a send, one not consumed yet), -1
 * failed. Never waiting here is what lets a group hold more calls than there are slots, in
 * any order (NCCL's groups do): the older calls finish by progress, then this one goes.
 * Each rank publishes in its sequence order, and only this process publishes rank
 * o->rank's calls, so nobody takes the slot between the look and the publication.
 */
static int publish(fake_xp_clique *q, xp_pend *p)
{
    const fake_xp_op *o = &p->op;
    bool coll = o->kind != FAKE_XP_SEND, busy;
    xp_desc d = make_desc(p, q->nranks);
    xp_slot *sl = &q->h->slots[p->seq % XP_SLOTS];
    xp_pslot *ps = &q->h->pairs[o->rank][o->peer < 0 ? 0 : o->peer][p->seq % XP_PSLOTS];
    uint64_t *next = coll ? &q->r[o->rank].pub_seq : &q->r[o->rank].pub_sent[o->peer];
    char name[128];

    /* In order: a later call of the rank may find the slot free while an earlier one, for
     * the same slot a round before, waits for it; it would take the earlier one's place. */
    if (!p->staged) {
        if (p->seq != *next || !shm_try(q->h))
            return 0;
        busy = coll ? sl->tag != 0 && sl->tag != p->seq + 1 : ps->tag != 0;
        shm_unlock(q->h);
        if (busy)
            return 0;
        ++*next;
        data_name(name, sizeof name, q, coll, p->seq, o->rank, o->peer);
        if (d.bytes > 0 && !write_data(name, o->src, d.bytes)) {
            rank_fail(q, o->rank, ncclSystemError, "its input could not be published");
            return -1;
        }
        p->staged = true; /* its data is written: only its slot is left to fill */
    }
    if (!shm_try(q->h))
        return 0;
    if (coll) {
        sl->tag = p->seq + 1;
        sl->d[o->rank] = d;
        sl->published |= 1u << o->rank;
    } else {
        ps->tag = p->seq + 1;
        ps->d = d;
        ps->state = PS_PUBLISHED;
    }
    shm_unlock(q->h);
    shm_wake(q->h);
    p->published = true;
    return 1;
}

/* Publish what can be, finish every launched call whose peers have done their part; failed
 * ones stay, stuck, until their rank leaves (their rank holds the error). */
static void progress(void)
{
    for (xp_pend **pp = &X.pend; *pp != NULL;) {
        xp_pend *p = *pp;
        fake_xp_clique *q = p->op.q;
        bool finished = q->h == NULL;
        if (p->failed && !finished) {
            pp = &p->next;
            continue;
        }
        int pub = finished || p->published || p->op.kind == FAKE_XP_RECV ? 1 : publish(q, p);
        if (pub < 0) {
            finished = true;
        } else if (pub == 0) {
            finished = now_ns() >= p->deadline;
            if (finished)
                rank_fail(q, p->op.rank, ncclSystemError,
                          "no free slot: peers did not finish older calls within the timeout");
        } else if (!finished) {
            switch (p->op.kind) {
            case FAKE_XP_SEND:
                finished = send_progress(q, p);
                break;
            case FAKE_XP_RECV:
                finished = recv_progress(q, p);
                break;
            default:
                finished = coll_progress(q, p);
                break;
            }
        }
        if (finished && q->h != NULL && q->r[p->op.rank].err != ncclSuccess) {
            p->failed = true; /* stuck until ncclCommAbort / ncclCommDestroy of its rank */
            pp = &p->next;
        } else if (finished) {
            *pp = p->next;
            free(p);
        } else {
            pp = &p->next;
        }
    }
}

static void join_progress(fake_xp_clique *q, int rank)
{
    uint32_t joined;
    char msg[160];
    if (!q->r[rank].joining || q->h == NULL || !shm_try(q->h))
        return;
    joined = q->h->joined;
    shm_unlock(q->h);
    if (joined == all_ranks(q->nranks)) {
        q->r[rank].joining = false;
        return;
    }
    if (now_ns() < q->r[rank].deadline)
        return;
    q->r[rank].joining = false;
    for (int k = 0; k < q->nranks; k++) {
        if (!(joined & (1u << k))) {
            snprintf(msg, sizeof msg,
                     "ncclCommInitRankConfig: rank %d never joined within the fake's timeout", k);
            break;
        }
    }
    rank_fail(q, rank, ncclSystemError, msg);
}

/* ---- The hooks ---- */

void fake_xp_unique_id(ncclUniqueId *id, unsigned long long counter)
{
    uint64_t rnd;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        rnd = (uint64_t)now_ns() * 0x9e3779b97f4a7c15ull;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "fake-id-%llu-%d-%016" PRIx64, counter,
             (int)getpid(), rnd);
}

fake_xp_clique *fake_xp_attach(const ncclUniqueId *id, int nranks)
{
    fake_xp_clique *q = calloc(1, sizeof *q);
    if (q == NULL)
        abort();
    q->id = *id;
    q->nranks = nranks;
    snprintf(q->name, sizeof q->name, "/ccqfake-%016" PRIx64 "-%u", id_hash(id),
             (unsigned)getuid());
    if (nranks > FAKE_XP_MAX_RANKS || !open_segment(q)) {
        free(q);
        return NULL;
    }
    q->next = X.cliques;
    X.cliques = q;
    return q;
}

ncclResult_t fake_xp_join(fake_xp_clique *q, int rank, int device, int cc_major)
{
    int32_t me = (int32_t)getpid(), other;
    if (q->h == NULL && !open_segment(q))
        return ncclSystemError;
    shm_lock(q->h);
    other = q->h->pid[rank];
    if (other != 0 && other != me && alive(other)) {
        shm_unlock(q->h);
        fake_error("ncclCommInitRankConfig: rank %d of %s is process %d's already", rank,
                   q->id.internal, (int)other);
        if (q->local == 0)
            close_segment(q); /* no rank of this process is in: do not hold it open */
        return ncclInvalidArgument;
    }
    q->h->pid[rank] = me;
    q->h->dev[rank] = device;
    q->h->cc[rank] = cc_major;
    q->h->joined |= 1u << rank;
    shm_unlock(q->h);
    shm_wake(q->h);
    memset(&q->r[rank], 0, sizeof q->r[rank]);
    q->r[rank].in = q->r[rank].joining = true;
    q->r[rank].deadline = now_ns() + timeout_ns();
    q->local++;
    join_progress(q, rank);
    return q->r[rank].joining ? ncclInProgress : q->r[rank].err;
}

ncclResult_t fake_xp_join_wait(fake_xp_clique *q, int rank)
{
    while (q->h != NULL && q->r[rank].joining) {
        uint32_t seen = atomic_load(&q->h->futex);
        join_progress(q, rank);
        if (q->r[rank].joining)
            shm_nap(q->h, seen, q->r[rank].deadline);
    }
    return q->r[rank].err;
}

ncclResult_t fake_xp_poll(fake_xp_clique *q, int rank)
{
    progress();
    join_progress(q, rank);
    return q->r[rank].joining ? ncclInProgress : q->r[rank].err;
}

bool fake_xp_joining(const fake_xp_clique *q, int rank)
{
    return q->r[rank].joining;
}

int fake_xp_min_cc(const fake_xp_clique *q)
{
    int low = INT_MAX;
    if (q->h == NULL)
        return low;
    shm_lock(q->h); /* at launch, after the join: taken while every rank is in */
    for (int k = 0; k < q->nranks; k++)
        if ((q->h->joined & (1u << k)) && q->h->cc[k] < low)
            low = q->h->cc[k];
    shm_unlock(q->h);
    return low;
}

/* Cross-process work of the stream that can still finish (a failed call never will: later
 * launches do not wait for it, but the events after it stay incomplete). */
static bool stream_busy(const void *stream)
{
    for (const xp_pend *p = X.pend; p != NULL; p = p->next)
        if (p->op.stream == stream && !p->failed)
            return true;
    return false;
}

/* Wait (progressing) while busy(arg) holds, at most until deadline. */
static bool wait_while(xp_shm *h, bool (*busy)(const void *), const void *arg, long long deadline)
{
    for (;;) {
        uint32_t seen = atomic_load(&h->futex);
        progress();
        if (!busy(arg))
            return true;
        if (now_ns() >= deadline)
            return false;
        shm_nap(h, seen, deadline);
    }
}

/* The bytes a collective moves, as NCCL's planner weighs it: count times the type's size. */
static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull; /* splitmix64 */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The signature of the group holding collective `o` (sequence number seq) on its clique,
 * for its rank: the first sequence number of the rank's collectives on that clique in this
 * group, their number, and the sum over them of hash(function, op, type) x bytes, which is
 * the same for the same bytes per (function, op, type) however they are split. */
static void group_signature(const fake_xp_op *ops, size_t n, const fake_xp_op *o, uint64_t seq,
                            xp_pend *p)
{
    uint32_t before = 0;
    p->gtasks = 0;
    p->gsig = 0;
    for (size_t j = 0; j < n; j++) {
        const fake_xp_op *x = &ops[j];
        if (x->q != o->q || x->rank != o->rank || x->kind == FAKE_XP_SEND ||
            x->kind == FAKE_XP_RECV)
            continue;
        before += x < o;
        p->gtasks++;
        uint64_t key = (uint64_t)x->kind << 40 |
                       (uint64_t)(uint32_t)(xk[x->kind].reduces ? x->nccl_op : -1) << 8 |
                       (uint64_t)(uint8_t)x->nccl_dtype;
        p->gsig += mix64(key) * (uint64_t)(x->count * ccq_dtype_size(x->dtype));
    }
    p->gseq = seq - before; /* the group's collectives of the rank take consecutive numbers */
}

ncclResult_t fake_xp_launch(const fake_xp_op *ops, size_t n, const void *const *streams,
                            size_t nstreams)
{
    long long deadline = now_ns() + timeout_ns();

    /* Stream order: a call reads what the calls before it on its stream wrote. */
    for (size_t i = 0; i < nstreams; i++) {
        for (const xp_pend *p = X.pend; p != NULL; p = p->next) {
            if (p->op.stream != streams[i] || p->failed)
                continue;
            if (!wait_while(p->op.q->h, stream_busy, streams[i], deadline)) {
                fprintf(stderr, "fake_cuda_nccl: a launch waited for its stream's "
                                "cross-process work past the fake's timeout\n");
                return ncclSystemError;
            }
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const fake_xp_op *o = &ops[i];
        fake_xp_clique *q = o->q;
        xp_pend *p = calloc(1, sizeof *p);
        if (p == NULL)
            abort();
        p->op = *o;
        p->ticket = ++X.tickets;
        p->deadline = deadline;
        if (o->kind == FAKE_XP_RECV)
            p->seq = q->r[o->rank].recvd[o->peer]++;
        else if (o->kind == FAKE_XP_SEND)
            p->seq = q->r[o->rank].sent[o->peer]++;
        else
            p->seq = q->r[o->rank].seq++;
        if (o->kind != FAKE_XP_SEND && o->kind != FAKE_XP_RECV)
            group_signature(ops, n, o, q->r[o->rank].seq - 1, p);
        if (q->h != NULL) { /* no lock: a launch never waits for a peer (shm_try) */
            __atomic_fetch_or(&q->h->launched, 1u << o->rank, __ATOMIC_ACQ_REL);
            shm_wake(q->h);
        }
        /* Appended, so progress visits the calls in launch order. */
        xp_pend **pp = &X.pend;
        while (*pp != NULL)
            pp = &(*pp)->next;
        *pp = p;
    }
    progress(); /* publishes the inputs */
    return ncclSuccess;
}

void fake_xp_event_record(const void *event, const void *stream)
{
    xp_event *e = X.events;
    while (e != NULL && e->event != event)
        e = e->next;
    if (e == NULL) {
        if ((e = calloc(1, sizeof *e)) == NULL)
            abort();
        e->event = event;
        e->next = X.events;
        X.events = e;
    }
    e->stream = stream;
    e->ticket = X.tickets;
}

uint64_t fake_xp_ticket(void)
{
    return X.tickets;
}

bool fake_xp_all_launched(const fake_xp_clique *q)
{
    uint32_t launched;
    if (q == NULL || q->h == NULL)
        return true;
    launched = __atomic_load_n(&q->h->launched, __ATOMIC_ACQUIRE);
    return launched == all_ranks(q->nranks);
}

long long fake_xp_now(void)
{
    return now_ns();
}

long long fake_xp_deadline(void)
{
    return now_ns() + timeout_ns();
}

bool fake_xp_stream_pending(const void *stream, uint64_t ticket)
{
    if (X.pend == NULL)
        return false;
    progress();
    for (const xp_pend *p = X.pend; p != NULL; p = p->next)
        if (p->op.stream == stream && p->ticket <= ticket)
            return true;
    return false;
}

bool fake_xp_event_pending(const void *event)
{
    const xp_event *e = X.events;
    while (e != NULL && e->event != event)
        e = e->next;
    return e != NULL && fake_xp_stream_pending(e->stream, e->ticket);
}

void fake_xp_leave(fake_xp_clique *q, int rank)
{
    if (!q->r[rank].in)
        return;
    drop_pending(q, rank);
    q->r[rank].in = q->r[rank].joining = false;
    if (--q->local == 0)
        close_segment(q);
}

void fake_xp_reset(void)
{
    for (fake_xp_clique *q = X.cliques, *n; q != NULL; q = n) {
        n = q->next;
        drop_pending(q, -1);
        close_segment(q);
        free(q);
    }
    for (xp_event *e = X.events, *n; e != NULL; e = n) {
        n = e->next;
        free(e);
    }
    memset(&X, 0, sizeof X);
    atomic_store(&xp_timeout, -1);
}

/* ---- Test controls (fake_cuda_nccl.h) ---- */

void fake_set_xproc_timeout_ms(long ms)
{
    atomic_store(&xp_timeout, ms < 0 ? -1 : ms);
}

/* A control segment no live process is in: every registered process exited, or nobody
 * registered for a long time. */
static bool segment_stale(const char *name)
{
    int fd = shm_open(name, O_RDONLY, 0);
    struct stat st;
    bool stale = false;
    if (fd < 0)
        return false;
    if (fstat(fd, &st) == 0) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        bool old = (long long)(now.tv_sec - st.st_mtim.tv_sec) * 1000000000ll > XP_STALE_NS;
        xp_shm *h = (size_t)st.st_size == sizeof *h
                        ? mmap(NULL, sizeof *h, PROT_READ, MAP_SHARED, fd, 0)
                        : MAP_FAILED;
        if (h == MAP_FAILED) {
            stale = old;
        } else {
            int registered = 0, live = 0;
            for (int k = 0; k < FAKE_XP_MAX_RANKS; k++) {
                registered += h->pid[k] != 0;
                live += alive(h->pid[k]);
            }
            stale = registered > 0 ? live == 0 : old;
            munmap(h, sizeof *h);
        }
    }
    close(fd);
    return stale;
}

int fake_xproc_cleanup(void)
{
    char suffix[32], name[300];
    int n = 0;
    DIR *d = opendir("/dev/shm");
    snprintf(suffix, sizeof suffix, "-%u", (unsigned)getuid());
    if (d == NULL)
        return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t len = strlen(e->d_name), sl = strlen(suffix);
        /* control segments: "ccqfake-<16 hex>-<uid>" */
        if (strncmp(e->d_name, "ccqfake-", 8) != 0 || len != 8 + 16 + sl ||
            strcmp(e->d_name + len - sl, suffix) != 0)
            continue;
        snprintf(name, sizeof name, "/%s", e->d_name);
        if (segment_stale(name))
            n += unlink_prefix(name, true);
    }
    closedir(d);
    return n;
}

size_t fake_xproc_files(const ncclUniqueId *id)
{
    char name[64], path[300];
    struct stat st;
    DIR *d = opendir("/dev/shm");
    size_t n = 0, len;
    snprintf(name, sizeof name, "ccqfake-%016" PRIx64 "-%u", id_hash(id), (unsigned)getuid());
    len = strlen(name);
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    if (d == NULL)
        return stat(path, &st) == 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n +=
            strncmp(e->d_name, name, len) == 0 && (e->d_name[len] == '\0' || e->d_name[len] == '-');
    closedir(d);
    return n;
}
