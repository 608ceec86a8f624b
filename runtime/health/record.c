/* Decoding heartbeat records (record.h): every count is checked against the record's length
 * before anything is read, so a truncated or foreign record is refused, never misread. */
#include "runtime/health/record.h"

#include <stddef.h>
#include <string.h>

int ccq_hb_decode(const void *rec, size_t len, ccq_hb_view *out, const char **why)
{
    const unsigned char *p = rec;
    const ccq_hb_head *h = rec;
    size_t need = sizeof *h;

    if (len < sizeof *h || ((uintptr_t)rec & 7u) != 0) {
        *why = "truncated";
        return -1;
    }
    if (h->magic != CCQ_HB_MAGIC || h->version != CCQ_HB_VERSION || h->head_size != sizeof *h) {
        *why = "not a heartbeat record of this version";
        return -1;
    }
    if (h->nlost > h->world_size || h->ncomms > CCQ_HB_MAX_COMMS) {
        *why = "bad counts";
        return -1;
    }
    need += (size_t)h->nlost * sizeof(ccq_hb_lost);
    if (need > len) {
        *why = "truncated";
        return -1;
    }
    out->head = h;
    out->lost = (const ccq_hb_lost *)(p + sizeof *h);
    out->comms = p + need;
    for (uint32_t k = 0; k < h->ncomms; k++) {
        ccq_hb_comm c;
        if (need + sizeof c > len) {
            *why = "truncated";
            return -1;
        }
        memcpy(&c, p + need, sizeof c);
        if (c.nranges > CCQ_HB_MAX_RANGES || need + ccq_hb_comm_size(c.nranges) > len) {
            *why = "truncated";
            return -1;
        }
        need += ccq_hb_comm_size(c.nranges);
    }
    return 0;
}

const ccq_hb_comm *ccq_hb_next_comm(const unsigned char **cursor, const uint32_t **ranges)
{
    const ccq_hb_comm *c = (const ccq_hb_comm *)*cursor;
    *ranges = (const uint32_t *)(*cursor + sizeof *c);
    *cursor += ccq_hb_comm_size(c->nranges);
    return c;
}

/* tools/ccq-trace reads these records with Python's struct module: the layout is fixed. */
_Static_assert(sizeof(ccq_hb_head) == 152 && offsetof(ccq_hb_head, nonce) == 16 &&
                   offsetof(ccq_hb_head, state) == 40 &&
                   offsetof(ccq_hb_head, heartbeat_ms) == 64 &&
                   offsetof(ccq_hb_head, nlost) == 80 && offsetof(ccq_hb_head, hostname) == 88,
               "heartbeat header layout (tools/ccq-trace, docs/multiprocess.md)");
_Static_assert(sizeof(ccq_hb_lost) == 32, "lost entry layout (tools/ccq-trace)");
_Static_assert(sizeof(ccq_hb_comm) == 56 && offsetof(ccq_hb_comm, submitted) == 16 &&
                   offsetof(ccq_hb_comm, pending_kind) == 32 &&
                   offsetof(ccq_hb_comm, pending_seq) == 40,
               "communicator entry layout (tools/ccq-trace)");
