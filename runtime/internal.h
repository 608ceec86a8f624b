/* Internal types of the runtime: commands, streams, communicators, the scheduler's
 * matching and batching state. Nothing here is visible through include/ccq.h. */
#ifndef CCQ_RUNTIME_INTERNAL_H
#define CCQ_RUNTIME_INTERNAL_H

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "ccq.h"
#include "common/kinds.h"
#include "queue/mpsc.h"
#include "queue/wake.h"
#include "runtime/fault.h"
#include "runtime/health/health.h"
#include "runtime/stream.h"
#include "runtime/trace/trace.h"
#include "runtime/world.h"

/* Upper bounds for configuration values (validated in ccq_runtime_create). */
#define CCQ_MAX_STREAMS_MAX 65536u
#define CCQ_QUEUE_DEPTH_MAX (1u << 20)
#define CCQ_MAX_BATCH_MAX   65536u
/* Fusion (ccq_config.fusion_bytes): the default, chosen by bench/ddp_step's sweep
 * (docs/performance.md), and the largest value accepted (a fused operation's scratch). */
#define CCQ_FUSION_BYTES_DEFAULT (1024u * 1024u)
#define CCQ_FUSION_BYTES_MAX     (1ull << 40)

/* Scheduler-side states of a command. */
enum ccq_cmd_state {
    CCQ_CMD_QUEUED,   /* in its stream FIFO, waiting for its instance and predecessors */
    CCQ_CMD_INCLUDED, /* tentatively in the batch being built */
    CCQ_CMD_ISSUED,   /* in the batch in flight for its stream */
    CCQ_CMD_FAILED,   /* failed (mismatch, timeout, abort); ends when it reaches the head */
    CCQ_CMD_DONE,     /* its operation came back before its batch (ccq_be_op.done_early):
                         ends when it reaches the head */
};

/* Communicator channels: collectives are matched per (comm, rank) sequence; each
 * direction of a send/recv pair has its own sequence (per-pair order). */
#define CCQ_CHAN_COLL  0
#define CCQ_CHAN_P2P0  1 /* devices[0] -> devices[1], or self for a one-device comm */
#define CCQ_CHAN_P2P1  2 /* devices[1] -> devices[0] */
#define CCQ_CHAN_COUNT 3

struct ccq_comm;
struct ccq_stream;
struct ccq_inst;

/*
 * A command: one rank's part of an operation. Commands live in their stream's slot ring
 * (no allocation on the submit path). Fields up to `seq` are written by the submitter
 * before the push and only read afterwards; the rest belong to the scheduler.
 */
typedef struct ccq_cmd {
    /* Cache-line aligned: neighbouring slots belong to different commands, which a
     * producer and the scheduler touch at the same time. */
    alignas(CCQ_CACHELINE) ccq_mpsc_node qnode;
    uint8_t kind;  /* ccq_kind */
    uint8_t dtype; /* ccq_dtype */
    uint8_t redop; /* ccq_reduce_op */
    uint8_t chan;  /* CCQ_CHAN_* */
    uint32_t part; /* index in the instance: rank for collectives, 0 send / 1 recv */
    uint32_t rank; /* rank of the submitting device in the communicator */
    uint32_t root; /* rooted collectives: root rank */
    ccq_device_id device;
    ccq_device_id peer; /* send/recv: the other device */
    size_t count;
    const void *src;
    void *dst;
    struct ccq_comm *comm;
    struct ccq_stream *stream;
    uint64_t submit_ns;
    uint64_t seq;
    ccq_status pre_status; /* set when the backend's submit hook failed */
    char *pre_detail;      /* its message (malloc'd by the submitter, freed by the scheduler) */
    uint32_t slot;         /* index in the ring; fixed when the ring is allocated */
    uint32_t thread;       /* submitting thread (for the event log) */
    uint64_t gw_mark;      /* GPU-side wait barriers its stream had at submission (gpu_wait.h) */
    /* ---- scheduler only ---- */
    struct ccq_cmd *fifo_next;
    struct ccq_inst *inst;
    ccq_span rd, wr;   /* memory it reads and writes (for hazard checks) */
    uint64_t trace_id; /* event-log id, assigned on arrival */
    uint64_t batch;    /* batch that issued it (0: none) */
    uint64_t fused;    /* the fused engine operation its operation ran in (CCQ_EV_FUSED id; 0) */
    uint64_t issue_ns;
    char *detail; /* failure detail (malloc'd), recorded on the stream when it ends */
    ccq_status status;
    uint8_t state;
    uint8_t cancel; /* ended by shutdown: counted as cancelled */
    /* 1 while owned by a submitter or the scheduler; 0 when the slot is free. */
    _Atomic uint32_t busy;
} ccq_cmd;

/* A per-rank submit counter on its own cache line (no false sharing between devices). */
typedef struct ccq_counter {
    alignas(CCQ_CACHELINE) _Atomic uint64_t v;
} ccq_counter;

/* Scheduler state of one channel of a communicator. */
typedef struct ccq_chan {
    struct ccq_comm *comm;
    uint8_t id;            /* CCQ_CHAN_* */
    uint32_t nparts;       /* parts that make one instance */
    uint64_t head;         /* lowest unresolved sequence number */
    uint64_t cap;          /* window size (power of two) */
    struct ccq_inst **win; /* win[seq & (cap-1)] for head <= seq < head + cap */
    uint64_t build_seq;    /* batch building: next seq to include (valid in pass build_pass) */
    uint64_t build_pass;
    uint32_t build_ops;              /* batch building: its instances in the batch (same pass) */
    uint32_t undo_ops;               /* build_ops before the current attempt */
    uint64_t attempt_seen, undo_seq; /* attempt that last moved build_seq, and it before */
    struct ccq_chan *undo_next;
    bool listed; /* in the scheduler's list of channels with work */
    struct ccq_chan *list_next;
    ccq_status late_status; /* what late parts of resolved-failed instances get */
} ccq_chan;

enum ccq_comm_state { CCQ_COMM_PENDING, CCQ_COMM_READY, CCQ_COMM_FAILED };

typedef struct ccq_comm {
    struct ccq_comm *_Atomic next; /* registry hash chain */
    uint64_t hash;
    uint32_t id;
    uint32_t n;             /* ranks, in every process */
    ccq_device_id *devices; /* sorted global ids: rank r is devices[r] */
    uint32_t first_local;   /* this process's ranks: first_local .. first_local + nlocal - 1 */
    uint32_t nlocal;
    uint32_t nprocs; /* member processes, and their world ranks (ascending) */
    uint32_t *procs;
    /* Grouping across processes (DESIGN.md): the collectives of this communicator one batch
     * (one backend group) may hold; 0 = no limit. Set at creation: the backend's
     * span_group_limit when the communicator spans processes (each process's scheduler cuts
     * its batches alone, and an engine that plans a group per communicator needs every
     * process to hand it the same collectives), else the runtime's span_batch_ops (a cap
     * by choice, backend.h), 0 for a communicator of one process. A mechanism by which the
     * member processes agree on a grouping (a rule depending only on the sequence of
     * operations, or an agreement over the engine) may raise or lift it from the scheduler
     * thread. Written before the communicator is published; scheduler only afterwards. */
    uint32_t group_limit;
    _Atomic uint32_t state; /* ccq_comm_state */
    _Atomic uint32_t aborted;
    /* A member process was lost (runtime/health/): set (release) after lost_detail, together
     * with aborted, so every path that fails an aborted communicator fails this one with
     * CCQ_ERR_PROCESS_LOST and lost_detail instead. */
    _Atomic uint32_t lost;
    char lost_detail[CCQ_DETAIL_LEN];
    _Atomic uint32_t requested; /* pushed on the scheduler's init list */
    ccq_mpsc_node req_node;
    ccq_signal ev; /* state changes */
    ccq_status init_status;
    char init_detail[CCQ_DETAIL_LEN];
    ccq_be_comm *be;
    /* Submit-side sequence counters. */
    ccq_counter *coll_seq; /* [n] */
    ccq_counter p2p_send[2], p2p_recv[2];
    /* Scheduler only. */
    ccq_chan chan[CCQ_CHAN_COUNT];
    uint64_t *coll_done; /* [n] collectives ended per rank (desync reports) */
    uint64_t p2p_done;   /* send/recv operations ended (heartbeat progress) */
    /* Formation (scheduler only): meeting the other member processes, then the backend. */
    struct ccq_comm *forming_next; /* on the scheduler's list of communicators forming */
    struct ccq_boot_xchg *xchg;    /* the exchange with the member processes, while it runs */
    uint64_t form_deadline;        /* it fails with CCQ_ERR_TIMEOUT after this */
    struct ccq_comm *shrink_from;  /* the lost communicator it may be shrunk from (comm_form.c) */
    uint64_t fusion_bytes;         /* its fusion threshold: this process's, or the smallest of its
                                      member processes' (the same in every member) */
    uint8_t form_step;             /* CCQ_FORM_* */
} ccq_comm;

/* Steps of a communicator's formation (ccq_comm.form_step). */
enum { CCQ_FORM_IDLE, CCQ_FORM_MEET, CCQ_FORM_BACKEND, CCQ_FORM_DONE };

/* Matching state of one operation instance (a collective, or a send/recv pair). */
/* CHECKING: every local part is there and they agree; the member processes are comparing
 * their signatures (ccq_config.check_signatures, runtime/sigcheck.c) before it may run. */
enum ccq_inst_state {
    CCQ_INST_WAITING,
    CCQ_INST_READY,
    CCQ_INST_FAILED,
    CCQ_INST_ISSUED,
    CCQ_INST_CHECKING
};

typedef struct ccq_inst {
    ccq_be_op op; /* the backend's view; op.parts = bparts */
    ccq_chan *chan;
    uint64_t seq;
    uint32_t present;
    uint32_t dropped; /* fault injection: parts that "arrived" absent (drop:rank=R) */
    uint8_t state;
    uint64_t attempt_seen;  /* batch attempt that tentatively included it */
    uint64_t batch_pass;    /* batch pass whose batch holds it */
    uint64_t blocked_pass;  /* batch pass in which it was found blocked */
    bool stage;             /* send/recv: the send's src is overwritten later in its batch */
    bool ended;             /* issued: its op came back and its commands took its status */
    bool cut;               /* in flight when a member process was lost: fails whatever the
                               backend says (the abort or revoke may have ended it early) */
    uint64_t refuse_pass;   /* batch pass that first found it cannot be staged (0: none) */
    ccq_status fail_status; /* when FAILED: what late parts get */
    char *fail_detail;
    struct ccq_boot_xchg *sig_xchg; /* CHECKING: the signature exchange */
    struct ccq_inst *check_next;    /* CHECKING: the scheduler's list of them */
    struct ccq_inst *wnext;         /* worklist / free list */
    ccq_cmd **cmds;                 /* [nparts] */
    ccq_be_part *bparts;            /* [nparts] */
} ccq_inst;

/* A batch in the scheduler. */
typedef struct ccq_batch {
    ccq_be_batch be; /* ops array points at `ops` */
    uint64_t issue_ns;
    uint32_t capops, capinsts;
    ccq_be_op **ops;
    ccq_inst **insts;
    ccq_stream *streams; /* streams with commands in this batch (batch_next links) */
    struct ccq_batch *next;
    bool aborting;
    bool overdue; /* past timeout_ms; the backend was asked to check its own deadlines first */
    bool big;     /* an operation of at least pin_bytes: the scheduler unpinned while it runs */
    uint32_t seen_early; /* be.ndone_early when its early completions were last taken */
} ccq_batch;

/* Comm registry: lock-free lookup, insertion under a mutex; never shrinks while live. */
#define CCQ_COMM_BUCKETS 256

typedef struct ccq_stats_atomic {
    _Atomic uint64_t completed, failed, cancelled, batches, batched_ops, max_batch_ops;
    _Atomic uint64_t hist[8];
} ccq_stats_atomic;

struct ccq_runtime {
    ccq_config cfg;
    const ccq_backend_ops *be_ops;
    ccq_backend *be;
    uint32_t ndev; /* this process's devices: global ids dev_first .. + ndev - 1 */
    uint32_t dev_first;
    uint32_t ndev_world; /* devices of every process (ccq_device_count) */
    ccq_world world;
    ccq_status span_status; /* the backend's world_ready: can it span these processes? */
    char span_detail[CCQ_DETAIL_LEN];
    uint32_t max_streams;
    uint32_t ring_size;  /* slots per stream (power of two >= queue_depth) */
    uint64_t timeout_ns; /* UINT64_MAX for none */
    uint64_t spin_ns;    /* polling budget before sleeping (cfg.spin_us) */
    /* 1 while the scheduler busy-polls an engine (a batch in flight whose backend asks to be
     * polled back to back: the host backend's UCX engine). Fence waiters then sleep at once
     * instead of spinning spin_us: on a machine with fewer cores than busy threads a spinning
     * waiter takes the core from the thread that must progress the work it waits for.
     * Written by the scheduler only (relaxed: a stale value only costs a spin or a sleep). */
    _Atomic uint32_t engine_polling;
    bool fence_spin_always; /* CCQ_FENCE_SPIN=1: spin anyway (measurements) */
    /* A world of several processes, and this host's do not outnumber the cores they may run
     * on (ccq_world.crowded, set once the world formed): where the scheduler's hand-off yield
     * and the batch cut below pay. */
    bool procs_fit_cores;
    /* ccq_backend_ops.span_batch_ops where procs_fit_cores (else 0 = no cap), or
     * CCQ_SPAN_BATCH_OPS: the group_limit of communicators spanning processes on a backend
     * whose span_group_limit is 0. */
    uint32_t span_batch_ops;
    /* Whether the scheduler takes a core of its own (ccq_core_pin): where this host's
     * processes outnumber their cores (CCQ_SCHED_PIN=1, the default), always (2), never (0),
     * and never where its scheduler calls MPI; pin_home is its process's core among the
     * host's (ccq_world_home_core; -1: its first). A batch with an operation of pin_bytes or
     * more (CCQ_SCHED_PIN_BYTES) unpins it until the next batch without one
     * (sched_batch.c). */
    bool pin;
    int pin_home;
    uint64_t pin_bytes;
#define CCQ_SCHED_PIN_BYTES_DEFAULT (1ull << 20)
    ccq_fault_plan fault; /* fault injection (cfg.fault); the runtime applies `drop` */
    ccq_stream *streams;  /* [ndev * max_streams] */

    /* Wake-up of the scheduler, and its inputs besides the stream queues. */
    ccq_wake wake;
    ccq_mpsc new_streams; /* streams used for the first time (ring allocated) */
    ccq_mpsc comm_reqs;   /* communicators to create in the backend */
    _Atomic uint32_t closing;

    /* Communicators. */
    pthread_mutex_t comm_lock; /* serialises registry insertion */
    /* Streams ever bound to a CUDA stream (runtime/gpu_wait.c): pushed under bound_lock,
     * read by any thread. */
    pthread_mutex_t bound_lock;
    ccq_stream *_Atomic bound_head;
    ccq_comm *_Atomic buckets[CCQ_COMM_BUCKETS];
    ccq_comm **comms; /* by id; scheduler reads entries < ncomms */
    _Atomic uint32_t ncomms;
    uint32_t comms_cap;

    /* Scheduler thread. */
    pthread_t thread;
    bool thread_started;
    _Atomic uint32_t sched_exited;
    ccq_signal exit_ev;
    pthread_mutex_t shutdown_lock;

    ccq_stats_atomic stats;
    ccq_trace trace;    /* flight recorder and metrics */
    ccq_health *health; /* job health (runtime/health/); NULL in a world of one */

    /* Scheduler-only state. */
    struct ccq_sched *sched;
};

/* ---- runtime/util.c ---- */
/* aligned_alloc(CCQ_CACHELINE, size rounded up to a whole cache line), as C11 requires. */
void *ccq_alloc_lines(size_t size);
void ccq_set_detail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
ccq_status ccq_fail(ccq_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ccq_clear_detail(void);
/* End a text cut to fit buf[len] with CCQ_TRUNCATED, so the cut is visible. */
#define CCQ_TRUNCATED "... [truncated]"
void ccq_mark_truncated(char *buf, size_t len);
size_t ccq_format(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
size_t ccq_describe_cmd(char *buf, size_t len, const ccq_cmd *c);
size_t ccq_describe_comm(char *buf, size_t len, const ccq_comm *comm);

/* ---- runtime/comm.c ---- */
ccq_comm *ccq_comm_lookup(ccq_runtime *rt, const ccq_device_id *sorted, uint32_t n);
ccq_status ccq_comm_get_or_create(ccq_runtime *rt, const ccq_device_id *sorted, uint32_t n,
                                  ccq_comm **out);
void ccq_comm_request_init(ccq_runtime *rt, ccq_comm *comm);
void ccq_comm_free_all(ccq_runtime *rt);

/* ---- runtime/sigcheck.c (scheduler thread) ---- */
/* Start comparing an instance's signature with the communicator's other member processes
 * (CCQ_OK: posted; an error: the check could not start, detail in *why). */
ccq_status ccq_sig_post(ccq_runtime *rt, struct ccq_inst *i, char *why, size_t len);
/* CCQ_IN_PROGRESS; CCQ_OK (every process agrees); CCQ_ERR_MISMATCH or another error with
 * the detail in why. Frees the exchange when it returns anything but CCQ_IN_PROGRESS. */
ccq_status ccq_sig_test(ccq_runtime *rt, struct ccq_inst *i, char *why, size_t len);
void ccq_sig_cancel(struct ccq_inst *i);
/* The member processes not heard from yet, as "processes 1,3", into buf. */
void ccq_sig_missing(struct ccq_inst *i, char *buf, size_t len);

/* ---- runtime/comm_form.c (scheduler thread) ---- */
/* Start forming a communicator: CCQ_OK when ready, CCQ_IN_PROGRESS when
 * ccq_comm_form_test must be polled until it is not, or an error (init_status and
 * init_detail say why). */
ccq_status ccq_comm_form_start(ccq_runtime *rt, ccq_comm *c, uint64_t now);
ccq_status ccq_comm_form_test(ccq_runtime *rt, ccq_comm *c, uint64_t now);
/* The name every member process gives the communicator in bootstrap exchanges. */
void ccq_comm_tag(const ccq_comm *c, char *tag, size_t len);
/* Stop forming it (shutdown): it ends failed with CCQ_ERR_SHUTDOWN. */
void ccq_comm_form_cancel(ccq_runtime *rt, ccq_comm *c, const char *why);

/* ---- runtime/sched.c ---- */
ccq_status ccq_sched_create(ccq_runtime *rt);
void ccq_sched_destroy(ccq_runtime *rt);
void *ccq_sched_main(void *arg);

/* ---- runtime/trace/recorder.c ---- */
ccq_status ccq_trace_write_file(ccq_runtime *rt, const char *path);
/* Write trace_file now if one is configured (reason: "destroy", "error", ...). */
void ccq_trace_autodump(ccq_runtime *rt, const char *reason);

/* Set while the calling thread is ccq's scheduler (of any runtime) or runs an event
 * callback (scheduler or fencing thread). A call that would wait for a scheduler there
 * (the callback contract forbids them) fails at once instead of hanging: one thread-local
 * load, on other threads too. */
enum { CCQ_INSIDE_SCHED = 1u, CCQ_INSIDE_CALLBACK = 2u };
extern _Thread_local uint32_t ccq_tls_inside;
/* CCQ_OK outside; else CCQ_ERR_INVALID_ARGUMENT with a detail naming fn and why. */
ccq_status ccq_refuse_inside(const char *fn);

static inline bool ccq_in_scheduler(const ccq_runtime *rt)
{
    return rt->thread_started && pthread_equal(pthread_self(), rt->thread);
}

/* ---- runtime/runtime.c ---- */
ccq_status ccq_runtime_create_with(const ccq_config *cfg, const ccq_backend_ops *ops,
                                   ccq_runtime **out);

/* The stream (device, id) of this process. */
/* The stream (global device d, s), d one of this process's (ccq_check_stream checked it). */
static inline ccq_stream *ccq_stream_at(ccq_runtime *rt, ccq_device_id d, ccq_stream_id s)
{
    return &rt->streams[(size_t)(d - rt->dev_first) * rt->max_streams + s];
}

/* Whether global device d is one of this process's (one subtraction, one compare). */
static inline bool ccq_is_local(const ccq_runtime *rt, ccq_device_id d)
{
    return d - rt->dev_first < rt->ndev;
}

/* The submit path's stream calls (runtime/stream.c has the slow paths): inline, so that a
 * submission with room on a stream already in use costs no call. */
static inline ccq_status ccq_check_stream(const ccq_runtime *rt, const char *fn,
                                          ccq_device_id device, ccq_stream_id stream)
{
    if (ccq_is_local(rt, device) && stream < rt->max_streams)
        return CCQ_OK;
    return ccq_check_stream_slow(rt, fn, device, stream);
}

static inline ccq_cmd *ccq_stream_ring(ccq_runtime *rt, ccq_stream *s)
{
    ccq_cmd *ring = atomic_load_explicit(&s->ring, memory_order_acquire);
    return ring != NULL ? ring : ccq_stream_ring_alloc(rt, s);
}

/* Reserve a ticket (a slot): one CAS when there is room and no race; else the slow path
 * (retry, wait for room, or refuse). */
static inline ccq_status ccq_stream_reserve(ccq_runtime *rt, ccq_stream *s, const char *fn,
                                            uint64_t *out)
{
    uint64_t t = atomic_load_explicit(&s->tickets, memory_order_relaxed);
    uint64_t e = atomic_load_explicit(&s->ended, memory_order_acquire);
    if (!(t & CCQ_TICKET_CLOSED) && t - e < rt->cfg.queue_depth &&
        atomic_compare_exchange_strong_explicit(&s->tickets, &t, t + 1, memory_order_acq_rel,
                                                memory_order_relaxed)) {
        *out = t;
        return CCQ_OK;
    }
    return ccq_stream_reserve_slow(rt, s, fn, out);
}

/* The backend's device (its local index) of this process's global device d. */
static inline ccq_device_id ccq_backend_device(const ccq_runtime *rt, ccq_device_id d)
{
    return d - rt->dev_first;
}

#endif /* CCQ_RUNTIME_INTERNAL_H */
