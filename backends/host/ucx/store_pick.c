/* How the mapped all_reduce copies its inputs into its slots (ucx/allreduce_mapped.c,
 * copy_in): by plain or by streaming stores, whichever costs this process less.
 *
 * A slot's lines were last read by the other members, on other cores. Where those cores share
 * a cache with this one, a plain store takes each line back from it cheaply, and the members
 * then read the slot from that cache. Where that is dear (the 2-vCPU VMs of
 * docs/performance.md, in phases of minutes: as we read them, vCPUs the host placed apart),
 * every line comes back from another cache one by one and the copy costs 2.7-3.3x its CPU time
 * (four processes, 32 MiB). Streaming stores skip that, but leave the slot in memory, where the
 * members' reduction reads it (1.6x the reduction's time where the caches are shared).
 *
 * So plain stores unless they cost more than 1.25x streaming ones per byte. Each cost is timed
 * in the scheduler thread's CPU time (a preemption in the middle of a copy does not count) over
 * copies of at least UCX_PICK_MIN_BYTES, averaged (a quarter of each new copy), measured plain
 * first, then streaming, and from then on every PICK_EXPLORE-th timed copy goes the other way,
 * which keeps both costs current as the phase changes. Each process chooses alone: the choice
 * changes no message and no bit of a result. CCQ_UCX_MAPPED_STREAM=0 or 1 fixes it (fixed). */
#include "backends/host/ucx/ucx.h"

#define PICK_EXPLORE 64u

static bool cheaper_streamed(const ucx_store_pick *k)
{
    if (k->cost[0] == 0 || k->cost[1] == 0) /* plain measured first, then streaming */
        return k->cost[0] != 0;
    return k->cost[0] * 4 > k->cost[1] * 5;
}

bool ucx_store_pick_streamed(const ucx_store_pick *k)
{
    return k->fixed >= 0 ? k->fixed != 0 : cheaper_streamed(k);
}

bool ucx_store_pick_next(ucx_store_pick *k, size_t bytes, bool *timed)
{
    bool nt = ucx_store_pick_streamed(k);
    *timed = k->fixed < 0 && bytes >= UCX_PICK_MIN_BYTES;
    if (*timed && ++k->timed % PICK_EXPLORE == 0 && k->cost[0] != 0 && k->cost[1] != 0)
        nt = !nt;
    return nt;
}

void ucx_store_pick_note(ucx_store_pick *k, bool streamed, uint64_t cpu_ns, size_t bytes)
{
    uint64_t per_mib = (uint64_t)((double)cpu_ns * (1 << 20) / (double)bytes) + 1;
    uint64_t *c = &k->cost[streamed];
    *c = *c == 0 ? per_mib : *c - *c / 4 + per_mib / 4;
}
