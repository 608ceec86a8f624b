/* What each kind of command is: one table, indexed by the public ccq_kind, that the runtime
 * (validation, matching, hazards, details), the backends and the trace writer read. Adding a
 * collective touches this table, its public wrapper and the backends' kernels. */
#ifndef CCQ_COMMON_KINDS_H
#define CCQ_COMMON_KINDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ccq.h"

/* Which ranks use a buffer: none, every rank, or the root only. */
enum { CCQ_USE_NONE, CCQ_USE_ALL, CCQ_USE_ROOT };

/* The one in-place position of a kind (NCCL's), in elements: where src may sit in dst. */
enum {
    CCQ_INPLACE_NONE,        /* no in-place form: any overlap is refused */
    CCQ_INPLACE_SAME,        /* src == dst */
    CCQ_INPLACE_SRC_AT_RANK, /* src == dst + rank * count (all_gather) */
    CCQ_INPLACE_DST_AT_RANK, /* dst == src + rank * count (reduce_scatter) */
    CCQ_INPLACE_SRC_AT_ROOT, /* src == dst + root_rank * count, on the root (gather) */
    CCQ_INPLACE_DST_AT_ROOT, /* dst == src + root_rank * count, on the root (scatter) */
};

typedef struct ccq_kind_info {
    const char *name;
    bool collective;          /* on the communicator's collective channel (else send/recv) */
    bool reduces;             /* takes a reduce op */
    bool rooted;              /* takes a root */
    uint8_t src_use, dst_use; /* CCQ_USE_*: which ranks read src / write dst */
    bool src_n, dst_n;        /* the buffer holds count * n elements (else count) */
    uint8_t inplace;          /* CCQ_INPLACE_* */
    const char *inplace_rule; /* the in-place rule in words, for details; NULL: none */
} ccq_kind_info;

extern const ccq_kind_info ccq_kinds[CCQ_KIND_COUNT_];

/*
 * An operation (ccq_be_op) has the kind of the collective, or CCQ_KIND_SEND for a matched
 * send/recv pair (its part 0 sends, part 1 receives): a backend never sees CCQ_KIND_RECV.
 */

static inline size_t ccq_kind_use_bytes_(uint8_t use, bool times_n, size_t count, size_t esize,
                                         uint32_t n, bool is_root)
{
    if (use == CCQ_USE_NONE || (use == CCQ_USE_ROOT && !is_root))
        return 0;
    return count * esize * (times_n ? n : 1u);
}

/* Bytes of one rank's src / dst (0 when that rank does not use it). Inline: on every
 * submission. */
static inline size_t ccq_kind_src_bytes(uint32_t kind, size_t count, size_t esize, uint32_t n,
                                        bool is_root)
{
    const ccq_kind_info *k = &ccq_kinds[kind];
    return ccq_kind_use_bytes_(k->src_use, k->src_n, count, esize, n, is_root);
}

static inline size_t ccq_kind_dst_bytes(uint32_t kind, size_t count, size_t esize, uint32_t n,
                                        bool is_root)
{
    const ccq_kind_info *k = &ccq_kinds[kind];
    return ccq_kind_use_bytes_(k->dst_use, k->dst_n, count, esize, n, is_root);
}

/* Bytes an operation of nranks ranks reads plus writes over all of them (a send/recv pair:
 * the send's src and the recv's dst): what it costs to run. */
size_t ccq_kind_op_bytes(uint32_t kind, size_t count, size_t esize, uint32_t nranks);

#endif /* CCQ_COMMON_KINDS_H */
