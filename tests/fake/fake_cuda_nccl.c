/* The fake CUDA runtime and NCCL for tests (see fake_cuda_nccl.h): call log, scripts,
 * handles, and group execution on host memory. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "backends/host/reduce.h"
#include "fake/fake_cuda_nccl.h"
#include "fake/fake_xproc.h"

#define FAKE_MAX_DEV     16
#define FAKE_MAX_RANKS   16
#define FAKE_MAX_SCRIPTS 64

/* Handles are never freed before fake_reset(), so a use after destroy is caught, not a
 * crash. */
struct CUstream_st {
    int device;
    int priority; /* cudaStreamCreateWithPriority's (0: the default) */
    int hwq;      /* its hardware queue on its device: creation order mod the connections */
    bool destroyed, user;
    bool mo_blocked;   /* memops pump: an earlier item of this stream cannot run yet */
    size_t mo_pending; /* items queued on it that have not run (stream memory operations) */
    struct CUstream_st *next;
};

struct CUevent_st {
    int device;
    bool recorded, complete, destroyed;
    bool stuck;  /* recorded behind work of a failed collective: completes only on abort */
    bool queued; /* its record waits behind unfinished work of its stream (MO_RECORD) */
    struct CUevent_st *next;
};

/* "Device memory" is host memory, so collectives and copies can really run on it. */
typedef struct fake_mem {
    char *ptr;
    size_t bytes;
    int device;
    bool freed;
    struct fake_mem *next;
} fake_mem;

typedef struct fake_clique {
    ncclUniqueId id;
    int nranks;
    ncclComm_t ranks[FAKE_MAX_RANKS];
    fake_xp_clique *xp; /* ranks in other processes: fake_xproc.c's view; NULL: none */
    struct fake_clique *next;
} fake_clique;

struct ncclComm {
    fake_clique *clique;
    int rank, device, pending;
    ncclResult_t async; /* sticky, reported once pending reaches 0 */
    bool destroyed, aborted;
    bool hung; /* launched its part of a collective whose other parts never came */
    /* NCCL_RUNTIME_CONNECT: a rank of a clique with ranks in other processes connects to its
     * peers in its first launch, which stays ncclInProgress until every rank launched one
     * (fake_set_runtime_connect). */
    bool connected, connecting;
    long long launch_until;     /* a launch lasts until then (fake_set_launch_in_progress) */
    long long connect_deadline; /* connecting: ncclSystemError after this (fake_xp_deadline) */
    bool launching;             /* in a group whose ncclGroupEnd returned ncclInProgress, until
                                   ncclCommGetAsyncError reports the launch finished */
    /* The streams its launching group puts work on: NCCL's launch thread enqueues the
     * kernels there later, so an event recorded there meanwhile does not cover them. */
    cudaStream_t lstream[16];
    int nlstream;
    bool blocking; /* config->blocking (fake_xproc.c's joins wait when set) */
    bool revoked;  /* ncclCommRevoke: no more work on it; it can still be shrunk */
    int shrinks;   /* ncclCommShrink calls on it (the k-th makes the same id everywhere) */
    struct ncclComm *next;
};

/* Kinds of calls a group collects; the collectives come last (see is_coll()). */
enum {
    OP_INIT,
    OP_SEND,
    OP_RECV,
    OP_ALLREDUCE,
    OP_BROADCAST,
    OP_REDUCE,
    OP_ALLGATHER,
    OP_REDUCESCATTER,
    OP_ALLTOALL,
    OP_GATHER,
    OP_SCATTER,
    OP_KINDS_
};

/* Which ranks use a collective's buffer. */
enum { USE_ALL = 1, USE_ROOT = 2 };

/* NCCL's definitions of the collectives (nccl.h): who reads sendbuff and writes recvbuff,
 * and which of the two holds count * nranks elements rather than count. */
static const struct coll_info {
    const char *fn;
    bool reduces, rooted;
    unsigned char src_use, dst_use;
    bool src_n, dst_n;
} coll_info[OP_KINDS_] = {
    [OP_ALLREDUCE] = {"ncclAllReduce", true, false, USE_ALL, USE_ALL, false, false},
    [OP_BROADCAST] = {"ncclBroadcast", false, true, USE_ROOT, USE_ALL, false, false},
    [OP_REDUCE] = {"ncclReduce", true, true, USE_ALL, USE_ROOT, false, false},
    [OP_ALLGATHER] = {"ncclAllGather", false, false, USE_ALL, USE_ALL, false, true},
    [OP_REDUCESCATTER] = {"ncclReduceScatter", true, false, USE_ALL, USE_ALL, true, false},
    [OP_ALLTOALL] = {"ncclAlltoAll", false, false, USE_ALL, USE_ALL, true, true},
    [OP_GATHER] = {"ncclGather", false, true, USE_ALL, USE_ROOT, false, true},
    [OP_SCATTER] = {"ncclScatter", false, true, USE_ROOT, USE_ALL, true, false},
};

static bool is_coll(int kind)
{
    return kind >= OP_ALLREDUCE && kind < OP_KINDS_;
}

/* A call collected by the open group. The lead op of a matched unit holds its partners. */
typedef struct fake_op {
    int kind;
    ncclComm_t comm;
    const void *src;
    void *dst;
    size_t count;
    ncclDataType_t dtype;
    ncclRedOp_t redop;
    int peer, root;
    bool matched, lead;
    bool ran; /* a one-rank collective, already run at its call (NCCL does not defer it) */
    size_t unit[FAKE_MAX_RANKS]; /* collectives: op index per rank; send: [0] = its recv */
    cudaStream_t stream;
} fake_op;

/* NCCL keeps group state per thread; so does the fake. */
static _Thread_local struct {
    int depth;
    ncclResult_t err; /* first failed call inside the group */
    fake_op *ops;
    size_t n, cap;
} grp;
/* The calling thread's current context, as the driver keeps it (cuCtxGetCurrent): NULL
 * (none yet), a device's primary context (cudaSetDevice, or the runtime's implicit
 * initialisation on device 0), or a context the test made (fake_context_create). cur_dev
 * follows it: the runtime API's current device (0 without a context, as cudaGetDevice
 * says). Contexts live in static storage, so a thread's pointer survives fake_reset(). */
struct CUctx_st {
    int device;
    bool primary;
};
#define FAKE_MAX_USER_CTX 16
static struct CUctx_st primary_ctx[FAKE_MAX_DEV];
static struct CUctx_st user_ctx[FAKE_MAX_USER_CTX];
static int nuser_ctx;
static _Thread_local CUcontext cur_ctx;
static _Thread_local int cur_dev;

/* Everything else is guarded by fake_lock, held for the whole of every call. */
static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fake_abort_cond = PTHREAD_COND_INITIALIZER; /* abort_hold changed */
typedef struct fake_state {
    bool inited, hold, manual, abort_keeps;
    bool abort_hold;                /* ncclCommAbort blocks while set (fake_hold_abort) */
    bool complete_at_group;         /* fake_complete_events_at_next_group() */
    int aborts_blocked;             /* ncclCommAbort calls waiting on abort_hold */
    bool init_hold;                 /* ncclCommInitRankConfig blocks while set (fake_hold_init) */
    bool no_runtime_connect;        /* fake_set_runtime_connect(false) */
    bool launch_in_progress;        /* fake_set_launch_in_progress */
    long long launch_ns;            /* how long such a launch lasts */
    int connections;                /* hardware queues per device (CUDA_DEVICE_MAX_CONNECTIONS) */
    int nstreams_dev[FAKE_MAX_DEV]; /* streams created per device (their queue: mod that) */
    int inits_blocked;              /* ncclCommInitRankConfig calls waiting on init_hold */
    int ndev, cc[FAKE_MAX_DEV], version, pending;
    bool primary_used[FAKE_MAX_DEV]; /* a thread made the device's primary context current */
    bool capturing_all;              /* fake_set_capturing(NULL, true) */
    struct CUstream_st *capturing;   /* the stream fake_set_capturing marked */
    char last_error[256];
    struct {
        char fn[40];
        int result;
        bool live;
    } scripts[FAKE_MAX_SCRIPTS];
    size_t nscripts;
    struct {
        int rank;
        ncclResult_t err;
        bool live;
    } async[FAKE_MAX_SCRIPTS];
    size_t nasync;
    fake_call *log;
    size_t nlog, caplog;
    struct CUstream_st *streams;
    struct CUevent_st *events;
    struct ncclComm *comms;
    fake_mem *mems;
    fake_clique *cliques;
    unsigned long long next_id;
    int nerrors;
    char error[256];
} fake_state;
static fake_state F;

static void ctx_make_current(CUcontext ctx)
{
    cur_ctx = ctx;
    cur_dev = ctx != NULL ? ctx->device : 0;
}

/* A runtime call that needs a context on a thread without one initialises the runtime on
 * the current device (0): its primary context becomes current, as with CUDA's lazy
 * initialisation. Lock held. */
static void ctx_need(void)
{
    if (cur_ctx == NULL) {
        primary_ctx[cur_dev].device = cur_dev;
        primary_ctx[cur_dev].primary = true;
        F.primary_used[cur_dev] = true;
        ctx_make_current(&primary_ctx[cur_dev]);
    }
}

static void memops_reset_locked(void);
static void memops_complete_locked(void);
static void memops_abort_locked(int device, bool keep);
/* Work queued on streams (the "Driver entry points and stream memory operations" section):
 * whether an item queued on s now would wait (earlier work of s pending, or a wait blocking
 * its hardware queue); queue an event record, a wait for an event's record, a group. */
static bool stream_busy(cudaStream_t s);
static void memop_record(cudaEvent_t e, cudaStream_t s);
static void memop_evwait(cudaStream_t s, cudaEvent_t e);
struct fake_op;
static void memop_group(const struct fake_op *ops, size_t n);

static void free_all_locked(void)
{
    memops_reset_locked();
    fake_xp_reset();
    for (struct CUstream_st *s = F.streams, *n; s != NULL; s = n) {
        n = s->next;
        free(s);
    }
    for (struct CUevent_st *e = F.events, *n; e != NULL; e = n) {
        n = e->next;
        free(e);
    }
    for (struct ncclComm *c = F.comms, *n; c != NULL; c = n) {
        n = c->next;
        free(c);
    }
    for (fake_mem *m = F.mems, *n; m != NULL; m = n) {
        n = m->next;
        if (!m->freed)
            free(m->ptr);
        free(m);
    }
    for (fake_clique *q = F.cliques, *n; q != NULL; q = n) {
        n = q->next;
        free(q);
    }
    free(F.log);
    memset(&F, 0, sizeof F);
    F.inited = true;
    F.ndev = 4;
    for (int d = 0; d < FAKE_MAX_DEV; d++)
        F.cc[d] = 9;
    F.version = NCCL_VERSION_CODE;
    {
        /* CUDA's default is 8 connections, at most 32. */
        const char *env = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
        long n = env != NULL && *env != '\0' ? strtol(env, NULL, 10) : 8;
        F.connections = n < 1 ? 1 : n > 32 ? 32 : (int)n;
    }
}

static void lock(void)
{
    pthread_mutex_lock(&fake_lock);
    if (!F.inited)
        free_all_locked(); /* first use: the defaults */
}

static void unlock(void)
{
    pthread_mutex_unlock(&fake_lock);
}

/* A misuse the real libraries would punish: counted, kept, printed. Lock held. */
void fake_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(F.error, sizeof F.error, fmt, ap);
    va_end(ap);
    F.nerrors++;
    fprintf(stderr, "fake_cuda_nccl: %s\n", F.error);
}

/* Lock, log the call, and take its scripted result (0 = success when none). The entry
 * stays valid until leave(): nothing in between appends to the log. */
static fake_call *enter(const char *fn, int *result)
{
    fake_call *c;
    lock();
    if (F.nlog == F.caplog) {
        F.caplog = F.caplog ? F.caplog * 2 : 1024;
        F.log = realloc(F.log, F.caplog * sizeof *F.log);
        if (F.log == NULL)
            abort();
    }
    c = &F.log[F.nlog++];
    memset(c, 0, sizeof *c);
    c->fn = fn;
    c->thread = pthread_self();
    c->device = cur_dev;
    c->rank = c->nranks = c->peer = c->peer_device = c->root = -1;
    *result = 0;
    for (size_t i = 0; i < F.nscripts; i++) {
        if (F.scripts[i].live && strcmp(F.scripts[i].fn, fn) == 0) {
            F.scripts[i].live = false;
            *result = F.scripts[i].result;
            break;
        }
    }
    return c;
}

static int leave(fake_call *c, int result)
{
    c->result = result;
    unlock();
    return result;
}

static void set_comm(fake_call *c, ncclComm_t comm)
{
    c->comm = comm;
    if (comm != NULL) {
        c->rank = comm->rank;
        c->nranks = comm->clique->nranks;
        c->device = comm->device;
    }
}

static bool stream_ok(cudaStream_t s, const char *fn)
{
    if (s != NULL && s->destroyed) {
        fake_error("%s: stream %p used after cudaStreamDestroy", fn, (void *)s);
        return false;
    }
    return true;
}

static bool event_ok(cudaEvent_t e, const char *fn)
{
    if (e == NULL || e->destroyed) {
        fake_error("%s: event %p is NULL or destroyed", fn, (void *)e);
        return false;
    }
    return true;
}

static bool comm_ok(ncclComm_t c, const char *fn)
{
    if (c == NULL || c->destroyed || c->aborted) {
        fake_error("%s: communicator %p is NULL, destroyed or aborted", fn, (void *)c);
        return false;
    }
    return true;
}

/* An armed asynchronous error for this rank, consumed. */
static ncclResult_t take_async(int rank)
{
    for (size_t i = 0; i < F.nasync; i++) {
        if (F.async[i].live && F.async[i].rank == rank) {
            F.async[i].live = false;
            return F.async[i].err;
        }
    }
    return ncclSuccess;
}

/* ---- CUDA runtime ---- */

cudaError_t cudaGetDeviceCount(int *count)
{
    int r;
    fake_call *c = enter("cudaGetDeviceCount", &r);
    if (r == cudaSuccess)
        *count = c->value = F.ndev;
    return (cudaError_t)leave(c, r);
}

cudaError_t cudaGetDevice(int *device)
{
    int r;
    fake_call *c = enter("cudaGetDevice", &r);
    if (r == cudaSuccess)
        *device = cur_dev;
    return (cudaError_t)leave(c, r);
}

cudaError_t cudaSetDevice(int device)
{
    int r;
    fake_call *c = enter("cudaSetDevice", &r);
    c->device = device;
    if (r == cudaSuccess && (device < 0 || device >= F.ndev))
        r = cudaErrorInvalidDevice;
    if (r == cudaSuccess) {
        /* The device's primary context becomes the thread's current one (created on first
         * use), replacing whatever context was current. */
        primary_ctx[device].device = device;
        primary_ctx[device].primary = true;
        F.primary_used[device] = true;
        ctx_make_current(&primary_ctx[device]);
    }
    return (cudaError_t)leave(c, r);
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    int r;
    fake_call *c = enter("cudaDeviceGetAttribute", &r);
    c->device = device;
    c->value = (int)attr;
    if (r == cudaSuccess && (device < 0 || device >= F.ndev))
        r = cudaErrorInvalidDevice;
    if (r == cudaSuccess)
        *value = attr == cudaDevAttrComputeCapabilityMajor ? F.cc[device] : 0;
    return (cudaError_t)leave(c, r);
}

/* The few CUDA errors the tests use, with CUDA's own names and texts. */
static const struct {
    cudaError_t e;
    const char *name, *text;
} cuda_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
};

static size_t cuda_error_index(cudaError_t e)
{
    size_t n = sizeof cuda_errors / sizeof cuda_errors[0];
    for (size_t i = 0; i < n; i++)
        if (cuda_errors[i].e == e)
            return i;
    return n;
}

const char *cudaGetErrorName(cudaError_t error)
{
    int r;
    size_t i = cuda_error_index(error);
    leave(enter("cudaGetErrorName", &r), 0);
    return i < sizeof cuda_errors / sizeof cuda_errors[0] ? cuda_errors[i].name
                                                          : "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t error)
{
    int r;
    size_t i = cuda_error_index(error);
    leave(enter("cudaGetErrorString", &r), 0);
    return i < sizeof cuda_errors / sizeof cuda_errors[0] ? cuda_errors[i].text : "unknown error";
}

/* A new stream of the current device. Lock held. */
static struct CUstream_st *stream_new(int priority)
{
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (s == NULL)
        abort();
    ctx_need();
    s->device = cur_dev;
    s->priority = priority;
    s->hwq = F.nstreams_dev[cur_dev]++ % F.connections;
    s->next = F.streams;
    F.streams = s;
    return s;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    int r;
    fake_call *c = enter("cudaStreamCreateWithFlags", &r);
    c->value = (int)flags;
    if (r == cudaSuccess)
        *stream = c->stream = stream_new(0);
    return (cudaError_t)leave(c, r);
}

/* The fake's priority range is an H100's: 0 (least, the default) to -5 (greatest). */
enum { FAKE_PRIO_LEAST = 0, FAKE_PRIO_GREATEST = -5 };

cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    int r;
    fake_call *c = enter("cudaDeviceGetStreamPriorityRange", &r);
    if (r == cudaSuccess) {
        if (leastPriority != NULL)
            *leastPriority = FAKE_PRIO_LEAST;
        if (greatestPriority != NULL)
            *greatestPriority = FAKE_PRIO_GREATEST;
    }
    return (cudaError_t)leave(c, r);
}

/* c->value: the priority asked for; count: the flags. As CUDA, a priority outside the
 * range is clamped to it. */
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags, int priority)
{
    int r;
    fake_call *c = enter("cudaStreamCreateWithPriority", &r);
    c->value = priority;
    c->count = flags;
    if (priority > FAKE_PRIO_LEAST)
        priority = FAKE_PRIO_LEAST;
    if (priority < FAKE_PRIO_GREATEST)
        priority = FAKE_PRIO_GREATEST;
    if (r == cudaSuccess)
        *stream = c->stream = stream_new(priority);
    return (cudaError_t)leave(c, r);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus)
{
    int r;
    fake_call *c = enter("cudaStreamIsCapturing", &r);
    c->stream = stream;
    if (r == cudaSuccess && !stream_ok(stream, c->fn))
        r = cudaErrorInvalidResourceHandle;
    if (r == cudaSuccess)
        *pCaptureStatus = F.capturing_all || (stream != NULL && stream == F.capturing)
                              ? cudaStreamCaptureStatusActive
                              : cudaStreamCaptureStatusNone;
    return (cudaError_t)leave(c, r);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    int r;
    fake_call *c = enter("cudaStreamDestroy", &r);
    c->stream = stream;
    if (r == cudaSuccess && (stream == NULL || !stream_ok(stream, c->fn)))
        r = cudaErrorInvalidResourceHandle;
    if (r == cudaSuccess)
        stream->destroyed = true;
    return (cudaError_t)leave(c, r);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    int r;
    fake_call *c = enter("cudaStreamWaitEvent", &r);
    c->stream = stream;
    c->event = event;
    c->value = (int)flags;
    if (r == cudaSuccess && (!stream_ok(stream, c->fn) || !event_ok(event, c->fn)))
        r = cudaErrorInvalidResourceHandle;
    /* What is queued on stream after this waits until the event completes (its record ran,
     * the work before it finished, cross-process work before it included). */
    if (r == cudaSuccess && stream != NULL && event->recorded &&
        (event->queued || !event->complete || fake_xp_event_pending(event)))
        memop_evwait(stream, event);
    return (cudaError_t)leave(c, r);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    int r;
    fake_call *c = enter("cudaEventCreateWithFlags", &r);
    c->value = (int)flags;
    if (r == cudaSuccess) {
        struct CUevent_st *e = calloc(1, sizeof *e);
        if (e == NULL)
            abort();
        ctx_need();
        e->device = cur_dev;
        e->next = F.events;
        F.events = e;
        *event = c->event = e;
    }
    return (cudaError_t)leave(c, r);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    int r;
    fake_call *c = enter("cudaEventDestroy", &r);
    c->event = event;
    if (r == cudaSuccess && !event_ok(event, c->fn))
        r = cudaErrorInvalidResourceHandle;
    if (r == cudaSuccess)
        event->destroyed = true;
    return (cudaError_t)leave(c, r);
}

/* A stream the communicator's launching group puts work on. Lock held. */
static void launch_stream_add(struct ncclComm *cm, cudaStream_t s)
{
    for (int k = 0; k < cm->nlstream; k++)
        if (cm->lstream[k] == s)
            return;
    if (cm->nlstream < (int)(sizeof cm->lstream / sizeof cm->lstream[0]))
        cm->lstream[cm->nlstream++] = s;
}

/* A communicator (not aborted or revoked: that joined the launch thread) whose non-blocking
 * group is still launching work onto `s`, or NULL. Lock held. */
static struct ncclComm *launching_on(cudaStream_t s)
{
    for (struct ncclComm *x = F.comms; x != NULL; x = x->next) {
        if (!x->launching || x->aborted || x->revoked || x->destroyed)
            continue;
        for (int k = 0; k < x->nlstream; k++)
            if (x->lstream[k] == s)
                return x;
    }
    return NULL;
}

/* Whether work queued on `device` now never finishes by itself: a rank there belongs to a
 * clique with a rank in asynchronous error and not aborted (NCCL's kernels of a failed
 * collective hang or fail; ncclCommAbort makes them exit, see ncclCommAbort). Lock held. */
static bool device_stuck(int device)
{
    for (struct ncclComm *x = F.comms; x != NULL; x = x->next) {
        if (x->async == ncclSuccess || x->async == ncclInProgress || x->aborted || x->destroyed)
            continue;
        for (int k = 0; k < x->clique->nranks; k++) {
            ncclComm_t p = x->clique->ranks[k];
            if (p != NULL && p->device == device && !p->aborted && !p->destroyed)
                return true;
        }
    }
    return false;
}

/* What the GPU finishes by itself: every recorded event that is not stuck. Lock held. */
static void complete_events_locked(void)
{
    memops_complete_locked(); /* a stream's writes run before its later events complete */
    for (struct CUevent_st *e = F.events; e != NULL; e = e->next)
        e->complete = e->recorded && !e->queued && (e->complete || !e->stuck);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    int r;
    fake_call *c = enter("cudaEventRecord", &r);
    c->event = event;
    c->stream = stream;
    if (r == cudaSuccess && (!event_ok(event, c->fn) || !stream_ok(stream, c->fn)))
        r = cudaErrorInvalidResourceHandle;
    if (r == cudaSuccess && stream != NULL && stream->device != event->device) {
        fake_error("cudaEventRecord: event of device %d on a stream of device %d", event->device,
                   stream->device);
        r = cudaErrorInvalidResourceHandle;
    }
    /* NCCL's launch thread of a non-blocking group enqueues its kernels when the launch
     * finishes (ncclCommGetAsyncError leaves ncclInProgress) or is aborted: an event
     * recorded on one of its streams before that completes without waiting for them. */
    struct ncclComm *lc = r == cudaSuccess && stream != NULL ? launching_on(stream) : NULL;
    if (lc != NULL)
        fake_error("cudaEventRecord on a stream of device %d while a non-blocking group of its "
                   "rank %d is still launching there (ncclInProgress, not aborted): the event "
                   "does not cover the group's kernels",
                   stream->device, lc->rank);
    if (r == cudaSuccess) {
        event->recorded = true;
        event->stuck = device_stuck(event->device);
        event->complete = !F.manual && !event->stuck;
        event->queued = false;
        fake_xp_event_record(event, stream);
        /* Behind unfinished work of its stream (or a wait blocking its hardware queue), the
         * record itself waits: the event completes once that work ran. */
        if (stream != NULL && stream_busy(stream)) {
            event->complete = false;
            event->queued = true;
            memop_record(event, stream);
        }
    }
    return (cudaError_t)leave(c, r);
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    int r;
    fake_call *c = enter("cudaEventQuery", &r);
    c->event = event;
    if (r == cudaSuccess && !event_ok(event, c->fn))
        r = cudaErrorInvalidResourceHandle;
    if (r == cudaSuccess) {
        c->value = event->recorded;
        /* As in CUDA, an event never recorded counts as complete. */
        if (event->recorded && !event->complete)
            r = cudaErrorNotReady;
        else if (event->recorded && fake_xp_event_pending(event))
            r = cudaErrorNotReady; /* cross-process work before it is not done */
    }
    return (cudaError_t)leave(c, r);
}

/* The live allocation holding [p, p + bytes), or NULL. */
static fake_mem *mem_find(const void *p, size_t bytes)
{
    for (fake_mem *m = F.mems; m != NULL; m = m->next)
        if (!m->freed && (const char *)p >= m->ptr && (const char *)p <= m->ptr + m->bytes &&
            bytes <= (size_t)(m->ptr + m->bytes - (const char *)p))
            return m;
    return NULL;
}

cudaError_t cudaMalloc(void **ptr, size_t size)
{
    int r;
    fake_call *c = enter("cudaMalloc", &r);
    c->count = size;
    if (r == cudaSuccess) {
        fake_mem *m = calloc(1, sizeof *m);
        /* cudaMalloc aligns to 256 bytes; aligned_alloc wants a multiple of it. */
        if (m == NULL || (m->ptr = aligned_alloc(256, (size + 255) & ~(size_t)255)) == NULL)
            abort();
        ctx_need();
        m->bytes = size;
        m->device = cur_dev;
        m->next = F.mems;
        F.mems = m;
        *ptr = c->dst = m->ptr;
    }
    return (cudaError_t)leave(c, r);
}

cudaError_t cudaFree(void *ptr)
{
    int r;
    fake_call *c = enter("cudaFree", &r);
    fake_mem *m = ptr != NULL ? mem_find(ptr, 0) : NULL;
    c->dst = ptr;
    if (r == cudaSuccess && ptr != NULL && (m == NULL || m->ptr != ptr)) {
        fake_error("cudaFree: %p is not a live cudaMalloc allocation", ptr);
        r = cudaErrorInvalidValue;
    }
    if (r == cudaSuccess && m != NULL) {
        free(m->ptr);
        m->freed = true;
    }
    return (cudaError_t)leave(c, r);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    int r;
    fake_call *c = enter("cudaMemcpy", &r);
    const void *dev = kind == cudaMemcpyHostToDevice ? dst : src;
    c->dst = dst;
    c->src = src;
    c->count = count;
    c->value = (int)kind;
    if (r == cudaSuccess && (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToHost) &&
        mem_find(dev, count) == NULL) {
        fake_error("cudaMemcpy: [%p, +%zu) is not inside a live cudaMalloc allocation", dev, count);
        r = cudaErrorInvalidValue;
    }
    if (r == cudaSuccess && count > 0)
        memmove(dst, src, count);
    return (cudaError_t)leave(c, r);
}

/* ---- NCCL: communicators ---- */

ncclResult_t ncclGetVersion(int *version)
{
    int r;
    fake_call *c = enter("ncclGetVersion", &r);
    if (r == ncclSuccess)
        *version = c->value = F.version;
    return (ncclResult_t)leave(c, r);
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    int r;
    fake_call *c = enter("ncclGetUniqueId", &r);
    if (r == ncclSuccess)
        fake_xp_unique_id(id, ++F.next_id); /* unique across processes too */
    return (ncclResult_t)leave(c, r);
}

const char *ncclGetErrorString(ncclResult_t result)
{
    static const char *const text[] = {
        [ncclSuccess] = "no error",
        [ncclUnhandledCudaError] = "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        [ncclSystemError] = "unhandled system error (run with NCCL_DEBUG=INFO for details)",
        [ncclInternalError] = "internal error - please report this issue to the NCCL developers",
        [ncclInvalidArgument] = "invalid argument (run with NCCL_DEBUG=WARN for details)",
        [ncclInvalidUsage] = "invalid usage (run with NCCL_DEBUG=WARN for details)",
        [ncclRemoteError] = "remote process exited or there was a network error",
        [ncclInProgress] = "NCCL operation in progress",
    };
    int r;
    leave(enter("ncclGetErrorString", &r), 0);
    return (unsigned)result < ncclNumResults ? text[result] : "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm)
{
    int r;
    fake_call *c = enter("ncclGetLastError", &r);
    c->comm = comm;
    leave(c, 0);
    return F.last_error; /* written only by the test while the backend is idle */
}

static int xp_join(ncclComm_t cm, bool wait);

/* Append a call to this thread's group. Lock held. */
static void grp_add(const fake_op *op)
{
    if (grp.n == grp.cap) {
        grp.cap = grp.cap ? grp.cap * 2 : 64;
        grp.ops = realloc(grp.ops, grp.cap * sizeof *grp.ops);
        if (grp.ops == NULL)
            abort();
    }
    grp.ops[grp.n++] = *op;
}

/* A rank of the clique of `id` on `device` (ncclCommInitRankConfig, ncclCommShrink). Lock
 * held; c is the call being logged. */
static int init_rank(fake_call *c, ncclComm_t *comm, int nranks, const ncclUniqueId *id, int rank,
                     int device, bool blocking)
{
    int r = ncclSuccess;
    fake_clique *q;
    struct ncclComm *cm;

    c->nranks = nranks;
    c->rank = rank;
    if (nranks < 1 || nranks > FAKE_MAX_RANKS || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    for (q = F.cliques; q != NULL && memcmp(&q->id, id, sizeof *id) != 0; q = q->next)
        ;
    if (q == NULL) {
        q = calloc(1, sizeof *q);
        if (q == NULL)
            abort();
        q->id = *id;
        q->nranks = nranks;
        q->next = F.cliques;
        F.cliques = q;
    }
    if (q->nranks != nranks || q->ranks[rank] != NULL) {
        fake_error("%s: rank %d of %d does not fit its clique", c->fn, rank, nranks);
        return ncclInvalidArgument;
    }
    for (int k = 0; k < nranks; k++)
        if (q->ranks[k] != NULL && q->ranks[k]->device == device)
            fake_error("%s: ranks %d and %d on the same device %d", c->fn, k, rank, device);
    cm = calloc(1, sizeof *cm);
    if (cm == NULL)
        abort();
    cm->clique = q;
    cm->rank = rank;
    cm->device = device;
    cm->pending = F.pending;
    cm->async = take_async(rank);
    cm->blocking = blocking;
    cm->next = F.comms;
    F.comms = cm;
    q->ranks[rank] = cm;
    *comm = c->comm = cm;
    if (grp.depth > 0)
        grp_add(&(fake_op){.kind = OP_INIT, .comm = cm});
    else if ((r = xp_join(cm, false)) == ncclSuccess || r == ncclInProgress)
        r = cm->blocking ? xp_join(cm, true) : r;
    return r;
}

/* A test hook, not NCCL behaviour: once the last rank of a clique exists, hold the calling
 * thread (the scheduler, which forms communicators) so that a test can queue work that must
 * all be found in one pass. */
static void init_hold(int r, int rank, int nranks)
{
    if (r == ncclSuccess && rank == nranks - 1) {
        lock();
        F.inits_blocked++;
        while (F.init_hold)
            pthread_cond_wait(&fake_abort_cond, &fake_lock);
        F.inits_blocked--;
        unlock();
    }
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    int r;
    fake_call *c = enter("ncclCommInitRankConfig", &r);

    c->value = config != NULL ? config->blocking : 1;
    if (r == ncclSuccess)
        r = init_rank(c, comm, nranks, &id, rank, cur_dev, config == NULL || config->blocking != 0);
    else
        c->nranks = nranks, c->rank = rank;
    if (r != ncclSuccess && grp.depth > 0 && grp.err == ncclSuccess)
        grp.err = (ncclResult_t)r;
    r = leave(c, r);
    init_hold(r, rank, nranks);
    return (ncclResult_t)r;
}

/* NCCL 2.28's fault-tolerance calls: an older library does not have them. Lock held. */
static bool has_228(fake_call *c)
{
    if (F.version >= NCCL_VERSION(2, 28, 0))
        return true;
    fake_error("%s called, but the emulated NCCL %d does not have it (added in 2.28)", c->fn,
               F.version);
    return false;
}

/* The aborted or revoked rank's kernels exit, so its device's streams drain. Lock held. */
static void drain_device(int device)
{
    memops_abort_locked(device, F.abort_keeps);
    for (struct CUevent_st *e = F.events; e != NULL; e = e->next)
        if (e->device == device && e->recorded && !e->queued) {
            e->complete |= !F.abort_keeps;
            e->stuck = false;
        }
}

ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
    int r;
    fake_call *c = enter("ncclCommRevoke", &r);
    set_comm(c, comm);
    c->value = revokeFlags;
    if (r == ncclSuccess && !has_228(c))
        r = ncclInvalidUsage;
    if (r == ncclSuccess && (!comm_ok(comm, c->fn) || revokeFlags != NCCL_REVOKE_DEFAULT))
        r = ncclInvalidArgument;
    if (r == ncclSuccess) {
        /* In-flight work stops (its cross-process part is dropped, its events complete); the
         * state is ncclInProgress until quiescent (one poll here), then ncclSuccess. */
        if (comm->clique->xp != NULL)
            fake_xp_leave(comm->clique->xp, comm->rank);
        drain_device(comm->device);
        comm->revoked = true;
        comm->async = ncclSuccess;
        comm->pending = 1;
    }
    return (ncclResult_t)leave(c, r);
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                            ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    int r, newrank = 0, nranks = 0;
    uint32_t excluded = 0;
    ncclUniqueId id;
    uint64_t h = 1469598103934665603ull;
    fake_call *c = enter("ncclCommShrink", &r);

    set_comm(c, comm);
    c->value = shrinkFlags;
    if (r == ncclSuccess && !has_228(c))
        r = ncclInvalidUsage;
    if (r == ncclSuccess &&
        (!comm_ok(comm, c->fn) || newcomm == NULL || excludeRanksCount < 0 ||
         (excludeRanksCount > 0 && excludeRanksList == NULL) ||
         (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)))
        r = ncclInvalidArgument;
    for (int k = 0; r == ncclSuccess && k < excludeRanksCount; k++) {
        int x = excludeRanksList[k];
        if (x < 0 || x >= comm->clique->nranks || x == comm->rank || (excluded & (1u << x))) {
            fake_error("ncclCommShrink: excluded rank %d of %d is invalid, repeated or the "
                       "caller's own (%d)",
                       x, comm->clique->nranks, comm->rank);
            r = ncclInvalidArgument;
        }
        excluded |= 1u << x;
    }
    /* The parent's work must be over: revoked (and quiescent), or NCCL_SHRINK_ABORT, or a
     * healthy communicator (NCCL_SHRINK_DEFAULT waits for its work). */
    if (r == ncclSuccess && !comm->revoked && shrinkFlags == NCCL_SHRINK_DEFAULT &&
        (comm->async != ncclSuccess || comm->pending > 0)) {
        fake_error("ncclCommShrink of rank %d in error or still ncclInProgress without "
                   "NCCL_SHRINK_ABORT (it would wait for work that never finishes)",
                   comm->rank);
        r = ncclInvalidUsage;
    }
    if (r == ncclSuccess) {
        /* Every remaining rank computes the same new id: the parent's, the how-manieth shrink
         * of it, and what is excluded. Ranks keep their order. */
        for (size_t i = 0; i < sizeof comm->clique->id.internal; i++)
            h = (h ^ (unsigned char)comm->clique->id.internal[i]) * 1099511628211ull;
        memset(&id, 0, sizeof id);
        snprintf(id.internal, sizeof id.internal, "fake-shrink-%016llx-%d-%08x",
                 (unsigned long long)h, ++comm->shrinks, excluded);
        for (int k = 0; k < comm->clique->nranks; k++) {
            if (excluded & (1u << k))
                continue;
            if (k < comm->rank)
                newrank++;
            nranks++;
        }
        if (shrinkFlags == NCCL_SHRINK_ABORT && comm->clique->xp != NULL && !comm->revoked)
            fake_xp_leave(comm->clique->xp, comm->rank);
        r = init_rank(c, newcomm, nranks, &id, newrank, comm->device,
                      config != NULL ? config->blocking != 0 : comm->blocking);
    }
    if (r != ncclSuccess && grp.depth > 0 && grp.err == ncclSuccess)
        grp.err = (ncclResult_t)r;
    r = leave(c, r);
    init_hold(r, newrank, nranks);
    return (ncclResult_t)r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error)
{
    int r;
    fake_call *c = enter("ncclCommGetAsyncError", &r);
    set_comm(c, comm);
    if (r == ncclSuccess && !comm_ok(comm, c->fn))
        r = ncclInvalidArgument;
    if (r == ncclSuccess) {
        ncclResult_t st = comm->async;
        if (F.hold) {
            st = ncclInProgress;
        } else if (comm->pending > 0) {
            comm->pending--;
            st = ncclInProgress;
        } else if (comm->launching && fake_xp_now() < comm->launch_until) {
            st = ncclInProgress;
        }
        if (st == ncclSuccess && comm->connecting) {
            /* Its first launch connects to its peers: done once every rank launched one. */
            if (fake_xp_all_launched(comm->clique->xp)) {
                comm->connecting = false;
                comm->connected = true;
            } else if (fake_xp_now() >= comm->connect_deadline) {
                comm->connecting = false;
                comm->async = st = ncclSystemError;
                fprintf(stderr,
                        "fake_cuda_nccl: rank %d of %s: a peer never launched, so the "
                        "first launch could not connect within the fake's timeout\n",
                        comm->rank, comm->clique->id.internal);
            } else {
                st = ncclInProgress;
            }
        }
        /* (A revoked rank left its clique: its earlier cross-process error is over.) */
        if (st == ncclSuccess && comm->clique->xp != NULL && !comm->revoked &&
            (st = fake_xp_poll(comm->clique->xp, comm->rank)) != ncclInProgress)
            comm->async = st;
        if (st != ncclInProgress) {
            comm->launching = false;
            comm->nlstream = 0;
        }
        *async_error = st;
        c->value = st;
    }
    return (ncclResult_t)leave(c, r);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    int r;
    fake_call *c = enter("ncclCommDestroy", &r);
    set_comm(c, comm);
    if (r == ncclSuccess && !comm_ok(comm, c->fn))
        r = ncclInvalidArgument;
    /* ncclCommDestroy waits for the communicator's work (commDestroySync): with a rank of
     * the clique in error, aborted or still launching, that work may never finish. */
    for (int k = 0; r == ncclSuccess && k < comm->clique->nranks; k++) {
        ncclComm_t p = comm->clique->ranks[k];
        if (p != NULL && (p->aborted || p->async != ncclSuccess || p->pending > 0 || p->hung))
            fake_error("ncclCommDestroy: rank %d of a clique whose rank %d is %s (the destroy "
                       "would wait for work that never finishes)",
                       comm->rank, k,
                       p->aborted                ? "aborted"
                       : p->async != ncclSuccess ? "in error"
                       : p->hung                 ? "running a partial group"
                                                 : "ncclInProgress");
    }
    if (r == ncclSuccess)
        comm->destroyed = true;
    if (r == ncclSuccess && comm->clique->xp != NULL)
        fake_xp_leave(comm->clique->xp, comm->rank);
    return (ncclResult_t)leave(c, r);
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    int r;
    fake_call *c;
    /* NCCL's abort of a multi-rank communicator can block: the last rank's abort reclaims
     * the communicator (commReclaim -> commDestroySync) with a stream synchronize that waits
     * for kernels queued behind other work. fake_hold_abort() models that wait; the lock is
     * released meanwhile, so other threads' calls go on. */
    lock();
    F.aborts_blocked++;
    while (F.abort_hold)
        pthread_cond_wait(&fake_abort_cond, &fake_lock);
    F.aborts_blocked--;
    unlock();
    c = enter("ncclCommAbort", &r);
    set_comm(c, comm);
    if (r == ncclSuccess && !comm_ok(comm, c->fn))
        r = ncclInvalidArgument;
    /* Destroying some ranks and aborting others: the destroyed ranks' destroy waited for
     * work that the aborted ranks' kernels no longer serve (commDestroySync in init.cc). */
    for (int k = 0; r == ncclSuccess && k < comm->clique->nranks; k++) {
        ncclComm_t p = comm->clique->ranks[k];
        if (p != NULL && p->destroyed)
            fake_error("ncclCommAbort: rank %d of a clique whose rank %d got ncclCommDestroy "
                       "(destroy all ranks or abort all)",
                       comm->rank, k);
    }
    if (r == ncclSuccess && comm->clique->xp != NULL)
        fake_xp_leave(comm->clique->xp, comm->rank); /* its cross-process work is dropped */
    if (r == ncclSuccess) {
        comm->aborted = true;
        /* The aborted kernels exit, so the device's streams drain: its recorded events
         * complete, unless the test keeps them (work stuck elsewhere, e.g. behind a user
         * stream). */
        drain_device(comm->device);
    }
    return (ncclResult_t)leave(c, r);
}

/* ---- NCCL: groups and operations ---- */

static const ccq_dtype to_ccq_dtype[ncclNumTypes] = {
    [ncclInt8] = CCQ_INT8,
    [ncclUint8] = CCQ_UINT8,
    [ncclInt32] = CCQ_INT32,
    [ncclUint32] = CCQ_UINT32,
    [ncclInt64] = CCQ_INT64,
    [ncclUint64] = CCQ_UINT64,
    [ncclFloat16] = CCQ_FLOAT16,
    [ncclFloat32] = CCQ_FLOAT32,
    [ncclFloat64] = CCQ_FLOAT64,
    [ncclBfloat16] = CCQ_BFLOAT16,
    [ncclFloat8e4m3] = CCQ_FLOAT8E4M3,
    [ncclFloat8e5m2] = CCQ_FLOAT8E5M2,
};

static const ccq_reduce_op to_ccq_op[ncclNumOps] = {
    [ncclSum] = CCQ_SUM, [ncclProd] = CCQ_PROD, [ncclMax] = CCQ_MAX,
    [ncclMin] = CCQ_MIN, [ncclAvg] = CCQ_AVG,
};

/* Match every call of the group (see the header). Lock held; false after a fake_error. */
static bool grp_match(void)
{
    for (size_t i = 0; i < grp.n; i++) {
        fake_op *o = &grp.ops[i];
        fake_clique *q = o->comm->clique;
        if (o->kind == OP_INIT || o->matched || q->xp != NULL)
            continue; /* cross-process cliques match in fake_xproc.c */
        if (is_coll(o->kind)) {
            /* The collectives of a communicator form one sequence, as in NCCL: earlier calls
             * are all matched, so each rank's first unmatched collective is the same
             * position in its sequence as this one, and must be the same collective. */
            const struct coll_info *ki = &coll_info[o->kind];
            for (int rk = 0; rk < q->nranks; rk++) {
                size_t k = i;
                while (k < grp.n && !(is_coll(grp.ops[k].kind) && !grp.ops[k].matched &&
                                      grp.ops[k].comm->clique == q && grp.ops[k].comm->rank == rk))
                    k++;
                if (k == grp.n) {
                    fake_error("ncclGroupEnd: incomplete group: the %s of %s lacks rank %d's part",
                               ki->fn, q->id.internal, rk);
                    return false;
                }
                fake_op *x = &grp.ops[k];
                if (x->kind != o->kind || x->count != o->count || x->dtype != o->dtype ||
                    (ki->reduces && x->redop != o->redop) || (ki->rooted && x->root != o->root)) {
                    fake_error("ncclGroupEnd: %s of %s: rank %d's part differs (%s, count %zu, "
                               "dtype %d, op %d, root %d; rank %d: count %zu, dtype %d, op %d, "
                               "root %d)",
                               ki->fn, q->id.internal, rk, coll_info[x->kind].fn, x->count,
                               (int)x->dtype, (int)x->redop, x->root, o->comm->rank, o->count,
                               (int)o->dtype, (int)o->redop, o->root);
                    return false;
                }
                o->unit[rk] = k;
            }
            for (int rk = 0; rk < q->nranks; rk++)
                grp.ops[o->unit[rk]].matched = true;
        } else {
            /* The counterpart: the first unmatched call of the other kind between the same
             * two ranks of the clique, in the same direction. */
            int want = o->kind == OP_SEND ? OP_RECV : OP_SEND;
            size_t k = 0;
            while (k < grp.n &&
                   !(grp.ops[k].kind == want && !grp.ops[k].matched &&
                     grp.ops[k].comm->clique == q && grp.ops[k].comm->rank == o->peer &&
                     grp.ops[k].peer == o->comm->rank))
                k++;
            if (k == grp.n) {
                fake_error("ncclGroupEnd: incomplete group: %s from rank %d to rank %d of %s "
                           "has no matching %s",
                           o->kind == OP_SEND ? "ncclSend" : "ncclRecv", o->comm->rank, o->peer,
                           q->id.internal, want == OP_SEND ? "ncclSend" : "ncclRecv");
                return false;
            }
            if (grp.ops[k].count != o->count || grp.ops[k].dtype != o->dtype) {
                fake_error("ncclGroupEnd: send/recv between ranks %d and %d differ in size",
                           o->comm->rank, o->peer);
                return false;
            }
            o->unit[0] = k;
            o->matched = grp.ops[k].matched = true;
        }
        o->lead = true;
    }
    return true;
}

/* Run one matched collective with NCCL's semantics (nccl.h) on host memory. p[rk] is rank
 * rk's call. Copies are memmoves, reductions the host backend's kernel (n inputs into one
 * output), so NCCL's in-place forms (checked at the call) work: every output block is
 * either disjoint from every input still to be read, or is exactly the input it comes
 * from. Buffers a rank does not use are not touched (they may be NULL). */
static void coll_execute(const fake_op *o, const fake_op *const *p, int n)
{
    ccq_dtype dt = to_ccq_dtype[o->dtype];
    ccq_reduce_op rop = coll_info[o->kind].reduces ? to_ccq_op[o->redop] : CCQ_SUM;
    size_t count = o->count, blk = count * ccq_dtype_size(dt);
    const void *src[FAKE_MAX_RANKS];
    void *dst[FAKE_MAX_RANKS];
    int root = o->root;

    if (count == 0)
        return;
    switch (o->kind) {
    case OP_ALLREDUCE:
        for (int rk = 0; rk < n; rk++) {
            src[rk] = p[rk]->src;
            dst[rk] = p[rk]->dst;
        }
        ccq_host_allreduce_range(dt, rop, (uint32_t)n, src, dst, 0, count);
        break;
    case OP_BROADCAST:
        for (int rk = 0; rk < n; rk++)
            memmove(p[rk]->dst, p[root]->src, blk);
        break;
    case OP_REDUCE:
        for (int rk = 0; rk < n; rk++)
            src[rk] = p[rk]->src;
        dst[0] = p[root]->dst;
        ccq_host_reduce_range(dt, rop, (uint32_t)n, src, 1, dst, 0, count, 0);
        break;
    case OP_ALLGATHER:
        for (int rk = 0; rk < n; rk++)
            for (int j = 0; j < n; j++)
                memmove((char *)p[rk]->dst + (size_t)j * blk, p[j]->src, blk);
        break;
    case OP_REDUCESCATTER:
        for (int rk = 0; rk < n; rk++) {
            for (int j = 0; j < n; j++)
                src[j] = (const char *)p[j]->src + (size_t)rk * blk;
            dst[0] = p[rk]->dst;
            ccq_host_reduce_range(dt, rop, (uint32_t)n, src, 1, dst, 0, count, 0);
        }
        break;
    case OP_ALLTOALL:
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++)
                memmove((char *)p[j]->dst + (size_t)i * blk,
                        (const char *)p[i]->src + (size_t)j * blk, blk);
        break;
    case OP_GATHER:
        for (int j = 0; j < n; j++)
            memmove((char *)p[root]->dst + (size_t)j * blk, p[j]->src, blk);
        break;
    case OP_SCATTER:
        for (int rk = 0; rk < n; rk++)
            memmove(p[rk]->dst, (const char *)p[root]->src + (size_t)rk * blk, blk);
        break;
    default:
        abort();
    }
}

/* Run a matched group on host memory, in call order of each unit's first call. */
static void ops_execute(const fake_op *ops, size_t nops)
{
    for (size_t i = 0; i < nops; i++) {
        const fake_op *o = &ops[i];
        if (!o->lead || o->ran)
            continue;
        if (is_coll(o->kind)) {
            int n = o->comm->clique->nranks;
            const fake_op *p[FAKE_MAX_RANKS];
            for (int rk = 0; rk < n; rk++)
                p[rk] = &ops[o->unit[rk]];
            coll_execute(o, p, n);
        } else {
            const fake_op *snd = o->kind == OP_SEND ? o : &ops[o->unit[0]];
            const fake_op *rcv = o->kind == OP_RECV ? o : &ops[o->unit[0]];
            size_t bytes = o->count * ccq_dtype_size(to_ccq_dtype[o->dtype]);
            if (bytes > 0)
                memmove(rcv->dst, snd->src, bytes);
        }
    }
}

/* The group's work: now, or (a stream of it has unfinished work queued, or a wait blocks
 * its hardware queue) once every stream of it got there (memop_group). Lock held. */
static void grp_execute(void)
{
    for (size_t i = 0; i < grp.n; i++) {
        const fake_op *o = &grp.ops[i];
        if (o->kind != OP_INIT && o->comm->clique->xp == NULL && o->stream != NULL &&
            stream_busy(o->stream)) {
            memop_group(grp.ops, grp.n);
            return;
        }
    }
    ops_execute(grp.ops, grp.n);
}

/*
 * Every non-blocking group gets its own launch thread (group.cc, ncclGroupEndInternal ->
 * groupLaunchNonBlocking), so two groups still launching on different communicators that
 * share a device may enqueue their kernels in a different order on each GPU: NCCL's "using
 * multiple NCCL communicators concurrently" deadlock. A group that touches a device on which
 * another communicator's group is still launching is a fake error. Lock held.
 */
static void grp_check_devices(void)
{
    for (struct ncclComm *x = F.comms; x != NULL; x = x->next) {
        bool mine = false, shares = false;
        if (!x->launching || x->destroyed || x->aborted)
            continue;
        for (size_t i = 0; i < grp.n; i++) {
            if (grp.ops[i].kind == OP_INIT)
                continue;
            mine |= grp.ops[i].comm == x;
            shares |= grp.ops[i].comm->device == x->device;
        }
        if (shares && !mine)
            fake_error("ncclGroupEnd: launches on device %d while a group of another "
                       "communicator (rank %d of %s) still launches there",
                       x->device, x->rank, x->clique->id.internal);
    }
}

/* ---- Cross-process cliques: the hooks into fake_xproc.c ---- */

/* A new communicator joins its clique's other processes, unless every rank of the clique
 * was created in this process by the end of the group (or the call) creating it; then
 * (wait), a blocking one waits for them. */
static int xp_join(ncclComm_t cm, bool wait)
{
    fake_clique *q = cm->clique;
    int local = 0;
    for (int k = 0; k < q->nranks; k++)
        local += q->ranks[k] != NULL && !q->ranks[k]->destroyed && !q->ranks[k]->aborted;
    if (q->xp == NULL && local == q->nranks)
        return ncclSuccess;
    if (q->xp == NULL && (q->xp = fake_xp_attach(&q->id, q->nranks)) == NULL)
        return ncclSystemError;
    if (!wait)
        return fake_xp_join(q->xp, cm->rank, cm->device, F.cc[cm->device]);
    return cm->blocking ? fake_xp_join_wait(q->xp, cm->rank) : ncclSuccess;
}

/* A send/recv peer in another process. */
static bool xp_remote_peer(ncclComm_t comm, int peer)
{
    return comm->clique->xp != NULL && peer >= 0 && peer < comm->clique->nranks;
}

/* At ncclGroupEnd, before the local calls run: join the group's new communicators, then
 * hand the calls on cross-process cliques to fake_xproc.c (with every stream of the group,
 * for stream order). */
static int xp_group(void)
{
    static const int kinds[OP_KINDS_] = {
        [OP_SEND] = FAKE_XP_SEND,
        [OP_RECV] = FAKE_XP_RECV,
        [OP_ALLREDUCE] = FAKE_XP_ALLREDUCE,
        [OP_BROADCAST] = FAKE_XP_BROADCAST,
        [OP_REDUCE] = FAKE_XP_REDUCE,
        [OP_ALLGATHER] = FAKE_XP_ALLGATHER,
        [OP_REDUCESCATTER] = FAKE_XP_REDUCESCATTER,
        [OP_ALLTOALL] = FAKE_XP_ALLTOALL,
        [OP_GATHER] = FAKE_XP_GATHER,
        [OP_SCATTER] = FAKE_XP_SCATTER,
    };
    fake_xp_op *xo;
    const void **streams;
    size_t nx = 0, ns = 0;
    int r = ncclSuccess;

    if (grp.n == 0)
        return ncclSuccess;
    xo = calloc(grp.n, sizeof *xo);
    streams = calloc(grp.n, sizeof *streams);
    if (xo == NULL || streams == NULL)
        abort();
    for (size_t i = 0; i < grp.n && r == ncclSuccess; i++) {
        const fake_op *o = &grp.ops[i];
        fake_clique *q = o->comm->clique;
        size_t k = 0;
        if (o->kind == OP_INIT) {
            int j = xp_join(o->comm, false);
            if (j != ncclSuccess && j != ncclInProgress)
                r = j;
            continue;
        }
        while (k < ns && streams[k] != o->stream)
            k++;
        if (k == ns)
            streams[ns++] = o->stream;
        if (q->xp == NULL)
            continue;
        xo[nx++] = (fake_xp_op){
            .kind = kinds[o->kind],
            .q = q->xp,
            .rank = o->comm->rank,
            .stream = o->stream,
            .src = o->src,
            .dst = o->dst,
            .count = o->count,
            .nccl_dtype = (int)o->dtype,
            .nccl_op = (int)o->redop,
            .dtype = to_ccq_dtype[o->dtype],
            .op = is_coll(o->kind) && coll_info[o->kind].reduces ? to_ccq_op[o->redop] : CCQ_SUM,
            .root = o->root,
            .peer = o->peer};
    }
    /* Every local rank has registered: now a blocking init may wait for the others. */
    for (size_t i = 0; i < grp.n && r == ncclSuccess; i++)
        if (grp.ops[i].kind == OP_INIT)
            r = xp_join(grp.ops[i].comm, true);
    if (r == ncclSuccess)
        r = fake_xp_launch(xo, nx, streams, ns);
    free(xo);
    free(streams);
    return r;
}

ncclResult_t ncclGroupStart(void)
{
    int r;
    fake_call *c = enter("ncclGroupStart", &r);
    if (r == ncclSuccess)
        grp.depth++;
    return (ncclResult_t)leave(c, r);
}

/* End the outermost group: check, run, then apply asynchronous state. Lock held. */
static int grp_end(int scripted)
{
    int r = scripted, xr;
    bool init_pending = false;

    if (grp.err != ncclSuccess) {
        r = grp.err; /* NCCL reports the group's first failure and runs nothing */
        /* A communicator whose call made it into the failed group takes an armed
         * asynchronous error now (NCCL may leave the group's error on them). */
        for (size_t i = 0; i < grp.n; i++) {
            ncclResult_t e =
                grp.ops[i].kind == OP_INIT ? ncclSuccess : take_async(grp.ops[i].comm->rank);
            if (e != ncclSuccess)
                grp.ops[i].comm->async = e;
        }
    } else if (r != ncclSuccess && r != ncclInProgress)
        ; /* scripted failure: nothing runs */
    else if (!grp_match())
        r = ncclInvalidUsage;
    else if ((xr = xp_group()) != ncclSuccess)
        r = xr;
    else {
        bool data = false;
        for (size_t i = 0; i < grp.n && !data; i++)
            data = grp.ops[i].kind != OP_INIT;
        /* fake_set_launch_in_progress: every data group launches non-blocking. */
        if (F.launch_in_progress && data && scripted == ncclSuccess)
            scripted = r = ncclInProgress;
        grp_check_devices();
        grp_execute();
        for (size_t i = 0; i < grp.n; i++) {
            ncclComm_t cm = grp.ops[i].comm;
            if (scripted == ncclInProgress && grp.ops[i].kind != OP_INIT) {
                cm->launching = true;
                launch_stream_add(cm, grp.ops[i].stream);
            }
            /* A new communicator took its armed error at creation. */
            ncclResult_t e = grp.ops[i].kind == OP_INIT ? ncclSuccess : take_async(cm->rank);
            if (e != ncclSuccess)
                cm->async = e;
            if (scripted == ncclInProgress) {
                cm->pending = F.pending;
                cm->launch_until = fake_xp_now() + F.launch_ns;
            }
            init_pending |= grp.ops[i].kind == OP_INIT && cm->pending > 0;
            init_pending |= grp.ops[i].kind == OP_INIT && cm->clique->xp != NULL &&
                            fake_xp_joining(cm->clique->xp, cm->rank);
        }
        /* NCCL_RUNTIME_CONNECT (NCCL's default): the first launch on a clique with ranks in
         * other processes connects to the peers with blocking bootstrap exchanges on the
         * launch thread (group.cc ncclPrepareTasksAndCollPreconnect, transport.cc), so a
         * non-blocking one stays ncclInProgress until every rank has launched its own. */
        bool connecting = false;
        for (size_t i = 0; i < grp.n; i++) {
            ncclComm_t cm = grp.ops[i].comm;
            if (grp.ops[i].kind == OP_INIT || cm->clique->xp == NULL || cm->blocking ||
                cm->connected || F.no_runtime_connect)
                continue;
            if (!cm->connecting && fake_xp_all_launched(cm->clique->xp)) {
                cm->connected = true;
                continue;
            }
            if (!cm->connecting)
                cm->connect_deadline = fake_xp_deadline();
            cm->connecting = cm->launching = true;
            launch_stream_add(cm, grp.ops[i].stream);
            connecting = true;
        }
        if (init_pending || connecting)
            r = ncclInProgress; /* as a non-blocking init or launch does */
    }
    /* The group's storage is per thread: free it, or every thread that ever ran a group
     * (each runtime's scheduler) would leak it at exit. */
    free(grp.ops);
    grp.ops = NULL;
    grp.cap = 0;
    grp.n = 0;
    grp.err = ncclSuccess;
    return r;
}

ncclResult_t ncclGroupEnd(void)
{
    int r;
    fake_call *c = enter("ncclGroupEnd", &r);
    if (grp.depth == 0) {
        fake_error("ncclGroupEnd without ncclGroupStart");
        r = ncclInvalidUsage;
    } else if (--grp.depth == 0) {
        if (F.complete_at_group) {
            F.complete_at_group = false;
            complete_events_locked();
        }
        r = grp_end(r);
    }
    return (ncclResult_t)leave(c, r);
}

/* Bytes of a collective's buffer that rank `rank` uses (0: it need not pass one). */
static size_t coll_bytes(const fake_op *op, bool src, int nranks)
{
    const struct coll_info *ki = &coll_info[op->kind];
    int use = src ? ki->src_use : ki->dst_use;
    bool times_n = src ? ki->src_n : ki->dst_n;
    if (use == USE_ROOT && op->comm->rank != op->root)
        return 0;
    return op->count * ccq_dtype_size(to_ccq_dtype[op->dtype]) * (times_n ? (size_t)nranks : 1u);
}

/* A collective's arguments as NCCL would check them (ncclInvalidArgument), plus what NCCL
 * leaves undefined but a correct caller never does: a NULL buffer the rank uses, and src
 * and dst overlapping anywhere but at the kind's in-place position (nccl.h). Those, and a
 * root out of range or an fp8 reduction below compute capability 9 (which NCCL refuses),
 * are fake errors. Lock held; comm valid, dtype and op in range. */
static int coll_check(fake_call *c, const fake_op *op)
{
    const struct coll_info *ki = &coll_info[op->kind];
    int n = op->comm->clique->nranks, rank = op->comm->rank;
    size_t sb, db, blk = op->count * ccq_dtype_size(to_ccq_dtype[op->dtype]);
    uintptr_t s0 = (uintptr_t)op->src, d0 = (uintptr_t)op->dst;

    if (ki->rooted && (op->root < 0 || op->root >= n)) {
        fake_error("%s: root %d out of range for %d ranks", c->fn, op->root, n);
        return ncclInvalidArgument;
    }
    /* NCCL checks the communicator's lowest compute capability (comm->minCompCap, in
     * taskAppend, enqueue.cc), not the calling rank's device. */
    if (ki->reduces && (op->dtype == ncclFloat8e4m3 || op->dtype == ncclFloat8e5m2)) {
        int low = op->comm->device;
        for (int k = 0; k < n; k++) {
            ncclComm_t p = op->comm->clique->ranks[k];
            if (p != NULL && F.cc[p->device] < F.cc[low])
                low = p->device;
        }
        if (F.cc[low] < 9) {
            fake_error("%s: fp8 reduction on a communicator with device %d of compute capability "
                       "%d (NCCL needs sm90 on every rank)",
                       c->fn, low, F.cc[low]);
            return ncclInvalidArgument;
        }
        /* Ranks in other processes too: NCCL computed minCompCap from every peer's info
         * at init (init.cc). */
        if (op->comm->clique->xp != NULL && fake_xp_min_cc(op->comm->clique->xp) < 9) {
            fake_error("%s: fp8 reduction on a communicator with a rank in another process of "
                       "compute capability %d (NCCL needs sm90 on every rank)",
                       c->fn, fake_xp_min_cc(op->comm->clique->xp));
            return ncclInvalidArgument;
        }
    }
    /* NCCL turns fp8 ncclAvg into a pre-multiplied sum (enqueue.cc, hostToDevRedOp) and
     * runs a one-rank communicator's collective through ncclLaunchOneRank (onerank.cu),
     * whose fp8 cases are compiled out of the host code: ncclInvalidArgument. */
    if (n == 1 && ki->reduces && op->redop == ncclAvg &&
        (op->dtype == ncclFloat8e4m3 || op->dtype == ncclFloat8e5m2)) {
        fake_error("%s: fp8 ncclAvg on a one-rank communicator (NCCL's one-rank kernel has no "
                   "fp8 pre-multiplied sum)",
                   c->fn);
        return ncclInvalidArgument;
    }
    sb = coll_bytes(op, true, n);
    db = coll_bytes(op, false, n);
    /* With NCCL_CHECK_POINTERS=1, ArgsCheck (misc/argcheck.cc) checks sendbuff on every
     * rank except a broadcast's non-roots and recvbuff on every rank except a reduce's
     * non-roots, whether the rank uses the buffer or not: the fake always checks so. */
    if (op->count > 0 && ((op->src == NULL && !(op->kind == OP_BROADCAST && rank != op->root)) ||
                          (op->dst == NULL && !(op->kind == OP_REDUCE && rank != op->root)))) {
        fake_error("%s: rank %d of %d (root %d): NULL %s, which NCCL_CHECK_POINTERS=1 refuses",
                   c->fn, rank, n, op->root, op->src == NULL ? "sendbuff" : "recvbuff");
        return ncclInvalidArgument;
    }
    if ((sb > 0 && op->src == NULL) || (db > 0 && op->dst == NULL)) {
        fake_error("%s: rank %d of %d (root %d) passed a NULL %s for %zu elements", c->fn, rank, n,
                   op->root, sb > 0 && op->src == NULL ? "sendbuff" : "recvbuff", op->count);
        return ncclInvalidArgument;
    }
    /* Device memory (cudaMalloc'd) must hold what the call uses; host arrays of a test
     * cannot be checked. */
    for (int b = 0; b < 2; b++) {
        const void *ptr = b == 0 ? op->src : (const void *)op->dst;
        size_t bytes = b == 0 ? sb : db;
        if (bytes > 0 && mem_find(ptr, 0) != NULL && mem_find(ptr, bytes) == NULL) {
            fake_error("%s: rank %d: %s %p does not hold the %zu bytes the call uses", c->fn, rank,
                       b == 0 ? "sendbuff" : "recvbuff", ptr, bytes);
            return ncclInvalidArgument;
        }
    }
    if (sb > 0 && db > 0 && s0 < d0 + db && d0 < s0 + sb) {
        bool in_place;
        switch (op->kind) {
        case OP_ALLGATHER:
            in_place = s0 == d0 + (uintptr_t)rank * blk;
            break;
        case OP_REDUCESCATTER:
            in_place = d0 == s0 + (uintptr_t)rank * blk;
            break;
        case OP_ALLTOALL:
            in_place = false;
            break;
        case OP_GATHER:
            in_place = s0 == d0 + (uintptr_t)op->root * blk;
            break;
        case OP_SCATTER:
            in_place = d0 == s0 + (uintptr_t)op->root * blk;
            break;
        default:
            in_place = s0 == d0;
            break;
        }
        if (!in_place) {
            fake_error("%s: rank %d: sendbuff %p (%zu bytes) and recvbuff %p (%zu bytes) overlap "
                       "outside the in-place position",
                       c->fn, rank, op->src, sb, (void *)op->dst, db);
            return ncclInvalidArgument;
        }
    }
    return ncclSuccess;
}

/* Common part of the operations: check, then collect (or run alone outside a group). */
static int add_op(fake_call *c, int r, const fake_op *op, cudaStream_t stream)
{
    ncclComm_t comm = op->comm;
    bool coll = is_coll(op->kind);
    set_comm(c, comm);
    c->stream = stream;
    c->src = op->src;
    c->dst = op->dst;
    c->count = op->count;
    c->dtype = (int)op->dtype;
    c->op = coll && coll_info[op->kind].reduces ? (int)op->redop : -1;
    if (coll && coll_info[op->kind].rooted)
        c->root = op->root;
    if (!coll) {
        c->peer = op->peer;
        if (comm != NULL && op->peer >= 0 && op->peer < comm->clique->nranks &&
            comm->clique->ranks[op->peer] != NULL)
            c->peer_device = comm->clique->ranks[op->peer]->device;
    }
    if (r == ncclSuccess && (!comm_ok(comm, c->fn) || !stream_ok(stream, c->fn)))
        r = ncclInvalidArgument;
    if (r == ncclSuccess && comm->revoked) {
        fake_error("%s on a revoked communicator (rank %d)", c->fn, comm->rank);
        r = ncclInvalidUsage;
    }
    if (r == ncclSuccess &&
        ((unsigned)op->dtype >= ncclNumTypes ||
         (coll && coll_info[op->kind].reduces && (unsigned)op->redop >= ncclNumOps) ||
         (!coll && c->peer_device < 0 && !xp_remote_peer(comm, op->peer))))
        r = ncclInvalidArgument;
    if (r == ncclSuccess && stream != NULL && stream->device != comm->device) {
        fake_error("%s: stream of device %d for a communicator of device %d", c->fn, stream->device,
                   comm->device);
        r = ncclInvalidArgument;
    }
    /* A non-blocking communicator whose last group is still being launched (ncclGroupEnd
     * returned ncclInProgress and ncclCommGetAsyncError has not reported the end yet)
     * refuses every call: "use of a communicator before the previous operation returned
     * ncclSuccess". */
    if (r == ncclSuccess && (comm->pending > 0 || comm->connecting)) {
        fake_error("%s: communicator of device %d used while still ncclInProgress", c->fn,
                   comm->device);
        r = ncclInvalidArgument;
    }
    if (r == ncclSuccess && comm->clique->xp != NULL &&
        fake_xp_joining(comm->clique->xp, comm->rank)) {
        fake_error("%s: communicator of device %d used while its peers are still joining", c->fn,
                   comm->device);
        r = ncclInvalidArgument;
    }
    /* NCCL runs a one-rank communicator's operation at the call (a copy or a kernel on the
     * stream), on the calling thread's current device, even inside a group: a launch on a
     * stream of another device fails. */
    if (r == ncclSuccess && comm->clique->nranks == 1 && cur_dev != comm->device) {
        fake_error("%s: one-rank communicator of device %d called with device %d current", c->fn,
                   comm->device, cur_dev);
        r = ncclUnhandledCudaError;
    }
    if (r == ncclSuccess && coll)
        r = coll_check(c, op);
    /* Only a failed NCCL call sets the group's error (ncclGroupErrCheck in ncclEnqueueCheck,
     * enqueue.cc): a CUDA error or anything else the caller hits between two calls does
     * not, and ncclGroupEnd then launches what the group holds. */
    if (r != ncclSuccess) {
        if (grp.depth > 0 && grp.err == ncclSuccess)
            grp.err = (ncclResult_t)r;
        return r;
    }
    grp_add(op);
    grp.ops[grp.n - 1].stream = stream;
    /* A one-rank collective is queued at the call, inside a group too (taskAppend ->
     * ncclLaunchOneRank, enqueue.cc): its buffers are written even if the group fails. */
    if (coll && comm->clique->nranks == 1 && (stream == NULL || !stream_busy(stream))) {
        const fake_op *self = &grp.ops[grp.n - 1];
        coll_execute(self, &self, 1);
        grp.ops[grp.n - 1].ran = true;
    } /* behind unfinished work of its stream, it runs when the group's work does */
    return grp.depth > 0 ? ncclSuccess : grp_end(ncclSuccess);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    int r;
    fake_call *c = enter("ncclAllReduce", &r);
    fake_op o = {.kind = OP_ALLREDUCE,
                 .comm = comm,
                 .src = sendbuff,
                 .dst = recvbuff,
                 .count = count,
                 .dtype = datatype,
                 .redop = op};
    return (ncclResult_t)leave(c, add_op(c, r, &o, stream));
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    int r;
    fake_call *c = enter("ncclSend", &r);
    fake_op o = {.kind = OP_SEND,
                 .comm = comm,
                 .src = sendbuff,
                 .count = count,
                 .dtype = datatype,
                 .peer = peer};
    return (ncclResult_t)leave(c, add_op(c, r, &o, stream));
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    int r;
    fake_call *c = enter("ncclRecv", &r);
    fake_op o = {.kind = OP_RECV,
                 .comm = comm,
                 .dst = recvbuff,
                 .count = count,
                 .dtype = datatype,
                 .peer = peer};
    return (ncclResult_t)leave(c, add_op(c, r, &o, stream));
}

/* The other collectives: nccl.h's signatures; counts as NCCL defines them (all_gather:
 * sendcount, reduce_scatter: recvcount, alltoall: per peer, gather/scatter: per rank). */
static ncclResult_t coll_call(const char *fn, int kind, const void *sendbuff, void *recvbuff,
                              size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root,
                              ncclComm_t comm, cudaStream_t stream)
{
    int r;
    fake_call *c = enter(fn, &r);
    /* NCCL added these three in 2.28: an older library does not have the symbols at all
     * (the program would not load, or would stop at the call). */
    if (r == ncclSuccess && (kind == OP_ALLTOALL || kind == OP_GATHER || kind == OP_SCATTER) &&
        F.version < NCCL_VERSION(2, 28, 0)) {
        fake_error("%s called, but the emulated NCCL %d does not have it (added in 2.28)", fn,
                   F.version);
        r = ncclInvalidUsage;
    }
    fake_op o = {.kind = kind,
                 .comm = comm,
                 .src = sendbuff,
                 .dst = recvbuff,
                 .count = count,
                 .dtype = datatype,
                 .redop = op,
                 .root = root};
    return (ncclResult_t)leave(c, add_op(c, r, &o, stream));
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return coll_call("ncclBroadcast", OP_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum,
                     root, comm, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    return coll_call("ncclReduce", OP_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm,
                     stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return coll_call("ncclAllGather", OP_ALLGATHER, sendbuff, recvbuff, sendcount, datatype,
                     ncclSum, -1, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    return coll_call("ncclReduceScatter", OP_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype,
                     op, -1, comm, stream);
}

ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return coll_call("ncclAlltoAll", OP_ALLTOALL, sendbuff, recvbuff, count, datatype, ncclSum, -1,
                     comm, stream);
}

ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        int root, ncclComm_t comm, cudaStream_t stream)
{
    return coll_call("ncclGather", OP_GATHER, sendbuff, recvbuff, count, datatype, ncclSum, root,
                     comm, stream);
}

ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return coll_call("ncclScatter", OP_SCATTER, sendbuff, recvbuff, count, datatype, ncclSum, root,
                     comm, stream);
}

/* ---- Test controls ---- */

void fake_reset(void)
{
    lock();
    free_all_locked();
    unlock();
}

void fake_set_devices(int n, int cc_major)
{
    lock();
    F.ndev = n < 0 ? 0 : n > FAKE_MAX_DEV ? FAKE_MAX_DEV : n;
    for (int d = 0; d < FAKE_MAX_DEV; d++)
        F.cc[d] = cc_major;
    unlock();
}

void fake_set_nccl_version(int version)
{
    lock();
    F.version = version;
    unlock();
}

void fake_set_launch_in_progress(bool on, long us)
{
    lock();
    F.launch_in_progress = on;
    F.launch_ns = us > 0 ? (long long)us * 1000 : 0;
    unlock();
}

void fake_set_runtime_connect(bool on)
{
    lock();
    F.no_runtime_connect = !on;
    unlock();
}

void fake_set_pending(int n)
{
    lock();
    F.pending = n;
    unlock();
}

void fake_hold_async(bool hold)
{
    lock();
    F.hold = hold;
    unlock();
}

void fake_set_manual_events(bool manual)
{
    lock();
    F.manual = manual;
    unlock();
}

void fake_hold_abort(bool hold)
{
    lock();
    F.abort_hold = hold;
    pthread_cond_broadcast(&fake_abort_cond);
    unlock();
}

void fake_hold_init(bool hold)
{
    lock();
    F.init_hold = hold;
    pthread_cond_broadcast(&fake_abort_cond);
    unlock();
}

int fake_inits_blocked(void)
{
    int n;
    lock();
    n = F.inits_blocked;
    unlock();
    return n;
}

int fake_aborts_blocked(void)
{
    int n;
    lock();
    n = F.abort_hold ? F.aborts_blocked : 0;
    unlock();
    return n;
}

void fake_set_device_cc(int device, int cc_major)
{
    lock();
    if (device >= 0 && device < FAKE_MAX_DEV)
        F.cc[device] = cc_major;
    unlock();
}

void fake_set_abort_keeps_events(bool keep)
{
    lock();
    F.abort_keeps = keep;
    unlock();
}

void fake_complete_events(void)
{
    lock();
    complete_events_locked();
    unlock();
}

void fake_complete_events_at_next_group(void)
{
    lock();
    F.complete_at_group = true;
    unlock();
}

void fake_set_last_error(const char *msg)
{
    lock();
    snprintf(F.last_error, sizeof F.last_error, "%s", msg);
    unlock();
}

void fake_script(const char *fn, int result)
{
    lock();
    if (F.nscripts == FAKE_MAX_SCRIPTS) { /* drop the consumed ones, keeping the order */
        size_t k = 0;
        for (size_t i = 0; i < F.nscripts; i++)
            if (F.scripts[i].live)
                F.scripts[k++] = F.scripts[i];
        F.nscripts = k;
    }
    if (F.nscripts == FAKE_MAX_SCRIPTS || strlen(fn) >= sizeof F.scripts[0].fn)
        abort(); /* a test bug */
    snprintf(F.scripts[F.nscripts].fn, sizeof F.scripts[0].fn, "%s", fn);
    F.scripts[F.nscripts].result = result;
    F.scripts[F.nscripts++].live = true;
    unlock();
}

void fake_script_async_error(int rank, ncclResult_t err)
{
    lock();
    if (F.nasync == FAKE_MAX_SCRIPTS)
        abort();
    F.async[F.nasync].rank = rank;
    F.async[F.nasync].err = err;
    F.async[F.nasync++].live = true;
    unlock();
}

cudaStream_t fake_user_stream(int device)
{
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (s == NULL)
        abort();
    s->device = device;
    s->user = true;
    lock();
    s->hwq = device >= 0 && device < FAKE_MAX_DEV ? F.nstreams_dev[device]++ % F.connections : 0;
    s->next = F.streams;
    F.streams = s;
    unlock();
    return s;
}

int fake_current_device(void)
{
    return cur_dev;
}

CUcontext fake_current_context(void)
{
    return cur_ctx;
}

CUcontext fake_context_create(int device)
{
    CUcontext ctx;
    lock();
    if (nuser_ctx == FAKE_MAX_USER_CTX || device < 0 || device >= FAKE_MAX_DEV)
        abort(); /* a test bug */
    ctx = &user_ctx[nuser_ctx++];
    ctx->device = device;
    ctx->primary = false;
    unlock();
    return ctx;
}

void fake_context_set(CUcontext ctx)
{
    ctx_make_current(ctx);
}

bool fake_primary_used(int device)
{
    bool used;
    lock();
    used = device >= 0 && device < FAKE_MAX_DEV && F.primary_used[device];
    unlock();
    return used;
}

void fake_set_capturing(cudaStream_t stream, bool capturing)
{
    lock();
    if (stream == NULL)
        F.capturing_all = capturing;
    else
        F.capturing = capturing ? stream : NULL;
    unlock();
}

int fake_stream_priority(cudaStream_t stream)
{
    return stream != NULL ? stream->priority : 0;
}

int fake_live(const char *kind)
{
    int n = 0;
    lock();
    if (strcmp(kind, "stream") == 0) {
        for (struct CUstream_st *s = F.streams; s != NULL; s = s->next)
            n += !s->user && !s->destroyed;
    } else if (strcmp(kind, "event") == 0) {
        for (struct CUevent_st *e = F.events; e != NULL; e = e->next)
            n += !e->destroyed;
    } else if (strcmp(kind, "mem") == 0) {
        for (fake_mem *m = F.mems; m != NULL; m = m->next)
            n += !m->freed;
    } else if (strcmp(kind, "comm") == 0) {
        for (struct ncclComm *c = F.comms; c != NULL; c = c->next)
            n += !c->destroyed && !c->aborted;
    }
    unlock();
    return n;
}

int fake_errors(char *buf, size_t len)
{
    int n;
    lock();
    n = F.nerrors;
    if (len > 0)
        snprintf(buf, len, "%s", F.error);
    unlock();
    return n;
}

size_t fake_log_size(void)
{
    size_t n;
    lock();
    n = F.nlog;
    unlock();
    return n;
}

bool fake_log_get(size_t i, fake_call *out)
{
    bool ok;
    lock();
    ok = i < F.nlog;
    if (ok)
        *out = F.log[i];
    unlock();
    return ok;
}

long fake_log_find(const char *fn, size_t from)
{
    long found = -1;
    lock();
    for (size_t i = from; i < F.nlog && found < 0; i++)
        if (strcmp(F.log[i].fn, fn) == 0)
            found = (long)i;
    unlock();
    return found;
}

size_t fake_log_count(const char *fn)
{
    size_t n = 0;
    lock();
    for (size_t i = 0; i < F.nlog; i++)
        n += strcmp(F.log[i].fn, fn) == 0;
    unlock();
    return n;
}

void fake_log_reset(void)
{
    lock();
    F.nlog = 0;
    unlock();
}

void fake_log_dump(void)
{
    lock();
    for (size_t i = 0; i < F.nlog; i++) {
        const fake_call *c = &F.log[i];
        fprintf(stderr,
                "%5zu %-26s r=%d dev=%d stream=%p event=%p comm=%p rank=%d/%d peer=%d root=%d "
                "count=%zu dtype=%d op=%d src=%p dst=%p value=%d\n",
                i, c->fn, c->result, c->device, (void *)c->stream, (void *)c->event,
                (void *)c->comm, c->rank, c->nranks, c->peer, c->root, c->count, c->dtype, c->op,
                c->src, c->dst, c->value);
    }
    unlock();
}

/* ---- Driver entry points and stream memory operations (GPU-side waits) ---- */

/*
 * Queued work of streams, in the order it was queued: an item runs once every earlier item
 * of its stream has run. A wait runs when its 64-bit value is reached (CUDA's GEQ: as a
 * signed difference); a write of a communication stream when the stream's earlier work is
 * done (at once with automatic events; with manual events at fake_complete_events(), or
 * when an abort drains the device, before the events complete, as on a GPU); a user
 * "kernel" (fake_user_launch) when it reaches the head; an event record behind unfinished
 * work completes the event when it runs, and a wait for such a record (cudaStreamWaitEvent)
 * runs once it did; a group's work queued behind unfinished work (grp_execute) runs once it
 * reached the head of every stream it uses, all at once.
 *
 * Hardware queues: the streams of a device share F.connections queues (CUDA_DEVICE_MAX_
 * CONNECTIONS, CUDA's default 8), in creation order mod that number. A wait (value or event)
 * that is not satisfied blocks its whole queue, not only its stream: nothing queued after it
 * on any stream of that queue runs until it is (stream memory operations are not visible to
 * CUDA's scheduling: cuda.h, cuStreamWaitValue64). Kernels and writes that are not ready
 * hold back their own stream only.
 */
enum { MO_WAIT, MO_WRITE, MO_KERNEL, MO_RECORD, MO_EVWAIT, MO_GROUP };

/* A group whose work waits behind queued work: a copy of its calls, and how many of its
 * streams' items (one per stream) reached their stream's head. */
typedef struct fake_qgroup {
    fake_op *ops;
    size_t n;
    int items, arrived;
    bool aborted; /* a device of it was aborted: its kernels exit, nothing is computed */
} fake_qgroup;

typedef struct fake_memop {
    int kind;
    cudaStream_t stream;
    uint64_t *addr;
    uint64_t value;
    void (*fn)(void *);
    void *arg;
    cudaEvent_t event;  /* MO_RECORD, MO_EVWAIT */
    fake_qgroup *group; /* MO_GROUP */
    bool ready, done, arrived;
    bool stuck;         /* a write behind the work of a failed collective (as events: see stuck) */
    uint64_t xp_ticket; /* a write: cross-process work launched on its stream before it */
    struct fake_memop *next;
} fake_memop;

typedef struct fake_hostmem {
    void *ptr;
    bool freed;
    struct fake_hostmem *next;
} fake_hostmem;

static struct {
    int mode; /* FAKE_MEMOPS_* */
    fake_memop *head, *tail;
    fake_hostmem *hostmems;
} M;

static void qgroup_unref(fake_qgroup *g)
{
    if (--g->items == 0) {
        free(g->ops);
        free(g);
    }
}

static void memops_reset_locked(void)
{
    for (fake_memop *o = M.head, *n; o != NULL; o = n) {
        n = o->next;
        if (o->kind == MO_GROUP)
            qgroup_unref(o->group);
        free(o);
    }
    for (fake_hostmem *h = M.hostmems, *n; h != NULL; h = n) {
        n = h->next;
        if (!h->freed)
            free(h->ptr);
        free(h);
    }
    memset(&M, 0, sizeof M);
}

static bool value_reached(const uint64_t *addr, uint64_t value)
{
    return (int64_t)(__atomic_load_n(addr, __ATOMIC_ACQUIRE) - value) >= 0;
}

static void memop_finish(fake_memop *o)
{
    o->done = true;
    o->stream->mo_pending--;
}

/* A queued group reached the head of all its streams: run it, finish all its items. */
static void qgroup_run(fake_qgroup *g)
{
    if (!g->aborted)
        ops_execute(g->ops, g->n);
    for (fake_memop *o = M.head; o != NULL; o = o->next)
        if (o->kind == MO_GROUP && o->group == g && !o->done)
            memop_finish(o);
}

/* Run what can run, in queue order per stream and per hardware queue: passes over the
 * queue until one makes no progress. Lock held. */
static void memops_pump_locked(void)
{
    static bool qblocked[FAKE_MAX_DEV][32];
    bool progress = true;
    while (progress) {
        progress = false;
        memset(qblocked, 0, sizeof qblocked);
        for (fake_memop *o = M.head; o != NULL; o = o->next)
            o->stream->mo_blocked = false;
        for (fake_memop *o = M.head; o != NULL; o = o->next) {
            bool *qb = &qblocked[o->stream->device][o->stream->hwq];
            if (o->done)
                continue;
            if (o->stream->mo_blocked || *qb) {
                o->stream->mo_blocked = true; /* its stream's later items wait too */
                continue;
            }
            /* Waits that are not satisfied block their hardware queue. */
            if ((o->kind == MO_WAIT && !value_reached(o->addr, o->value)) ||
                (o->kind == MO_EVWAIT &&
                 (o->event->queued || !o->event->complete || fake_xp_event_pending(o->event)))) {
                o->stream->mo_blocked = true;
                *qb = true;
                continue;
            }
            if (o->kind == MO_WRITE &&
                (!o->ready || fake_xp_stream_pending(o->stream, o->xp_ticket))) {
                o->stream->mo_blocked = true;
                continue;
            }
            if (o->kind == MO_GROUP) {
                if (!o->arrived) {
                    o->arrived = true;
                    o->group->arrived++;
                    progress = true;
                }
                if (o->group->aborted || o->group->arrived == o->group->items) {
                    if (o->group->aborted)
                        memop_finish(o); /* its kernels exit one by one */
                    else
                        qgroup_run(o->group);
                    progress = true;
                } else {
                    o->stream->mo_blocked = true; /* a kernel waiting for its peers */
                }
                continue;
            }
            if (o->kind == MO_WRITE)
                __atomic_store_n(o->addr, o->value, __ATOMIC_RELEASE);
            if (o->kind == MO_KERNEL)
                o->fn(o->arg);
            if (o->kind == MO_RECORD) {
                cudaEvent_t e = o->event;
                e->queued = false;
                e->stuck = device_stuck(e->device);
                e->complete = !F.manual && !e->stuck;
            }
            memop_finish(o);
            progress = true;
        }
    }
    /* Forget what ran (the queue holds pending work only). */
    fake_memop **pp = &M.head;
    M.tail = NULL;
    while (*pp != NULL) {
        fake_memop *o = *pp;
        if (o->done) {
            *pp = o->next;
            if (o->kind == MO_GROUP)
                qgroup_unref(o->group);
            free(o);
        } else {
            M.tail = o;
            pp = &o->next;
        }
    }
}

/* The GPU finishes by itself: queued writes that are not stuck behind a failed
 * collective's work run (as complete_events_locked completes events). Lock held. */
static void memops_complete_locked(void)
{
    for (fake_memop *o = M.head; o != NULL; o = o->next)
        if (o->kind == MO_WRITE && !o->stuck)
            o->ready = true;
    memops_pump_locked();
}

/* An abort on `device`: its streams drain (their writes run), unless the test keeps them
 * (as it keeps the events). Lock held. */
static void memops_abort_locked(int device, bool keep)
{
    for (fake_memop *o = M.head; o != NULL; o = o->next) {
        if (o->kind == MO_WRITE && o->stream->device == device) {
            o->stuck = false;
            o->ready |= !keep;
        }
        if (o->kind == MO_GROUP && o->stream->device == device)
            o->group->aborted = true; /* the aborted kernels exit */
    }
    memops_pump_locked();
}

static fake_memop *memop_add(int kind, cudaStream_t stream, uint64_t *addr, uint64_t value,
                             void (*fn)(void *), void *arg)
{
    fake_memop *o = calloc(1, sizeof *o);
    if (o == NULL)
        abort();
    *o = (fake_memop){
        .kind = kind, .stream = stream, .addr = addr, .value = value, .fn = fn, .arg = arg};
    if (kind == MO_WRITE) {
        o->stuck = device_stuck(stream->device);
        o->ready = !F.manual && !o->stuck;
        o->xp_ticket = fake_xp_ticket(); /* runs after the stream's cross-process work */
    }
    if (M.tail)
        M.tail->next = o;
    else
        M.head = o;
    M.tail = o;
    stream->mo_pending++;
    return o;
}

/* After an item was queued on s: behind earlier work of s it cannot run, nor unblock
 * anything (it is last in the queue), so a pump is needed only when it is alone there. */
static void memops_pump_new(cudaStream_t s)
{
    if (s->mo_pending == 1)
        memops_pump_locked();
}

static bool stream_busy(cudaStream_t s)
{
    memops_pump_locked();
    if (s->mo_pending > 0)
        return true;
    for (fake_memop *o = M.head; o != NULL; o = o->next)
        if (!o->done && (o->kind == MO_WAIT || o->kind == MO_EVWAIT) &&
            o->stream->device == s->device && o->stream->hwq == s->hwq)
            return true; /* a wait blocks its hardware queue */
    return false;
}

static void memop_record(cudaEvent_t e, cudaStream_t s)
{
    memop_add(MO_RECORD, s, NULL, 0, NULL, NULL)->event = e;
    memops_pump_locked();
}

static void memop_evwait(cudaStream_t s, cudaEvent_t e)
{
    memop_add(MO_EVWAIT, s, NULL, 0, NULL, NULL)->event = e;
    memops_pump_locked();
}

static void memop_group(const fake_op *ops, size_t n)
{
    fake_qgroup *g = calloc(1, sizeof *g);
    cudaStream_t seen[64];
    int nseen = 0;
    if (g == NULL || (g->ops = malloc(n * sizeof *ops)) == NULL)
        abort();
    memcpy(g->ops, ops, n * sizeof *ops);
    g->n = n;
    for (size_t i = 0; i < n; i++) {
        cudaStream_t s = ops[i].stream;
        bool dup = false;
        if (ops[i].kind == OP_INIT || ops[i].comm->clique->xp != NULL || s == NULL)
            continue;
        for (int k = 0; k < nseen && !dup; k++)
            dup = seen[k] == s;
        if (dup)
            continue;
        if (nseen == (int)(sizeof seen / sizeof seen[0]))
            abort(); /* a test with more streams in one group than the fake follows */
        seen[nseen++] = s;
        g->items++;
        memop_add(MO_GROUP, s, NULL, 0, NULL, NULL)->group = g;
    }
    memops_pump_locked();
}

static CUresult fake_cuDeviceGet(CUdevice *device, int ordinal)
{
    int r;
    fake_call *c = enter("cuDeviceGet", &r);
    c->device = ordinal;
    if (r == CUDA_SUCCESS && (ordinal < 0 || ordinal >= F.ndev))
        r = CUDA_ERROR_INVALID_DEVICE;
    if (r == CUDA_SUCCESS)
        *device = ordinal;
    return (CUresult)leave(c, r);
}

static CUresult fake_cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    int r;
    fake_call *c = enter("cuDeviceGetAttribute", &r);
    c->device = dev;
    c->value = (int)attrib;
    if (r == CUDA_SUCCESS)
        *pi = attrib == CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS
                  ? M.mode != FAKE_MEMOPS_NO_ATTRIBUTE
                  : 0;
    return (CUresult)leave(c, r);
}

static bool host_mapped(const void *p)
{
    for (fake_hostmem *h = M.hostmems; h != NULL; h = h->next)
        if (!h->freed && (const char *)p >= (const char *)h->ptr &&
            (const char *)p < (const char *)h->ptr + 4096 * 16)
            return true;
    return false;
}

static CUresult fake_cuStreamWaitValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value,
                                         unsigned int flags)
{
    int r;
    fake_call *c = enter("cuStreamWaitValue64", &r);
    c->stream = stream;
    c->dst = (void *)(uintptr_t)addr;
    c->count = (size_t)value;
    c->value = (int)flags;
    if (r == CUDA_SUCCESS && (stream == NULL || !stream_ok(stream, c->fn)))
        r = CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS && (!host_mapped((void *)(uintptr_t)addr) || (addr & 7) != 0)) {
        fake_error("cuStreamWaitValue64: %p is not an aligned word of mapped host memory",
                   (void *)(uintptr_t)addr);
        r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r == CUDA_SUCCESS && flags != CU_STREAM_WAIT_VALUE_GEQ) {
        fake_error("cuStreamWaitValue64: flags %u (the fake knows GEQ only)", flags);
        r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r == CUDA_SUCCESS) {
        memop_add(MO_WAIT, stream, (uint64_t *)(uintptr_t)addr, value, NULL, NULL);
        memops_pump_new(stream);
    }
    return (CUresult)leave(c, r);
}

static CUresult fake_cuStreamWriteValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value,
                                          unsigned int flags)
{
    int r;
    fake_call *c = enter("cuStreamWriteValue64", &r);
    c->stream = stream;
    c->dst = (void *)(uintptr_t)addr;
    c->count = (size_t)value;
    c->value = (int)flags;
    if (r == CUDA_SUCCESS && (stream == NULL || !stream_ok(stream, c->fn)))
        r = CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS && (!host_mapped((void *)(uintptr_t)addr) || (addr & 7) != 0)) {
        fake_error("cuStreamWriteValue64: %p is not an aligned word of mapped host memory",
                   (void *)(uintptr_t)addr);
        r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r == CUDA_SUCCESS && stream->device != cur_dev) {
        fake_error("cuStreamWriteValue64: stream of device %d while device %d is current",
                   stream->device, cur_dev);
    }
    if (r == CUDA_SUCCESS) {
        memop_add(MO_WRITE, stream, (uint64_t *)(uintptr_t)addr, value, NULL, NULL);
        memops_pump_new(stream);
    }
    return (CUresult)leave(c, r);
}

static CUresult fake_cuCtxGetCurrent(CUcontext *pctx)
{
    int r;
    fake_call *c = enter("cuCtxGetCurrent", &r);
    c->src = cur_ctx;
    c->device = cur_ctx != NULL ? cur_ctx->device : -1;
    if (r == CUDA_SUCCESS)
        *pctx = cur_ctx;
    return (CUresult)leave(c, r);
}

/* NULL makes no context current (the thread is back to "none"). */
static CUresult fake_cuCtxSetCurrent(CUcontext ctx)
{
    int r;
    fake_call *c = enter("cuCtxSetCurrent", &r);
    c->src = ctx;
    c->device = ctx != NULL ? ctx->device : -1;
    if (r == CUDA_SUCCESS)
        ctx_make_current(ctx);
    return (CUresult)leave(c, r);
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus)
{
    int r;
    fake_call *c = enter("cudaGetDriverEntryPointByVersion", &r);
    void *fn = NULL;
    c->value = (int)cudaVersion;
    (void)flags;
    if (strcmp(symbol, "cuDeviceGet") == 0)
        fn = (void *)fake_cuDeviceGet;
    else if (strcmp(symbol, "cuDeviceGetAttribute") == 0)
        fn = (void *)fake_cuDeviceGetAttribute;
    else if (strcmp(symbol, "cuCtxGetCurrent") == 0)
        fn = (void *)fake_cuCtxGetCurrent;
    else if (strcmp(symbol, "cuCtxSetCurrent") == 0)
        fn = (void *)fake_cuCtxSetCurrent;
    else if (strcmp(symbol, "cuStreamWaitValue64") == 0 && M.mode != FAKE_MEMOPS_NO_SYMBOL)
        fn = (void *)fake_cuStreamWaitValue64;
    else if (strcmp(symbol, "cuStreamWriteValue64") == 0 && M.mode != FAKE_MEMOPS_NO_SYMBOL)
        fn = (void *)fake_cuStreamWriteValue64;
    *funcPtr = r == cudaSuccess ? fn : NULL;
    if (driverStatus != NULL)
        *driverStatus = fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return (cudaError_t)leave(c, r);
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    int r;
    fake_call *c = enter("cudaHostAlloc", &r);
    c->count = size;
    c->value = (int)flags;
    if (r == cudaSuccess && size > 4096 * 16) {
        fake_error("cudaHostAlloc: the fake maps at most 64 KiB (%zu asked)", size);
        r = cudaErrorMemoryAllocation;
    }
    if (r == cudaSuccess) {
        fake_hostmem *h = calloc(1, sizeof *h);
        ctx_need();
        if (h == NULL || (h->ptr = calloc(1, 4096 * 16)) == NULL)
            abort();
        h->next = M.hostmems;
        M.hostmems = h;
        *pHost = c->dst = h->ptr;
        /* Not zeroed by CUDA: fill with garbage so a missing initialisation shows. */
        memset(h->ptr, 0xa5, size);
    }
    return (cudaError_t)leave(c, r);
}

cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
    int r;
    fake_call *c = enter("cudaHostGetDevicePointer", &r);
    c->src = pHost;
    c->value = (int)flags;
    if (r == cudaSuccess && !host_mapped(pHost))
        r = cudaErrorInvalidValue;
    if (r == cudaSuccess)
        *pDevice = pHost; /* unified addressing */
    return (cudaError_t)leave(c, r);
}

cudaError_t cudaFreeHost(void *ptr)
{
    int r;
    fake_call *c = enter("cudaFreeHost", &r);
    c->dst = ptr;
    fake_hostmem *h = M.hostmems;
    while (h != NULL && (h->freed || h->ptr != ptr))
        h = h->next;
    if (r == cudaSuccess && h == NULL)
        r = cudaErrorInvalidValue;
    if (r == cudaSuccess) {
        /* Waits still queued on it would read freed memory on a GPU. */
        for (fake_memop *o = M.head; o != NULL; o = o->next)
            if (!o->done && o->addr != NULL && (char *)o->addr >= (char *)ptr &&
                (char *)o->addr < (char *)ptr + 4096 * 16)
                fake_error("cudaFreeHost: a queued stream memory operation still reads it");
        h->freed = true;
        free(h->ptr);
    }
    return (cudaError_t)leave(c, r);
}

void fake_set_connections(int n)
{
    lock();
    F.connections = n < 1 ? 1 : n > 32 ? 32 : n;
    unlock();
}

void fake_set_memops(int mode)
{
    lock();
    M.mode = mode;
    unlock();
}

void fake_user_launch(cudaStream_t stream, void (*fn)(void *), void *arg)
{
    lock();
    memop_add(MO_KERNEL, stream, NULL, 0, fn, arg);
    memops_pump_new(stream);
    unlock();
}

void fake_pump(void)
{
    lock();
    memops_pump_locked();
    unlock();
}

size_t fake_stream_pending(cudaStream_t stream)
{
    size_t n = 0;
    lock();
    memops_pump_locked();
    for (fake_memop *o = M.head; o != NULL; o = o->next)
        n += !o->done && o->stream == stream;
    unlock();
    return n;
}
