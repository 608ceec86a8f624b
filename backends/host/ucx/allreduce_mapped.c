/* all_reduce for large buffers among the processes of one machine, over mapped scratch
 * (ucx/mapped.c): instead of passing blocks around a ring (each landed by a copy, then
 * reduced, then copied out), every process copies its input into its own mapped region, and
 * the others read it there in place.
 *
 * Per segment g (ucx_segments; `window` of them at once, segment g in slot g % window of the
 * region), in P blocks:
 *   0. this process combines its parts' inputs of the segment into its slot (copy_in) and
 *      tells every member where the slot is ("in": the region's key, its address and the
 *      slot's offset);
 *   1. once every member said so, it reduces its own block of the segment from every member's
 *      slot (members in order) into its own slot's block, and says so ("reduced");
 *   2. once every member did, it copies every member's reduced block from that member's slot
 *      to its outputs (AVG divided on the way) and says so ("done");
 *   3. once every member is done, no one reads its slot any more: the segment is done and the
 *      slot free for segment g + window.
 * Each block is reduced once, by its owner, in one order, and copied: every process ends with
 * the same bits. A member's "in" is the first message of the segment from it, checked as every
 * message is (kind, dtype, op, count, ...) before any of its bytes is read: a mismatch still
 * leaves every buffer untouched. The outputs are written only in step 2, after every member's
 * "reduced": in place holds (a segment's inputs are copied before its outputs are written, and
 * segments are disjoint).
 *
 * Memory touched per process and segment of S bytes (blocks b = S / P): the copy-in (2 S), the
 * reduction of its block (P b read, b written), the copy-out (S read, S written by streaming
 * stores from STREAM_BYTES): about 5.25 S at P = 4, against the ring's 7.5 S
 * (docs/results/2026-12-07/copy-floor). (Its own block need not be copied in: the reduction
 * could read it from the input where it is. Measured 2026-12-07, 4 x 1 32 MiB: 0.88x, slower,
 * in six of eight pairs of runs; 2 x 1 even.) The price: three small messages per member and
 * segment, and every member's progress in each step (a segment's steps wait for the slowest).
 *
 * Failure: a member that fails or stops makes the others' waits end in its error or their
 * deadline, as on the ring. A region goes back for reuse only after its operation succeeded
 * (every member said "done"); otherwise it is let go and a member still reading it keeps its
 * own mapping of that operation's bytes (ucx/mapped.c). A peer that died leaves its region
 * readable here until this operation ends. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/host/reduce.h"
#include "backends/host/ucx/ucx.h"
#include "common/clock.h"

/* Per slot and member: where that member's slot is readable here (NULL: its "in" has not come),
 * and which of its "reduced" (1) and "done" (2) came. */
typedef struct map_slot {
    char *at;
    uint8_t got;
} map_slot;

enum { STEP_IN, STEP_REDUCED, STEP_DONE, STEPS };

static ccq_status mapped_init(ucx_op *o, ccq_errbuf *err)
{
    ccq_status st = ucx_segments(o, o->count, 0, ucx_window(), err);
    if (st != CCQ_OK)
        return st;
    o->peer_map = malloc(o->P * sizeof *o->peer_map);
    if (o->peer_map == NULL || ucx_scratch(o, BUF_AUX, o->window * sizeof(ucx_map_msg)) == NULL ||
        ucx_scratch(o, BUF_TMP, (size_t)o->window * o->P * sizeof(map_slot)) == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory for UCX scratch");
        return CCQ_ERR_NO_MEMORY;
    }
    for (uint32_t p = 0; p < o->P; p++)
        o->peer_map[p] = -1;
    o->wrote_out = true;
    return CCQ_OK;
}

/* Member q's "in" (payload at buf): where its slot of this segment is readable here. */
static ccq_status peer_slot(ucx_op *o, uint32_t q, const void *buf, size_t bytes, char **at,
                            ccq_errbuf *err)
{
    ucx_engine *e = o->e;
    uint32_t wrank = o->c->procs[q];
    ucx_map_msg m;
    memcpy(&m, buf, sizeof m); /* UCX's eager payload: no alignment promised */
    if (m.bytes != bytes) {
        snprintf(err->msg, sizeof err->msg,
                 "process %u's segment of %s sequence %" PRIu64 " has %" PRIu64 " bytes where "
                 "this process (%u) expects %zu: the processes run different schedules (another "
                 "ccq version?)",
                 wrank, ucx_kind_name(o->kind), o->seq, m.bytes, o->c->procs[o->me], bytes);
        return CCQ_ERR_BACKEND;
    }
    if (o->peer_map[q] < 0 && (o->peer_map[q] = ucx_region_attach(e, wrank, &m, err)) < 0)
        return CCQ_ERR_BACKEND;
    if (e->maps[o->peer_map[q]].id != m.id || m.slot > m.len || bytes > m.len - m.slot) {
        snprintf(err->msg, sizeof err->msg,
                 "process %u's mapped scratch for %s sequence %" PRIu64 " changed or is out of "
                 "range (region %u, slot %" PRIu64 " of %" PRIu64 " bytes, %zu needed; this is "
                 "process %u)",
                 wrank, ucx_kind_name(o->kind), o->seq, m.id, m.slot, m.len, bytes,
                 o->c->procs[o->me]);
        return CCQ_ERR_BACKEND;
    }
    *at = e->maps[o->peer_map[q]].local + m.slot;
    return CCQ_OK;
}

/* Every member's header-only message of segment g's step `step` (bit: which, in got). */
static ccq_status wait_all(ucx_op *o, uint32_t g, uint32_t step, uint8_t bit, map_slot *ms,
                           ccq_errbuf *err)
{
    for (uint32_t q = 0; q < o->P; q++) {
        ucx_msg *m;
        ccq_status st;
        if (q == o->me || (ms[q].got & bit))
            continue;
        st = ucx_recv_step(o, q, g * STEPS + step, NULL, 0, &m, err);
        if (st != CCQ_OK)
            return st;
        ucx_msg_done(o->e, m);
        ms[q].got |= bit;
    }
    return CCQ_OK;
}

static ccq_status send_all(ucx_op *o, uint32_t g, uint32_t step, const void *buf, size_t bytes,
                           ccq_errbuf *err)
{
    for (uint32_t q = 0; q < o->P; q++) {
        ccq_status st;
        if (q != o->me &&
            (st = ucx_send_step(o, q, g * STEPS + step, buf, bytes, g, err)) != CCQ_OK)
            return st;
    }
    return CCQ_OK;
}

/* Step 0's combine of this process's inputs of a segment (len elements from element off0) into
 * its slot `mine`, by plain or streaming stores as each costs this process (ucx/store_pick.c),
 * fenced before the slot is said. */
static void copy_in(ucx_op *o, size_t off0, char *mine, size_t len)
{
    ucx_engine *e = o->e;
    size_t bytes = len * o->es;
    bool timed, nt = ucx_store_pick_next(&e->map_in, bytes, &timed);
    unsigned flags = nt ? CCQ_HOST_REDUCE_NT : 0;
    uint64_t t0 = timed ? ccq_thread_cpu_ns() : 0;

    ucx_part_combine(o, o->op, off0 * o->es, mine, len, flags);
    ccq_host_store_fence(flags);
    if (timed)
        ucx_store_pick_note(&e->map_in, nt, ccq_thread_cpu_ns() - t0, bytes);
}

static ccq_status mapped_seg(ucx_op *o, uint32_t g, ccq_errbuf *err)
{
    const ccq_be_op *op = o->op;
    uint32_t P = o->P, me = o->me, w = g % o->window;
    size_t es = o->es, off0 = (size_t)g * o->seg_elems;
    size_t len = o->count - off0 < o->seg_elems ? o->count - off0 : o->seg_elems;
    size_t slot_off = (size_t)w * o->seg_elems * es;
    char *mine = o->region->base + slot_off;
    map_slot *ms = (map_slot *)o->buf[BUF_TMP] + (size_t)w * P;
    ucx_seg *s = &o->seg[g];
    ccq_status st = CCQ_OK;
    size_t bo, bl;

    if (s->step == 0) {
        ucx_map_msg *say = (ucx_map_msg *)o->buf[BUF_AUX] + w;
        /* The slot's segment before is done (every member finished reading it), but UCX may
         * still hold the "in" payload it sent from say. */
        if (g >= o->window) {
            bool left = ucx_sends_done(o, g - o->window, &st, err);
            if (st != CCQ_OK)
                return st;
            if (!left)
                return CCQ_IN_PROGRESS;
        }
        copy_in(o, off0, mine, len);
        ucx_region_say(o->region, slot_off, len * es, say);
        for (uint32_t p = 0; p < P; p++)
            ms[p] = (map_slot){p == me ? mine : NULL, 0};
        if ((st = send_all(o, g, STEP_IN, say, sizeof *say, err)) != CCQ_OK)
            return st;
        s->step = 1;
    }
    if (s->step == 1) {
        const void *src[UCX_MAPPED_MAX_P];
        for (uint32_t q = 0; q < P; q++) {
            ucx_msg *m;
            if (ms[q].at != NULL)
                continue;
            st = ucx_recv_step(o, q, g * STEPS + STEP_IN, NULL, sizeof(ucx_map_msg), &m, err);
            if (st != CCQ_OK)
                return st;
            st = peer_slot(o, q, m->buf, len * es, &ms[q].at, err);
            ucx_msg_done(o->e, m);
            if (st != CCQ_OK)
                return st;
        }
        ucx_block(len, P, me, &bo, &bl);
        for (uint32_t p = 0; p < P; p++)
            src[p] = ms[p].at + bo * es;
        if (bl > 0) /* into this process's own block: each block of it is read before written */
            ucx_reduce(o, P, src, mine + bo * es, bl);
        if ((st = send_all(o, g, STEP_REDUCED, NULL, 0, err)) != CCQ_OK)
            return st;
        s->step = 2;
    }
    if (s->step == 2) {
        void *out[CCQ_MAX_DEVICES];
        if ((st = wait_all(o, g, STEP_REDUCED, 1, ms, err)) != CCQ_OK)
            return st;
        for (uint32_t p = 0; p < P; p++) {
            ucx_block(len, P, p, &bo, &bl);
            for (uint32_t k = 0; k < op->nparts; k++)
                out[k] = (char *)op->parts[k].dst + (off0 + bo) * es;
            if (bl > 0)
                ucx_write_result(o, out, op->nparts, ms[p].at + bo * es, bl);
        }
        if ((st = send_all(o, g, STEP_DONE, NULL, 0, err)) != CCQ_OK)
            return st;
        s->step = 3;
    }
    if ((st = wait_all(o, g, STEP_DONE, 2, ms, err)) != CCQ_OK)
        return st;
    s->step = 4;
    return CCQ_OK;
}

static ccq_status mapped_advance(ucx_op *o, ccq_errbuf *err)
{
    /* The region at the first step, not at init: a failure there (the machine's shared memory
     * full: a container's /dev/shm) reaches every member at once as this operation's notice,
     * where a failed init would leave them waiting for its messages until their deadline. */
    if (o->region == NULL &&
        (o->region = ucx_region_get(o->e, (size_t)o->window * o->seg_elems * o->es, err)) == NULL)
        return CCQ_ERR_BACKEND;
    return ucx_run_segments(o, mapped_seg, err);
}

const ucx_alg ucx_allreduce_mapped = {"mapped", mapped_init, mapped_advance};
