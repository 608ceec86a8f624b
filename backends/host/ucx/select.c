/* The UCX engine's choice of schedule (as UCC's tl/ucp selects by size), and what the
 * schedules share: blocks, segments.
 *
 * The thresholds are measured on the 2-core machines of docs/performance.md and can be
 * moved for experiments with CCQ_UCX_RING_BYTES (all_reduce: recursive doubling up to it,
 * the ring above), CCQ_UCX_DIRECT_AR_BYTES and CCQ_UCX_SEG_BYTES (the pipelined schedules'
 * segment size). Every process must run the same schedule for an operation: a communicator
 * runs the largest of its members' (ucx_knobs, said in the world's meeting), whatever each
 * process set. How a payload travels (CCQ_UCX_EAGER_BYTES, CCQ_UCX_BULK_BYTES) is each
 * sender's own choice. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/host/ucx/ucx.h"
#include "common/env.h"

/* all_reduce: recursive doubling (log2 P rounds of whole buffers) up to this many bytes, the
 * ring (2 (P - 1) steps of 1/P of them each) above. */
#define RING_BYTES (32u * 1024u)
/* all_reduce of 3 to UCX_DIRECT_AR_MAX_P processes: everyone to everyone at once up to this many
 * bytes, recursive doubling's combines done by each (ucx/allreduce_rd.c). Off by default
 * (0): on the 2-core machines of docs/performance.md, where 3 or 4 processes take turns on 2
 * cores whatever the schedule, it measured within the noise of recursive doubling (0.80-1.10x
 * by size and method); where every process has a core it saves round trips, not measured
 * here. CCQ_UCX_DIRECT_AR_BYTES=2048 turns it on. */
#define DIRECT_AR_BYTES 0u
/* all_gather, reduce_scatter: everyone to everyone at once up to this many bytes in all. */
#define DIRECT_BYTES (64u * 1024u)
/* Pipelined schedules: segment size, and how many segments move at once. */
#define SEG_BYTES (1u << 20)
#define WINDOW    4u
/* Payloads from this size go on the single-copy endpoint (ucx_peer.bulk). Below it the other
 * endpoint's copying rendezvous (UCX's starts at 8 KiB on shared memory) is faster: the single
 * copy's handshake, system call and page pinning cost more than the copy saved. Measured on
 * the 2-vCPU AMD VM (interleaved runs, docs/performance.md): 2 x 1 and 2 x 2, 64 KiB and
 * 128 KiB messages 1.3-1.4x faster copied, 256 KiB even, 512 KiB 1.5x faster single-copied.
 * That holds for a world of two processes with a core each, and only there is it the default:
 * - with more processes than cores the copying pipeline needs both schedulers at once, where
 *   the single copy is the reader's alone (4 x 1 on 2 cores: 0.76-0.95x copied at 512 KiB);
 * - with three processes or more, survivors of a process killed with rendezvous fragments
 *   queued for it had their own copying rendezvous stop moving (UCX 1.13 over shared memory,
 *   2-3 runs in 60 of test_host_ucx_kill_large_np3 before the single-copy endpoint existed);
 *   two processes leave one survivor, who has no one left to talk to.
 * Such worlds keep BULK_BYTES_SAFE. Processes may disagree (another core count, another
 * CCQ_UCX_BULK_BYTES): each sender picks the endpoint by its own threshold and the active
 * message id tells the receiver which one a payload came on (UCX_AM_ID_BULK), so whether an
 * unfetched rendezvous can be released (the endpoint it names still open: msg.c,
 * ucx_msg_done) is judged by where it came from, never by the receiver's threshold. */
/* Payloads below this on the copying endpoint go by UCX's eager protocol
 * (UCP_AM_SEND_FLAG_EAGER: copied into the transport's queue as the send is posted), not by
 * its copying rendezvous, which UCX 1.13 starts at 8 KiB on shared memory: a round trip (the
 * announcement, the receiver's request for the data) before any byte moves. Measured 2 x 1 on
 * the 2-vCPU AMD VM (bench/ab-libs.sh, 11 interleaved runs, medians): all_reduce 8 KiB 1.84x,
 * 32 KiB 1.81x, 64 KiB 1.22x, 128 KiB 1.18x faster eager; 256 KiB (the ring's 128 KiB
 * payloads) 1.18x more with 256 KiB than with 128 KiB here. So in a pair everything on the
 * copying endpoint goes eager (BULK_BYTES_PAIR below); CCQ_UCX_EAGER_BYTES moves it (0: never).
 * The cost: an eager payload waits in the receiver's memory (UCX's, kept until its operation
 * takes it) where a rendezvous left it in the sender's scratch until fetched. */
/* Operations of at least this many bytes (per buffer) write their outputs with streaming
 * (non-temporal) stores, unless an output is an input (in place): the user's output is not
 * read again by the engine, and a plain store first reads every line it overwrites
 * (read-for-ownership) and evicts scratch the schedule still needs. Two processes of 4 MiB
 * hold 2 x (input, output, scratch) = 24-28 MiB, near this VM's 32 MiB L3. Measured 2 x 1 on
 * the 2-vCPU AMD VM (bench/ab-libs.sh, 11 interleaved runs, medians, the fastest run in
 * parentheses): all_reduce 4 MiB 1.11x (1.11x), 8 MiB 1.56x (1.12x), 16 MiB 1.25x (1.13x)
 * faster streamed; 1 MiB 0.91x (0.65x) and 2 MiB 0.94x (0.84x): below it, the cache wins.
 * A run of smaller operations (a batch's collectives on one communicator) that reaches it
 * streams too (a data-parallel step's gradients: DDP step 2 x 2 1.11x, 2 x 1 0.98-1.03x).
 * CCQ_UCX_STREAM_BYTES moves it (0: never); a process's own choice (it changes no message). */
/* all_reduce among the processes of one machine from this many bytes: the mapped schedule
 * (ucx/allreduce_mapped.c: every process reads the others' copies of their inputs in place,
 * no block landed by a copy) instead of the ring. Every member says its own threshold in the
 * world's meeting (CCQ_UCX_MAPPED_BYTES, 0: never; a process whose UCX has no shared memory
 * says 0) and a communicator uses the largest of its members', or none where one says 0 or
 * runs on another machine: they always agree. Measured: docs/performance.md, "The mapped
 * all_reduce". */
#define MAPPED_BYTES    (1u * 1024u * 1024u)
#define STREAM_BYTES    (4u * 1024u * 1024u)
#define EAGER_BYTES     (256u * 1024u)
#define BULK_BYTES_PAIR (256u * 1024u)
#define BULK_BYTES_SAFE (64u * 1024u)

static uint64_t knob(const char *name, uint64_t def)
{
    uint64_t v;
    return ccq_env_u64(name, 1, 1ull << 40, &v) > 0 ? v : def;
}

void ucx_tuning(ucx_engine *e)
{
    e->knobs.ring_bytes = knob("CCQ_UCX_RING_BYTES", RING_BYTES);
    /* 0 = never (recursive doubling at every small size: the default). */
    uint64_t direct;
    e->knobs.direct_ar_bytes = ccq_env_u64("CCQ_UCX_DIRECT_AR_BYTES", 0, 1ull << 40, &direct) > 0
                                   ? direct
                                   : DIRECT_AR_BYTES;
    /* 0 = never (every payload from 8 KiB by UCX's rendezvous, as before 2026-12-04). */
    uint64_t eager;
    e->eager_bytes =
        ccq_env_u64("CCQ_UCX_EAGER_BYTES", 0, 1ull << 40, &eager) > 0 ? (size_t)eager : EAGER_BYTES;
    e->knobs.seg_bytes = knob("CCQ_UCX_SEG_BYTES", SEG_BYTES);
    /* 0 = never (the ring, as before 2026-12-07). */
    uint64_t mapped;
    e->map_bytes =
        ccq_env_u64("CCQ_UCX_MAPPED_BYTES", 0, 1ull << 40, &mapped) > 0 ? mapped : MAPPED_BYTES;
    /* 0 = never. */
    uint64_t stream;
    e->stream_bytes = ccq_env_u64("CCQ_UCX_STREAM_BYTES", 0, 1ull << 40, &stream) > 0
                          ? (stream == 0 ? SIZE_MAX : (size_t)stream)
                          : STREAM_BYTES;
    /* Unset: chosen by what each way costs here (ucx/allreduce_mapped.c). */
    uint64_t in_nt;
    e->map_in.fixed = ccq_env_u64("CCQ_UCX_MAPPED_STREAM", 0, 1, &in_nt) > 0 ? (int)in_nt : -1;
    /* 0 = pack them first, as before 2026-12-04: for A/B runs (the same bits either way). */
    uint64_t in_place;
    e->fused_in_place = ccq_env_u64("CCQ_UCX_FUSED_IN_PLACE", 0, 1, &in_place) <= 0 || in_place;
    /* 0 = never (every payload on the endpoint with peer error handling). Unset: chosen by
     * ucx_bulk_default once the world's size is known, BULK_BYTES_SAFE until then. */
    uint64_t bulk;
    e->bulk_auto = ccq_env_u64("CCQ_UCX_BULK_BYTES", 0, 1ull << 40, &bulk) <= 0;
    if (e->bulk_auto)
        bulk = BULK_BYTES_SAFE;
    e->bulk_bytes = bulk == 0 ? SIZE_MAX : (size_t)bulk;
    /* 0 = a polling thread never moves itself off a shared core (common/cores.h). */
    uint64_t unstack;
    e->unstack_on = ccq_env_u64("CCQ_UCX_UNSTACK", 0, 1, &unstack) <= 0 || unstack;
}

size_t ucx_bulk_default(uint32_t world_size, bool oversubscribed)
{
    return world_size == 2 && !oversubscribed ? BULK_BYTES_PAIR : BULK_BYTES_SAFE;
}

const ucx_alg *ucx_select(const ucx_op *o)
{
    size_t bytes = (size_t)o->count * o->es;
    size_t all = bytes * o->c->nranks;
    switch (o->kind) {
    case CCQ_KIND_ALL_REDUCE:
        if (o->c->map_bytes > 0 && bytes >= o->c->map_bytes && o->P <= UCX_MAPPED_MAX_P &&
            o->count >= o->P)
            return &ucx_allreduce_mapped;
        if (bytes <= o->c->knobs.direct_ar_bytes && o->c->knobs.direct_ar_bytes > 0 && o->P >= 3 &&
            o->P <= UCX_DIRECT_AR_MAX_P)
            return &ucx_allreduce_direct;
        return bytes <= o->c->knobs.ring_bytes || o->count < o->P ? &ucx_allreduce_rd
                                                                  : &ucx_allreduce_ring;
    case CCQ_KIND_REDUCE:
        return &ucx_reduce_binomial;
    case CCQ_KIND_BROADCAST:
        return &ucx_bcast_binomial;
    case CCQ_KIND_ALL_GATHER:
        return all <= DIRECT_BYTES ? &ucx_allgather_direct : &ucx_allgather_ring;
    case CCQ_KIND_REDUCE_SCATTER:
        return ucx_rs_direct(all) ? &ucx_reduce_scatter_direct : &ucx_reduce_scatter_ring;
    case CCQ_KIND_ALL_TO_ALL:
        return &ucx_alltoall_pairwise;
    case CCQ_KIND_GATHER:
        return &ucx_gather_binomial;
    case CCQ_KIND_SCATTER:
        return &ucx_scatter_binomial;
    case CCQ_KIND_RECV:
        return &ucx_recv_direct;
    default:
        return &ucx_send_direct;
    }
}

bool ucx_rs_direct(size_t all)
{
    return all <= DIRECT_BYTES;
}

void ucx_block(size_t n, uint32_t P, uint32_t b, size_t *off, size_t *len)
{
    size_t base = n / P, extra = n % P;
    *off = (size_t)b * base + (b < extra ? b : extra);
    *len = base + (b < extra ? 1 : 0);
}

ccq_status ucx_segments(ucx_op *o, size_t elems, size_t seg_bytes, uint32_t window, ccq_errbuf *err)
{
    size_t seg = (seg_bytes ? seg_bytes : (size_t)o->c->knobs.seg_bytes) / (o->es ? o->es : 1);
    if (seg == 0)
        seg = 1;
    o->seg_elems = seg;
    o->nseg = elems == 0 ? 1 : (uint32_t)((elems + seg - 1) / seg);
    o->window = window < o->nseg ? window : o->nseg;
    o->active_lo = 0;
    o->seg = calloc(o->nseg, sizeof *o->seg);
    if (o->seg == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory for %u segments", o->nseg);
        return CCQ_ERR_NO_MEMORY;
    }
    return CCQ_OK;
}

uint32_t ucx_window(void)
{
    return WINDOW;
}

ccq_status ucx_run_segments(ucx_op *o, ccq_status (*step)(ucx_op *o, uint32_t g, ccq_errbuf *err),
                            ccq_errbuf *err)
{
    uint32_t lo;
    do { /* again while the window moves: newly active segments can start now */
        uint32_t end = o->active_lo + o->window < o->nseg ? o->active_lo + o->window : o->nseg;
        lo = o->active_lo;
        for (uint32_t g = o->active_lo; g < end; g++) {
            ccq_status st;
            if (o->seg[g].done)
                continue;
            st = step(o, g, err);
            if (st == CCQ_OK)
                o->seg[g].done = 1;
            else if (st != CCQ_IN_PROGRESS)
                return st;
        }
        while (o->active_lo < o->nseg && o->seg[o->active_lo].done)
            o->active_lo++;
    } while (o->active_lo != lo && o->active_lo < o->nseg);
    return o->active_lo == o->nseg ? CCQ_OK : CCQ_IN_PROGRESS;
}

ccq_status ucx_exchange_all(ucx_op *o, ucx_place_fn out, ucx_place_fn in, char *got,
                            ccq_errbuf *err)
{
    ccq_status st;

    if (!o->sent) {
        for (uint32_t s = 1; s < o->P; s++) {
            uint32_t q = (o->me + s) % o->P;
            char *at;
            size_t len;
            out(o, q, &at, &len);
            if ((st = ucx_send_step(o, q, 0, at, len, 0, err)) != CCQ_OK)
                return st;
        }
        o->sent = true;
    }
    for (uint32_t s = 1; s < o->P && o->x[0] < o->P - 1; s++) {
        uint32_t p = (o->me + o->P - s) % o->P;
        char *land;
        size_t len;
        ucx_msg *m;
        if (got[p])
            continue;
        in(o, p, &land, &len);
        st = ucx_recv_step(o, p, 0, land, len, &m, err);
        if (st == CCQ_IN_PROGRESS)
            continue;
        if (st != CCQ_OK)
            return st;
        if (m->buf != land)
            memcpy(land, m->buf, len);
        ucx_msg_done(o->e, m);
        got[p] = 1;
        o->x[0]++;
    }
    return o->x[0] == o->P - 1 ? CCQ_OK : CCQ_IN_PROGRESS;
}

ccq_status ucx_ring_step(ucx_op *o, uint32_t g, uint32_t id, const char *send, size_t send_len,
                         char *land, size_t recv_len, uint32_t ninto, void *const *into,
                         const char *mine, ucx_msg **taken, ccq_errbuf *err)
{
    uint32_t next = (o->me + 1) % o->P, prev = (o->me + o->P - 1) % o->P;
    ucx_seg *s = &o->seg[g];
    ccq_status st = CCQ_OK;
    ucx_msg *m;

    if (!s->sent) {
        /* One send in flight per segment: the previous step's has left, so nothing this
         * step lands into is still being read. */
        if (!ucx_sends_done(o, g, &st, err))
            return st != CCQ_OK ? st : CCQ_IN_PROGRESS;
        if (st != CCQ_OK)
            return st;
        if ((st = ucx_send_step(o, next, id, send, send_len, g, err)) != CCQ_OK)
            return st;
        s->sent = 1;
    }
    if ((st = ucx_recv_step(o, prev, id, land, recv_len, &m, err)) != CCQ_OK)
        return st;
    if (taken != NULL) {
        *taken = m;
    } else if (ninto > 0) { /* the incoming partial first, then this process's */
        const void *src[2] = {m->buf, mine != NULL ? mine : into[0]};
        ucx_reduce_to(o, 2, src, ninto, into, recv_len / o->es);
    } else if (m->buf != land) {
        memcpy(land, m->buf, recv_len);
    }
    if (taken == NULL)
        ucx_msg_done(o->e, m);
    s->step++;
    s->sent = 0;
    return CCQ_OK;
}
