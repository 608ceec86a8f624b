/* The UCX engine's messages: the active-message handler and where each arrival goes (its
 * operation, the communicator's early list when its operation has not started here yet,
 * the engine's orphans when its communicator has not formed here yet, or nowhere: dropped),
 * the header check that turns a disagreement into CCQ_ERR_MISMATCH before any payload is
 * touched, notices that tell every member, and the send and receive helpers the schedules
 * use.
 *
 * Memory: an early or orphan message holds UCX's buffer (eager payloads, at most UCX's
 * eager size) or only a descriptor (a rendezvous payload stays at the sender until it is
 * fetched). Orphans are bounded (UCX_ORPHANS_MAX messages, UCX_ORPHAN_BYTES bytes); beyond
 * that they are dropped and counted. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/host/ucx/ucx.h"
#include "common/clock.h"

#define UCX_ORPHANS_MAX  65536u
#define UCX_ORPHAN_BYTES (256u << 20)

/* ---- records ---------------------------------------------------------------------------- */

static ucx_msg *msg_new(ucx_engine *e)
{
    ucx_msg *m = e->free_msgs;
    if (m != NULL)
        e->free_msgs = m->next;
    else if ((m = malloc(sizeof *m)) == NULL)
        return NULL;
    memset(m, 0, sizeof *m);
    return m;
}

void ucx_msg_done(ucx_engine *e, ucx_msg *m)
{
    if (m == NULL)
        return;
    if (m->req != NULL) {
        /* A landing receive: UCX frees it once it completes (cancelled or not). */
        if (ucp_request_check_status(m->req) == UCS_INPROGRESS)
            ucp_request_cancel(e->worker, m->req);
        ucp_request_free(m->req);
    }
    if (m->ucx_data) {
        /* An eager payload, or an unfetched rendezvous, whose release answers its sender (the
         * sender's send completes) through the endpoint the announcement names. That endpoint
         * must still exist: for a failed peer UCX may have destroyed it (it asserted, fetching
         * or releasing), so such a rendezvous is left to the worker's end. So is one from the
         * single-copy endpoint once this process closed it, or when it never opened one
         * (CCQ_UCX_BULK_BYTES=0 here: the sender's endpoint then pairs with one UCX made):
         * without peer error handling UCX names that endpoint by its address, not by an id it
         * can look up safely. While the peer is alive and ucx_peer.bulk open, a dropped payload
         * is released at once: left unreleased, its sender's send never ended and held its
         * destroy, and its scheduler's polling, until this process said goodbye (test_host_ucx
         * with CCQ_TEST_LINGER_MS). Its sender, if it died unseen, gets an answer it never
         * reads. */
        const ucx_peer *p = e->peers != NULL && m->wsrc < e->world_size ? &e->peers[m->wsrc] : NULL;
        bool peer_ok = p == NULL || p->failed == UCS_OK;
        if (m->state != MSG_RNDV || (peer_ok && (!m->bulk || (p != NULL && p->bulk != NULL))))
            ucp_am_data_release(e->worker, m->data);
    } else if (m->state == MSG_EAGER || (m->state == MSG_READY && m->data != NULL)) {
        free(m->data); /* our own copy */
    }
    m->next = e->free_msgs;
    e->free_msgs = m;
}

/* Discard m. fresh: m is the message of the active-message callback running now, whose
 * data UCX releases itself when the callback returns UCS_OK (releasing it here would be too
 * early). */
static void drop(ucx_engine *e, ucx_msg *m, bool fresh)
{
    e->dropped++;
    if (fresh && m->ucx_data) { /* UCX's own buffer: neither ours to free nor to release */
        m->ucx_data = false;
        m->data = NULL;
    }
    ucx_msg_done(e, m);
}

/* ---- the header check ------------------------------------------------------------------ */

static size_t add_field(char *buf, size_t len, size_t w, bool *first, const char *name,
                        const char *theirs, const char *mine)
{
    (void)mine;
    if (w >= len)
        return w;
    w += (size_t)snprintf(buf + w, len - w, "%s%s %s", *first ? "" : " and ", name, theirs);
    *first = false;
    return w;
}

/* What a header is compared with: an operation here, running or ended (ucx_ended). */
typedef struct ucx_want {
    uint8_t kind, dtype, redop;
    uint32_t root, chan, nops;
    uint64_t count, shape; /* nops, shape: a fused group's (ucx/fused.c); 1, 0 alone */
} ucx_want;

static ucx_want want_of(const ucx_op *o)
{
    ucx_want w = {.kind = o->chan != 0 ? CCQ_KIND_SEND : o->kind,
                  .dtype = o->dtype,
                  .redop = o->redop,
                  .root = o->root,
                  .chan = o->chan,
                  .nops = o->nops,
                  .count = o->count,
                  .shape = o->shape};
    return w;
}

/* Whether h disagrees with w; if so theirs and mine (room len each) name every field that
 * differs, as "count 10 and dtype float32". */
static bool header_differs(const ucx_want *w, const ucx_hdr *h, char *theirs, char *mine,
                           size_t len)
{
    bool p2p = w->chan != 0;
    bool reduces = !p2p && ccq_kinds[w->kind].reduces;
    bool rooted = !p2p && ccq_kinds[w->kind].rooted;
    char t[64], m[64];
    bool f1 = true, f2 = true;
    size_t w1 = 0, w2 = 0;

    if (h->kind == w->kind && h->dtype == w->dtype && h->count == w->count &&
        (!reduces || h->redop == w->redop) && (!rooted || h->root == w->root) &&
        h->nops == w->nops && h->shape == w->shape)
        return false;
    theirs[0] = mine[0] = '\0';
    if (h->kind != w->kind) {
        w1 = add_field(theirs, len, w1, &f1, "kind", ucx_kind_name(h->kind), NULL);
        w2 = add_field(mine, len, w2, &f2, "kind", ucx_kind_name(w->kind), NULL);
    }
    if (h->count != w->count) {
        snprintf(t, sizeof t, "%" PRIu64, h->count);
        snprintf(m, sizeof m, "%" PRIu64, w->count);
        w1 = add_field(theirs, len, w1, &f1, "count", t, NULL);
        w2 = add_field(mine, len, w2, &f2, "count", m, NULL);
    }
    if (h->dtype != w->dtype) {
        w1 = add_field(theirs, len, w1, &f1, "dtype", ucx_dtype_name(h->dtype), NULL);
        w2 = add_field(mine, len, w2, &f2, "dtype", ucx_dtype_name(w->dtype), NULL);
    }
    if (reduces && h->redop != w->redop && h->kind == w->kind) {
        w1 = add_field(theirs, len, w1, &f1, "op", ucx_op_name(h->redop), NULL);
        w2 = add_field(mine, len, w2, &f2, "op", ucx_op_name(w->redop), NULL);
    }
    if (rooted && h->root != w->root && h->kind == w->kind) {
        snprintf(t, sizeof t, "%u", h->root);
        snprintf(m, sizeof m, "%u", w->root);
        w1 = add_field(theirs, len, w1, &f1, "root", t, NULL);
        w2 = add_field(mine, len, w2, &f2, "root", m, NULL);
    }
    if (h->nops != w->nops || h->shape != w->shape) {
        /* Fusion (ucx/fused.c): the members cut their window differently, so one of the
         * operations there differs (count, dtype, op) between them. */
        snprintf(t, sizeof t, "%u operation%s fused", h->nops, h->nops == 1 ? "" : "s");
        snprintf(m, sizeof m, "%u operation%s fused", w->nops, w->nops == 1 ? "" : "s");
        if (h->nops == w->nops) {
            snprintf(t, sizeof t, "%u operations of other counts fused", h->nops);
            snprintf(m, sizeof m, "%u operations fused", w->nops);
        }
        w1 = add_field(theirs, len, w1, &f1, "fusion", t, NULL);
        w2 = add_field(mine, len, w2, &f2, "fusion", m, NULL);
    }
    (void)w1;
    (void)w2;
    return true;
}

/* Kinds whose result at every member depends on every member's input (all_reduce,
 * all_gather, reduce_scatter, all_to_all): whatever schedule runs them, a member completes
 * one only once a message from every member reached it, directly or through members that
 * checked its header on the way. */
static bool hears_everyone(uint8_t kind)
{
    return kind == CCQ_KIND_ALL_REDUCE || kind == CCQ_KIND_ALL_GATHER ||
           kind == CCQ_KIND_REDUCE_SCATTER || kind == CCQ_KIND_ALL_TO_ALL;
}

/* Whether a disagreement on o (unfused, a collective) with a member that ran `their_kind`
 * (unfused too) fails o alone, the communicator going on (ucx_op.op_only). Where both kinds
 * hear everyone, no member can complete the operation before the disagreement reached it:
 * a member that received a disagreeing header fails it, and one that did not is starved of
 * that member's part until the finders' notices arrive. So every member fails it, and every
 * member's next operation is the same one (sequence numbers count operations, not what they
 * are), as on the MPI engine. Elsewhere a member whose part only sends (a broadcast's root, a
 * reduce's sender, a send) may have completed it first, and a fused group's members may
 * have cut their windows differently (their next operations differ): there the
 * communicator fails, so that every member hears of it, never silently (late_notice). */
static bool fails_alone(const ucx_op *o, uint8_t their_kind, uint32_t their_nops)
{
    return o->chan == 0 && o->fz == NULL && o->nops == 1 && their_nops == 1 &&
           hears_everyone(o->kind) && hears_everyone(their_kind);
}

/* Compare m's header with o; on a disagreement fail o with CCQ_ERR_MISMATCH naming both
 * processes and every field that differs, and return false. */
static bool header_agrees(ucx_op *o, const ucx_hdr *h)
{
    const ucx_comm *c = o->c;
    ucx_want w = want_of(o);
    char theirs[256], mine[256];

    if (!header_differs(&w, h, theirs, mine, sizeof theirs))
        return true;
    o->op_only = fails_alone(o, h->kind, h->nops);
    if (o->nops > 1 || h->nops > 1) {
        ucx_op_fail(o, CCQ_ERR_MISMATCH,
                    "processes disagree on %s sequence %" PRIu64
                    " of a communicator spanning processes (a fused operation of sequences %" PRIu64
                    "-%" PRIu64 " here: one of them differs between the processes): process %u "
                    "submitted %s where process %u (this one) submitted %s; nothing was reduced "
                    "or written",
                    ucx_kind_name(o->kind), o->seq, o->seq, o->seq + o->nops - 1, c->procs[h->src],
                    theirs, c->procs[c->me], mine);
        return false;
    }
    ucx_op_fail(o, CCQ_ERR_MISMATCH,
                "processes disagree on %s sequence %" PRIu64
                " of a communicator spanning processes: process %u submitted %s where process "
                "%u (this one) submitted %s; nothing was reduced or written",
                ucx_kind_name(o->kind), o->seq, c->procs[h->src], theirs, c->procs[c->me], mine);
    return false;
}

void ucx_comm_ended(ucx_comm *c, const ucx_op *o)
{
    ucx_want w = want_of(o);
    ucx_ended *r = &c->ended[o->chan][o->seq % UCX_ENDED];
    r->seq = o->seq + 1;
    r->count = w.count;
    r->shape = w.shape;
    r->nops = w.nops;
    r->root = w.root;
    r->kind = w.kind;
    r->dtype = w.dtype;
    r->redop = w.redop;
}

/* c failed here over the operation m is a message of, which other members may have failed
 * alone and gone on from: the next operation here tells them (ucx_comm_tell). */
static void untold(ucx_comm *c, const ucx_msg *m)
{
    c->failed_untold = true;
    c->untold_chan = m->hdr.chan;
    c->untold_seq = m->hdr.seq;
}

/* A data message of an operation that already ended here: if that operation succeeded here
 * (and is recent enough to be remembered) and m's header disagrees with it, the members
 * did not run the same operation (each only sent, so nobody compared a header in time).
 * The operation cannot be failed any more: the communicator is, so its next operation here
 * fails with this detail (and tells the members), never silently. */
static void late_check(ucx_comm *c, const ucx_msg *m)
{
    const ucx_ended *r = &c->ended[m->hdr.chan][m->hdr.seq % UCX_ENDED];
    ucx_want w;
    char theirs[160], mine[160], detail[CCQ_DETAIL_LEN];

    if (m->hdr.type != UCX_MSG_DATA || r->seq != m->hdr.seq + 1 || m->hdr.src >= c->nprocs)
        return;
    w = (ucx_want){.kind = r->kind,
                   .dtype = r->dtype,
                   .redop = r->redop,
                   .root = r->root,
                   .chan = m->hdr.chan,
                   .nops = r->nops,
                   .count = r->count,
                   .shape = r->shape};
    if (!header_differs(&w, &m->hdr, theirs, mine, sizeof theirs))
        return;
    snprintf(detail, sizeof detail,
             "processes disagree on %s sequence %" PRIu64 ": process %u submitted %.100s where "
             "process %u (this one) submitted %.100s; it had completed here (this process only "
             "sent), so the communicator is no longer usable",
             ucx_kind_name(r->kind), m->hdr.seq, c->procs[m->hdr.src], theirs, c->procs[c->me],
             mine);
    ucx_comm_fail(c, CCQ_ERR_MISMATCH, detail, false);
    /* The others may have failed it alone (fails_alone: their kinds hear everyone, this one's
     * only sent) and gone on: tell them. */
    untold(c, m);
}

/* ---- routing ------------------------------------------------------------------------------ */

/* What a notice says its operation failed with (an older sender: 0, a mismatch). */
static ccq_status notice_status(const ucx_msg *m)
{
    return m->hdr.status ? -(ccq_status)m->hdr.status : CCQ_ERR_MISMATCH;
}

/* A notice: o failed elsewhere (a member found a mismatch). */
static void take_notice(ucx_op *o, ucx_msg *m)
{
    const ucx_comm *c = o->c;
    char text[CCQ_DETAIL_LEN - 64];
    size_t n = 0;
    ccq_status st = notice_status(m);

    if (m->state == MSG_EAGER) {
        n = m->len < sizeof text - 1 ? m->len : sizeof text - 1;
        memcpy(text, m->data, n);
    }
    text[n] = '\0';
    if (n == 0 || memchr(text, '\0', n) == NULL)
        text[n] = '\0';
    o->noticed = true;
    if (o->status == CCQ_IN_PROGRESS) {
        o->op_only = m->hdr.step == UCX_NOTICE_OP_ONLY;
        if (o->op_only && st == CCQ_ERR_MISMATCH && (o->fz != NULL || o->nops > 1)) {
            /* A disagreement the finder failed alone (fails_alone), but this process runs
             * the operation in a fused group, whose other operations would fail with it
             * while the members run them alone: the communicator fails here, and this
             * process tells the members, whose communicators fail too (late_notice). An
             * unfused operation, whatever its kind, fails alone like the finder's: every
             * member that had not completed it fails it, and one that had fails the
             * communicator instead (late_notice, ucx_comm_tell). */
            o->op_only = false;
            o->noticed = false;
        }
    }
    ucx_op_fail(o, st < 0 ? st : CCQ_ERR_MISMATCH, "%s (reported by process %u)",
                n ? text : "a member process failed this operation", c->procs[m->hdr.src]);
}

/* Whether the operation at (chan, seq) succeeded here, as far as the last UCX_ENDED
 * operations of its channel tell. */
static bool ended_here(const ucx_comm *c, uint32_t chan, uint64_t seq)
{
    return chan < 3 && c->ended[chan][seq % UCX_ENDED].seq == seq + 1;
}

/* A notice for an operation that ended here (it succeeded, or failed alone: ucx_op.op_only):
 * the communicator is no longer usable, its next operation fails with the reporter's
 * detail. Except a notice of a failure that is the operation's alone: a member failed it
 * for want of a leaver's message (this one had them), or every member failed it over a
 * disagreement (fails_alone: this one too, unless it completed it, which only a member
 * running another kind can have). */
static void late_notice(ucx_comm *c, const ucx_msg *m)
{
    char text[CCQ_DETAIL_LEN - 160];
    size_t n;

    if (m->hdr.type != UCX_MSG_NOTICE || c->failed != CCQ_OK)
        return;
    if (m->hdr.step == UCX_NOTICE_OP_ONLY &&
        (notice_status(m) != CCQ_ERR_MISMATCH || !ended_here(c, m->hdr.chan, m->hdr.seq)))
        return;
    n = m->state == MSG_EAGER && m->len < sizeof text ? m->len : 0;
    memcpy(text, m->data, n);
    text[n < sizeof text ? n : sizeof text - 1] = '\0';
    c->failed = notice_status(m);
    c->failed_remote = true;
    /* A failure the others took for the operation's alone (fails_alone): they went on, and
     * would wait for this process in their next operation until timeout_ms. */
    if (m->hdr.step == UCX_NOTICE_OP_ONLY)
        untold(c, m);
    snprintf(c->failed_detail, sizeof c->failed_detail,
             "%.340s (reported by process %u after sequence %" PRIu64
             " ended here; the communicator is no longer usable)",
             text[0] ? text : "a member process failed an operation",
             m->hdr.src < c->nprocs ? c->procs[m->hdr.src] : UINT32_MAX, m->hdr.seq);
    ucx_comm_drop_messages(c);
}

/* m belongs to o; false when it was dropped. */
static bool op_adopt(ucx_op *o, ucx_msg *m, bool fresh)
{
    ucx_engine *e = o->e;
    if (m->hdr.src >= o->P || m->hdr.src == o->me) {
        drop(e, m, fresh); /* malformed: not from another member */
        return false;
    }
    if (m->hdr.type == UCX_MSG_NOTICE) {
        if (o->status == CCQ_IN_PROGRESS)
            take_notice(o, m);
        else if (o->status == CCQ_OK || o->op_only)
            late_notice(o->c, m); /* ended here, not yet retired (as comm_route does after) */
        drop(e, m, fresh);
        return false;
    }
    if (o->status == CCQ_OK)
        late_check(o->c, m); /* ended here, not yet retired */
    if (o->status != CCQ_IN_PROGRESS || !header_agrees(o, &m->hdr) ||
        !ucx_prior_agrees(o, &m->hdr)) {
        drop(e, m, fresh); /* a failed operation's messages are never placed */
        return false;
    }
    if (m->hdr.follow < o->minf) /* fusion's agreement (ucx/fused.c) */
        o->minf = m->hdr.follow;
    m->next = NULL;
    ucx_msg **pp = &o->arrivals;
    while (*pp != NULL)
        pp = &(*pp)->next;
    *pp = m;
    return true;
}

/* Route m within c; false when it was dropped. */
static bool comm_route(ucx_comm *c, ucx_msg *m, bool fresh)
{
    ucx_engine *e = c->e;
    if (c->failed != CCQ_OK || m->hdr.chan > 2) {
        drop(e, m, fresh);
        return false;
    }
    ucx_op *o = ucx_comm_find(c, m->hdr.chan, m->hdr.seq);
    if (o != NULL)
        return op_adopt(o, m, fresh);
    if (m->hdr.seq < c->next_seq[m->hdr.chan] &&
        !(m->hdr.chan == 0 && ucx_pend_has(c, m->hdr.seq))) {
        /* Its operation already ended here. A notice then says the communicator is no longer
         * usable: the next operation on it fails with the reporter's detail. */
        late_check(c, m);
        late_notice(c, m);
        drop(e, m, fresh);
        return false;
    }
    ucx_msg **b = &c->early[ucx_seq_bucket(m->hdr.chan, m->hdr.seq)];
    m->next = *b;
    *b = m;
    c->nearly++;
    return true;
}

static ucx_comm *find_comm(ucx_engine *e, uint64_t id)
{
    for (ucx_comm *c = e->comms; c != NULL; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

static bool comm_gone(const ucx_engine *e, uint64_t id)
{
    uint32_t n = e->ngone < 256 ? e->ngone : 256;
    for (uint32_t k = 0; k < n; k++)
        if (e->gone[k] == id)
            return true;
    return false;
}

static ucs_status_t am_recv(void *arg, const void *header, size_t header_length, void *data,
                            size_t length, const ucp_am_recv_param_t *param, bool bulk);

ucs_status_t ucx_am_recv(void *arg, const void *header, size_t header_length, void *data,
                         size_t length, const ucp_am_recv_param_t *param)
{
    return am_recv(arg, header, header_length, data, length, param, false);
}

ucs_status_t ucx_am_recv_bulk(void *arg, const void *header, size_t header_length, void *data,
                              size_t length, const ucp_am_recv_param_t *param)
{
    return am_recv(arg, header, header_length, data, length, param, true);
}

static ucs_status_t am_recv(void *arg, const void *header, size_t header_length, void *data,
                            size_t length, const ucp_am_recv_param_t *param, bool bulk)
{
    ucx_engine *e = arg;
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    bool held = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0;
    ucx_comm *c;
    ucx_msg *m;
    ucx_hdr h;

    e->activity++;
    if (header_length != sizeof h) {
        e->dropped++;
        return UCS_OK; /* not ccq's: a rendezvous payload is dropped, its sender completes */
    }
    memcpy(&h, header, sizeof h);
    if (h.magic != UCX_MAGIC || h.version != UCX_VERSION || h.type > UCX_MSG_PONG) {
        e->dropped++;
        return UCS_OK;
    }
    if (h.type == UCX_MSG_PING || h.type == UCX_MSG_PONG) { /* ucx/probe.c */
        if (h.wsrc < e->world_size && h.wsrc != e->world_rank)
            ucx_probe_recv(e, &h);
        return UCS_OK;
    }
    if (h.wsrc < e->world_size && h.wsrc != e->world_rank) {
        ucx_peer *peer = &e->peers[h.wsrc];
        if (h.type == UCX_MSG_BYE) {
            peer->left = true;
            peer->bye_count = h.seq;
            return UCS_OK;
        }
        peer->got++;
    }
    c = find_comm(e, h.comm);
    if (c == NULL && (comm_gone(e, h.comm) || e->norphans >= UCX_ORPHANS_MAX ||
                      e->orphan_bytes + (rndv ? 0 : length) > UCX_ORPHAN_BYTES)) {
        if (!comm_gone(e, h.comm))
            e->orphans_dropped++;
        e->dropped++;
        return UCS_OK;
    }
    if (c != NULL && c->failed != CCQ_OK) {
        e->dropped++;
        return UCS_OK;
    }
    if ((m = msg_new(e)) == NULL) {
        e->dropped++;
        return UCS_OK;
    }
    m->hdr = h;
    m->bulk = bulk;
    m->wsrc = h.wsrc < e->world_size ? h.wsrc : UINT32_MAX;
    m->len = length;
    if (rndv || held) {
        /* Kept without a copy until its operation takes it (ucp_am_recv_data_nbx for a
         * rendezvous, ucp_am_data_release for both). */
        m->state = rndv ? MSG_RNDV : MSG_EAGER;
        m->data = data;
        m->ucx_data = true;
    } else {
        m->state = MSG_EAGER;
        m->data = malloc(length ? length : 1);
        if (m->data == NULL) {
            m->next = e->free_msgs;
            e->free_msgs = m;
            e->dropped++;
            return UCS_OK;
        }
        memcpy(m->data, data, length);
    }
    if (c == NULL) {
        m->next = e->orphans;
        e->orphans = m;
        e->norphans++;
        e->orphan_bytes += rndv ? 0 : length;
    } else if (!comm_route(c, m, true)) {
        return UCS_OK; /* dropped: UCX releases the data (a rendezvous sender completes) */
    }
    return m->ucx_data ? UCS_INPROGRESS : UCS_OK;
}

void ucx_adopt_orphans(ucx_engine *e, ucx_comm *c)
{
    for (ucx_msg **pp = &e->orphans; *pp != NULL;) {
        ucx_msg *m = *pp;
        if (m->hdr.comm != c->id) {
            pp = &m->next;
            continue;
        }
        *pp = m->next;
        e->norphans--;
        e->orphan_bytes -= m->state == MSG_EAGER ? m->len : 0;
        (void)comm_route(c, m, false);
    }
}

void ucx_adopt_early(ucx_op *o)
{
    ucx_comm *c = o->c;
    ucx_msg *mine = NULL;

    /* Arrival order is kept (the early list is newest first). */
    for (ucx_msg **pp = &c->early[ucx_seq_bucket(o->chan, o->seq)]; *pp != NULL;) {
        ucx_msg *m = *pp;
        if (m->hdr.chan != o->chan || m->hdr.seq != o->seq) {
            pp = &m->next;
            continue;
        }
        *pp = m->next;
        m->next = mine;
        mine = m;
        c->nearly--;
    }
    while (mine != NULL) {
        ucx_msg *m = mine;
        mine = m->next;
        (void)op_adopt(o, m, false);
    }
}

void ucx_comm_drop_messages(ucx_comm *c)
{
    for (uint32_t b = 0; b < UCX_OP_BUCKETS; b++)
        while (c->early[b] != NULL) {
            ucx_msg *m = c->early[b];
            c->early[b] = m->next;
            drop(c->e, m, false);
        }
    c->nearly = 0;
}

/* ---- sends ------------------------------------------------------------------------------ */

static ucx_peer *member(ucx_op *o, uint32_t p)
{
    return &o->e->peers[o->c->procs[p]];
}

static ccq_status post(ucx_op *o, uint32_t dst, ucx_send *s, const void *buf, size_t bytes,
                       ccq_errbuf *err)
{
    ucx_peer *peer = member(o, dst);
    ucp_ep_h ep;
    void *req;

    if (peer->left) {
        if (s->hdr.type == UCX_MSG_DATA) /* (a notice to it: it needs none) */
            o->op_only = true;
        snprintf(err->msg, sizeof err->msg,
                 "process %u left (destroyed its runtime) before %s sequence %" PRIu64
                 " could send to it (this is process %u)",
                 o->c->procs[dst], ucx_kind_name(o->kind), o->seq, o->c->procs[o->me]);
        free(s->copy);
        free(s);
        return CCQ_ERR_BACKEND;
    }
    if (peer->failed != UCS_OK || peer->ep == NULL) {
        snprintf(err->msg, sizeof err->msg,
                 "process %u failed (UCX: %s) during %s sequence %" PRIu64 " (this is process %u)",
                 o->c->procs[dst],
                 peer->failed != UCS_OK ? ucs_status_string(peer->failed) : "no endpoint",
                 ucx_kind_name(o->kind), o->seq, o->c->procs[o->me]);
        free(s->copy);
        free(s);
        return CCQ_ERR_BACKEND;
    }
    ep = bytes >= o->e->bulk_bytes ? ucx_bulk_ep(o->e, peer) : peer->ep;
    req = ucp_am_send_nbx(
        ep, ep != peer->ep ? UCX_AM_ID_BULK : UCX_AM_ID, &s->hdr, sizeof s->hdr, buf, bytes,
        ep == peer->ep && bytes < o->e->eager_bytes ? &o->e->send_eager : &o->e->send_param);
    if (!UCS_PTR_IS_ERR(req))
        peer->sent++;  /* what our goodbye will say (ucx_destroy) */
    if (req == NULL) { /* done at once */
        free(s->copy);
        free(s);
        return CCQ_OK;
    }
    if (UCS_PTR_IS_ERR(req)) {
        snprintf(err->msg, sizeof err->msg, "UCX: sending to process %u: %s", o->c->procs[dst],
                 ucs_status_string(UCS_PTR_STATUS(req)));
        free(s->copy);
        free(s);
        return CCQ_ERR_BACKEND;
    }
    s->req = req;
    s->next = o->sends;
    o->sends = s;
    return CCQ_OK;
}

static ucx_send *send_new(ucx_op *o, uint32_t dst, uint8_t type, uint32_t step, uint32_t tag)
{
    ucx_send *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->dst = dst;
    s->tag = tag;
    s->hdr.magic = UCX_MAGIC;
    s->hdr.version = UCX_VERSION;
    s->hdr.type = type;
    s->hdr.kind = o->kind == CCQ_KIND_RECV ? CCQ_KIND_SEND : o->kind;
    s->hdr.comm = o->c->id;
    s->hdr.seq = o->seq;
    s->hdr.chan = o->chan;
    s->hdr.src = o->me;
    s->hdr.wsrc = o->e->world_rank;
    s->hdr.root = o->root;
    s->hdr.step = step;
    s->hdr.count = o->count;
    s->hdr.dtype = o->dtype;
    s->hdr.redop = o->redop;
    s->hdr.follow = o->minf;
    s->hdr.nops = o->nops;
    s->hdr.shape = o->shape;
    if (o->chan == 0)
        ucx_prior_stamp(o->c, &s->hdr);
    return s;
}

ccq_status ucx_send_step(ucx_op *o, uint32_t dst, uint32_t step, const void *buf, size_t bytes,
                         uint32_t tag, ccq_errbuf *err)
{
    ucx_send *s = send_new(o, dst, UCX_MSG_DATA, step, tag);
    if (s == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    return post(o, dst, s, buf, bytes, err);
}

bool ucx_sends_done(ucx_op *o, uint32_t tag, ccq_status *st, ccq_errbuf *err)
{
    bool done = true;
    for (ucx_send **pp = &o->sends; *pp != NULL;) {
        ucx_send *s = *pp;
        ucs_status_t us = ucp_request_check_status(s->req);
        if (us == UCS_INPROGRESS) {
            done &= tag != UCX_ALL && s->tag != tag;
            pp = &s->next;
            continue;
        }
        if (us != UCS_OK && *st == CCQ_OK) {
            *st = CCQ_ERR_BACKEND;
            snprintf(err->msg, sizeof err->msg,
                     "UCX: the message of %s sequence %" PRIu64
                     " to process %u failed: %s (this is process %u)",
                     ucx_kind_name(o->kind), o->seq, o->c->procs[s->dst], ucs_status_string(us),
                     o->c->procs[o->me]);
        }
        *pp = s->next;
        ucp_request_free(s->req);
        free(s->copy);
        free(s);
    }
    return done;
}

void ucx_notice(ucx_op *o)
{
    size_t n = strlen(o->detail.msg) + 1;
    if (o->noticed)
        return;
    o->noticed = true;
    for (uint32_t p = 0; p < o->P; p++) {
        ucx_send *s;
        ccq_errbuf ignored;
        if (p == o->me || (s = send_new(o, p, UCX_MSG_NOTICE, o->op_only ? UCX_NOTICE_OP_ONLY : 0,
                                        UCX_NOTICE_TAG)) == NULL)
            continue;
        s->hdr.status = (uint16_t)(-o->status);
        s->copy = malloc(n);
        if (s->copy == NULL) {
            free(s);
            continue;
        }
        memcpy(s->copy, o->detail.msg, n);
        (void)post(o, p, s, s->copy, n, &ignored);
    }
}

/* ---- receives ----------------------------------------------------------------------------- */

int ucx_peer_left(const ucx_peer *p, uint64_t now_ns)
{
    if (!p->left)
        return UCX_LEFT_NO;
    if (p->got >= p->bye_count)
        return UCX_LEFT_ALL;
    /* Some are still on their way (over TCP each endpoint is its own connection: the goodbye
     * may overtake a payload on the large-message endpoint); a connection that failed this
     * long ago brings nothing more. */
    return p->failed != UCS_OK && now_ns - p->failed_ns > UCX_LEFT_GRACE_NS ? UCX_LEFT_LOST
                                                                            : UCX_LEFT_NO;
}

ccq_status ucx_recv_step(ucx_op *o, uint32_t src, uint32_t step, void *land, size_t bytes,
                         ucx_msg **out, ccq_errbuf *err)
{
    ucx_msg **pp = &o->arrivals, *m;
    ucx_peer *peer = member(o, src);

    *out = NULL;
    for (; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->hdr.src == src && (*pp)->hdr.step == step)
            break;
    m = *pp;
    if (m == NULL) {
        /* The clock only for a peer that left: this runs at every poll while waiting. */
        int left = peer->left ? ucx_peer_left(peer, ccq_now_ns()) : UCX_LEFT_NO;
        o->wait_src = src;
        o->wait_step = step;
        if (left != UCX_LEFT_NO) {
            o->op_only = true;
            snprintf(err->msg, sizeof err->msg,
                     "process %u left (destroyed its runtime) before sending its message "
                     "(step %u of %s sequence %" PRIu64 "; this is process %u)%s",
                     o->c->procs[src], step, ucx_kind_name(o->kind), o->seq, o->c->procs[o->me],
                     left == UCX_LEFT_LOST ? ": some of its last messages never arrived (its "
                                             "connection failed first)"
                                           : "");
            return CCQ_ERR_BACKEND;
        }
        if (peer->failed != UCS_OK && !peer->left) {
            snprintf(err->msg, sizeof err->msg,
                     "process %u failed (UCX: %s) during %s sequence %" PRIu64
                     " (this is process %u, waiting for its message)",
                     o->c->procs[src], ucs_status_string(peer->failed), ucx_kind_name(o->kind),
                     o->seq, o->c->procs[o->me]);
            return CCQ_ERR_BACKEND;
        }
        return CCQ_IN_PROGRESS;
    }
    if (m->len != bytes) {
        snprintf(err->msg, sizeof err->msg,
                 "process %u's message (step %u of %s sequence %" PRIu64
                 ") has %zu bytes where this process (%u) expects %zu: the processes run "
                 "different schedules (another ccq version?)",
                 o->c->procs[src], step, ucx_kind_name(o->kind), o->seq, m->len, o->c->procs[o->me],
                 bytes);
        return CCQ_ERR_BACKEND;
    }
    switch (m->state) {
    case MSG_EAGER:
        m->buf = m->data;
        break;
    case MSG_RNDV: {
        ucp_request_param_t prm;
        void *req;
        if (peer->failed != UCS_OK) {
            /* Its sender failed after announcing it: never fetch (UCX may have destroyed the
             * endpoint the announcement names; fetching then asserted inside UCX: seen once in
             * CI's ASan run of test_host_ucx_kill_large_np3). The message stays unreleased, as
             * any dropped rendezvous from a failed peer (docs/multiprocess-host.md). */
            snprintf(err->msg, sizeof err->msg,
                     "process %u failed (UCX: %s) during %s sequence %" PRIu64
                     " (this is process %u, its message announced but not fetched)",
                     o->c->procs[src], ucs_status_string(peer->failed), ucx_kind_name(o->kind),
                     o->seq, o->c->procs[o->me]);
            return CCQ_ERR_BACKEND;
        }
        memset(&prm, 0, sizeof prm);
        m->ucx_data = false; /* UCX owns the descriptor from here on */
        m->buf = land;
        req = ucp_am_recv_data_nbx(o->e->worker, m->data, land, bytes, &prm);
        m->data = NULL;
        if (UCS_PTR_IS_ERR(req)) {
            snprintf(err->msg, sizeof err->msg, "UCX: receiving process %u's message: %s",
                     o->c->procs[src], ucs_status_string(UCS_PTR_STATUS(req)));
            return CCQ_ERR_BACKEND;
        }
        if (req != NULL) {
            m->req = req;
            m->state = MSG_LANDING;
            o->wait_src = src;
            o->wait_step = step;
            return CCQ_IN_PROGRESS;
        }
        break;
    }
    case MSG_LANDING: {
        ucs_status_t us = ucp_request_check_status(m->req);
        if (us == UCS_INPROGRESS)
            return CCQ_IN_PROGRESS;
        ucp_request_free(m->req);
        m->req = NULL;
        if (us != UCS_OK) {
            snprintf(err->msg, sizeof err->msg, "UCX: receiving process %u's message: %s",
                     o->c->procs[src], ucs_status_string(us));
            return CCQ_ERR_BACKEND;
        }
        break;
    }
    default:
        break;
    }
    m->state = MSG_READY;
    *pp = m->next;
    m->next = NULL;
    o->wait_src = UINT32_MAX;
    *out = m;
    return CCQ_OK;
}
