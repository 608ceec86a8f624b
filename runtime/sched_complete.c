/* The scheduler's completion side: batches back from the backend, commands ended in stream
 * order, `ended` published to fences. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/sched.h"

/* ------------------------------------------------------------------------------------ */
/* Ending commands                                                                       */
/* ------------------------------------------------------------------------------------ */

/* With trace_file set, the failures a pass ends are published (error records, then `ended`)
 * only after the scheduler wrote a dump holding them, at the end of that pass (ccq_sched_main):
 * users print a fence's error and exit, or abort, and the dump must be on disk by then. */
static bool hold_failures(const ccq_runtime *rt)
{
    return rt->trace.file != NULL && rt->trace.cap != 0;
}

static void hold_stream(ccq_sched *S, ccq_stream *s)
{
    if (s->held)
        return;
    s->held = true;
    s->held_next = S->held;
    S->held = s;
}

/* Keep a failure for publication after the dump; takes `detail`. */
static void hold_error(ccq_sched *S, ccq_stream *s, uint64_t pos, ccq_status st, char *detail)
{
    if (s->nheld == s->capheld) {
        uint32_t cap = s->capheld ? 2 * s->capheld : 4;
        ccq_held_err *v = realloc(s->held_errs, cap * sizeof *v);
        if (v == NULL)
            sched_xgrow_fail();
        s->held_errs = v;
        s->capheld = cap;
    }
    s->held_errs[s->nheld++] = (ccq_held_err){pos, st, detail};
    hold_stream(S, s);
}

const char *sched_held_reason(ccq_runtime *rt)
{
    for (ccq_stream *s = rt->sched->held; s != NULL; s = s->held_next)
        for (uint32_t i = 0; i < s->nheld; i++)
            if (s->held_errs[i].status == CCQ_ERR_PROCESS_LOST)
                return "process_lost";
    return "error";
}

void sched_release_held(ccq_runtime *rt)
{
    ccq_sched *S = rt->sched;
    while (S->held != NULL) {
        ccq_stream *s = S->held;
        uint64_t n = s->held_n;
        S->held = s->held_next;
        for (uint32_t i = 0; i < s->nheld; i++) {
            ccq_stream_record_error(s, s->held_errs[i].pos, s->held_errs[i].status,
                                    s->held_errs[i].detail);
            free(s->held_errs[i].detail);
        }
        s->nheld = 0;
        s->held_n = 0;
        s->held = false;
        s->held_next = NULL;
        sched_publish_ended(rt, s, n);
    }
}

/* End the head command of a stream. The caller publishes `ended` afterwards. */
static void end_head(ccq_runtime *rt, ccq_stream *s, uint64_t now)
{
    ccq_sched *S = rt->sched;
    ccq_cmd *c = s->fifo_head;

    s->fifo_head = c->fifo_next;
    if (s->fifo_head == NULL)
        s->fifo_tail = NULL;
    if (s->cursor == c)
        s->cursor = c->fifo_next;
    uint64_t pos = s->ending++;
    if (c->status == CCQ_OK) {
        S->completed++;
    } else {
        if (c->cancel)
            S->cancelled++;
        else
            S->failed++;
        if (hold_failures(rt)) {
            hold_error(S, s, pos, c->status, c->detail);
            c->detail = NULL;
        } else {
            ccq_stream_record_error(s, pos, c->status, c->detail);
        }
    }
    /* Metrics are kept whether or not the recorder is on (one histogram bucket per end). */
    if (c->issue_ns != 0)
        ccq_hist_add(&rt->trace.run_ns, now - c->issue_ns);
    if (ccq_trace_on(&rt->trace))
        sched_ev_cmd(rt, c->status == CCQ_OK ? CCQ_EV_COMPLETED : CCQ_EV_FAILED, c, now, c->status);
    free(c->detail);
    c->detail = NULL;
    free(c->pre_detail);
    c->pre_detail = NULL;
    /* Hands the slot back to producers; nothing below may touch `c`. */
    atomic_store_explicit(&c->busy, 0, memory_order_release);
}

void sched_publish_ended(ccq_runtime *rt, ccq_stream *s, uint64_t n)
{
    ccq_sched *S = rt->sched;
    if (n == 0)
        return;
    if (s->held) { /* a failure of this pass waits for the dump: so does what ended after it */
        s->held_n += n;
        return;
    }
    /* Counters first, so a fence that sees `ended` also sees them (exact once idle). */
    atomic_store_explicit(&rt->stats.completed, S->completed, memory_order_release);
    atomic_store_explicit(&rt->stats.failed, S->failed, memory_order_release);
    atomic_store_explicit(&rt->stats.cancelled, S->cancelled, memory_order_release);
    ccq_stream_publish_ended(s, n);
    S->ended_pass = true;
    ccq_gw_passed(s, s->ending);
    /* GPU-side waits: commands that never reached the device advance the counter here. */
    if (rt->be_ops->stream_ended != NULL)
        rt->be_ops->stream_ended(rt->be, s->index, s->ending);
}

/* End failed commands at the heads of streams with nothing in flight, and drop streams
 * whose FIFO is empty from the active list. */
bool sched_end_failed_heads(ccq_runtime *rt)
{
    ccq_sched *S = rt->sched;
    bool any = false;
    uint64_t now = 0; /* read the clock only if something ends */

    for (uint32_t k = 0; k < S->nactive;) {
        ccq_stream *s = S->active[k];
        uint64_t n = 0;
        while (!s->inflight && s->fifo_head != NULL && s->fifo_head->state == CCQ_CMD_FAILED) {
            now = now ? now : ccq_now_ns();
            end_head(rt, s, now);
            n++;
        }
        sched_publish_ended(rt, s, n);
        any |= n > 0;
        if (s->fifo_head == NULL) {
            s->active = false;
            S->active[k] = S->active[--S->nactive];
        } else {
            k++;
        }
    }
    return any;
}

void sched_batch_release(ccq_sched *S, ccq_batch *b)
{
    b->next = S->batch_free;
    S->batch_free = b;
}

/* A fused engine operation the backend ran at op k of this batch (ccq_be_op.fused on its
 * first op): one CCQ_EV_FUSED event, and every part of its ops names it, so the trace shows
 * which operations ran as which engine operation. Before the parts end (with done_early, its
 * ops end in the same pass: the backend ends a fused group whole); once (fused is cleared). */
static void record_fused(ccq_runtime *rt, ccq_batch *b, uint32_t k)
{
    ccq_sched *S = rt->sched;
    ccq_be_op *head = &b->insts[k]->op;
    uint32_t n = head->fused;
    uint64_t bytes = 0, id;
    ccq_status st = CCQ_OK;
    if (n < 2)
        return;
    head->fused = 0;
    if (n > b->be.nops - k) /* a backend bug: never trust it past the batch */
        n = b->be.nops - k;
    id = ++S->next_fused;
    for (uint32_t j = k; j < k + n; j++) {
        ccq_inst *i = b->insts[j];
        bytes += i->op.count * ccq_dtype_size((ccq_dtype)i->op.dtype);
        if (st == CCQ_OK)
            st = i->op.status != CCQ_OK ? i->op.status : b->be.status;
        for (uint32_t p = 0; p < i->chan->nparts; p++)
            if (i->cmds[p] != NULL)
                i->cmds[p]->fused = id;
    }
    if (ccq_trace_on(&rt->trace)) {
        ccq_event e;
        memset(&e, 0, sizeof e);
        e.type = CCQ_EV_FUSED;
        e.time_ns = head->fused_t0;
        e.dur_ns = head->fused_t1 > head->fused_t0 ? head->fused_t1 - head->fused_t0 : 0;
        e.id = id;
        e.batch = b->be.id;
        e.comm = b->insts[k]->chan->comm->id;
        e.seq = head->seq;
        e.count = n;
        e.bytes = bytes;
        e.kind = head->kind;
        e.dtype = head->dtype;
        e.op = head->redop;
        e.status = st;
        e.device = e.stream = UINT32_MAX;
        ccq_trace_rec(&rt->trace, &e);
    }
}

/* A communicator the backend aborted on its own (an asynchronous error): fail what is queued
 * on it and refuse new work, as the watchdog's aborts do. */
static void inst_backend_abort(ccq_runtime *rt, ccq_batch *b, ccq_inst *i)
{
    if (i->op.comm_aborted &&
        !atomic_load_explicit(&i->chan->comm->aborted, memory_order_relaxed)) {
        char why[CCQ_DETAIL_LEN];
        ccq_format(why, sizeof why,
                   "the backend aborted it after an error in batch %" PRIu64 ": %s", b->be.id,
                   b->be.detail.msg[0] ? b->be.detail.msg : "?");
        sched_abort_comm(rt, i->chan->comm, why);
    }
}

/* An engine error on a communicator spanning processes may be a member process that died:
 * ask the OS now, so the failure is reported as the loss it is (runtime/health/). */
static void inst_probe(ccq_runtime *rt, ccq_batch *b, ccq_inst *i)
{
    if (rt->health != NULL && (i->op.status != CCQ_OK || b->be.status != CCQ_OK) &&
        i->chan->comm->nprocs > 1 &&
        !atomic_load_explicit(&i->chan->comm->lost, memory_order_relaxed))
        ccq_health_probe(rt, i->chan->comm);
}

/* An instance's op came back: every part takes its status (and a detail if it failed). */
static void inst_done(ccq_batch *b, ccq_inst *i)
{
    ccq_comm *comm = i->chan->comm;
    ccq_status st = i->op.status;

    if (st == CCQ_OK && b->be.status != CCQ_OK)
        st = b->be.status;
    /* The watchdog aborted the batch: every op in it is aborted, also one the backend
     * finished before it saw its communicator's abort (abort_batch aborts them one by
     * one while the backend runs), so the outcome does not depend on that race. */
    if (st == CCQ_OK && b->aborting)
        st = CCQ_ERR_ABORTED;
    /* A member process was lost: what did not complete, and what was in flight then, fails as
     * that loss. */
    if ((st != CCQ_OK || i->cut) && atomic_load_explicit(&comm->lost, memory_order_relaxed))
        st = CCQ_ERR_PROCESS_LOST;
    if (i->chan->id != CCQ_CHAN_COLL)
        comm->p2p_done++;
    for (uint32_t p = 0; p < i->chan->nparts; p++) {
        ccq_cmd *c = i->cmds[p];
        c->status = st;
        c->state = CCQ_CMD_DONE;
        if (st == CCQ_ERR_PROCESS_LOST) {
            sched_set_detail(c, comm->lost_detail);
        } else if (st == CCQ_ERR_ABORTED &&
                   atomic_load_explicit(&comm->aborted, memory_order_relaxed)) {
            /* Say why it was aborted (the watchdog's or the backend's reason). */
            char reason[CCQ_DETAIL_LEN];
            ccq_format(reason, sizeof reason, "communicator aborted: %s", comm->init_detail);
            sched_set_detail(c, reason);
        } else if (st != CCQ_OK) {
            char reason[CCQ_DETAIL_LEN];
            ccq_format(reason, sizeof reason, "%s%s%s", ccq_status_string(st),
                       b->be.detail.msg[0] ? ": " : "", b->be.detail.msg);
            sched_set_detail(c, reason);
        }
        if (i->chan->id == CCQ_CHAN_COLL && c->seq + 1 > i->chan->comm->coll_done[c->rank])
            i->chan->comm->coll_done[c->rank] = c->seq + 1;
    }
    i->ended = true;
}

/* End the commands of b's streams whose operations came back, in stream order; a stream whose
 * commands of b all ended leaves the batch (it can take new work). Returns whether any ended. */
static bool batch_streams_end(ccq_runtime *rt, ccq_batch *b, uint64_t now, bool all)
{
    bool any = false;
    for (ccq_stream **pp = &b->streams; *pp != NULL;) {
        ccq_stream *s = *pp;
        uint64_t n = 0;
        /* Done, or a failed command riding along (it never reached the backend). */
        while (s->fifo_head != s->cursor &&
               (all || s->fifo_head->state == CCQ_CMD_DONE || s->fifo_head->status != CCQ_OK)) {
            end_head(rt, s, now);
            n++;
        }
        sched_publish_ended(rt, s, n);
        any |= n > 0;
        if (s->fifo_head != s->cursor) {
            pp = &s->batch_next;
            continue;
        }
        *pp = s->batch_next;
        s->inflight = false;
        atomic_store_explicit(&s->issued_ns, 0, memory_order_relaxed);
    }
    return any;
}

/* Operations the backend finished before their batch (ccq_be_op.done_early): their commands
 * end now, so one operation waiting for another process does not hold the streams of the
 * others in its batch. (Without it, a batch holding a pair's all_reduce beside the world's
 * stuck one held the pair's stream until the world's deadline; and a batch holding a ring's
 * local copies beside a receive from another process held streams whose next sends that
 * process waited for: a deadlock across processes.) */
static bool batch_end_early(ccq_runtime *rt, ccq_batch *b)
{
    b->seen_early = b->be.ndone_early;
    for (uint32_t k = 0; k < b->be.nops; k++) {
        ccq_inst *i = b->insts[k];
        if (!i->ended && i->op.done_early) {
            record_fused(rt, b, k);
            inst_probe(rt, b, i);
            inst_backend_abort(rt, b, i);
            inst_done(b, i);
        }
    }
    return batch_streams_end(rt, b, ccq_now_ns(), false);
}

/* A batch came back from the backend: set each part's status, end the batch's commands
 * (every command before each stream's cursor) in stream order. */
void sched_batch_done(ccq_runtime *rt, ccq_batch *b)
{
    ccq_sched *S = rt->sched;
    uint64_t now = ccq_now_ns();

    for (uint32_t k = 0; k < b->be.nops; k++)
        if (!b->insts[k]->ended)
            inst_probe(rt, b, b->insts[k]);
    for (uint32_t k = 0; k < b->be.nops; k++)
        if (!b->insts[k]->ended)
            inst_backend_abort(rt, b, b->insts[k]);
    for (uint32_t k = 0; k < b->be.nops; k++) {
        if (!b->insts[k]->ended) {
            record_fused(rt, b, k);
            inst_done(b, b->insts[k]);
        }
        sched_inst_release(S, b->insts[k]);
    }
    batch_streams_end(rt, b, now, true);
    if (ccq_trace_on(&rt->trace))
        sched_ev_misc(rt, ccq_now_ns(), CCQ_EV_BATCH_DONE, b->be.id, UINT32_MAX, 0, b->be.nops, 0,
                      b->be.status);
    for (uint32_t k = 0; k < b->be.nops; k++) {
        if (b->insts[k]->op.status != CCQ_OK || b->be.status != CCQ_OK) {
            char note[CCQ_DETAIL_LEN];
            ccq_format(
                note, sizeof note, "batch %" PRIu64 " (%u ops) failed: %s%s%s", b->be.id,
                b->be.nops,
                ccq_status_string(b->be.status != CCQ_OK ? b->be.status : b->insts[k]->op.status),
                b->be.detail.msg[0] ? ": " : "", b->be.detail.msg);
            ccq_trace_note(&rt->trace, CCQ_EV_BATCH_DONE, note);
            break;
        }
    }
    /* Unlink from the in-flight list. */
    for (ccq_batch **pp = &S->inflight; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == b) {
            *pp = b->next;
            break;
        }
    }
    S->ninflight--;
    if (b->big)
        S->big_inflight--; /* the next small batch pins again (sched_batch.c, pin_for) */
    sched_batch_release(S, b);
}

bool sched_reap(ccq_runtime *rt)
{
    ccq_sched *S = rt->sched;
    ccq_be_batch *list = S->done;
    bool any = false;

    S->done = NULL;
    /* Also with nothing in flight while the backend still has background work that only
     * its poll() moves (the host backend's sends across processes, completed early). */
    if (S->ninflight > 0 ||
        (rt->be_ops->poll_interval != NULL && rt->be_ops->poll_interval(rt->be) > 0)) {
        ccq_be_batch *more = rt->be_ops->poll(rt->be);
        /* Append: completions are independent, order does not matter. */
        while (more != NULL) {
            ccq_be_batch *next = more->next_done;
            more->next_done = list;
            list = more;
            more = next;
        }
    }
    while (list != NULL) {
        ccq_be_batch *next = list->next_done;
        sched_batch_done(rt, ccq_container_of(list, ccq_batch, be));
        list = next;
        any = true;
    }
    for (ccq_batch *b = S->inflight; b != NULL; b = b->next)
        if (b->be.ndone_early != b->seen_early)
            any |= batch_end_early(rt, b);
    return any;
}
