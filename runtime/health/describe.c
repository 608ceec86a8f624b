/* The words of job health: what every command failed by a loss says, and how a loss was
 * seen. Details name "process P" and its devices first (tests and tools look for them). */
#include <inttypes.h>
#include <stdio.h>

#include "runtime/health/health_impl.h"
#include "runtime/internal.h"

const char *ccq_health_how_name(uint32_t how)
{
    switch (how) {
    case CCQ_HOW_HEARTBEAT:
        return "its heartbeat stopped";
    case CCQ_HOW_EXITED:
        return "its process exited";
    case CCQ_HOW_CLOSED:
        return "its rendezvous connection closed";
    case CCQ_HOW_ENGINE:
        return "the data engine reported it failed";
    case CCQ_HOW_SILENT:
        return "it served the tcp rendezvous and went silent with its connection open, "
               "stopped or hung";
    case CCQ_HOW_CUT_OFF:
        return "it was cut off from a quorum of the processes (a network partition, or its "
               "own link)";
    default:
        return "?";
    }
}

/* "devices 4..5", "device 4", "no devices". */
static size_t fmt_devices(const ccq_health *h, uint32_t p, char *buf, size_t len)
{
    const ccq_world *w = &h->rt->world;
    uint32_t first = w->first[p], end = w->first[p + 1];
    if (end == first)
        return ccq_format(buf, len, "no devices");
    if (end - first == 1)
        return ccq_format(buf, len, "device %u", first);
    return ccq_format(buf, len, "devices %u..%u", first, end - 1);
}

size_t ccq_health_describe_loss(const ccq_health *h, uint32_t p, char *buf, size_t len)
{
    const hpeer *q = &h->peers[p];
    uint64_t now = ccq_now_ns();
    double ago = (double)(now - q->lost_ns) / 1e9;
    size_t w;
    char devs[64];
    /* An engine's word is declared only after the judge weighed it where heartbeats run
     * (judge.c; the world runs one heartbeat setting, so every process's word went so). */
    const char *judged =
        q->how == CCQ_HOW_ENGINE && h->judged
            ? ", which job health's judge weighed with the other processes' reports"
            : "";

    fmt_devices(h, p, devs, sizeof devs);
    if (p == h->rank && q->how == CCQ_HOW_CUT_OFF) {
        /* It heard too few of the others for too long: it gave itself up (check_quorum). */
        return ccq_format(
            buf, len,
            "process %" PRIu32 " (this process, %s) cut itself off %.1f s ago: for %.1f s it "
            "heard from no quorum of the processes that may be alive (more than half of them, "
            "or half with the lowest): a network partition, or its own link; it is fenced off, "
            "its communicators spanning processes fail, and the others go on without it where "
            "a quorum of them still hear each other",
            p, devs, ago, (double)q->hb_age_ns / 1e9);
    }
    if (p == h->rank) {
        /* Fenced off: it ran on while the others had given it up. */
        w = ccq_format(
            buf, len,
            "process %" PRIu32 " (this process, %s) was declared lost by process %" PRIu32
            " (%s%s; its last heartbeat %.1f s old then), which it learned %.1f s ago "
            "(it was stopped or cut off meanwhile): it is fenced off, its communicators "
            "spanning processes fail and nothing it sends reaches the others",
            p, devs, q->by, ccq_health_how_name(q->how), judged, (double)q->hb_age_ns / 1e9, ago);
        return w;
    }
    w = ccq_format(buf, len, "process %" PRIu32 " (%s) was lost %.1f s ago: ", p, devs, ago);
    if (q->by == h->rank)
        w += ccq_format(buf + w, len - w, "this process (%" PRIu32 ") saw that %s%s", h->rank,
                        ccq_health_how_name(q->how), judged);
    else
        w += ccq_format(buf + w, len - w, "process %" PRIu32 " saw that %s%s", q->by,
                        ccq_health_how_name(q->how), judged);
    if (h->records) /* (the MPI bootstrap carries no heartbeats: only the OS tells) */
        w += ccq_format(buf + w, len - w, " (its last heartbeat %.1f s old then)",
                        (double)q->hb_age_ns / 1e9);
    return w;
}
