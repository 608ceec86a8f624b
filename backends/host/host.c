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

#include "backends/backend.h"
#include "backends/fuse.h"
#include "backends/host/engine.h"
#include "backends/host/host_impl.h"
#include "backends/host/reduce.h"
#include "common/cores.h"
#include "common/thread_name.h"
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

/* A batch runs as units: one op, or a fused group of small ops (backends/fuse.h) that one
 * thread runs whole, one after the other, as a single piece of work. */
typedef struct host_job {
    ccq_mpsc_node done_node;
    ccq_be_batch *b;
    struct host_job *next; /* pending list (jobs with unclaimed chunks) */
    uint32_t nchunks, claimed, remaining;
    uint32_t nunits;
    uint32_t *unit_op;     /* [nunits + 1]: the first op of each unit (ops of u: [u], [u + 1]) */
    size_t *first_chunk;   /* [nunits + 1]: chunk index where each unit starts */
    size_t *chunk_elems;   /* [nunits]: elements per chunk of a one-op unit (0: fused, whole) */
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
    host_xp xp;            /* across processes (xproc.c); scheduler thread only */
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
void host_run_range(const ccq_be_op *op, size_t begin, size_t end, uint64_t stream_bytes)
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

/* Run a fused group's ops whole, in sequence order, and note when the group ran (for the
 * trace's fused slice). One thread runs it: it is small (at most fusion_bytes per buffer). */
void host_run_fused(ccq_be_op *const *ops, uint32_t n, uint64_t stream_bytes)
{
    ops[0]->fused_t0 = ccq_now_ns();
    for (uint32_t k = 0; k < n; k++)
        if (!host_op_aborted(ops[k]))
            host_run_range(ops[k], 0, ops[k]->count, stream_bytes);
    ops[0]->fused_t1 = ccq_now_ns();
}

static void run_chunk(host_job *j, size_t chunk)
{
    /* Find the unit holding this chunk (binary search: a batch of small ops has many). */
    uint32_t lo = 0, hi = j->nunits - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (j->first_chunk[mid] <= chunk)
            lo = mid;
        else
            hi = mid - 1;
    }
    ccq_be_op *const *ops = j->b->ops + j->unit_op[lo];
    uint32_t n = j->unit_op[lo + 1] - j->unit_op[lo];
    if (n > 1) {
        host_run_fused(ops, n, j->stream_bytes);
        return;
    }
    if (host_op_aborted(ops[0]))
        return;
    size_t begin = (chunk - j->first_chunk[lo]) * j->chunk_elems[lo];
    size_t end = begin + j->chunk_elems[lo];
    host_run_range(ops[0], begin, end < ops[0]->count ? end : ops[0]->count, j->stream_bytes);
}

static void job_finish(host_be *h, host_job *j)
{
    for (uint32_t k = 0; k < j->b->nops; k++)
        j->b->ops[k]->status = host_op_aborted(j->b->ops[k]) ? CCQ_ERR_ABORTED : CCQ_OK;
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

    ccq_thread_name("ccq-host");
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
    if (h->xp.engine != NULL)
        h->xp.engine->ops->destroy(h->xp.engine);
    free(h->threads);
    free(h);
}

static ccq_status host_create(const ccq_config *cfg, const ccq_be_hooks *hooks, ccq_backend **out,
                              ccq_errbuf *err)
{
    host_be *h = calloc(1, sizeof *h);

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
    h->nworkers = cfg->host_workers ? cfg->host_workers : ccq_worker_cores();
    h->spin_ns = (uint64_t)cfg->spin_us * 1000u;
    h->stream_bytes = cfg->host_stream_bytes ? cfg->host_stream_bytes : HOST_NT_BYTES;
    h->xp.timeout_ns = cfg->timeout_ms ? cfg->timeout_ms * 1000000ull : UINT64_MAX;
    h->xp.stream_bytes = h->stream_bytes;
    if (cfg->world_size > 1)
        host_xp_open(&h->xp, cfg, hooks);
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

/* This process's bytes for the world's meeting (the UCX engine's worker address). */
static ccq_status host_world_blob(ccq_backend *be, void *blob, size_t *len, ccq_errbuf *err)
{
    return host_xp_world_blob(&to_host(be)->xp, blob, len, err);
}

/* Every process of the world calls this at the same point. */
static ccq_status host_world_ready(ccq_backend *be, uint32_t world_rank, uint32_t world_size,
                                   bool crowded, const void *const *blobs, const size_t *blob_len,
                                   ccq_errbuf *err)
{
    return host_xp_world_ready(&to_host(be)->xp, world_rank, world_size, crowded, blobs, blob_len,
                               err);
}

static ccq_status host_comm_test(ccq_backend *be, ccq_be_comm *comm, ccq_errbuf *err)
{
    host_be *h = to_host(be);
    host_comm *c = (host_comm *)comm;
    return c->eng == NULL ? CCQ_OK : h->xp.engine->ops->comm_test(h->xp.engine, c->eng, err);
}

static ccq_status host_comm_create(ccq_backend *be, const ccq_be_comm_desc *d, ccq_be_comm **out,
                                   ccq_errbuf *err)
{
    host_be *h = to_host(be);
    host_comm *c;
    ccq_status st = CCQ_OK;

    *out = NULL;
    if (d->nprocs > 1 && h->xp.engine == NULL) {
        snprintf(err->msg, sizeof err->msg, "%.440s (this communicator spans %u processes)",
                 h->xp.engine_err.msg[0]
                     ? h->xp.engine_err.msg
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
    /* An engine without start_run cannot agree on fusion with the members: unfused there. */
    c->fusion_bytes =
        ccq_fuse_threshold(d, 0, h->xp.engine != NULL && h->xp.engine->ops->start_run != NULL);
    atomic_init(&c->aborted, 0);
    if (d->nprocs > 1) {
        st = h->xp.engine->ops->comm_create(h->xp.engine, d, &c->eng, err);
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
    if (c->eng != NULL) {
        h->xp.engine->ops->comm_destroy(h->xp.engine, c->eng);
    }
    free(c);
}

static ccq_status host_comm_root_blob(ccq_backend *be, const ccq_be_comm_desc *d, void *blob,
                                      size_t *len, ccq_errbuf *err)
{
    host_be *h = to_host(be);
    if (h->xp.engine == NULL) {
        *len = 0;
        return CCQ_OK;
    }
    *len = *len < CCQ_HENG_BLOB_MAX ? *len : CCQ_HENG_BLOB_MAX;
    return h->xp.engine->ops->root_blob(h->xp.engine, d, blob, len, err);
}

static uint64_t host_poll_interval(const ccq_backend *be)
{
    return host_xp_poll_interval(&ccq_container_of(be, const host_be, base)->xp);
}

static bool host_calls_mpi(const ccq_backend *be)
{
    const ccq_host_engine *eng = ccq_container_of(be, const host_be, base)->xp.engine;
    return eng != NULL && strcmp(eng->ops->name, "mpi") == 0;
}

void host_free_staged(void **staged, uint32_t nops)
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
ccq_status host_stage_sends(ccq_be_batch *b, void ***staged, ccq_errbuf *err)
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
    host_free_staged(*staged, b->nops);
    *staged = NULL;
    snprintf(err->msg, sizeof err->msg, "out of memory staging a send's data");
    return CCQ_ERR_NO_MEMORY;
}

/* The units of a batch (host_job): each fused group (backends/fuse.h: consecutive ops of
 * one communicator, small, alike) is one, marked on its first op (ccq_be_op.fused); every
 * other op is its own. unit_op gets nunits + 1 entries. */
static uint32_t plan_units(ccq_be_batch *b, uint32_t *unit_op)
{
    uint32_t nu = 0;
    for (uint32_t k = 0; k < b->nops;) {
        const host_comm *c = (const host_comm *)b->ops[k]->comm;
        uint32_t g = 1;
        if (c != NULL && c->fusion_bytes > 0)
            g = ccq_fuse_group(b->ops + k, b->nops - k, c->fusion_bytes, CCQ_FUSE_KINDS_ALL);
        b->ops[k]->fused = g > 1 ? g : 0;
        unit_op[nu++] = k;
        k += g;
    }
    unit_op[nu] = b->nops;
    return nu;
}

static ccq_status host_issue(ccq_backend *be, ccq_be_batch *b, ccq_errbuf *err)
{
    host_be *h = to_host(be);
    size_t total = 0, nchunks = 0;
    host_job *j;

    if (host_xp_needs(b))
        return host_xp_issue(&h->xp, b, err);
    for (uint32_t k = 0; k < b->nops; k++) {
        if (b->ops[k]->nparts > CCQ_MAX_DEVICES) {
            snprintf(err->msg, sizeof err->msg, "op with %u parts exceeds %u", b->ops[k]->nparts,
                     CCQ_MAX_DEVICES);
            return CCQ_ERR_UNSUPPORTED;
        }
        total += op_moved_bytes(b->ops[k]);
    }
    j = malloc(sizeof *j + (2 * (size_t)b->nops + 1) * sizeof(size_t) +
               ((size_t)b->nops + 1) * sizeof(uint32_t));
    if (j == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    j->b = b;
    j->next = NULL;
    j->first_chunk = (size_t *)(j + 1);
    j->chunk_elems = j->first_chunk + b->nops + 1;
    j->unit_op = (uint32_t *)(j->chunk_elems + b->nops);
    j->nunits = plan_units(b, j->unit_op);
    j->stream_bytes = h->stream_bytes;
    j->staged = NULL;
    if (host_stage_sends(b, &j->staged, err) != CCQ_OK) {
        free(j);
        return CCQ_ERR_NO_MEMORY;
    }
    b->be_priv = j;

    if (total <= HOST_INLINE_BYTES || h->nworkers == 0)
        goto run_inline;
    /* Cut each one-op unit into chunks: at least HOST_MIN_CHUNK_BYTES per buffer, and about
     * four per worker for big ops so a slow worker does not hold the batch back. A fused unit
     * is one chunk: its ops are small, and one claim for all of them is what fusion saves. */
    for (uint32_t u = 0; u < j->nunits; u++) {
        const ccq_be_op *op = b->ops[j->unit_op[u]];
        size_t es = ccq_dtype_size((ccq_dtype)op->dtype);
        size_t per = (op->count + 4 * h->nworkers - 1) / (4 * h->nworkers);
        size_t min = HOST_MIN_CHUNK_BYTES / es;
        j->first_chunk[u] = nchunks;
        if (j->unit_op[u + 1] - j->unit_op[u] > 1) {
            j->chunk_elems[u] = 0;
            nchunks++;
            continue;
        }
        if (per < min)
            per = min;
        per = (per + 63) & ~(size_t)63; /* whole cache lines for every dtype */
        j->chunk_elems[u] = per;
        nchunks += (op->count + per - 1) / per;
    }
    j->first_chunk[j->nunits] = nchunks;
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
    for (uint32_t u = 0; u < j->nunits; u++) {
        ccq_be_op *const *ops = b->ops + j->unit_op[u];
        uint32_t n = j->unit_op[u + 1] - j->unit_op[u];
        if (n > 1)
            host_run_fused(ops, n, j->stream_bytes);
        else if (!host_op_aborted(ops[0]))
            host_run_range(ops[0], 0, ops[0]->count, j->stream_bytes);
    }
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
        host_free_staged(j->staged, b->nops);
        free(j);
        b->be_priv = NULL;
        b->next_done = list;
        list = b;
        n = next;
    }
    if (host_xp_busy(&h->xp))
        list = host_xp_poll(&h->xp, list);
    return list;
}

/* The watchdog found a batch in flight past timeout_ms: the engines' deadlines, which come
 * a little before it, are checked at the next poll (xproc.c, host_xp_poll). */
static void host_check_deadlines(ccq_backend *be)
{
    to_host(be)->xp.deadlines_due = true;
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
    .calls_mpi = host_calls_mpi,
    .world_blob = host_world_blob,
    .world_ready = host_world_ready,
    .comm_test = host_comm_test,
    .comm_create = host_comm_create,
    .comm_destroy = host_comm_destroy,
    .issue = host_issue,
    .stages_sends = true,
    .span_batch_ops = CCQ_HOST_SPAN_BATCH_OPS,
    .poll = host_poll,
    .check_deadlines = host_check_deadlines,
    .abort = host_abort,
    .poll_interval_ns = 0,
    .mem_alloc = host_mem_alloc,
    .mem_free = host_mem_free,
    .mem_copy = host_mem_copy,
};
