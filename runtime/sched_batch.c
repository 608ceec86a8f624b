/* The scheduler's batching: what is ready goes into one backend group, respecting channel
 * order (every rank cuts at the same place) and stream order (hazards), then issue. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/sched.h"

/* ------------------------------------------------------------------------------------ */
/* Batching                                                                              */
/* ------------------------------------------------------------------------------------ */

/* Two commands of one stream conflict if either writes memory the other touches. */
static bool hazard(const ccq_cmd *a, const ccq_cmd *b)
{
    return ccq_span_hit(a->wr, b->wr) || ccq_span_hit(a->wr, b->rd) || ccq_span_hit(a->rd, b->wr);
}

/* The same test against everything the stream already has in the batch (its bounding
 * boxes): O(1), and exact whenever it says "no". */
static bool may_conflict(const ccq_stream *s, const ccq_cmd *q)
{
    return ccq_span_hit(q->wr, s->build_wr) || ccq_span_hit(q->wr, s->build_rd) ||
           ccq_span_hit(q->rd, s->build_wr);
}

static void tent_push(ccq_sched *S, ccq_inst *i)
{
    i->attempt_seen = S->attempt;
    XGROW(&S->work, &S->capwork, S->nwork + 1);
    S->work[S->nwork++] = i;
    XGROW(&S->tent, &S->captent, S->ntent + 1);
    S->tent[S->ntent++] = i;
}

static bool inst_taken(const ccq_sched *S, const ccq_inst *i)
{
    return i->attempt_seen == S->attempt || i->batch_pass == S->pass;
}

/* First touch of a stream in this pass / attempt: set up building state, save for undo. */
static void stream_touch(ccq_sched *S, ccq_stream *s)
{
    if (s->build_pass != S->pass) {
        s->build_pass = S->pass;
        s->build_next = s->cursor;
        s->build_first = s->cursor;
        s->attempt_seen = 0;
        s->build_rd = s->build_wr = CCQ_SPAN_EMPTY;
    }
    if (s->attempt_seen != S->attempt) {
        s->attempt_seen = S->attempt;
        s->undo_build_next = s->build_next;
        s->undo_rd = s->build_rd;
        s->undo_wr = s->build_wr;
        s->undo_next = S->undo_streams;
        S->undo_streams = s;
    }
}

static uint64_t chan_build_seq(ccq_sched *S, ccq_chan *ch)
{
    if (ch->build_pass != S->pass) {
        ch->build_pass = S->pass;
        ch->build_seq = ch->head;
        ch->build_ops = 0;
        ch->attempt_seen = 0;
    }
    return ch->build_seq;
}

static void chan_touch(ccq_sched *S, ccq_chan *ch)
{
    chan_build_seq(S, ch);
    if (ch->attempt_seen != S->attempt) {
        ch->attempt_seen = S->attempt;
        ch->undo_seq = ch->build_seq;
        ch->undo_ops = ch->build_ops;
        ch->undo_next = S->undo_chans;
        S->undo_chans = ch;
    }
}

static void attempt_undo(ccq_sched *S)
{
    for (ccq_stream *s = S->undo_streams; s != NULL; s = s->undo_next) {
        for (ccq_cmd *q = s->undo_build_next; q != s->build_next; q = q->fifo_next)
            q->state = q->status == CCQ_OK ? CCQ_CMD_QUEUED : CCQ_CMD_FAILED;
        s->build_next = s->undo_build_next;
        s->build_rd = s->undo_rd;
        s->build_wr = s->undo_wr;
    }
    for (ccq_chan *ch = S->undo_chans; ch != NULL; ch = ch->undo_next) {
        ch->build_seq = ch->undo_seq;
        ch->build_ops = ch->undo_ops;
    }
    for (uint32_t k = 0; k < S->ntent; k++)
        S->tent[k]->attempt_seen = 0;
}

enum { ADD_OK, ADD_BLOCKED, ADD_FULL };

/* The backend cannot stage a send whose src a later command of its stream overwrites in
 * the same group, and the attempt's whole set (what can only run together) was found: fail
 * all of it now, so no part of an exchange or ring runs without the others and nothing
 * waits for the watchdog. */
static void refuse_group(ccq_runtime *rt, const ccq_cmd *send)
{
    ccq_sched *S = rt->sched;
    char detail[CCQ_DETAIL_LEN];
    size_t w = ccq_format(detail, sizeof detail,
                          "refused: the send on device %u stream %u to "
                          "device %u (#%" PRIu64 ") reads a buffer that a "
                          "later command of its stream overwrites, and "
                          "they can only run in one group (an in-place "
                          "exchange or ring shift); backend \"%s\" cannot "
                          "stage the outgoing data",
                          send->device, send->stream->id, send->peer, send->seq, rt->be_ops->name);
    ccq_format(detail + w, sizeof detail - w,
               " (NCCL leaves overlapping buffers in one group undefined): use separate send and "
               "recv buffers");
    attempt_undo(S);
    for (uint32_t k = 0; k < S->ntent; k++)
        sched_fail_inst(S, S->tent[k], CCQ_ERR_UNSUPPORTED, detail, false);
    S->refuse_retry = true; /* progress: the loop runs again and ends the failed heads now */
}

/*
 * Add `root` to the batch together with everything it needs: the earlier sequence numbers
 * of its channel (every rank must cut at the same place) and, for each part, the commands
 * before it on its stream (stream order). Those pull in their own instances, so a ring of
 * send-then-recv goes in whole. Either all of it goes in or nothing does (undo on failure).
 * Cost: linear in what it adds, plus the hazard checks against the same stream's commands
 * already in the batch.
 */
static int try_add(ccq_runtime *rt, ccq_batch *b, ccq_inst *root)
{
    ccq_sched *S = rt->sched;
    uint32_t limit = rt->cfg.max_batch_ops;

    S->attempt++;
    S->nwork = S->ntent = 0;
    S->undo_streams = NULL;
    S->undo_chans = NULL;
    tent_push(S, root);

    while (S->nwork > 0) {
        ccq_inst *x = S->work[--S->nwork];
        ccq_chan *ch = x->chan;

        if (x->blocked_pass == S->pass)
            goto blocked;
        /* Pulled in as a stream predecessor, it may sit on a communicator still forming
         * (a pair's first send/recv across processes): it cannot go yet. */
        if (atomic_load_explicit(&ch->comm->state, memory_order_relaxed) != CCQ_COMM_READY)
            goto blocked;
        /* Channel order: every earlier sequence number is in (or resolved). */
        chan_touch(S, ch);
        /* Grouping across processes: a communicator spanning processes contributes at most
         * group_limit collectives to a batch (ccq_comm.group_limit); the next one goes in
         * the next batch, built at once (S->cut). Only collectives count: a send/recv half
         * (its own channels) is matched per peer by the engine whatever the grouping. */
        if (ch->id == CCQ_CHAN_COLL && ch->comm->group_limit != 0) {
            if (ch->build_ops >= ch->comm->group_limit) {
                S->cut = true;
                goto blocked;
            }
            ch->build_ops++;
        }
        for (uint64_t q = ch->build_seq; q < x->seq; q++) {
            ccq_inst *y = sched_win_get(ch, q);
            if (y == NULL || y->state == CCQ_INST_WAITING || y->state == CCQ_INST_CHECKING)
                goto blocked;
            if (y->state == CCQ_INST_READY && !inst_taken(S, y))
                tent_push(S, y);
        }
        if (x->seq + 1 > ch->build_seq)
            ch->build_seq = x->seq + 1;
        /* Stream order: everything before each part is in the batch too. */
        for (uint32_t p = 0; p < ch->nparts; p++) {
            ccq_cmd *c = x->cmds[p];
            ccq_stream *s = c->stream;
            if (c->state == CCQ_CMD_INCLUDED)
                continue;
            if (s->inflight)
                goto blocked;
            stream_touch(S, s);
            for (ccq_cmd *q = s->build_next;; q = q->fifo_next) {
                if (q->state == CCQ_CMD_QUEUED) {
                    ccq_inst *y = q->inst;
                    if (y->state != CCQ_INST_READY)
                        goto blocked;
                    /* Submitted after a GPU-side wait on its bound CUDA stream: only once the
                     * commands the wait covers were issued in an earlier batch (gpu_wait.h),
                     * which may be the one this pass issues: build again (S->cut). */
                    if (q->gw_mark != 0 && !ccq_gw_clear(rt, s, q->gw_mark)) {
                        S->cut = true;
                        goto blocked;
                    }
                    /* Exact scan only when the boxes overlap: O(1) for the common case
                     * of independent buffers, O(commands in the batch) otherwise. */
                    if (may_conflict(s, q))
                        for (ccq_cmd *e = s->build_first; e != q; e = e->fifo_next) {
                            if (e->status != CCQ_OK || !hazard(e, q))
                                continue;
                            /* A send only reads, so q overwrites what it sends: stream order
                             * says the send reads the old data. The pair may only be able to
                             * run together with q (an in-place exchange or ring shift: its
                             * partner is behind q), so the send's data is staged instead of
                             * q waiting for it, which could be forever. */
                            if (e->kind != CCQ_KIND_SEND)
                                goto blocked;
                            e->inst->stage = true;
                            if (!rt->be_ops->stages_sends && S->refuse == NULL)
                                S->refuse = e;
                        }
                    ccq_span_add(&s->build_rd, q->rd);
                    ccq_span_add(&s->build_wr, q->wr);
                    if (!inst_taken(S, y))
                        tent_push(S, y);
                }
                /* Failed commands ride along and end with the batch (stream order).
                 * build_next moves with every inclusion so an undo covers exactly these. */
                q->state = CCQ_CMD_INCLUDED;
                s->build_next = q->fifo_next;
                if (q == c)
                    break;
            }
        }
    }
    if (S->refuse != NULL) {
        /* Refused only when seen again in a later pass: meanwhile the ready commands before
         * the exchange that can run without it (pulled in here as its stream predecessors)
         * go in a batch of their own, and only what must run with it fails. */
        ccq_inst *e = S->refuse->inst;
        if (e->refuse_pass != 0 && e->refuse_pass < S->pass) {
            refuse_group(rt, S->refuse);
        } else {
            e->refuse_pass = S->pass;
            S->refuse_retry = true;
            attempt_undo(S);
            root->blocked_pass = S->pass;
        }
        S->refuse = NULL;
        return ADD_BLOCKED;
    }
    if (b->be.nops > 0 && b->be.nops + S->ntent > limit) {
        attempt_undo(S);
        return ADD_FULL;
    }
    /* Commit. */
    XGROW(&b->insts, &b->capinsts, b->be.nops + S->ntent);
    for (uint32_t k = 0; k < S->ntent; k++) {
        ccq_inst *i = S->tent[k];
        i->batch_pass = S->pass;
        b->insts[b->be.nops++] = i;
    }
    for (ccq_stream *s = S->undo_streams; s != NULL; s = s->undo_next) {
        if (s->listed_pass != S->pass) { /* first commit touching this stream in this pass */
            s->listed_pass = S->pass;
            s->pass_next = S->pass_streams;
            S->pass_streams = s;
        }
    }
    return ADD_OK;

blocked:
    S->refuse = NULL;
    attempt_undo(S);
    root->blocked_pass = S->pass;
    return ADD_BLOCKED;
}

static ccq_batch *batch_get(ccq_sched *S)
{
    ccq_batch *b = S->batch_free;
    if (b != NULL) {
        S->batch_free = b->next;
    } else {
        b = calloc(1, sizeof *b);
        if (b == NULL)
            sched_xgrow_fail();
    }
    b->be.nops = 0;
    b->be.status = CCQ_OK;
    b->be.detail.msg[0] = '\0';
    b->be.next_done = NULL;
    b->be.be_priv = NULL;
    b->be.ndone_early = 0;
    b->seen_early = 0;
    b->streams = NULL;
    b->next = NULL;
    b->aborting = false;
    b->overdue = false;
    return b;
}

static int inst_order(const void *pa, const void *pb)
{
    const ccq_inst *a = *(ccq_inst *const *)pa, *b = *(ccq_inst *const *)pb;
    if (a->chan->comm->id != b->chan->comm->id)
        return a->chan->comm->id < b->chan->comm->id ? -1 : 1;
    if (a->chan->id != b->chan->id)
        return a->chan->id < b->chan->id ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static void stats_batch(ccq_runtime *rt, uint32_t nops)
{
    int bucket = 0;
    while (bucket < 7 && (2u << bucket) <= nops)
        bucket++;
    atomic_fetch_add_explicit(&rt->stats.batches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&rt->stats.batched_ops, nops, memory_order_relaxed);
    atomic_fetch_add_explicit(&rt->stats.hist[bucket], 1, memory_order_relaxed);
    if (nops > atomic_load_explicit(&rt->stats.max_batch_ops, memory_order_relaxed))
        atomic_store_explicit(&rt->stats.max_batch_ops, nops, memory_order_relaxed);
}

/* A batch with an operation of pin_bytes or more runs with the scheduler unpinned
 * (common/cores.h, ccq_core_pin); the next batch without one pins it again, once no such batch
 * is in flight (sched_batch_done counts them). Decided as batches are issued, not as they end:
 * a chain of large operations stays unpinned, where pinning at each end would move the thread
 * back to its core before every operation. */
static void pin_for(ccq_runtime *rt, ccq_batch *b)
{
    ccq_sched *S = rt->sched;

    b->big = false;
    if (S->pin.cpu < 0)
        return;
    for (uint32_t k = 0; k < b->be.nops && !b->big; k++)
        b->big = (uint64_t)b->ops[k]->count * ccq_dtype_size((ccq_dtype)b->ops[k]->dtype) >=
                 rt->pin_bytes;
    if (b->big)
        S->big_inflight++;
    ccq_core_pin_set(&S->pin, S->big_inflight == 0);
}

/* Hand a built batch to the backend. Operations of one channel go in sequence order
 * (NCCL requires every rank to call a communicator's collectives in the same order). */
static void issue(ccq_runtime *rt, ccq_batch *b)
{
    ccq_sched *S = rt->sched;
    ccq_errbuf err = {{0}};
    ccq_status st;

    qsort(b->insts, b->be.nops, sizeof *b->insts, inst_order);
    XGROW(&b->ops, &b->capops, b->be.nops);
    for (uint32_t k = 0; k < b->be.nops; k++) {
        ccq_inst *i = b->insts[k];
        i->state = CCQ_INST_ISSUED;
        /* Set here, not at match time: an operation can match while its communicator still
         * forms (meeting the other processes), before the backend has created it. */
        i->op.comm = i->chan->comm->be;
        i->op.status = CCQ_OK;
        i->op.comm_aborted = 0;
        i->op.done_early = 0;
        i->ended = false;
        i->op.stage_src = i->stage && rt->be_ops->stages_sends;
        i->op.fused = 0; /* the backend says which ops it fused (backends/fuse.h) */
        i->op.fused_t0 = i->op.fused_t1 = 0;
        b->ops[k] = &i->op;
    }
    b->be.ops = b->ops;
    b->be.id = ++S->batch_id;
    b->issue_ns = ccq_now_ns();
    bool traced = ccq_trace_on(&rt->trace);
    /* Every stream with commands in the batch: they are in flight up to build_next. */
    for (ccq_stream *s = S->pass_streams; s != NULL;) {
        ccq_stream *next = s->pass_next;
        for (ccq_cmd *q = s->cursor; q != s->build_next; q = q->fifo_next) {
            q->state = CCQ_CMD_ISSUED;
            if (q->status != CCQ_OK)
                continue; /* a failed command riding along; it is not sent anywhere */
            q->batch = b->be.id;
            q->issue_ns = b->issue_ns;
            ccq_hist_add(&rt->trace.queue_ns, b->issue_ns - q->submit_ns);
            if (traced)
                sched_ev_cmd(rt, CCQ_EV_ISSUED, q, b->issue_ns, CCQ_OK);
        }
        /* Every command up to build_next ends when the batch comes back: the stream's ended
         * count then (the backend's GPU-side wait counter after the batch). */
        s->batch_done = s->ending;
        for (ccq_cmd *q = s->fifo_head; q != s->build_next; q = q->fifo_next)
            s->batch_done++;
        ccq_gw_passed(s, s->batch_done); /* issued: GPU-side wait barriers on it are met */
        s->cursor = s->build_next;
        s->inflight = true;
        atomic_store_explicit(&s->issued_ns, b->issue_ns, memory_order_release);
        s->pass_next = NULL;
        s->batch_next = b->streams;
        b->streams = s;
        s = next;
    }
    S->pass_streams = NULL;
    for (uint32_t k = 0; k < b->be.nops; k++) {
        ccq_inst *i = b->insts[k];
        for (uint32_t p = 0; p < i->op.nparts; p++)
            i->op.parts[p].stream_done = i->cmds[p] ? i->cmds[p]->stream->batch_done : 0;
        sched_chan_advance(S, i->chan);
    }
    b->next = S->inflight;
    S->inflight = b;
    S->ninflight++;
    S->wd_next = min_u64(S->wd_next, ccq_add_sat(b->issue_ns, rt->timeout_ns));
    stats_batch(rt, b->be.nops);
    pin_for(rt, b);

    st = rt->be_ops->issue(rt->be, &b->be, &err);
    if (traced) { /* bytes = how long issuing took (for the host backend: inline work too) */
        uint64_t t1 = ccq_now_ns();
        sched_ev_misc(rt, t1, CCQ_EV_BATCH, b->be.id, UINT32_MAX, 0, b->be.nops, t1 - b->issue_ns,
                      st);
    }
    if (st != CCQ_OK) {
        /* Nothing started: the batch completes now, failed with the backend's message. */
        b->be.status = st;
        snprintf(b->be.detail.msg, sizeof b->be.detail.msg, "%s", err.msg);
        for (uint32_t k = 0; k < b->be.nops; k++)
            b->ops[k]->status = st;
        b->be.next_done = S->done;
        S->done = &b->be;
    }
}

bool sched_build_and_issue(ccq_runtime *rt)
{
    ccq_sched *S = rt->sched;
    bool any = false;

    while (S->chans != NULL) {
        ccq_batch *b = batch_get(S);
        bool full = false;

        S->pass++;
        S->pass_streams = NULL;
        S->cut = false;
        for (ccq_chan **pp = &S->chans; *pp != NULL && !full;) {
            ccq_chan *ch = *pp;
            ccq_inst *i = sched_win_get(ch, ch->head);
            if (i == NULL || i->state != CCQ_INST_READY ||
                atomic_load_explicit(&ch->comm->state, memory_order_relaxed) != CCQ_COMM_READY) {
                /* Its head is not ready (or its communicator is still forming): unlist until
                 * an arrival, an advance or the communicator's formation relists it. */
                ch->listed = false;
                *pp = ch->list_next;
                continue;
            }
            /* Add as many of this channel's ready instances as fit, in sequence order. */
            for (uint64_t q = chan_build_seq(S, ch);; q = chan_build_seq(S, ch)) {
                i = sched_win_get(ch, q);
                if (i != NULL && i->state == CCQ_INST_FAILED) {
                    ch->build_seq = q + 1; /* resolved: its parts end on their own */
                    continue;
                }
                if (i == NULL || i->state != CCQ_INST_READY)
                    break;
                int r = i->batch_pass == S->pass ? ADD_OK : try_add(rt, b, i);
                if (r == ADD_FULL)
                    full = true;
                if (r != ADD_OK)
                    break;
                if (chan_build_seq(S, ch) <= q)
                    ch->build_seq = q + 1;
            }
            pp = &ch->list_next;
        }
        if (b->be.nops == 0) {
            sched_batch_release(S, b);
            break;
        }
        issue(rt, b);
        any = true;
        /* A full batch, or one that a group limit cut, leaves ready work: another pass
         * (one with nothing to add ends the loop above). */
        if (!full && !S->cut)
            break;
    }
    any |= S->refuse_retry;
    S->refuse_retry = false;
    return any;
}
