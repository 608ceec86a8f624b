/* What each member made of the collectives before the one a message is of.
 *
 * A disagreement that every member of hearing kinds finds fails the operation alone there
 * (msg.c, fails_alone): the communicator goes on. A member running a kind that only sends (a
 * broadcast's root) may have completed that operation first; it learns of the failure from a
 * notice and fails its communicator. Until then it may start its next collective and send
 * that one's data, with which a member that failed the one before alone would complete it,
 * while the sender fails it: the next collective succeeded on some members and failed on
 * others. So every message carries what its sender made of the collectives before it (ucx_hdr:
 * every one below prior_upto ended there; prior_sum sums ucx_prior_mix of those it failed
 * alone over a disagreement), and a receiver that ended as many compares them with its own
 * before it uses the payload: a difference fails the operation with CCQ_ERR_MISMATCH and the
 * communicator with it, on the receiver, and on the sender when the notices of the earlier
 * failure reach it. A message whose sender had not ended the disagreeing collective yet says
 * nothing of it, and a receiver that had not ended it yet takes the message as it is: then
 * its own messages of that time said nothing of it either, and their receiver took them the
 * same way. (Comparing again later, as the operation completes, was built and taken out: a
 * pair whose only messages of the next one crossed before one of them ended the disagreeing
 * collective would then fail the next one on that side and complete it on the other, which
 * judged the crossing message by what it said; reasoned, not drilled.) What that leaves
 * (several collectives in flight at once) is in docs/multiprocess-host.md, "Three or more
 * members that disagree".
 *
 * Everything here runs on the scheduler thread (ucx.h). */
#include <inttypes.h>
#include <stdio.h>

#include "backends/host/ucx/ucx.h"

uint64_t ucx_prior_mix(uint64_t seq)
{
    /* splitmix64's finaliser: sums of distinct sequences' mixes do not collide in practice, so
     * "failed 3 and completed 5" differs from "completed 3 and failed 5". */
    uint64_t z = seq + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The collective at c->prior_upto ended (alone: failed alone): move past it. */
static void prior_pass(ucx_comm *c, bool alone)
{
    if (alone)
        c->prior_sum += ucx_prior_mix(c->prior_upto);
    c->prior_upto++;
    c->prior_hist[c->prior_upto % UCX_PRIOR_HIST][0] = c->prior_upto;
    c->prior_hist[c->prior_upto % UCX_PRIOR_HIST][1] = c->prior_sum;
}

void ucx_prior_ended(ucx_comm *c, uint64_t seq, uint32_t n, bool alone)
{
    for (uint64_t s = seq; s < seq + n && !c->prior_off; s++) {
        if (s < c->prior_upto)
            continue; /* (never: each sequence ends once) */
        if (s > c->prior_upto) {
            if (s - c->prior_upto >= UCX_PRIOR_SLOTS) {
                c->prior_off = true; /* its slot still belongs to an earlier, unended one */
                return;
            }
            c->prior_slot[s % UCX_PRIOR_SLOTS] = (s + 1) << 1 | (alone ? 1u : 0u);
            continue;
        }
        /* The one at prior_upto: past it, and past those after it that ended before. */
        prior_pass(c, alone);
        for (;;) {
            uint64_t *slot = &c->prior_slot[c->prior_upto % UCX_PRIOR_SLOTS];
            if (*slot >> 1 != c->prior_upto + 1)
                break;
            bool a = (*slot & 1u) != 0;
            *slot = 0;
            prior_pass(c, a);
        }
    }
}

void ucx_prior_stamp(const ucx_comm *c, ucx_hdr *h)
{
    h->prior_upto = c->prior_off ? 0 : c->prior_upto;
    h->prior_sum = c->prior_sum;
}

/* The sum below sequence t here, if this process ended every collective below t and still
 * keeps it. */
static bool prior_sum_below(const ucx_comm *c, uint64_t t, uint64_t *sum)
{
    if (t > c->prior_upto || c->prior_upto - t >= UCX_PRIOR_HIST)
        return false;
    const uint64_t *h = c->prior_hist[t % UCX_PRIOR_HIST];
    if (h[0] != t)
        return false;
    *sum = h[1];
    return true;
}

/* The latest collective below t this process failed alone, as far as it keeps them
 * (UINT64_MAX: none). */
static uint64_t prior_last_alone(const ucx_comm *c, uint64_t t)
{
    uint64_t hi, lo;
    for (uint64_t k = t; k > 0; k--)
        if (!prior_sum_below(c, k, &hi) || !prior_sum_below(c, k - 1, &lo))
            break;
        else if (hi != lo)
            return k - 1;
    return UINT64_MAX;
}

/* Fail o: member src (its view of the collectives below t, sum) and this process ended them
 * otherwise. */
static void prior_differs(ucx_op *o, uint32_t src, uint64_t t)
{
    const ucx_comm *c = o->c;
    uint64_t mine = prior_last_alone(c, t);
    char which[128];

    if (mine != UINT64_MAX)
        snprintf(which, sizeof which, "this process failed sequence %" PRIu64 " alone", mine);
    else
        snprintf(which, sizeof which, "this process failed none of the last %u alone",
                 UCX_PRIOR_HIST);
    o->op_only = false; /* the communicator fails with it: its members ended apart */
    ucx_op_fail(o, CCQ_ERR_MISMATCH,
                "%s sequence %" PRIu64 " of a communicator spanning processes: process %u and "
                "process %u (this one) ended the collectives before sequence %" PRIu64
                " differently (one completed what the other failed alone over a disagreement; "
                "%s), so the communicator is no longer usable",
                ucx_kind_name(o->kind), o->seq, c->procs[src], c->procs[c->me], t, which);
}

bool ucx_prior_agrees(ucx_op *o, const ucx_hdr *h)
{
    uint64_t mine;

    /* Not ended here yet, or too long ago: taken as it is (above). */
    if (o->chan != 0 || h->prior_upto == 0 || o->c->prior_off ||
        !prior_sum_below(o->c, h->prior_upto, &mine) || mine == h->prior_sum)
        return true;
    prior_differs(o, h->src, h->prior_upto);
    return false;
}
