/* The scheduler's private state and the functions its phases share (runtime/sched*.c only). */
#ifndef CCQ_RUNTIME_SCHED_H
#define CCQ_RUNTIME_SCHED_H

#include "common/cores.h"
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
    uint64_t next_fused;  /* event-log ids of fused engine operations (CCQ_EV_FUSED) */
    bool error_seen;      /* a command failed this pass (automatic trace dumps) */
    ccq_stream *held;     /* streams whose failures wait for the dump (held_next links) */
    uint64_t dump_after;  /* when the next dump of held failures may be written */
    ccq_batch *batch_free;
    ccq_batch *inflight; /* batches issued and not returned (next links) */
    uint32_t ninflight;
    ccq_core_pin pin;      /* this thread's own core while crowded (rt->pin, rt->pin_home) */
    uint32_t big_inflight; /* batches in flight with an operation of pin_bytes or more */
    bool ended_pass;       /* commands ended since the scheduler last went idle (ccq_sched_main) */
    ccq_be_batch *done;    /* completions polled but not processed yet */
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
    bool cut;                 /* this pass left ready work out that another batch can take
                                 now (a communicator's group_limit): build it at once */
    bool refuse_retry;        /* a refusal was deferred or made: loop again without sleeping */
    uint64_t wd_next;         /* earliest watchdog deadline (UINT64_MAX: none) */
    /* While a bootstrap exchange runs (forming, checking): the next idle sleep's length. It
     * starts at the bootstrap's own poll interval after any progress and doubles up to
     * CCQ_FORM_POLL_NS, so a meeting that completes at once is seen at once, and one that
     * waits for a late process costs a wake-up per millisecond. */
    uint64_t boot_poll_ns, boot_poll_min_ns;
    /* Shutdown. */
    bool closing, cancelled_incomplete, shutdown_aborted;
    uint64_t close_ns;
    /* Counters (published to rt->stats). */
    uint64_t completed, failed, cancelled;
} ccq_sched;

/* The longest wait between two dumps of failures (see ccq_sched_main). */
#define CCQ_DUMP_GAP_MAX_NS 1000000000ull

/* How often, at the least, communicators that are forming (and signature checks) are polled
 * while the scheduler is otherwise idle; from the bootstrap's own interval up to this. */
#define CCQ_FORM_POLL_NS 1000000u

static inline uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

#define XGROW(arrp, capp, need)                                                                    \
    do {                                                                                           \
        if (!sched_grow((arrp), (capp), (need)))                                                   \
            sched_xgrow_fail();                                                                    \
    } while (0)

/* sched.c */
/* Grow a pointer array to hold at least `need` entries (false: out of memory). */
bool sched_grow(void *arrp, uint32_t *cap, uint32_t need);
/* The scheduler must not fail on memory in the middle of a pass: out of memory on its small
 * internal arrays is fatal, like an assertion. */
__attribute__((noreturn)) void sched_xgrow_fail(void);
char *sched_xstrdup(const char *s);
void sched_ev_cmd(ccq_runtime *rt, uint32_t type, const ccq_cmd *c, uint64_t t, ccq_status st);
void sched_ev_misc(ccq_runtime *rt, uint64_t t, uint32_t type, uint64_t id, uint32_t comm,
                   uint64_t seq, uint64_t count, uint64_t extra, ccq_status st);
void sched_fail_cmd(ccq_cmd *c, ccq_status st, const char *reason, bool cancel);
void sched_fail_inst(ccq_sched *S, ccq_inst *i, ccq_status st, const char *reason, bool cancel);
void sched_set_detail(ccq_cmd *c, const char *reason);
/* sched_match.c */
void sched_arrive(ccq_runtime *rt, ccq_cmd *c);
void sched_chan_advance(ccq_sched *S, ccq_chan *ch);
bool sched_checks_progress(ccq_runtime *rt);
void sched_comm_settle(ccq_runtime *rt, ccq_comm *c, ccq_status st);
bool sched_comms_progress(ccq_runtime *rt, uint64_t now);
bool sched_drain(ccq_runtime *rt);
bool sched_field_differs(const ccq_cmd *a, const ccq_cmd *b, int f);
void sched_inst_release(ccq_sched *S, ccq_inst *i);
ccq_inst *sched_win_get(ccq_chan *ch, uint64_t seq);
/* sched_complete.c */
void sched_batch_done(ccq_runtime *rt, ccq_batch *b);
void sched_batch_release(ccq_sched *S, ccq_batch *b);
bool sched_end_failed_heads(ccq_runtime *rt);
/* n more commands of s ended: publish them (held back while a failure of s waits for the
 * dump). */
void sched_publish_ended(ccq_runtime *rt, ccq_stream *s, uint64_t n);
/* The dump's reason for the held failures: "process_lost" if one is a loss, else "error". */
const char *sched_held_reason(ccq_runtime *rt);
/* After the dump: publish the held failures and what ended with them. */
void sched_release_held(ccq_runtime *rt);
bool sched_reap(ccq_runtime *rt);
/* sched_batch.c */
bool sched_build_and_issue(ccq_runtime *rt);
/* sched_watchdog.c */
void sched_abort_batch(ccq_runtime *rt, ccq_batch *b, const char *why);
void sched_abort_comm(ccq_runtime *rt, ccq_comm *comm, const char *why);
/* A member process of comm was lost (runtime/health/): fail everything on it with
 * CCQ_ERR_PROCESS_LOST and `why`, now and later. */
void sched_lose_comm(ccq_runtime *rt, ccq_comm *comm, const char *why);
bool sched_watchdog(ccq_runtime *rt, uint64_t now);

#endif /* CCQ_RUNTIME_SCHED_H */
