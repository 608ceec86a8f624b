/* The host backend's UCX engine, private parts shared by its files: the engine (one UCP
 * context and worker per runtime), a communicator's engine side, an operation in flight
 * (the generic task every algorithm's state machine embeds), the message header every
 * message carries, and the helpers the algorithms send and receive with. Only the files of
 * backends/host/ucx/ include this (and so ucp.h). docs/multiprocess-host.md describes the
 * engine for users.
 *
 * Threads: everything here runs on the runtime's scheduler thread (the host backend calls the
 * engine from it only), except create and world_blob/world_ready, which run on the thread
 * creating the runtime before the scheduler starts (pthread_create orders them before). The
 * worker is UCS_THREAD_MODE_SINGLE: nothing locks. */
#ifndef CCQ_HOST_UCX_H
#define CCQ_HOST_UCX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "backends/host/engine.h"
#include "backends/host/scratch_pool.h"
#include "common/cores.h"

/* ---- the message header ---------------------------------------------------------------- */

/* Every message is one UCP active message whose user header is this. The receiver checks it
 * against its own operation before it touches the payload: another kind, dtype, op, root or
 * count fails the operation with CCQ_ERR_MISMATCH on every member (notices below). */
#define UCX_MAGIC   0x58554343u /* "CCUX" */
#define UCX_VERSION 4u          /* 4: PING and PONG (ucx/probe.c) */
#define UCX_AM_ID   0x3c        /* ccq's active message id on its own worker */
/* The same messages sent on the single-copy endpoint (ucx_peer.bulk): the id tells the receiver
 * which endpoint a payload came on (ucx_msg.bulk), whatever its own threshold is. */
#define UCX_AM_ID_BULK 0x3d

enum {
    UCX_MSG_DATA = 0,   /* a step of an operation's schedule */
    UCX_MSG_NOTICE = 1, /* "this operation failed": payload = the detail, every member fails */
    UCX_MSG_BYE = 2,    /* "this process destroys its runtime": seq = how many messages it sent
                           the receiver before this one (ucx_destroy; ucx_peer.left) */
    UCX_MSG_PING = 3,   /* "can you hear me": seq = the probe's number (ucx/probe.c) */
    UCX_MSG_PONG = 4,   /* the answer: seq = the PING's */
};

typedef struct ucx_hdr {
    uint32_t magic;
    uint16_t version;
    uint8_t type;  /* UCX_MSG_* */
    uint8_t kind;  /* ccq_kind (send/recv halves: CCQ_KIND_SEND) */
    uint64_t comm; /* the communicator's id, the same in every member (its root blob) */
    uint64_t seq;  /* the operation's position in its channel */
    uint32_t chan; /* 0: collectives; 1 + r: sends of comm rank r (a pair's direction) */
    uint32_t src;  /* the sender's index among the member processes */
    uint32_t root; /* rooted kinds: the root's rank; else 0 */
    uint32_t step; /* which message of the schedule (unique per (src, step) in an operation) */
    uint64_t count;
    uint8_t dtype;
    uint8_t redop;   /* reducing kinds; else 0 */
    uint16_t status; /* NOTICE: -ccq_status of the failure */
    uint32_t wsrc;   /* the sender's world rank */
    /* Fusion (ucx/fused.c): the fewest operations, among the members the sender heard from in
     * this engine operation (itself included), that follow it in their start_run; and what the
     * engine operation runs: nops operations (1: unfused; else a fused group starting at seq,
     * shape a hash of their counts, count their sum). */
    uint32_t follow;
    uint32_t nops;
    uint64_t shape;
    /* What the sender made of the collectives before this one (channel 0; ucx/prior.c): every
     * one below sequence prior_upto ended there (0: nothing to compare), and prior_sum sums
     * ucx_prior_mix of those it failed alone over a disagreement. */
    uint64_t prior_upto, prior_sum;
} ucx_hdr;

/* ---- arrivals: messages received, not consumed yet ------------------------------------- */

enum { MSG_EAGER, MSG_RNDV, MSG_LANDING, MSG_READY };

typedef struct ucx_msg {
    struct ucx_msg *next;
    ucx_hdr hdr;
    size_t len;    /* payload bytes */
    void *data;    /* MSG_EAGER: the payload (UCX's persistent data); MSG_RNDV: UCX's desc */
    void *req;     /* MSG_LANDING: the rendezvous receive */
    void *buf;     /* MSG_READY: where the payload is readable */
    uint8_t state; /* MSG_* */
    bool ucx_data; /* data is UCX's: release it with ucp_am_data_release */
    bool bulk;     /* it came on the single-copy endpoint (UCX_AM_ID_BULK) */
    uint32_t wsrc; /* the sender's world rank (hdr.wsrc, checked) */
} ucx_msg;

/* The settings that choose a schedule (ucx/select.c): every member of a communicator must run
 * the same one for an operation, so each process says its own in the world's meeting
 * (ucx_blob_tail) and a communicator runs the largest of its members' (ucx_comm.knobs).
 * Before 2026-12-07 each process used its own: a process with another CCQ_UCX_RING_BYTES or
 * CCQ_UCX_DIRECT_AR_BYTES than the others hung with them until their deadline. */
typedef struct ucx_knobs {
    uint64_t ring_bytes;      /* all_reduce: recursive doubling up to it, the ring above */
    uint64_t direct_ar_bytes; /* all_reduce: the direct schedule up to it (0: never) */
    uint64_t seg_bytes;       /* the pipelined schedules' segment */
} ucx_knobs;

/* How the mapped all_reduce copies its inputs into its slots: plain or streaming stores, by
 * what each costs this process (ucx/store_pick.c). */
typedef struct ucx_store_pick {
    int fixed;        /* -1: by the costs; 0 plain, 1 streaming (CCQ_UCX_MAPPED_STREAM) */
    uint64_t cost[2]; /* CPU ns per MiB of plain [0] and streaming [1] stores (0: not yet) */
    uint32_t timed;   /* copies timed so far */
} ucx_store_pick;

/* Copies of fewer bytes are not timed (their clock reads would weigh). */
#define UCX_PICK_MIN_BYTES (256u * 1024u)

/* The way the next copy of `bytes` goes (true: streaming) and whether to time it (*timed; then
 * ucx_store_pick_note its CPU time). */
bool ucx_store_pick_next(ucx_store_pick *k, size_t bytes, bool *timed);
void ucx_store_pick_note(ucx_store_pick *k, bool streamed, uint64_t cpu_ns, size_t bytes);
/* The way chosen now, without counting a copy. */
bool ucx_store_pick_streamed(const ucx_store_pick *k);

/* ---- mapped scratch (ucx/mapped.c) ----------------------------------------------------- */

/* This process's region of mapped scratch: lent to one operation at a time (ucx_op.region). */
typedef struct ucx_region {
    struct ucx_region *next; /* the engine's free list */
    ucp_mem_h mh;
    char *base;
    size_t len;
    uint32_t id;     /* this process's own numbering: a peer caches its view by (rank, id) */
    void *rkey;      /* packed (ucp_rkey_pack) */
    size_t rkey_len; /* at most UCX_MAP_RKEY_MAX */
} ucx_region;

/* What a mapped message says of the sender's region (its payload, ucx/allreduce_mapped.c). */
#define UCX_MAP_RKEY_MAX 192u
typedef struct ucx_map_msg {
    uint32_t id, rkey_len;
    uint64_t base; /* the region's address in its owner (ucp_rkey_ptr's) */
    uint64_t len;  /* its bytes */
    uint64_t slot; /* where the step's bytes are (bytes from base) */
    /* How many there are in the sender's schedule: the reader's must be as many (a member
     * that cut other segments, as one with its own CCQ_UCX_SEG_BYTES did before ucx_knobs,
     * would read the wrong bytes). */
    uint64_t bytes;
    unsigned char rkey[UCX_MAP_RKEY_MAX];
} ucx_map_msg;

/* Which processes can read each other's regions. UCX's shared-memory transports reach a
 * peer only on the same machine (UCX's system id: the kernel's boot id) and, from inside
 * containers, in the same IPC namespace (SysV segments, and UCX's own reachability rule for
 * its shared memory); POSIX segments need the same PID namespace too (they are opened
 * through /proc/PID/fd where UCX_POSIX_USE_PROC_LINK, its default). Two containers of one machine
 * (Docker's default, a Kubernetes pod each) share the boot id and nothing else: UCX talks TCP
 * between them, and a region of one cannot be read by the other. Namespaces are the inode
 * numbers of /proc/self/ns/{ipc,pid} (0 where /proc has none). And a region is of one kind
 * (alloc_kind: UCX_SHM_SYSV or UCX_SHM_POSIX; 0: UCX made it of memory no other process can
 * map, so this one does not map) that a reader's UCX must have (read_kinds): UCX_TLS=posix in
 * one process and the default (SysV first) in another is a pair that cannot read both ways. */
enum { UCX_SHM_SYSV = 1, UCX_SHM_POSIX = 2 };
typedef struct ucx_shm_scope {
    uint64_t system_id, ipc_ns, pid_ns;
    uint32_t alloc_kind, read_kinds;
} ucx_shm_scope;

/* A peer's region as this process reads it: attached once, kept while operations use it
 * (refs) and, unused, until PEER_MAPS_KEPT newer ones push it out (ucx/mapped.c). */
typedef struct ucx_peer_map {
    uint32_t wrank, id, refs;
    ucp_rkey_h rkey;
    char *local; /* the region's base here */
    uint64_t used;
} ucx_peer_map;

/* ---- the engine ------------------------------------------------------------------------ */

typedef struct ucx_engine ucx_engine;
typedef struct ucx_comm ucx_comm;
typedef struct ucx_op ucx_op;

/* A peer process of the world: its endpoint, created on first use (comm_create). */
typedef struct ucx_peer {
    ucp_ep_h ep;
    /* Large payloads only (ucx_engine.bulk_bytes): an endpoint without peer error handling,
     * so that UCX may use its single-copy transport (CMA), which it refuses under peer error
     * handling (docs/multiprocess-host.md, "Large messages"). Failures are still seen on ep
     * (keepalive, the same peer), and on this one through the same error callback. Made with
     * ep by every communicator that has the peer (ucx_comm_create), so that both processes make
     * it in the same order and UCX pairs them. */
    ucp_ep_h bulk;
    const void *addr; /* its worker address (a copy held by the engine) */
    size_t addr_len;
    /* From its world blob (ucx_blob_tail): the mapped all_reduce's threshold there (0: it
     * cannot or will not map), whose shared memory it can read (machine and namespaces), and
     * its schedule settings. */
    uint64_t map_bytes;
    ucx_shm_scope scope;
    ucx_knobs knobs;
    ucs_status_t failed; /* UCS_OK, or what UCX's error callback said about it */
    uint64_t failed_ns;  /* when the error callback said it */
    bool reported;       /* told to the runtime (base.peer_failed) */
    /* A peer that destroyed its runtime cleanly said goodbye (UCX_MSG_BYE) with the number of
     * messages it sent here: once that many arrived, nothing more will come from it, and the
     * error its closed connection raises is no failure of work that already has its messages
     * (ucx_peer_left). sent and got count ccq's messages (data and notices) each way. */
    bool left;
    uint64_t sent, got, bye_count;
    struct ucx_peer_err *cb_arg;
    /* Probes (ucx/probe.c): this process's last PING to it (number, when sent: 0 = answered or
     * none) and when the last answer came; the PONG it is owed (0: none); whether this process
     * told job health it suspects it; and the two messages' headers and requests (UCX reads a
     * header until its send completes). */
    uint64_t ping_seq, ping_ns, pong_ns, pong_owed;
    bool suspected;
    ucx_hdr ping_hdr, pong_hdr;
    void *ping_req, *pong_req;
} ucx_peer;

/* The error callback's argument: which peer (the engine may move its peer array). */
typedef struct ucx_peer_err {
    ucx_engine *e;
    uint32_t rank;
} ucx_peer_err;

struct ucx_engine {
    ccq_host_engine base;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr; /* this worker's address (world_blob) */
    size_t addr_len;
    uint32_t world_rank, world_size;
    ucx_peer *peers;      /* [world_size] */
    unsigned char *addrs; /* every process's address bytes (peers point into it) */
    uint64_t timeout_ns;  /* cfg->timeout_ms (UINT64_MAX: none) */
    uint32_t comms_made;  /* communicator ids this process handed out as lowest member */
    ucx_comm *comms;      /* live communicators */
    ucx_msg *orphans;     /* messages of communicators not formed here yet */
    size_t norphans, orphan_bytes, orphans_dropped;
    uint64_t gone[256]; /* ids of destroyed communicators (their late messages are dropped) */
    uint32_t ngone;
    ucx_op *background; /* ended operations whose messages UCX still holds */
    uint32_t nbackground;
    uint32_t nmoving;      /* ...of which have sends still to leave (up to timeout_ms): they need
                              progress; the others only wait to be freed */
    uint32_t inflight;     /* operations started and not ended */
    bool connected;        /* an endpoint to a peer was created: idle, poll now and then */
    uint64_t idle_poll_ns; /* idle: no progress before this (ucx_reap, UCX_IDLE_POLL_NS) */
    uint64_t dropped;      /* messages discarded (aborted comm, failed op, malformed) */
    /* Arrivals and starts, counted (no clock read each: ucx_poll_interval stamps the time it
     * first sees the count move, once per scheduler pass), and when the count last moved. */
    uint64_t activity, activity_seen;
    uint64_t last_activity_ns;
    ucx_knobs knobs;       /* this process's (ucx/select.c) */
    size_t stream_bytes;   /* outputs by streaming stores from (ucx/select.c) */
    ucx_store_pick map_in; /* the mapped all_reduce's copy into its slots (ucx/store_pick.c) */
    bool fused_in_place;   /* fused ring inputs read in place (ucx/select.c) */
    size_t bulk_bytes;     /* payloads of at least this go on ucx_peer.bulk */
    bool bulk_auto;        /* bulk_bytes is the default (no CCQ_UCX_BULK_BYTES) */
    bool unstack_on;       /* CCQ_UCX_UNSTACK (default 1) */
    uint32_t idle_polls;   /* progress calls in a row that moved nothing */
    uint32_t yield_mask;   /* ...of which every (yield_mask + 1)th yields */
    ccq_unstack unstack;   /* ...timed: off a core shared with another poller */
    uint32_t peers_failed, peers_seen; /* peer errors so far, and those check_peers handled */
    /* Probes (ucx/probe.c): how long a PING may go unanswered while an operation waits for its
     * peer (0: no probes), whether a poll found nothing arriving for UCX_BUSY_NS (late: the
     * scheduler polls calmly, and probes), and whether some PONG is owed. */
    uint64_t probe_wait_ns;
    bool late;
    bool pongs_owed;
    ucx_msg *free_msgs;    /* recycled arrival records */
    ccq_scratch_pool pool; /* scratch kept for reuse */
    ucp_request_param_t send_param;
    /* The same, forcing UCX's eager protocol: payloads below eager_bytes on the copying
     * endpoint (ucx/select.c, EAGER_BYTES). */
    ucp_request_param_t send_eager;
    size_t eager_bytes;
    /* Mapped scratch (ucx/mapped.c): this process's threshold for the mapped all_reduce
     * (CCQ_UCX_MAPPED_BYTES; 0: off, or UCX cannot map here), its free regions, and the peers'
     * regions it reads. */
    uint64_t map_bytes;
    ucx_shm_scope scope; /* this process's (ucx_shm_scope_here) */
    /* Its shared-memory FIFO elements, SysV and POSIX (0: no shared memory selected): the
     * processes of a machine must agree (ucx_world_ready). */
    uint32_t fifo_elem[2];
    ucx_region *regions;
    uint32_t nregions, region_ids;
    ucx_peer_map *maps;
    uint32_t nmaps, maps_cap;
    uint64_t map_clock;
    ucx_hdr *bye;   /* goodbyes UCX had not sent when destroy closed the endpoints */
    char note[160]; /* how the engine was set up (transports, keepalive), for details */
};

/* ---- a communicator -------------------------------------------------------------------- */

/* What an operation that succeeded here was (its header fields), kept for a late message
 * of it: when every member only sends (two processes that both believe they are a
 * broadcast's root), a disagreement shows only in a message that arrives after the
 * operation ended here. */
#define UCX_ENDED 16u
/* Collectives that ended out of order above ucx_comm.prior_upto that ucx/prior.c marks (one
 * ending further above stops the comparison on that communicator), and the sums below the last
 * sequences it keeps (a message whose sender had ended fewer is not compared). */
#define UCX_PRIOR_SLOTS 1024u
#define UCX_PRIOR_HIST  64u
/* Buckets of ucx_comm.by_seq and ucx_comm.early (a power of two), and the bucket of a
 * channel's sequence number. */
#define UCX_OP_BUCKETS 64u
static inline uint32_t ucx_seq_bucket(uint32_t chan, uint64_t seq)
{
    return (uint32_t)(seq * 3u + chan) & (UCX_OP_BUCKETS - 1u);
}
typedef struct ucx_ended {
    uint64_t seq, count, shape; /* seq + 1: 0 = empty slot */
    uint32_t root, nops;
    uint8_t kind, dtype, redop;
} ucx_ended;

struct ucx_comm {
    ucx_comm *next;
    ucx_engine *e;
    uint64_t id;
    uint32_t nprocs, me; /* member processes; this process's index */
    uint32_t *procs;     /* [nprocs] world ranks */
    uint32_t *fr;        /* [nprocs + 1] first rank of each member process */
    uint32_t nranks;
    /* Messages of operations not started here yet, nearly of them, in buckets as by_seq
     * (each newest first): an operation that starts takes its own from one bucket. */
    ucx_msg *early[UCX_OP_BUCKETS];
    uint32_t nearly;
    uint64_t next_seq[3]; /* per channel (0, 1, 2): operations started so far */
    /* The last UCX_ENDED operations that succeeded here, per channel (slot seq %
     * UCX_ENDED): what a late message of one of them is compared with (ucx_comm_ended). */
    ucx_ended ended[3][UCX_ENDED];
    ucx_op *ops; /* operations in flight on it, newest first */
    /* ...and the same operations by channel and sequence (ucx_comm_find): an arrival finds its
     * operation in a bucket, not by walking every operation in flight (hundreds when a batch
     * of independent operations is launched at once). */
    ucx_op *by_seq[UCX_OP_BUCKETS];
    ccq_status failed;  /* CCQ_OK, or why it can no longer be used (sticky) */
    bool failed_remote; /* ...as a member told this process */
    /* ...and some members may not know: they failed the operation at (untold_chan, untold_seq)
     * alone and went on, where it had completed here (late_notice, late_check). The next
     * operation that starts or is tested here tells them (ucx_comm_tell). */
    bool failed_untold;
    uint32_t untold_chan;
    uint64_t untold_seq;
    char failed_detail[CCQ_DETAIL_LEN];
    /* What this process made of its collectives (channel 0), stamped on its messages and
     * compared with the members' (ucx/prior.c): every collective below prior_upto ended here,
     * prior_sum sums ucx_prior_mix of those that failed alone over a disagreement, and
     * prior_hist[k % UCX_PRIOR_HIST] = {k, that sum below k} for the last sequences it passed.
     * prior_slot[seq % UCX_PRIOR_SLOTS] marks a collective that ended above prior_upto
     * ((seq + 1) << 1 | failed alone); prior_off: one ended too far above to be marked, and
     * this communicator stamps and compares nothing more. */
    uint64_t prior_upto, prior_sum;
    bool prior_off;
    uint64_t prior_hist[UCX_PRIOR_HIST][2];
    uint64_t prior_slot[UCX_PRIOR_SLOTS];
    uint32_t refs; /* 1 for the communicator + operations still referring to it */
    bool destroyed;
    /* Fusion (ucx/fused.c). The collectives start_run gave and that are not decided yet, in
     * sequence order (pq[pq_head .. pq_head + pq_n - 1] modulo pq_cap); the agreed window:
     * the operation at agree_seq opens the next one, agree_w long once known (agree_unit, the
     * engine operation whose end tells it, NULL). */
    /* The mapped all_reduce from this many bytes (ucx/allreduce_mapped.c): every member on one
     * machine and able to map, the largest of their thresholds; 0: never. */
    uint64_t map_bytes;
    ucx_knobs knobs;       /* the largest of the members' (ucx_knobs) */
    uint64_t fusion_bytes; /* 0: start_run never fuses */
    struct ucx_pend *pq;
    uint32_t pq_head, pq_n, pq_cap;
    uint64_t agree_seq;
    uint32_t agree_w;
    ucx_op *agree_unit;
};

/* A collective start_run gave, not decided yet: o waits (NULL once it ended: it was started
 * at once, alone, as one that can never fuse). */
typedef struct ucx_pend {
    uint64_t seq;
    ucx_op *o;
} ucx_pend;

/* A fused group (ucx/fused.c): its first operation (the head) runs one recursive doubling
 * over the parts' combined inputs, laid end to end in its scratch, and writes every part's
 * outputs; the others (members) end with what it ended with. */
typedef struct ucx_fused {
    uint32_t n, refs;
    ccq_status status; /* CCQ_IN_PROGRESS while the head runs */
    bool op_only;      /* its failure is the group's alone (ucx_op.op_only) */
    bool abandoned;    /* the head was given up: the members wait for their own deadline */
    ucx_op *head;      /* NULL once it ended */
    ccq_errbuf detail; /* its failure, or what it waited for when given up */
    struct {
        ccq_be_op *op; /* NULL once that part was given up */
        size_t count;
    } part[];
} ucx_fused;

/* ---- an operation: the generic task -------------------------------------------------- */

/* A message this operation sent, kept until UCX let go of it (the header too: UCX may read
 * it until then). */
typedef struct ucx_send {
    struct ucx_send *next;
    void *req;
    ucx_hdr hdr;
    uint32_t dst; /* member index */
    uint32_t tag; /* the schedule's grouping (a segment), for ucx_sends_done */
    char *copy;   /* a payload the send owns (notices) */
} ucx_send;

typedef struct ucx_alg {
    const char *name;
    /* Build the schedule after the local combine (o->res holds this process's buffer). */
    ccq_status (*init)(ucx_op *o, ccq_errbuf *err);
    /* Move as far as possible without blocking: CCQ_OK when this process's part is done
     * (finish() then writes the local outputs), CCQ_IN_PROGRESS, or an error. */
    ccq_status (*advance)(ucx_op *o, ccq_errbuf *err);
} ucx_alg;

/* Per-segment state of the pipelined schedules (ring, trees). */
typedef struct ucx_seg {
    uint32_t step; /* the next step of this segment */
    uint8_t sent;  /* this step's send is posted */
    uint8_t done;
    uint32_t combined; /* parts_lazy: steps whose blocks are combined (ucx/allreduce_ring.c) */
} ucx_seg;

/* Buffers of an operation: engine scratch, the only memory UCX reads or writes. User buffers
 * are read at start and written at finish by ccq's thread, except the ring all_reduce's
 * (ucx_op.own, .out), which this thread reads and writes as the schedule goes. */
enum { BUF_RES, BUF_TMP, BUF_AUX, BUF_N };

struct ucx_op {
    ucx_op *next;      /* engine background list */
    ucx_op *comm_next; /* the communicator's list of operations in flight (c->ops)... */
    ucx_op *comm_prev; /* ...linked both ways: one that ends leaves it at once */
    ucx_op *seq_next;  /* the next one in its c->by_seq bucket */
    ucx_engine *e;
    ucx_comm *c;
    const ccq_be_op *op; /* NULL once abandoned or detached */
    const ucx_alg *alg;
    /* What every member must agree on (the header's fields). */
    uint8_t kind, dtype, redop;
    uint32_t root, chan;
    uint64_t seq, count;
    size_t es;          /* bytes per element */
    uint32_t P, me;     /* member processes and this one's index */
    uint32_t root_proc; /* rooted kinds: the member index owning the root */
    uint32_t peer_proc; /* send/recv: the member index of the peer */
    ccq_status status;  /* CCQ_IN_PROGRESS until it ends; sticky */
    ccq_errbuf detail;
    uint64_t start_ns;
    ucx_msg *arrivals; /* its messages, in arrival order */
    ucx_send *sends;   /* its sends UCX has not completed */
    void *buf[BUF_N];
    size_t cap[BUF_N];
    /* The ring all_reduce of a process with one part: that part's src, which the reductions
     * read in place of a copy in buf[BUF_RES] (only the block each segment sends as it is gets
     * copied there: UCX reads engine scratch only). NULL: buf[BUF_RES] holds the input. */
    const char *own;
    /* ...and that part's dst, written as the schedule goes (each block once every member's
     * header for it was checked: the block the reduce-scatter's last step fully reduced, each
     * block the all-gather lands; AVG divided on the way), so there is no copy-out at the end.
     * NULL: local_outputs writes the outputs. */
    char *out;
    /* The ring all_reduce of a process with several parts: each block of buf[BUF_RES] is their
     * local combine, made when the schedule first needs it (as local_combine would, block by
     * block, so the block is in cache for its send or reduction), and each finished block goes
     * to every part's dst as `out` would. */
    bool parts_lazy;
    /* A fused all_reduce on the ring whose parts each have one part in this process (ucx/fused.c):
     * their inputs are read where they are as the schedule goes, as `own` is (own_at[i]: the
     * group's element where part i starts, n + 1 of them), never packed into buf[BUF_RES]
     * first; ucx_fused_own_block reads them. NULL: buf[BUF_RES] holds the packed inputs. */
    size_t *own_at;
    /* The schedule wrote the outputs itself (recursive doubling's last combine,
     * ucx/allreduce_rd.c; the mapped all_reduce's copy-out, ucx/allreduce_mapped.c). */
    bool wrote_out;
    /* The mapped all_reduce: this process's region, and the peers' regions it reads
     * (peer_map[p]: ucx_engine.maps index of member p's, -1 none; P of them). */
    ucx_region *region;
    int32_t *peer_map;
    /* CCQ_HOST_REDUCE_NT when ucx_write_result writes the outputs by streaming stores (the
     * operation's buffers, or those of the run it came in, are beyond the caches, none in
     * place: ucx/select.c, STREAM_BYTES), else 0. */
    unsigned out_nt;
    /* Bytes (count x dtype size) of all the operations of the start_run call it came in (a
     * batch's consecutive collectives on its communicator); 0 when started alone. */
    uint64_t run_bytes;
    /* Schedule state (algorithms use what they need). */
    uint32_t nseg, window, active_lo; /* segments, how many at once, lowest not done */
    size_t seg_elems;
    ucx_seg *seg;
    uint32_t step, stage, k;
    bool sent, got;
    uint32_t x[8];                /* algorithm-private counters */
    uint32_t wait_src, wait_step; /* what it waits for now, for details */
    bool detached;                /* a send reported complete at once (host backend's detach) */
    bool moving;                  /* in the background with sends still to leave (e->nmoving) */
    uint64_t retired_ns;
    bool noticed; /* the members were told of its failure (or told us of it) */
    /* It failed because a member that left cleanly (ucx_peer.left) never sent what it needs,
     * or must be sent something: that failure is its own, the communicator goes on, so that
     * operations that have their messages still complete (later ones that need the leaver fail
     * the same way, at once). Its notices say so (UCX_NOTICE_OP_ONLY). */
    bool op_only;
    /* Fusion (ucx/fused.c). */
    uint8_t phase;   /* UCX_PH_* */
    uint32_t follow; /* operations of its start_run after it (a fused group: after its last) */
    uint32_t minf;   /* the fewest follow heard in this engine operation, its own included */
    uint32_t nops;   /* operations it runs: 1, or a fused group's (the header's) */
    uint64_t shape;  /* a fused group's hash of its parts' counts (0: unfused) */
    ucx_fused *fz;   /* head or member of a fused group */
};

enum {
    UCX_PH_RUN = 0, /* its schedule runs (or ran) */
    UCX_PH_PENDING, /* given by start_run, waiting to be decided (ucx/fused.c) */
    UCX_PH_MEMBER,  /* a fused group's part other than its head: ends with the head */
};

/* ---- engine helpers (ucx/engine.c, ucx/msg.c) ---------------------------------------- */

/* Scratch of at least bytes from the pool (NULL when out of memory). */
void *ucx_scratch(ucx_op *o, int which, size_t bytes);
/* Send bytes of buf (engine scratch, kept until the send completes) to member dst as step
 * `step` of o; tag groups sends for ucx_sends_done (a segment). */
ccq_status ucx_send_step(ucx_op *o, uint32_t dst, uint32_t step, const void *buf, size_t bytes,
                         uint32_t tag, ccq_errbuf *err);
/* The payload of member src's step `step`: CCQ_OK with *m readable (its payload at
 * (*m)->buf, exactly `bytes` long), CCQ_IN_PROGRESS while it has not arrived (or is still
 * landing: a rendezvous lands at `land`, which must hold bytes), or an error (the message
 * disagreed, a peer failed). Free *m with ucx_msg_done once used. */
ccq_status ucx_recv_step(ucx_op *o, uint32_t src, uint32_t step, void *land, size_t bytes,
                         ucx_msg **m, ccq_errbuf *err);
void ucx_msg_done(ucx_engine *e, ucx_msg *m);
/* True once every send of o with this tag (UCX_ALL: every send) has completed; frees the
 * completed ones. A send that failed sets *st (an error) and err. */
#define UCX_ALL UINT32_MAX
/* A notice's step: the failure is the operation's alone (ucx_op.op_only); else 0. */
#define UCX_NOTICE_OP_ONLY 1u
/* The tag of a failure's notices (ucx_notice): the engine's destroy lets them leave. */
#define UCX_NOTICE_TAG (UCX_ALL - 1)
bool ucx_sends_done(ucx_op *o, uint32_t tag, ccq_status *st, ccq_errbuf *err);
/* Fail o with st and detail (sticky; the first reason wins). Returns st. */
ccq_status ucx_op_fail(ucx_op *o, ccq_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Progress the worker until it has nothing more to do now. */
void ucx_progress(ucx_engine *e);
/* The AM handler and the routing of arrivals (ucx/msg.c). */
ucs_status_t ucx_am_recv(void *arg, const void *header, size_t header_length, void *data,
                         size_t length, const ucp_am_recv_param_t *param);
ucs_status_t ucx_am_recv_bulk(void *arg, const void *header, size_t header_length, void *data,
                              size_t length, const ucp_am_recv_param_t *param);
/* Hand the communicator's early messages of o to o (o just started), and the engine's
 * orphans of c to c (c just formed). */
void ucx_adopt_early(ucx_op *o);
void ucx_adopt_orphans(ucx_engine *e, ucx_comm *c);
/* Drop every message c still holds (it failed or is going away). */
void ucx_comm_drop_messages(ucx_comm *c);
/* The endpoint for p's large payloads (ucx_peer.bulk, made if it was not yet; p->ep if it
 * cannot be made). */
ucp_ep_h ucx_bulk_ep(ucx_engine *e, ucx_peer *p);
/* How p stands after saying goodbye (UCX_MSG_BYE): UCX_LEFT_NO while it did not, or while
 * its messages are still arriving; UCX_LEFT_ALL once they all arrived (a message not here
 * now never comes); UCX_LEFT_LOST when some never did (its connection failed
 * UCX_LEFT_GRACE_NS ago and they are still missing). */
enum { UCX_LEFT_NO = 0, UCX_LEFT_ALL, UCX_LEFT_LOST };
#define UCX_LEFT_GRACE_NS 2000000000ull
int ucx_peer_left(const ucx_peer *p, uint64_t now_ns);
/* c can no longer be used: its later operations fail with st and detail. remote: a member
 * reported it (so this process need not tell the others). */
void ucx_comm_fail(ucx_comm *c, ccq_status st, const char *detail, bool remote);
/* o succeeded here: remember its header fields for late messages (ucx_comm.ended). */
void ucx_comm_ended(ucx_comm *c, const ucx_op *o);
/* Tell every other member that o failed (a mismatch): payload = o's detail (sends tagged
 * UCX_NOTICE_TAG). */
void ucx_notice(ucx_op *o);
/* c failed and some members may not know (ucx_comm.failed_untold): tell them, with notices
 * of the operation they failed alone (every member has started it, so each routes the notice to
 * late_notice, which fails c there too); op is the operation that found it (for its fields). */
void ucx_comm_tell(ucx_comm *c, const ccq_be_op *op, uint64_t now_ns);
/* An operation starting on c, which failed: tell the members who may not know (ucx_comm_tell)
 * and refuse it with c's failure and detail. */
ccq_status ucx_comm_refuse(ucx_comm *c, const ccq_be_op *op, uint64_t now_ns, ccq_errbuf *err);

/* What each member made of the collectives before the one a message is of (ucx/prior.c,
 * docs/multiprocess-host.md "Three or more members that disagree"): a member that failed one
 * alone over a disagreement (fails_alone) must not complete the next with the data of a member
 * that completed it (that one's communicator fails once it hears), nor the other way round.
 * ucx_prior_ended: the collectives of sequences [seq, seq + n) ended here (alone: failed alone
 * over a disagreement). ucx_prior_stamp: fill h's prior fields. ucx_prior_agrees: compare h
 * (a data message of o, channel 0) with this process's own; on a difference fail o with
 * CCQ_ERR_MISMATCH (its communicator with it) and return false; where this process has not
 * ended as many yet (or ended them too long ago), the message is taken as it is. */
uint64_t ucx_prior_mix(uint64_t seq);
void ucx_prior_ended(ucx_comm *c, uint64_t seq, uint32_t n, bool alone);
void ucx_prior_stamp(const ucx_comm *c, ucx_hdr *h);
bool ucx_prior_agrees(ucx_op *o, const ucx_hdr *h);

/* Operations (ucx/engine.c): a new one, not started (counted in flight; c referenced); start
 * it (its local combine, its schedule: a fused head runs recursive doubling over its group);
 * free one that never started. */
ucx_op *ucx_op_new(ucx_comm *c, const ccq_be_op *op, uint64_t now_ns);
ccq_status ucx_op_launch(ucx_op *o, ccq_errbuf *err);
void ucx_op_discard(ucx_op *o);

/* Probes (ucx/probe.c). From the active-message callback: a PING or PONG from peer h->wsrc.
 * From the scheduler after progress (ucx_reap): owed PONGs sent; while late, the peers that
 * operations wait for probed, and one that leaves a PING unanswered for probe_wait_ns reported
 * to job health (base.peer_failed: a suspicion the judge weighs). At destroy, before the
 * endpoints close: the probes' requests let go. */
void ucx_probe_recv(ucx_engine *e, const ucx_hdr *h);
void ucx_probe_run(ucx_engine *e);
void ucx_probe_release(ucx_engine *e);

/* Fusion (ucx/fused.c, docs/fusion.md): engine.h's start_run; decide what c's waiting
 * collectives run as, as far as the agreement goes, and start them; a waiting op that ends
 * without starting (its communicator failed, given up); whether an operation of sequence seq
 * waits here (its messages are kept for it); a fused group's head ended (its members end with
 * st); a group's reference dropped. */
ccq_status ucx_start_run(ccq_host_engine *base, ccq_heng_comm *hc, ccq_be_op *const *ops,
                         uint32_t n, uint64_t now_ns, ccq_heng_op **out, uint32_t *nstarted,
                         ccq_errbuf *err);
void ucx_fuse_decide(ucx_comm *c);
void ucx_pend_forget(ucx_op *o);
bool ucx_pend_has(const ucx_comm *c, uint64_t seq);
void ucx_fused_end(ucx_op *head, ccq_status st, const char *detail);
void ucx_fused_unref(ucx_fused *fz);

/* Mapped scratch (ucx/mapped.c). A region of at least len bytes for an operation (NULL, err
 * set, when UCX cannot map one); back from it: kept for the next (reuse: the operation
 * succeeded, no peer reads it any more) or let go. ucx_region_say: describe region r and a
 * slot of it holding bytes for a message. ucx_region_attach: member wrank's region as m describes
 * it, readable here (referenced: ucx_region_detach drops it): its index in e->maps, or -1 with err
 * set. At destroy: let every peer's region go (before the endpoints close), then this process's
 * own. */
ucx_region *ucx_region_get(ucx_engine *e, size_t len, ccq_errbuf *err);
/* This process's ucx_shm_scope; the kinds only with region_bytes > 0 (0: none, no mapping). */
void ucx_shm_scope_here(ucp_context_h ctx, size_t region_bytes, ucx_shm_scope *s);
void ucx_region_put(ucx_engine *e, ucx_region *r, bool reuse);
void ucx_region_say(const ucx_region *r, size_t slot, size_t bytes, ucx_map_msg *m);
int32_t ucx_region_attach(ucx_engine *e, uint32_t wrank, const ucx_map_msg *m, ccq_errbuf *err);
void ucx_region_detach(ucx_engine *e, int32_t at);
void ucx_maps_release(ucx_engine *e);
void ucx_regions_release(ucx_engine *e);

/* Names for details. */
const char *ucx_kind_name(uint8_t kind);
const char *ucx_dtype_name(uint8_t dt);
const char *ucx_op_name(uint8_t op);

/* ---- the schedules (one file each; ucx/select.c picks one) ---------------------------- */

extern const ucx_alg ucx_allreduce_rd, ucx_allreduce_ring, ucx_allreduce_direct,
    ucx_allreduce_mapped;
/* The most processes the mapped all_reduce spans (a combine's inputs: one per member). */
#define UCX_MAPPED_MAX_P 64u
/* The most processes the direct all_reduce spans (ucx/allreduce_rd.c). */
#define UCX_DIRECT_AR_MAX_P 8u
extern const ucx_alg ucx_reduce_binomial, ucx_bcast_binomial;
extern const ucx_alg ucx_allgather_direct, ucx_allgather_ring;
extern const ucx_alg ucx_reduce_scatter_direct, ucx_reduce_scatter_ring;
extern const ucx_alg ucx_alltoall_pairwise;
extern const ucx_alg ucx_gather_binomial, ucx_scatter_binomial;
extern const ucx_alg ucx_send_direct, ucx_recv_direct;

/* The operation in flight on c with this channel and sequence, or NULL; linking one in (at
 * launch) and out (when it ends). */
ucx_op *ucx_comm_find(const ucx_comm *c, uint32_t chan, uint64_t seq);
void ucx_comm_link(ucx_comm *c, ucx_op *o);
void ucx_comm_unlink(ucx_op *o);

/* The schedule for o (kind, size, process count). */
const ucx_alg *ucx_select(const ucx_op *o);

/* Shared pieces of the schedules (ucx/select.c). */
/* Reduce n inputs (in that order) into dst, count elements of o's dtype and op (AVG sums). */
void ucx_reduce(const ucx_op *o, uint32_t n, const void *const *src, void *dst, size_t count);
/* The same into nout outputs at once (the host backend's kernel writes each finished block to
 * all of them). */
void ucx_reduce_to(const ucx_op *o, uint32_t n, const void *const *src, uint32_t nout,
                   void *const *dst, size_t count);
/* One local operation's combine of its parts' inputs (elems elements from byte `from` of
 * each) into `to`: the kernel and part order of the whole-buffer combine (engine.c). flags:
 * CCQ_HOST_REDUCE_NT writes `to` by streaming stores (the caller fences them before it
 * publishes `to`: ccq_host_store_fence). */
void ucx_part_combine(const ucx_op *o, const ccq_be_op *op, size_t from, char *to, size_t elems,
                      unsigned flags);
/* Elements [at, at + elems) of a fused group's inputs laid end to end (o->own_at): copied to
 * dst (msg NULL), or msg (+) them written to dst (the incoming partial first, as
 * ucx_ring_step's reduction; msg may be dst). CCQ_ERR_ABORTED, err set, if one of those parts
 * was given up (its buffers may be gone). */
ccq_status ucx_fused_own_block(const ucx_op *o, size_t at, size_t elems, const char *msg, char *dst,
                               ccq_errbuf *err);
/* out[k] = res (AVG: res / nranks, divided once) for each of n outputs (NULL: skipped). */
void ucx_write_result(const ucx_op *o, void *const *out, uint32_t n, const char *res, size_t elems);
/* The elements of block b of P nearly equal blocks of n elements: [*off, *off + *len). */
void ucx_block(size_t n, uint32_t P, uint32_t b, size_t *off, size_t *len);
/* Local ranks of member process p, and its first rank. */
static inline uint32_t ucx_nl(const ucx_op *o, uint32_t p)
{
    return o->c->fr[p + 1] - o->c->fr[p];
}

/* Where an everyone-to-everyone step puts member p's part: *at, *len bytes. */
typedef void (*ucx_place_fn)(const ucx_op *o, uint32_t p, char **at, size_t *len);
/* Every member sends out(o, q) to every other member q and lands what p sends at in(o, p),
 * one message each way, all posted at once (step 0); got (P flags) and x[0] count arrivals.
 * CCQ_OK once every part arrived. */
ccq_status ucx_exchange_all(ucx_op *o, ucx_place_fn out, ucx_place_fn in, char *got,
                            ccq_errbuf *err);
/* One step of a ring in segment g (step id `id`): send to the next member, take the previous
 * one's message into land (recv_len bytes), then, with ninto > 0, write it (+) mine (the
 * incoming partial first; mine NULL: into[0]'s own contents) into each of into[0..ninto) in
 * one pass (a block final here goes to the outputs without a second read), or leave it at
 * land. With taken, the message is handed over instead, its bytes at (*taken)->buf (land, or
 * UCX's buffer of an eager payload: never copied to land), for the caller to use and end with
 * ucx_msg_done. Advances seg[g].step when done. */
ccq_status ucx_ring_step(ucx_op *o, uint32_t g, uint32_t id, const char *send, size_t send_len,
                         char *land, size_t recv_len, uint32_t ninto, void *const *into,
                         const char *mine, ucx_msg **taken, ccq_errbuf *err);
/* Process p's block of a per-process layout (its ranks' count elements each): offset and
 * length in elements. */
static inline size_t ucx_block_off(const ucx_op *o, uint32_t p)
{
    return (size_t)o->c->fr[p] * o->count;
}

static inline size_t ucx_block_len(const ucx_op *o, uint32_t p)
{
    return (size_t)(o->c->fr[p + 1] - o->c->fr[p]) * o->count;
}

/* Segmentation of the pipelined schedules: segments of at most seg_bytes (or
 * CCQ_UCX_SEG_BYTES), `window` at once; fills nseg, seg_elems, window, seg[]. */
ccq_status ucx_segments(ucx_op *o, size_t elems, size_t seg_bytes, uint32_t window,
                        ccq_errbuf *err);
uint32_t ucx_window(void);
/* Whether a reduce_scatter of `all` bytes in all (every rank's block) runs the direct
 * schedule (one combine order) rather than the ring (another): fusion keeps a part's own. */
bool ucx_rs_direct(size_t all);
/* Whether a fused all_reduce runs the ring rather than recursive doubling (ucx/fused.c): two
 * processes, a commuting combine, above the ring threshold (the same single combine of two
 * partials per element; half the reduction work of exchanging whole buffers). */
bool ucx_fused_ring(const ucx_op *head);
/* The schedules' thresholds (CCQ_UCX_RING_BYTES, CCQ_UCX_SEG_BYTES), read once. */
void ucx_tuning(ucx_engine *e);
/* The single-copy threshold when CCQ_UCX_BULK_BYTES is unset: higher in a world of two
 * processes with a core each (ucx/select.c says why). */
size_t ucx_bulk_default(uint32_t world_size, bool oversubscribed);
/* Advance every active segment of o with step(o, g) (CCQ_OK: segment g done; an error ends
 * o) and move the window past done segments: CCQ_OK once all are done. */
ccq_status ucx_run_segments(ucx_op *o, ccq_status (*step)(ucx_op *o, uint32_t g, ccq_errbuf *err),
                            ccq_errbuf *err);

#endif /* CCQ_HOST_UCX_H */
