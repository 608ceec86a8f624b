/* The CUDA + NCCL backend: one NCCL communicator per local device of a set, one
 * ncclGroupStart/ncclGroupEnd per batch, stream ordering through CUDA events, completion
 * and asynchronous errors polled from the scheduler thread. The only file in ccq that
 * includes CUDA or NCCL headers. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pthread.h>

#include <cuda.h> /* driver types only: entry points come from cudaGetDriverEntryPointByVersion */
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "backends/backend.h"
#include "backends/fuse.h"
#include "common/thread_name.h"
#include "queue/mpsc.h"
#include "queue/wake.h"

/* ncclAlltoAll, ncclGather and ncclScatter appeared in NCCL 2.28: built against older
 * headers, ccq refuses those three collectives instead of calling them. */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#define NCCL_HAS_228_COLLECTIVES 1
#else
#define NCCL_HAS_228_COLLECTIVES 0
#endif
/* ncclFloat8e4m3 and ncclFloat8e5m2 appeared in NCCL 2.24: older headers build without fp8
 * (refused at submission). */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
#define NCCL_HAS_FP8 1
#else
#define NCCL_HAS_FP8 0
#endif
/* ncclCommRevoke and ncclCommShrink (fault tolerance) appeared in NCCL 2.28: with older
 * headers, or an older library at run time, a communicator that lost a member process is
 * aborted and the survivors' communicator is a fresh init. */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#define NCCL_HAS_SHRINK 1
#else
#define NCCL_HAS_SHRINK 0
#endif

/* How long a failed batch waits for the GPU to drain its work (and for its communicators'
 * aborts to finish) when timeout_ms is 0; otherwise timeout_ms. */
#define NCCL_DRAIN_MAX_NS (60ull * 1000000000u)
/* The scheduler polls completions at this interval while batches are in flight. */
#define NCCL_POLL_INTERVAL_NS 20000u
/* Communicator creation gives up after this long (it also honours timeout_ms). */
#define NCCL_INIT_TIMEOUT_NS (120ull * 1000000000ull)

/* Map NCCL and CUDA results to ccq once, keeping their own message in the detail. */
#define NCCL_CHECK_GOTO(call, err, st, label)                                                      \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess && r_ != ncclInProgress) {                                           \
            (st) = nccl_status(r_);                                                                \
            nccl_msg((err), #call, r_, NULL);                                                      \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#define CUDA_CHECK_GOTO(call, err, st, label)                                                      \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            (st) = CCQ_ERR_BACKEND;                                                                \
            snprintf((err)->msg, sizeof(err)->msg, "%s: %s (%s)", #call, cudaGetErrorString(e_),   \
                     cudaGetErrorName(e_));                                                        \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

typedef struct nccl_comm {
    uint32_t n; /* local ranks: first .. first + n - 1 of nranks */
    uint32_t first, nranks;
    int *devs;                    /* CUDA device of each local rank */
    ncclComm_t *comms;            /* one per local rank */
    bool aborted;                 /* scheduler only: set when the abort is queued; from then on the
                                     scheduler makes no NCCL call on this communicator */
    _Atomic bool abort_done;      /* the abort thread finished ncclCommAbort of every rank (or,
                                     revoked, ncclCommRevoke and its quiescence) */
    struct nccl_comm *abort_next; /* the abort thread's queue (under abort_lock) */
    uint64_t init_deadline;       /* ncclCommInitRankConfig must have finished by then */
    uint64_t fusion_bytes;        /* ccq_fuse_threshold: 0 when it spans processes (see "Fusion") */
    int min_cc; /* lowest compute capability major of every rank, member processes included
                   (exchanged when they met): NCCL's fp8 reduction check (comm->minCompCap) */
    /* A member process was lost (the runtime's revoke): ncclCommRevoke instead of abort, so
     * it can be the parent of the survivors' communicator (ncclCommShrink). */
    bool revoked;
    _Atomic bool revoke_failed; /* ncclCommRevoke failed or never went quiescent: aborted */
    /* A communicator made by shrinking `parent` (nccl_comm_shrink): the shrink starts once the
     * parent's revoke is done (shrink_pending until then). */
    struct nccl_comm *parent;
    int *exclude;
    int nexclude;
    bool shrink_pending;
} nccl_comm;

/* Per ccq stream. `user` and `slot_events` are written by bind (a user thread, while the
 * stream is idle) and read by submit hooks and the scheduler; the rest is scheduler-only,
 * except `done` which the fence hook reads (CUDA calls on it are thread-safe). */
typedef struct nccl_stream {
    _Atomic(cudaStream_t) user;
    cudaEvent_t *slot_events; /* [ring_size]: submission events, created at bind */
    cudaStream_t comm;        /* where NCCL runs this stream's work; created on first use */
    cudaEvent_t done;         /* recorded after each batch on `comm` */
    cudaEvent_t join; /* orders `comm` with another stream's (a fused op's parts, "Fusion") */
    _Atomic uint32_t done_recorded;
    _Atomic uint64_t done_upto; /* the stream_done of the last batch whose `done` is recorded */
    uint64_t batch_mark;        /* scheduler scratch: last batch that listed this stream */
    /* GPU-side waits (see "GPU-side waits" below). */
    _Atomic uint32_t waited; /* a ccq_nccl_stream_wait was queued: keep its counter */
    uint64_t floor;          /* scheduler: the highest value the host wrote to the counter */
    bool repair;             /* scheduler: a GPU write older than `floor` may still run */
} nccl_stream;

/* GPU-side waits: driver entry points and the counters, set up on first use. */
typedef struct nccl_memops {
    pthread_mutex_t lock; /* first-use setup (user threads) */
    _Atomic int state;    /* 0: not tried, 1: ready, -1: unsupported (why) */
    char why[CCQ_DETAIL_LEN / 2];
    PFN_cuStreamWaitValue64_v11070 wait;
    PFN_cuStreamWriteValue64_v11070 write;
    int8_t *dev_ok;                /* [ndev]: 64-bit stream memory operations supported */
    _Atomic uint64_t *_Atomic ctr; /* [ndev * max_streams], mapped pinned host memory */
    CUdeviceptr dctr;              /* the same memory, as the GPU addresses it */
    uint32_t nrepair;              /* scheduler: streams with `repair` set */
} nccl_memops;

/* A batch's launch: ENQUEUING from ncclGroupStart until every communicator left
 * ncclInProgress and the completion events are recorded, then RUNNING; WAITING before its
 * group, while an earlier launch on a device it uses is in progress (launch_blocker);
 * REFUSED: ended without a group (its ops carry why). */
enum { NB_ENQUEUING, NB_RUNNING, NB_WAITING, NB_REFUSED };

/* Per-batch state, in be_priv. */
typedef struct nccl_batch {
    ccq_be_batch *b;
    struct nccl_batch *next; /* h->inflight, in issue order */
    int state;
    bool failed;             /* batch_fail ran: now only waiting for the GPU to drain */
    uint64_t drain_deadline; /* when a failed batch is returned even if not drained */
    uint32_t nstreams, ncomms;
    uint32_t *streams;     /* stream indices used */
    uint64_t *stream_done; /* [nstreams]: the parts' stream_done (GPU-side wait counters) */
    nccl_comm **comms;     /* distinct communicators used */
    /* Fusion ("Fusion" below): its fused groups, and the device scratch they pack into. */
    struct nccl_fgroup *groups;
    uint32_t ngroups;
    bool unpacked; /* the groups' copies out were queued (after the launch) */
    struct nccl_scratch *scratch;
} nccl_batch;

/* The calling thread's current CUDA context, kept to be put back after the backend made a
 * device current on a user thread (see ctx_save). */
typedef struct ctx_saved {
    CUcontext ctx;
    int dev;   /* fallback without the driver's entry points: cudaGetDevice's */
    bool have; /* ctx is valid */
} ctx_saved;

typedef struct nccl_be {
    ccq_backend base;
    ccq_be_hooks hooks;
    int ndev;
    int *cc_major;
    /* cuCtxGetCurrent/cuCtxSetCurrent (driver entry points, resolved at create). */
    PFN_cuCtxGetCurrent_v4000 ctx_get;
    PFN_cuCtxSetCurrent_v4000 ctx_set;
    bool high_priority; /* ccq_config.nccl_high_priority */
    int connections;    /* CUDA_DEVICE_MAX_CONNECTIONS (CUDA's default 8): hardware queues */
    int *prio;          /* [ndev]: the device's greatest stream priority (high_priority) */
    int version;        /* ncclGetVersion(): all_to_all, gather and scatter need 2.28 */
    uint32_t max_streams, ring_size;
    uint64_t timeout_ns;  /* communicator creation and launch waits */
    uint64_t drain_ns;    /* how long a failed batch waits for the GPU (see batch_drained) */
    nccl_stream *streams; /* [ndev * max_streams] */
    nccl_batch *inflight; /* scheduler only: issued and not returned, in issue order */
    nccl_batch *inflight_tail;
    uint64_t batch_mark;
    nccl_memops mo;
    /* The abort thread (see abort_main): aborts queued by the scheduler. */
    pthread_t abort_thread;
    bool abort_thread_started;
    pthread_mutex_t abort_lock;
    pthread_cond_t abort_cond;
    nccl_comm *abort_head, *abort_tail; /* under abort_lock */
    bool abort_stop;                    /* under abort_lock */
    /* Fusion, scheduler thread only: opted in (CCQ_NCCL_FUSION=1), and device scratch
     * buffers free for reuse. */
    bool fusion;
    struct nccl_scratch *scratch_free;
} nccl_be;

static nccl_be *to_nccl(ccq_backend *be)
{
    return ccq_container_of(be, nccl_be, base);
}

/* GPU-side waits (defined with ccq_nccl_stream_wait's hook below). */
static void memops_init(nccl_be *h);
static void scratch_fini(nccl_be *h);
static void memops_fini(nccl_be *h);
static ccq_status counter_write_after(nccl_be *h, uint32_t stream_index, uint64_t value,
                                      ccq_errbuf *err);
static void counters_repair(nccl_be *h);

static ccq_status nccl_status(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess:
    case ncclInProgress:
        return CCQ_OK;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
        return CCQ_ERR_INVALID_ARGUMENT;
    default:
        return CCQ_ERR_BACKEND;
    }
}

/* "what: NCCL error 'unhandled cuda error' (1): <ncclGetLastError>". */
static void nccl_msg(ccq_errbuf *err, const char *what, ncclResult_t r, ncclComm_t comm)
{
    const char *last = ncclGetLastError(comm);
    snprintf(err->msg, sizeof err->msg, "%s: NCCL error '%s' (%d)%s%s", what, ncclGetErrorString(r),
             (int)r, last && *last ? ": " : "", last ? last : "");
}

static const ncclDataType_t dtype_map[CCQ_DTYPE_COUNT_] = {
    [CCQ_INT8] = ncclInt8,
    [CCQ_UINT8] = ncclUint8,
    [CCQ_INT32] = ncclInt32,
    [CCQ_UINT32] = ncclUint32,
    [CCQ_INT64] = ncclInt64,
    [CCQ_UINT64] = ncclUint64,
    [CCQ_FLOAT16] = ncclFloat16,
    [CCQ_FLOAT32] = ncclFloat32,
    [CCQ_FLOAT64] = ncclFloat64,
    [CCQ_BFLOAT16] = ncclBfloat16,
#if NCCL_HAS_FP8
    [CCQ_FLOAT8E4M3] = ncclFloat8e4m3,
    [CCQ_FLOAT8E5M2] = ncclFloat8e5m2,
#endif
};

static const ncclRedOp_t op_map[CCQ_REDUCE_OP_COUNT_] = {
    [CCQ_SUM] = ncclSum, [CCQ_PROD] = ncclProd, [CCQ_MAX] = ncclMax,
    [CCQ_MIN] = ncclMin, [CCQ_AVG] = ncclAvg,
};

static void sleep_ns(long ns)
{
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/*
 * A user thread's current CUDA context, saved before the backend makes one of its devices
 * current and put back afterwards. cudaGetDevice + cudaSetDevice would not do: on a thread
 * that had no context, cudaGetDevice says 0 and cudaSetDevice(0) then creates device 0's
 * primary context and leaves it current; on a thread whose current context is not a
 * primary one (cuCtxCreate, a green context), cudaSetDevice replaces it with the device's
 * primary context. cuCtxSetCurrent(saved) restores exactly what was there, NULL included.
 */
static void ctx_save(const nccl_be *h, ctx_saved *s)
{
    s->have = h->ctx_get != NULL && h->ctx_get(&s->ctx) == CUDA_SUCCESS;
    s->dev = -1;
    if (!s->have && cudaGetDevice(&s->dev) != cudaSuccess)
        s->dev = -1;
}

static void ctx_restore(const nccl_be *h, const ctx_saved *s)
{
    if (s->have)
        (void)h->ctx_set(s->ctx);
    else if (s->dev >= 0)
        (void)cudaSetDevice(s->dev);
}

/* ------------------------------------------------------------------------------------ */
/* Aborts, off the scheduler thread                                                      */
/* ------------------------------------------------------------------------------------ */

static ncclResult_t wait_comms(ncclComm_t *comms, uint32_t n, uint64_t timeout_ns,
                               ncclComm_t *failed);
static ccq_status shrink_start(nccl_be *h, nccl_comm *c, ccq_errbuf *err);

static void comm_free(nccl_comm *c)
{
    free(c->devs);
    free(c->comms);
    free(c->exclude);
    free(c);
}

/* Revoke every rank, then wait (bounded) until NCCL says it is quiescent; on failure abort
 * it instead (it then cannot be shrunk). Abort thread. */
static void revoke_ranks(nccl_be *h, nccl_comm *c)
{
#if NCCL_HAS_SHRINK
    bool ok = true;
    for (uint32_t i = 0; i < c->n && ok; i++)
        ok = c->comms[i] == NULL || ncclCommRevoke(c->comms[i], NCCL_REVOKE_DEFAULT) == ncclSuccess;
    if (ok) {
        ncclComm_t failed = NULL;
        ok = wait_comms(c->comms, c->n, h->timeout_ns, &failed) == ncclSuccess;
    }
    if (ok)
        return;
    atomic_store_explicit(&c->revoke_failed, true, memory_order_release);
#else
    (void)h;
#endif
    for (uint32_t i = 0; i < c->n; i++)
        if (c->comms[i] != NULL)
            ncclCommAbort(c->comms[i]);
}

/*
 * ncclCommAbort does not return at once: the abort of a multi-rank communicator's last
 * rank reclaims it (init.cc: commReclaim -> commDestroySync), which synchronizes NCCL's
 * internal stream and so waits for kernels that may themselves wait behind a bound user
 * stream. On the scheduler thread that would stop every other communicator. So the
 * scheduler only marks a communicator aborted (and from then on makes no NCCL call on it:
 * NCCL allows ncclCommAbort from another thread as long as nothing else runs on that
 * communicator) and queues it here; this thread aborts every rank, sets abort_done and
 * wakes the scheduler, which returns the communicator's failed batches once that is done
 * and their streams drained (batch_drained).
 */
static void *abort_main(void *arg)
{
    nccl_be *h = arg;

    ccq_thread_name("ccq-nccl-abort");
    pthread_mutex_lock(&h->abort_lock);
    for (;;) {
        nccl_comm *c = h->abort_head;
        if (c == NULL) {
            if (h->abort_stop)
                break;
            pthread_cond_wait(&h->abort_cond, &h->abort_lock);
            continue;
        }
        h->abort_head = c->abort_next;
        if (h->abort_head == NULL)
            h->abort_tail = NULL;
        pthread_mutex_unlock(&h->abort_lock);
        if (c->revoked) {
            revoke_ranks(h, c);
        } else {
            for (uint32_t i = 0; i < c->n; i++)
                if (c->comms[i] != NULL)
                    ncclCommAbort(c->comms[i]);
        }
        atomic_store_explicit(&c->abort_done, true, memory_order_release);
        if (h->hooks.notify != NULL)
            h->hooks.notify(h->hooks.notify_arg);
        pthread_mutex_lock(&h->abort_lock);
    }
    pthread_mutex_unlock(&h->abort_lock);
    return NULL;
}

/* Scheduler thread: mark c aborted and hand it to the abort thread. */
static void abort_comm(nccl_be *h, nccl_comm *c)
{
    if (c->aborted)
        return;
    c->aborted = true;
    c->abort_next = NULL;
    pthread_mutex_lock(&h->abort_lock);
    if (h->abort_tail != NULL)
        h->abort_tail->abort_next = c;
    else
        h->abort_head = c;
    h->abort_tail = c;
    pthread_cond_signal(&h->abort_cond);
    pthread_mutex_unlock(&h->abort_lock);
}

/* ------------------------------------------------------------------------------------ */
/* Lifetime                                                                              */
/* ------------------------------------------------------------------------------------ */

static void free_stream_events(nccl_be *h, nccl_stream *s, int dev)
{
    if (s->slot_events == NULL)
        return;
    cudaSetDevice(dev);
    for (uint32_t i = 0; i < h->ring_size; i++)
        if (s->slot_events[i] != NULL)
            cudaEventDestroy(s->slot_events[i]);
    free(s->slot_events);
    s->slot_events = NULL;
}

/* On the thread calling ccq_runtime_destroy: its current device is restored at the end. */
static void nccl_destroy(ccq_backend *be)
{
    nccl_be *h = to_nccl(be);
    uint32_t nstreams = (uint32_t)h->ndev * h->max_streams;
    ctx_saved prev;

    if (h->abort_thread_started) {
        /* Every comm_destroy waited for its abort: the queue is empty. */
        pthread_mutex_lock(&h->abort_lock);
        h->abort_stop = true;
        pthread_cond_signal(&h->abort_cond);
        pthread_mutex_unlock(&h->abort_lock);
        pthread_join(h->abort_thread, NULL);
    }
    pthread_cond_destroy(&h->abort_cond);
    pthread_mutex_destroy(&h->abort_lock);
    ctx_save(h, &prev);
    memops_fini(h);

    for (uint32_t i = 0; h->streams != NULL && i < nstreams; i++) {
        nccl_stream *s = &h->streams[i];
        int dev = (int)(i / h->max_streams);
        /* A stream never used or bound holds nothing: making its device current would
         * create that device's primary context (memory, time; an error on an
         * exclusive-process GPU in use). */
        if (s->slot_events == NULL && s->done == NULL && s->comm == NULL)
            continue;
        free_stream_events(h, s, dev);
        cudaSetDevice(dev);
        if (s->done != NULL)
            cudaEventDestroy(s->done);
        if (s->join != NULL)
            cudaEventDestroy(s->join);
        if (s->comm != NULL)
            cudaStreamDestroy(s->comm);
    }
    scratch_fini(h);
    ctx_restore(h, &prev);
    free(h->streams);
    free(h->cc_major);
    free(h->prio);
    free(h);
}

static ccq_status nccl_create(const ccq_config *cfg, const ccq_be_hooks *hooks, ccq_backend **out,
                              ccq_errbuf *err)
{
    nccl_be *h;
    int ndev = 0, version = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);

    if (ce != cudaSuccess || ndev <= 0) {
        snprintf(err->msg, sizeof err->msg,
                 "no usable CUDA device: cudaGetDeviceCount: %s (%s); use backend \"host\"",
                 ce == cudaSuccess ? "0 devices" : cudaGetErrorString(ce),
                 ce == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(ce));
        return CCQ_ERR_UNSUPPORTED;
    }
    if (ncclGetVersion(&version) != ncclSuccess || version < NCCL_VERSION(2, 19, 0)) {
        snprintf(err->msg, sizeof err->msg, "NCCL %d is too old: ccq needs NCCL >= 2.19", version);
        return CCQ_ERR_UNSUPPORTED;
    }
    h = calloc(1, sizeof *h);
    if (h == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    h->base.ops = &ccq_nccl_backend_ops;
    memops_init(h);
    {
        /* cuCtxGetCurrent/cuCtxSetCurrent exist in every driver (CUDA 4.0); without them
         * (an odd runtime), ctx_save falls back to the current device. */
        enum cudaDriverEntryPointQueryResult q;
        void *get = NULL, *set = NULL;
        if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 4000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess &&
            cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 4000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess && get != NULL && set != NULL) {
            h->ctx_get = (PFN_cuCtxGetCurrent_v4000)get;
            h->ctx_set = (PFN_cuCtxSetCurrent_v4000)set;
        }
    }
    h->high_priority = cfg->nccl_high_priority != 0;
    {
        const char *env = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
        long n = env != NULL && *env != '\0' ? strtol(env, NULL, 10) : 8;
        h->connections = n < 1 ? 1 : n > 32 ? 32 : (int)n;
    }
    h->hooks = *hooks;
    h->ndev = ndev;
    h->version = version;
    h->max_streams = cfg->max_streams;
    h->ring_size = ccq_ring_size(cfg->queue_depth);
    h->timeout_ns = cfg->timeout_ms ? cfg->timeout_ms * 1000000ull : NCCL_INIT_TIMEOUT_NS;
    h->drain_ns = cfg->timeout_ms ? cfg->timeout_ms * 1000000ull : NCCL_DRAIN_MAX_NS;
    {
        const char *f = getenv("CCQ_NCCL_FUSION"); /* opt-in: see "Fusion" */
        h->fusion = f != NULL && strcmp(f, "1") == 0;
    }
    pthread_mutex_init(&h->abort_lock, NULL);
    pthread_cond_init(&h->abort_cond, NULL);
    h->cc_major = calloc((size_t)ndev, sizeof *h->cc_major);
    h->prio = calloc((size_t)ndev, sizeof *h->prio);
    h->streams = calloc((size_t)ndev * h->max_streams, sizeof *h->streams);
    if (h->cc_major == NULL || h->prio == NULL || h->streams == NULL) {
        nccl_destroy(&h->base);
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    if (pthread_create(&h->abort_thread, NULL, abort_main, h) != 0) {
        nccl_destroy(&h->base);
        snprintf(err->msg, sizeof err->msg, "cannot start the NCCL abort thread");
        return CCQ_ERR_NO_MEMORY;
    }
    h->abort_thread_started = true;
    for (int d = 0; d < ndev; d++) {
        if (cudaDeviceGetAttribute(&h->cc_major[d], cudaDevAttrComputeCapabilityMajor, d) !=
            cudaSuccess)
            h->cc_major[d] = 0;
    }
    for (uint32_t i = 0; i < (uint32_t)ndev * h->max_streams; i++)
        atomic_init(&h->streams[i].user, NULL);
    for (int d = 0; d < ndev; d++)
        h->prio[d] = INT_MIN; /* not asked yet (stream_ready) */
    *out = &h->base;
    return CCQ_OK;
}

static uint32_t nccl_device_count(const ccq_backend *be)
{
    return (uint32_t)ccq_container_of(be, const nccl_be, base)->ndev;
}

/* ------------------------------------------------------------------------------------ */
/* Communicators                                                                         */
/* ------------------------------------------------------------------------------------ */

/* Wait (polling) until no communicator of the set is ncclInProgress; the first error wins.
 * Abort thread only (a revoke's quiescence): the scheduler never waits for NCCL. */
static ncclResult_t wait_comms(ncclComm_t *comms, uint32_t n, uint64_t timeout_ns,
                               ncclComm_t *failed)
{
    uint64_t deadline = ccq_deadline_in(timeout_ns);
    for (;;) {
        bool pending = false;
        for (uint32_t i = 0; i < n; i++) {
            ncclResult_t st = ncclInProgress;
            if (comms[i] == NULL)
                continue;
            ncclResult_t r = ncclCommGetAsyncError(comms[i], &st);
            if (r != ncclSuccess) {
                *failed = comms[i];
                return r;
            }
            if (st == ncclInProgress)
                pending = true;
            else if (st != ncclSuccess) {
                *failed = comms[i];
                return st;
            }
        }
        if (!pending)
            return ncclSuccess;
        if (ccq_now_ns() >= deadline) {
            *failed = NULL;
            return ncclInProgress;
        }
        sleep_ns(100000);
    }
}

/* A communicator spanning processes: the lowest member process makes the unique id that
 * every member passes to ncclCommInitRankConfig (the runtime shares it). */
static ccq_status nccl_comm_root_blob(ccq_backend *be, const ccq_be_comm_desc *d, void *blob,
                                      size_t *len, ccq_errbuf *err)
{
    ccq_status st = CCQ_OK;
    (void)be;
    (void)d;
    if (*len < sizeof(ncclUniqueId)) {
        snprintf(err->msg, sizeof err->msg, "no room for an ncclUniqueId");
        return CCQ_ERR_NO_MEMORY;
    }
    NCCL_CHECK_GOTO(ncclGetUniqueId((ncclUniqueId *)blob), err, st, fail);
    *len = sizeof(ncclUniqueId);
    return CCQ_OK;
fail:
    return st == CCQ_OK ? CCQ_ERR_BACKEND : st;
}

/* The lowest compute capability major of devs[0..n). */
static int min_cc_of(const nccl_be *h, const ccq_device_id *devs, uint32_t n)
{
    int low = INT_MAX;
    for (uint32_t i = 0; i < n; i++)
        if (devs[i] < (ccq_device_id)h->ndev && h->cc_major[devs[i]] < low)
            low = h->cc_major[devs[i]];
    return low;
}

/* Every member process tells the others the lowest compute capability of its devices in
 * the communicator: NCCL refuses an fp8 reduction when the lowest over *all* ranks is below
 * 9.0 (init.cc computes comm->minCompCap from every peer; enqueue.cc's taskAppend checks
 * it), so submission can refuse it in every process alike instead of failing inside a
 * group and aborting the communicator. */
static ccq_status nccl_comm_member_blob(ccq_backend *be, const ccq_be_comm_desc *d,
                                        ccq_be_member_blob *blob, ccq_errbuf *err)
{
    int32_t low = min_cc_of(to_nccl(be), d->local_devices, d->nlocal);
    (void)err;
    memcpy(blob->bytes, &low, sizeof low);
    blob->len = sizeof low;
    return CCQ_OK;
}

/* c->min_cc: the lowest compute capability of its devices and of every member process's
 * (d->member_blobs, from the meeting). */
static ccq_status comm_min_cc(const nccl_be *h, nccl_comm *c, const ccq_be_comm_desc *d,
                              ccq_errbuf *err)
{
    c->min_cc = min_cc_of(h, d->local_devices, d->nlocal);
    for (uint32_t p = 0; d->member_blobs != NULL && p < d->nprocs; p++) {
        int32_t low;
        if (d->member_blobs[p].len != sizeof low) {
            snprintf(err->msg, sizeof err->msg,
                     "member process %" PRIu32 " sent no compute capability (a ccq without it?)",
                     d->procs[p]);
            return CCQ_ERR_INVALID_ARGUMENT;
        }
        memcpy(&low, d->member_blobs[p].bytes, sizeof low);
        if (low < c->min_cc)
            c->min_cc = low;
    }
    return CCQ_OK;
}

/* One non-blocking group of ncclCommInitRankConfig, one per local rank (global ranks
 * first_rank + i of nranks); nccl_comm_test polls it, so the scheduler never waits here. */
static ccq_status nccl_comm_create(ccq_backend *be, const ccq_be_comm_desc *d, ccq_be_comm **out,
                                   ccq_errbuf *err)
{
    nccl_be *h = to_nccl(be);
    nccl_comm *c = calloc(1, sizeof *c);
    uint32_t n = d->nlocal;
    ncclUniqueId id;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ccq_status st = CCQ_OK;
    bool group_open = false;

    if (c == NULL || (c->devs = calloc(n, sizeof *c->devs)) == NULL ||
        (c->comms = calloc(n, sizeof *c->comms)) == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        if (c != NULL)
            comm_free(c);
        return CCQ_ERR_NO_MEMORY;
    }
    c->n = n;
    c->first = d->first_rank;
    c->nranks = d->nranks;
    c->fusion_bytes = ccq_fuse_threshold(d, ccq_nccl_backend_ops.span_group_limit, false);
    for (uint32_t i = 0; i < n; i++)
        c->devs[i] = (int)d->local_devices[i];
    st = comm_min_cc(h, c, d, err);
    if (st != CCQ_OK) {
        comm_free(c);
        return st;
    }
    config.blocking = 0; /* so a hung peer can never block the scheduler */

    if (d->nprocs > 1) {
        if (d->root_blob == NULL || d->root_blob_len != sizeof id) {
            st = CCQ_ERR_INVALID_ARGUMENT;
            snprintf(err->msg, sizeof err->msg, "no ncclUniqueId from the lowest member process");
            goto fail;
        }
        memcpy(&id, d->root_blob, sizeof id);
    } else {
        NCCL_CHECK_GOTO(ncclGetUniqueId(&id), err, st, fail);
    }
    NCCL_CHECK_GOTO(ncclGroupStart(), err, st, fail);
    group_open = true;
    for (uint32_t i = 0; i < n; i++) {
        CUDA_CHECK_GOTO(cudaSetDevice(c->devs[i]), err, st, fail);
        NCCL_CHECK_GOTO(ncclCommInitRankConfig(&c->comms[i], (int)d->nranks, id,
                                               (int)(d->first_rank + i), &config),
                        err, st, fail);
    }
    group_open = false;
    NCCL_CHECK_GOTO(ncclGroupEnd(), err, st, fail);
    c->init_deadline = ccq_deadline_in(h->timeout_ns);
    *out = (ccq_be_comm *)c;
    return CCQ_IN_PROGRESS;

fail:
    if (group_open)
        ncclGroupEnd();
    /* Here, not on the abort thread: no work was ever queued on these communicators, so
     * their reclaim has no kernel to wait for. */
    for (uint32_t i = 0; i < n; i++)
        if (c->comms[i] != NULL)
            ncclCommAbort(c->comms[i]);
    comm_free(c);
    return st == CCQ_OK ? CCQ_ERR_BACKEND : st;
}

/* Has every local rank's ncclCommInitRankConfig finished? A failed or overdue one aborts
 * them all (the runtime then forgets the communicator). */
static ccq_status nccl_comm_test(ccq_backend *be, ccq_be_comm *comm, ccq_errbuf *err)
{
    nccl_comm *c = (nccl_comm *)comm;
    ccq_status st;
    bool pending = false;

    if (c->shrink_pending) { /* a shrink waiting for its parent's revoke */
        if (!atomic_load_explicit(&c->parent->abort_done, memory_order_acquire)) {
            if (ccq_now_ns() < c->init_deadline)
                return CCQ_IN_PROGRESS;
            snprintf(err->msg, sizeof err->msg,
                     "the parent's ncclCommRevoke did not finish within timeout_ms");
            c->aborted = true;
            atomic_store_explicit(&c->abort_done, true, memory_order_release);
            return CCQ_ERR_TIMEOUT;
        }
        st = shrink_start(to_nccl(be), c, err);
        if (st != CCQ_IN_PROGRESS) {
            c->aborted = true;
            atomic_store_explicit(&c->abort_done, true, memory_order_release);
            return st;
        }
    }
    /* Ask every rank each round (a rank still initialising does not hide another's error). */
    for (uint32_t i = 0; i < c->n; i++) {
        ncclResult_t state = ncclInProgress, r = ncclCommGetAsyncError(c->comms[i], &state);
        if (r != ncclSuccess)
            state = r;
        if (state == ncclInProgress) {
            pending = true;
        } else if (state != ncclSuccess) {
            st = nccl_status(state);
            nccl_msg(err, "ncclCommInitRankConfig", state, c->comms[i]);
            goto fail;
        }
    }
    if (!pending)
        return CCQ_OK;
    if (ccq_now_ns() < c->init_deadline)
        return CCQ_IN_PROGRESS;
    snprintf(err->msg, sizeof err->msg, "ncclCommInitRankConfig did not finish within timeout_ms");
    st = CCQ_ERR_TIMEOUT;
fail:
    /* Here, not on the abort thread: no work was ever queued on these communicators. The
     * runtime then destroys it (nccl_comm_destroy frees an aborted one). */
    for (uint32_t i = 0; i < c->n; i++)
        if (c->comms[i] != NULL)
            ncclCommAbort(c->comms[i]);
    c->aborted = true;
    atomic_store_explicit(&c->abort_done, true, memory_order_release);
    return st == CCQ_OK ? CCQ_ERR_BACKEND : st;
}

/*
 * At ccq_runtime_destroy, on its thread, after the scheduler stopped. An aborted
 * communicator is freed once the abort thread is done with it. Otherwise, if any rank is in
 * error or still ncclInProgress, every rank is aborted: ncclCommDestroy of a healthy rank
 * waits for its work, which may wait forever for a peer in error (and ncclCommDestroy of a
 * rank in error is refused and leaks).
 */
static void nccl_comm_destroy(ccq_backend *be, ccq_be_comm *comm)
{
    nccl_comm *c = (nccl_comm *)comm;
    bool abort_all = false;
    (void)be;
    if (c->aborted) {
        while (!atomic_load_explicit(&c->abort_done, memory_order_acquire))
            sleep_ns(100000);
        /* A revoked communicator is quiescent but alive (a shrink's parent): its end is an
         * abort (a member process is gone, so no destroy that could wait for it). */
        for (uint32_t i = 0; c->revoked && !atomic_load(&c->revoke_failed) && i < c->n; i++)
            if (c->comms[i] != NULL)
                ncclCommAbort(c->comms[i]);
        comm_free(c);
        return;
    }
    for (uint32_t i = 0; i < c->n && !abort_all; i++) {
        ncclResult_t st = ncclSuccess;
        if (c->comms[i] != NULL &&
            (ncclCommGetAsyncError(c->comms[i], &st) != ncclSuccess || st != ncclSuccess))
            abort_all = true;
    }
    for (uint32_t i = 0; i < c->n; i++) {
        if (c->comms[i] == NULL)
            continue;
        if (abort_all)
            ncclCommAbort(c->comms[i]);
        else
            ncclCommDestroy(c->comms[i]);
    }
    comm_free(c);
}

static void nccl_abort(ccq_backend *be, ccq_be_comm *comm)
{
    abort_comm(to_nccl(be), (nccl_comm *)comm);
}

/* A member process was lost: with NCCL >= 2.28 (headers and library), ncclCommRevoke on the
 * abort thread instead of ncclCommAbort (issued work stops and comes back failed the same
 * way), so the survivors can shrink it; else an abort. */
static void nccl_revoke(ccq_backend *be, ccq_be_comm *comm)
{
    nccl_be *h = to_nccl(be);
    nccl_comm *c = (nccl_comm *)comm;
    if (!c->aborted && NCCL_HAS_SHRINK && h->version >= NCCL_VERSION(2, 28, 0))
        c->revoked = true;
    abort_comm(h, c);
}

/* Whether the survivors can make their communicator by shrinking this one: it was revoked
 * (decided at the revoke, the same way in every survivor). */
static bool nccl_comm_shrinkable(ccq_backend *be, ccq_be_comm *comm)
{
    (void)be;
    return ((nccl_comm *)comm)->revoked;
}

/* The shrink itself, once the parent is quiescent: one group of ncclCommShrink, one per local
 * rank (this process's ranks of the parent are all in the new communicator, in order). */
static ccq_status shrink_start(nccl_be *h, nccl_comm *c, ccq_errbuf *err)
{
#if NCCL_HAS_SHRINK
    nccl_comm *p = c->parent;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ccq_status st = CCQ_OK;
    bool group_open = false;

    c->shrink_pending = false;
    if (atomic_load_explicit(&p->revoke_failed, memory_order_acquire)) {
        snprintf(err->msg, sizeof err->msg,
                 "the parent communicator could not be revoked (ncclCommRevoke failed or did not "
                 "go quiescent within timeout_ms), so it cannot be shrunk");
        return CCQ_ERR_BACKEND;
    }
    config.blocking = 0;
    NCCL_CHECK_GOTO(ncclGroupStart(), err, st, fail);
    group_open = true;
    for (uint32_t i = 0; i < c->n; i++) {
        CUDA_CHECK_GOTO(cudaSetDevice(c->devs[i]), err, st, fail);
        NCCL_CHECK_GOTO(ncclCommShrink(p->comms[i], c->exclude, c->nexclude, &c->comms[i], &config,
                                       NCCL_SHRINK_DEFAULT),
                        err, st, fail);
    }
    group_open = false;
    NCCL_CHECK_GOTO(ncclGroupEnd(), err, st, fail);
    c->init_deadline = ccq_deadline_in(h->timeout_ns);
    return CCQ_IN_PROGRESS;
fail:
    if (group_open)
        ncclGroupEnd();
    for (uint32_t i = 0; i < c->n; i++)
        if (c->comms[i] != NULL) {
            ncclCommAbort(c->comms[i]);
            c->comms[i] = NULL;
        }
    return st == CCQ_OK ? CCQ_ERR_BACKEND : st;
#else
    (void)h;
    (void)c;
    snprintf(err->msg, sizeof err->msg, "ncclCommShrink needs NCCL 2.28");
    return CCQ_ERR_UNSUPPORTED;
#endif
}

/* The survivors' communicator from `parent` minus its ranks in exclude (nccl_comm_test polls
 * it: the shrink starts once the parent's revoke is done). */
static ccq_status nccl_comm_shrink(ccq_backend *be, ccq_be_comm *parent, const uint32_t *exclude,
                                   uint32_t nexclude, const ccq_be_comm_desc *d, ccq_be_comm **out,
                                   ccq_errbuf *err)
{
    nccl_be *h = to_nccl(be);
    nccl_comm *p = (nccl_comm *)parent, *c = calloc(1, sizeof *c);
    uint32_t n = d->nlocal;

    if (c == NULL || (c->devs = calloc(n, sizeof *c->devs)) == NULL ||
        (c->comms = calloc(n, sizeof *c->comms)) == NULL ||
        (c->exclude = calloc(nexclude ? nexclude : 1, sizeof *c->exclude)) == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        if (c != NULL)
            comm_free(c);
        return CCQ_ERR_NO_MEMORY;
    }
    if (!p->revoked || p->n != n) {
        snprintf(err->msg, sizeof err->msg,
                 "cannot shrink: the parent is not revoked, or has other local ranks");
        comm_free(c);
        return CCQ_ERR_BACKEND;
    }
    c->n = n;
    c->first = d->first_rank;
    c->nranks = d->nranks;
    for (uint32_t i = 0; i < n; i++)
        c->devs[i] = (int)d->local_devices[i];
    if (comm_min_cc(h, c, d, err) != CCQ_OK) {
        comm_free(c);
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    for (uint32_t i = 0; i < nexclude; i++)
        c->exclude[i] = (int)exclude[i];
    c->nexclude = (int)nexclude;
    c->parent = p;
    c->shrink_pending = true;
    c->init_deadline = ccq_deadline_in(h->timeout_ns);
    *out = (ccq_be_comm *)c;
    if (!atomic_load_explicit(&p->abort_done, memory_order_acquire))
        return CCQ_IN_PROGRESS;
    ccq_status st = shrink_start(h, c, err);
    if (st != CCQ_IN_PROGRESS) {
        comm_free(c);
        *out = NULL;
    }
    return st;
}

/* ------------------------------------------------------------------------------------ */
/* Hooks on user threads (CUDA runtime calls only: those are thread-safe)                */
/* ------------------------------------------------------------------------------------ */

static ccq_status nccl_check(ccq_backend *be, const ccq_be_submit *s, ccq_errbuf *err)
{
    nccl_be *h = to_nccl(be);
    bool fp8 = s->dtype == CCQ_FLOAT8E4M3 || s->dtype == CCQ_FLOAT8E5M2;
    bool reduces = ccq_kinds[s->kind].reduces;
    bool since_228 =
        s->kind == CCQ_KIND_ALL_TO_ALL || s->kind == CCQ_KIND_GATHER || s->kind == CCQ_KIND_SCATTER;
    if (since_228 && (!NCCL_HAS_228_COLLECTIVES || h->version < NCCL_VERSION(2, 28, 0))) {
        snprintf(err->msg, sizeof err->msg,
                 "%s needs NCCL 2.28 or newer (ncclAlltoAll/ncclGather/ncclScatter); this process "
                 "has NCCL %d.%d.%d",
                 ccq_kinds[s->kind].name, h->version / 10000, h->version / 100 % 100,
                 h->version % 100);
        return CCQ_ERR_UNSUPPORTED;
    }
    if (fp8 && (!NCCL_HAS_FP8 || h->version < NCCL_VERSION(2, 24, 0))) {
        snprintf(err->msg, sizeof err->msg,
                 "fp8 needs NCCL 2.24 or newer (ncclFloat8e4m3/ncclFloat8e5m2); this process has "
                 "NCCL %d.%d.%d",
                 h->version / 10000, h->version / 100 % 100, h->version % 100);
        return CCQ_ERR_UNSUPPORTED;
    }
    if (fp8 && reduces) {
        /* NCCL refuses an fp8 reduction unless every rank's device is sm90 or newer (it
         * checks the communicator's lowest compute capability), so check the whole set:
         * the communicator's lowest over every member process once it formed, this
         * process's devices while it forms (nccl_issue checks again then). */
        const nccl_comm *c = (const nccl_comm *)s->comm;
        ccq_device_id low = s->device;
        for (uint32_t i = 0; i < s->ndevices; i++) {
            ccq_device_id d = s->devices[i] - s->device_first;
            if (d < (ccq_device_id)h->ndev && h->cc_major[d] < h->cc_major[low])
                low = d;
        }
        if (c != NULL && c->min_cc < 9 && h->cc_major[low] >= 9) {
            snprintf(err->msg, sizeof err->msg,
                     "NCCL reduces fp8 only on compute capability 9.0 (sm90) or newer on every "
                     "device of the communicator; a device of another member process is %d.x "
                     "(moving fp8 data without reducing it works everywhere)",
                     c->min_cc);
            return CCQ_ERR_UNSUPPORTED;
        }
        if (h->cc_major[low] < 9) {
            snprintf(err->msg, sizeof err->msg,
                     "NCCL reduces fp8 only on compute capability 9.0 (sm90) or newer on every "
                     "device of the communicator; device %u is %d.x (moving fp8 data without "
                     "reducing it works everywhere)",
                     low + s->device_first, h->cc_major[low]);
            return CCQ_ERR_UNSUPPORTED;
        }
    }
    return CCQ_OK;
}

static ccq_status nccl_submit(ccq_backend *be, const ccq_be_submit *s, ccq_errbuf *err)
{
    nccl_be *h = to_nccl(be);
    nccl_stream *st = &h->streams[s->stream_index];
    cudaStream_t user = atomic_load_explicit(&st->user, memory_order_acquire);
    cudaError_t e;

    if (user == NULL)
        return CCQ_OK;
    /* The collective must see all work the caller queued on its stream before this call. */
    e = cudaEventRecord(st->slot_events[s->slot], user);
    if (e != cudaSuccess) {
        snprintf(err->msg, sizeof err->msg, "cudaEventRecord on the bound stream: %s (%s)",
                 cudaGetErrorString(e), cudaGetErrorName(e));
        return CCQ_ERR_BACKEND;
    }
    return CCQ_OK;
}

static void nccl_fence(ccq_backend *be, uint32_t stream_index)
{
    nccl_be *h = to_nccl(be);
    nccl_stream *st = &h->streams[stream_index];
    cudaStream_t user = atomic_load_explicit(&st->user, memory_order_acquire);

    /* GPU work the caller queues after the fence must see the data: order it after the
     * completion event (already complete, so this costs the GPU nothing). */
    if (user != NULL && atomic_load_explicit(&st->done_recorded, memory_order_acquire))
        cudaStreamWaitEvent(user, st->done, 0);
}

static ccq_status nccl_bind_stream(ccq_backend *be, ccq_device_id device, uint32_t stream_index,
                                   void *native, ccq_errbuf *err)
{
    nccl_be *h = to_nccl(be);
    nccl_stream *st = &h->streams[stream_index];
    ccq_status status = CCQ_OK;
    enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    ctx_saved prev;

    if (native == NULL) {
        atomic_store_explicit(&st->user, NULL, memory_order_release);
        return CCQ_OK;
    }
    /* Under CUDA Graph capture, the submission events ccq records on the stream would be
     * captured into the graph instead of recorded, and the communication stream's waits on
     * them would join (or invalidate) the capture: unsupported, refused. */
    CUDA_CHECK_GOTO(cudaStreamIsCapturing((cudaStream_t)native, &capture), err, status, refuse);
    if (capture != cudaStreamCaptureStatusNone) {
        snprintf(err->msg, sizeof err->msg,
                 "the stream is being captured into a CUDA Graph (cudaStreamIsCapturing: %s); "
                 "binding a capturing stream is unsupported: bind before or after the capture",
                 capture == cudaStreamCaptureStatusActive ? "active" : "invalidated");
        return CCQ_ERR_UNSUPPORTED;
    }
    if (st->slot_events == NULL) {
        cudaEvent_t *ev = calloc(h->ring_size, sizeof *ev);
        if (ev == NULL) {
            snprintf(err->msg, sizeof err->msg, "out of memory");
            return CCQ_ERR_NO_MEMORY;
        }
        /* Events belong to the device current at creation: switch, then give the caller
         * its context back (ctx_save). */
        ctx_save(h, &prev);
        CUDA_CHECK_GOTO(cudaSetDevice((int)device), err, status, fail_restore);
        for (uint32_t i = 0; i < h->ring_size; i++)
            CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming), err, status,
                            fail_restore);
        ctx_restore(h, &prev);
        st->slot_events = ev;
        goto bound;
    fail_restore:
        for (uint32_t i = 0; i < h->ring_size; i++)
            if (ev[i] != NULL)
                cudaEventDestroy(ev[i]);
        ctx_restore(h, &prev);
        free(ev);
        return status;
    }
bound:
    atomic_store_explicit(&st->user, (cudaStream_t)native, memory_order_release);
    return CCQ_OK;
refuse:
    return status;
}

/* ------------------------------------------------------------------------------------ */
/* GPU-side waits (ccq_nccl_stream_wait; docs/nccl.md "GPU-side waits")                  */
/* ------------------------------------------------------------------------------------ */

/*
 * Per ccq stream, a 64-bit count of ended commands that the GPU reads: a user stream waits
 * with cuStreamWaitValue64(count >= commands submitted before the call); the communication
 * stream writes each batch's count with cuStreamWriteValue64 before the batch's completion
 * event; the scheduler writes it from the host when commands end without reaching the GPU.
 *
 * The counters live in mapped pinned host memory (cudaHostAlloc, portable and mapped), not
 * in device memory: the host must be able to release every waiting GPU stream with a plain
 * store, without a CUDA call that could queue behind a hung stream or fail on a context an
 * abort left in error; and one allocation serves every device. The GPU polls it over the
 * bus while a wait is pending, which costs a little bus traffic, nothing on the host.
 *
 * Host writes only raise a counter (a CAS loop). A GPU write is queued at issue and runs
 * before the batch's completion event, so by the time the scheduler publishes a batch's
 * commands it has run, and the host never writes while one is pending. The exception is a
 * failed batch returned before its streams drained (the GPU still had not run its queued
 * work timeout_ms after the failure): its late GPU write could lower the counter below
 * what the host wrote for the commands that failed after it. Such streams are marked and
 * their counters rewritten at every poll until their completion event shows the late
 * write has run.
 *
 * The memory is never freed: waits the GPU has queued but not evaluated yet read it, also
 * after ccq_runtime_destroy (which raises every counter to its final value first). It is
 * 8 bytes per stream, allocated once per runtime, and only if ccq_nccl_stream_wait is used.
 */

static void memops_init(nccl_be *h)
{
    pthread_mutex_init(&h->mo.lock, NULL);
    atomic_init(&h->mo.state, 0);
    atomic_init(&h->mo.ctr, NULL);
}

static _Atomic uint64_t *counter_of(nccl_be *h, uint32_t stream_index)
{
    _Atomic uint64_t *ctr = atomic_load_explicit(&h->mo.ctr, memory_order_acquire);
    return ctr != NULL ? &ctr[stream_index] : NULL;
}

/* Raise a counter to v (never lower it): user threads and the scheduler. */
static void counter_raise(_Atomic uint64_t *c, uint64_t v)
{
    uint64_t cur = atomic_load_explicit(c, memory_order_acquire);
    while ((int64_t)(v - cur) > 0 && !atomic_compare_exchange_weak_explicit(
                                         c, &cur, v, memory_order_acq_rel, memory_order_acquire))
        ;
}

/* At destroy (every command ended): release every waiting GPU stream for good. */
static void memops_fini(nccl_be *h)
{
    uint32_t nstreams = (uint32_t)h->ndev * h->max_streams;
    for (uint32_t i = 0; h->streams != NULL && i < nstreams; i++)
        if (atomic_load_explicit(&h->streams[i].waited, memory_order_acquire) &&
            counter_of(h, i) != NULL)
            counter_raise(counter_of(h, i), h->streams[i].floor);
    free(h->mo.dev_ok);
    pthread_mutex_destroy(&h->mo.lock);
}

static void *entry_point(nccl_be *h, const char *sym, unsigned version)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion(sym, &fn, version, cudaEnableDefault, &q);
    if (e == cudaSuccess && q == cudaDriverEntryPointSuccess && fn != NULL)
        return fn;
    snprintf(h->mo.why, sizeof h->mo.why,
             "the CUDA driver has no %s (CUDA %u.%u API): cudaGetDriverEntryPointByVersion: %s%s",
             sym, version / 1000, version % 1000 / 10,
             e != cudaSuccess ? cudaGetErrorString(e) : "",
             e != cudaSuccess                               ? ""
             : q == cudaDriverEntryPointVersionNotSufficent ? "driver too old"
                                                            : "symbol not found");
    return NULL;
}

/* Resolve the driver entry points, check each device, allocate the counters. Under
 * mo.lock; sets mo.state. */
static void memops_setup(nccl_be *h)
{
    PFN_cuDeviceGet_v2000 get = entry_point(h, "cuDeviceGet", 2000);
    PFN_cuDeviceGetAttribute_v2000 attr = get ? entry_point(h, "cuDeviceGetAttribute", 2000) : NULL;
    h->mo.wait = attr ? entry_point(h, "cuStreamWaitValue64", 11070) : NULL;
    h->mo.write = h->mo.wait ? entry_point(h, "cuStreamWriteValue64", 11070) : NULL;
    if (h->mo.write == NULL) {
        atomic_store_explicit(&h->mo.state, -1, memory_order_release);
        return;
    }
    h->mo.dev_ok = calloc((size_t)h->ndev, 1);
    if (h->mo.dev_ok == NULL) {
        snprintf(h->mo.why, sizeof h->mo.why, "out of memory");
        atomic_store_explicit(&h->mo.state, -1, memory_order_release);
        return;
    }
    for (int d = 0; d < h->ndev; d++) {
        CUdevice cd = 0;
        int v = 0;
        if (get(&cd, d) == CUDA_SUCCESS &&
            attr(&v, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, cd) == CUDA_SUCCESS)
            h->mo.dev_ok[d] = v != 0;
    }
    void *p = NULL, *dp = NULL;
    size_t bytes = (size_t)h->ndev * h->max_streams * sizeof(uint64_t);
    cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e == cudaSuccess)
        e = cudaHostGetDevicePointer(&dp, p, 0);
    if (e != cudaSuccess) {
        snprintf(h->mo.why, sizeof h->mo.why,
                 "mapped pinned memory for the wait counters: cudaHostAlloc/"
                 "cudaHostGetDevicePointer: %s (%s)",
                 cudaGetErrorString(e), cudaGetErrorName(e));
        if (p != NULL)
            cudaFreeHost(p);
        atomic_store_explicit(&h->mo.state, -1, memory_order_release);
        return;
    }
    memset(p, 0, bytes);
    h->mo.dctr = (CUdeviceptr)(uintptr_t)dp;
    atomic_store_explicit(&h->mo.ctr, (_Atomic uint64_t *)p, memory_order_release);
    atomic_store_explicit(&h->mo.state, 1, memory_order_release);
}

/*
 * How the wait is queued, by what its covered commands (tickets below target) have reached:
 *
 * - all ended: nothing to wait for on the GPU (their completion events completed).
 * - all launched (the completion event of the batch holding the last of them is recorded):
 *   cudaStreamWaitEvent on that event, a dependency CUDA sees. A value wait would do too,
 *   but CUDA's scheduling does not see it (cuda.h, cuStreamWaitValue64: work ordered by it
 *   "should also have that order expressed with CUDA-visible dependencies").
 * - not launched yet: a wait on the counter is the only way to wait for work not queued
 *   yet, but it sits in the hardware queue of `native` before the NCCL kernel and the
 *   counter write it waits for are queued. Streams share CUDA_DEVICE_MAX_CONNECTIONS
 *   hardware queues (default 8; Megatron-LM and TransformerEngine set 1), and a wait that
 *   is not satisfied holds back everything behind it in its queue: with one queue, always
 *   the communication stream's work too, a GPU hang. So with fewer than the default 8
 *   connections the caller waits on the host until they are launched (at most timeout_ms),
 *   then as above; with 8 or more, the counter wait (the call returns at once), which
 *   deadlocks only if the driver put `native` and the stream NCCL runs on in one queue
 *   (docs/nccl.md says how to rule that out).
 */
static bool waits_on_host(const nccl_be *h)
{
    return h->connections < 8;
}

/* The covered commands all ended (*ended), or all launched (`done` recorded after them). */
static bool covered_ended(const _Atomic uint64_t *ended, uint64_t target)
{
    return (int64_t)(atomic_load_explicit(ended, memory_order_acquire) - target) >= 0;
}

static bool covered_launched(const nccl_stream *st, uint64_t target)
{
    return atomic_load_explicit(&st->done_recorded, memory_order_acquire) &&
           (int64_t)(atomic_load_explicit(&st->done_upto, memory_order_acquire) - target) >= 0;
}

/* User thread: queue the wait (see backend.h). */
static ccq_status nccl_stream_wait(ccq_backend *be, ccq_device_id device, uint32_t stream_index,
                                   void *native, uint64_t target, const _Atomic uint64_t *ended,
                                   ccq_errbuf *err)
{
    nccl_be *h = to_nccl(be);
    nccl_stream *st = &h->streams[stream_index];

    if (atomic_load_explicit(&h->mo.state, memory_order_acquire) == 0) {
        pthread_mutex_lock(&h->mo.lock);
        if (atomic_load_explicit(&h->mo.state, memory_order_relaxed) == 0) {
            /* cudaHostAlloc needs a context: the wait's device's (the caller's is put back),
             * not whatever the runtime would initialise on a thread without one. */
            ctx_saved prev;
            ctx_save(h, &prev);
            (void)cudaSetDevice((int)device);
            memops_setup(h);
            ctx_restore(h, &prev);
        }
        pthread_mutex_unlock(&h->mo.lock);
    }
    if (atomic_load_explicit(&h->mo.state, memory_order_acquire) < 0) {
        snprintf(err->msg, sizeof err->msg,
                 "GPU-side waits are unsupported here: %s; fence on the host instead "
                 "(ccq_fence_wait, ccq_sync_collective)",
                 h->mo.why);
        return CCQ_ERR_UNSUPPORTED;
    }
    if (!h->mo.dev_ok[device]) {
        snprintf(err->msg, sizeof err->msg,
                 "GPU-side waits are unsupported on device %u: "
                 "CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0 (no 64-bit "
                 "cuStreamWaitValue64); fence on the host instead (ccq_fence_wait, "
                 "ccq_sync_collective)",
                 device);
        return CCQ_ERR_UNSUPPORTED;
    }
    if (!covered_ended(ended, target) && !covered_launched(st, target) && waits_on_host(h)) {
        uint64_t deadline = ccq_deadline_in(h->timeout_ns);
        while (!covered_ended(ended, target) && !covered_launched(st, target)) {
            if (ccq_now_ns() >= deadline) {
                snprintf(err->msg, sizeof err->msg,
                         "the commands it covers were not launched within timeout_ms (with "
                         "CUDA_DEVICE_MAX_CONNECTIONS=%d, fewer than 8 hardware queues, ccq "
                         "waits on the host until they are: a wait queued before them would "
                         "hold back their own kernels; submit every part first)",
                         h->connections);
                return CCQ_ERR_TIMEOUT;
            }
            sleep_ns(20000);
        }
    }
    if (covered_ended(ended, target))
        return CCQ_OK;
    if (covered_launched(st, target)) {
        /* The latest record of `done`, at or after the batch that holds them. */
        cudaError_t e = cudaStreamWaitEvent((cudaStream_t)native, st->done, 0);
        if (e != cudaSuccess) {
            snprintf(err->msg, sizeof err->msg, "cudaStreamWaitEvent on the given stream: %s (%s)",
                     cudaGetErrorString(e), cudaGetErrorName(e));
            return CCQ_ERR_BACKEND;
        }
        return CCQ_OK;
    }
    _Atomic uint64_t *c = counter_of(h, stream_index);
    /* Arm, then read the count: either the scheduler sees the stream armed when it next
     * publishes (and writes), or this thread sees what it published (and writes it). */
    atomic_store_explicit(&st->waited, 1, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    counter_raise(c, atomic_load_explicit(ended, memory_order_acquire));
    CUdeviceptr addr = h->mo.dctr + (CUdeviceptr)stream_index * 8u;
    CUresult r = h->mo.wait((CUstream)native, addr, target, CU_STREAM_WAIT_VALUE_GEQ);
    if (r == CUDA_ERROR_INVALID_CONTEXT) {
        /* A thread that never used CUDA has no current context: make the device's primary
         * context current for the call, then give the thread its (lack of) context back. */
        ctx_saved prev;
        ctx_save(h, &prev);
        if (cudaSetDevice((int)device) == cudaSuccess)
            r = h->mo.wait((CUstream)native, addr, target, CU_STREAM_WAIT_VALUE_GEQ);
        ctx_restore(h, &prev);
    }
    if (r != CUDA_SUCCESS) {
        snprintf(err->msg, sizeof err->msg, "cuStreamWaitValue64 on the given stream: CUresult %d",
                 (int)r);
        return r == CUDA_ERROR_NOT_SUPPORTED ? CCQ_ERR_UNSUPPORTED : CCQ_ERR_BACKEND;
    }
    return CCQ_OK;
}

/* Scheduler, in record_done: the batch's count, queued on the stream's NCCL stream. */
static ccq_status counter_write_after(nccl_be *h, uint32_t stream_index, uint64_t value,
                                      ccq_errbuf *err)
{
    nccl_stream *st = &h->streams[stream_index];
    if (counter_of(h, stream_index) == NULL ||
        !atomic_load_explicit(&st->waited, memory_order_acquire))
        return CCQ_OK; /* no wait ever: the host writes if one comes (nccl_stream_ended) */
    /* The stream's device current, as for any work queued on it. */
    cudaError_t e = cudaSetDevice((int)(stream_index / h->max_streams));
    if (e != cudaSuccess) {
        snprintf(err->msg, sizeof err->msg, "cudaSetDevice: %s (%s)", cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return CCQ_ERR_BACKEND;
    }
    CUresult r =
        h->mo.write(st->comm, h->mo.dctr + (CUdeviceptr)stream_index * 8u, value, 0 /* ordered */);
    if (r != CUDA_SUCCESS) {
        snprintf(err->msg, sizeof err->msg,
                 "cuStreamWriteValue64 of the GPU-side wait counter: CUresult %d", (int)r);
        return CCQ_ERR_BACKEND;
    }
    return CCQ_OK;
}

/* Scheduler: `ended` commands of the stream ended. Writes from the host only when the GPU
 * did not (commands that never reached it, a batch whose write failed or was not queued). */
static void nccl_stream_ended(ccq_backend *be, uint32_t stream_index, uint64_t ended)
{
    nccl_be *h = to_nccl(be);
    nccl_stream *st = &h->streams[stream_index];

    atomic_thread_fence(memory_order_seq_cst); /* pairs with nccl_stream_wait's arming */
    _Atomic uint64_t *c = counter_of(h, stream_index);
    if (c == NULL || !atomic_load_explicit(&st->waited, memory_order_relaxed))
        return;
    if ((int64_t)(ended - st->floor) > 0)
        st->floor = ended;
    if ((int64_t)(ended - atomic_load_explicit(c, memory_order_acquire)) <= 0)
        return; /* the GPU wrote it */
    counter_raise(c, ended);
    if (!st->repair && st->comm != NULL &&
        atomic_load_explicit(&st->done_recorded, memory_order_acquire) &&
        cudaEventQuery(st->done) == cudaErrorNotReady) {
        st->repair = true; /* a late GPU write may still lower it */
        h->mo.nrepair++;
    }
}

/* Scheduler, each poll while some stream may see a late GPU write (see above). */
static void counters_repair(nccl_be *h)
{
    uint32_t nstreams = (uint32_t)h->ndev * h->max_streams;
    for (uint32_t i = 0; i < nstreams && h->mo.nrepair > 0; i++) {
        nccl_stream *st = &h->streams[i];
        if (!st->repair)
            continue;
        bool drained = cudaEventQuery(st->done) != cudaErrorNotReady;
        counter_raise(counter_of(h, i), st->floor);
        if (drained) {
            st->repair = false;
            h->mo.nrepair--;
        }
    }
}

/* ------------------------------------------------------------------------------------ */
/* Issue and completion (scheduler thread)                                               */
/* ------------------------------------------------------------------------------------ */

/* The stream NCCL runs a ccq stream's work on, created on first use; with
 * ccq_config.nccl_high_priority, at the device's greatest priority (a lower number is a
 * higher priority: cudaDeviceGetStreamPriorityRange), so the GPU's block scheduler starts
 * communication kernels ahead of queued compute ones. */
static ccq_status stream_ready(nccl_be *h, nccl_stream *st, int dev, ccq_errbuf *err)
{
    ccq_status status = CCQ_OK;
    if (st->comm != NULL)
        return CCQ_OK;
    CUDA_CHECK_GOTO(cudaSetDevice(dev), err, status, fail);
    if (h->high_priority) {
        int least = 0;
        if (h->prio[dev] == INT_MIN)
            CUDA_CHECK_GOTO(cudaDeviceGetStreamPriorityRange(&least, &h->prio[dev]), err, status,
                            fail);
        CUDA_CHECK_GOTO(
            cudaStreamCreateWithPriority(&st->comm, cudaStreamNonBlocking, h->prio[dev]), err,
            status, fail);
    } else {
        CUDA_CHECK_GOTO(cudaStreamCreateWithFlags(&st->comm, cudaStreamNonBlocking), err, status,
                        fail);
    }
    CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&st->done, cudaEventDisableTiming), err, status, fail);
    CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&st->join, cudaEventDisableTiming), err, status, fail);
    return CCQ_OK;
fail:
    if (st->done != NULL)
        cudaEventDestroy(st->done);
    if (st->comm != NULL)
        cudaStreamDestroy(st->comm);
    st->comm = NULL;
    st->done = NULL;
    return status;
}

static ccq_status fuse_unpack(nccl_be *h, nccl_batch *nb, ccq_errbuf *err);

/* One completion event per stream used, recorded after the group's work (and after the
 * fused groups' copies out, queued here: the group's kernels are on the streams now). */
static ccq_status record_done(nccl_be *h, nccl_batch *nb, ccq_errbuf *err)
{
    ccq_status status = fuse_unpack(h, nb, err);
    if (status != CCQ_OK)
        return status;
    for (uint32_t k = 0; k < nb->nstreams; k++) {
        nccl_stream *st = &h->streams[nb->streams[k]];
        /* Before the event: once the host sees the batch complete, the counter is there. */
        status = counter_write_after(h, nb->streams[k], nb->stream_done[k], err);
        if (status != CCQ_OK)
            goto fail;
        CUDA_CHECK_GOTO(cudaEventRecord(st->done, st->comm), err, status, fail);
        atomic_store_explicit(&st->done_upto, nb->stream_done[k], memory_order_release);
        atomic_store_explicit(&st->done_recorded, 1, memory_order_release);
    }
fail:
    return status;
}

/*
 * NCCL runs a one-rank communicator's operation at the call, even inside a group (a copy,
 * or a kernel for ncclAvg and the like), on the calling thread's current device, and a
 * launch on a stream of another device fails. So each part's device is made current
 * before its NCCL call; *cur avoids repeating cudaSetDevice within a batch.
 */
static cudaError_t set_device(int *cur, int dev)
{
    if (*cur == dev)
        return cudaSuccess;
    cudaError_t e = cudaSetDevice(dev);
    if (e == cudaSuccess)
        *cur = dev;
    return e;
}

/* ------------------------------------------------------------------------------------ */
/* Fusion (docs/fusion.md)                                                               */
/* ------------------------------------------------------------------------------------ */

/*
 * Opt-in (CCQ_NCCL_FUSION=1 with ccq_config.fusion_bytes > 0) until a GPU measurement shows
 * the gain. A fused group (backends/fuse.h: a batch's consecutive small all_reduces of one
 * communicator) runs, for each local rank, on the NCCL stream of its first op's part: the
 * other parts' streams join it (an event each), one cudaMemcpyBatchAsync packs the parts'
 * inputs into a device scratch buffer (pooled), one ncclAllReduce reduces it in place inside
 * the batch's group, and once the group is launched one cudaMemcpyBatchAsync copies the
 * results out and the other streams join back, all before the streams' completion events.
 * Each element meets the same ncclAllReduce op as unfused; NCCL's reduction order per element
 * is its algorithm's (ring, tree), which NCCL chooses by size, so float sums on more than two
 * ranks may differ in the last bits from the unfused ops (docs/fusion.md).
 *
 * Only communicators with every rank in this process fuse: across processes the members
 * would have to agree on each fusion, and NCCL gives the host no channel of its own but the
 * GPU stream (an agreement there would wait behind all queued GPU work before the data could
 * be enqueued) or the bootstrap (a TCP round trip per fusion); a communicator spanning
 * processes keeps one NCCL operation per ccq operation.
 */
#define NCCL_FUSE_KINDS CCQ_FUSE_KIND(CCQ_KIND_ALL_REDUCE)

typedef struct nccl_scratch {
    void *p;
    size_t cap;
    int dev;
    struct nccl_scratch *next;
} nccl_scratch;

typedef struct nccl_fgroup {
    uint32_t k, n; /* ops [k, k + n) of the batch */
    size_t total;  /* their elements */
    void **buf;    /* [the communicator's local ranks]: each rank's packed buffer */
} nccl_fgroup;

/* A device buffer of at least `bytes` on dev: a free one, or a new one (cudaMalloc, on the
 * first steps only: buffers return to the pool when their batch ends). */
static ccq_status scratch_get(nccl_be *h, nccl_batch *nb, int dev, size_t bytes, void **out,
                              ccq_errbuf *err)
{
    ccq_status status = CCQ_OK;
    nccl_scratch **best = NULL, *x;
    for (nccl_scratch **pp = &h->scratch_free; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->dev == dev && (*pp)->cap >= bytes && (best == NULL || (*pp)->cap < (*best)->cap))
            best = pp;
    if (best != NULL) {
        x = *best;
        *best = x->next;
    } else {
        x = calloc(1, sizeof *x);
        if (x == NULL) {
            snprintf(err->msg, sizeof err->msg, "out of memory");
            return CCQ_ERR_NO_MEMORY;
        }
        x->dev = dev;
        x->cap = (bytes + 4095) & ~(size_t)4095;
        CUDA_CHECK_GOTO(cudaSetDevice(dev), err, status, fail);
        CUDA_CHECK_GOTO(cudaMalloc(&x->p, x->cap), err, status, fail);
    }
    x->next = nb->scratch;
    nb->scratch = x;
    *out = x->p;
    return CCQ_OK;
fail:
    free(x);
    return status;
}

/* The batch's buffers go back to the pool (the GPU is done with them). */
static void scratch_put(nccl_be *h, nccl_batch *nb)
{
    while (nb->scratch != NULL) {
        nccl_scratch *x = nb->scratch;
        nb->scratch = x->next;
        x->next = h->scratch_free;
        h->scratch_free = x;
    }
}

static void scratch_fini(nccl_be *h)
{
    while (h->scratch_free != NULL) {
        nccl_scratch *x = h->scratch_free;
        h->scratch_free = x->next;
        cudaSetDevice(x->dev);
        cudaFree(x->p);
        free(x);
    }
}

/* n device-to-device copies on stream st of device dev, one call (CUDA 12.8+). */
static cudaError_t batch_copy(cudaStream_t st, int dev, void **dsts, const void **srcs,
                              size_t *sizes, size_t n)
{
#if CUDART_VERSION >= 12080
    struct cudaMemcpyAttributes attr;
    size_t idx = 0;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream; /* after what the stream did before */
    attr.srcLocHint.type = cudaMemLocationTypeDevice;
    attr.srcLocHint.id = dev;
    attr.dstLocHint.type = cudaMemLocationTypeDevice;
    attr.dstLocHint.id = dev;
#if CUDART_VERSION >= 13000
    return cudaMemcpyBatchAsync(dsts, srcs, sizes, n, &attr, &idx, 1, st);
#else
    size_t failed = 0;
    return cudaMemcpyBatchAsync(dsts, (void **)srcs, sizes, n, &attr, &idx, 1, &failed, st);
#endif
#else
    (void)dev;
    for (size_t i = 0; i < n; i++) {
        cudaError_t e = cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDeviceToDevice, st);
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
#endif
}

/* Whether stream y appears among the parts of ops[0..j-1] of local rank p (joined already). */
static bool joined_before(nccl_be *h, ccq_be_op *const *ops, uint32_t j, uint32_t p,
                          const nccl_stream *y)
{
    for (uint32_t i = 0; i < j; i++)
        if (&h->streams[ops[i]->parts[p].stream_index] == y)
            return true;
    return false;
}

/* Copy rank p's parts of a group between their buffers and its packed buffer, on x. */
static ccq_status group_copy(nccl_be *h, ccq_be_op *const *ops, const nccl_fgroup *g, uint32_t p,
                             bool in, ccq_errbuf *err)
{
    ccq_status status = CCQ_OK;
    size_t es = ccq_fuse_esize(ops[0]->dtype), off = 0;
    void **dsts = malloc(g->n * sizeof *dsts);
    const void **srcs = malloc(g->n * sizeof *srcs);
    size_t *sizes = malloc(g->n * sizeof *sizes);
    const ccq_be_part *head = &ops[0]->parts[p];
    if (dsts == NULL || srcs == NULL || sizes == NULL) {
        status = CCQ_ERR_NO_MEMORY;
        snprintf(err->msg, sizeof err->msg, "out of memory");
        goto out;
    }
    for (uint32_t j = 0; j < g->n; j++) {
        char *packed = (char *)g->buf[p] + off * es;
        dsts[j] = in ? packed : ops[j]->parts[p].dst;
        srcs[j] = in ? ops[j]->parts[p].src : packed;
        sizes[j] = ops[j]->count * es;
        off += ops[j]->count;
    }
    {
        cudaError_t e = batch_copy(h->streams[head->stream_index].comm, (int)head->device, dsts,
                                   srcs, sizes, g->n);
        if (e != cudaSuccess) {
            status = CCQ_ERR_BACKEND;
            snprintf(err->msg, sizeof err->msg,
                     "cudaMemcpyBatchAsync (%s the %u parts of a fused all_reduce on device %u): "
                     "%s (%s)",
                     in ? "packing" : "unpacking", g->n, head->device, cudaGetErrorString(e),
                     cudaGetErrorName(e));
        }
    }
out:
    free(dsts);
    free(srcs);
    free(sizes);
    return status;
}

/*
 * Before the batch's group: find its fused groups and, for each local rank, join the parts'
 * streams into the first part's and pack the inputs there (queued before the group, so before
 * the NCCL kernel it launches). Marks each group's first op (ccq_be_op.fused).
 */
static ccq_status fuse_prepare(nccl_be *h, nccl_batch *nb, int *cur, ccq_errbuf *err)
{
    ccq_be_batch *b = nb->b;
    ccq_status status = CCQ_OK;
    uint64_t now = ccq_now_ns();

    for (uint32_t k = 0; k < b->nops;) {
        ccq_be_op *op = b->ops[k];
        nccl_comm *c = (nccl_comm *)op->comm;
        uint32_t g = 1;
        if (h->fusion && op->status == CCQ_OK && c->fusion_bytes > 0)
            g = ccq_fuse_group(b->ops + k, b->nops - k, c->fusion_bytes, NCCL_FUSE_KINDS);
        if (g > 1) {
            nccl_fgroup *ng = realloc(nb->groups, (nb->ngroups + 1) * sizeof *ng);
            if (ng == NULL)
                goto oom;
            nb->groups = ng;
            ng[nb->ngroups] = (nccl_fgroup){k, g, 0, calloc(c->n, sizeof(void *))};
            if (ng[nb->ngroups].buf == NULL)
                goto oom;
            for (uint32_t j = 0; j < g; j++)
                ng[nb->ngroups].total += b->ops[k + j]->count;
            nb->ngroups++;
        }
        k += g;
    }
    for (uint32_t q = 0; q < nb->ngroups; q++) {
        nccl_fgroup *g = &nb->groups[q];
        ccq_be_op **ops = b->ops + g->k;
        nccl_comm *c = (nccl_comm *)ops[0]->comm;
        for (uint32_t p = 0; p < c->n; p++) {
            const ccq_be_part *head = &ops[0]->parts[p];
            nccl_stream *x = &h->streams[head->stream_index];
            status = scratch_get(h, nb, (int)head->device, g->total * ccq_fuse_esize(ops[0]->dtype),
                                 &g->buf[p], err);
            if (status != CCQ_OK)
                return status;
            CUDA_CHECK_GOTO(set_device(cur, (int)head->device), err, status, fail);
            for (uint32_t j = 1; j < g->n; j++) {
                nccl_stream *y = &h->streams[ops[j]->parts[p].stream_index];
                if (y == x || joined_before(h, ops, j, p, y))
                    continue;
                CUDA_CHECK_GOTO(cudaEventRecord(y->join, y->comm), err, status, fail);
                CUDA_CHECK_GOTO(cudaStreamWaitEvent(x->comm, y->join, 0), err, status, fail);
            }
            status = group_copy(h, ops, g, p, true, err);
            if (status != CCQ_OK)
                return status;
        }
        ops[0]->fused = g->n;
        ops[0]->fused_t0 = now;
    }
    return CCQ_OK;
oom:
    snprintf(err->msg, sizeof err->msg, "out of memory");
    return CCQ_ERR_NO_MEMORY;
fail:
    return status;
}

/* Inside the group: each local rank's ncclAllReduce of a group's packed buffer, in place. */
static ccq_status fuse_enqueue(nccl_be *h, ccq_be_op *const *ops, const nccl_fgroup *g, int *cur,
                               bool *cuda_err, ccq_errbuf *err)
{
    nccl_comm *c = (nccl_comm *)ops[0]->comm;
    ccq_status status = CCQ_OK;
    ncclRedOp_t ro = c->nranks == 1 ? ncclSum : op_map[ops[0]->redop];
    *cuda_err = false;
    for (uint32_t p = 0; p < c->n; p++) {
        const ccq_be_part *head = &ops[0]->parts[p];
        CUDA_CHECK_GOTO(set_device(cur, (int)head->device), err, status, cuda_fail);
        NCCL_CHECK_GOTO(ncclAllReduce(g->buf[p], g->buf[p], g->total, dtype_map[ops[0]->dtype], ro,
                                      c->comms[head->rank - c->first],
                                      h->streams[head->stream_index].comm),
                        err, status, fail);
    }
    return CCQ_OK;
cuda_fail:
    *cuda_err = true;
fail:
    return status == CCQ_OK ? CCQ_ERR_BACKEND : status;
}

/* Once the group is launched (its kernels are on the streams): copy every group's results out
 * and join the other parts' streams back, before their completion events. Once per batch. */
static ccq_status fuse_unpack(nccl_be *h, nccl_batch *nb, ccq_errbuf *err)
{
    ccq_be_batch *b = nb->b;
    ccq_status status = CCQ_OK;
    int cur = -1;
    if (nb->unpacked || nb->failed)
        return CCQ_OK;
    nb->unpacked = true;
    for (uint32_t q = 0; q < nb->ngroups; q++) {
        nccl_fgroup *g = &nb->groups[q];
        ccq_be_op **ops = b->ops + g->k;
        nccl_comm *c = (nccl_comm *)ops[0]->comm;
        for (uint32_t p = 0; p < c->n; p++) {
            const ccq_be_part *head = &ops[0]->parts[p];
            nccl_stream *x = &h->streams[head->stream_index];
            bool recorded = false;
            CUDA_CHECK_GOTO(set_device(&cur, (int)head->device), err, status, fail);
            status = group_copy(h, ops, g, p, false, err);
            if (status != CCQ_OK)
                return status;
            for (uint32_t j = 1; j < g->n; j++) {
                nccl_stream *y = &h->streams[ops[j]->parts[p].stream_index];
                if (y == x || joined_before(h, ops, j, p, y))
                    continue;
                if (!recorded)
                    CUDA_CHECK_GOTO(cudaEventRecord(x->join, x->comm), err, status, fail);
                recorded = true;
                CUDA_CHECK_GOTO(cudaStreamWaitEvent(y->comm, x->join, 0), err, status, fail);
            }
        }
    }
fail:
    return status;
}

/* The batch ended: its fused operations ended now (for the trace). */
static void fuse_ended(nccl_batch *nb)
{
    uint64_t now = ccq_now_ns();
    for (uint32_t q = 0; q < nb->ngroups; q++)
        nb->b->ops[nb->groups[q].k]->fused_t1 = now;
}

static void nb_free(nccl_batch *nb)
{
    for (uint32_t q = 0; q < nb->ngroups; q++)
        free(nb->groups[q].buf);
    free(nb->groups);
    free(nb->streams);
    free(nb->stream_done);
    free(nb->comms);
    free(nb);
}

/* Whether two communicators have a device in common. */
static bool comms_share_device(const nccl_comm *a, const nccl_comm *b)
{
    for (uint32_t i = 0; i < a->n; i++)
        for (uint32_t j = 0; j < b->n; j++)
            if (a->devs[i] == b->devs[j])
                return true;
    return false;
}

static bool batch_poll(nccl_be *h, nccl_batch *nb);

/* Whether two batches have a device in common. */
static bool batches_overlap(const nccl_batch *a, const nccl_batch *b)
{
    for (uint32_t j = 0; j < a->ncomms; j++)
        for (uint32_t k = 0; k < b->ncomms; k++)
            if (comms_share_device(a->comms[j], b->comms[k]))
                return true;
    return false;
}

/*
 * Non-blocking communicators: while a group's launch is still in progress (ncclGroupEnd
 * returned ncclInProgress: an in-flight batch in NB_ENQUEUING, on other ccq streams, since a
 * stream has one batch in flight), NCCL refuses any other call on its communicators with
 * ncclInvalidArgument. And each non-blocking group is launched by its own NCCL thread
 * (group.cc, groupLaunchNonBlocking), so two groups launching at once on communicators that
 * share a device could enqueue their kernels in a different order on each GPU and deadlock
 * ("using multiple NCCL communicators concurrently" in NCCL's docs). So nb is launched only
 * once no earlier batch sharing a device with it is still launching or waiting to: launches
 * are serialized per device, in issue order.
 *
 * The scheduler never waits for that here: a launch can take long (with NCCL_RUNTIME_CONNECT,
 * the default, the first launch of an algorithm or peer connects with blocking bootstrap
 * exchanges on the launch thread: group.cc ncclPrepareTasksAndCollPreconnect,
 * transport.cc), and until every member process launched its part, which may itself wait
 * behind another launch there. The batch stays NB_WAITING instead, and each poll checks
 * again (nccl_poll); meanwhile the scheduler serves everything else.
 *
 * A failed batch still launching counts until its communicators' aborts finished (the
 * abort joins NCCL's launch thread). There is no deadline of its own: the watchdog aborts
 * the earlier batch timeout_ms after it was issued, and this one then goes.
 *
 * Returns the earlier batch nb waits for, or NULL. Asks a launching batch's communicators
 * once (batch_poll), never waits.
 */
static bool aborts_done(const nccl_batch *a)
{
    for (uint32_t k = 0; k < a->ncomms; k++)
        if (!atomic_load_explicit(&a->comms[k]->abort_done, memory_order_acquire))
            return false;
    return true;
}

static const nccl_batch *launch_blocker(nccl_be *h, const nccl_batch *nb)
{
    for (nccl_batch *a = h->inflight; a != NULL && a != nb; a = a->next) {
        if ((a->state != NB_WAITING && a->state != NB_ENQUEUING) || !batches_overlap(a, nb))
            continue;
        if (a->state == NB_ENQUEUING)
            (void)batch_poll(h, a); /* records its events once its launch finished */
        if (a->state == NB_WAITING || (a->state == NB_ENQUEUING && (!a->failed || !aborts_done(a))))
            return a;
    }
    return NULL;
}

/* The kinds this build can hand to NCCL (ncclAlltoAll, ncclGather, ncclScatter: 2.28). */
static bool kind_supported(unsigned kind)
{
    switch (kind) {
    case CCQ_KIND_ALL_REDUCE:
    case CCQ_KIND_SEND:
    case CCQ_KIND_RECV: /* a half whose peer is another process's */
    case CCQ_KIND_BROADCAST:
    case CCQ_KIND_REDUCE:
    case CCQ_KIND_ALL_GATHER:
    case CCQ_KIND_REDUCE_SCATTER:
        return true;
    case CCQ_KIND_ALL_TO_ALL:
    case CCQ_KIND_GATHER:
    case CCQ_KIND_SCATTER:
        return NCCL_HAS_228_COLLECTIVES;
    default:
        return false;
    }
}

/* An fp8 reduction (NCCL checks the communicator's lowest compute capability for those). */
static bool fp8_reduction(const ccq_be_op *op)
{
    return (op->dtype == CCQ_FLOAT8E4M3 || op->dtype == CCQ_FLOAT8E5M2) &&
           op->kind < CCQ_KIND_COUNT_ && ccq_kinds[op->kind].reduces;
}

/* What issue() can refuse before ncclGroupStart: a kind, dtype or op it cannot map. */
static ccq_status op_validate(const ccq_be_op *op, ccq_errbuf *err)
{
    bool fp8 = op->dtype == CCQ_FLOAT8E4M3 || op->dtype == CCQ_FLOAT8E5M2;
    if (!kind_supported(op->kind)) {
        snprintf(err->msg, sizeof err->msg, "operation kind %u is not supported%s", op->kind,
                 NCCL_HAS_228_COLLECTIVES ? "" : " (built against NCCL < 2.28)");
        return CCQ_ERR_UNSUPPORTED;
    }
    if (op->dtype >= CCQ_DTYPE_COUNT_ || (fp8 && !NCCL_HAS_FP8)) {
        snprintf(err->msg, sizeof err->msg, "dtype %u has no NCCL type", op->dtype);
        return CCQ_ERR_UNSUPPORTED;
    }
    if (op->kind < CCQ_KIND_COUNT_ && ccq_kinds[op->kind].reduces &&
        op->redop >= CCQ_REDUCE_OP_COUNT_) {
        snprintf(err->msg, sizeof err->msg, "reduce op %u has no NCCL op", op->redop);
        return CCQ_ERR_UNSUPPORTED;
    }
    return CCQ_OK;
}

/*
 * After a CUDA error (or anything that is not a failed NCCL call) inside the open group,
 * NCCL's group error is not set, and ncclGroupEnd would launch the partial group: one
 * rank's half of a collective without the others', which hangs the GPU. A call NCCL's
 * argument check refuses (an invalid datatype, ArgsCheck in misc/argcheck.cc, before the
 * call touches a buffer or a stream) sets the group error (ncclGroupErrCheck in
 * ncclEnqueueCheck), so ncclGroupEnd then launches nothing.
 */
static void poison_group(nccl_comm *c)
{
    (void)ncclAllReduce(NULL, NULL, 1, (ncclDataType_t)ncclNumTypes, ncclSum, c->comms[0], NULL);
}

static void batch_fail(nccl_be *h, nccl_batch *nb, ccq_status st, const char *msg);

/* The NCCL calls of one op inside the open group; on failure, *cuda_err says whether it was a
 * CUDA call (which leaves NCCL's group error unset) rather than an NCCL one. */
static ccq_status op_enqueue(nccl_be *h, ccq_be_op *op, int *cur, bool *cuda_err, ccq_errbuf *err)
{
    nccl_comm *c = (nccl_comm *)op->comm;
    ncclDataType_t dt = dtype_map[op->dtype];
    ccq_status status = CCQ_OK;

    *cuda_err = false;
    if ((op->kind == CCQ_KIND_SEND || op->kind == CCQ_KIND_RECV) && op->nparts == 1) {
        /* A half whose peer is another process's device: that process calls the other. */
        const ccq_be_part *me = &op->parts[0];
        ncclComm_t mine = c->comms[me->rank - c->first];
        cudaStream_t cs = h->streams[me->stream_index].comm;
        CUDA_CHECK_GOTO(set_device(cur, (int)me->device), err, status, cuda_fail);
        if (op->kind == CCQ_KIND_SEND)
            NCCL_CHECK_GOTO(ncclSend(me->src, op->count, dt, (int)op->peer, mine, cs), err, status,
                            fail);
        else
            NCCL_CHECK_GOTO(ncclRecv(me->dst, op->count, dt, (int)op->peer, mine, cs), err, status,
                            fail);
        return CCQ_OK;
    }
    if (op->kind == CCQ_KIND_SEND) {
        /* part 0 sends to part 1's rank, part 1 receives from part 0's */
        const ccq_be_part *snd = &op->parts[0], *rcv = &op->parts[1];
        CUDA_CHECK_GOTO(set_device(cur, (int)snd->device), err, status, cuda_fail);
        NCCL_CHECK_GOTO(ncclSend(snd->src, op->count, dt, (int)rcv->rank,
                                 c->comms[snd->rank - c->first],
                                 h->streams[snd->stream_index].comm),
                        err, status, fail);
        CUDA_CHECK_GOTO(set_device(cur, (int)rcv->device), err, status, cuda_fail);
        NCCL_CHECK_GOTO(ncclRecv(rcv->dst, op->count, dt, (int)snd->rank,
                                 c->comms[rcv->rank - c->first],
                                 h->streams[rcv->stream_index].comm),
                        err, status, fail);
        return CCQ_OK;
    }
    /* A collective: every local rank's part, in rank order, inside this one group. */
    for (uint32_t p = 0; p < op->nparts; p++) {
        const ccq_be_part *part = &op->parts[p];
        ncclComm_t comm = c->comms[part->rank - c->first];
        cudaStream_t cs = h->streams[part->stream_index].comm;
        /* A one-rank reduction is the identity: NCCL's ncclAvg on one rank becomes a
         * pre-multiplied sum run by its one-rank kernel, which lacks fp8 in host code
         * (onerank.cu) and refuses it; ncclSum there is a plain copy, for every type. */
        ncclRedOp_t ro = c->nranks == 1 ? ncclSum : op_map[op->redop];
        int root = (int)op->root;
        const void *src = part->src;
        void *dst = part->dst;
        CUDA_CHECK_GOTO(set_device(cur, (int)part->device), err, status, cuda_fail);
        switch (op->kind) {
        case CCQ_KIND_ALL_REDUCE:
            NCCL_CHECK_GOTO(ncclAllReduce(src, dst, op->count, dt, ro, comm, cs), err, status,
                            fail);
            break;
        case CCQ_KIND_BROADCAST:
            NCCL_CHECK_GOTO(ncclBroadcast(src, dst, op->count, dt, root, comm, cs), err, status,
                            fail);
            break;
        case CCQ_KIND_REDUCE:
            NCCL_CHECK_GOTO(ncclReduce(src, dst, op->count, dt, ro, root, comm, cs), err, status,
                            fail);
            break;
        case CCQ_KIND_ALL_GATHER:
            NCCL_CHECK_GOTO(ncclAllGather(src, dst, op->count, dt, comm, cs), err, status, fail);
            break;
        case CCQ_KIND_REDUCE_SCATTER:
            NCCL_CHECK_GOTO(ncclReduceScatter(src, dst, op->count, dt, ro, comm, cs), err, status,
                            fail);
            break;
#if NCCL_HAS_228_COLLECTIVES
        case CCQ_KIND_ALL_TO_ALL:
            NCCL_CHECK_GOTO(ncclAlltoAll(src, dst, op->count, dt, comm, cs), err, status, fail);
            break;
        /* With NCCL_CHECK_POINTERS=1, NCCL checks a gather's recvbuff and a scatter's
         * sendbuff on every rank (ArgsCheck, misc/argcheck.cc), though only the root uses
         * them: a non-root passes its other buffer instead of NULL (never read or written). */
        case CCQ_KIND_GATHER:
            NCCL_CHECK_GOTO(
                ncclGather(src, dst != NULL ? dst : (void *)src, op->count, dt, root, comm, cs),
                err, status, fail);
            break;
        case CCQ_KIND_SCATTER:
            NCCL_CHECK_GOTO(
                ncclScatter(src != NULL ? src : dst, dst, op->count, dt, root, comm, cs), err,
                status, fail);
            break;
#endif
        default:
            /* op_validate() refused it before the group */
            status = CCQ_ERR_UNSUPPORTED;
            snprintf(err->msg, sizeof err->msg, "operation kind %u", op->kind);
            goto cuda_fail;
        }
    }
    return CCQ_OK;
cuda_fail:
    *cuda_err = true;
fail:
    return status == CCQ_OK ? CCQ_ERR_BACKEND : status;
}

/* The batch's group: ncclGroupStart, every op not refused, ncclGroupEnd; then its state
 * (see NB_*). An error: nothing was started (ncclGroupStart failed). */
static ccq_status batch_launch(nccl_be *h, nccl_batch *nb, ccq_errbuf *err)
{
    ccq_be_batch *b = nb->b;
    ccq_status status = CCQ_OK;
    int cur = -1; /* the device made current last (-1: not known) */
    bool cuda_err = false;
    ncclResult_t r;

    status = fuse_prepare(h, nb, &cur, err);
    if (status != CCQ_OK)
        goto fail;

    /* The whole batch is one group: every local rank's part of each collective and both
     * halves of each send/recv, so NCCL launches them together and rings cannot deadlock. */
    NCCL_CHECK_GOTO(ncclGroupStart(), err, status, fail);
    for (uint32_t k = 0, q = 0; k < b->nops && status == CCQ_OK; k++) {
        if (q < nb->ngroups && nb->groups[q].k == k) { /* a fused group: one call per rank */
            status = fuse_enqueue(h, b->ops + k, &nb->groups[q], &cur, &cuda_err, err);
            k += nb->groups[q++].n - 1;
        } else if (b->ops[k]->status == CCQ_OK) { /* not refused */
            status = op_enqueue(h, b->ops[k], &cur, &cuda_err, err);
        }
    }
    if (status != CCQ_OK && cuda_err && nb->ncomms > 0)
        poison_group(nb->comms[0]);
    r = ncclGroupEnd();
    nb->state = NB_ENQUEUING;
    if (status != CCQ_OK) {
        /* Started: one-rank ops earlier in the group already queued their work at the call,
         * and NCCL may leave the group's error on its communicators. */
        batch_fail(h, nb, status, err->msg);
    } else if (r == ncclInProgress) {
        /* Non-blocking communicators: the launch completes in the background; poll()
         * records the completion events once every communicator left ncclInProgress. */
    } else if (r != ncclSuccess) {
        ccq_status st = nccl_status(r);
        nccl_msg(err, "ncclGroupEnd", r, NULL);
        batch_fail(h, nb, st == CCQ_OK ? CCQ_ERR_BACKEND : st, err->msg);
    } else {
        status = record_done(h, nb, err);
        if (status != CCQ_OK)
            batch_fail(h, nb, status, err->msg);
        else
            nb->state = NB_RUNNING;
    }
    return CCQ_OK;
fail:
    return status == CCQ_OK ? CCQ_ERR_BACKEND : status;
}

/* A batch that ends without its group (nothing started): every op not already refused
 * fails with st. */
static void batch_refuse(nccl_batch *nb, ccq_status st, const char *msg)
{
    ccq_be_batch *b = nb->b;
    b->status = st;
    snprintf(b->detail.msg, sizeof b->detail.msg, "%s", msg);
    for (uint32_t k = 0; k < b->nops; k++)
        if (b->ops[k]->status == CCQ_OK)
            b->ops[k]->status = st;
    nb->state = NB_REFUSED;
}

/* A waiting batch's ops on communicators aborted since it was issued fail now (the
 * scheduler makes no NCCL call on an aborted communicator); nb->comms keeps the others.
 * False when none is left. */
static bool waiting_prune(nccl_batch *nb)
{
    ccq_be_batch *b = nb->b;
    bool any = false;
    nb->ncomms = 0;
    for (uint32_t k = 0; k < b->nops; k++) {
        ccq_be_op *op = b->ops[k];
        nccl_comm *c = (nccl_comm *)op->comm;
        bool seen = false;
        if (op->status != CCQ_OK)
            continue;
        if (c->aborted) {
            op->status = CCQ_ERR_ABORTED;
            op->comm_aborted = 1;
            continue;
        }
        any = true;
        for (uint32_t j = 0; j < nb->ncomms && !seen; j++)
            seen = nb->comms[j] == c;
        if (!seen)
            nb->comms[nb->ncomms++] = c;
    }
    return any;
}

/* Append to the in-flight list (issue order). */
static void inflight_add(nccl_be *h, nccl_batch *nb)
{
    nb->next = NULL;
    if (h->inflight_tail != NULL)
        h->inflight_tail->next = nb;
    else
        h->inflight = nb;
    h->inflight_tail = nb;
}

static ccq_status nccl_issue(ccq_backend *be, ccq_be_batch *b, ccq_errbuf *err)
{
    nccl_be *h = to_nccl(be);
    nccl_batch *nb = calloc(1, sizeof *nb);
    ccq_status status = CCQ_OK;
    uint32_t nparts = 0;

    for (uint32_t k = 0; k < b->nops; k++)
        nparts += b->ops[k]->nparts;
    if (nb == NULL || (nb->streams = calloc(nparts ? nparts : 1, sizeof *nb->streams)) == NULL ||
        (nb->stream_done = calloc(nparts ? nparts : 1, sizeof *nb->stream_done)) == NULL ||
        (nb->comms = calloc(b->nops ? b->nops : 1, sizeof *nb->comms)) == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        if (nb != NULL)
            nb_free(nb);
        return CCQ_ERR_NO_MEMORY;
    }
    nb->b = b;
    h->batch_mark++;

    /* Before the group, everything that can be checked or prepared: after ncclGroupStart a
     * failure is no longer "nothing started" (see below). Streams and communicators the
     * batch uses; each stream's NCCL stream first waits for the events its commands
     * recorded on the caller's stream at submission. */
    for (uint32_t k = 0; k < b->nops; k++) {
        ccq_be_op *op = b->ops[k];
        nccl_comm *c = (nccl_comm *)op->comm;
        bool seen = false;
        if (c->aborted) {
            /* Only this op fails; the rest of the batch runs (ops carry their own status). */
            op->status = CCQ_ERR_ABORTED;
            op->comm_aborted = 1;
            continue;
        }
        status = op_validate(op, err);
        if (status != CCQ_OK)
            goto fail;
        if (fp8_reduction(op) && c->min_cc < 9) {
            /* Submitted while the communicator formed (nccl_check did not know every
             * member's devices yet): refused here, before the group, in every member
             * process alike, so NCCL never sees it and the communicator stays usable. */
            op->status = CCQ_ERR_UNSUPPORTED;
            snprintf(b->detail.msg, sizeof b->detail.msg,
                     "NCCL reduces fp8 only on compute capability 9.0 (sm90) or newer on every "
                     "device of the communicator; its lowest is %d.x",
                     c->min_cc);
            continue;
        }
        for (uint32_t j = 0; j < nb->ncomms && !seen; j++)
            seen = nb->comms[j] == c;
        if (!seen)
            nb->comms[nb->ncomms++] = c;
        for (uint32_t p = 0; p < op->nparts; p++) {
            const ccq_be_part *part = &op->parts[p];
            nccl_stream *st = &h->streams[part->stream_index];
            cudaStream_t user = atomic_load_explicit(&st->user, memory_order_acquire);
            status = stream_ready(h, st, (int)part->device, err);
            if (status != CCQ_OK)
                goto fail;
            if (st->batch_mark != h->batch_mark) {
                st->batch_mark = h->batch_mark;
                nb->stream_done[nb->nstreams] = part->stream_done;
                nb->streams[nb->nstreams++] = part->stream_index;
            }
            if (user != NULL)
                CUDA_CHECK_GOTO(cudaStreamWaitEvent(st->comm, st->slot_events[part->slot], 0), err,
                                status, fail);
        }
    }

    /* An earlier launch on one of its devices still in progress: the group waits, and
     * poll() launches it once that one finished (launch_blocker). */
    b->be_priv = nb;
    if (launch_blocker(h, nb) != NULL) {
        nb->state = NB_WAITING;
        inflight_add(h, nb);
        return CCQ_OK;
    }
    status = batch_launch(h, nb, err);
    if (status != CCQ_OK)
        goto fail;
    /* From ncclGroupStart on, the batch comes back only through poll(): a failed one once
     * its communicators are aborted and its streams drained (batch_drained). */
    inflight_add(h, nb);
    return CCQ_OK;

fail:
    /* Before ncclGroupStart (or it failed): no collective was started (copies that packed a
     * fused group's inputs may have been queued; they only write ccq's scratch, which the
     * streams' later work orders after them). */
    scratch_put(h, nb);
    b->be_priv = NULL;
    nb_free(nb);
    return status == CCQ_OK ? CCQ_ERR_BACKEND : status;
}

/* Fail a batch whose group hit an error: abort every communicator it used (their other
 * work cannot be trusted), keep NCCL's message. The batch is returned only once the GPU no
 * longer touches its buffers (see batch_drained); if the group's launch had not got as far
 * as its completion events, batch_drained records them once the aborts finished. */
static void batch_fail(nccl_be *h, nccl_batch *nb, ccq_status st, const char *msg)
{
    ccq_be_batch *b = nb->b;
    for (uint32_t k = 0; k < nb->ncomms; k++)
        abort_comm(h, nb->comms[k]);
    b->status = st;
    snprintf(b->detail.msg, sizeof b->detail.msg, "%s", msg);
    for (uint32_t k = 0; k < b->nops; k++) {
        b->ops[k]->status = st;
        b->ops[k]->comm_aborted = 1;
    }
    nb->failed = true;
    nb->drain_deadline = ccq_deadline_in(h->drain_ns);
}

/*
 * A failed batch is returned once its communicators' aborts finished (on the abort thread)
 * and its streams' completion events have completed: an abort makes NCCL's kernels exit,
 * but work queued for the batch (for instance behind a bound user stream) may still run and
 * write its buffers. If that has not happened by the drain deadline (timeout_ms after the
 * failure, 60 s when timeout_ms is 0), it is returned anyway, saying so in the detail. A
 * stream whose event cannot be queried does not hold the batch.
 */
static bool batch_drained(nccl_batch *nb, nccl_be *h)
{
    ccq_be_batch *b = nb->b;
    bool pending = false;
    for (uint32_t k = 0; k < nb->ncomms && !pending; k++)
        pending = !atomic_load_explicit(&nb->comms[k]->abort_done, memory_order_acquire);
    /*
     * A group still launching when it failed (ncclGroupEnd said ncclInProgress): NCCL's
     * launch thread may still be enqueuing its kernels (group.cc, groupLaunchNonBlocking),
     * and an event recorded before they are would complete ahead of them. Every
     * communicator of a failed batch is aborted, and ncclCommAbort joins that thread
     * (ncclGroupJobAbort): so the events are recorded once every abort finished, after
     * whatever the launch enqueued. If they cannot be recorded, the batch is returned
     * (nothing left to wait for that ccq can see).
     */
    if (!pending && nb->state == NB_ENQUEUING) {
        ccq_errbuf e;
        if (record_done(h, nb, &e) == CCQ_OK)
            nb->state = NB_RUNNING;
    }
    for (uint32_t k = 0; nb->state == NB_RUNNING && k < nb->nstreams && !pending; k++)
        pending = cudaEventQuery(h->streams[nb->streams[k]].done) == cudaErrorNotReady;
    if (!pending)
        return true;
    if (ccq_now_ns() < nb->drain_deadline)
        return false;
    size_t len = strlen(b->detail.msg);
    snprintf(b->detail.msg + len, sizeof b->detail.msg - len,
             "; the GPU had not finished this batch's queued work (or NCCL its abort) timeout_ms "
             "after the failure: its buffers may still change");
    return true;
}

/* Whether every completion event of a running batch has completed. */
static bool events_complete(nccl_be *h, const nccl_batch *nb)
{
    if (nb->state != NB_RUNNING)
        return false;
    for (uint32_t k = 0; k < nb->nstreams; k++)
        if (cudaEventQuery(h->streams[nb->streams[k]].done) != cudaSuccess)
            return false;
    return true;
}

/* Advance one batch; true when it is finished (completed or failed). */
static bool batch_poll(nccl_be *h, nccl_batch *nb)
{
    ccq_errbuf err = {{0}};
    bool enqueuing = false;

    if (nb->state == NB_REFUSED)
        return true;
    if (nb->state == NB_WAITING) {
        if (!waiting_prune(nb)) {
            batch_refuse(nb, CCQ_ERR_ABORTED, "the communicator was aborted");
            return true;
        }
        if (launch_blocker(h, nb) != NULL)
            return false;
        ccq_status st = batch_launch(h, nb, &err);
        if (st != CCQ_OK) {
            batch_refuse(nb, st, err.msg);
            return true;
        }
    }
    if (nb->failed)
        return batch_drained(nb, h);
    /* Completion first: an asynchronous error (or abort) of a communicator seen now may
     * come from a later batch, and must not fail this one once its work is done. */
    if (events_complete(h, nb))
        return true; /* ops keep the status issue() gave them: CCQ_OK unless refused */

    for (uint32_t k = 0; k < nb->ncomms; k++) {
        nccl_comm *c = nb->comms[k];
        if (c->aborted) {
            batch_fail(h, nb, CCQ_ERR_ABORTED, "the communicator was aborted");
            return batch_drained(nb, h);
        }
        for (uint32_t i = 0; i < c->n; i++) {
            ncclResult_t st = ncclSuccess, r = ncclCommGetAsyncError(c->comms[i], &st);
            if (r != ncclSuccess)
                st = r;
            if (st == ncclInProgress) {
                enqueuing = true;
            } else if (st != ncclSuccess) {
                nccl_msg(&err, "asynchronous error", st, c->comms[i]);
                /* A peer process gone (or unreachable): revoked rather than aborted, so the
                 * survivors can shrink it (runtime/health/ tells them it is lost). */
                if (st == ncclRemoteError && NCCL_HAS_SHRINK &&
                    h->version >= NCCL_VERSION(2, 28, 0))
                    c->revoked = true;
                batch_fail(h, nb, nccl_status(st) == CCQ_OK ? CCQ_ERR_BACKEND : nccl_status(st),
                           err.msg);
                return batch_drained(nb, h);
            }
        }
    }
    if (nb->state == NB_ENQUEUING) {
        if (enqueuing)
            return false;
        if (record_done(h, nb, &err) != CCQ_OK) {
            batch_fail(h, nb, CCQ_ERR_BACKEND, err.msg);
            return batch_drained(nb, h);
        }
        nb->state = NB_RUNNING;
    }
    for (uint32_t k = 0; k < nb->nstreams; k++) {
        cudaError_t e = cudaEventQuery(h->streams[nb->streams[k]].done);
        if (e == cudaErrorNotReady)
            return false;
        if (e != cudaSuccess) {
            snprintf(err.msg, sizeof err.msg, "cudaEventQuery: %s (%s)", cudaGetErrorString(e),
                     cudaGetErrorName(e));
            batch_fail(h, nb, CCQ_ERR_BACKEND, err.msg);
            return batch_drained(nb, h);
        }
    }
    return true; /* ops keep the status issue() gave them: CCQ_OK unless refused */
}

static ccq_be_batch *nccl_poll(ccq_backend *be)
{
    nccl_be *h = to_nccl(be);
    ccq_be_batch *done = NULL;

    if (h->mo.nrepair > 0)
        counters_repair(h);

    /* In issue order, so a waiting batch launches after the earlier ones it waits for. */
    h->inflight_tail = NULL;
    for (nccl_batch **pp = &h->inflight; *pp != NULL;) {
        nccl_batch *nb = *pp;
        if (!batch_poll(h, nb)) {
            h->inflight_tail = nb;
            pp = &nb->next;
            continue;
        }
        *pp = nb->next;
        fuse_ended(nb);
        scratch_put(h, nb);
        nb->b->be_priv = NULL;
        nb->b->next_done = done;
        done = nb->b;
        nb_free(nb);
    }
    return done;
}

/* ------------------------------------------------------------------------------------ */
/* Memory for tools and tests (user threads; the caller's current device is restored)    */
/* ------------------------------------------------------------------------------------ */

static ccq_status nccl_mem_alloc(ccq_backend *be, ccq_device_id device, size_t bytes, void **out,
                                 ccq_errbuf *err)
{
    const nccl_be *h = to_nccl(be);
    ccq_status status = CCQ_OK;
    ctx_saved prev;
    *out = NULL;
    ctx_save(h, &prev);
    CUDA_CHECK_GOTO(cudaSetDevice((int)device), err, status, restore);
    CUDA_CHECK_GOTO(cudaMalloc(out, bytes ? bytes : 1), err, status, restore);
restore:
    ctx_restore(h, &prev);
    return status;
}

static void nccl_mem_free(ccq_backend *be, ccq_device_id device, void *ptr)
{
    const nccl_be *h = to_nccl(be);
    ctx_saved prev;
    ctx_save(h, &prev);
    if (cudaSetDevice((int)device) == cudaSuccess)
        cudaFree(ptr);
    ctx_restore(h, &prev);
}

static ccq_status nccl_mem_copy(ccq_backend *be, ccq_device_id device, void *dst, const void *src,
                                size_t bytes, int to_device, ccq_errbuf *err)
{
    const nccl_be *h = to_nccl(be);
    ccq_status status = CCQ_OK;
    ctx_saved prev;
    ctx_save(h, &prev);
    CUDA_CHECK_GOTO(cudaSetDevice((int)device), err, status, restore);
    CUDA_CHECK_GOTO(
        cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost),
        err, status, restore);
restore:
    ctx_restore(h, &prev);
    return status;
}

const ccq_backend_ops ccq_nccl_backend_ops = {
    .name = "nccl",
    .create = nccl_create,
    .destroy = nccl_destroy,
    .device_count = nccl_device_count,
    .comm_root_blob = nccl_comm_root_blob,
    .comm_member_blob = nccl_comm_member_blob,
    .comm_create = nccl_comm_create,
    .comm_test = nccl_comm_test,
    .comm_destroy = nccl_comm_destroy,
    .issue = nccl_issue,
    .poll = nccl_poll,
    .abort = nccl_abort,
    .revoke = nccl_revoke,
    .comm_shrink = nccl_comm_shrink,
    .comm_shrinkable = nccl_comm_shrinkable,
    .poll_interval_ns = NCCL_POLL_INTERVAL_NS,
    /* NCCL plans each group per communicator from all its collectives (enqueue.cc: the
     * aggregation of sizes within 4x for algorithm and protocol, the channel split by the
     * group's traffic): one spanning collective per group unless the processes agree. */
    .span_group_limit = 1,
    .check = nccl_check,
    .submit = nccl_submit,
    .fence = nccl_fence,
    .bind_stream = nccl_bind_stream,
    .stream_wait = nccl_stream_wait,
    .stream_ended = nccl_stream_ended,
    .mem_alloc = nccl_mem_alloc,
    .mem_free = nccl_mem_free,
    .mem_copy = nccl_mem_copy,
};
