/* Probes: what tells a peer that cannot be reached from one that is only slow, while an
 * operation waits for it.
 *
 * UCX reports a peer failed when its keepalive or a send fails, which over TCP needs the
 * connection to fail: a peer whose process died (its kernel resets the connection), or one idle
 * long enough for TCP's keepalive. With data in flight and the path cut (the data network or a
 * NIC down, the process and its heartbeats going on: a gray failure), TCP retransmits for many
 * minutes and UCX says nothing: operations waited out timeout_ms, and job health saw every
 * process alive (tests/health/partition.sh, gray3: nothing in 11 s). So while the scheduler
 * polls calmly (nothing arrived for UCX_BUSY_NS: late), each peer an operation in flight waits
 * for (the member whose message it needs, or the destination of a send UCX has not completed)
 * gets a PING, header only, at most one a second and one outstanding; its scheduler answers
 * with a PONG after its next progress (also an idle one, every UCX_IDLE_POLL_NS). A peer that
 * leaves a PING unanswered for probe_wait_ns (its heartbeat_timeout_ms: a process alive but
 * unreachable for as long as silence would take to declare it) is reported to job health once,
 * as a peer error would be: a suspicion, which the judge weighs with the other processes'
 * (runtime/health/judge.c). A peer slow behind another answers (its scheduler progresses while
 * it waits), so a stall that cascades along a ring points at the link that broke.
 *
 * Off with heartbeats off (probe_wait_ns 0): nobody would judge, and a peer's word would be
 * taken at once. */
#include <string.h>

#include "backends/host/ucx/ucx.h"
#include "common/clock.h"

/* At most one PING a second to a peer that answers. */
#define PROBE_EVERY_NS 1000000000ull

/* Send a header-only message of `type` to p on hdr/req, unless the last one sent there is
 * still leaving. */
static bool send_ctl(ucx_engine *e, ucx_peer *p, ucx_hdr *hdr, void **req, uint8_t type,
                     uint64_t seq)
{
    ucp_request_param_t prm;
    void *r;

    if (p->ep == NULL || p->failed != UCS_OK || p->left)
        return true; /* nothing to send it on: nothing owed */
    if (*req != NULL) {
        if (ucp_request_check_status(*req) == UCS_INPROGRESS)
            return false;
        ucp_request_free(*req);
        *req = NULL;
    }
    memset(hdr, 0, sizeof *hdr);
    hdr->magic = UCX_MAGIC;
    hdr->version = UCX_VERSION;
    hdr->type = type;
    hdr->wsrc = e->world_rank;
    hdr->seq = seq;
    memset(&prm, 0, sizeof prm);
    r = ucp_am_send_nbx(p->ep, UCX_AM_ID, hdr, sizeof *hdr, NULL, 0, &prm);
    if (UCS_PTR_IS_ERR(r))
        return true; /* the endpoint failed: its error callback says so */
    *req = r;
    return true;
}

void ucx_probe_recv(ucx_engine *e, const ucx_hdr *h)
{
    ucx_peer *p = &e->peers[h->wsrc];
    if (h->type == UCX_MSG_PING) {
        p->pong_owed = h->seq; /* sent after progress returns (ucx_probe_run) */
        e->pongs_owed = true;
    } else if (h->seq == p->ping_seq && p->ping_ns != 0) {
        p->ping_ns = 0;
        p->pong_ns = ccq_now_ns();
    }
}

/* Probe the peer of world rank r, which an operation waits for. */
static void probe(ucx_engine *e, uint32_t r, uint64_t now)
{
    ucx_peer *p = &e->peers[r];

    if (r == e->world_rank || p->ep == NULL || p->failed != UCS_OK || p->left || p->suspected)
        return;
    if (p->ping_ns == 0) {
        if (now - p->pong_ns >= PROBE_EVERY_NS &&
            send_ctl(e, p, &p->ping_hdr, &p->ping_req, UCX_MSG_PING, p->ping_seq + 1)) {
            p->ping_seq++;
            p->ping_ns = now;
        }
        return;
    }
    if (now - p->ping_ns > e->probe_wait_ns) {
        p->suspected = true;
        if (e->base.peer_failed != NULL)
            e->base.peer_failed(e->base.peer_failed_arg, r);
    }
}

void ucx_probe_run(ucx_engine *e)
{
    if (e->pongs_owed) {
        e->pongs_owed = false;
        for (uint32_t r = 0; r < e->world_size; r++) {
            ucx_peer *p = &e->peers[r];
            if (p->pong_owed == 0)
                continue;
            if (send_ctl(e, p, &p->pong_hdr, &p->pong_req, UCX_MSG_PONG, p->pong_owed))
                p->pong_owed = 0;
            else
                e->pongs_owed = true; /* the last PONG to it still leaving: next pass */
        }
    }
    if (e->probe_wait_ns == 0 || !e->late || e->inflight == 0)
        return;
    uint64_t now = ccq_now_ns();
    for (ucx_comm *c = e->comms; c != NULL; c = c->next)
        for (ucx_op *o = c->ops; o != NULL; o = o->comm_next) {
            if (o->phase != UCX_PH_RUN || o->status != CCQ_IN_PROGRESS)
                continue;
            if (o->wait_src < c->nprocs && o->wait_src != c->me) {
                probe(e, c->procs[o->wait_src], now);
                continue;
            }
            for (const ucx_send *s = o->sends; s != NULL; s = s->next)
                if (s->dst < c->nprocs && ucp_request_check_status(s->req) == UCS_INPROGRESS) {
                    probe(e, c->procs[s->dst], now);
                    break;
                }
        }
}

void ucx_probe_release(ucx_engine *e)
{
    for (uint32_t r = 0; e->peers != NULL && r < e->world_size; r++) {
        ucx_peer *p = &e->peers[r];
        if (p->ping_req != NULL)
            ucp_request_free(p->ping_req);
        if (p->pong_req != NULL)
            ucp_request_free(p->pong_req);
        p->ping_req = p->pong_req = NULL;
    }
}
