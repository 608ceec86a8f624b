/* The scheduler thread: drains stream queues, matches the parts of each operation,
 * batches what is ready, issues batches through the backend, ends commands in stream order,
 * runs the watchdog and carries out shutdown. It is the only thread that calls the backend
 * and the only one that touches anything marked "scheduler only". */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"

typedef struct ccq_sched {
    ccq_stream **live; /* streams with a ring: scanned for input */
    uint32_t nlive, caplive;
    ccq_stream **active; /* streams with commands received and not ended */
    uint32_t nactive, capactive;
    ccq_chan *chans;    /* channels that may have a ready head (list_next links) */
    ccq_comm *forming;  /* communicators forming (forming_next links) */
    ccq_inst *checking; /* instances in the cross-process signature check (check_next) */
    ccq_inst *inst_free;
    size_t inst_size;
    uint32_t inst_parts;  /* parts every instance can hold: max(2, ndev) */
    uint64_t *drop_seen;  /* fault injection: commands seen per device (drop:rank=R) */
    uint64_t next_cmd_id; /* event-log ids */
    bool error_seen;      /* a command failed this pass (automatic trace dumps) */
    ccq_batch *batch_free;
    ccq_batch *inflight; /* batches issued and not returned (next links) */
    uint32_t ninflight;
    ccq_be_batch *done; /* completions polled but not processed yet */
    uint64_t pass, attempt, batch_id;
    /* The current attempt's tentative set and undo lists. */
    ccq_inst **work;
    uint32_t nwork, capwork;
    ccq_inst **tent;
    uint32_t ntent, captent;
    ccq_stream *undo_streams;
    ccq_chan *undo_chans;
    ccq_stream *pass_streams; /* streams with commands in the batch being built */
    const ccq_cmd *refuse;    /* the attempt met a send the backend cannot stage */
    bool refuse_retry;        /* a refusal was deferred or made: loop again without sleeping */
    uint64_t wd_next;         /* earliest watchdog deadline (UINT64_MAX: none) */
    /* Shutdown. */
    bool closing, cancelled_incomplete, shutdown_aborted;
    uint64_t close_ns;
    /* Counters (published to rt->stats). */
    uint64_t completed, failed, cancelled;
} ccq_sched;

/* How often communicators that are forming are polled while the scheduler is otherwise idle. */
#define CCQ_FORM_POLL_NS 1000000u

static inline uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* Grow a pointer array to hold at least `need` entries. */
static bool grow(void *arrp, uint32_t *cap, uint32_t need)
{
    void **arr = *(void ***)arrp;
    uint32_t ncap = *cap ? *cap : 16;

    if (need <= *cap)
        return true;
    while (ncap < need)
        ncap *= 2;
    arr = realloc(arr, ncap * sizeof *arr);
    if (arr == NULL)
        return false;
    *(void ***)arrp = arr;
    *cap = ncap;
    return true;
}

/* The scheduler must not fail on memory in the middle of a pass; allocation failure on
 * these small internal arrays is treated as fatal, like an assertion. */
__attribute__((noreturn)) static void xgrow_fail(void)
{
    fprintf(stderr, "ccq: scheduler out of memory\n");
    abort();
}

#define XGROW(arrp, capp, need)                                                                    \
    do {                                                                                           \
        if (!grow((arrp), (capp), (need)))                                                         \
            xgrow_fail();                                                                          \
    } while (0)

static char *xstrdup(const char *s)
{
    char *d = strdup(s ? s : "");
    if (d == NULL)
        xgrow_fail();
    return d;
}

/* ------------------------------------------------------------------------------------ */
/* Setup                                                                                 */
/* ------------------------------------------------------------------------------------ */

ccq_status ccq_sched_create(ccq_runtime *rt)
{
    ccq_sched *S = calloc(1, sizeof *S);
    if (S == NULL)
        return CCQ_ERR_NO_MEMORY;
    S->inst_parts = rt->ndev > 2 ? rt->ndev : 2;
    S->inst_size = sizeof(ccq_inst) + S->inst_parts * (sizeof(ccq_cmd *) + sizeof(ccq_be_part));
    S->wd_next = UINT64_MAX;
    S->drop_seen = calloc(rt->ndev, sizeof *S->drop_seen);
    if (S->drop_seen == NULL) {
        free(S);
        return CCQ_ERR_NO_MEMORY;
    }
    rt->sched = S;
    return CCQ_OK;
}

static void batch_free_mem(ccq_batch *b)
{
    free(b->ops);
    free(b->insts);
    free(b);
}

void ccq_sched_destroy(ccq_runtime *rt)
{
    ccq_sched *S = rt->sched;
    if (S == NULL)
        return;
    while (S->inst_free) {
        ccq_inst *i = S->inst_free;
        S->inst_free = i->wnext;
        free(i);
    }
    while (S->batch_free) {
        ccq_batch *b = S->batch_free;
        S->batch_free = b->next;
        batch_free_mem(b);
    }
    free(S->drop_seen);
    free(S->live);
    free(S->active);
    free(S->work);
    free(S->tent);
    free(S);
    rt->sched = NULL;
}

/* ------------------------------------------------------------------------------------ */
/* Instances and channel windows                                                         */
/* ------------------------------------------------------------------------------------ */

static ccq_inst *inst_alloc(ccq_sched *S, ccq_chan *chan, uint64_t seq)
{
    ccq_inst *i = S->inst_free;
    if (i != NULL)
        S->inst_free = i->wnext;
    else if ((i = malloc(S->inst_size)) == NULL)
        xgrow_fail();
    memset(i, 0, sizeof *i);
    i->cmds = (ccq_cmd **)(i + 1);
    i->bparts = (ccq_be_part *)(i->cmds + S->inst_parts);
    memset(i->cmds, 0, chan->nparts * sizeof *i->cmds);
    i->chan = chan;
    i->seq = seq;
    i->state = CCQ_INST_WAITING;
    return i;
}

static void inst_release(ccq_sched *S, ccq_inst *i)
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

static ccq_inst *win_get(ccq_chan *ch, uint64_t seq)
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
        xgrow_fail();
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
static void chan_advance(ccq_sched *S, ccq_chan *ch)
{
    ccq_inst *i;
    while (ch->win != NULL && (i = *win_slot(ch, ch->head)) != NULL &&
           (i->state == CCQ_INST_ISSUED || i->state == CCQ_INST_FAILED)) {
        *win_slot(ch, ch->head) = NULL;
        if (i->state == CCQ_INST_FAILED) {
            ch->late_status = i->fail_status;
            inst_release(S, i);
        }
        ch->head++;
    }
    i = ch->win ? *win_slot(ch, ch->head) : NULL;
    if (i != NULL && i->state == CCQ_INST_READY)
        chan_list(S, ch);
}

/* ------------------------------------------------------------------------------------ */
/* Event log                                                                             */
/* ------------------------------------------------------------------------------------ */

/* Record an event about a command (submitted, issued, completed, failed). */
static void ev_cmd(ccq_runtime *rt, uint32_t type, const ccq_cmd *c, uint64_t t, ccq_status st)
{
    ccq_event tmp, *e = ccq_trace_slot(&rt->trace, &tmp);
    const ccq_kind_info *k = &ccq_kinds[c->kind];
    /* Every field is written: the slot holds an older event. */
    e->time_ns = t;
    e->id = c->trace_id;
    e->batch = c->batch;
    e->seq = c->seq;
    e->count = c->count;
    e->bytes = c->count * ccq_dtype_size((ccq_dtype)c->dtype);
    e->type = type;
    e->thread = c->thread;
    e->device = c->device;
    e->stream = c->stream->id;
    e->comm = c->comm->id;
    e->kind = c->kind;
    e->dtype = c->dtype;
    e->op = c->redop;
    e->peer_valid = !k->collective || k->rooted;
    e->status = st;
    e->peer = !k->collective ? c->peer : k->rooted ? c->comm->devices[c->root] : 0;
    ccq_trace_commit(&rt->trace, e);
}

/* Record an event about a communicator, an operation of it, or a batch. */
static void ev_misc(ccq_runtime *rt, uint64_t t, uint32_t type, uint64_t id, uint32_t comm,
                    uint64_t seq, uint64_t count, uint64_t extra, ccq_status st)
{
    ccq_event e;
    memset(&e, 0, sizeof e);
    e.time_ns = t;
    e.type = type;
    e.id = id;
    e.comm = comm;
    e.seq = seq;
    e.count = count;
    e.bytes = extra;
    e.status = st;
    e.device = e.stream = UINT32_MAX;
    ccq_trace_rec(&rt->trace, &e);
}

/* ------------------------------------------------------------------------------------ */
/* Failing commands                                                                      */
/* ------------------------------------------------------------------------------------ */

/* A command's error detail: what it is (its own device and stream), then why it failed. */
static void set_detail(ccq_cmd *c, const char *reason)
{
    char what[CCQ_DETAIL_LEN];
    size_t w = ccq_describe_cmd(what, sizeof what, c), n = strlen(reason);
    char *d = malloc(w + 2 + n + 1); /* whole: a desync report may be long */
    if (d == NULL)
        xgrow_fail();
    memcpy(d, what, w);
    memcpy(d + w, ": ", 2);
    memcpy(d + w + 2, reason, n + 1);
    free(c->detail);
    c->detail = d;
}

static void fail_cmd(ccq_cmd *c, ccq_status st, const char *reason, bool cancel)
{
    if (c->state != CCQ_CMD_QUEUED)
        return;
    c->state = CCQ_CMD_FAILED;
    c->status = st;
    c->cancel = cancel;
    set_detail(c, reason);
    c->inst = NULL;
}

/* Fail every present part of an instance; parts that arrive later get the same. */
static void fail_inst(ccq_sched *S, ccq_inst *i, ccq_status st, const char *reason, bool cancel)
{
    if (i->state == CCQ_INST_FAILED || i->state == CCQ_INST_ISSUED)
        return;
    if (i->state == CCQ_INST_CHECKING) { /* leave the check: the instance may be freed soon */
        ccq_sig_cancel(i);
        for (ccq_inst **pp = &S->checking; *pp != NULL; pp = &(*pp)->check_next)
            if (*pp == i) {
                *pp = i->check_next;
                break;
            }
    }
    /* The parts end on their own from now on (their slots get reused), so the instance
     * forgets them. */
    for (uint32_t p = 0; p < i->chan->nparts; p++) {
        if (i->cmds[p] != NULL)
            fail_cmd(i->cmds[p], st, reason, cancel);
        i->cmds[p] = NULL;
    }
    i->state = CCQ_INST_FAILED;
    i->fail_status = st;
    i->fail_detail = xstrdup(reason);
    if (i->seq == i->chan->head)
        chan_advance(S, i->chan);
}

/* ------------------------------------------------------------------------------------ */
/* Matching                                                                              */
/* ------------------------------------------------------------------------------------ */

/* The fields the parts of a collective must agree on: kind, count, dtype, and the op of
 * reductions and the root of rooted ones (those only when the kinds agree). */
static bool field_differs(const ccq_cmd *a, const ccq_cmd *b, int f)
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
                if (!field_differs(c0, c, f))
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
        fail_inst(S, i, CCQ_ERR_MISMATCH, detail, false);
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
            fail_inst(S, i, st, why, false);
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
        ev_misc(rt, ccq_now_ns(), CCQ_EV_MATCHED, c0->trace_id, ch->comm->id, i->seq, c0->count,
                c0->count * ccq_dtype_size((ccq_dtype)c0->dtype), CCQ_OK);
    if (i->seq == ch->head)
        chan_list(rt->sched, ch);
}

/* Advance the cross-process signature checks; true if one ended. */
static bool checks_progress(ccq_runtime *rt)
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
        fail_inst(S, i, st, why, false);
        S->error_seen = true;
    }
    return any;
}

/* A communicator's formation ended: publish it (ccq_comm_init waiters, submitters) and
 * release or fail what waits on it. */
static void comm_settle(ccq_runtime *rt, ccq_comm *c, ccq_status st)
{
    ccq_sched *S = rt->sched;
    atomic_store_explicit(&c->state, st == CCQ_OK ? CCQ_COMM_READY : CCQ_COMM_FAILED,
                          memory_order_release);
    ccq_signal_notify(&c->ev);
    for (int k = 0; k < CCQ_CHAN_COUNT; k++) {
        ccq_chan *ch = &c->chan[k];
        if (st == CCQ_OK) {
            /* Operations matched while it formed can go now. */
            ccq_inst *i = win_get(ch, ch->head);
            if (i != NULL && i->state == CCQ_INST_READY)
                chan_list(S, ch);
            continue;
        }
        char detail[CCQ_DETAIL_LEN];
        ccq_format(detail, sizeof detail, "communicator could not be created: %s", c->init_detail);
        for (uint64_t q = ch->head, end = ch->head + ch->cap; ch->win != NULL && q < end; q++) {
            ccq_inst *i = win_get(ch, q);
            if (i != NULL && i->state != CCQ_INST_ISSUED && i->state != CCQ_INST_FAILED)
                fail_inst(S, i, c->init_status, detail, c->init_status == CCQ_ERR_SHUTDOWN);
        }
        ch->late_status = c->init_status;
        chan_advance(S, ch);
    }
    if (st != CCQ_OK)
        S->error_seen = true;
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
    comm_settle(rt, c, st);
}

/* Advance every communicator that is forming; true if one finished. */
static bool comms_progress(ccq_runtime *rt, uint64_t now)
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
        comm_settle(rt, c, st);
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
static void arrive(ccq_runtime *rt, ccq_cmd *c)
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
        ev_cmd(rt, CCQ_EV_SUBMITTED, c, c->submit_ns, CCQ_OK);
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
            fail_cmd(c, CCQ_ERR_BACKEND, detail, false);
        }
    }
    if (comm->form_step == CCQ_FORM_IDLE)
        comm_form(rt, comm, c->submit_ns);
    if (atomic_load_explicit(&comm->aborted, memory_order_acquire)) {
        ccq_format(detail, sizeof detail, "communicator aborted: %s", comm->init_detail);
        fail_cmd(c, CCQ_ERR_ABORTED, detail, false);
        return;
    }
    if (atomic_load_explicit(&comm->state, memory_order_acquire) == CCQ_COMM_FAILED) {
        ccq_format(detail, sizeof detail, "communicator could not be created: %s",
                   comm->init_detail);
        fail_cmd(c, comm->init_status, detail, comm->init_status == CCQ_ERR_SHUTDOWN);
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
        fail_cmd(c, ch->late_status, detail, ch->late_status == CCQ_ERR_SHUTDOWN);
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
            fail_inst(S, i, CCQ_ERR_BACKEND, "every part was dropped by fault injection", false);
        return;
    }
    if (c->part >= ch->nparts || i->cmds[c->part] != NULL) {
        /* Cannot happen: sequence numbers come from one counter per (channel, part). */
        fail_cmd(c, CCQ_ERR_BACKEND, "internal error: duplicate part", false);
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
        fail_inst(S, i, c->pre_status, detail, false);
        return;
    }
    if (i->state == CCQ_INST_FAILED) {
        fail_cmd(c, i->fail_status, i->fail_detail, i->fail_status == CCQ_ERR_SHUTDOWN);
        i->cmds[c->part] = NULL;
        return;
    }
    if (i->present == ch->nparts && i->dropped == 0)
        inst_complete(rt, S, i);
}

static bool drain(ccq_runtime *rt)
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
            /* Read the link first: arrive() may fail the command, never free it, but keep
             * the queue link and the FIFO link independent. */
            ccq_mpsc_node *next = n->next;
            s->received++;
            arrive(rt, ccq_container_of(n, ccq_cmd, qnode));
            n = next;
            any = true;
        }
    }
    return any;
}

/* ------------------------------------------------------------------------------------ */
/* Ending commands                                                                       */
/* ------------------------------------------------------------------------------------ */

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
        S->error_seen = true;
        ccq_stream_record_error(s, pos, c->status, c->detail);
    }
    /* Metrics are kept whether or not the recorder is on (one histogram bucket per end). */
    if (c->issue_ns != 0)
        ccq_hist_add(&rt->trace.run_ns, now - c->issue_ns);
    if (ccq_trace_on(&rt->trace))
        ev_cmd(rt, c->status == CCQ_OK ? CCQ_EV_COMPLETED : CCQ_EV_FAILED, c, now, c->status);
    free(c->detail);
    c->detail = NULL;
    free(c->pre_detail);
    c->pre_detail = NULL;
    /* Hands the slot back to producers; nothing below may touch `c`. */
    atomic_store_explicit(&c->busy, 0, memory_order_release);
}

static void publish_ended(ccq_runtime *rt, ccq_stream *s, uint64_t n)
{
    ccq_sched *S = rt->sched;
    if (n == 0)
        return;
    /* Counters first, so a fence that sees `ended` also sees them (exact once idle). */
    atomic_store_explicit(&rt->stats.completed, S->completed, memory_order_release);
    atomic_store_explicit(&rt->stats.failed, S->failed, memory_order_release);
    atomic_store_explicit(&rt->stats.cancelled, S->cancelled, memory_order_release);
    ccq_stream_publish_ended(s, n);
    /* GPU-side waits: commands that never reached the device advance the counter here. */
    if (rt->be_ops->stream_ended != NULL)
        rt->be_ops->stream_ended(rt->be, s->index, s->ending);
}

/* End failed commands at the heads of streams with nothing in flight, and drop streams
 * whose FIFO is empty from the active list. */
static bool end_failed_heads(ccq_runtime *rt)
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
        publish_ended(rt, s, n);
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

static void abort_comm(ccq_runtime *rt, ccq_comm *comm, const char *why);

static void batch_release(ccq_sched *S, ccq_batch *b)
{
    b->next = S->batch_free;
    S->batch_free = b;
}

/* A batch came back from the backend: set each part's status, end the batch's commands
 * (every command before each stream's cursor) in stream order. */
static void batch_done(ccq_runtime *rt, ccq_batch *b)
{
    ccq_sched *S = rt->sched;
    uint64_t now = ccq_now_ns();

    /* Communicators the backend aborted on its own (an asynchronous error): fail what is
     * queued on them and refuse new work, as the watchdog's aborts do. */
    for (uint32_t k = 0; k < b->be.nops; k++) {
        ccq_inst *i = b->insts[k];
        if (i->op.comm_aborted &&
            !atomic_load_explicit(&i->chan->comm->aborted, memory_order_relaxed)) {
            char why[CCQ_DETAIL_LEN];
            ccq_format(why, sizeof why,
                       "the backend aborted it after an error in batch %" PRIu64 ": %s", b->be.id,
                       b->be.detail.msg[0] ? b->be.detail.msg : "?");
            abort_comm(rt, i->chan->comm, why);
        }
    }
    for (uint32_t k = 0; k < b->be.nops; k++) {
        ccq_inst *i = b->insts[k];
        ccq_comm *comm = i->chan->comm;
        ccq_status st = i->op.status;
        if (st == CCQ_OK && b->be.status != CCQ_OK)
            st = b->be.status;
        /* The watchdog aborted the batch: every op in it is aborted, also one the backend
         * finished before it saw its communicator's abort (abort_batch aborts them one by
         * one while the backend runs), so the outcome does not depend on that race. */
        if (st == CCQ_OK && b->aborting)
            st = CCQ_ERR_ABORTED;
        for (uint32_t p = 0; p < i->chan->nparts; p++) {
            ccq_cmd *c = i->cmds[p];
            c->status = st;
            if (st == CCQ_ERR_ABORTED &&
                atomic_load_explicit(&comm->aborted, memory_order_relaxed)) {
                /* Say why it was aborted (the watchdog's or the backend's reason). */
                char reason[CCQ_DETAIL_LEN];
                ccq_format(reason, sizeof reason, "communicator aborted: %s", comm->init_detail);
                set_detail(c, reason);
            } else if (st != CCQ_OK) {
                char reason[CCQ_DETAIL_LEN];
                ccq_format(reason, sizeof reason, "%s%s%s", ccq_status_string(st),
                           b->be.detail.msg[0] ? ": " : "", b->be.detail.msg);
                set_detail(c, reason);
            }
            if (i->chan->id == CCQ_CHAN_COLL && c->seq + 1 > i->chan->comm->coll_done[c->rank])
                i->chan->comm->coll_done[c->rank] = c->seq + 1;
        }
        inst_release(S, i);
    }
    for (ccq_stream *s = b->streams; s != NULL;) {
        ccq_stream *next = s->batch_next;
        uint64_t n = 0;
        while (s->fifo_head != s->cursor) {
            end_head(rt, s, now);
            n++;
        }
        s->inflight = false;
        atomic_store_explicit(&s->issued_ns, 0, memory_order_relaxed);
        publish_ended(rt, s, n);
        s = next;
    }
    if (ccq_trace_on(&rt->trace))
        ev_misc(rt, ccq_now_ns(), CCQ_EV_BATCH_DONE, b->be.id, UINT32_MAX, 0, b->be.nops, 0,
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
    batch_release(S, b);
}

static bool reap(ccq_runtime *rt)
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
        batch_done(rt, ccq_container_of(list, ccq_batch, be));
        list = next;
        any = true;
    }
    return any;
}

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
    for (ccq_chan *ch = S->undo_chans; ch != NULL; ch = ch->undo_next)
        ch->build_seq = ch->undo_seq;
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
        fail_inst(S, S->tent[k], CCQ_ERR_UNSUPPORTED, detail, false);
    S->error_seen = true;
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
        for (uint64_t q = ch->build_seq; q < x->seq; q++) {
            ccq_inst *y = win_get(ch, q);
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
            xgrow_fail();
    }
    b->be.nops = 0;
    b->be.status = CCQ_OK;
    b->be.detail.msg[0] = '\0';
    b->be.next_done = NULL;
    b->be.be_priv = NULL;
    b->streams = NULL;
    b->next = NULL;
    b->aborting = false;
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
        i->op.stage_src = i->stage && rt->be_ops->stages_sends;
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
                ev_cmd(rt, CCQ_EV_ISSUED, q, b->issue_ns, CCQ_OK);
        }
        /* Every command up to build_next ends when the batch comes back: the stream's ended
         * count then (the backend's GPU-side wait counter after the batch). */
        s->batch_done = s->ending;
        for (ccq_cmd *q = s->fifo_head; q != s->build_next; q = q->fifo_next)
            s->batch_done++;
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
        chan_advance(S, i->chan);
    }
    b->next = S->inflight;
    S->inflight = b;
    S->ninflight++;
    S->wd_next = min_u64(S->wd_next, ccq_add_sat(b->issue_ns, rt->timeout_ns));
    stats_batch(rt, b->be.nops);

    st = rt->be_ops->issue(rt->be, &b->be, &err);
    if (traced) { /* bytes = how long issuing took (for the host backend: inline work too) */
        uint64_t t1 = ccq_now_ns();
        ev_misc(rt, t1, CCQ_EV_BATCH, b->be.id, UINT32_MAX, 0, b->be.nops, t1 - b->issue_ns, st);
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

static bool build_and_issue(ccq_runtime *rt)
{
    ccq_sched *S = rt->sched;
    bool any = false;

    while (S->chans != NULL) {
        ccq_batch *b = batch_get(S);
        bool full = false;

        S->pass++;
        S->pass_streams = NULL;
        for (ccq_chan **pp = &S->chans; *pp != NULL && !full;) {
            ccq_chan *ch = *pp;
            ccq_inst *i = win_get(ch, ch->head);
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
                i = win_get(ch, q);
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
            batch_release(S, b);
            break;
        }
        issue(rt, b);
        any = true;
        if (!full)
            break;
    }
    any |= S->refuse_retry;
    S->refuse_retry = false;
    return any;
}

/* ------------------------------------------------------------------------------------ */
/* Watchdog                                                                              */
/* ------------------------------------------------------------------------------------ */

/* The longest watchdog report (a desync report of a 1024-rank communicator fits easily;
 * beyond it the report ends with CCQ_TRUNCATED). Scheduler stack. */
#define CCQ_REPORT_LEN 16384

/* A sorted list of numbers as ranges: "3-17,19". */
static size_t fmt_ranges(char *buf, size_t len, const uint32_t *v, uint32_t n)
{
    size_t w = 0;
    for (uint32_t k = 0; k < n;) {
        uint32_t j = k;
        while (j + 1 < n && v[j + 1] == v[j] + 1)
            j++;
        w += ccq_format(buf + w, len - w, j > k ? "%s%u-%u" : "%s%u", k ? "," : "", v[k], v[j]);
        k = j + 1;
    }
    return w;
}

/* A collective's signature: "all_reduce #5 (float32 x 8, sum)". */
static size_t fmt_sig(char *buf, size_t len, const ccq_cmd *c, const ccq_comm *comm)
{
    size_t w = ccq_format(buf, len, "%s #%" PRIu64 " (%s x %zu", ccq_kind_name(c->kind), c->seq,
                          ccq_dtype_name((ccq_dtype)c->dtype), c->count);
    if (ccq_kinds[c->kind].reduces)
        w += ccq_format(buf + w, len - w, ", %s", ccq_reduce_op_name((ccq_reduce_op)c->redop));
    if (ccq_kinds[c->kind].rooted)
        w += ccq_format(buf + w, len - w, ", root device %u", comm->devices[c->root]);
    return w + ccq_format(buf + w, len - w, ")");
}

/* The desync report of a collective that misses parts, most useful facts first: who is
 * missing, what they owe (or that the parts that came disagree), then how far every rank
 * got, ranks with equal progress grouped ("0-2,18:6/5 3-17,19:5/5"). */
static size_t describe_missing(ccq_inst *i, const ccq_cmd *c, char *buf, size_t len)
{
    ccq_chan *ch = i->chan;
    ccq_comm *comm = ch->comm;
    uint32_t ranks[CCQ_MAX_DEVICES], devs[CCQ_MAX_DEVICES], missing = 0;
    const ccq_cmd *first = NULL, *odd = NULL;
    size_t w = 0;

    for (uint32_t r = 0; r < ch->nparts; r++) {
        const ccq_cmd *p = i->cmds[r];
        if (p == NULL) { /* part r is rank first_local + r (matching is per process) */
            ranks[missing] = comm->first_local + r;
            devs[missing++] = comm->devices[comm->first_local + r];
            continue;
        }
        if (first == NULL)
            first = p;
        for (int f = 0; f < 5 && odd == NULL; f++)
            if (field_differs(first, p, f))
                odd = p;
    }
    if (first == NULL)
        first = c;
    w += ccq_format(buf + w, len - w, "; missing rank%s ", missing > 1 ? "s" : "");
    w += fmt_ranges(buf + w, len - w, ranks, missing);
    w += ccq_format(buf + w, len - w, " (device%s ", missing > 1 ? "s" : "");
    w += fmt_ranges(buf + w, len - w, devs, missing);
    if (odd == NULL) {
        /* The signature they owe: what the parts that did come agree on. */
        w += ccq_format(buf + w, len - w, "), which %s not submitted ",
                        missing > 1 ? "have" : "has");
        w += fmt_sig(buf + w, len - w, first, comm);
    } else {
        w += ccq_format(buf + w, len - w,
                        "); the parts that did arrive disagree (rank %u: ", first->rank);
        w += fmt_sig(buf + w, len - w, first, comm);
        w += ccq_format(buf + w, len - w, ", rank %u: ", odd->rank);
        w += fmt_sig(buf + w, len - w, odd, comm);
        w += ccq_format(buf + w, len - w,
                        "), so what the missing ranks owe is unknown (the parts fail as a "
                        "mismatch once all arrive)");
    }
    /* Desync report: how far each rank of the communicator got. */
    w += ccq_format(buf + w, len - w, "; comm ");
    w += ccq_describe_comm(buf + w, len - w, comm);
    w += ccq_format(buf + w, len - w, " collectives submitted/completed per rank:");
    bool done[CCQ_MAX_DEVICES] = {false};
    for (uint32_t r = 0; r < ch->nparts && w < len - 1; r++) {
        uint32_t g = comm->first_local + r; /* this process's ranks only: the others' are theirs */
        if (done[r])
            continue;
        uint64_t sub = atomic_load_explicit(&comm->coll_seq[g].v, memory_order_relaxed);
        uint64_t end = comm->coll_done[g];
        uint32_t n = 0;
        for (uint32_t q = r; q < ch->nparts; q++)
            if (!done[q] &&
                atomic_load_explicit(&comm->coll_seq[comm->first_local + q].v,
                                     memory_order_relaxed) == sub &&
                comm->coll_done[comm->first_local + q] == end) {
                done[q] = true;
                ranks[n++] = comm->first_local + q;
            }
        w += ccq_format(buf + w, len - w, " ");
        w += fmt_ranges(buf + w, len - w, ranks, n);
        w += ccq_format(buf + w, len - w, ":%" PRIu64 "/%" PRIu64, sub, end);
    }
    return w;
}

/* Why an instance waits: its missing parts, or what its parts wait behind. */
static void describe_wait(ccq_inst *i, ccq_cmd *c, uint64_t now, char *buf, size_t len)
{
    ccq_chan *ch = i->chan;
    ccq_comm *comm = ch->comm;
    size_t w = ccq_format(buf, len, "not issued within timeout_ms (%.0f ms in queue)",
                          (double)(now - c->submit_ns) / 1e6);
    if (i->state == CCQ_INST_CHECKING) {
        char who[128];
        ccq_sig_missing(i, who, sizeof who);
        ccq_format(buf + w, len - w,
                   "; matched here, waiting for the cross-process signature check of comm's %s",
                   who);
        return;
    }
    if (atomic_load_explicit(&comm->state, memory_order_relaxed) == CCQ_COMM_PENDING) {
        ccq_format(buf + w, len - w,
                   "; its communicator is still forming (member processes of world ranks %u..%u "
                   "must all call ccq_comm_init, or send/recv with this process)",
                   comm->procs[0], comm->procs[comm->nprocs - 1]);
        return;
    }
    if (i->state == CCQ_INST_WAITING) {
        if (ch->id == CCQ_CHAN_COLL) {
            w += describe_missing(i, c, buf + w, len - w);
            if (w >= len - 1)
                ccq_mark_truncated(buf, len);
        } else {
            ccq_cmd *have = i->cmds[0] ? i->cmds[0] : i->cmds[1];
            if (have->kind == CCQ_KIND_SEND)
                w += ccq_format(buf + w, len - w,
                                "; missing the matching recv on device %u from "
                                "device %u (#%" PRIu64 ")",
                                have->peer, have->device, i->seq);
            else
                w += ccq_format(buf + w, len - w,
                                "; missing the matching send on device %u to "
                                "device %u (#%" PRIu64 ")",
                                have->peer, have->device, i->seq);
        }
        return;
    }
    /* Matched on every rank: find the first part that waits behind something. */
    if (ch->id == CCQ_CHAN_COLL) {
        ccq_inst *y = win_get(ch, ch->head);
        if (y != NULL && y != i && y->state == CCQ_INST_WAITING) {
            w += ccq_format(buf + w, len - w,
                            "; matched, but collective #%" PRIu64 " before it on this "
                            "communicator is still missing parts",
                            y->seq);
            return;
        }
    }
    for (uint32_t p = 0; p < ch->nparts; p++) {
        ccq_cmd *part = i->cmds[p];
        ccq_stream *s = part->stream;
        if (s->inflight) {
            w += ccq_format(buf + w, len - w,
                            "; matched, but device %u stream %u has a batch in flight", s->device,
                            s->id);
            return;
        }
        for (ccq_cmd *q = s->cursor; q != NULL && q != part; q = q->fifo_next) {
            if (q->state == CCQ_CMD_QUEUED && q->inst && q->inst->state == CCQ_INST_WAITING) {
                w += ccq_format(buf + w, len - w, "; matched, but waits behind ");
                ccq_describe_cmd(buf + w, len - w, q);
                return;
            }
        }
    }
    ccq_format(buf + w, len - w,
               "; matched, but its buffers overlap an earlier command of "
               "the same stream that cannot complete first");
}

static void abort_comm(ccq_runtime *rt, ccq_comm *comm, const char *why)
{
    ccq_sched *S = rt->sched;
    char detail[CCQ_DETAIL_LEN];

    if (atomic_load_explicit(&comm->aborted, memory_order_relaxed))
        return;
    snprintf(comm->init_detail, sizeof comm->init_detail, "%s", why);
    atomic_store_explicit(&comm->aborted, 1, memory_order_release);
    if (ccq_trace_on(&rt->trace))
        ev_misc(rt, ccq_now_ns(), CCQ_EV_ABORT, 0, comm->id, 0, 0, 0, CCQ_ERR_ABORTED);
    {
        char note[CCQ_DETAIL_LEN];
        size_t w = ccq_format(note, sizeof note, "communicator ");
        w += ccq_describe_comm(note + w, sizeof note - w, comm);
        ccq_format(note + w, sizeof note - w, " aborted: %s", why);
        ccq_trace_note(&rt->trace, CCQ_EV_ABORT, note);
    }
    S->error_seen = true;
    if (comm->be != NULL)
        rt->be_ops->abort(rt->be, comm->be);
    /* Everything still queued on it fails fast. */
    for (int k = 0; k < CCQ_CHAN_COUNT; k++) {
        ccq_chan *ch = &comm->chan[k];
        /* Fixed bounds: failing the head instance advances the head under us. */
        for (uint64_t q = ch->head, end = ch->head + ch->cap; ch->win != NULL && q < end; q++) {
            ccq_inst *i = win_get(ch, q);
            if (i == NULL || i->state == CCQ_INST_ISSUED || i->state == CCQ_INST_FAILED)
                continue;
            ccq_format(detail, sizeof detail, "communicator aborted: %s", why);
            fail_inst(S, i, CCQ_ERR_ABORTED, detail, false);
        }
        ch->late_status = CCQ_ERR_ABORTED;
        chan_advance(S, ch);
    }
}

static void abort_batch(ccq_runtime *rt, ccq_batch *b, const char *why)
{
    b->aborting = true;
    for (uint32_t k = 0; k < b->be.nops; k++)
        abort_comm(rt, b->insts[k]->chan->comm, why);
}

/* Fail what waited too long; abort what was issued and did not complete. Runs only when
 * the earliest known deadline has passed; returns true if it failed or aborted anything. */
static bool watchdog(ccq_runtime *rt, uint64_t now)
{
    ccq_sched *S = rt->sched;
    char detail[CCQ_REPORT_LEN];
    uint64_t next = UINT64_MAX;
    bool any = false;

    if (now < S->wd_next)
        return false;
    for (uint32_t k = 0; k < S->nactive; k++) {
        ccq_stream *s = S->active[k];
        for (ccq_cmd *q = s->cursor; q != NULL; q = q->fifo_next) {
            uint64_t dl;
            if (q->state != CCQ_CMD_QUEUED)
                continue;
            dl = ccq_add_sat(q->submit_ns, rt->timeout_ns);
            if (dl > now) {
                next = min_u64(next, dl);
                break;
            }
            describe_wait(q->inst, q, now, detail, sizeof detail);
            if (ccq_trace_on(&rt->trace))
                ev_misc(rt, ccq_now_ns(), CCQ_EV_WATCHDOG, q->trace_id, q->comm->id, q->seq,
                        q->count, 0, CCQ_ERR_TIMEOUT);
            ccq_trace_note(&rt->trace, CCQ_EV_WATCHDOG, detail);
            fail_inst(S, q->inst, CCQ_ERR_TIMEOUT, detail, false);
            S->error_seen = true;
            any = true;
        }
    }
    for (ccq_batch *b = S->inflight; b != NULL; b = b->next) {
        uint64_t dl = ccq_add_sat(b->issue_ns, rt->timeout_ns);
        if (b->aborting)
            continue;
        if (dl > now) {
            next = min_u64(next, dl);
            continue;
        }
        snprintf(detail, sizeof detail,
                 "batch %" PRIu64 " (%u ops) issued %.0f ms ago did not complete within "
                 "timeout_ms; the watchdog aborted its communicators",
                 b->be.id, b->be.nops, (double)(now - b->issue_ns) / 1e6);
        abort_batch(rt, b, detail);
        any = true;
    }
    if (S->closing && !S->shutdown_aborted)
        next = min_u64(next, ccq_add_sat(S->close_ns, rt->timeout_ns));
    S->wd_next = next;
    return any;
}

/* ------------------------------------------------------------------------------------ */
/* Shutdown                                                                              */
/* ------------------------------------------------------------------------------------ */

/* True once every ticket handed out before the streams closed has been drained. */
static bool all_received(ccq_runtime *rt)
{
    ccq_sched *S = rt->sched;
    for (uint32_t k = 0; k < S->nlive; k++) {
        ccq_stream *s = S->live[k];
        uint64_t t = atomic_load_explicit(&s->tickets, memory_order_acquire) & ~CCQ_TICKET_CLOSED;
        if (s->received != t)
            return false;
    }
    /* A stream announced but not drained from new_streams yet would show up here. */
    return ccq_mpsc_empty(&rt->new_streams);
}

static void cancel_all(ccq_runtime *rt, bool incomplete_only, const char *why)
{
    ccq_sched *S = rt->sched;
    char detail[CCQ_DETAIL_LEN];
    uint32_t n;

    pthread_mutex_lock(&rt->comm_lock);
    n = atomic_load_explicit(&rt->ncomms, memory_order_acquire);
    for (uint32_t k = 0; k < n; k++) {
        ccq_comm *comm = rt->comms[k];
        for (int c = 0; c < CCQ_CHAN_COUNT; c++) {
            ccq_chan *ch = &comm->chan[c];
            for (uint64_t q = ch->head, end = ch->head + ch->cap; ch->win != NULL && q < end; q++) {
                ccq_inst *i = win_get(ch, q);
                if (i == NULL || (i->state != CCQ_INST_WAITING &&
                                  (incomplete_only ||
                                   (i->state != CCQ_INST_READY && i->state != CCQ_INST_CHECKING))))
                    continue;
                ccq_format(detail, sizeof detail, "cancelled by shutdown: %s", why);
                fail_inst(S, i, CCQ_ERR_SHUTDOWN, detail, true);
            }
            ch->late_status = CCQ_ERR_SHUTDOWN;
            chan_advance(S, ch);
        }
    }
    pthread_mutex_unlock(&rt->comm_lock);
}

/* One step of shutdown; true when the scheduler may exit. */
static bool shutdown_step(ccq_runtime *rt, uint64_t now, bool *progress)
{
    ccq_sched *S = rt->sched;

    if (!S->closing) {
        S->closing = true;
        S->close_ns = now;
        S->wd_next = min_u64(S->wd_next, ccq_add_sat(now, rt->timeout_ns));
    }
    if (!S->cancelled_incomplete && all_received(rt)) {
        /* No more parts can come: whatever is incomplete never can run. */
        cancel_all(rt, true, "the other parts were never submitted");
        S->cancelled_incomplete = true;
        *progress = true;
    }
    if (!S->shutdown_aborted && now >= ccq_add_sat(S->close_ns, rt->timeout_ns)) {
        char detail[CCQ_DETAIL_LEN];
        snprintf(detail, sizeof detail, "shutdown waited timeout_ms for issued work");
        for (ccq_batch *b = S->inflight; b != NULL; b = b->next)
            if (!b->aborting)
                abort_batch(rt, b, detail);
        cancel_all(rt, false, "shutdown reached timeout_ms before it could run");
        S->shutdown_aborted = true;
        *progress = true;
    }
    return S->cancelled_incomplete && S->nactive == 0 && S->ninflight == 0 && S->done == NULL;
}

/* ------------------------------------------------------------------------------------ */
/* The loop                                                                              */
/* ------------------------------------------------------------------------------------ */

/* Anything to do? Checked after announcing sleep, so a concurrent push is never missed. */
static bool work_visible(ccq_runtime *rt)
{
    ccq_sched *S = rt->sched;

    if (!ccq_mpsc_empty(&rt->new_streams) || !ccq_mpsc_empty(&rt->comm_reqs) ||
        ccq_trace_requested(&rt->trace))
        return true;
    if (!S->closing && atomic_load_explicit(&rt->closing, memory_order_acquire))
        return true;
    for (uint32_t k = 0; k < S->nlive; k++)
        if (!ccq_mpsc_empty(&S->live[k]->q))
            return true;
    if (S->ninflight > 0) {
        ccq_be_batch *more = rt->be_ops->poll(rt->be);
        if (more != NULL) {
            while (more != NULL) {
                ccq_be_batch *next = more->next_done;
                more->next_done = S->done;
                S->done = more;
                more = next;
            }
            return true;
        }
    }
    return false;
}

void *ccq_sched_main(void *arg)
{
    ccq_runtime *rt = arg;
    ccq_sched *S = rt->sched;
    uint64_t spin_ns = rt->spin_ns, busy_ns = ccq_now_ns();
    unsigned spin_step = 0;

    ccq_tls_inside |= CCQ_INSIDE_SCHED;

    for (;;) {
        bool progress = false;
        uint64_t now, deadline;

        progress |= ccq_trace_serve(&rt->trace);
        progress |= drain(rt);
        if (S->forming != NULL)
            progress |= comms_progress(rt, ccq_now_ns());
        if (S->checking != NULL)
            progress |= checks_progress(rt);
        progress |= reap(rt);
        progress |= end_failed_heads(rt);
        progress |= build_and_issue(rt);
        now = ccq_now_ns();
        progress |= watchdog(rt, now);
        ccq_trace_tick(&rt->trace, now, S->completed + S->failed + S->cancelled);
        if (S->error_seen) { /* trace_file: keep the story of what went wrong */
            S->error_seen = false;
            ccq_trace_autodump(rt, false);
        }
        if (S->closing || atomic_load_explicit(&rt->closing, memory_order_acquire)) {
            if (shutdown_step(rt, now, &progress))
                break;
        }
        if (progress) {
            busy_ns = now;
            continue;
        }
        /* Poll a little before sleeping: work that arrives within spin_us of the last
         * is picked up without a futex round trip (the submitter's push then costs no
         * system call either, since `sleeping` stays 0). Bounded, so an idle runtime does
         * not hold a core. */
        if (now - busy_ns < spin_ns) {
            for (int k = 0; k < 8 && !work_visible(rt); k++)
                ccq_spin_step(&spin_step);
            continue;
        }

        deadline = min_u64(
            S->wd_next, ccq_trace_next_tick(&rt->trace, S->completed + S->failed + S->cancelled));
        if (S->ninflight > 0 || rt->be_ops->poll_interval != NULL) {
            uint64_t iv = rt->be_ops->poll_interval != NULL ? rt->be_ops->poll_interval(rt->be)
                                                            : rt->be_ops->poll_interval_ns;
            if (iv > 0)
                deadline = min_u64(deadline, ccq_add_sat(now, iv));
        }
        if (S->forming != NULL || S->checking != NULL) /* the bootstrap cannot wake us */
            deadline = min_u64(deadline, ccq_add_sat(now, CCQ_FORM_POLL_NS));
        uint32_t seq = ccq_wake_prepare(&rt->wake);
        if (work_visible(rt)) {
            ccq_wake_cancel(&rt->wake);
            continue;
        }
        now = ccq_now_ns();
        if (deadline <= now) {
            ccq_wake_cancel(&rt->wake);
            continue;
        }
        ccq_wake_sleep(&rt->wake, seq, deadline == UINT64_MAX ? UINT64_MAX : deadline - now);
    }

    /* Communicators still waiting for creation will never get it. */
    for (ccq_mpsc_node *n = ccq_mpsc_pop_all_spsc(&rt->comm_reqs); n != NULL;) {
        ccq_mpsc_node *next = n->next;
        ccq_comm *c = ccq_container_of(n, ccq_comm, req_node);
        if (c->form_step == CCQ_FORM_IDLE) {
            ccq_comm_form_cancel(rt, c, "the runtime is shutting down");
            comm_settle(rt, c, CCQ_ERR_SHUTDOWN);
        }
        n = next;
    }
    while (S->forming != NULL) {
        ccq_comm *c = S->forming;
        S->forming = c->forming_next;
        ccq_comm_form_cancel(rt, c, "the runtime shut down before it formed");
        comm_settle(rt, c, CCQ_ERR_SHUTDOWN);
    }
    ccq_trace_fence_writes(); /* the ring is read by other threads from now on */
    atomic_store_explicit(&rt->sched_exited, 1, memory_order_seq_cst);
    /* A snapshot request that came too late is answered by its caller now (see trace.c). */
    ccq_signal_notify(&rt->trace.req_sig);
    /* ccq_comm_init waiters whose request came too late wait on their comm's event: wake
     * them all. A comm registered after this loop sees sched_exited (the registry lock
     * orders the store above before its registration) and does not wait. */
    pthread_mutex_lock(&rt->comm_lock);
    for (uint32_t k = 0; k < atomic_load_explicit(&rt->ncomms, memory_order_relaxed); k++)
        ccq_signal_notify(&rt->comms[k]->ev);
    pthread_mutex_unlock(&rt->comm_lock);
    ccq_signal_notify(&rt->exit_ev);
    return NULL;
}

/* Debug: print the scheduler's view (streams, their FIFOs, channel heads). Scheduler thread
 * or a stopped process only (gdb: call ccq_sched_dump(rt)). */
void ccq_sched_dump(ccq_runtime *rt);
void ccq_sched_dump(ccq_runtime *rt)
{
    ccq_sched *S = rt->sched;
    char buf[CCQ_DETAIL_LEN];
    static const char *const st[] = {"QUEUED", "INCLUDED", "ISSUED", "FAILED"};
    static const char *const ist[] = {"WAITING", "READY", "FAILED", "ISSUED"};

    fprintf(stderr, "sched: pass %llu, %u active streams, %u in flight\n",
            (unsigned long long)S->pass, S->nactive, S->ninflight);
    for (uint32_t k = 0; k < S->nactive; k++) {
        ccq_stream *s = S->active[k];
        fprintf(stderr, " stream %u/%u inflight=%d\n", s->device, s->id, s->inflight);
        for (ccq_cmd *q = s->fifo_head; q != NULL; q = q->fifo_next) {
            ccq_describe_cmd(buf, sizeof buf, q);
            fprintf(stderr, "  %s%s %s inst=%s\n", q == s->cursor ? ">" : " ", st[q->state], buf,
                    q->inst ? ist[q->inst->state] : "-");
        }
    }
    for (ccq_chan *ch = S->chans; ch != NULL; ch = ch->list_next) {
        ccq_describe_comm(buf, sizeof buf, ch->comm);
        ccq_inst *i = win_get(ch, ch->head);
        fprintf(stderr, " listed chan %s/%u head %llu: %s\n", buf, ch->id,
                (unsigned long long)ch->head, i ? ist[i->state] : "none");
    }
}
