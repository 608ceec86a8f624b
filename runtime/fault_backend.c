/* Fault injection as a runtime layer: a backend that wraps the real one (host, NCCL, the
 * fake NCCL of the tests) and applies the plan's `fail`, `delay` and `stall` clauses to the
 * operations it is handed, so fault drills behave the same on every backend. `drop` is not
 * here: it acts on commands as they reach the scheduler (runtime/sched.c, arrive()).
 *
 * Only installed when the plan fails, delays or stalls something, so a runtime without fault
 * injection calls its backend directly and pays nothing. Like every backend it runs on the
 * scheduler thread only, except the forwarded user-thread hooks (check, submit, fence,
 * bind_stream, mem_*), which touch nothing of the wrapper's state. */
#define _GNU_SOURCE /* nanosleep */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "queue/wake.h"
#include "runtime/fault.h"

/* The scheduler polls at this interval while a batch is held (a delay has no completion to
 * notify it), so a delayed batch is released within about this much of its time. */
#define FAULT_POLL_INTERVAL_NS 500000u

/* One batch the wrapper was handed. `inner` is what the wrapped backend runs: the batch's
 * operations that neither fail by injection nor were aborted while the batch was held. */
typedef struct fault_job {
    ccq_be_batch inner;
    ccq_be_batch *outer;
    uint64_t release_ns;    /* delayed: handed to the inner backend at this time */
    struct fault_job *next; /* on the held, running or done list */
    ccq_be_op *ops[];       /* inner.ops */
} fault_job;

typedef struct fault_be {
    ccq_backend base;
    ccq_backend_ops ops; /* the inner backend's ops with the wrapper's in between */
    const ccq_backend_ops *inner_ops;
    ccq_backend *inner;
    ccq_fault_plan plan;
    uint64_t next_op;   /* operations issued so far: the numbering `op=N` refers to */
    fault_job *held;    /* delayed, not handed to the inner backend yet */
    fault_job *running; /* handed to the inner backend, not back yet */
    fault_job *done;    /* ended without the inner backend (every op failed or aborted) */
    bool stalled;       /* the stall clause was armed (it happens once) */
    bool stall_due;     /* ...and is carried out in the next poll */
} fault_be;

static fault_be *to_fault(ccq_backend *be)
{
    return ccq_container_of(be, fault_be, base);
}

static const fault_be *to_fault_const(const ccq_backend *be)
{
    return ccq_container_of(be, const fault_be, base);
}

/* ---- Forwarded calls ----------------------------------------------------------------- */

static void fwd_destroy(ccq_backend *be)
{
    fault_be *f = to_fault(be);
    /* Every issued batch came back through poll() before destroy (backend contract). */
    f->inner_ops->destroy(f->inner);
    free(f);
}

static uint32_t fwd_device_count(const ccq_backend *be)
{
    const fault_be *f = to_fault_const(be);
    return f->inner_ops->device_count(f->inner);
}

static ccq_status fwd_comm_root_blob(ccq_backend *be, const ccq_be_comm_desc *d, void *blob,
                                     size_t *len, ccq_errbuf *err)
{
    fault_be *f = to_fault(be);
    return f->inner_ops->comm_root_blob(f->inner, d, blob, len, err);
}

static ccq_status fwd_comm_member_blob(ccq_backend *be, const ccq_be_comm_desc *d,
                                       ccq_be_member_blob *blob, ccq_errbuf *err)
{
    fault_be *f = to_fault(be);
    return f->inner_ops->comm_member_blob(f->inner, d, blob, err);
}

static ccq_status fwd_world_blob(ccq_backend *be, void *blob, size_t *len, ccq_errbuf *err)
{
    fault_be *f = to_fault(be);
    return f->inner_ops->world_blob(f->inner, blob, len, err);
}

static ccq_status fwd_world_ready(ccq_backend *be, uint32_t world_rank, uint32_t world_size,
                                  bool crowded, const void *const *blobs, const size_t *blob_len,
                                  ccq_errbuf *err)
{
    fault_be *f = to_fault(be);
    return f->inner_ops->world_ready(f->inner, world_rank, world_size, crowded, blobs, blob_len,
                                     err);
}

static ccq_status fwd_comm_create(ccq_backend *be, const ccq_be_comm_desc *d, ccq_be_comm **out,
                                  ccq_errbuf *err)
{
    fault_be *f = to_fault(be);
    return f->inner_ops->comm_create(f->inner, d, out, err);
}

static ccq_status fwd_comm_test(ccq_backend *be, ccq_be_comm *comm, ccq_errbuf *err)
{
    fault_be *f = to_fault(be);
    return f->inner_ops->comm_test(f->inner, comm, err);
}

static void fwd_comm_destroy(ccq_backend *be, ccq_be_comm *comm)
{
    fault_be *f = to_fault(be);
    f->inner_ops->comm_destroy(f->inner, comm);
}

static ccq_status fwd_check(ccq_backend *be, const ccq_be_submit *s, ccq_errbuf *err)
{
    fault_be *f = to_fault(be);
    return f->inner_ops->check(f->inner, s, err);
}

static ccq_status fwd_submit(ccq_backend *be, const ccq_be_submit *s, ccq_errbuf *err)
{
    fault_be *f = to_fault(be);
    return f->inner_ops->submit(f->inner, s, err);
}

static void fwd_fence(ccq_backend *be, uint32_t stream_index)
{
    fault_be *f = to_fault(be);
    f->inner_ops->fence(f->inner, stream_index);
}

static ccq_status fwd_bind_stream(ccq_backend *be, ccq_device_id device, uint32_t stream_index,
                                  void *native, ccq_errbuf *err)
{
    fault_be *f = to_fault(be);
    return f->inner_ops->bind_stream(f->inner, device, stream_index, native, err);
}

static ccq_status fwd_stream_wait(ccq_backend *be, ccq_device_id device, uint32_t stream_index,
                                  void *native, uint64_t target, const _Atomic uint64_t *ended,
                                  ccq_errbuf *err)
{
    fault_be *f = to_fault(be);
    return f->inner_ops->stream_wait(f->inner, device, stream_index, native, target, ended, err);
}

static void fwd_stream_ended(ccq_backend *be, uint32_t stream_index, uint64_t ended)
{
    fault_be *f = to_fault(be);
    f->inner_ops->stream_ended(f->inner, stream_index, ended);
}

static ccq_status fwd_mem_alloc(ccq_backend *be, ccq_device_id device, size_t bytes, void **out,
                                ccq_errbuf *err)
{
    fault_be *f = to_fault(be);
    return f->inner_ops->mem_alloc(f->inner, device, bytes, out, err);
}

static void fwd_mem_free(ccq_backend *be, ccq_device_id device, void *ptr)
{
    fault_be *f = to_fault(be);
    f->inner_ops->mem_free(f->inner, device, ptr);
}

static ccq_status fwd_mem_copy(ccq_backend *be, ccq_device_id device, void *dst, const void *src,
                               size_t bytes, int to_device, ccq_errbuf *err)
{
    fault_be *f = to_fault(be);
    return f->inner_ops->mem_copy(f->inner, device, dst, src, bytes, to_device, err);
}

/* ---- Batches ------------------------------------------------------------------------- */

/* Hand a job's surviving operations to the inner backend. On an error nothing started
 * there, and the whole batch ends failed with the inner backend's message. */
static ccq_status job_start(fault_be *f, fault_job *j, ccq_errbuf *err)
{
    ccq_status st = f->inner_ops->issue(f->inner, &j->inner, err);
    if (st != CCQ_OK) {
        for (uint32_t k = 0; k < j->inner.nops; k++)
            j->inner.ops[k]->status = st;
        return st;
    }
    j->next = f->running;
    f->running = j;
    return CCQ_OK;
}

static void job_end_now(fault_be *f, fault_job *j)
{
    j->next = f->done;
    f->done = j;
}

/* stall: the scheduler thread stands still once, in its first poll after it handed the
 * backend the group holding operation stall_op (so the backend started it and looked at it
 * once: its first messages left), as if its process were stopped or preempted. */
static void stall_arm(fault_be *f, uint64_t first_op)
{
    uint64_t op = (uint64_t)f->plan.stall_op;
    if (f->plan.stall_us > 0 && !f->stalled && op >= first_op && op < f->next_op)
        f->stalled = f->stall_due = true;
}

static void stall_now(fault_be *f)
{
    struct timespec ts = {(time_t)(f->plan.stall_us / 1000000),
                          (long)(f->plan.stall_us % 1000000) * 1000L};
    f->stall_due = false;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static ccq_status fault_issue(ccq_backend *be, ccq_be_batch *b, ccq_errbuf *err)
{
    fault_be *f = to_fault(be);
    uint64_t first_op = f->next_op;
    fault_job *j = malloc(sizeof *j + (b->nops ? b->nops : 1) * sizeof j->ops[0]);
    uint64_t delay_us = 0;
    uint32_t n = 0, failed = 0;

    if (j == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory (fault injection)");
        return CCQ_ERR_NO_MEMORY;
    }
    memset(&j->inner, 0, sizeof j->inner);
    j->outer = b;
    j->next = NULL;
    j->release_ns = 0;
    for (uint32_t k = 0; k < b->nops; k++, f->next_op++) {
        uint64_t d = ccq_fault_delay_us(&f->plan, f->next_op);
        if (ccq_fault_fails(&f->plan, f->next_op)) {
            /* Nothing of it runs: its outputs stay as they were. */
            b->ops[k]->status = CCQ_ERR_BACKEND;
            failed++;
            continue;
        }
        j->ops[n++] = b->ops[k];
        delay_us = d > delay_us ? d : delay_us;
    }
    if (failed > 0)
        snprintf(b->detail.msg, sizeof b->detail.msg,
                 "fault injection (CCQ_FAULT fail): the %s backend failed this operation",
                 f->ops.name);
    j->inner.id = b->id;
    j->inner.nops = n;
    j->inner.ops = j->ops;
    j->inner.status = CCQ_OK;
    b->be_priv = j;
    if (n == 0) {
        job_end_now(f, j);
        stall_arm(f, first_op);
        return CCQ_OK;
    }
    if (delay_us > 0) {
        /* A slow operation: held here, not started, so an abort (the watchdog's, or
         * shutdown's) ends it before it touches any buffer. */
        j->release_ns = ccq_now_ns() + delay_us * 1000u;
        j->next = f->held;
        f->held = j;
        stall_arm(f, first_op);
        return CCQ_OK;
    }
    ccq_status st = job_start(f, j, err);
    if (st != CCQ_OK) {
        b->be_priv = NULL;
        free(j);
    }
    stall_arm(f, first_op);
    return st;
}

/* The outer batch of a finished job, with what the inner backend said about it. */
static ccq_be_batch *job_finish(fault_job *j)
{
    ccq_be_batch *b = j->outer;
    if (j->inner.status != CCQ_OK) {
        b->status = j->inner.status;
        snprintf(b->detail.msg, sizeof b->detail.msg, "%s", j->inner.detail.msg);
    } else if (j->inner.detail.msg[0] != '\0' && b->detail.msg[0] == '\0') {
        snprintf(b->detail.msg, sizeof b->detail.msg, "%s", j->inner.detail.msg);
    }
    b->be_priv = NULL;
    free(j);
    return b;
}

static ccq_be_batch *fault_poll(ccq_backend *be)
{
    fault_be *f = to_fault(be);
    ccq_be_batch *list = NULL;
    uint64_t now = f->held != NULL ? ccq_now_ns() : 0;

    /* Held batches whose delay is over go to the inner backend now. */
    for (fault_job **pp = &f->held; *pp != NULL;) {
        fault_job *j = *pp;
        if (j->release_ns > now) {
            pp = &j->next;
            continue;
        }
        *pp = j->next;
        ccq_errbuf err = {{0}};
        if (job_start(f, j, &err) != CCQ_OK) {
            j->inner.status = j->inner.ops[0]->status;
            snprintf(j->inner.detail.msg, sizeof j->inner.detail.msg, "%s", err.msg);
            job_end_now(f, j);
        }
    }
    while (f->done != NULL) {
        fault_job *j = f->done;
        f->done = j->next;
        ccq_be_batch *b = job_finish(j);
        b->next_done = list;
        list = b;
    }
    for (ccq_be_batch *ib = f->inner_ops->poll(f->inner); ib != NULL;) {
        ccq_be_batch *next = ib->next_done;
        fault_job *j = ccq_container_of(ib, fault_job, inner);
        for (fault_job **pp = &f->running; *pp != NULL; pp = &(*pp)->next)
            if (*pp == j) {
                *pp = j->next;
                break;
            }
        ccq_be_batch *b = job_finish(j);
        b->next_done = list;
        list = b;
        ib = next;
    }
    /* Operations the inner backend ended before their batch (ccq_be_op.done_early: the ops
     * are the outer batch's own): the scheduler counts them on the outer batch. */
    for (fault_job *j = f->running; j != NULL; j = j->next)
        j->outer->ndone_early = j->inner.ndone_early;
    if (f->stall_due)
        stall_now(f);
    return list;
}

static void fwd_check_deadlines(ccq_backend *be)
{
    fault_be *f = to_fault(be);
    f->inner_ops->check_deadlines(f->inner);
}

/* An abort also ends the held operations of that communicator: they never started, so
 * they fail at once and their buffers are untouched. */
static void fault_abort(ccq_backend *be, ccq_be_comm *comm)
{
    fault_be *f = to_fault(be);

    f->inner_ops->abort(f->inner, comm);
    for (fault_job **pp = &f->held; *pp != NULL;) {
        fault_job *j = *pp;
        uint32_t n = 0;
        for (uint32_t k = 0; k < j->inner.nops; k++) {
            if (j->ops[k]->comm == comm)
                j->ops[k]->status = CCQ_ERR_ABORTED;
            else
                j->ops[n++] = j->ops[k];
        }
        j->inner.nops = n;
        if (n > 0) {
            pp = &j->next;
            continue;
        }
        *pp = j->next;
        job_end_now(f, j);
    }
}

ccq_status ccq_fault_wrap(const ccq_fault_plan *plan, const ccq_backend_ops **ops, ccq_backend **be)
{
    const ccq_backend_ops *in = *ops;
    fault_be *f;

    if (plan->fail_op < 0 && plan->fail_every <= 0 && plan->delay_us <= 0 && plan->stall_us <= 0)
        return CCQ_OK; /* nothing for a backend layer to do */
    f = calloc(1, sizeof *f);
    if (f == NULL)
        return CCQ_ERR_NO_MEMORY;
    f->inner_ops = in;
    f->inner = *be;
    f->plan = *plan;
    f->ops = (ccq_backend_ops){
        .name = in->name,
        .create = NULL, /* the wrapper is made around a backend that exists */
        .destroy = fwd_destroy,
        .device_count = fwd_device_count,
        .comm_root_blob = in->comm_root_blob ? fwd_comm_root_blob : NULL,
        .comm_member_blob = in->comm_member_blob ? fwd_comm_member_blob : NULL,
        .world_blob = in->world_blob ? fwd_world_blob : NULL,
        .world_ready = in->world_ready ? fwd_world_ready : NULL,
        .comm_create = fwd_comm_create,
        .comm_test = in->comm_test ? fwd_comm_test : NULL,
        .comm_destroy = fwd_comm_destroy,
        .issue = fault_issue,
        .poll = fault_poll,
        .check_deadlines = in->check_deadlines ? fwd_check_deadlines : NULL,
        .abort = fault_abort,
        .stages_sends = in->stages_sends, /* ops reach the inner backend as they are */
        .span_group_limit = in->span_group_limit,
        .span_batch_ops = in->span_batch_ops,
        .poll_interval_ns = in->poll_interval_ns && in->poll_interval_ns < FAULT_POLL_INTERVAL_NS
                                ? in->poll_interval_ns
                                : FAULT_POLL_INTERVAL_NS,
        .check = in->check ? fwd_check : NULL,
        .submit = in->submit ? fwd_submit : NULL,
        .fence = in->fence ? fwd_fence : NULL,
        .bind_stream = in->bind_stream ? fwd_bind_stream : NULL,
        .stream_wait = in->stream_wait ? fwd_stream_wait : NULL,
        .stream_ended = in->stream_ended ? fwd_stream_ended : NULL,
        .mem_alloc = in->mem_alloc ? fwd_mem_alloc : NULL,
        .mem_free = in->mem_free ? fwd_mem_free : NULL,
        .mem_copy = in->mem_copy ? fwd_mem_copy : NULL,
    };
    f->base.ops = &f->ops;
    *ops = &f->ops;
    *be = &f->base;
    return CCQ_OK;
}
