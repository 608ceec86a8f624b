/* The fusion tests' workload (test_fusion.c in one process, test_fusion_world.c across
 * processes): a sequence of small collectives of every fusable kind whose sizes sit around
 * the fusion threshold, submitted part by part, and the rule that says which of them fuse,
 * written here from docs/fusion.md (not from backends/fuse.h) as the tests' oracle. */
#ifndef CCQ_TESTS_FUSION_WORK_H
#define CCQ_TESTS_FUSION_WORK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ccq.h"
#include "ref.h"

typedef struct fw_op {
    ccq_kind kind;
    size_t count;
    uint32_t root; /* a rank (broadcast) */
} fw_op;

/* Byte sizes, as multiples of F/16, of the ops in a run: below, at and above the threshold,
 * pairs that fill it exactly, ones that overflow it. 0 stands for one element. */
static const uint32_t fw_sixteenths[] = {0, 4, 15, 16, 8, 8, 12, 0, 32, 3, 5, 9, 1, 16, 2, 2};
#define FW_NSIZES (sizeof fw_sixteenths / sizeof fw_sixteenths[0])

/* The plan: runs of all_reduce, broadcast (two roots), all_gather and reduce_scatter (or
 * all_reduce only), each run of FW_NSIZES ops with the sizes above, the kinds cycling, until
 * nops ops (at most cap) or, with nops == 0, one cycle (6 runs; 2 of all_reduce only).
 * Returns the op count. */
static inline size_t fw_plan_n(fw_op *ops, size_t cap, size_t nops, ccq_dtype dt, uint64_t F,
                               uint32_t nranks, bool all_kinds)
{
    static const ccq_kind run_kinds[] = {CCQ_KIND_ALL_REDUCE,     CCQ_KIND_BROADCAST,
                                         CCQ_KIND_BROADCAST,      CCQ_KIND_ALL_GATHER,
                                         CCQ_KIND_REDUCE_SCATTER, CCQ_KIND_ALL_REDUCE};
    size_t es = ref_dtype_size(dt), n = 0, nk = sizeof run_kinds / sizeof run_kinds[0];
    size_t want = nops ? nops : (all_kinds ? nk : 2) * FW_NSIZES;
    for (size_t r = 0; n < want && n < cap; r++) {
        for (size_t i = 0; i < FW_NSIZES && n < want && n < cap; i++) {
            size_t bytes = (size_t)(F * fw_sixteenths[i] / 16);
            fw_op *o = &ops[n++];
            o->kind = all_kinds ? run_kinds[r % nk] : CCQ_KIND_ALL_REDUCE;
            o->count = bytes / es > 0 ? bytes / es : 1;
            o->root = r % nk == 2 ? nranks - 1 : 0;
        }
    }
    return n;
}

static inline size_t fw_plan(fw_op *ops, size_t cap, ccq_dtype dt, uint64_t F, uint32_t nranks,
                             bool all_kinds)
{
    return fw_plan_n(ops, cap, 0, dt, F, nranks, all_kinds);
}

/* Whether op may fuse at all, and whether b may follow a in a fused op (docs/fusion.md). */
static inline bool fw_eligible(const fw_op *o, ccq_dtype dt, uint64_t F)
{
    uint64_t bytes = (uint64_t)o->count * ref_dtype_size(dt);
    bool kind = o->kind == CCQ_KIND_ALL_REDUCE || o->kind == CCQ_KIND_BROADCAST ||
                o->kind == CCQ_KIND_ALL_GATHER || o->kind == CCQ_KIND_REDUCE_SCATTER;
    return kind && F > 0 && bytes > 0 && bytes < F;
}

/* The oracle for one batch holding ops [0, n) of one communicator: the length of the fused
 * group starting at op i (1: alone). */
static inline size_t fw_group(const fw_op *ops, size_t i, size_t n, ccq_dtype dt, uint64_t F)
{
    size_t es = ref_dtype_size(dt), g = 1;
    uint64_t total;
    if (!fw_eligible(&ops[i], dt, F))
        return 1;
    total = ops[i].count * es;
    while (i + g < n && fw_eligible(&ops[i + g], dt, F) && ops[i + g].kind == ops[i].kind &&
           (ops[i].kind != CCQ_KIND_BROADCAST || ops[i + g].root == ops[i].root) &&
           total + ops[i + g].count * es <= F) {
        total += ops[i + g].count * es;
        g++;
    }
    return g;
}

#endif /* CCQ_TESTS_FUSION_WORK_H */
