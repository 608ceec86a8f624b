/* The CUDA + NCCL backend: one NCCL communicator per local device of a set, one
 * ncclGroupStart/ncclGroupEnd per batch, stream ordering through CUDA events, completion
 * and asynchronous errors polled from the scheduler thread. The only file in ccq that
 * includes CUDA or NCCL headers. */
#define _GNU_SOURCE
#include <inttypes.h>
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

/* How long a failed batch waits for the GPU to drain its work when timeout_ms is 0. */
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
    uint32_t n;
    int *devs;         /* CUDA device of each rank */
    ncclComm_t *comms; /* one per rank (all ranks are local) */
    bool aborted;      /* scheduler only */
} nccl_comm;

/* Per ccq stream. `user` and `slot_events` are written by bind (a user thread, while the
 * stream is idle) and read by submit hooks and the scheduler; the rest is scheduler-only,
 * except `done` which the fence hook reads (CUDA calls on it are thread-safe). */
typedef struct nccl_stream {
    _Atomic(cudaStream_t) user;
    cudaEvent_t *slot_events; /* [ring_size]: submission events, created at bind */
    cudaStream_t comm;        /* where NCCL runs this stream's work; created on first use */
    cudaEvent_t done;         /* recorded after each batch on `comm` */
    _Atomic uint32_t done_recorded;
    uint64_t batch_mark; /* scheduler scratch: last batch that listed this stream */
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

enum { NB_ENQUEUING, NB_RUNNING };

/* Per-batch state, in be_priv. */
typedef struct nccl_batch {
    ccq_be_batch *b;
    struct nccl_batch *next;
    int state;
    bool failed;             /* batch_fail ran: now only waiting for the GPU to drain */
    uint64_t drain_deadline; /* when a failed batch is returned even if not drained */
    uint32_t nstreams, ncomms;
    uint32_t *streams;     /* stream indices used */
    uint64_t *stream_done; /* [nstreams]: the parts' stream_done (GPU-side wait counters) */
    nccl_comm **comms;     /* distinct communicators used */
} nccl_batch;

typedef struct nccl_be {
    ccq_backend base;
    ccq_be_hooks hooks;
    int ndev;
    int *cc_major;
    int version; /* ncclGetVersion(): all_to_all, gather and scatter need 2.28 */
    uint32_t max_streams, ring_size;
    uint64_t timeout_ns;
    nccl_stream *streams; /* [ndev * max_streams] */
    nccl_batch *inflight; /* scheduler only */
    uint64_t batch_mark;
    nccl_memops mo;
} nccl_be;

static nccl_be *to_nccl(ccq_backend *be)
{
    return ccq_container_of(be, nccl_be, base);
}

/* GPU-side waits (defined with ccq_nccl_stream_wait's hook below). */
static void memops_init(nccl_be *h);
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
    int prev = -1;

    (void)cudaGetDevice(&prev);
    memops_fini(h);

    for (uint32_t i = 0; h->streams != NULL && i < nstreams; i++) {
        nccl_stream *s = &h->streams[i];
        int dev = (int)(i / h->max_streams);
        free_stream_events(h, s, dev);
        cudaSetDevice(dev);
        if (s->done != NULL)
            cudaEventDestroy(s->done);
        if (s->comm != NULL)
            cudaStreamDestroy(s->comm);
    }
    if (prev >= 0)
        cudaSetDevice(prev);
    free(h->streams);
    free(h->cc_major);
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
    h->hooks = *hooks;
    h->ndev = ndev;
    h->version = version;
    h->max_streams = cfg->max_streams;
    h->ring_size = ccq_ring_size(cfg->queue_depth);
    h->timeout_ns = cfg->timeout_ms ? cfg->timeout_ms * 1000000ull : NCCL_INIT_TIMEOUT_NS;
    h->cc_major = calloc((size_t)ndev, sizeof *h->cc_major);
    h->streams = calloc((size_t)ndev * h->max_streams, sizeof *h->streams);
    if (h->cc_major == NULL || h->streams == NULL) {
        nccl_destroy(&h->base);
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    for (int d = 0; d < ndev; d++) {
        if (cudaDeviceGetAttribute(&h->cc_major[d], cudaDevAttrComputeCapabilityMajor, d) !=
            cudaSuccess)
            h->cc_major[d] = 0;
    }
    for (uint32_t i = 0; i < (uint32_t)ndev * h->max_streams; i++)
        atomic_init(&h->streams[i].user, NULL);
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

static void comm_free(nccl_comm *c)
{
    free(c->devs);
    free(c->comms);
    free(c);
}

/* Wait (polling) until no communicator of the set is ncclInProgress; the first error wins. */
static ncclResult_t wait_comms(ncclComm_t *comms, uint32_t n, uint64_t timeout_ns,
                               ncclComm_t *failed)
{
    uint64_t deadline = ccq_now_ns() + timeout_ns;
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

static ccq_status nccl_comm_create(ccq_backend *be, const ccq_device_id *devices, uint32_t n,
                                   ccq_be_comm **out, ccq_errbuf *err)
{
    nccl_be *h = to_nccl(be);
    nccl_comm *c = calloc(1, sizeof *c);
    ncclUniqueId id;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ccq_status st = CCQ_OK;
    ncclComm_t failed = NULL;
    ncclResult_t r;
    bool group_open = false;

    if (c == NULL || (c->devs = calloc(n, sizeof *c->devs)) == NULL ||
        (c->comms = calloc(n, sizeof *c->comms)) == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        if (c != NULL)
            comm_free(c);
        return CCQ_ERR_NO_MEMORY;
    }
    c->n = n;
    for (uint32_t i = 0; i < n; i++)
        c->devs[i] = (int)devices[i]; /* sorted and duplicate-free (the runtime checked) */
    config.blocking = 0;              /* so a hung peer can never block the scheduler */

    NCCL_CHECK_GOTO(ncclGetUniqueId(&id), err, st, fail);
    NCCL_CHECK_GOTO(ncclGroupStart(), err, st, fail);
    group_open = true;
    for (uint32_t i = 0; i < n; i++) {
        CUDA_CHECK_GOTO(cudaSetDevice(c->devs[i]), err, st, fail);
        NCCL_CHECK_GOTO(ncclCommInitRankConfig(&c->comms[i], (int)n, id, (int)i, &config), err, st,
                        fail);
    }
    group_open = false;
    NCCL_CHECK_GOTO(ncclGroupEnd(), err, st, fail);
    r = wait_comms(c->comms, n, h->timeout_ns, &failed);
    if (r == ncclInProgress) {
        st = CCQ_ERR_TIMEOUT;
        snprintf(err->msg, sizeof err->msg,
                 "ncclCommInitRankConfig did not finish within timeout_ms");
        goto fail;
    }
    if (r != ncclSuccess) {
        st = nccl_status(r);
        nccl_msg(err, "ncclCommInitRankConfig", r, failed);
        goto fail;
    }
    *out = (ccq_be_comm *)c;
    return CCQ_OK;

fail:
    if (group_open)
        ncclGroupEnd();
    for (uint32_t i = 0; i < n; i++)
        if (c->comms[i] != NULL)
            ncclCommAbort(c->comms[i]);
    comm_free(c);
    return st == CCQ_OK ? CCQ_ERR_BACKEND : st;
}

/* At ccq_runtime_destroy, on its thread, after the scheduler stopped. A communicator in
 * error refuses ncclCommDestroy (and would leak): abort those instead. */
static void nccl_comm_destroy(ccq_backend *be, ccq_be_comm *comm)
{
    nccl_comm *c = (nccl_comm *)comm;
    (void)be;
    for (uint32_t i = 0; !c->aborted && i < c->n; i++) {
        ncclResult_t st = ncclSuccess;
        if (c->comms[i] == NULL)
            continue;
        if (ncclCommGetAsyncError(c->comms[i], &st) != ncclSuccess || st != ncclSuccess)
            ncclCommAbort(c->comms[i]);
        else
            ncclCommDestroy(c->comms[i]);
    }
    comm_free(c);
}

static void abort_comm(nccl_comm *c)
{
    if (c->aborted)
        return;
    c->aborted = true;
    /* ncclCommAbort stops the communicator's kernels and frees it; it is the documented
     * way out of a hang (ncclCommDestroy would wait for the work). */
    for (uint32_t i = 0; i < c->n; i++)
        if (c->comms[i] != NULL)
            ncclCommAbort(c->comms[i]);
}

static void nccl_abort(ccq_backend *be, ccq_be_comm *comm)
{
    (void)be;
    abort_comm((nccl_comm *)comm);
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
    if (fp8 && reduces && h->cc_major[s->device] < 9) {
        snprintf(err->msg, sizeof err->msg,
                 "NCCL reduces fp8 only on compute capability 9.0 (sm90) or newer; device %u is "
                 "%d.x (moving fp8 data without reducing it works everywhere)",
                 s->device, h->cc_major[s->device]);
        return CCQ_ERR_UNSUPPORTED;
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
    int prev = 0;

    if (native == NULL) {
        atomic_store_explicit(&st->user, NULL, memory_order_release);
        return CCQ_OK;
    }
    if (st->slot_events == NULL) {
        cudaEvent_t *ev = calloc(h->ring_size, sizeof *ev);
        if (ev == NULL) {
            snprintf(err->msg, sizeof err->msg, "out of memory");
            return CCQ_ERR_NO_MEMORY;
        }
        /* Events belong to the device current at creation: switch, then restore the
         * caller's device. */
        CUDA_CHECK_GOTO(cudaGetDevice(&prev), err, status, fail);
        CUDA_CHECK_GOTO(cudaSetDevice((int)device), err, status, fail);
        for (uint32_t i = 0; i < h->ring_size; i++)
            CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming), err, status,
                            fail_restore);
        cudaSetDevice(prev);
        st->slot_events = ev;
        goto bound;
    fail_restore:
        for (uint32_t i = 0; i < h->ring_size; i++)
            if (ev[i] != NULL)
                cudaEventDestroy(ev[i]);
        cudaSetDevice(prev);
    fail:
        free(ev);
        return status;
    }
bound:
    atomic_store_explicit(&st->user, (cudaStream_t)native, memory_order_release);
    return CCQ_OK;
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

/* User thread: queue the wait (see backend.h). */
static ccq_status nccl_stream_wait(ccq_backend *be, ccq_device_id device, uint32_t stream_index,
                                   void *native, uint64_t target, const _Atomic uint64_t *ended,
                                   ccq_errbuf *err)
{
    nccl_be *h = to_nccl(be);
    nccl_stream *st = &h->streams[stream_index];

    if (atomic_load_explicit(&h->mo.state, memory_order_acquire) == 0) {
        pthread_mutex_lock(&h->mo.lock);
        if (atomic_load_explicit(&h->mo.state, memory_order_relaxed) == 0)
            memops_setup(h);
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
    _Atomic uint64_t *c = counter_of(h, stream_index);
    /* Arm, then read the count: either the scheduler sees the stream armed when it next
     * publishes (and writes), or this thread sees what it published (and writes it). */
    atomic_store_explicit(&st->waited, 1, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    counter_raise(c, atomic_load_explicit(ended, memory_order_acquire));
    CUresult r = h->mo.wait((CUstream)native, h->mo.dctr + (CUdeviceptr)stream_index * 8u, target,
                            CU_STREAM_WAIT_VALUE_GEQ);
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

/* The stream NCCL runs a ccq stream's work on, created on first use. */
static ccq_status stream_ready(nccl_stream *st, int dev, ccq_errbuf *err)
{
    ccq_status status = CCQ_OK;
    if (st->comm != NULL)
        return CCQ_OK;
    CUDA_CHECK_GOTO(cudaSetDevice(dev), err, status, fail);
    CUDA_CHECK_GOTO(cudaStreamCreateWithFlags(&st->comm, cudaStreamNonBlocking), err, status, fail);
    CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&st->done, cudaEventDisableTiming), err, status, fail);
    return CCQ_OK;
fail:
    if (st->comm != NULL)
        cudaStreamDestroy(st->comm);
    st->comm = NULL;
    return status;
}

static void nb_free(nccl_batch *nb)
{
    free(nb->streams);
    free(nb->stream_done);
    free(nb->comms);
    free(nb);
}

/* One completion event per stream used, recorded after the group's work. */
static ccq_status record_done(nccl_be *h, nccl_batch *nb, ccq_errbuf *err)
{
    ccq_status status = CCQ_OK;
    for (uint32_t k = 0; k < nb->nstreams; k++) {
        nccl_stream *st = &h->streams[nb->streams[k]];
        /* Before the event: once the host sees the batch complete, the counter is there. */
        status = counter_write_after(h, nb->streams[k], nb->stream_done[k], err);
        if (status != CCQ_OK)
            goto fail;
        CUDA_CHECK_GOTO(cudaEventRecord(st->done, st->comm), err, status, fail);
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

/*
 * Non-blocking communicators: while a group's launch is still in progress (ncclGroupEnd
 * returned ncclInProgress: an in-flight batch in NB_ENQUEUING, on other ccq streams, since a
 * stream has one batch in flight), NCCL refuses any other call on its communicators with
 * ncclInvalidArgument. Before nb uses such a communicator, wait until it leaves
 * ncclInProgress (a launch takes microseconds to milliseconds), at most timeout_ms.
 */
static ccq_status settle_comms(nccl_be *h, const nccl_batch *nb, ccq_errbuf *err)
{
    for (const nccl_batch *a = h->inflight; a != NULL; a = a->next) {
        if (a->state != NB_ENQUEUING)
            continue;
        for (uint32_t j = 0; j < a->ncomms; j++) {
            nccl_comm *c = a->comms[j];
            bool shared = false;
            for (uint32_t k = 0; k < nb->ncomms && !shared; k++)
                shared = nb->comms[k] == c;
            if (!shared || c->aborted)
                continue;
            ncclComm_t failed = NULL;
            ncclResult_t r = wait_comms(c->comms, c->n, h->timeout_ns, &failed);
            if (r == ncclInProgress) {
                snprintf(err->msg, sizeof err->msg,
                         "a communicator of this batch was still launching batch %" PRIu64
                         " (ncclInProgress) after timeout_ms",
                         a->b->id);
                return CCQ_ERR_TIMEOUT;
            }
            if (r != ncclSuccess) {
                ccq_status st = nccl_status(r);
                nccl_msg(err, "asynchronous error", r, failed);
                return st == CCQ_OK ? CCQ_ERR_BACKEND : st;
            }
        }
    }
    return CCQ_OK;
}

static ccq_status nccl_issue(ccq_backend *be, ccq_be_batch *b, ccq_errbuf *err)
{
    nccl_be *h = to_nccl(be);
    nccl_batch *nb = calloc(1, sizeof *nb);
    ccq_status status = CCQ_OK;
    uint32_t nparts = 0;
    bool group_open = false;
    int cur = -1; /* the device made current last (-1: not known) */
    ncclResult_t r;

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

    /* Streams and communicators the batch uses; each stream's NCCL stream first waits for
     * the events its commands recorded on the caller's stream at submission. */
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
        for (uint32_t j = 0; j < nb->ncomms && !seen; j++)
            seen = nb->comms[j] == c;
        if (!seen)
            nb->comms[nb->ncomms++] = c;
        for (uint32_t p = 0; p < op->nparts; p++) {
            const ccq_be_part *part = &op->parts[p];
            nccl_stream *st = &h->streams[part->stream_index];
            cudaStream_t user = atomic_load_explicit(&st->user, memory_order_acquire);
            status = stream_ready(st, (int)part->device, err);
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

    status = settle_comms(h, nb, err);
    if (status != CCQ_OK)
        goto fail;

    /* The whole batch is one group: every local rank's part of each collective and both
     * halves of each send/recv, so NCCL launches them together and rings cannot deadlock. */
    NCCL_CHECK_GOTO(ncclGroupStart(), err, status, fail);
    group_open = true;
    for (uint32_t k = 0; k < b->nops; k++) {
        ccq_be_op *op = b->ops[k];
        nccl_comm *c = (nccl_comm *)op->comm;
        ncclDataType_t dt = dtype_map[op->dtype];
        if (op->status != CCQ_OK)
            continue; /* refused above */
        if (op->kind == CCQ_KIND_SEND) {
            /* part 0 sends to part 1's rank, part 1 receives from part 0's */
            const ccq_be_part *snd = &op->parts[0], *rcv = &op->parts[1];
            CUDA_CHECK_GOTO(set_device(&cur, (int)snd->device), err, status, fail);
            NCCL_CHECK_GOTO(ncclSend(snd->src, op->count, dt, (int)rcv->rank, c->comms[snd->rank],
                                     h->streams[snd->stream_index].comm),
                            err, status, fail);
            CUDA_CHECK_GOTO(set_device(&cur, (int)rcv->device), err, status, fail);
            NCCL_CHECK_GOTO(ncclRecv(rcv->dst, op->count, dt, (int)snd->rank, c->comms[rcv->rank],
                                     h->streams[rcv->stream_index].comm),
                            err, status, fail);
            continue;
        }
        /* A collective: every local rank's part, in rank order, inside this one group. */
        for (uint32_t p = 0; p < op->nparts; p++) {
            const ccq_be_part *part = &op->parts[p];
            ncclComm_t comm = c->comms[part->rank];
            cudaStream_t cs = h->streams[part->stream_index].comm;
            ncclRedOp_t ro = op_map[op->redop];
            int root = (int)op->root;
            CUDA_CHECK_GOTO(set_device(&cur, (int)part->device), err, status, fail);
            switch (op->kind) {
            case CCQ_KIND_ALL_REDUCE:
                NCCL_CHECK_GOTO(ncclAllReduce(part->src, part->dst, op->count, dt, ro, comm, cs),
                                err, status, fail);
                break;
            case CCQ_KIND_BROADCAST:
                NCCL_CHECK_GOTO(ncclBroadcast(part->src, part->dst, op->count, dt, root, comm, cs),
                                err, status, fail);
                break;
            case CCQ_KIND_REDUCE:
                NCCL_CHECK_GOTO(ncclReduce(part->src, part->dst, op->count, dt, ro, root, comm, cs),
                                err, status, fail);
                break;
            case CCQ_KIND_ALL_GATHER:
                NCCL_CHECK_GOTO(ncclAllGather(part->src, part->dst, op->count, dt, comm, cs), err,
                                status, fail);
                break;
            case CCQ_KIND_REDUCE_SCATTER:
                NCCL_CHECK_GOTO(
                    ncclReduceScatter(part->src, part->dst, op->count, dt, ro, comm, cs), err,
                    status, fail);
                break;
#if NCCL_HAS_228_COLLECTIVES
            case CCQ_KIND_ALL_TO_ALL:
                NCCL_CHECK_GOTO(ncclAlltoAll(part->src, part->dst, op->count, dt, comm, cs), err,
                                status, fail);
                break;
            case CCQ_KIND_GATHER:
                NCCL_CHECK_GOTO(ncclGather(part->src, part->dst, op->count, dt, root, comm, cs),
                                err, status, fail);
                break;
            case CCQ_KIND_SCATTER:
                NCCL_CHECK_GOTO(ncclScatter(part->src, part->dst, op->count, dt, root, comm, cs),
                                err, status, fail);
                break;
#endif
            default:
                status = CCQ_ERR_UNSUPPORTED;
                snprintf(err->msg, sizeof err->msg, "operation kind %u", op->kind);
                goto fail;
            }
        }
    }
    group_open = false;
    r = ncclGroupEnd();
    if (r == ncclInProgress) {
        /* Non-blocking communicators: the launch completes in the background; poll()
         * records the completion events once every communicator left ncclInProgress. */
        nb->state = NB_ENQUEUING;
    } else if (r != ncclSuccess) {
        status = nccl_status(r);
        nccl_msg(err, "ncclGroupEnd", r, NULL);
        goto fail;
    } else {
        status = record_done(h, nb, err);
        if (status != CCQ_OK)
            goto fail;
        nb->state = NB_RUNNING;
    }
    b->be_priv = nb;
    nb->next = h->inflight;
    h->inflight = nb;
    return CCQ_OK;

fail:
    if (group_open) {
        ncclGroupEnd();
        /* NCCL's group cleanup may leave the error of a call that failed inside the group
         * as the asynchronous error of the group's communicators, which then refuse every
         * further call: abort those, so their later work fails fast with CCQ_ERR_ABORTED. */
        for (uint32_t k = 0; k < nb->ncomms; k++) {
            nccl_comm *c = nb->comms[k];
            for (uint32_t i = 0; i < c->n && !c->aborted; i++) {
                ncclResult_t st = ncclSuccess;
                if (ncclCommGetAsyncError(c->comms[i], &st) != ncclSuccess ||
                    (st != ncclSuccess && st != ncclInProgress))
                    abort_comm(c);
            }
        }
        for (uint32_t k = 0; k < b->nops; k++)
            if (((nccl_comm *)b->ops[k]->comm)->aborted)
                b->ops[k]->comm_aborted = 1;
    }
    nb_free(nb);
    return status == CCQ_OK ? CCQ_ERR_BACKEND : status;
}

/* Fail a batch whose group hit an error: abort every communicator it used (their other
 * work cannot be trusted), keep NCCL's message. The batch is returned only once the GPU no
 * longer touches its buffers (see batch_drained), so completion events are recorded now if
 * the group's launch had not got that far. */
static void batch_fail(nccl_be *h, nccl_batch *nb, ccq_status st, const char *msg)
{
    ccq_be_batch *b = nb->b;
    for (uint32_t k = 0; k < nb->ncomms; k++)
        abort_comm(nb->comms[k]);
    b->status = st;
    snprintf(b->detail.msg, sizeof b->detail.msg, "%s", msg);
    for (uint32_t k = 0; k < b->nops; k++) {
        b->ops[k]->status = st;
        b->ops[k]->comm_aborted = 1;
    }
    nb->failed = true;
    nb->drain_deadline = ccq_now_ns() + (h->timeout_ns ? h->timeout_ns : NCCL_DRAIN_MAX_NS);
    if (nb->state == NB_ENQUEUING) {
        ccq_errbuf e;
        if (record_done(h, nb, &e) == CCQ_OK)
            nb->state = NB_RUNNING;
    }
}

/*
 * A failed batch is returned once its streams' completion events have completed: an abort
 * makes NCCL's kernels exit, but work queued for the batch (for instance behind a bound
 * user stream) may still run and write its buffers. If that has not happened by the drain
 * deadline (timeout_ms after the failure), it is returned anyway, saying so in the detail.
 * A stream whose event cannot be queried does not hold the batch.
 */
static bool batch_drained(nccl_batch *nb, nccl_be *h)
{
    ccq_be_batch *b = nb->b;
    if (nb->state != NB_RUNNING)
        return true; /* no completion event was recorded: nothing to wait for */
    for (uint32_t k = 0; k < nb->nstreams; k++) {
        if (cudaEventQuery(h->streams[nb->streams[k]].done) != cudaErrorNotReady)
            continue;
        if (ccq_now_ns() < nb->drain_deadline)
            return false;
        size_t len = strlen(b->detail.msg);
        snprintf(b->detail.msg + len, sizeof b->detail.msg - len,
                 "; the GPU had not finished this batch's queued work timeout_ms after the "
                 "failure: its buffers may still change");
        return true;
    }
    return true;
}

/* Advance one batch; true when it is finished (completed or failed). */
static bool batch_poll(nccl_be *h, nccl_batch *nb)
{
    ccq_errbuf err = {{0}};
    bool enqueuing = false;

    if (nb->failed)
        return batch_drained(nb, h);

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

    for (nccl_batch **pp = &h->inflight; *pp != NULL;) {
        nccl_batch *nb = *pp;
        if (!batch_poll(h, nb)) {
            pp = &nb->next;
            continue;
        }
        *pp = nb->next;
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
    ccq_status status = CCQ_OK;
    int prev = 0;
    (void)be;
    *out = NULL;
    CUDA_CHECK_GOTO(cudaGetDevice(&prev), err, status, done);
    CUDA_CHECK_GOTO(cudaSetDevice((int)device), err, status, done);
    CUDA_CHECK_GOTO(cudaMalloc(out, bytes ? bytes : 1), err, status, restore);
restore:
    cudaSetDevice(prev);
done:
    return status;
}

static void nccl_mem_free(ccq_backend *be, ccq_device_id device, void *ptr)
{
    int prev = 0;
    (void)be;
    if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice((int)device) == cudaSuccess) {
        cudaFree(ptr);
        cudaSetDevice(prev);
    }
}

static ccq_status nccl_mem_copy(ccq_backend *be, ccq_device_id device, void *dst, const void *src,
                                size_t bytes, int to_device, ccq_errbuf *err)
{
    ccq_status status = CCQ_OK;
    int prev = 0;
    (void)be;
    CUDA_CHECK_GOTO(cudaGetDevice(&prev), err, status, done);
    CUDA_CHECK_GOTO(cudaSetDevice((int)device), err, status, done);
    CUDA_CHECK_GOTO(
        cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost),
        err, status, restore);
restore:
    cudaSetDevice(prev);
done:
    return status;
}

const ccq_backend_ops ccq_nccl_backend_ops = {
    .name = "nccl",
    .create = nccl_create,
    .destroy = nccl_destroy,
    .device_count = nccl_device_count,
    .comm_create = nccl_comm_create,
    .comm_destroy = nccl_comm_destroy,
    .issue = nccl_issue,
    .poll = nccl_poll,
    .abort = nccl_abort,
    .poll_interval_ns = NCCL_POLL_INTERVAL_NS,
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
