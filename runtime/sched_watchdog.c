/* The scheduler's watchdog: deadlines for queued and issued work, the desync report that
 * names missing ranks, and communicator aborts. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/sched.h"

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
            if (sched_field_differs(first, p, f))
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
static void describe_wait(ccq_runtime *rt, ccq_inst *i, ccq_cmd *c, uint64_t now, char *buf,
                          size_t len)
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
        w += ccq_format(buf + w, len - w,
                        "; its communicator is still forming (member processes of world ranks "
                        "%u..%u must all call ccq_comm_init, or send/recv with this process)",
                        comm->procs[0], comm->procs[comm->nprocs - 1]);
        /* How each of them is doing, from its heartbeats (runtime/health/). */
        ccq_health_describe_members(rt, comm, c->seq, buf + w, len - w);
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
        ccq_inst *y = sched_win_get(ch, ch->head);
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
        for (ccq_cmd *q = s->cursor; q != NULL; q = q->fifo_next) {
            uint32_t xi = 0;
            uint64_t t = 0;
            if (q->state == CCQ_CMD_QUEUED && q->gw_mark != 0 &&
                ccq_gw_blocker(rt, s, q->gw_mark, &xi, &t)) {
                const ccq_stream *x = &rt->streams[xi];
                w += ccq_format(buf + w, len - w,
                                "; matched, but a command of device %u stream %u was submitted "
                                "after a GPU-side wait (ccq_nccl_stream_wait) on its bound CUDA "
                                "stream for the first %" PRIu64 " commands of device %u stream "
                                "%u, which are not all issued: it runs only after them",
                                s->device, s->id, t, x->device, x->id);
                return;
            }
            if (q == part)
                break;
        }
    }
    ccq_format(buf + w, len - w,
               "; matched, but its buffers overlap an earlier command of "
               "the same stream that cannot complete first");
}

/* Abort a communicator: st CCQ_ERR_ABORTED (the watchdog, the backend) or
 * CCQ_ERR_PROCESS_LOST (a member process was lost: `why` names it, and the backend may keep
 * the communicator as the parent of a shrink). */
static void abort_comm(ccq_runtime *rt, ccq_comm *comm, ccq_status st, const char *why)
{
    ccq_sched *S = rt->sched;
    char detail[CCQ_DETAIL_LEN];

    snprintf(comm->init_detail, sizeof comm->init_detail, "%s", why);
    atomic_store_explicit(&comm->aborted, 1, memory_order_release);
    if (ccq_trace_on(&rt->trace))
        sched_ev_misc(rt, ccq_now_ns(), CCQ_EV_ABORT, 0, comm->id, 0, 0, 0, st);
    {
        char note[CCQ_DETAIL_LEN];
        size_t w = ccq_format(note, sizeof note, "communicator ");
        w += ccq_describe_comm(note + w, sizeof note - w, comm);
        ccq_format(note + w, sizeof note - w, " aborted: %s", why);
        ccq_trace_note(&rt->trace, CCQ_EV_ABORT, note);
    }
    if (comm->be != NULL) {
        if (st == CCQ_ERR_PROCESS_LOST && rt->be_ops->revoke != NULL)
            rt->be_ops->revoke(rt->be, comm->be);
        else
            rt->be_ops->abort(rt->be, comm->be);
    }
    /* Everything still queued on it fails fast. */
    if (st == CCQ_ERR_PROCESS_LOST)
        snprintf(detail, sizeof detail, "%s", why);
    else
        ccq_format(detail, sizeof detail, "communicator aborted: %s", why);
    for (int k = 0; k < CCQ_CHAN_COUNT; k++) {
        ccq_chan *ch = &comm->chan[k];
        /* Fixed bounds: failing the head instance advances the head under us. */
        for (uint64_t q = ch->head, end = ch->head + ch->cap; ch->win != NULL && q < end; q++) {
            ccq_inst *i = sched_win_get(ch, q);
            if (i == NULL || i->state == CCQ_INST_ISSUED || i->state == CCQ_INST_FAILED)
                continue;
            sched_fail_inst(S, i, st, detail, false);
        }
        ch->late_status = st;
        sched_chan_advance(S, ch);
    }
}

void sched_abort_comm(ccq_runtime *rt, ccq_comm *comm, const char *why)
{
    if (atomic_load_explicit(&comm->aborted, memory_order_relaxed))
        return;
    abort_comm(rt, comm, CCQ_ERR_ABORTED, why);
}

void sched_lose_comm(ccq_runtime *rt, ccq_comm *comm, const char *why)
{
    bool was_aborted = atomic_load_explicit(&comm->aborted, memory_order_relaxed);

    if (atomic_load_explicit(&comm->lost, memory_order_relaxed))
        return;
    snprintf(comm->lost_detail, sizeof comm->lost_detail, "%s", why);
    atomic_store_explicit(&comm->lost, 1, memory_order_release);
    /* Its operations in flight fail, also one the backend reports done: the revoke or abort
     * ends kernels that wait for the lost process, and their completion says nothing about
     * their data (as the watchdog's aborts, the outcome does not depend on that race). */
    for (ccq_batch *b = rt->sched->inflight; b != NULL; b = b->next)
        for (uint32_t k = 0; k < b->be.nops; k++)
            if (b->insts[k]->chan->comm == comm)
                b->insts[k]->cut = true;
    if (!was_aborted) {
        abort_comm(rt, comm, CCQ_ERR_PROCESS_LOST, why);
        return;
    }
    /* Aborted before (the watchdog, an engine error): what was queued failed then; what comes
     * now fails with the loss (sched_arrive, comm_status read `lost`). */
    for (int k = 0; k < CCQ_CHAN_COUNT; k++)
        comm->chan[k].late_status = CCQ_ERR_PROCESS_LOST;
}

void sched_abort_batch(ccq_runtime *rt, ccq_batch *b, const char *why)
{
    b->aborting = true;
    for (uint32_t k = 0; k < b->be.nops; k++) {
        ccq_inst *i = b->insts[k];
        /* An operation that already ended on its own (ccq_be_op.done_early: a pair's
         * all_reduce batched beside the world's stuck one) leaves its communicator alone: one
         * communicator's stuck operation never takes another down. */
        if (i->ended || i->op.done_early)
            continue;
        sched_abort_comm(rt, i->chan->comm, why);
    }
}

/* Fail what waited too long; abort what was issued and did not complete (after the backend,
 * if it has deadlines of its own, looked first). Runs only when the earliest known deadline
 * has passed; returns true if it failed or aborted anything or asked the backend to look. */
bool sched_watchdog(ccq_runtime *rt, uint64_t now)
{
    ccq_sched *S = rt->sched;
    char detail[CCQ_REPORT_LEN];
    uint64_t next = UINT64_MAX;
    bool any = false, ask_backend = false;

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
            describe_wait(rt, q->inst, q, now, detail, sizeof detail);
            if (ccq_trace_on(&rt->trace))
                sched_ev_misc(rt, ccq_now_ns(), CCQ_EV_WATCHDOG, q->trace_id, q->comm->id, q->seq,
                              q->count, 0, CCQ_ERR_TIMEOUT);
            ccq_trace_note(&rt->trace, CCQ_EV_WATCHDOG, detail);
            sched_fail_inst(S, q->inst, CCQ_ERR_TIMEOUT, detail, false);
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
        if (!b->overdue && rt->be_ops->check_deadlines != NULL) {
            /* The backend's own deadlines come before this one, so that a stuck operation
             * fails alone, naming what it waits for, and only its communicator is aborted.
             * Past both at once (this thread stood still: its process stopped, preempted),
             * the backend has not looked yet: it does at the next poll, and what is still in
             * flight after it is aborted in the next pass (no sleep in between: next = now). */
            b->overdue = true;
            ask_backend = true;
            next = now;
            continue;
        }
        size_t w = ccq_format(detail, sizeof detail,
                              "batch %" PRIu64 " (%u ops) issued %.0f ms ago did not complete "
                              "within timeout_ms; the watchdog aborted its communicators",
                              b->be.id, b->be.nops, (double)(now - b->issue_ns) / 1e6);
        /* Communicators spanning processes: how each other member process is doing, from
         * its heartbeats (runtime/health/). */
        for (uint32_t k = 0; k < b->be.nops && rt->health != NULL && w + 1 < sizeof detail; k++) {
            ccq_inst *i = b->insts[k];
            if (i->chan->comm->nprocs <= 1)
                continue;
            w += ccq_format(detail + w, sizeof detail - w, "; on comm ");
            w += ccq_describe_comm(detail + w, sizeof detail - w, i->chan->comm);
            w += ccq_format(detail + w, sizeof detail - w, " this process waits at #%" PRIu64,
                            i->seq);
            w += ccq_health_describe_members(rt, i->chan->comm, i->seq, detail + w,
                                             sizeof detail - w);
        }
        sched_abort_batch(rt, b, detail);
        any = true;
    }
    if (ask_backend)
        rt->be_ops->check_deadlines(rt->be);
    if (S->closing && !S->shutdown_aborted)
        next = min_u64(next, ccq_add_sat(S->close_ns, rt->timeout_ns));
    S->wd_next = next;
    return any || ask_backend;
}
