/* The host backend: N virtual devices whose buffers are host memory. A batch is cut into
 * chunks that a small worker pool runs; tiny batches run inline on the scheduler thread.
 * Completions come back through poll(), exactly as GPU completions do. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/backend.h"
#include "backends/host/reduce.h"
#include "backends/host/engine.h"
#include "backends/module.h"
#include "queue/mpsc.h"
#include "queue/wake.h"

/* Batches that move fewer bytes than this run on the scheduler thread: handing them to a
 * worker (a futex wake and a cache migration, ~5-20 us) would cost more than the copy. */
#define HOST_INLINE_BYTES (128u * 1024u)
/* Smallest chunk a worker takes (per buffer), so per-chunk overhead stays negligible. */
#define HOST_MIN_CHUNK_BYTES (256u * 1024u)
/* Batches up to this size (bytes over all parts) get chunks run by the scheduler thread as
 * well as by the workers (about 1 ms of copying at most). */
#define HOST_CALLER_RUNS_BYTES (16u * 1024u * 1024u)
/* Default working set (inputs + outputs of all ranks) from which outputs use streaming
 * stores (cfg.host_stream_bytes overrides it). */
#define HOST_NT_BYTES (64ull * 1024u * 1024u)

typedef struct host_comm {
    uint32_t n;
    _Atomic uint32_t aborted;
    ccq_heng_comm *eng; /* communicators spanning processes: their engine side */
} host_comm;

/* A batch holding operations across processes: engine operations the scheduler tests in
 * poll(). */
typedef struct host_xbatch {
    ccq_be_batch *b;
    struct host_xbatch *next;
    uint64_t deadline; /* the engine's own: a little before the runtime's watchdog */
    uint32_t pending;
    void **staged;    /* [nops] or NULL: copies of stage_src sends' data */
    ccq_heng_op *h[]; /* [nops]: NULL once done (or for a local op) */
} host_xbatch;

typedef struct host_job {
    ccq_mpsc_node done_node;
    ccq_be_batch *b;
    struct host_job *next; /* pending list (jobs with unclaimed chunks) */
    uint32_t nchunks, claimed, remaining;
    size_t *first_chunk;   /* [nops + 1]: chunk index where each op starts */
    size_t *chunk_elems;   /* [nops]: elements per chunk of each op */
    uint64_t stream_bytes; /* the backend's streaming-store threshold */
    void **staged;         /* [nops] or NULL: copies of stage_src sends' data (freed in poll) */
} host_job;

typedef struct host_be {
    ccq_backend base;
    ccq_be_hooks hooks;
    uint32_t ndev;
    uint32_t nworkers;
    pthread_t *threads;
    /* mu guards the pending list and every job's claimed/remaining counts. Workers never
     * hold it while they move data. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    host_job *head, *tail;
    bool stop;
    /* Jobs with unclaimed chunks, readable without the lock: idle workers poll it for a
     * short while before they sleep on the condvar (see worker_main). */
    _Atomic uint32_t pending;
    uint64_t spin_ns;
    uint64_t stream_bytes; /* ops moving at least this many bytes use streaming stores */
    ccq_mpsc done;         /* finished jobs; the scheduler pops them in poll() */
    /* Across processes; scheduler thread only. */
    ccq_host_engine *engine; /* NULL: this runtime cannot span processes (engine_err says why) */
    ccq_errbuf engine_err;
    char ucx_why[320];     /* by default: why the ucx engine was passed over for mpi ("" if not) */
    uint64_t timeout_ns;   /* cfg->timeout_ms (UINT64_MAX: none) */
    host_xbatch *xbatches; /* batches with engine operations in flight */
    uint32_t background;   /* engine work given up on or detached, not yet ended */
} host_be;

static host_be *to_host(ccq_backend *be)
{
    return ccq_container_of(be, host_be, base);
}

/* Bytes an op reads and writes in all: what it costs, for the inline/worker decision. */
static size_t op_moved_bytes(const ccq_be_op *op)
{
    return ccq_kind_op_bytes(op->kind, op->count, ccq_dtype_size((ccq_dtype)op->dtype), op->nparts);
}

/* Copy `bytes` from src to every non-NULL dst (skipping dst == src, in place), block by
 * block, so the source is read from memory once and the copies come from cache: a
 * broadcast reads once and writes n times (n - 1 in place). */
static void copy_fanout(void *const *dst, uint32_t nd, const char *src, size_t bytes,
                        unsigned flags)
{
    for (size_t off = 0; off < bytes; off += CCQ_HOST_REDUCE_BLOCK_BYTES) {
        size_t len =
            bytes - off < CCQ_HOST_REDUCE_BLOCK_BYTES ? bytes - off : CCQ_HOST_REDUCE_BLOCK_BYTES;
        for (uint32_t k = 0; k < nd; k++)
            if (dst[k] != NULL && (const char *)dst[k] != src)
                ccq_host_copy((char *)dst[k] + off, src + off, len, flags);
    }
}

/* Run elements [begin, end) of one op. Every kind is cut along the per-rank block of
 * `count` elements, so all of them split into chunks the same way. Parts are in rank
 * order (the runtime builds them so); a NULL buffer is one this rank does not use. */
static void run_range(const ccq_be_op *op, size_t begin, size_t end, uint64_t stream_bytes)
{
    size_t es = ccq_dtype_size((ccq_dtype)op->dtype), blk = op->count * es;
    size_t off = begin * es, len = (end - begin) * es;
    uint32_t n = op->nparts;
    const void *src[CCQ_MAX_DEVICES];
    void *dst[CCQ_MAX_DEVICES];
    ccq_dtype dt = (ccq_dtype)op->dtype;
    ccq_reduce_op ro = (ccq_reduce_op)op->redop;
    /* Streaming stores once the op's working set is far beyond the caches: they skip the
     * read-for-ownership of every output line, a third of an out-of-place all_reduce's
     * traffic and nearly half of a broadcast's (measured on the 2-core machine of
     * docs/performance.md: +45% for all_reduce at 64 MiB per rank, a loss below ~32 MiB
     * in all). Never into an output that is also an input (in place): its lines are cached. */
    unsigned nt = op_moved_bytes(op) >= stream_bytes ? CCQ_HOST_REDUCE_NT : 0;

    if (begin >= end)
        return;
    switch (op->kind) {
    case CCQ_KIND_ALL_REDUCE: {
        bool in_place = false;
        for (uint32_t r = 0; r < n; r++) {
            src[r] = op->parts[r].src;
            dst[r] = op->parts[r].dst;
            in_place |= src[r] == dst[r];
        }
        ccq_host_allreduce_range_ex(dt, ro, n, src, dst, begin, end, in_place ? 0 : nt);
        break;
    }
    case CCQ_KIND_REDUCE: /* every rank's src into the root's dst */
        for (uint32_t r = 0; r < n; r++)
            src[r] = op->parts[r].src;
        dst[0] = op->parts[op->root].dst;
        ccq_host_reduce_range(dt, ro, n, src, 1, dst, begin, end, dst[0] == src[op->root] ? 0 : nt);
        break;
    case CCQ_KIND_REDUCE_SCATTER: /* block r of every src into rank r's dst */
        for (uint32_t r = 0; r < n; r++) {
            for (uint32_t j = 0; j < n; j++)
                src[j] = (const char *)op->parts[j].src + r * blk;
            dst[0] = op->parts[r].dst;
            ccq_host_reduce_range(dt, ro, n, src, 1, dst, begin, end, dst[0] == src[r] ? 0 : nt);
        }
        break;
    case CCQ_KIND_BROADCAST: /* the root's src into every dst */
        for (uint32_t r = 0; r < n; r++)
            dst[r] = (char *)op->parts[r].dst + off;
        copy_fanout(dst, n, (const char *)op->parts[op->root].src + off, len, nt);
        break;
    case CCQ_KIND_ALL_GATHER: /* rank r's src into block r of every dst */
        for (uint32_t r = 0; r < n; r++) {
            for (uint32_t j = 0; j < n; j++)
                dst[j] = (char *)op->parts[j].dst + r * blk + off;
            copy_fanout(dst, n, (const char *)op->parts[r].src + off, len, nt);
        }
        break;
    case CCQ_KIND_ALL_TO_ALL: /* block j of rank i's src into block i of rank j's dst */
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < n; j++)
                ccq_host_copy((char *)op->parts[j].dst + i * blk + off,
                              (const char *)op->parts[i].src + j * blk + off, len, nt);
        break;
    case CCQ_KIND_GATHER: /* rank r's src into block r of the root's dst */
        for (uint32_t r = 0; r < n; r++) {
            char *d = (char *)op->parts[op->root].dst + r * blk + off;
            const char *s = (const char *)op->parts[r].src + off;
            if (d != s)
                ccq_host_copy(d, s, len, nt);
        }
        break;
    case CCQ_KIND_SCATTER: /* block r of the root's src into rank r's dst */
        for (uint32_t r = 0; r < n; r++) {
            char *d = (char *)op->parts[r].dst + off;
            const char *s = (const char *)op->parts[op->root].src + r * blk + off;
            if (d != s)
                ccq_host_copy(d, s, len, nt);
        }
        break;
    default: { /* CCQ_KIND_SEND, a send/recv pair: part 0 sends, part 1 receives */
        const char *s = (const char *)op->parts[0].src + off;
        char *d = (char *)op->parts[1].dst + off;
        uintptr_t us = (uintptr_t)s, ud = (uintptr_t)d;
        if (us + len <= ud || ud + len <= us) /* the usual case: no overlap */
            ccq_host_copy(d, s, len, nt);
        else if (s != d)
            memmove(d, s, len);
        break;
    }
    }
    ccq_host_store_fence(nt);
}

static bool op_aborted(const ccq_be_op *op)
{
    const host_comm *c = (const host_comm *)op->comm;
    return c != NULL && atomic_load_explicit(&c->aborted, memory_order_acquire);
}

static void run_chunk(host_job *j, size_t chunk)
{
    /* Find the op holding this chunk: ops are few per big batch, a linear scan is fine. */
    uint32_t k = 0;
    while (j->first_chunk[k + 1] <= chunk)
        k++;
    const ccq_be_op *op = j->b->ops[k];
    if (op_aborted(op))
        return;
    size_t begin = (chunk - j->first_chunk[k]) * j->chunk_elems[k];
    size_t end = begin + j->chunk_elems[k];
    run_range(op, begin, end < op->count ? end : op->count, j->stream_bytes);
}

static void job_finish(host_be *h, host_job *j)
{
    for (uint32_t k = 0; k < j->b->nops; k++)
        j->b->ops[k]->status = op_aborted(j->b->ops[k]) ? CCQ_ERR_ABORTED : CCQ_OK;
    /* The push (an atomic RMW) publishes every byte the workers wrote; notify wakes the
     * scheduler, which acquires it in poll(). */
    ccq_mpsc_push_mpsc(&h->done, &j->done_node);
    h->hooks.notify(h->hooks.notify_arg);
}

/* Claim the next chunk of the first pending job (of `only`, if given). Lock held. */
static bool claim_chunk(host_be *h, host_job *only, host_job **out, size_t *chunk)
{
    host_job *j = h->head;
    if (j == NULL || (only != NULL && j != only))
        return false;
    *chunk = j->claimed++;
    if (j->claimed == j->nchunks) {
        h->head = j->next;
        if (h->head == NULL)
            h->tail = NULL;
        atomic_fetch_sub_explicit(&h->pending, 1, memory_order_relaxed);
    }
    *out = j;
    return true;
}

/* Run a claimed chunk; the thread that finishes a job's last chunk completes the job.
 * Called and returns with the lock held; drops it while moving data. */
static void run_claimed(host_be *h, host_job *j, size_t chunk)
{
    pthread_mutex_unlock(&h->mu);
    run_chunk(j, chunk);
    pthread_mutex_lock(&h->mu);
    if (--j->remaining == 0) {
        pthread_mutex_unlock(&h->mu);
        job_finish(h, j);
        pthread_mutex_lock(&h->mu);
    }
}

static void *worker_main(void *arg)
{
    host_be *h = arg;

    pthread_mutex_lock(&h->mu);
    for (;;) {
        host_job *j;
        size_t c;
        if (!h->stop && h->head == NULL && h->spin_ns > 0) {
            /* Poll before sleeping: a batch that follows within spin_ns (the scheduler's
             * setting) starts at once instead of after a futex wake-up, which is what
             * small and mid-size batches would otherwise wait for. Bounded, so an idle
             * backend does not hold cores. */
            uint64_t until = ccq_now_ns() + h->spin_ns;
            unsigned step = 0;
            pthread_mutex_unlock(&h->mu);
            while (atomic_load_explicit(&h->pending, memory_order_acquire) == 0 &&
                   ccq_now_ns() < until)
                ccq_spin_step(&step);
            pthread_mutex_lock(&h->mu);
        }
        while (!h->stop && h->head == NULL)
            pthread_cond_wait(&h->cv, &h->mu);
        if (!claim_chunk(h, NULL, &j, &c))
            break; /* stopping and nothing left */
        run_claimed(h, j, c);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Stop and join the workers (they finish the jobs they hold), then free. */
static void host_destroy(ccq_backend *be)
{
    host_be *h = to_host(be);

    pthread_mutex_lock(&h->mu);
    h->stop = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    for (uint32_t k = 0; k < h->nworkers; k++)
        pthread_join(h->threads[k], NULL);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    if (h->engine != NULL)
        h->engine->ops->destroy(h->engine);
    free(h->threads);
    free(h);
}

/* The engine that reaches other processes (see engine.h): cfg->host_engine, or by default
 * UCX when its module loads and UCX starts, else MPI (which needs MPI initialised: its
 * world_ready says so). Each engine is a module (libccq-ucx.so, libccq-mpi.so), loaded here:
 * the first time a runtime of this process is in a world of several processes. Without one,
 * communicators spanning processes are refused with engine_err. */
static void engine_open(host_be *h, const ccq_config *cfg)
{
    static const char no_span[] = "the host backend cannot span processes: ";
    const char *want = cfg->host_engine;
    const ccq_module *m = NULL;
    ccq_errbuf why = {{0}};

    if (want == NULL || strcmp(want, "ucx") == 0) {
        if (ccq_module_get("ucx", "the host backend cannot span processes: its ucx engine", &m,
                           &why) == CCQ_OK) {
            ccq_errbuf start = {{0}};
            if (m->host_engine == NULL)
                snprintf(why.msg, sizeof why.msg, "%sccq's ucx module has no engine", no_span);
            else if (m->host_engine->create(cfg, &h->engine, &start) == CCQ_OK)
                return;
            else
                snprintf(why.msg, sizeof why.msg, "%sits ucx engine cannot start: %.400s", no_span,
                         start.msg);
        }
        h->engine = NULL;
        snprintf(h->engine_err.msg, sizeof h->engine_err.msg, "%s", why.msg);
        if (want != NULL)
            return;
        /* The default goes on to MPI; what UCX said stays for a later refusal's detail. */
        snprintf(h->ucx_why, sizeof h->ucx_why, "%.319s", why.msg + strlen(no_span));
    }
    if (ccq_module_get("mpi", "the host backend cannot span processes: its mpi engine", &m, &why) !=
        CCQ_OK) {
        if (want == NULL) { /* neither: both reasons */
            size_t n = (size_t)snprintf(h->engine_err.msg, sizeof h->engine_err.msg, "%s%s",
                                        no_span, h->ucx_why);
            if (n < sizeof h->engine_err.msg)
                snprintf(h->engine_err.msg + n, sizeof h->engine_err.msg - n, "; %s",
                         why.msg + strlen(no_span));
        } else
            snprintf(h->engine_err.msg, sizeof h->engine_err.msg, "%s", why.msg);
        return;
    }
    if (m->host_engine == NULL) {
        snprintf(h->engine_err.msg, sizeof h->engine_err.msg, "%sccq's mpi module has no engine",
                 no_span);
        return;
    }
    if (m->host_engine->create(cfg, &h->engine, &h->engine_err) != CCQ_OK)
        h->engine = NULL;
}

/* This process's bytes for the world's meeting (the UCX engine's worker address). */
static ccq_status host_world_blob(ccq_backend *be, void *blob, size_t *len, ccq_errbuf *err)
{
    host_be *h = to_host(be);
    if (h->engine == NULL || h->engine->ops->world_blob == NULL) {
        *len = 0;
        return CCQ_OK;
    }
    return h->engine->ops->world_blob(h->engine, blob, len, err);
}

static ccq_status host_create(const ccq_config *cfg, const ccq_be_hooks *hooks, ccq_backend **out,
                              ccq_errbuf *err)
{
    host_be *h = calloc(1, sizeof *h);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);

    if (h == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    if (cfg->host_devices > CCQ_MAX_DEVICES) {
        snprintf(err->msg, sizeof err->msg, "host_devices = %u exceeds the host backend's %u",
                 cfg->host_devices, CCQ_MAX_DEVICES);
        free(h);
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    h->base.ops = &ccq_host_backend_ops;
    h->hooks = *hooks;
    h->ndev = cfg->host_devices;
    h->nworkers = cfg->host_workers ? cfg->host_workers : (cores > 0 ? (uint32_t)cores : 1);
    h->spin_ns = (uint64_t)cfg->spin_us * 1000u;
    h->stream_bytes = cfg->host_stream_bytes ? cfg->host_stream_bytes : HOST_NT_BYTES;
    h->timeout_ns = cfg->timeout_ms ? cfg->timeout_ms * 1000000ull : UINT64_MAX;
    if (cfg->world_size > 1)
        engine_open(h, cfg);
    if (h->engine != NULL) { /* a peer error the engine sees: the runtime's job health */
        h->engine->peer_failed = hooks->peer_failed;
        h->engine->peer_failed_arg = hooks->notify_arg;
    }
    atomic_init(&h->pending, 0);
    ccq_mpsc_init(&h->done);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->threads = calloc(h->nworkers, sizeof *h->threads);
    if (h->threads == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        free(h);
        return CCQ_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < h->nworkers; i++) {
        if (pthread_create(&h->threads[i], NULL, worker_main, h) != 0) {
            snprintf(err->msg, sizeof err->msg, "cannot start host worker thread %u", i);
            h->nworkers = i;
            host_destroy(&h->base);
            return CCQ_ERR_NO_MEMORY;
        }
    }
    *out = &h->base;
    return CCQ_OK;
}

static uint32_t host_device_count(const ccq_backend *be)
{
    return ccq_container_of(be, const host_be, base)->ndev;
}

/* Every process of the world calls this at the same point. */
static ccq_status host_world_ready(ccq_backend *be, uint32_t world_rank, uint32_t world_size,
                                   const void *const *blobs, const size_t *blob_len,
                                   ccq_errbuf *err)
{
    host_be *h = to_host(be);
    ccq_status st;
    if (h->engine == NULL) {
        snprintf(err->msg, sizeof err->msg, "%s", h->engine_err.msg);
        return CCQ_ERR_UNSUPPORTED;
    }
    st = h->engine->ops->world_ready(h->engine, world_rank, world_size, blobs, blob_len, err);
    if (st != CCQ_OK) {
        if (h->ucx_why[0] != '\0') { /* the default's fallback: say why not UCX too */
            size_t n = strlen(err->msg);
            snprintf(err->msg + n, sizeof err->msg - n, " (the ucx engine, tried first: %s)",
                     h->ucx_why);
        }
        snprintf(h->engine_err.msg, sizeof h->engine_err.msg, "%s", err->msg);
        h->engine->ops->destroy(h->engine);
        h->engine = NULL;
    }
    return st;
}

static ccq_status host_comm_test(ccq_backend *be, ccq_be_comm *comm, ccq_errbuf *err)
{
    host_be *h = to_host(be);
    host_comm *c = (host_comm *)comm;
    return c->eng == NULL ? CCQ_OK : h->engine->ops->comm_test(h->engine, c->eng, err);
}

static ccq_status host_comm_create(ccq_backend *be, const ccq_be_comm_desc *d, ccq_be_comm **out,
                                   ccq_errbuf *err)
{
    host_be *h = to_host(be);
    host_comm *c;
    ccq_status st = CCQ_OK;

    *out = NULL;
    if (d->nprocs > 1 && h->engine == NULL) {
        snprintf(err->msg, sizeof err->msg, "%.440s (this communicator spans %u processes)",
                 h->engine_err.msg[0] ? h->engine_err.msg
                                      : "the host backend has no engine to reach other processes",
                 d->nprocs);
        return CCQ_ERR_UNSUPPORTED;
    }
    c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    c->n = d->nranks;
    atomic_init(&c->aborted, 0);
    if (d->nprocs > 1) {
        st = h->engine->ops->comm_create(h->engine, d, &c->eng, err);
        if (st != CCQ_OK && st != CCQ_IN_PROGRESS) {
            free(c);
            return st;
        }
    }
    *out = (ccq_be_comm *)c;
    return st;
}

static void host_comm_destroy(ccq_backend *be, ccq_be_comm *comm)
{
    host_be *h = to_host(be);
    host_comm *c = (host_comm *)comm;
    if (c->eng != NULL)
        h->engine->ops->comm_destroy(h->engine, c->eng);
    free(c);
}

static ccq_status host_comm_root_blob(ccq_backend *be, const ccq_be_comm_desc *d, void *blob,
                                      size_t *len, ccq_errbuf *err)
{
    host_be *h = to_host(be);
    if (h->engine == NULL) {
        *len = 0;
        return CCQ_OK;
    }
    *len = *len < CCQ_HENG_BLOB_MAX ? *len : CCQ_HENG_BLOB_MAX;
    return h->engine->ops->root_blob(h->engine, d, blob, len, err);
}

static void free_staged(void **staged, uint32_t nops)
{
    for (uint32_t k = 0; staged != NULL && k < nops; k++)
        free(staged[k]);
    free(staged);
}

/* Sends whose src a later command of their stream overwrites in this batch (stage_src)
 * send a copy taken now, before any op of the batch runs or starts: what stream order
 * promises. Cross-process batches need it as much as local ones: a local copy or an engine
 * receive of the batch may write the buffer before an engine send reads it (an in-place
 * shift across processes took the data of a neighbour's neighbour without it). */
static ccq_status stage_sends(ccq_be_batch *b, void ***staged, ccq_errbuf *err)
{
    for (uint32_t k = 0; k < b->nops; k++) {
        ccq_be_op *op = b->ops[k];
        size_t bytes = op->count * ccq_dtype_size((ccq_dtype)op->dtype);
        if (!op->stage_src || op->kind != CCQ_KIND_SEND || bytes == 0)
            continue;
        if (*staged == NULL && (*staged = calloc(b->nops, sizeof **staged)) == NULL)
            goto oom;
        if (((*staged)[k] = malloc(bytes)) == NULL)
            goto oom;
        memcpy((*staged)[k], op->parts[0].src, bytes);
        op->parts[0].src = (*staged)[k];
    }
    return CCQ_OK;
oom:
    free_staged(*staged, b->nops);
    *staged = NULL;
    snprintf(err->msg, sizeof err->msg, "out of memory staging a send's data");
    return CCQ_ERR_NO_MEMORY;
}

static ccq_heng_comm *op_eng(const ccq_be_op *op)
{
    const host_comm *c = (const host_comm *)op->comm;
    return c != NULL ? c->eng : NULL;
}

static void batch_fail_detail(ccq_be_batch *b, const ccq_errbuf *err)
{
    if (b->detail.msg[0] == '\0')
        snprintf(b->detail.msg, sizeof b->detail.msg, "%s", err->msg);
}

/* An op of a batch across processes has ended (status set) while others of the batch may
 * still wait for other processes: the runtime ends its commands now (ccq_be_op.done_early),
 * so a stuck engine operation never holds the streams of unrelated ones. */
static void op_ended(ccq_be_batch *b, ccq_be_op *op)
{
    op->done_early = 1;
    b->ndone_early++;
}

/* A batch with operations across processes: local ones run now, on this thread; each of
 * the others combines its local parts and starts its engine operation, in batch order (the
 * runtime's sequence order, the same in every process: engines match operations by it). */
static ccq_status xproc_issue(host_be *h, ccq_be_batch *b, ccq_errbuf *err)
{
    ccq_host_engine *eng = h->engine;
    host_xbatch *m = calloc(1, sizeof *m + b->nops * sizeof m->h[0]);
    uint64_t now = ccq_now_ns();

    if (m == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    m->b = b;
    if (stage_sends(b, &m->staged, err) != CCQ_OK) {
        free(m);
        return CCQ_ERR_NO_MEMORY;
    }
    /* The engine's deadline comes a little before the watchdog's (issue time + timeout_ms),
     * so a stuck engine operation fails alone (CCQ_ERR_TIMEOUT naming what it waits for) and only
     * its communicator is aborted, not every communicator of the batch. */
    if (h->timeout_ns == UINT64_MAX) {
        m->deadline = UINT64_MAX;
    } else {
        uint64_t grace = h->timeout_ns / 16;
        grace = grace < 10000000u ? 10000000u : grace > 200000000u ? 200000000u : grace;
        m->deadline = now + (h->timeout_ns > grace ? h->timeout_ns - grace : h->timeout_ns / 2);
    }
    for (uint32_t k = 0; k < b->nops; k++) {
        ccq_be_op *op = b->ops[k];
        ccq_heng_comm *mc = op_eng(op);
        ccq_errbuf e = {{0}};
        ccq_status st;
        op->status = CCQ_OK;
        if (op_aborted(op)) {
            op->status = CCQ_ERR_ABORTED;
            op_ended(b, op);
            continue;
        }
        if (mc == NULL && op->nparts < 2 && !ccq_kinds[op->kind].collective) {
            /* A half of a pair across processes without its engine side: never run it as a
             * local copy (it would read a second part that does not exist). */
            op->status = CCQ_ERR_BACKEND;
            snprintf(err->msg, sizeof err->msg,
                     "internal: a %s half across processes reached the host backend before "
                     "its communicator's engine side existed",
                     ccq_kinds[op->kind].name);
            batch_fail_detail(b, err);
            op_ended(b, op);
            continue;
        }
        if (mc == NULL) {
            run_range(op, 0, op->count, h->stream_bytes);
            op_ended(b, op);
            continue;
        }
        st = eng->ops->start(eng, mc, op, now, &m->h[k], &e);
        if (st != CCQ_OK) {
            op->status = st;
            batch_fail_detail(b, &e);
            op_ended(b, op);
            continue;
        }
        if (op->kind == CCQ_KIND_SEND && eng->ops->detach(eng, m->h[k])) {
            /* it sends a copy: done here, the engine finishes it in the background */
            m->h[k] = NULL;
            h->background++;
            op_ended(b, op);
            continue;
        }
        m->pending++;
    }
    m->next = h->xbatches;
    h->xbatches = m;
    return CCQ_OK;
}

/* Test the batches' engine operations; return those that completed (or failed) on `list`. */
static ccq_be_batch *xproc_poll(host_be *h, ccq_be_batch *list)
{
    ccq_host_engine *eng = h->engine;
    uint64_t now = ccq_now_ns();

    /* Background work: given up, detached, or (UCX) done here while its last messages still
     * move. The engine knows what it has; asking costs little. */
    h->background = eng->ops->reap(eng, now);
    for (host_xbatch **pp = &h->xbatches; *pp != NULL;) {
        host_xbatch *m = *pp;
        ccq_be_batch *b = m->b;
        for (uint32_t k = 0; k < b->nops && m->pending > 0; k++) {
            ccq_be_op *op = b->ops[k];
            ccq_errbuf e = {{0}};
            ccq_status st;
            if (m->h[k] == NULL)
                continue;
            if (op_aborted(op)) {
                /* Give the operation up (the engine keeps what its transport may still touch);
                 * the runtime's reason is on the comm. */
                eng->ops->abandon(eng, m->h[k]);
                h->background++;
                op->status = CCQ_ERR_ABORTED;
            } else if ((st = eng->ops->test(eng, m->h[k], &e)) == CCQ_IN_PROGRESS) {
                if (now < m->deadline)
                    continue;
                eng->ops->describe(eng, m->h[k], now, &e);
                eng->ops->abandon(eng, m->h[k]);
                h->background++;
                op->status = CCQ_ERR_TIMEOUT;
                op->comm_aborted = 1; /* later work on it would queue behind the stuck call */
                batch_fail_detail(b, &e);
            } else if (st != CCQ_OK) {
                op->status = st;
                /* A mismatch across processes is found before any data moves and leaves
                 * nothing pending: the communicator goes on with the next operation. Other
                 * errors may leave MPI state behind: later work would queue behind it. */
                op->comm_aborted = st != CCQ_ERR_MISMATCH;
                batch_fail_detail(b, &e);
                h->background++;
            }
            m->h[k] = NULL;
            m->pending--;
            op_ended(b, op);
        }
        if (m->pending > 0) {
            pp = &m->next;
            continue;
        }
        *pp = m->next;
        free_staged(m->staged, b->nops);
        free(m);
        b->be_priv = NULL;
        b->next_done = list;
        list = b;
    }
    return list;
}

static uint64_t host_poll_interval(const ccq_backend *be)
{
    const host_be *h = ccq_container_of(be, const host_be, base);
    if (h->engine == NULL)
        return 0;
    /* The engine says: operations in flight, or background work only polling moves (a
     * send completed early whose data UCX or MPI still moves). */
    return h->engine->ops->poll_interval(h->engine, h->xbatches != NULL);
}

static ccq_status host_issue(ccq_backend *be, ccq_be_batch *b, ccq_errbuf *err)
{
    host_be *h = to_host(be);
    size_t total = 0, nchunks = 0;
    host_job *j;

    for (uint32_t k = 0; k < b->nops; k++)
        if (op_eng(b->ops[k]) != NULL ||
            (b->ops[k]->nparts < 2 && !ccq_kinds[b->ops[k]->kind].collective))
            return xproc_issue(h, b, err);
    for (uint32_t k = 0; k < b->nops; k++) {
        if (b->ops[k]->nparts > CCQ_MAX_DEVICES) {
            snprintf(err->msg, sizeof err->msg, "op with %u parts exceeds %u", b->ops[k]->nparts,
                     CCQ_MAX_DEVICES);
            return CCQ_ERR_UNSUPPORTED;
        }
        total += op_moved_bytes(b->ops[k]);
    }
    j = malloc(sizeof *j + (2 * (size_t)b->nops + 1) * sizeof(size_t));
    if (j == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    j->b = b;
    j->next = NULL;
    j->first_chunk = (size_t *)(j + 1);
    j->chunk_elems = j->first_chunk + b->nops + 1;
    j->stream_bytes = h->stream_bytes;
    j->staged = NULL;
    if (stage_sends(b, &j->staged, err) != CCQ_OK) {
        free(j);
        return CCQ_ERR_NO_MEMORY;
    }
    b->be_priv = j;

    if (total <= HOST_INLINE_BYTES || h->nworkers == 0)
        goto run_inline;
    /* Cut each op into chunks: at least HOST_MIN_CHUNK_BYTES per buffer, and about four
     * per worker for big ops so a slow worker does not hold the batch back. */
    for (uint32_t k = 0; k < b->nops; k++) {
        const ccq_be_op *op = b->ops[k];
        size_t es = ccq_dtype_size((ccq_dtype)op->dtype);
        size_t per = (op->count + 4 * h->nworkers - 1) / (4 * h->nworkers);
        size_t min = HOST_MIN_CHUNK_BYTES / es;
        if (per < min)
            per = min;
        per = (per + 63) & ~(size_t)63; /* whole cache lines for every dtype */
        j->first_chunk[k] = nchunks;
        j->chunk_elems[k] = per;
        nchunks += (op->count + per - 1) / per;
    }
    j->first_chunk[b->nops] = nchunks;
    if (nchunks <= 1) /* nothing to share: a hand-off only adds a wake-up */
        goto run_inline;
    j->nchunks = (uint32_t)nchunks;
    j->claimed = 0;
    j->remaining = (uint32_t)nchunks;
    pthread_mutex_lock(&h->mu);
    if (h->tail)
        h->tail->next = j;
    else
        h->head = j;
    h->tail = j;
    atomic_fetch_add_explicit(&h->pending, 1, memory_order_release);
    pthread_cond_broadcast(&h->cv);
    /* Caller runs: for mid-size batches the scheduler takes chunks too, so the batch
     * starts now rather than after a worker wakes up. Bounded by HOST_CALLER_RUNS_BYTES so
     * the scheduler is never kept from matching and issuing for long. */
    if (total <= HOST_CALLER_RUNS_BYTES) {
        host_job *cj;
        size_t c;
        while (claim_chunk(h, j, &cj, &c))
            run_claimed(h, cj, c);
    }
    pthread_mutex_unlock(&h->mu);
    return CCQ_OK;

run_inline:
    for (uint32_t k = 0; k < b->nops; k++)
        if (!op_aborted(b->ops[k]))
            run_range(b->ops[k], 0, b->ops[k]->count, j->stream_bytes);
    job_finish(h, j);
    return CCQ_OK;
}

static ccq_be_batch *host_poll(ccq_backend *be)
{
    host_be *h = to_host(be);
    ccq_be_batch *list = NULL;

    for (ccq_mpsc_node *n = ccq_mpsc_pop_all_spsc(&h->done); n != NULL;) {
        ccq_mpsc_node *next = n->next;
        host_job *j = ccq_container_of(n, host_job, done_node);
        ccq_be_batch *b = j->b;
        free_staged(j->staged, b->nops);
        free(j);
        b->be_priv = NULL;
        b->next_done = list;
        list = b;
        n = next;
    }
    if (h->engine != NULL &&
        (h->xbatches != NULL || h->background > 0 || host_poll_interval(be) > 0))
        list = xproc_poll(h, list);
    return list;
}

/* Unclaimed chunks of the comm's ops are skipped; running ones finish (host copies cannot
 * be interrupted, and they are short), then the batch comes back failed. */
static void host_abort(ccq_backend *be, ccq_be_comm *comm)
{
    host_comm *c = (host_comm *)comm;
    (void)be;
    atomic_store_explicit(&c->aborted, 1, memory_order_release);
}

static ccq_status host_mem_alloc(ccq_backend *be, ccq_device_id device, size_t bytes, void **out,
                                 ccq_errbuf *err)
{
    (void)be;
    (void)device;
    /* aligned_alloc wants a multiple of the alignment; round up. */
    *out = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (*out == NULL && bytes > 0) {
        snprintf(err->msg, sizeof err->msg, "out of host memory allocating %zu bytes", bytes);
        return CCQ_ERR_NO_MEMORY;
    }
    return CCQ_OK;
}

static void host_mem_free(ccq_backend *be, ccq_device_id device, void *ptr)
{
    (void)be;
    (void)device;
    free(ptr);
}

static ccq_status host_mem_copy(ccq_backend *be, ccq_device_id device, void *dst, const void *src,
                                size_t bytes, int to_device, ccq_errbuf *err)
{
    (void)be;
    (void)device;
    (void)to_device;
    (void)err;
    memmove(dst, src, bytes);
    return CCQ_OK;
}

const ccq_backend_ops ccq_host_backend_ops = {
    .name = "host",
    .create = host_create,
    .destroy = host_destroy,
    .device_count = host_device_count,
    .comm_root_blob = host_comm_root_blob,
    .poll_interval = host_poll_interval,
    .world_blob = host_world_blob,
    .world_ready = host_world_ready,
    .comm_test = host_comm_test,
    .comm_create = host_comm_create,
    .comm_destroy = host_comm_destroy,
    .issue = host_issue,
    .stages_sends = true,
    .poll = host_poll,
    .abort = host_abort,
    .poll_interval_ns = 0,
    .mem_alloc = host_mem_alloc,
    .mem_free = host_mem_free,
    .mem_copy = host_mem_copy,
};
