/* The judge of suspicions: what job health makes of a data engine's word.
 *
 * A data engine that reports a peer failed (UCX's peer error: a keepalive or a send that timed
 * out, a connection reset; ccq_health_peer_failed) cannot tell a peer that died from one it can
 * no longer reach while the peer goes on: its data network cut, a NIC down, with the bootstrap
 * (the control network) still carrying every heartbeat. Declared on the spot, such a report was
 * a race: with process 3's data link down, 3 reports 0, 1 and 2 while they report 3, and
 * whichever word reached the others first won; 3's often did, fencing off the three processes
 * that could go on (each learned itself lost), then 3 itself. So an engine's word is a
 * suspicion: listed in the process's record (CCQ_HOW_SUSPECT), never relayed, and judged by one
 * process, the judge: the lowest process alive in its own view whose heartbeat is fresh (or
 * itself). The judge collects the suspicions of the processes alive; once the set stopped
 * growing for 2 heartbeats (the other side's engine may see its failure later), or its oldest
 * suspicion is half of heartbeat_timeout_ms old, it declares one process lost: the one
 * suspected by the most processes; on a tie the one that suspects the most; then the highest
 * rank (a cut between two processes alone loses the higher). Its suspicions go with it (a
 * process lost counts for nothing), and the judge weighs what remains at its next pass. Only
 * a judge that hears a quorum decides (as check_ages).
 *
 * A process that really died is found so too, 2 heartbeats after its peers' engines reported
 * it (on this host, and over the tcp:// rendezvous, the OS and the closed connection say so at
 * once, as before). Where records do not travel (the MPI bootstrap) or heartbeats are off, there
 * is nobody to judge: the engine's word is declared at once, as before. */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "runtime/health/health_impl.h"
#include "runtime/internal.h"

/* The judge in this process's view: the lowest process alive whose beat is at most fresh_ns
 * old, or this process. */
static uint32_t judge_of(const ccq_health *h, uint64_t now, uint64_t fresh_ns)
{
    for (uint32_t q = 0; q < h->size; q++) {
        if (ccq_health_state_of(h, q) != CCQ_PROCESS_ALIVE)
            continue;
        if (q == h->rank || now - h->peers[q].change_ns <= fresh_ns)
            return q;
    }
    return h->rank;
}

/* Note that `by` suspects `rank` (both alive). Without memory the suspicion waits for the next
 * pass (gather notes every listed one again). */
static void note(ccq_health *h, uint32_t by, uint32_t rank, uint64_t now)
{
    if (by == rank || rank >= h->size || ccq_health_state_of(h, rank) != CCQ_PROCESS_ALIVE)
        return;
    for (uint32_t k = 0; k < h->nsus; k++)
        if (h->sus[k].by == by && h->sus[k].rank == rank) {
            h->sus[k].live = true;
            return;
        }
    if (h->nsus == h->sus_cap) {
        uint32_t cap = h->sus_cap ? 2 * h->sus_cap : 16;
        hsuspicion *s = realloc(h->sus, cap * sizeof *s);
        if (s == NULL)
            return;
        h->sus = s;
        h->sus_cap = cap;
    }
    h->sus[h->nsus++] = (hsuspicion){by, rank, now, true};
    h->sus_grew_ns = now;
}

/* Every suspicion of the processes alive, as this pass sees them; the ones no longer listed
 * (withdrawn with a loss, or their bearer lost) dropped. Monitor thread. */
static void gather(ccq_health *h, uint64_t now)
{
    for (uint32_t k = 0; k < h->nsus; k++)
        h->sus[k].live = false;
    pthread_mutex_lock(&h->lock);
    for (uint32_t q = 0; q < h->size; q++)
        if (h->suspects[q])
            note(h, h->rank, q, now);
    for (uint32_t by = 0; by < h->size; by++) {
        const hpeer *p = &h->peers[by];
        ccq_hb_view v;
        const char *why;
        if (by == h->rank || ccq_health_state_of(h, by) != CCQ_PROCESS_ALIVE || p->rec == NULL ||
            ccq_hb_decode(p->rec, p->rec_len, &v, &why) != 0)
            continue;
        for (uint32_t k = 0; k < v.head->nlost; k++)
            if (v.lost[k].how == CCQ_HOW_SUSPECT && v.lost[k].by == by)
                note(h, by, v.lost[k].rank, now);
    }
    pthread_mutex_unlock(&h->lock);
    uint32_t n = 0;
    for (uint32_t k = 0; k < h->nsus; k++)
        if (h->sus[k].live && ccq_health_state_of(h, h->sus[k].by) == CCQ_PROCESS_ALIVE &&
            ccq_health_state_of(h, h->sus[k].rank) == CCQ_PROCESS_ALIVE)
            h->sus[n++] = h->sus[k];
    h->nsus = n;
}

/* The process to declare: suspected by the most, then suspecting the most, then the highest;
 * *first gets who suspected it first (named as who saw it). */
static uint32_t verdict(const ccq_health *h, uint32_t *first)
{
    uint32_t best = UINT32_MAX, best_in = 0, best_out = 0;
    for (uint32_t q = 0; q < h->size; q++) {
        uint32_t in = 0, out = 0;
        for (uint32_t k = 0; k < h->nsus; k++) {
            in += h->sus[k].rank == q;
            out += h->sus[k].by == q;
        }
        if (in > 0 && (in > best_in || (in == best_in && out >= best_out))) {
            best = q;
            best_in = in;
            best_out = out;
        }
    }
    uint64_t at = UINT64_MAX;
    *first = h->rank;
    for (uint32_t k = 0; k < h->nsus; k++)
        if (h->sus[k].rank == best && h->sus[k].seen_ns < at) {
            at = h->sus[k].seen_ns;
            *first = h->sus[k].by;
        }
    return best;
}

void ccq_health_judge(ccq_health *h, uint64_t now, uint64_t fresh_ns, bool quorum)
{
    uint64_t settle = 2 * h->hb_ns, oldest = now;

    if (ccq_health_state_of(h, h->rank) != CCQ_PROCESS_ALIVE ||
        judge_of(h, now, fresh_ns) != h->rank) {
        h->nsus = 0; /* another judges (or nobody here): start afresh if this one becomes it */
        return;
    }
    gather(h, now);
    if (h->nsus == 0 || !quorum)
        return;
    for (uint32_t k = 0; k < h->nsus; k++)
        if (h->sus[k].seen_ns < oldest)
            oldest = h->sus[k].seen_ns;
    if (now - h->sus_grew_ns < settle && now - oldest < h->timeout_ns / 2)
        return;
    uint32_t by, q = verdict(h, &by);
    if (q == UINT32_MAX)
        return;
    pthread_mutex_lock(&h->lock);
    uint64_t age = now - h->peers[q].change_ns;
    pthread_mutex_unlock(&h->lock);
    ccq_health_declare(h, q, by, CCQ_HOW_ENGINE, age, ccq_health_realtime_ns());
}
