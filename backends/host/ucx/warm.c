/* Warming the shared-memory path to a peer of this host, once, when its endpoint is made.
 *
 * Why: UCX's shared-memory transports (posix, sysv) copy a message that does not fit a FIFO
 * element inline (above ~400 bytes with ccq's 512-byte elements, engine.c) into a receive
 * descriptor of 8 KiB that the receiver owns and the sender maps. Each FIFO element (64 by
 * default, UCX_MM_FIFO_SIZE) has its own descriptor, and each page of one is touched for the
 * first time by the first message through that element: a page fault in the sender (its
 * mapping of the receiver's memory) and one in the receiver (reading the header that UCP puts
 * after the payload). In a chain of 2 KiB all_reduces, 2 x 1 on the 2-vCPU VM, the first ~70
 * operations took 6-12 us where the rest took 2.8 (`getrusage`: 125 minor faults in operations
 * 10-90 of each process, 20 with the warm-up; 4 x 1: 170 against 29-43). A chain of 100 after
 * 5 warm-ups (bench/ab-libs.sh) then measured the faults, not the engine: 2 KiB 7.5 against
 * 3.6 us warmed.
 *
 * What: right before ccq's first message to a peer of this host, as many messages as the
 * receiver's FIFO has elements (CCQ_UCX_WARM_MSGS moves it; 0 = none), of UCX_WARM_BYTES each,
 * on an active message id of their own that the receiver's handler reads a byte of every 2 KiB
 * of and drops. Nothing waits for them; the operation's own message queues behind them (UCX
 * keeps an endpoint's order), so the first operation on a path pays its faults at once rather
 * than the next 64 one by one. The faults are as many: this moves them, it does not remove them;
 * every operation after the first then costs what the transport costs. Only peers a process
 * sends to (a schedule talks to few of its communicator's members: recursive doubling to log2 P,
 * the ring to one), and only peers of this host (the same ccq_host_id, in the world's blobs):
 * across hosts UCX's transports have no such descriptors.
 *
 * Not counted as ccq's messages (ucx_peer.sent/got, the goodbye's count): the peer drops them
 * before anything of ccq sees them. A peer that dies meanwhile fails them, which nobody reads
 * (its endpoint's error reaches the operations as always). */
#include <stdlib.h>

#include "backends/host/ucx/ucx.h"
#include "common/env.h"

/* Fills a descriptor (UCX_MM_SEG_SIZE, 8256 bytes by default) less UCP's header, so that every
 * page of it is touched: a message of 4-8 KiB reaches its last page. A smaller SEG_SIZE only
 * splits these in fragments. */
#define UCX_WARM_BYTES 8192u
/* UCX 1.13's UCX_MM_FIFO_SIZE default (src/uct/sm/mm/base/mm_iface.c). */
#define UCX_FIFO_SIZE_DEFAULT 64u

static const char warm_payload[UCX_WARM_BYTES];

ucs_status_t ucx_am_recv_warm(void *arg, const void *header, size_t header_length, void *data,
                              size_t length, const ucp_am_recv_param_t *param)
{
    const volatile char *d = data;

    (void)arg, (void)header, (void)header_length, (void)param;
    /* The receiver's own first touch of each page (a read: its mapping faults as a write's). */
    for (size_t i = 0; i < length; i += 2048)
        (void)d[i];
    if (length > 0)
        (void)d[length - 1];
    return UCS_OK;
}

/* The receiving FIFO's elements as UCX will size it: every process of a host reads the same
 * environment (UCX's own setting must agree there anyway). */
static uint32_t fifo_size(void)
{
    static const char *const names[] = {"UCX_POSIX_FIFO_SIZE", "UCX_SYSV_FIFO_SIZE",
                                        "UCX_MM_FIFO_SIZE"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        uint64_t v;
        if (ccq_env_u64(names[i], 1, 1u << 20, &v) > 0)
            return (uint32_t)v;
    }
    return UCX_FIFO_SIZE_DEFAULT;
}

uint32_t ucx_warm_default(void)
{
    uint64_t v;
    if (ccq_env_u64("CCQ_UCX_WARM_MSGS", 0, 1u << 20, &v) > 0)
        return (uint32_t)v;
    return fifo_size();
}

void ucx_warm_path(ucx_engine *e, ucx_peer *p)
{
    p->warmed = true;
    if (!p->near || p->ep == NULL)
        return;
    for (uint32_t i = 0; i < e->warm_msgs; i++) {
        void *req = ucp_am_send_nbx(p->ep, UCX_AM_ID_WARM, NULL, 0, warm_payload,
                                    sizeof warm_payload, &e->send_eager);
        if (UCS_PTR_IS_ERR(req))
            break; /* the peer is gone: its endpoint's error says so where it matters */
        if (req != NULL)
            ucp_request_free(req); /* UCX frees it once sent (or failed) */
    }
}
