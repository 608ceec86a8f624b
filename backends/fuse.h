/* Fusion of small collectives (docs/fusion.md): the rule that cuts a run of a batch's
 * operations into fused groups. Every process computes it the same way from the same
 * operations (their signatures agree, and so does the communicator's fusion_bytes), which is
 * what lets the member processes of a communicator spanning processes fuse identically once
 * they agreed on how many operations all of them have: the backends call it, the runtime
 * never does. Header-only: the host backend, its engines' tests and the NCCL backend use it
 * without linking the runtime. */
#ifndef CCQ_BACKENDS_FUSE_H
#define CCQ_BACKENDS_FUSE_H

#include <stdbool.h>
#include <stdint.h>

#include "backends/backend.h"
#include "common/kinds.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The kinds one of ccq's fused layouts covers (a backend or engine may cover fewer): a bit
 * per ccq_kind. all_reduce and broadcast concatenate; all_gather and reduce_scatter
 * interleave each rank's blocks of the parts (docs/fusion.md). */
#define CCQ_FUSE_KIND(k) (1u << (k))
#define CCQ_FUSE_KINDS_ALL                                                                         \
    (CCQ_FUSE_KIND(CCQ_KIND_ALL_REDUCE) | CCQ_FUSE_KIND(CCQ_KIND_BROADCAST) |                      \
     CCQ_FUSE_KIND(CCQ_KIND_ALL_GATHER) | CCQ_FUSE_KIND(CCQ_KIND_REDUCE_SCATTER))

/* Bytes of one element (ccq_dtype_size, without the runtime). */
static inline size_t ccq_fuse_esize(uint8_t dtype)
{
    static const uint8_t sz[CCQ_DTYPE_COUNT_] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return dtype < CCQ_DTYPE_COUNT_ ? sz[dtype] : 0;
}

/* The bytes fusion counts for an operation: count x dtype size (a rank's block), whatever
 * the kind. */
static inline uint64_t ccq_fuse_bytes(const ccq_be_op *op)
{
    return (uint64_t)op->count * ccq_fuse_esize(op->dtype);
}

/* Whether an operation may fuse at all: a kind of `kinds`, on a collective channel (never a
 * send/recv), smaller than fusion_bytes, not empty. A property of the operation alone, so
 * every member process answers the same. */
static inline bool ccq_fuse_eligible(const ccq_be_op *op, uint64_t fusion_bytes, uint32_t kinds)
{
    uint64_t b = ccq_fuse_bytes(op);
    return op->kind < 32 && (kinds & CCQ_FUSE_KIND(op->kind)) && b > 0 && b < fusion_bytes;
}

/* Whether b can join a fused group whose last operation is a: the next sequence number of
 * the same communicator, the same kind, dtype, op (reductions) and root (rooted kinds). */
static inline bool ccq_fuse_follows(const ccq_be_op *a, const ccq_be_op *b)
{
    const ccq_kind_info *k = &ccq_kinds[a->kind];
    return b->comm == a->comm && b->seq == a->seq + 1 && b->kind == a->kind &&
           b->dtype == a->dtype && (!k->reduces || b->redop == a->redop) &&
           (!k->rooted || b->root == a->root);
}

/*
 * The fusion threshold a backend uses for a communicator: fusion and grouping across processes
 * are one rule (DESIGN.md, "Grouping across processes"): the engine operations of a
 * communicator spanning processes must be the same in every member, whatever each process's
 * scheduler saw ready. A backend whose engine plans a group from all its collectives
 * (span_group_limit != 0, NCCL) has no channel on which its members could agree, so its
 * spanning communicators are limited to span_group_limit collectives per group and never fuse;
 * an engine that agrees on each fusion with its members (`agrees`: the host backend's MPI and
 * UCX engines, start_run) fuses them by the communicator's threshold, the same in every member.
 * Communicators of one process fuse freely.
 */
static inline uint64_t ccq_fuse_threshold(const ccq_be_comm_desc *d, uint32_t span_group_limit,
                                          bool agrees)
{
    if (d->nprocs > 1 && (span_group_limit != 0 || !agrees))
        return 0;
    return d->fusion_bytes;
}

/* Whether next joins a fused group of `total` bytes whose last operation is last: eligible,
 * following it, and the group within fusion_bytes. The one step of the rule (ccq_fuse_group,
 * and engines that grow a group op by op as their members' checks pass). */
static inline bool ccq_fuse_joins(const ccq_be_op *last, const ccq_be_op *next, uint64_t total,
                                  uint64_t fusion_bytes, uint32_t kinds)
{
    return ccq_fuse_eligible(next, fusion_bytes, kinds) && ccq_fuse_follows(last, next) &&
           total + ccq_fuse_bytes(next) <= fusion_bytes;
}

/*
 * How many of ops[0..n-1] (a run of one communicator's operations in sequence order, n >= 1)
 * form the fused group that starts at ops[0]: ops[0] and every following one while each is
 * eligible, follows the previous one, and the group stays within fusion_bytes in all. 1 when
 * ops[0] runs alone. O(group length).
 */
static inline uint32_t ccq_fuse_group(ccq_be_op *const *ops, uint32_t n, uint64_t fusion_bytes,
                                      uint32_t kinds)
{
    uint64_t total;
    uint32_t g = 1;

    if (n == 0)
        return 0;
    if (!ccq_fuse_eligible(ops[0], fusion_bytes, kinds))
        return 1;
    total = ccq_fuse_bytes(ops[0]);
    while (g < n && ccq_fuse_joins(ops[g - 1], ops[g], total, fusion_bytes, kinds)) {
        total += ccq_fuse_bytes(ops[g]);
        g++;
    }
    return g;
}

#ifdef __cplusplus
}
#endif

#endif /* CCQ_BACKENDS_FUSE_H */
