/* The host backend's UCX engine (engine.h's interface): one UCP context and worker per
 * runtime, endpoints per peer process made from the worker addresses every process gave
 * the world's meeting, and ccq's own schedules between the member processes after the local
 * combine (one buffer per process). The scheduler thread alone progresses the worker, back
 * to back while operations are in flight and not at all otherwise.
 *
 * Choices, measured on UCX 1.13.1 (Debian 12; docs/multiprocess-host.md):
 *  - Endpoints use UCP_ERR_HANDLING_MODE_PEER, so a peer that dies is an error on its
 *    requests, never a hang. UCX 1.13 then refuses its shared-memory transports unless their
 *    error handling is switched on (MM_ERROR_HANDLING, set here unless the environment says
 *    otherwise): without it, two processes on one host talked over TCP loopback (8 us
 *    instead of 0.6 us per 8-byte round trip). CMA (single-copy) has no peer failure
 *    support there, so large messages go through the shared-memory FIFO.
 *  - KEEPALIVE_INTERVAL 250 ms (UCX's default is 20 s): a receiver waiting for a dead peer
 *    learns of it within about that (measured: 0.1 s at 100 ms, 16 s at the default).
 *  - Every message is an active message carrying ucx_hdr: the receiver sees the header
 *    before any payload is placed (a rendezvous payload is fetched only after the check).
 *  - Every byte UCX reads or writes is engine scratch: the local combine copies the user's
 *    inputs in, the local write copies results out after every header was checked. A
 *    failed, aborted or timed-out operation can never have UCX write a user buffer later.
 *    The mapped all_reduce's regions (ucx/mapped.c), which the other processes of this
 *    machine read in place, are engine scratch too. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/host/reduce.h"
#include "backends/host/ucx/ucx.h"
#include "common/clock.h"
#include "common/cores.h"

/* Shared memory: the size of an element of a process's receive FIFO. UCX's 128 bytes hold a
 * message of at most 100 bytes inline (am_short), our header (ucx_hdr, 72 bytes then, 88 now) and
 * UCP's (8) included, so every payload above 20 bytes went by am_bcopy through a separate buffer;
 * 512 holds about 400 bytes of payload inline. Measured (bench/ab-libs.sh, before / after,
 * 9 interleaved runs, medians; docs/performance.md): all_reduce 4 x 1 32 B 1.55x, 128 B
 * 1.17x (fastest runs 1.64x); 2 x 1 32 B 1.49x, 128 B 1.54x; 8 B and 512 B-8 KiB within the
 * noise (0.85-1.30x). 1024 or 2304 helped 512 B-2 KiB but cost the smallest sizes down to
 * 0.72x (a larger FIFO, further from the cache). UCX computes a peer's element addresses
 * from its own size, so every process of a host must use the same: a user's
 * UCX_MM_/UCX_SYSV_/UCX_POSIX_FIFO_ELEM_SIZE, when set, wins (to be set alike everywhere). */
#define UCX_FIFO_ELEM_SIZE "512"
/* While operations are in flight the scheduler polls back to back; once nothing arrived for
 * this long (a peer is late: it has not submitted yet, or it died), every UCX_SLOW_POLL_NS
 * (measured: docs/multiprocess-host.md, "Progress"). */
#define UCX_BUSY_NS      2000000u
#define UCX_SLOW_POLL_NS 200000u
/* With nothing in flight the scheduler sleeps, but not for longer than this once a peer has
 * an endpoint: some of what peers send an idle process needs its progress to answer. Over
 * UCX's TCP a peer's flush (what say_goodbye waits for) sends a zero-byte put and waits for
 * its acknowledgement, which only this process's ucp_worker_progress sends: with its
 * scheduler asleep, every peer's ccq_runtime_destroy waited out say_goodbye's full second
 * (found 2026-12-07: 1.003 s, 2 and 3 processes, UCX_TLS=self,tcp, the others idle). Ten
 * polls a second cost an idle process a few tenths of a millisecond of CPU per second
 * (bench_world_idle; docs/multiprocess-host.md, "Progress"). */
#define UCX_IDLE_POLL_NS 100000000u

static ucx_engine *to_ucx(ccq_host_engine *e)
{
    return ccq_container_of(e, ucx_engine, base);
}

static size_t esize(uint8_t dt)
{
    static const uint8_t sz[CCQ_DTYPE_COUNT_] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return dt < CCQ_DTYPE_COUNT_ ? sz[dt] : 0;
}

/* ---- scratch ----------------------------------------------------------------------------- */

void *ucx_scratch(ucx_op *o, int which, size_t bytes)
{
    if (o->buf[which] != NULL && o->cap[which] >= bytes)
        return o->buf[which];
    ccq_pool_put(&o->e->pool, o->buf[which], o->cap[which]);
    o->buf[which] = ccq_pool_get(&o->e->pool, bytes ? bytes : 1, &o->cap[which]);
    if (o->buf[which] == NULL)
        o->cap[which] = 0;
    return o->buf[which];
}

/* ---- names ------------------------------------------------------------------------------ */

const char *ucx_kind_name(uint8_t kind)
{
    if (kind == CCQ_KIND_RECV)
        return "recv";
    return kind < CCQ_KIND_COUNT_ ? ccq_kinds[kind].name : "?";
}

const char *ucx_dtype_name(uint8_t dt)
{
    static const char *const names[CCQ_DTYPE_COUNT_] = {
        "int8",    "uint8",   "int32",   "uint32",   "int64",      "uint64",
        "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"};
    return dt < CCQ_DTYPE_COUNT_ ? names[dt] : "?";
}

const char *ucx_op_name(uint8_t op)
{
    static const char *const names[CCQ_REDUCE_OP_COUNT_] = {"sum", "prod", "max", "min", "avg"};
    return op < CCQ_REDUCE_OP_COUNT_ ? names[op] : "?";
}

/* ---- progress and failure ------------------------------------------------------------ */

/* How many of UCX's progress calls in a row moved something. Bounded: a flood of arrivals
 * must not keep the scheduler from its other work. */
static int progress_burst(ucx_engine *e)
{
    int k = 0;
    while (k < 256 && ucp_worker_progress(e->worker) != 0)
        k++;
    return k;
}

void ucx_progress(ucx_engine *e)
{
    int k = progress_burst(e);
    /* Nothing moved: now and then (yield_mask) such a poll gives the core away for a
     * moment, so that on a machine with more busy threads than cores (processes of one job
     * on few cores) the peer this process waits for gets to run; and where the cores are
     * enough, a thread whose yields keep giving its core to another (the peer's progress
     * thread, placed on the same core) moves to another core (common/cores.h). */
    if (k == 0 && (++e->idle_polls & e->yield_mask) == 0)
        ccq_unstack_yield(&e->unstack);
    else if (k > 0)
        e->idle_polls = 0;
}

ccq_status ucx_op_fail(ucx_op *o, ccq_status st, const char *fmt, ...)
{
    va_list ap;
    if (o->status != CCQ_IN_PROGRESS && o->status != CCQ_OK)
        return o->status;
    va_start(ap, fmt);
    vsnprintf(o->detail.msg, sizeof o->detail.msg, fmt, ap);
    va_end(ap);
    o->status = st;
    return st;
}

/* (ucx.h) */
void ucx_comm_fail(ucx_comm *c, ccq_status st, const char *detail, bool remote)
{
    if (c->failed != CCQ_OK)
        return;
    c->failed = st;
    c->failed_remote = remote;
    snprintf(c->failed_detail, sizeof c->failed_detail, "%s", detail);
    ucx_comm_drop_messages(c);
}

/* UCX's endpoint error callback (inside ucp_worker_progress, on the scheduler thread): the
 * peer died or its connection broke, seen on either of its endpoints (the large-payload one
 * often first: a single-copy read of the dead peer's memory). check_peers acts on it once
 * progress returned. */
static void peer_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ucx_peer_err *pe = arg;
    ucx_engine *e = pe->e;
    ucx_peer *p = &e->peers[pe->rank];
    (void)ep;
    if (p->failed == UCS_OK) {
        p->failed = status != UCS_OK ? status : UCS_ERR_ENDPOINT_TIMEOUT;
        p->failed_ns = ccq_now_ns();
        e->peers_failed++;
    }
}

/* Peers whose connection failed read what is readable now first, so that a goodbye already
 * on its way counts (ucx_peer.left). It left before the peer closed anything (ucx_destroy),
 * but over TCP each endpoint is a connection of its own: the close of its large-payload one may
 * be read here before the goodbye waiting on the other. A few ms at most: a real loss is seen
 * that much later. */
static void read_goodbyes(ucx_engine *e)
{
    uint64_t until = ccq_now_ns() + 5000000ull;
    for (uint32_t r = 0; r < e->world_size; r++)
        while (e->peers[r].failed != UCS_OK && !e->peers[r].left &&
               ucp_worker_progress(e->worker) != 0 && ccq_now_ns() < until)
            ;
}

/* Tell the runtime (job health) once that a peer's UCX failed while an operation needed it. */
static void report_failed(ucx_engine *e, uint32_t rank)
{
    ucx_peer *peer = &e->peers[rank];
    if (!peer->reported && !peer->left && e->base.peer_failed != NULL) {
        peer->reported = true;
        e->base.peer_failed(e->base.peer_failed_arg, rank);
    }
}

/* A peer failed: every communicator it is a member of fails, so that operations on them end
 * now, whoever they wait for (a process waiting on a survivor that waits on the dead one).
 * The runtime's job health hears of it (base.peer_failed) when it cut an operation in
 * flight. A peer that said goodbye (it destroyed its runtime cleanly: ucx_peer.left) is no
 * failure: its closed connection ends nothing here, operations take the messages it sent,
 * and only one that needs a message it never sent, or to send it one, fails
 * (ucx_recv_step, post in ucx/msg.c); job health reads its "left" record. */
static void check_peers(ucx_engine *e)
{
    if (e->peers_failed == e->peers_seen)
        return;
    e->peers_seen = e->peers_failed;
    read_goodbyes(e);
    for (ucx_comm *c = e->comms; c != NULL; c = c->next) {
        bool busy = c->ops != NULL || c->pq_n > 0;
        /* Every failed member is told, not only the first: two at once (a data network cut
         * while the bootstrap's still reaches everyone) left the second untold, and every
         * later communicator with it failed each operation with "failed earlier", never a
         * loss (found by hand, 2026-12-07). */
        for (uint32_t p = 0; p < c->nprocs; p++) {
            ucx_peer *peer = &e->peers[c->procs[p]];
            char why[CCQ_DETAIL_LEN];
            if (p == c->me || peer->failed == UCS_OK || peer->left)
                continue;
            if (busy)
                report_failed(e, c->procs[p]);
            if (c->failed != CCQ_OK)
                continue;
            snprintf(why, sizeof why,
                     "process %u failed (UCX: %s): a member of this communicator (this is "
                     "process %u)",
                     c->procs[p], ucs_status_string(peer->failed), e->world_rank);
            ucx_comm_fail(c, CCQ_ERR_BACKEND, why, false);
        }
    }
}

static void close_one(ucx_engine *e, ucp_ep_h *epp)
{
    ucp_request_param_t prm;
    void *req;
    uint64_t until;

    if (*epp == NULL)
        return;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    req = ucp_ep_close_nbx(*epp, &prm);
    *epp = NULL;
    if (req == NULL || UCS_PTR_IS_ERR(req))
        return;
    /* A forced close needs no answer from the peer; bounded anyway. */
    until = ccq_now_ns() + 1000000000ull;
    while (ucp_request_check_status(req) == UCS_INPROGRESS && ccq_now_ns() < until)
        ucp_worker_progress(e->worker);
    ucp_request_free(req);
}

static void close_ep(ucx_engine *e, ucx_peer *p)
{
    close_one(e, &p->bulk);
    close_one(e, &p->ep);
}

ucp_ep_h ucx_bulk_ep(ucx_engine *e, ucx_peer *p)
{
    ucp_ep_params_t ep;

    if (p->bulk != NULL || p->failed != UCS_OK || p->ep == NULL)
        return p->bulk != NULL ? p->bulk : p->ep;
    memset(&ep, 0, sizeof ep);
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = p->addr;
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    /* No error handling mode (so that UCX uses CMA), but a callback all the same: a transport
     * error on this endpoint (a single-copy read of a peer that died: process_vm_readv fails)
     * then goes to peer_error, and UCX discards the endpoint's lanes and fails its requests.
     * Without a callback UCX 1.13 treats that error as fatal and aborts this process. */
    ep.err_handler.cb = peer_error;
    ep.err_handler.arg = p->cb_arg;
    if (ucp_ep_create(e->worker, &ep, &p->bulk) != UCS_OK)
        p->bulk = NULL;
    return p->bulk != NULL ? p->bulk : p->ep;
}

/* ---- create, the world ------------------------------------------------------------------ */

/* Set a UCX configuration value unless the user set it in the environment: UCX_<name>, and for
 * a shared-memory setting (MM_<x>) either transport's own, UCX_SYSV_<x> or UCX_POSIX_<x>. */
static void config_default(ucp_config_t *cfg, const char *name, const char *value)
{
    static const char *const mm_env[] = {"UCX_SYSV_", "UCX_POSIX_"};
    char env[96];

    snprintf(env, sizeof env, "UCX_%s", name);
    if (getenv(env) != NULL)
        return;
    for (size_t i = 0; strncmp(name, "MM_", 3) == 0 && i < sizeof mm_env / sizeof mm_env[0]; i++) {
        snprintf(env, sizeof env, "%s%s", mm_env[i], name + 3);
        if (getenv(env) != NULL)
            return;
    }
    (void)ucp_config_modify(cfg, name, value);
}

/* Whether UCX_TLS (unset: all) may select a shared-memory transport: MM_ERROR_HANDLING is
 * set only then (UCX warns "invalid configuration" for a setting no selected transport reads,
 * as with docs/multiprocess-host.md's UCX_TLS=tcp,self,cma). */
static bool tls_has_shm(void)
{
    static const char *const shm[] = {"all", "sm", "shm", "mm", "posix", "sysv", "xpmem"};
    const char *tls = getenv("UCX_TLS");
    char list[256], *save = NULL;

    if (tls == NULL || tls[0] == '^' || strlen(tls) >= sizeof list)
        return true; /* everything, everything but some, or too long to read: assume so */
    snprintf(list, sizeof list, "%s", tls);
    for (char *t = strtok_r(list, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save))
        for (size_t i = 0; i < sizeof shm / sizeof shm[0]; i++)
            if (strcmp(t, shm[i]) == 0)
                return true;
    return false;
}

/* The element size of each shared-memory transport's receive FIFO in this process: its own
 * UCX_SYSV_/UCX_POSIX_FIFO_ELEM_SIZE, else UCX_MM_FIFO_ELEM_SIZE, else ccq's default
 * (config_default); 0 where no shared memory is selected. A value that is not a plain number
 * of bytes counts by its text (fnv-1a), which a peer that wrote the same text matches. */
static uint32_t fifo_elem_bytes(const char *tl_env)
{
    const char *v = getenv(tl_env);
    char *end = NULL;
    unsigned long long n;
    if (v == NULL)
        v = getenv("UCX_MM_FIFO_ELEM_SIZE");
    if (v == NULL)
        v = UCX_FIFO_ELEM_SIZE;
    n = strtoull(v, &end, 10);
    if (end != v && *end == '\0' && n <= UINT32_MAX)
        return (uint32_t)n;
    uint32_t h = 2166136261u;
    for (; *v != '\0'; v++)
        h = (h ^ (unsigned char)*v) * 16777619u;
    return h | 0x80000000u;
}

static ccq_status ucx_create(const ccq_config *cfg, ccq_host_engine **out, ccq_errbuf *err)
{
    ucx_engine *e = calloc(1, sizeof *e);
    ucp_params_t params;
    ucp_worker_params_t wp;
    ucp_worker_attr_t wa;
    ucp_config_t *ucfg = NULL;
    ucp_am_handler_param_t ap;
    ucs_status_t us;

    *out = NULL;
    if (e == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    e->base.ops = &ccq_host_engine_ucx_ops;
    ucx_tuning(e);
    e->yield_mask = 15; /* until world_ready knows the world's size */
    ccq_unstack_init(&e->unstack, false, (uint32_t)getpid());
    e->timeout_ns = cfg->timeout_ms ? cfg->timeout_ms * 1000000ull : UINT64_MAX;
    /* Probes (ucx/probe.c) wait as long as silence takes to declare a process lost: this
     * process's heartbeat_timeout_ms (default 10 heartbeats); none with heartbeats off. */
    uint64_t hb_timeout_ms =
        cfg->heartbeat_timeout_ms ? cfg->heartbeat_timeout_ms : 10ull * cfg->heartbeat_ms;
    e->probe_wait_ns = cfg->heartbeat_ms != 0 ? hb_timeout_ms * 1000000ull : 0;
    us = ucp_config_read(NULL, NULL, &ucfg);
    if (us != UCS_OK) {
        snprintf(err->msg, sizeof err->msg, "UCX: ucp_config_read: %s", ucs_status_string(us));
        goto fail;
    }
    if (tls_has_shm()) {
        config_default(ucfg, "MM_ERROR_HANDLING", "y");
        config_default(ucfg, "MM_FIFO_ELEM_SIZE", UCX_FIFO_ELEM_SIZE);
    }
    config_default(ucfg, "KEEPALIVE_INTERVAL", "250ms");
    /* The mapped all_reduce reads the other processes' scratch through their shared memory
     * (ucx/mapped.c): none without it. RMA: UCX's memory keys, in every process whether it maps
     * or not: UCX wires up an endpoint's lanes from both sides' features, and a pair that
     * asked for different ones aborted in UCX ("endpoint reconfiguration not supported yet",
     * test_host_world_ucx_mapped_mixed_np3). Measured: the small sizes' latency the same with
     * it, 2 x 1 and 4 x 1, 8 B-64 KiB, 0.96-1.05x. */
    if (!tls_has_shm())
        e->map_bytes = 0;
    memset(&params, 0, sizeof params);
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;
    params.name = "ccq";
    us = ucp_init(&params, ucfg, &e->ctx);
    ucp_config_release(ucfg);
    if (us != UCS_OK) {
        e->ctx = NULL;
        snprintf(err->msg, sizeof err->msg, "UCX: ucp_init: %s", ucs_status_string(us));
        goto fail;
    }
    /* The region's kind only if this process maps: UCX allocates one to say it. */
    ucx_shm_scope_here(e->ctx, e->map_bytes > 0 ? ucx_window() * e->knobs.seg_bytes : 0, &e->scope);
    if (e->scope.alloc_kind == 0)
        e->map_bytes = 0;
    if (tls_has_shm()) {
        e->fifo_elem[0] = fifo_elem_bytes("UCX_SYSV_FIFO_ELEM_SIZE");
        e->fifo_elem[1] = fifo_elem_bytes("UCX_POSIX_FIFO_ELEM_SIZE");
    }
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    us = ucp_worker_create(e->ctx, &wp, &e->worker);
    if (us != UCS_OK) {
        e->worker = NULL;
        snprintf(err->msg, sizeof err->msg, "UCX: ucp_worker_create: %s", ucs_status_string(us));
        goto fail;
    }
    memset(&wa, 0, sizeof wa);
    wa.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
    if (ucp_worker_query(e->worker, &wa) == UCS_OK && wa.max_am_header < sizeof(ucx_hdr)) {
        snprintf(err->msg, sizeof err->msg,
                 "UCX: active message headers hold %zu bytes here; ccq's needs %zu",
                 wa.max_am_header, sizeof(ucx_hdr));
        goto fail;
    }
    memset(&ap, 0, sizeof ap);
    ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    ap.id = UCX_AM_ID;
    ap.cb = ucx_am_recv;
    ap.arg = e;
    /* Whole messages, and eager payloads that stay valid after the callback: a message
     * arriving before its operation started waits for it without a copy. */
    ap.flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA;
    us = ucp_worker_set_am_recv_handler(e->worker, &ap);
    if (us == UCS_OK) {
        ap.id = UCX_AM_ID_BULK;
        ap.cb = ucx_am_recv_bulk;
        us = ucp_worker_set_am_recv_handler(e->worker, &ap);
    }
    if (us == UCS_OK)
        us = ucp_worker_get_address(e->worker, &e->addr, &e->addr_len);
    if (us != UCS_OK) {
        e->addr = NULL;
        snprintf(err->msg, sizeof err->msg, "UCX: setting up the worker: %s",
                 ucs_status_string(us));
        goto fail;
    }
    memset(&e->send_param, 0, sizeof e->send_param);
    memset(&e->send_eager, 0, sizeof e->send_eager);
    e->send_eager.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    e->send_eager.flags = UCP_AM_SEND_FLAG_EAGER;
    *out = &e->base;
    return CCQ_OK;

fail:
    e->base.ops->destroy(&e->base);
    return CCQ_ERR_UNSUPPORTED;
}

static void op_free(ucx_op *o);

static uint32_t ucx_reap(ccq_host_engine *base);

/* Can s still leave? Not when UCX completed it, nor when its receiver failed or said goodbye
 * (ucx_peer.left): a process that destroyed its engine takes nothing more, and a rendezvous it
 * dropped unfetched without releasing it (ucx_msg_done: one whose endpoint it had closed)
 * completes only when the sender sees its worker go, which over shared memory with the process
 * alive is never (a stray payload after a mismatch once held its sender's destroy for
 * timeout_ms, CI 2026-12-03). */
static bool send_owed(const ucx_engine *e, const ucx_op *o, const ucx_send *s)
{
    const ucx_peer *p = &e->peers[o->c->procs[s->dst]];
    return ucp_request_check_status(s->req) == UCS_INPROGRESS && p->failed == UCS_OK && !p->left;
}

/* Data this process still owes a peer: sends of operations that succeeded here (a detached
 * send, a finished schedule's last messages); with notices, also the notices of failed ones
 * (what a member waiting for this process's message learns the failure from: without it, it
 * waits for its own deadline), but not their data messages (a peer that stopped would hold
 * destroy for timeout_ms). */
static bool owed(const ucx_engine *e, bool notices)
{
    for (const ucx_op *o = e->background; o != NULL; o = o->next) {
        if (!o->moving)
            continue;
        for (const ucx_send *s = o->sends; s != NULL; s = s->next)
            if ((o->status == CCQ_OK || (notices && s->tag == UCX_NOTICE_TAG)) &&
                send_owed(e, o, s))
                return true;
    }
    return false;
}

/* Before its endpoints close: tell every live peer goodbye, with how many messages this
 * process sent it (ucx_peer.left), and flush both endpoints, so that what UCX reported sent
 * has left this process (over TCP a completed send may still sit in UCX's buffer, which a
 * forced close discards). Bounded: a second at most (timeout_ms if less), for a peer too busy
 * to read. */
static void say_goodbye(ucx_engine *e)
{
    uint32_t n = e->world_size;
    ucx_hdr *bye = calloc(n, sizeof *bye);
    void **reqs = calloc(3 * (size_t)n, sizeof *reqs);
    ucp_request_param_t prm;
    uint64_t until = ccq_now_ns() + (e->timeout_ns < 1000000000ull ? e->timeout_ns : 1000000000ull);
    bool busy = true;

    if (bye == NULL || reqs == NULL) {
        free(bye);
        free(reqs);
        return;
    }
    memset(&prm, 0, sizeof prm);
    for (uint32_t r = 0; r < n; r++) {
        ucx_peer *p = &e->peers[r];
        if (r == e->world_rank || p->ep == NULL || p->failed != UCS_OK || p->left)
            continue;
        bye[r].magic = UCX_MAGIC;
        bye[r].version = UCX_VERSION;
        bye[r].type = UCX_MSG_BYE;
        bye[r].wsrc = e->world_rank;
        bye[r].seq = p->sent;
        reqs[3 * r] = ucp_am_send_nbx(p->ep, UCX_AM_ID, &bye[r], sizeof bye[r], NULL, 0, &prm);
        reqs[3 * r + 1] = ucp_ep_flush_nbx(p->ep, &prm);
        if (p->bulk != NULL)
            reqs[3 * r + 2] = ucp_ep_flush_nbx(p->bulk, &prm);
    }
    while (busy && ccq_now_ns() < until) {
        busy = false;
        ucp_worker_progress(e->worker);
        for (uint32_t k = 0; k < 3 * n; k++)
            busy |= reqs[k] != NULL && !UCS_PTR_IS_ERR(reqs[k]) &&
                    ucp_request_check_status(reqs[k]) == UCS_INPROGRESS;
    }
    /* Closing the endpoints ends what is still in progress; UCX frees those then. */
    for (uint32_t k = 0; k < 3 * n; k++)
        if (reqs[k] != NULL && !UCS_PTR_IS_ERR(reqs[k]))
            ucp_request_free(reqs[k]);
    free(reqs);
    if (!busy)
        free(bye);
    else
        e->bye = bye; /* a goodbye not sent yet still reads its header: freed with the worker */
}

static void ucx_destroy(ccq_host_engine *base)
{
    ucx_engine *e = to_ucx(base);

    e->unstack.enabled = false; /* the caller's thread now: never move it */
    /* Sends reported complete here (detached, or the last messages of a finished
     * operation) may still wait for their receiver to take them (a rendezvous needs this
     * process): let them finish, up to timeout_ms, as the runtime lets issued work finish at
     * destroy. A receiver that is gone ends them sooner (its endpoint's error). */
    if (e->worker != NULL && e->nmoving > 0) {
        uint64_t now = ccq_now_ns();
        uint64_t until = now + (e->timeout_ns < 60000000000ull ? e->timeout_ns : 60000000000ull);
        /* A failure's notices are a few hundred bytes, eager: they leave at once unless the
         * peer's connection is full or gone; a second bounds them. */
        uint64_t notices_until =
            now + (e->timeout_ns < 1000000000ull ? e->timeout_ns : 1000000000ull);
        while ((now = ccq_now_ns()) < until && owed(e, now < notices_until))
            ucx_reap(base);
    }
    if (e->worker != NULL && e->peers != NULL)
        say_goodbye(e);
    /* Operations UCX still held (abandoned, failed): cancel what can be, then close the
     * endpoints, which ends every request on them. */
    for (ucx_op *o = e->background; o != NULL; o = o->next)
        for (ucx_msg *m = o->arrivals; m != NULL; m = m->next)
            if (m->state == MSG_LANDING && m->req != NULL)
                ucp_request_cancel(e->worker, m->req);
    ucx_maps_release(e);  /* the peers' regions, before their endpoints close */
    ucx_probe_release(e); /* (UCX still reads a probe's header until its endpoint closes) */
    for (uint32_t r = 0; e->peers != NULL && r < e->world_size; r++)
        close_ep(e, &e->peers[r]);
    while (e->background != NULL) {
        ucx_op *o = e->background;
        e->background = o->next;
        ucx_progress(e);
        op_free(o);
    }
    while (e->comms != NULL) { /* the host backend destroyed them all first; defensive */
        ucx_comm *c = e->comms;
        e->comms = c->next;
        ucx_comm_drop_messages(c);
        free(c->procs);
        free(c);
    }
    while (e->orphans != NULL) {
        ucx_msg *m = e->orphans;
        e->orphans = m->next;
        ucx_msg_done(e, m);
    }
    while (e->free_msgs != NULL) {
        ucx_msg *m = e->free_msgs;
        e->free_msgs = m->next;
        free(m);
    }
    ccq_pool_free(&e->pool);
    ucx_regions_release(e);
    if (e->addr != NULL)
        ucp_worker_release_address(e->worker, e->addr);
    if (e->worker != NULL)
        ucp_worker_destroy(e->worker);
    free(e->bye);
    if (e->ctx != NULL)
        ucp_cleanup(e->ctx);
    for (uint32_t r = 0; e->peers != NULL && r < e->world_size; r++)
        free(e->peers[r].cb_arg);
    free(e->peers);
    free(e->addrs);
    free(e);
}

/* A process's world blob: its worker address, then this: what the others need to agree on
 * the schedules with it (ucx_comm.map_bytes, ucx_comm.knobs). */
#define UCX_BLOB_MAGIC 0x3250414du /* "MAP2" */
typedef struct ucx_blob_tail {
    uint32_t magic, reserved;
    ucx_shm_scope scope; /* processes with the same one read each other's regions */
    uint64_t map_bytes;  /* its threshold (0: it cannot or will not map) */
    ucx_knobs knobs;
    uint32_t fifo_elem[2]; /* ucx_engine.fifo_elem */
} ucx_blob_tail;

static ccq_status ucx_world_blob(ccq_host_engine *base, void *blob, size_t *len, ccq_errbuf *err)
{
    ucx_engine *e = to_ucx(base);
    ucx_blob_tail tail;
    /* Whether this process can map scratch at all (shared memory there, room in it): a first
     * region of the default size, kept for the first mapped all_reduce (UCX touches no page of
     * it until then). If not, it says so and no communicator of it maps. */
    if (e->map_bytes > 0) {
        ccq_errbuf ignored;
        ucx_region *r = ucx_region_get(e, ucx_window() * e->knobs.seg_bytes, &ignored);
        if (r != NULL)
            ucx_region_put(e, r, true);
        else
            e->map_bytes = 0;
    }
    tail = (ucx_blob_tail){UCX_BLOB_MAGIC, 0,        e->scope,
                           e->map_bytes,   e->knobs, {e->fifo_elem[0], e->fifo_elem[1]}};
    if (*len < e->addr_len + sizeof tail) {
        snprintf(err->msg, sizeof err->msg, "the UCX worker address has %zu bytes (room for %zu)",
                 e->addr_len + sizeof tail, *len);
        *len = 0;
        return CCQ_ERR_UNSUPPORTED;
    }
    memcpy(blob, e->addr, e->addr_len);
    memcpy((char *)blob + e->addr_len, &tail, sizeof tail);
    *len = e->addr_len + sizeof tail;
    return CCQ_OK;
}

/* How often an idle poll yields (ucx_progress): every 16th, or every 4th when this host's
 * processes outnumber the cores they may run on (crowded: ccq_world_crowded, from every
 * process's affinity, so a launcher's binding of one core each is not mistaken for it, nor
 * the processes of other hosts counted), so that the schedulers alone (each process has one,
 * busy while operations are in flight) outnumber the cores. Measured (bench/ab-libs.sh,
 * medians of 7 interleaved runs, docs/performance.md): 4 processes on 2 cores, all_reduce 8 B
 * to 512 KiB, every 4th 1.07-1.44x faster (3 processes: 1.07-1.64x), every 2nd or every poll
 * slower than every 4th; 2 processes on 2 cores, every 4th 0.81-1.03x, so they keep every
 * 16th. */
static uint32_t yield_mask(bool crowded)
{
    return crowded ? 3u : 15u;
}

static ccq_status ucx_world_ready(ccq_host_engine *base, uint32_t world_rank, uint32_t world_size,
                                  bool crowded, const void *const *blobs, const size_t *blob_len,
                                  ccq_errbuf *err)
{
    ucx_engine *e = to_ucx(base);
    size_t total = 0, off = 0;

    e->world_rank = world_rank;
    e->world_size = world_size;
    e->yield_mask = yield_mask(crowded);
    /* With more processes than cores, stacking is the rule and moving only trades places. */
    ccq_unstack_init(&e->unstack, e->unstack_on && !crowded, (uint32_t)getpid());
    if (e->bulk_auto)
        e->bulk_bytes = ucx_bulk_default(world_size, crowded);
    for (uint32_t p = 0; p < world_size; p++) {
        ucx_blob_tail tail;
        if (blobs != NULL && blobs[p] != NULL && blob_len[p] > sizeof tail) {
            memcpy(&tail, (const char *)blobs[p] + blob_len[p] - sizeof tail, sizeof tail);
            if (tail.magic != UCX_BLOB_MAGIC) {
                snprintf(err->msg, sizeof err->msg,
                         "process %u's UCX engine said something this one cannot read: it runs "
                         "another ccq version",
                         p);
                return CCQ_ERR_UNSUPPORTED;
            }
        } else if (blobs != NULL && blobs[p] != NULL && blob_len[p] > 0) {
            snprintf(err->msg, sizeof err->msg,
                     "process %u's UCX engine said %zu bytes, too few: it runs another ccq version",
                     p, blob_len[p]);
            return CCQ_ERR_UNSUPPORTED;
        }
        if (blobs == NULL || blobs[p] == NULL || blob_len[p] == 0) {
            snprintf(err->msg, sizeof err->msg,
                     "the host backend cannot span processes with its UCX engine: process %u "
                     "has no UCX worker address (its engine is %s)",
                     p,
                     blobs == NULL || p == world_rank ? "not UCX or did not start"
                                                      : "another one, or UCX did not start there");
            return CCQ_ERR_UNSUPPORTED;
        }
        total += blob_len[p];
    }
    e->peers = calloc(world_size, sizeof *e->peers);
    e->addrs = malloc(total ? total : 1);
    if (e->peers == NULL || e->addrs == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory for %u peer addresses", world_size);
        return CCQ_ERR_NO_MEMORY;
    }
    for (uint32_t p = 0; p < world_size; p++) {
        ucx_blob_tail tail;
        size_t alen = blob_len[p] - sizeof tail;
        memcpy(&tail, (const char *)blobs[p] + alen, sizeof tail);
        memcpy(e->addrs + off, blobs[p], alen);
        e->peers[p].addr = e->addrs + off;
        e->peers[p].addr_len = alen;
        e->peers[p].map_bytes = tail.map_bytes;
        e->peers[p].scope = tail.scope;
        e->peers[p].knobs = tail.knobs;
        off += alen;
        /* UCX reads a peer's shared-memory FIFO with its own element size: processes that
         * reach each other over shared memory (one machine, one IPC namespace) and differ
         * corrupt each other's messages (seen: a pair with 1024 and 512 hung). Refused here,
         * named, before any message. */
        if (tail.scope.system_id == e->scope.system_id && tail.scope.ipc_ns == e->scope.ipc_ns &&
            e->fifo_elem[0] != 0 && tail.fifo_elem[0] != 0 &&
            (tail.fifo_elem[0] != e->fifo_elem[0] || tail.fifo_elem[1] != e->fifo_elem[1])) {
            snprintf(err->msg, sizeof err->msg,
                     "process %u's UCX has shared-memory FIFO elements of %u (SysV) and %u "
                     "(POSIX) bytes, this process (%u) %u and %u: UCX reads a peer's FIFO with "
                     "its own element size, so the processes of a machine must set "
                     "UCX_MM_FIFO_ELEM_SIZE (or UCX_SYSV_/UCX_POSIX_FIFO_ELEM_SIZE) alike, or "
                     "not at all (ccq's default: " UCX_FIFO_ELEM_SIZE ")",
                     p, tail.fifo_elem[0], tail.fifo_elem[1], world_rank, e->fifo_elem[0],
                     e->fifo_elem[1]);
            return CCQ_ERR_INVALID_ARGUMENT;
        }
    }
    return CCQ_OK;
}

/* The peer's endpoint, made on first use: no message, no answer needed from the peer (UCX
 * connects it in the background); never involves any other process. */
static ccq_status peer_ep(ucx_engine *e, uint32_t rank, ccq_errbuf *err)
{
    ucx_peer *p = &e->peers[rank];
    ucp_ep_params_t ep;
    ucs_status_t us;

    if (p->failed != UCS_OK) {
        report_failed(e, rank); /* an operation needs it now */
        snprintf(err->msg, sizeof err->msg, "process %u failed earlier (UCX: %s)", rank,
                 ucs_status_string(p->failed));
        return CCQ_ERR_BACKEND;
    }
    if (p->ep != NULL)
        return CCQ_OK;
    if (p->cb_arg == NULL && (p->cb_arg = malloc(sizeof *p->cb_arg)) == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    p->cb_arg->e = e;
    p->cb_arg->rank = rank;
    memset(&ep, 0, sizeof ep);
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = p->addr;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = peer_error;
    ep.err_handler.arg = p->cb_arg;
    us = ucp_ep_create(e->worker, &ep, &p->ep);
    e->connected |= us == UCS_OK;
    if (us != UCS_OK) {
        /* The peer cannot be reached (its worker is gone: it destroyed its runtime or died
         * between the meeting and now; UCX's shared memory fails at once then): a peer
         * failure, as if its endpoint had reported it. */
        p->ep = NULL;
        p->failed = us;
        e->peers_failed++;
        snprintf(err->msg, sizeof err->msg, "process %u cannot be reached (UCX: ucp_ep_create: %s)",
                 rank, ucs_status_string(us));
        return CCQ_ERR_BACKEND;
    }
    return CCQ_OK;
}

/* ---- communicators ----------------------------------------------------------------------- */

/* The lowest member names the communicator for every member: its world rank and how many it
 * named before. Messages carry the id, so two communicators never take each other's. */
static ccq_status ucx_root_blob(ccq_host_engine *base, const ccq_be_comm_desc *d, void *blob,
                                size_t *len, ccq_errbuf *err)
{
    ucx_engine *e = to_ucx(base);
    uint64_t id = (uint64_t)d->world_rank << 32 | ++e->comms_made;
    if (*len < sizeof id) {
        snprintf(err->msg, sizeof err->msg, "internal: %zu bytes for the UCX engine's blob", *len);
        return CCQ_ERR_BACKEND;
    }
    memcpy(blob, &id, sizeof id);
    *len = sizeof id;
    return CCQ_OK;
}

static void comm_unref(ucx_comm *c)
{
    if (--c->refs > 0)
        return;
    ucx_comm_drop_messages(c);
    free(c->pq);
    free(c->procs);
    free(c);
}

/* The mapped all_reduce's threshold for a communicator of these members (ucx_comm.map_bytes):
 * every member willing, able to read every member's kind of region, on this process's machine
 * in its IPC namespace, and in its PID namespace too where a region is POSIX (ucx_shm_scope);
 * the largest threshold among them; else 0. Every member computes the same from the same
 * world blobs ("one differs from mine" is "not all alike" in every member). */
static uint64_t comm_map_bytes(const ucx_engine *e, const ccq_be_comm_desc *d)
{
    uint64_t most = 0;
    uint32_t made = 0, read = ~0u; /* the kinds of the members' regions, those all can read */
    bool pid_apart = false;
    for (uint32_t p = 0; p < d->nprocs; p++) {
        const ucx_peer *q = d->procs[p] < e->world_size ? &e->peers[d->procs[p]] : NULL;
        if (q == NULL || q->map_bytes == 0 || q->scope.system_id != e->scope.system_id ||
            q->scope.ipc_ns != e->scope.ipc_ns)
            return 0;
        pid_apart |= q->scope.pid_ns != e->scope.pid_ns;
        made |= q->scope.alloc_kind;
        read &= q->scope.read_kinds;
        if (q->map_bytes > most)
            most = q->map_bytes;
    }
    if (d->nprocs < 2 || (made & ~read) != 0 || (pid_apart && (made & UCX_SHM_POSIX)))
        return 0;
    return most;
}

/* The schedule settings of a communicator of these members: the largest of each (every
 * member computes the same from the same world blobs). */
static ucx_knobs comm_knobs(const ucx_engine *e, const ccq_be_comm_desc *d)
{
    ucx_knobs k = e->knobs;
    for (uint32_t p = 0; p < d->nprocs; p++) {
        const ucx_knobs *q = d->procs[p] < e->world_size ? &e->peers[d->procs[p]].knobs : NULL;
        if (q == NULL)
            continue;
        k.ring_bytes = q->ring_bytes > k.ring_bytes ? q->ring_bytes : k.ring_bytes;
        k.direct_ar_bytes =
            q->direct_ar_bytes > k.direct_ar_bytes ? q->direct_ar_bytes : k.direct_ar_bytes;
        k.seg_bytes = q->seg_bytes > k.seg_bytes ? q->seg_bytes : k.seg_bytes;
    }
    return k;
}

static ccq_status ucx_comm_create(ccq_host_engine *base, const ccq_be_comm_desc *d,
                                  ccq_heng_comm **out, ccq_errbuf *err)
{
    ucx_engine *e = to_ucx(base);
    ucx_comm *c;
    ccq_status st;
    uint64_t id;
    char dead[CCQ_DETAIL_LEN] = "";

    *out = NULL;
    if (e->peers == NULL) {
        snprintf(err->msg, sizeof err->msg, "the UCX engine did not meet the world");
        return CCQ_ERR_UNSUPPORTED;
    }
    if (d->root_blob_len != sizeof id || d->proc_first == NULL) {
        snprintf(err->msg, sizeof err->msg,
                 "internal: the UCX engine's communicator id is missing (%zu bytes)",
                 d->root_blob_len);
        return CCQ_ERR_BACKEND;
    }
    memcpy(&id, d->root_blob, sizeof id);
    c = calloc(1, sizeof *c);
    if (c != NULL)
        c->procs = malloc((2 * (size_t)d->nprocs + 1) * sizeof *c->procs);
    if (c == NULL || c->procs == NULL) {
        free(c);
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    c->e = e;
    c->id = id;
    c->refs = 1;
    c->nprocs = d->nprocs;
    c->nranks = d->nranks;
    c->fr = c->procs + d->nprocs;
    c->me = UINT32_MAX;
    c->fusion_bytes = d->fusion_bytes; /* the same in every member */
    for (uint32_t p = 0; p < d->nprocs; p++) {
        c->procs[p] = d->procs[p];
        if (d->procs[p] == e->world_rank)
            c->me = p;
    }
    memcpy(c->fr, d->proc_first, ((size_t)d->nprocs + 1) * sizeof *c->fr);
    c->map_bytes = comm_map_bytes(e, d);
    c->knobs = comm_knobs(e, d);
    for (uint32_t p = 0; p < d->nprocs; p++) {
        if (p == c->me)
            continue;
        if (d->procs[p] >= e->world_size) {
            snprintf(err->msg, sizeof err->msg, "internal: member process %u is not in the world",
                     d->procs[p]);
            st = CCQ_ERR_BACKEND;
            goto fail;
        }
        st = peer_ep(e, d->procs[p], err);
        if (st == CCQ_ERR_NO_MEMORY)
            goto fail;
        /* The large-payload endpoint too, now rather than at the first large send: both sides
         * make it right after the first (the same order, so UCX pairs the two), and a peer's
         * large message then arrives on an endpoint this process made, with its error
         * callback. Made only by the peer, UCX's side of it is an internal endpoint that UCX
         * destroys at once when the peer dies, while a rendezvous announced on it may wait
         * here to be fetched: fetching then dereferenced the freed endpoint (a UCX assertion,
         * test_host_ucx_kill_large_np3 1 run in 50-100 under load). */
        if (st == CCQ_OK && e->bulk_bytes != SIZE_MAX)
            (void)ucx_bulk_ep(e, &e->peers[d->procs[p]]);
        if (st != CCQ_OK && dead[0] == '\0')
            snprintf(dead, sizeof dead,
                     "%.400s: a member of this communicator (this is process %u)", err->msg,
                     e->world_rank);
    }
    c->next = e->comms;
    e->comms = c;
    ucx_adopt_orphans(e, c);
    /* A member already gone: the communicator forms (forming waits for nobody and each member
     * decides alone), and its operations fail naming the process, as after a peer error. */
    if (dead[0] != '\0')
        ucx_comm_fail(c, CCQ_ERR_BACKEND, dead, false);
    err->msg[0] = '\0';
    *out = (ccq_heng_comm *)c;
    return CCQ_OK;

fail:
    free(c->procs);
    free(c);
    return st;
}

static ccq_status ucx_comm_test(ccq_host_engine *e, ccq_heng_comm *c, ccq_errbuf *err)
{
    (void)e;
    (void)c;
    (void)err;
    return CCQ_OK;
}

static void ucx_comm_destroy(ccq_host_engine *base, ccq_heng_comm *hc)
{
    ucx_engine *e = to_ucx(base);
    ucx_comm *c = (ucx_comm *)hc;
    if (c == NULL)
        return;
    for (ucx_comm **pp = &e->comms; *pp != NULL; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    e->gone[e->ngone++ % (sizeof e->gone / sizeof e->gone[0])] = c->id;
    c->destroyed = true;
    comm_unref(c);
}

/* ---- operations ------------------------------------------------------------------------- */

static uint32_t owner(const ucx_comm *c, uint32_t rank)
{
    uint32_t p = 0;
    while (p + 1 < c->nprocs && c->fr[p + 1] <= rank)
        p++;
    return p;
}

/* (ucx.h) */
ucx_op *ucx_comm_find(const ucx_comm *c, uint32_t chan, uint64_t seq)
{
    for (ucx_op *o = c->by_seq[ucx_seq_bucket(chan, seq)]; o != NULL; o = o->seq_next)
        if (o->chan == chan && o->seq == seq)
            return o;
    return NULL;
}

/* (ucx.h) */
void ucx_comm_link(ucx_comm *c, ucx_op *o)
{
    ucx_op **b = &c->by_seq[ucx_seq_bucket(o->chan, o->seq)];
    o->comm_prev = NULL;
    o->comm_next = c->ops;
    if (c->ops != NULL)
        c->ops->comm_prev = o;
    c->ops = o;
    o->seq_next = *b;
    *b = o;
}

/* (ucx.h) Also for one never linked (a pending operation that failed): nothing to undo. */
void ucx_comm_unlink(ucx_op *o)
{
    ucx_comm *c = o->c;
    for (ucx_op **pp = &c->by_seq[ucx_seq_bucket(o->chan, o->seq)]; *pp != NULL;
         pp = &(*pp)->seq_next)
        if (*pp == o) {
            *pp = o->seq_next;
            break;
        }
    if (o->comm_prev != NULL)
        o->comm_prev->comm_next = o->comm_next;
    else if (c->ops == o)
        c->ops = o->comm_next;
    if (o->comm_next != NULL)
        o->comm_next->comm_prev = o->comm_prev;
    o->comm_next = o->comm_prev = o->seq_next = NULL;
}

static void op_free(ucx_op *o)
{
    ucx_engine *e = o->e;
    while (o->arrivals != NULL) {
        ucx_msg *m = o->arrivals;
        o->arrivals = m->next;
        ucx_msg_done(e, m);
    }
    while (o->sends != NULL) { /* only after UCX completed them (or at destroy) */
        ucx_send *s = o->sends;
        o->sends = s->next;
        if (s->req != NULL)
            ucp_request_free(s->req);
        free(s->copy); /* a notice's text, a detached send's data */
        free(s);
    }
    for (int k = 0; k < BUF_N; k++)
        ccq_pool_put(&e->pool, o->buf[k], o->cap[k]);
    /* Mapped scratch: the peers' regions it read, and its own (reused only after a success:
     * every member then said it finished reading it). */
    for (uint32_t p = 0; o->peer_map != NULL && p < o->P; p++)
        ucx_region_detach(e, o->peer_map[p]);
    free(o->peer_map);
    ucx_region_put(e, o->region, o->status == CCQ_OK);
    free(o->seg);
    free(o->own_at);
    ucx_fused_unref(o->fz);
    comm_unref(o->c);
    free(o);
}

/* Has o a send that can still leave (send_owed)? */
static bool sends_owed(const ucx_engine *e, const ucx_op *o)
{
    for (const ucx_send *s = o->sends; s != NULL; s = s->next)
        if (send_owed(e, o, s))
            return true;
    return false;
}

/* Does UCX still hold anything of o (a send, a landing receive)? */
static bool op_held(ucx_op *o)
{
    ccq_status st = CCQ_OK;
    ccq_errbuf ignored;
    if (!ucx_sends_done(o, UCX_ALL, &st, &ignored))
        return true;
    for (ucx_msg *m = o->arrivals; m != NULL; m = m->next)
        if (m->state == MSG_LANDING && m->req != NULL &&
            ucp_request_check_status(m->req) == UCS_INPROGRESS)
            return true;
    return false;
}

/* o ended here (done, failed, abandoned, detached): stop routing messages to it and keep it
 * until UCX lets go of its buffers. */
static void op_retire(ucx_op *o)
{
    ucx_engine *e = o->e;
    ucx_comm_unlink(o);
    e->inflight--;
    if (o->c->agree_unit == o) { /* it ended without telling: it failed (every member did) */
        o->c->agree_unit = NULL;
        o->c->agree_w = 0;
    }
    for (ucx_msg *m = o->arrivals; m != NULL; m = m->next)
        if (m->state == MSG_LANDING && m->req != NULL)
            ucp_request_cancel(e->worker, m->req);
    if (!op_held(o)) {
        op_free(o);
        return;
    }
    o->next = e->background;
    e->background = o;
    e->nbackground++;
    /* Its last messages (a finished schedule's, a detached send, a failure's notices) need
     * this process's progress to leave: poll for them, up to timeout_ms. */
    o->moving = o->sends != NULL;
    o->retired_ns = ccq_now_ns();
    e->nmoving += o->moving;
}

/* (ucx.h) An operation that never runs: it exists to send its notices, as the one that ended
 * here (its channel and sequence), and is kept until they left. Not as op itself: a
 * send/recv's channel and sequence are its pair's, which the other members never reach. */
void ucx_comm_tell(ucx_comm *c, const ccq_be_op *op, uint64_t now_ns)
{
    ucx_op *o;
    if (!c->failed_untold || (o = ucx_op_new(c, op, now_ns)) == NULL)
        return;
    c->failed_untold = false;
    o->chan = c->untold_chan;
    o->seq = c->untold_seq;
    ucx_op_fail(o, c->failed, "%s", c->failed_detail);
    ucx_notice(o);
    o->op = NULL; /* the runtime fails op itself, with c's detail */
    op_retire(o);
}

/* (ucx.h) */
ccq_status ucx_comm_refuse(ucx_comm *c, const ccq_be_op *op, uint64_t now_ns, ccq_errbuf *err)
{
    ucx_comm_tell(c, op, now_ns);
    snprintf(err->msg, sizeof err->msg, "%s", c->failed_detail);
    return c->failed;
}

/* The local combine's inputs: part k's src (offset off bytes). */
static void local_srcs(const ccq_be_op *op, size_t off, const void **src)
{
    for (uint32_t k = 0; k < op->nparts; k++)
        src[k] = (const char *)op->parts[k].src + off;
}

/* The host backend's kernel on o's dtype and op (AVG sums: each engine divides once, at the
 * end); flags: CCQ_HOST_REDUCE_NT streams the outputs. */
static void reduce_flags(const ucx_op *o, uint32_t n, const void *const *src, uint32_t nout,
                         void *const *dst, size_t count, unsigned flags)
{
    ccq_reduce_op ro = o->redop == CCQ_AVG ? CCQ_SUM : (ccq_reduce_op)o->redop;
    ccq_host_reduce_range((ccq_dtype)o->dtype, ro, n, src, nout, dst, 0, count, flags);
}

void ucx_reduce_to(const ucx_op *o, uint32_t n, const void *const *src, uint32_t nout,
                   void *const *dst, size_t count)
{
    reduce_flags(o, n, src, nout, dst, count, 0);
}

void ucx_reduce(const ucx_op *o, uint32_t n, const void *const *src, void *dst, size_t count)
{
    void *d[1] = {dst};
    ucx_reduce_to(o, n, src, 1, d, count);
}

/* Combine this process's parts (elements per part: elems) into res. */
static ccq_status local_combine(ucx_op *o, size_t elems, ccq_errbuf *err)
{
    const ccq_be_op *op = o->op;
    const void *src[CCQ_MAX_DEVICES];
    void *res;
    if (o->alg == &ucx_allreduce_mapped)
        return CCQ_OK; /* each segment's inputs are combined into its mapped slot */
    if (o->alg == &ucx_allreduce_ring) {
        /* Read and written in place, or combined and written block by block, as the schedule
         * goes; its scratch is the segments in flight only (ucx/allreduce_ring.c). */
        if (op->nparts == 1) {
            o->own = op->parts[0].src;
            o->out = op->parts[0].dst;
        } else {
            o->parts_lazy = true;
        }
        return CCQ_OK;
    }
    res = ucx_scratch(o, BUF_RES, elems * o->es);
    if (res == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory for %zu bytes of UCX scratch",
                 elems * o->es);
        return CCQ_ERR_NO_MEMORY;
    }
    if (op->nparts == 1) {
        memcpy(res, op->parts[0].src, elems * o->es);
        return CCQ_OK;
    }
    local_srcs(op, 0, src);
    ucx_reduce(o, op->nparts, src, res, elems);
    return CCQ_OK;
}

/* The inputs into o->buf[BUF_RES] as the schedule wants them. */
static ccq_status local_inputs(ucx_op *o, ccq_errbuf *err)
{
    const ccq_be_op *op = o->op;
    const ucx_comm *c = o->c;
    size_t blk = o->count * o->es;

    switch (o->kind) {
    case CCQ_KIND_ALL_REDUCE:
    case CCQ_KIND_REDUCE:
        return local_combine(o, o->count, err);
    case CCQ_KIND_REDUCE_SCATTER:
        return local_combine(o, o->count * c->nranks, err);
    case CCQ_KIND_BROADCAST: {
        char *res = ucx_scratch(o, BUF_RES, blk);
        if (res == NULL)
            break;
        if (o->root_proc == o->me)
            memcpy(res, op->parts[o->root - c->fr[o->me]].src, blk);
        return CCQ_OK;
    }
    case CCQ_KIND_ALL_GATHER: {
        char *res = ucx_scratch(o, BUF_RES, blk * c->nranks);
        if (res == NULL)
            break;
        for (uint32_t k = 0; k < op->nparts; k++)
            memcpy(res + (size_t)(c->fr[o->me] + k) * blk, op->parts[k].src, blk);
        return CCQ_OK;
    }
    case CCQ_KIND_SEND: {
        char *res = ucx_scratch(o, BUF_RES, blk);
        if (res == NULL)
            break;
        memcpy(res, op->parts[0].src, blk);
        return CCQ_OK;
    }
    default: /* all_to_all, gather, scatter and recv pack in their init */
        return CCQ_OK;
    }
    snprintf(err->msg, sizeof err->msg, "out of memory for UCX scratch");
    return CCQ_ERR_NO_MEMORY;
}

static void copy_out(void *dst, const void *src, size_t bytes)
{
    if (dst != NULL && dst != src && bytes > 0)
        memmove(dst, src, bytes);
}

/* out[k] = res (AVG: res / nranks) for each of n outputs. res itself is never written: a
 * send may still read it (the schedule's last messages leave after this process is done).
 * With o->out_nt the outputs are written by streaming stores, each from res (an output just
 * streamed is no longer in cache), fenced before the operation can be seen done. */
void ucx_write_result(const ucx_op *o, void *const *out, uint32_t n, const char *res, size_t elems)
{
    bool avg = o->redop == CCQ_AVG && ccq_kinds[o->kind].reduces;
    const char *from = res;
    for (uint32_t k = 0; k < n; k++) {
        if (out[k] == NULL)
            continue;
        if (avg && (from == res || o->out_nt)) {
            ccq_host_divide_ex((ccq_dtype)o->dtype, res, out[k], elems, o->c->nranks, o->out_nt);
            from = out[k];
        } else if (o->out_nt) {
            ccq_host_copy(out[k], res, elems * o->es, o->out_nt);
        } else {
            copy_out(out[k], from, elems * o->es);
        }
    }
    ccq_host_store_fence(o->out_nt);
}

/* Every header checked, every step done: write the local outputs. */
static void local_outputs(ucx_op *o)
{
    const ccq_be_op *op = o->op;
    const ucx_comm *c = o->c;
    size_t blk = o->count * o->es;
    char *res = o->buf[BUF_RES];
    void *out[CCQ_MAX_DEVICES];

    switch (o->kind) {
    case CCQ_KIND_ALL_REDUCE:
        if (o->out != NULL || o->parts_lazy || o->wrote_out) /* the schedule wrote them */
            break;
        for (uint32_t k = 0; k < op->nparts; k++)
            out[k] = op->parts[k].dst;
        ucx_write_result(o, out, op->nparts, res, o->count);
        break;
    case CCQ_KIND_REDUCE:
        if (o->root_proc != o->me)
            break;
        out[0] = op->parts[o->root - c->fr[o->me]].dst;
        ucx_write_result(o, out, 1, res, o->count);
        break;
    case CCQ_KIND_BROADCAST:
        for (uint32_t k = 0; k < op->nparts; k++)
            copy_out(op->parts[k].dst, res, blk);
        break;
    case CCQ_KIND_ALL_GATHER:
        for (uint32_t k = 0; k < op->nparts; k++)
            copy_out(op->parts[k].dst, res, blk * c->nranks);
        break;
    case CCQ_KIND_REDUCE_SCATTER: {
        const char *mine = res + (size_t)c->fr[o->me] * blk;
        for (uint32_t k = 0; k < op->nparts; k++) {
            out[0] = op->parts[k].dst;
            ucx_write_result(o, out, 1, mine + k * blk, o->count);
        }
        break;
    }
    case CCQ_KIND_RECV:
        copy_out(op->parts[0].dst, res, blk);
        break;
    default: /* all_to_all, gather, scatter: their advance wrote the outputs */
        break;
    }
}

/* A fused group's layout (docs/fusion.md): all_reduce lays its parts end to end; all_gather
 * and reduce_scatter interleave them, each rank's block being the parts' blocks of that rank
 * end to end (rank r's block of part i at r x total + off_i, total = o->count). So every
 * schedule runs on the group as on one operation of total elements per rank. */

/* One part's local combine into the group's scratch: the kernel and device order it meets
 * alone (local_combine), on `elems` elements from byte `from` of its inputs. */
void ucx_part_combine(const ucx_op *o, const ccq_be_op *op, size_t from, char *to, size_t elems,
                      unsigned flags)
{
    const void *src[CCQ_MAX_DEVICES];
    void *dst[1] = {to};
    if (op->nparts == 1) {
        ccq_host_copy(to, (const char *)op->parts[0].src + from, elems * o->es, flags);
        return;
    }
    local_srcs(op, from, src);
    reduce_flags(o, op->nparts, src, 1, dst, elems, flags);
}

/* Whether a fused all_reduce reads its inputs where they are (o->own_at): on the ring, every
 * part with one part here (several are combined first: packed as they would be alone). */
static bool fused_reads_in_place(const ucx_op *o)
{
    if (o->alg != &ucx_allreduce_ring)
        return false;
    for (uint32_t i = 0; i < o->fz->n; i++)
        if (o->fz->part[i].op == NULL || o->fz->part[i].op->nparts != 1)
            return false;
    return true;
}

ccq_status ucx_fused_own_block(const ucx_op *o, size_t at, size_t elems, const char *msg, char *dst,
                               ccq_errbuf *err)
{
    const ucx_fused *fz = o->fz;
    const size_t *start = o->own_at;
    size_t es = o->es;
    uint32_t lo = 0, hi = fz->n; /* the part holding `at`: start[lo] <= at < start[lo + 1] */

    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (start[mid] <= at)
            lo = mid;
        else
            hi = mid;
    }
    for (uint32_t i = lo; elems > 0 && i < fz->n; i++) {
        const ccq_be_op *op = fz->part[i].op;
        size_t off = at - start[i], len = start[i + 1] - at < elems ? start[i + 1] - at : elems;
        const char *in;
        if (len == 0)
            continue;
        if (op == NULL) {
            snprintf(err->msg, sizeof err->msg,
                     "part %u of the fused operation was given up (timeout or abort)", i);
            return CCQ_ERR_ABORTED;
        }
        in = (const char *)op->parts[0].src + off * es;
        if (msg == NULL) {
            memcpy(dst, in, len * es);
        } else {
            const void *src[2] = {msg, in};
            void *to[1] = {dst};
            ucx_reduce_to(o, 2, src, 1, to, len);
            msg += len * es;
        }
        dst += len * es;
        at += len;
        elems -= len;
    }
    return CCQ_OK;
}

/* A fused group's combine (its head's launch): each part's inputs into the head's scratch,
 * laid out as above, each with the kernel it would meet alone; or, read in place
 * (fused_reads_in_place), only where each part starts. */
static ccq_status fused_inputs(ucx_op *o, ccq_errbuf *err)
{
    const ucx_fused *fz = o->fz;
    const ucx_comm *c = o->c;
    size_t total = o->count, es = o->es, off = 0;
    size_t ranks = o->kind == CCQ_KIND_ALL_REDUCE ? 1 : c->nranks;
    char *res = ucx_scratch(o, BUF_RES, total * ranks * es);

    if (res == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory for %zu bytes of UCX scratch",
                 total * ranks * es);
        return CCQ_ERR_NO_MEMORY;
    }
    if (o->e->fused_in_place && fused_reads_in_place(o)) {
        if ((o->own_at = malloc(((size_t)fz->n + 1) * sizeof *o->own_at)) == NULL) {
            snprintf(err->msg, sizeof err->msg, "out of memory for %u fused parts", fz->n);
            return CCQ_ERR_NO_MEMORY;
        }
        for (uint32_t i = 0; i < fz->n; i++) {
            o->own_at[i] = off;
            off += fz->part[i].count;
        }
        o->own_at[fz->n] = off;
        return CCQ_OK;
    }
    for (uint32_t i = 0; i < fz->n; i++) {
        const ccq_be_op *op = fz->part[i].op;
        size_t cnt = fz->part[i].count;
        switch (o->kind) {
        case CCQ_KIND_ALL_GATHER: /* each local rank's input into its rank's block */
            for (uint32_t k = 0; k < op->nparts; k++)
                memcpy(res + ((c->fr[o->me] + k) * total + off) * es, op->parts[k].src, cnt * es);
            break;
        case CCQ_KIND_REDUCE_SCATTER: /* every rank's block of the part, combined */
            for (uint32_t r = 0; r < c->nranks; r++)
                ucx_part_combine(o, op, r * cnt * es, res + (r * total + off) * es, cnt, 0);
            break;
        default:
            ucx_part_combine(o, op, 0, res + off * es, cnt, 0);
            break;
        }
        off += cnt;
    }
    return CCQ_OK;
}

/* Every part's outputs from the head's result (AVG divides each on its way out, as alone).
 * A part abandoned by its stream (op NULL) is skipped. */
static void fused_outputs(ucx_op *o)
{
    const ucx_fused *fz = o->fz;
    const ucx_comm *c = o->c;
    const char *res = o->buf[BUF_RES];
    size_t total = o->count, es = o->es, off = 0;
    void *out[CCQ_MAX_DEVICES];

    for (uint32_t i = 0; i < fz->n; i++) {
        const ccq_be_op *op = fz->part[i].op;
        size_t cnt = fz->part[i].count;
        for (uint32_t k = 0; op != NULL && k < op->nparts; k++) {
            char *dst = op->parts[k].dst;
            switch (o->kind) {
            case CCQ_KIND_ALL_GATHER: /* rank r's block of this part, for every r */
                for (uint32_t r = 0; r < c->nranks; r++)
                    copy_out(dst + r * cnt * es, res + (r * total + off) * es, cnt * es);
                break;
            case CCQ_KIND_REDUCE_SCATTER: /* this local rank's block of the part */
                out[0] = dst;
                ucx_write_result(o, out, 1, res + ((c->fr[o->me] + k) * total + off) * es, cnt);
                break;
            default:
                out[k] = dst;
                break;
            }
        }
        if (op != NULL && o->kind == CCQ_KIND_ALL_REDUCE)
            ucx_write_result(o, out, op->nparts, res + off * es, cnt);
        off += cnt;
    }
    if (fz->part[0].op != NULL)
        fz->part[0].op->fused_t1 = ccq_now_ns();
}

ucx_op *ucx_op_new(ucx_comm *c, const ccq_be_op *op, uint64_t now_ns)
{
    ucx_engine *e = c->e;
    ucx_op *o = calloc(1, sizeof *o);
    if (o == NULL)
        return NULL;
    o->e = e;
    o->c = c;
    c->refs++;
    o->op = op;
    o->kind = op->kind;
    o->dtype = op->dtype;
    o->es = esize(op->dtype);
    o->count = op->count;
    o->seq = op->seq;
    o->P = c->nprocs;
    o->me = c->me;
    o->status = CCQ_IN_PROGRESS;
    o->start_ns = now_ns;
    o->wait_src = UINT32_MAX;
    if (ccq_kinds[o->kind < CCQ_KIND_COUNT_ ? o->kind : 0].reduces)
        o->redop = op->redop;
    if (op->kind == CCQ_KIND_SEND || op->kind == CCQ_KIND_RECV) {
        /* A half of a pair across processes: the channel of the sending rank. */
        uint32_t sender = op->kind == CCQ_KIND_SEND ? op->parts[0].rank : op->peer;
        o->chan = 1 + (sender & 1);
        o->peer_proc = owner(c, op->peer);
    } else if (ccq_kinds[o->kind].rooted) {
        o->root = op->root;
        o->root_proc = owner(c, op->root);
    }
    o->nops = 1;
    o->phase = UCX_PH_PENDING;
    e->inflight++;
    return o;
}

void ucx_op_discard(ucx_op *o)
{
    o->e->inflight--;
    op_free(o);
}

/* Whether ucx_write_result streams this operation's outputs (ucx/select.c, STREAM_BYTES):
 * its buffers, or its run's (a data-parallel step's hundreds of gradients, none reused before
 * the step ends), beyond the caches, and no output that is also an input (its lines are
 * cached, and a streamed write would evict what is read next). */
static unsigned outputs_streamed(const ucx_op *o)
{
    uint32_t n = o->fz != NULL ? o->fz->n : 1;
    if (o->count * o->es < o->e->stream_bytes && o->run_bytes < o->e->stream_bytes)
        return 0;
    for (uint32_t i = 0; i < n; i++) {
        const ccq_be_op *op = o->fz != NULL ? o->fz->part[i].op : o->op;
        for (uint32_t k = 0; op != NULL && k < op->nparts; k++)
            if (op->parts[k].src == op->parts[k].dst)
                return 0;
    }
    return CCQ_HOST_REDUCE_NT;
}

ccq_status ucx_op_launch(ucx_op *o, ccq_errbuf *err)
{
    ucx_engine *e = o->e;
    ucx_comm *c = o->c;
    ccq_status st;

    /* A fused group of reductions runs its parts' own schedule whatever its size (recursive
     * doubling, the direct reduce_scatter; a commuting pair's all_reduce the ring): each
     * element then meets the same combines, in the same order (a pair: the same two operands),
     * as in its own operation (ucx/fused.c). An all_gather combines nothing. */
    if (o->fz == NULL || o->kind == CCQ_KIND_ALL_GATHER)
        o->alg = ucx_select(o);
    else
        o->alg = o->kind == CCQ_KIND_REDUCE_SCATTER ? &ucx_reduce_scatter_direct
                 : ucx_fused_ring(o)                ? &ucx_allreduce_ring
                                                    : &ucx_allreduce_rd;
    o->out_nt = outputs_streamed(o);
    st = o->fz != NULL ? fused_inputs(o, err) : local_inputs(o, err);
    if (st == CCQ_OK)
        st = o->alg->init(o, err);
    if (st != CCQ_OK)
        return st;
    o->phase = UCX_PH_RUN;
    o->minf = o->follow;
    ucx_comm_link(c, o);
    e->activity++;
    if (c->next_seq[o->chan] < o->seq + o->nops)
        c->next_seq[o->chan] = o->seq + o->nops;
    ucx_adopt_early(o);
    if (o->kind == CCQ_KIND_SEND && o->sends == NULL) {
        /* Its message left at once (UCX copied it): done, as a buffered send, whatever a
         * member says of it later (a notice then fails the communicator, not this send). */
        ucx_comm_ended(c, o);
        o->status = CCQ_OK;
    }
    return CCQ_OK;
}

static ccq_status ucx_start(ccq_host_engine *base, ccq_heng_comm *hc, const ccq_be_op *op,
                            uint64_t now_ns, ccq_heng_op **out, ccq_errbuf *err)
{
    ucx_comm *c = (ucx_comm *)hc;
    ucx_op *o;
    ccq_status st;

    (void)base;
    *out = NULL;
    if (c->failed != CCQ_OK)
        return ucx_comm_refuse(c, op, now_ns, err);
    if ((o = ucx_op_new(c, op, now_ns)) == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    if ((st = ucx_op_launch(o, err)) != CCQ_OK) {
        o->status = st;
        ucx_op_discard(o);
        return st;
    }
    *out = (ccq_heng_op *)o;
    return CCQ_OK;
}

/* One step of o: its schedule as far as it goes, then the outputs when done. */
static ccq_status op_step(ucx_op *o)
{
    ccq_errbuf err = {{0}};
    ccq_status st;

    if (o->status != CCQ_IN_PROGRESS)
        return o->status;
    if (o->c->failed != CCQ_OK) {
        /* Members that failed an operation alone while it completed here are told first
         * (ucx_comm_tell); then this operation's own notices, unless a member told this
         * process of the failure (a dead peer seen here: they may not know). */
        if (o->op != NULL)
            ucx_comm_tell(o->c, o->op, ccq_now_ns());
        o->noticed = o->c->failed_remote;
        return ucx_op_fail(o, o->c->failed == CCQ_ERR_ABORTED ? CCQ_ERR_ABORTED : o->c->failed,
                           "%s", o->c->failed_detail);
    }
    st = o->alg->advance(o, &err);
    if (st == CCQ_IN_PROGRESS)
        return st;
    if (st != CCQ_OK)
        return ucx_op_fail(o, st, "%s", err.msg[0] ? err.msg : "UCX operation failed");
    if (o->fz != NULL)
        fused_outputs(o);
    else
        local_outputs(o);
    ucx_comm_ended(o->c, o);
    o->status = CCQ_OK;
    if (o->c->agree_unit == o) { /* every member knows the same fewest now (ucx/fused.c) */
        o->c->agree_unit = NULL;
        o->c->agree_w = o->minf;
    }
    return CCQ_OK;
}

static ccq_status ucx_test(ccq_host_engine *base, ccq_heng_op *h, ccq_errbuf *err)
{
    ucx_engine *e = to_ucx(base);
    ucx_op *o = (ucx_op *)h;
    ucx_comm *c = o->c;
    ccq_status st;

    ucx_progress(e);
    check_peers(e);
    if (o->phase == UCX_PH_PENDING) {
        ucx_fuse_decide(c); /* o may start now (its window is agreed on) */
        if (o->phase == UCX_PH_PENDING) {
            if (c->failed == CCQ_OK)
                return CCQ_IN_PROGRESS;
            /* Never started: nothing was sent, nothing to tell. */
            snprintf(err->msg, sizeof err->msg, "%s", c->failed_detail);
            ucx_pend_forget(o);
            o->op = NULL;
            op_retire(o);
            return c->failed;
        }
    }
    if (o->phase == UCX_PH_MEMBER) {
        /* A fused group's part: its head (tested before it, in batch order) ended it. */
        const ucx_fused *fz = o->fz;
        if (fz->status == CCQ_IN_PROGRESS)
            return CCQ_IN_PROGRESS; /* also when the head was given up: its own deadline */
        st = fz->status;
        if (st != CCQ_OK)
            snprintf(err->msg, sizeof err->msg, "%s", fz->detail.msg);
        base->op_error_only = st != CCQ_OK && fz->op_only;
        o->op = NULL;
        op_retire(o);
        return st;
    }
    st = op_step(o);
    if (st == CCQ_IN_PROGRESS)
        return st;
    if (st != CCQ_OK) {
        snprintf(err->msg, sizeof err->msg, "%s", o->detail.msg);
        /* Every member learns it (a mismatch, a dead peer): none waits for a message of an
         * operation that failed here. */
        bool remote = o->noticed; /* it came from a member's notice */
        ucx_notice(o);
        if (!o->op_only)
            ucx_comm_fail(c, st, o->detail.msg, remote);
        base->op_error_only = o->op_only;
        if (o->fz != NULL)
            o->fz->op_only = o->op_only;
    }
    if (o->chan == 0)
        ucx_prior_ended(c, o->seq, o->nops, st == CCQ_ERR_MISMATCH && o->op_only);
    ucx_fused_end(o, st, o->detail.msg);
    o->op = NULL;
    op_retire(o);
    ucx_fuse_decide(c); /* the window it agreed on, if it was the last of one */
    return st;
}

static void ucx_describe(ccq_host_engine *base, const ccq_heng_op *h, uint64_t now_ns,
                         ccq_errbuf *err)
{
    const ucx_engine *e = to_ucx(base);
    const ucx_op *o = (const ucx_op *)h;
    const ucx_comm *c = o->c;
    size_t w;

    if (o->phase == UCX_PH_MEMBER) {
        /* A fused group's part: what its head waits for (or waited for, given up). */
        const ucx_fused *fz = o->fz;
        ccq_errbuf hd = {{0}};
        if (fz->head != NULL)
            ucx_describe(base, (const ccq_heng_op *)fz->head, now_ns, &hd);
        snprintf(
            err->msg, sizeof err->msg, "fused into the operation of sequence %" PRIu64 ": %.440s",
            fz->head != NULL ? fz->head->seq : o->seq, fz->head != NULL ? hd.msg : fz->detail.msg);
        return;
    }
    if (o->phase == UCX_PH_PENDING) {
        snprintf(err->msg, sizeof err->msg,
                 "UCX %s (%" PRIu64 " x %s, sequence %" PRIu64 ", this is process %u) has not "
                 "started after %.0f ms: it waits for sequence %" PRIu64 " to end, which tells "
                 "the member processes how many operations all of them have (fusion's "
                 "agreement, docs/fusion.md): a member process died, hangs, or stopped "
                 "submitting on this communicator",
                 ucx_kind_name(o->kind), o->count, ucx_dtype_name(o->dtype), o->seq,
                 c->procs[c->me], (double)(now_ns - o->start_ns) / 1e6,
                 c->agree_unit != NULL ? c->agree_unit->seq + c->agree_unit->nops - 1
                                       : c->agree_seq - 1);
        return;
    }
    if (o->fz != NULL)
        w = (size_t)snprintf(err->msg, sizeof err->msg,
                             "UCX fused %s (%s, %u operations of sequences %" PRIu64 "-%" PRIu64
                             ", %" PRIu64 " x %s in all) among processes ",
                             ucx_kind_name(o->kind), o->alg->name, o->nops, o->seq,
                             o->seq + o->nops - 1, o->count, ucx_dtype_name(o->dtype));
    else
        w = (size_t)snprintf(err->msg, sizeof err->msg,
                             "UCX %s (%s, %" PRIu64 " x %s, sequence %" PRIu64 ") among processes ",
                             ucx_kind_name(o->kind), o->alg->name, o->count,
                             ucx_dtype_name(o->dtype), o->seq);
    for (uint32_t p = 0; p < c->nprocs && w < sizeof err->msg; p++) {
        if (p == 16) {
            w +=
                (size_t)snprintf(err->msg + w, sizeof err->msg - w, "and %u more ", c->nprocs - 16);
            break;
        }
        w += (size_t)snprintf(err->msg + w, sizeof err->msg - w, "%u%s", c->procs[p],
                              p + 1 == c->nprocs   ? " "
                              : p + 2 == c->nprocs ? " and "
                                                   : ", ");
    }
    if (w < sizeof err->msg && o->wait_src < c->nprocs) {
        bool landing = false;
        uint32_t leaving = 0; /* this process's messages to it that UCX has not completed */
        for (const ucx_msg *m = o->arrivals; m != NULL; m = m->next)
            landing |=
                m->hdr.src == o->wait_src && m->hdr.step == o->wait_step && m->state == MSG_LANDING;
        for (const ucx_send *s = o->sends; s != NULL; s = s->next)
            leaving += s->dst == o->wait_src && ucp_request_check_status(s->req) == UCS_INPROGRESS;
        w += (size_t)snprintf(err->msg + w, sizeof err->msg - w,
                              "(%u ranks; this is process %u) waits for process %u's message "
                              "(step %u%s; %u of this process's messages to it still leaving)",
                              c->nranks, c->procs[c->me], c->procs[o->wait_src], o->wait_step,
                              landing ? ": it arrived, its data is still being fetched" : "",
                              leaving);
    } else if (w < sizeof err->msg)
        w += (size_t)snprintf(err->msg + w, sizeof err->msg - w,
                              "(%u ranks; this is process %u) waits for its sends to complete",
                              c->nranks, c->procs[c->me]);
    if (w < sizeof err->msg)
        w += (size_t)snprintf(err->msg + w, sizeof err->msg - w,
                              ", pending for %.0f ms: a member process died, hangs, or stopped "
                              "submitting on this communicator",
                              (double)(now_ns - o->start_ns) / 1e6);
    /* A process of the world whose endpoint failed (any: the one whose dying write matters need
     * not be a member here) while the awaited member is alive: UCX's shared-memory receive
     * queue may be what stopped (docs/multiprocess-host.md, "A process killed while writing").
     * A process that destroyed its runtime and exited cleanly fails its endpoints too, so the
     * detail says "exited or died". */
    uint32_t gone = UINT32_MAX;
    for (uint32_t r = 0; e->peers_failed > 0 && r < e->world_size && gone == UINT32_MAX; r++)
        if (e->peers[r].failed != UCS_OK)
            gone = r;
    if (w < sizeof err->msg && gone != UINT32_MAX &&
        (o->wait_src >= c->nprocs || e->peers[c->procs[o->wait_src]].failed == UCS_OK))
        w += (size_t)snprintf(err->msg + w, sizeof err->msg - w,
                              "; process %u's UCX connection failed earlier (it exited or died: "
                              "one killed while writing into a peer's UCX shared-memory queue "
                              "leaves that peer deaf to every sender, docs/multiprocess-host.md)",
                              gone);
    /* What the engine holds, for whoever has to work out why. */
    if (w < sizeof err->msg) {
        snprintf(err->msg + w, sizeof err->msg - w,
                 " (engine: %u message(s) here for later operations, %zu for communicators "
                 "not formed here, %" PRIu64 " dropped)",
                 c->nearly, e->norphans, e->dropped);
    }
}

static void ucx_abandon(ccq_host_engine *base, ccq_heng_op *h)
{
    ucx_op *o = (ucx_op *)h;
    if (o->phase == UCX_PH_PENDING)
        ucx_pend_forget(o);
    if (o->phase == UCX_PH_MEMBER) {
        for (uint32_t i = 0; i < o->fz->n; i++) /* its head must not write it any more */
            if (o->fz->part[i].op == o->op)
                o->fz->part[i].op = NULL;
    } else if (o->fz != NULL && o->fz->status == CCQ_IN_PROGRESS) {
        /* The head: its members are given up at the same deadline, and say what it waited
         * for. */
        ucx_describe(base, h, ccq_now_ns(), &o->fz->detail);
        o->fz->abandoned = true;
        o->fz->head = NULL;
    }
    if (o->status == CCQ_IN_PROGRESS)
        ucx_op_fail(o, CCQ_ERR_ABORTED, "given up (timeout or abort)");
    /* Later messages of this communicator are dropped: the runtime aborts it. */
    ucx_comm_fail(o->c, CCQ_ERR_ABORTED,
                  "an earlier operation on this communicator was given up (timeout or abort)",
                  false);
    o->op = NULL;
    op_retire(o);
}

static bool ucx_detach(ccq_host_engine *base, ccq_heng_op *h)
{
    ucx_op *o = (ucx_op *)h;
    (void)base;
    if (o->kind != CCQ_KIND_SEND || o->status != CCQ_IN_PROGRESS || o->sends == NULL)
        return false;
    /* Its message is posted from scratch: UCX finishes it without the user's buffer. */
    o->op = NULL;
    o->detached = true;
    o->status = CCQ_OK;
    op_retire(o);
    return true;
}

static uint32_t ucx_reap(ccq_host_engine *base)
{
    ucx_engine *e = to_ucx(base);
    uint64_t now_ns = 0; /* read once, if a moving operation needs it */

    if (e->inflight == 0 && e->nmoving == 0 && e->nbackground == 0) {
        /* Idle (ucx_poll_interval asks for UCX_IDLE_POLL_NS): progress at that pace, not at
         * every pass of a scheduler busy with other work (local collectives), and without
         * ucx_progress's yields, which are for waiting on a peer. */
        uint64_t now = ccq_now_ns();
        if (now < e->idle_poll_ns)
            return 0;
        e->idle_poll_ns = now + UCX_IDLE_POLL_NS;
        progress_burst(e);
        check_peers(e);
        ucx_probe_run(e); /* the PONGs it owes */
        return 0;
    }
    ucx_progress(e);
    check_peers(e);
    ucx_probe_run(e);
    for (ucx_op **pp = &e->background; *pp != NULL;) {
        ucx_op *o = *pp;
        if (op_held(o)) {
            bool owes = o->moving && sends_owed(e, o);
            if (owes && now_ns == 0)
                now_ns = ccq_now_ns();
            if (o->moving && (!owes || now_ns - o->retired_ns > e->timeout_ns)) {
                /* Its messages left, their receivers went, or nobody took them within
                 * timeout_ms: stop busy-polling for them. */
                o->moving = false;
                e->nmoving--;
            }
            pp = &o->next;
            continue;
        }
        *pp = o->next;
        e->nbackground--;
        e->nmoving -= o->moving;
        op_free(o);
    }
    return e->nbackground;
}

static uint64_t ucx_poll_interval(ccq_host_engine *base, bool busy)
{
    ucx_engine *e = to_ucx(base);
    (void)busy;
    if (e->inflight == 0 && e->nmoving == 0)
        return e->connected ? UCX_IDLE_POLL_NS : 0;
    /* Back to back while messages flow; a peer that has been silent for UCX_BUSY_NS is late
     * (not submitted yet, descheduled, dead): then poll calmly, leaving the core to it. */
    uint64_t now = ccq_now_ns();
    if (e->activity != e->activity_seen) {
        e->activity_seen = e->activity;
        e->last_activity_ns = now;
    }
    e->late = now - e->last_activity_ns > UCX_BUSY_NS;
    return e->late ? UCX_SLOW_POLL_NS : 1;
}

const ccq_host_engine_ops ccq_host_engine_ucx_ops = {
    .name = "ucx",
    .create = ucx_create,
    .destroy = ucx_destroy,
    .world_blob = ucx_world_blob,
    .world_ready = ucx_world_ready,
    .root_blob = ucx_root_blob,
    .comm_create = ucx_comm_create,
    .comm_test = ucx_comm_test,
    .comm_destroy = ucx_comm_destroy,
    .start = ucx_start,
    .test = ucx_test,
    .describe = ucx_describe,
    .abandon = ucx_abandon,
    .detach = ucx_detach,
    .reap = ucx_reap,
    .poll_interval = ucx_poll_interval,
    .start_run = ucx_start_run,
};
