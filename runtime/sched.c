/* The scheduler thread: its state, the loop, shutdown, and what every phase shares (event
 * records, failing commands). The phases are sched_match.c (intake, matching, communicators
 * forming), sched_batch.c (hazards, batch building, issue), sched_complete.c (reap, end in
 * stream order) and sched_watchdog.c (deadlines, desync reports, aborts), over sched.h. It is
 * the only thread that calls the backend and the only one that touches anything marked
 * "scheduler only". */
#define _GNU_SOURCE
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/thread_name.h"
#include "runtime/boot/bootstrap.h"
#include "runtime/sched.h"

/* Grow a pointer array to hold at least `need` entries. */
bool sched_grow(void *arrp, uint32_t *cap, uint32_t need)
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
void sched_xgrow_fail(void)
{
    fprintf(stderr, "ccq: scheduler out of memory\n");
    abort();
}

char *sched_xstrdup(const char *s)
{
    char *d = strdup(s ? s : "");
    if (d == NULL)
        sched_xgrow_fail();
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
/* Event log                                                                             */
/* ------------------------------------------------------------------------------------ */

/* Record an event about a command (submitted, issued, completed, failed). */
void sched_ev_cmd(ccq_runtime *rt, uint32_t type, const ccq_cmd *c, uint64_t t, ccq_status st)
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
    e->fused = type == CCQ_EV_COMPLETED || type == CCQ_EV_FAILED ? c->fused : 0;
    e->dur_ns = 0;
    ccq_trace_commit(&rt->trace, e);
}

/* Record an event about a communicator, an operation of it, or a batch. */
void sched_ev_misc(ccq_runtime *rt, uint64_t t, uint32_t type, uint64_t id, uint32_t comm,
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
void sched_set_detail(ccq_cmd *c, const char *reason)
{
    char what[CCQ_DETAIL_LEN];
    size_t w = ccq_describe_cmd(what, sizeof what, c), n = strlen(reason);
    char *d = malloc(w + 2 + n + 1); /* whole: a desync report may be long */
    if (d == NULL)
        sched_xgrow_fail();
    memcpy(d, what, w);
    memcpy(d + w, ": ", 2);
    memcpy(d + w + 2, reason, n + 1);
    free(c->detail);
    c->detail = d;
}

void sched_fail_cmd(ccq_cmd *c, ccq_status st, const char *reason, bool cancel)
{
    if (c->state != CCQ_CMD_QUEUED)
        return;
    c->state = CCQ_CMD_FAILED;
    c->status = st;
    c->cancel = cancel;
    sched_set_detail(c, reason);
    c->inst = NULL;
}

/* Fail every present part of an instance; parts that arrive later get the same. */
void sched_fail_inst(ccq_sched *S, ccq_inst *i, ccq_status st, const char *reason, bool cancel)
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
            sched_fail_cmd(i->cmds[p], st, reason, cancel);
        i->cmds[p] = NULL;
    }
    i->state = CCQ_INST_FAILED;
    i->fail_status = st;
    i->fail_detail = sched_xstrdup(reason);
    if (i->seq == i->chan->head)
        sched_chan_advance(S, i->chan);
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
                ccq_inst *i = sched_win_get(ch, q);
                if (i == NULL || (i->state != CCQ_INST_WAITING &&
                                  (incomplete_only ||
                                   (i->state != CCQ_INST_READY && i->state != CCQ_INST_CHECKING))))
                    continue;
                ccq_format(detail, sizeof detail, "cancelled by shutdown: %s", why);
                sched_fail_inst(S, i, CCQ_ERR_SHUTDOWN, detail, true);
            }
            ch->late_status = CCQ_ERR_SHUTDOWN;
            sched_chan_advance(S, ch);
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
                sched_abort_batch(rt, b, detail);
        cancel_all(rt, false, "shutdown reached timeout_ms before it could run");
        S->shutdown_aborted = true;
        *progress = true;
    }
    return S->cancelled_incomplete && S->nactive == 0 && S->ninflight == 0 && S->done == NULL &&
           S->held == NULL;
}

/* ------------------------------------------------------------------------------------ */
/* The loop                                                                              */
/* ------------------------------------------------------------------------------------ */

/* One step of the scheduler's spin between polls while it busy-polls an engine
 * (rt->engine_polling: an operation across processes in flight; work_visible polls the engine
 * between steps): SCHED_POLL_PAUSES pauses, a yield every SCHED_POLL_YIELD_MASK + 1 steps.
 * ccq_spin_step's 32 pauses (~0.8 us on the 2-vCPU VMs of docs/performance.md) made a message
 * that just arrived wait up to that long to be seen, every round of every operation; 4 pauses
 * poll about 5 times as often, and yielding every 64th step gives the core away about as often
 * in time as ccq_spin_step's every 8th. Measured (docs/performance.md, "The scheduler polls
 * its engine 5 times as often": bench/ab-libs.sh, 18 runs, medians): all_reduce 8 B-2 MiB,
 * 2 x 1 0.97-1.32x and 4 x 1 0.95-1.18x as fast as with 32 pauses (12 of 16 sizes faster, none
 * beyond the noise slower). Fences, producers and one-process batches keep ccq_spin_step. */
#define SCHED_POLL_PAUSES     4u
#define SCHED_POLL_YIELD_MASK 63u

static void sched_poll_step(unsigned *step)
{
    ccq_spin_step_n(step, SCHED_POLL_PAUSES, SCHED_POLL_YIELD_MASK);
}

/* Anything to do? Checked after announcing sleep, so a concurrent push is never missed. */
static bool work_visible(ccq_runtime *rt)
{
    ccq_sched *S = rt->sched;

    if (!ccq_mpsc_empty(&rt->new_streams) || !ccq_mpsc_empty(&rt->comm_reqs) ||
        ccq_trace_requested(&rt->trace) || ccq_trace_dump_requested(&rt->trace) ||
        (rt->health != NULL && ccq_health_due(rt)))
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

/* Tell fence waiters whether this thread busy-polls an engine now (see
 * ccq_runtime.engine_polling): a batch in flight on a backend asking for a poll interval
 * below a microsecond. */
static void note_engine_polling(ccq_runtime *rt)
{
    ccq_sched *S = rt->sched;
    uint32_t polling = 0;
    if (S->ninflight > 0 && rt->be_ops->poll_interval != NULL) {
        uint64_t iv = rt->be_ops->poll_interval(rt->be);
        polling = iv > 0 && iv < 1000;
    }
    if (polling != atomic_load_explicit(&rt->engine_polling, memory_order_relaxed))
        atomic_store_explicit(&rt->engine_polling, polling, memory_order_relaxed);
}

void *ccq_sched_main(void *arg)
{
    ccq_runtime *rt = arg;
    ccq_sched *S = rt->sched;
    uint64_t spin_ns = rt->spin_ns, busy_ns = ccq_now_ns();
    unsigned spin_step = 0;
    /* Once commands ended and nothing is in flight, the idle spin gives the core away after
     * its first step, as a fence waiter does after submitting (queue/wake.c): the two threads
     * hand work to each other, and where a process's threads outnumber the cores left to it
     * (2 processes on 2 cores: a submitting thread and a scheduler each) the fence waiter
     * waits for this very core. One 8-byte all_reduce then a fence: 2 x 1 1.4-1.8x faster,
     * 2 x 2 1.4x. Only where the host's processes do not outnumber their cores (procs_fit_cores):
     * with more (4 x 1 on 2) the core may go to another process's busy scheduler instead, and
     * nothing measured there showed a gain beyond its noise; in one process a back-to-back fence
     * came out slower (0.8x). docs/performance.md, "The scheduler's hand-off yield". */
    bool handoff_yield = rt->procs_fit_cores;

    ccq_thread_name("ccq-sched");
    ccq_tls_inside |= CCQ_INSIDE_SCHED;
    S->pin = (ccq_core_pin){.cpu = -1, .claim = -1}; /* never pins, unless: */
    if (rt->pin) { /* this host's processes outnumber their cores (common/cores.h) */
        ccq_core_pin_init(&S->pin, rt->pin_home);
        ccq_core_pin_set(&S->pin, true);
    }
    S->boot_poll_min_ns = CCQ_FORM_POLL_NS;
    if (rt->world.boot != NULL) { /* at least 10 us: a sleep, not a spin */
        uint64_t iv = ccq_boot_poll_interval_ns(rt->world.boot);
        S->boot_poll_min_ns = min_u64(iv > 10000 ? iv : 10000, CCQ_FORM_POLL_NS);
    }
    S->boot_poll_ns = S->boot_poll_min_ns;

    for (;;) {
        bool progress = false;
        uint64_t now, deadline;

        progress |= ccq_trace_serve(&rt->trace);
        if (rt->health != NULL && ccq_health_due(rt)) /* losses to apply, progress asked */
            progress |= ccq_health_serve(rt);
        progress |= sched_drain(rt);
        if (S->forming != NULL)
            progress |= sched_comms_progress(rt, ccq_now_ns());
        if (S->checking != NULL)
            progress |= sched_checks_progress(rt);
        progress |= sched_reap(rt);
        progress |= sched_end_failed_heads(rt);
        progress |= sched_build_and_issue(rt);
        now = ccq_now_ns();
        progress |= sched_watchdog(rt, now);
        ccq_trace_tick(&rt->trace, now, S->completed + S->failed + S->cancelled);
        if (S->held != NULL && (now >= S->dump_after || S->closing)) {
            /* trace_file: the story of what went wrong is on disk before any fence or test
             * can report it (the failures were held back for it). A dump of a full ring
             * takes long (65536 events: 0.4-1 s here), so the next one waits 4 times as long
             * as this one took, at most 1 s: dumps take at most a fifth of the scheduler's
             * time however often commands fail, and a failure waits at most that for its
             * dump. */
            uint64_t t0 = ccq_now_ns(), t1;
            ccq_trace_autodump(rt, sched_held_reason(rt));
            t1 = ccq_now_ns();
            S->dump_after = ccq_add_sat(t1, min_u64(4 * (t1 - t0), CCQ_DUMP_GAP_MAX_NS));
            sched_release_held(rt);
            progress = true;
        }
        progress |= ccq_trace_serve_dump(rt);
        if (S->closing || atomic_load_explicit(&rt->closing, memory_order_acquire)) {
            if (shutdown_step(rt, now, &progress))
                break;
        }
        note_engine_polling(rt);
        if (progress) {
            busy_ns = now;
            S->boot_poll_ns = S->boot_poll_min_ns;
            continue;
        }
        /* Poll a little before sleeping: work that arrives within spin_us of the last
         * is picked up without a futex round trip (the submitter's push then costs no
         * system call either, since `sleeping` stays 0). Bounded, so an idle runtime does
         * not hold a core. */
        if (now - busy_ns < spin_ns) {
            for (int k = 0; k < 8 && !work_visible(rt); k++) {
                /* Commands just ended and nothing is left in flight: a fence waiter is
                 * about to run, maybe queued on this very core, which the spin would hold
                 * for 7 steps (see handoff_yield). */
                if (k == 1 && handoff_yield && S->ended_pass && S->ninflight == 0) {
                    S->ended_pass = false;
                    sched_yield();
                }
                if (atomic_load_explicit(&rt->engine_polling, memory_order_relaxed))
                    sched_poll_step(&spin_step);
                else
                    ccq_spin_step(&spin_step);
            }
            continue;
        }
        S->ended_pass = false;

        deadline = min_u64(
            S->wd_next, ccq_trace_next_tick(&rt->trace, S->completed + S->failed + S->cancelled));
        if (S->ninflight > 0 || rt->be_ops->poll_interval != NULL) {
            uint64_t iv = rt->be_ops->poll_interval != NULL ? rt->be_ops->poll_interval(rt->be)
                                                            : rt->be_ops->poll_interval_ns;
            if (iv > 0)
                deadline = min_u64(deadline, ccq_add_sat(now, iv));
        }
        bool boot_wait = S->forming != NULL || S->checking != NULL;
        if (boot_wait) /* the bootstrap cannot wake us */
            deadline = min_u64(deadline, ccq_add_sat(now, S->boot_poll_ns));
        if (S->held != NULL) /* failures waiting for their dump */
            deadline = min_u64(deadline, S->dump_after);
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
        if (boot_wait) /* the back-off grows with the sleeps actually taken */
            S->boot_poll_ns = min_u64(2 * S->boot_poll_ns, CCQ_FORM_POLL_NS);
        ccq_wake_sleep(&rt->wake, seq, deadline == UINT64_MAX ? UINT64_MAX : deadline - now);
    }

    /* Communicators still waiting for creation will never get it. */
    for (ccq_mpsc_node *n = ccq_mpsc_pop_all_spsc(&rt->comm_reqs); n != NULL;) {
        ccq_mpsc_node *next = n->next;
        ccq_comm *c = ccq_container_of(n, ccq_comm, req_node);
        if (c->form_step == CCQ_FORM_IDLE) {
            ccq_comm_form_cancel(rt, c, "the runtime is shutting down");
            sched_comm_settle(rt, c, CCQ_ERR_SHUTDOWN);
        }
        n = next;
    }
    while (S->forming != NULL) {
        ccq_comm *c = S->forming;
        S->forming = c->forming_next;
        ccq_comm_form_cancel(rt, c, "the runtime shut down before it formed");
        sched_comm_settle(rt, c, CCQ_ERR_SHUTDOWN);
    }
    ccq_core_pin_fini(&S->pin); /* its index free for a runtime created later */
    ccq_trace_fence_writes();   /* the ring is read by other threads from now on */
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
    static const char *const st[] = {"QUEUED", "INCLUDED", "ISSUED", "FAILED", "DONE"};
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
        ccq_inst *i = sched_win_get(ch, ch->head);
        fprintf(stderr, " listed chan %s/%u head %llu: %s\n", buf, ch->id,
                (unsigned long long)ch->head, i ? ist[i->state] : "none");
    }
}
