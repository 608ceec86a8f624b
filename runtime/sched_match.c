/* The scheduler's intake: drain stream queues, give each part its instance in its channel
 * window, match the parts of an operation (mismatches fail it), and form communicators. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/sched.h"

/* ------------------------------------------------------------------------------------ */
/* Instances and channel windows                                                         */
/* ------------------------------------------------------------------------------------ */

static ccq_inst *inst_alloc(ccq_sched *S, ccq_chan *chan, uint64_t seq)
{
    ccq_inst *i = S->inst_free;
    if (i != NULL)
        S->inst_free = i->wnext;
    else if ((i = malloc(S->inst_size)) == NULL)
        sched_xgrow_fail();
    memset(i, 0, sizeof *i);
    i->cmds = (ccq_cmd **)(i + 1);
    i->bparts = (ccq_be_part *)(i->cmds + S->inst_parts);
    memset(i->cmds, 0, chan->nparts * sizeof *i->cmds);
    i->chan = chan;
    i->seq = seq;
    i->state = CCQ_INST_WAITING;
    return i;
}

void sched_inst_release(ccq_sched *S, ccq_inst *i)
{
    free(i->fail_detail);
    i->fail_detail = NULL;
    i->wnext = S->inst_free;
    S->inst_free = i;
}

static ccq_inst **win_slot(ccq_chan *ch, uint64_t seq)
{
    return &ch->win[seq & (ch->cap - 1)];
}

ccq_inst *sched_win_get(ccq_chan *ch, uint64_t seq)
{
    if (ch->win == NULL || seq < ch->head || seq - ch->head >= ch->cap)
        return NULL;
    return *win_slot(ch, seq);
}

/* Make room for seq in the window (O(cap) when it grows, which is rare: the window only
 * spans the sequence numbers in flight on this channel). */
static void win_reserve(ccq_chan *ch, uint64_t seq)
{
    uint64_t need = seq - ch->head + 1, ncap = ch->cap ? ch->cap : 16;
    ccq_inst **nw;

    if (ch->win != NULL && need <= ch->cap)
        return;
    while (ncap < need)
        ncap *= 2;
    nw = calloc(ncap, sizeof *nw);
    if (nw == NULL)
        sched_xgrow_fail();
    for (uint64_t s = ch->head; ch->win != NULL && s < ch->head + ch->cap; s++)
        nw[s & (ncap - 1)] = *win_slot(ch, s);
    free(ch->win);
    ch->win = nw;
    ch->cap = ncap;
}

static void chan_list(ccq_sched *S, ccq_chan *ch)
{
    if (!ch->listed) {
        ch->listed = true;
        ch->list_next = S->chans;
        S->chans = ch;
    }
}

/* Move the head past resolved instances (issued ones belong to their batch now; failed
 * ones are freed: their present parts already carry the failure). */
void sched_chan_advance(ccq_sched *S, ccq_chan *ch)
{
    ccq_inst *i;
    while (ch->win != NULL && (i = *win_slot(ch, ch->head)) != NULL &&
           (i->state == CCQ_INST_ISSUED || i->state == CCQ_INST_FAILED)) {
        *win_slot(ch, ch->head) = NULL;
        if (i->state == CCQ_INST_FAILED) {
            ch->late_status = i->fail_status;
            sched_inst_release(S, i);
        }
        ch->head++;
    }
    i = ch->win ? *win_slot(ch, ch->head) : NULL;
    if (i != NULL && i->state == CCQ_INST_READY)
        chan_list(S, ch);
}

/* ------------------------------------------------------------------------------------ */
/* Matching                                                                              */
/* ------------------------------------------------------------------------------------ */

/* The fields the parts of a collective must agree on: kind, count, dtype, and the op of
 * reductions and the root of rooted ones (those only when the kinds agree). */
bool sched_field_differs(const ccq_cmd *a, const ccq_cmd *b, int f)
{
    switch (f) {
    case 0:
        return a->kind != b->kind;
    case 1:
        return a->count != b->count;
    case 2:
        return a->dtype != b->dtype;
    case 3:
        return a->kind == b->kind && ccq_kinds[a->kind].reduces && a->redop != b->redop;
    default:
        return a->kind == b->kind && ccq_kinds[a->kind].rooted && a->root != b->root;
    }
}

static size_t field_str(char *buf, size_t len, const ccq_cmd *c, int f)
{
    switch (f) {
    case 0:
        return ccq_format(buf, len, "%s", ccq_kind_name(c->kind));
    case 1:
        return ccq_format(buf, len, "%zu", c->count);
    case 2:
        return ccq_format(buf, len, "%s", ccq_dtype_name((ccq_dtype)c->dtype));
    case 3:
        return ccq_format(buf, len, "%s", ccq_reduce_op_name((ccq_reduce_op)c->redop));
    default:
        return ccq_format(buf, len, "device %u", c->comm->devices[c->root]);
    }
}

static void inst_ready(ccq_runtime *rt, ccq_inst *i);

/* All parts are present: check that they agree, then build the backend's view. */
static void inst_complete(ccq_runtime *rt, ccq_sched *S, ccq_inst *i)
{
    ccq_chan *ch = i->chan;
    ccq_cmd *c0 = i->cmds[0];
    char detail[CCQ_DETAIL_LEN];
    size_t w = 0;
    bool bad = false;
    int nbad = 0; /* fields found to differ so far */

    if (ch->id == CCQ_CHAN_COLL) {
        /* Compare every rank with rank 0, field by field, naming the ranks. */
        static const char *const fields[] = {"kind", "count", "dtype", "op", "root"};
        for (int f = 0; f < 5; f++) {
            bool field_bad = false;
            for (uint32_t r = 1; r < ch->nparts; r++) {
                ccq_cmd *c = i->cmds[r];
                if (!sched_field_differs(c0, c, f))
                    continue;
                if (!bad)
                    w += ccq_format(detail + w, sizeof detail - w,
                                    "parts do not match across ranks:");
                bad = true;
                if (!field_bad) {
                    w += ccq_format(detail + w, sizeof detail - w, "%s %s: rank 0 (device %u) ",
                                    nbad ? ";" : "", fields[f], c0->device);
                    w += field_str(detail + w, sizeof detail - w, c0, f);
                }
                field_bad = true;
                w += ccq_format(detail + w, sizeof detail - w, ", rank %u (device %u) ", r,
                                c->device);
                w += field_str(detail + w, sizeof detail - w, c, f);
            }
            nbad += field_bad;
        }
    } else if (ch->nparts == 2) {
        ccq_cmd *snd = i->cmds[0], *rcv = i->cmds[1];
        if (snd->count != rcv->count || snd->dtype != rcv->dtype) {
            bad = true;
            ccq_format(detail, sizeof detail,
                       "send and recv do not match: the send on device %u has %s x %zu, the "
                       "recv on device %u has %s x %zu",
                       snd->device, ccq_dtype_name(snd->dtype), snd->count, rcv->device,
                       ccq_dtype_name(rcv->dtype), rcv->count);
        }
    }
    if (bad) {
        char note[CCQ_DETAIL_LEN];
        size_t nw = ccq_format(note, sizeof note, "mismatch in #%" PRIu64 " on comm ", i->seq);
        nw += ccq_describe_comm(note + nw, sizeof note - nw, ch->comm);
        ccq_format(note + nw, sizeof note - nw, ": %s", detail);
        ccq_trace_note(&rt->trace, CCQ_EV_FAILED, note);
        sched_fail_inst(S, i, CCQ_ERR_MISMATCH, detail, false);
        return;
    }

    i->op.kind = c0->kind; /* a send/recv pair: part 0, the send (see common/kinds.h) */
    i->op.dtype = c0->dtype;
    i->op.redop = c0->redop;
    i->op.root = ch->id == CCQ_CHAN_COLL ? c0->root : 0;
    /* A half whose peer is another process's: the peer's rank (a pair's ranks are 0, 1). */
    i->op.peer = ch->id != CCQ_CHAN_COLL && ch->comm->n == 2 ? 1 - c0->rank : 0;
    i->op.count = c0->count;
    i->op.seq = i->seq;
    i->op.comm = ch->comm->be;
    i->op.comm_size = ch->comm->n;
    i->op.nparts = ch->nparts;
    i->op.parts = i->bparts;
    i->op.status = CCQ_OK;
    for (uint32_t p = 0; p < ch->nparts; p++) {
        ccq_cmd *c = i->cmds[p];
        i->bparts[p].device = ccq_backend_device(rt, c->device);
        i->bparts[p].rank = c->rank;
        i->bparts[p].stream_index = c->stream->index;
        i->bparts[p].slot = c->slot;
        /* Buffers a rank does not use reach the backend as NULL (non-root ranks). */
        i->bparts[p].src = c->rd.lo < c->rd.hi ? c->src : NULL;
        i->bparts[p].dst = c->wr.lo < c->wr.hi ? c->dst : NULL;
    }
    if (rt->cfg.check_signatures && ch->comm->nprocs > 1) {
        /* Opt-in: the member processes compare signatures before it may run. */
        char why[CCQ_DETAIL_LEN];
        ccq_status st = ccq_sig_post(rt, i, why, sizeof why);
        if (st != CCQ_OK) {
            sched_fail_inst(S, i, st, why, false);
            return;
        }
        i->state = CCQ_INST_CHECKING;
        i->check_next = S->checking;
        S->checking = i;
        return;
    }
    inst_ready(rt, i);
}

/* An instance may run: every part is there and agrees (and, with check_signatures, every
 * member process agrees too). */
static void inst_ready(ccq_runtime *rt, ccq_inst *i)
{
    ccq_chan *ch = i->chan;
    ccq_cmd *c0 = i->cmds[0];
    i->state = CCQ_INST_READY;
    if (ccq_trace_on(&rt->trace))
        sched_ev_misc(rt, ccq_now_ns(), CCQ_EV_MATCHED, c0->trace_id, ch->comm->id, i->seq,
                      c0->count, c0->count * ccq_dtype_size((ccq_dtype)c0->dtype), CCQ_OK);
    if (i->seq == ch->head)
        chan_list(rt->sched, ch);
}

/* Advance the cross-process signature checks; true if one ended. */
bool sched_checks_progress(ccq_runtime *rt)
{
    ccq_sched *S = rt->sched;
    bool any = false;
    for (ccq_inst **pp = &S->checking; *pp != NULL;) {
        ccq_inst *i = *pp;
        char why[CCQ_DETAIL_LEN];
        ccq_status st = ccq_sig_test(rt, i, why, sizeof why);
        if (st == CCQ_IN_PROGRESS) {
            pp = &i->check_next;
            continue;
        }
        *pp = i->check_next;
        any = true;
        if (st == CCQ_OK) {
            inst_ready(rt, i);
            continue;
        }
        char note[CCQ_DETAIL_LEN];
        size_t nw = ccq_format(note, sizeof note, "mismatch in #%" PRIu64 " on comm ", i->seq);
        nw += ccq_describe_comm(note + nw, sizeof note - nw, i->chan->comm);
        ccq_format(note + nw, sizeof note - nw, ": %s", why);
        ccq_trace_note(&rt->trace, CCQ_EV_FAILED, note);
        i->state = CCQ_INST_READY; /* off the list already: fail it as a matched one */
        sched_fail_inst(S, i, st, why, false);
    }
    return any;
}

/* A communicator's formation ended: publish it (ccq_comm_init waiters, submitters) and
 * release or fail what waits on it. */
void sched_comm_settle(ccq_runtime *rt, ccq_comm *c, ccq_status st)
{
    ccq_sched *S = rt->sched;
    atomic_store_explicit(&c->state, st == CCQ_OK ? CCQ_COMM_READY : CCQ_COMM_FAILED,
                          memory_order_release);
    ccq_signal_notify(&c->ev);
    for (int k = 0; k < CCQ_CHAN_COUNT; k++) {
        ccq_chan *ch = &c->chan[k];
        if (st == CCQ_OK) {
            /* Operations matched while it formed can go now. */
            ccq_inst *i = sched_win_get(ch, ch->head);
            if (i != NULL && i->state == CCQ_INST_READY)
                chan_list(S, ch);
            continue;
        }
        char detail[CCQ_DETAIL_LEN];
        ccq_format(detail, sizeof detail, "communicator could not be created: %s", c->init_detail);
        for (uint64_t q = ch->head, end = ch->head + ch->cap; ch->win != NULL && q < end; q++) {
            ccq_inst *i = sched_win_get(ch, q);
            if (i != NULL && i->state != CCQ_INST_ISSUED && i->state != CCQ_INST_FAILED)
                sched_fail_inst(S, i, c->init_status, detail, c->init_status == CCQ_ERR_SHUTDOWN);
        }
        ch->late_status = c->init_status;
        sched_chan_advance(S, ch);
    }
}

/* Start forming a communicator (scheduler thread only: NCCL requires it). While shutting
 * down it is still formed: commands accepted before the streams closed may need it. Only
 * requests left when the scheduler exits are refused. */
static void comm_form(ccq_runtime *rt, ccq_comm *c, uint64_t now)
{
    ccq_sched *S = rt->sched;
    ccq_status st;

    if (c->form_step != CCQ_FORM_IDLE)
        return;
    st = ccq_comm_form_start(rt, c, now);
    if (st == CCQ_IN_PROGRESS) {
        c->forming_next = S->forming;
        S->forming = c;
        return;
    }
    sched_comm_settle(rt, c, st);
}

/* Advance every communicator that is forming; true if one finished. */
bool sched_comms_progress(ccq_runtime *rt, uint64_t now)
{
    ccq_sched *S = rt->sched;
    bool any = false;
    for (ccq_comm **pp = &S->forming; *pp != NULL;) {
        ccq_comm *c = *pp;
        ccq_status st = ccq_comm_form_test(rt, c, now);
        if (st == CCQ_IN_PROGRESS) {
            pp = &c->forming_next;
            continue;
        }
        *pp = c->forming_next;
        sched_comm_settle(rt, c, st);
        any = true;
    }
    return any;
}

static void active_add(ccq_sched *S, ccq_stream *s)
{
    if (!s->active) {
        XGROW(&S->active, &S->capactive, S->nactive + 1);
        S->active[S->nactive++] = s;
        s->active = true;
    }
}

/* A command arrived from its stream's queue. */
void sched_arrive(ccq_runtime *rt, ccq_cmd *c)
{
    ccq_sched *S = rt->sched;
    ccq_stream *s = c->stream;
    ccq_comm *comm = c->comm;
    ccq_chan *ch;
    ccq_inst *i;
    char detail[CCQ_DETAIL_LEN];

    c->fifo_next = NULL;
    c->inst = NULL;
    c->detail = NULL;
    c->trace_id = ++S->next_cmd_id;
    c->batch = 0;
    c->issue_ns = 0;
    if (ccq_trace_on(&rt->trace))
        sched_ev_cmd(rt, CCQ_EV_SUBMITTED, c, c->submit_ns, CCQ_OK);
    {
        /* The memory this rank's part reads and writes, by kind (hazards, backend view). */
        size_t es = ccq_dtype_size((ccq_dtype)c->dtype);
        bool root = c->rank == c->root;
        uint32_t n = ccq_kinds[c->kind].collective ? c->comm->n : 1;
        size_t rb = ccq_kind_src_bytes(c->kind, c->count, es, n, root);
        size_t wb = ccq_kind_dst_bytes(c->kind, c->count, es, n, root);
        c->rd =
            c->src && rb ? (ccq_span){(uintptr_t)c->src, (uintptr_t)c->src + rb} : CCQ_SPAN_EMPTY;
        c->wr =
            c->dst && wb ? (ccq_span){(uintptr_t)c->dst, (uintptr_t)c->dst + wb} : CCQ_SPAN_EMPTY;
    }
    c->status = CCQ_OK;
    c->state = CCQ_CMD_QUEUED;
    c->cancel = 0;
    if (s->fifo_tail)
        s->fifo_tail->fifo_next = c;
    else
        s->fifo_head = c;
    s->fifo_tail = c;
    if (s->cursor == NULL)
        s->cursor = c;
    active_add(S, s);
    S->wd_next = min_u64(S->wd_next, ccq_add_sat(c->submit_ns, rt->timeout_ns));

    bool dropped = false;
    if (rt->fault.drop_rank == (int64_t)c->device) {
        /* Fault injection: this rank "never submitted" the command (it still ends, failed,
         * on its own stream; its operation sees the part as missing: below). */
        uint64_t k = S->drop_seen[ccq_backend_device(rt, c->device)]++;
        dropped = k >= (uint64_t)rt->fault.drop_after &&
                  (rt->fault.drop_count < 0 ||
                   k - (uint64_t)rt->fault.drop_after < (uint64_t)rt->fault.drop_count);
        if (dropped) {
            ccq_format(detail, sizeof detail,
                       "dropped by fault injection (CCQ_FAULT drop:rank=%u): never matched, "
                       "so the other ranks see this rank as missing",
                       c->device);
            sched_fail_cmd(c, CCQ_ERR_BACKEND, detail, false);
        }
    }
    if (comm->form_step == CCQ_FORM_IDLE)
        comm_form(rt, comm, c->submit_ns);
    if (atomic_load_explicit(&comm->aborted, memory_order_acquire)) {
        if (atomic_load_explicit(&comm->lost, memory_order_acquire)) {
            sched_fail_cmd(c, CCQ_ERR_PROCESS_LOST, comm->lost_detail, false);
            return;
        }
        ccq_format(detail, sizeof detail, "communicator aborted: %s", comm->init_detail);
        sched_fail_cmd(c, CCQ_ERR_ABORTED, detail, false);
        return;
    }
    if (atomic_load_explicit(&comm->state, memory_order_acquire) == CCQ_COMM_FAILED) {
        ccq_format(detail, sizeof detail, "communicator could not be created: %s",
                   comm->init_detail);
        sched_fail_cmd(c, comm->init_status, detail, comm->init_status == CCQ_ERR_SHUTDOWN);
        return;
    }
    ch = &comm->chan[c->chan];
    if (c->seq < ch->head) {
        if (dropped)
            return;
        /* Its operation was already resolved without it: the other parts failed. */
        ccq_format(detail, sizeof detail,
                   "arrived after the other parts of this operation had failed (%s)",
                   ccq_status_name(ch->late_status));
        sched_fail_cmd(c, ch->late_status, detail, ch->late_status == CCQ_ERR_SHUTDOWN);
        return;
    }
    win_reserve(ch, c->seq);
    i = *win_slot(ch, c->seq);
    if (i == NULL) {
        i = inst_alloc(S, ch, c->seq);
        *win_slot(ch, c->seq) = i;
    }
    if (dropped) {
        /* The part counts as arrived-but-absent: the operation can never run. With parts
         * from other ranks it waits, and the watchdog names this rank as missing; with none
         * (a one-rank communicator, a send to self) nothing would ever resolve its sequence
         * number and everything after it would stall, so it resolves now. */
        i->present++;
        i->dropped++;
        if (i->state != CCQ_INST_FAILED && i->dropped == ch->nparts)
            sched_fail_inst(S, i, CCQ_ERR_BACKEND, "every part was dropped by fault injection",
                            false);
        return;
    }
    if (c->part >= ch->nparts || i->cmds[c->part] != NULL) {
        /* Cannot happen: sequence numbers come from one counter per (channel, part). */
        sched_fail_cmd(c, CCQ_ERR_BACKEND, "internal error: duplicate part", false);
        return;
    }
    i->cmds[c->part] = c;
    i->present++;
    c->inst = i;
    if (c->pre_status != CCQ_OK) {
        /* The backend's submit hook failed on the caller's thread: the operation cannot
         * run, so every part fails now rather than waiting for the watchdog. */
        ccq_format(detail, sizeof detail, "the backend refused it on device %u: %s", c->device,
                   c->pre_detail ? c->pre_detail : "submit hook failed");
        sched_fail_inst(S, i, c->pre_status, detail, false);
        return;
    }
    if (i->state == CCQ_INST_FAILED) {
        sched_fail_cmd(c, i->fail_status, i->fail_detail, i->fail_status == CCQ_ERR_SHUTDOWN);
        i->cmds[c->part] = NULL;
        return;
    }
    if (i->present == ch->nparts && i->dropped == 0)
        inst_complete(rt, S, i);
}

bool sched_drain(ccq_runtime *rt)
{
    ccq_sched *S = rt->sched;
    ccq_mpsc_node *n;
    bool any = false;

    for (n = ccq_mpsc_pop_all_spsc(&rt->new_streams); n != NULL;) {
        ccq_mpsc_node *next = n->next;
        XGROW(&S->live, &S->caplive, S->nlive + 1);
        S->live[S->nlive++] = ccq_container_of(n, ccq_stream, new_node);
        n = next;
        any = true;
    }
    for (n = ccq_mpsc_pop_all_spsc(&rt->comm_reqs); n != NULL;) {
        ccq_mpsc_node *next = n->next;
        comm_form(rt, ccq_container_of(n, ccq_comm, req_node), ccq_now_ns());
        n = next;
        any = true;
    }
    for (uint32_t k = 0; k < S->nlive; k++) {
        ccq_stream *s = S->live[k];
        for (n = ccq_mpsc_pop_all_spsc(&s->q); n != NULL;) {
            /* Read the link first: sched_arrive() may fail the command, never free it, but keep
             * the queue link and the FIFO link independent. */
            ccq_mpsc_node *next = n->next;
            s->received++;
            sched_arrive(rt, ccq_container_of(n, ccq_cmd, qnode));
            n = next;
            any = true;
        }
    }
    return any;
}
