/* The table of command kinds (see kinds.h). */
#include "common/kinds.h"

#define A CCQ_USE_ALL
#define R CCQ_USE_ROOT
#define N CCQ_USE_NONE
/* name, collective, reduces, rooted, who reads src, who writes dst, src holds count * n,
 * dst holds count * n, in-place position and its rule. */
const ccq_kind_info ccq_kinds[CCQ_KIND_COUNT_] = {
    [CCQ_KIND_ALL_REDUCE] = {"all_reduce", true, true, false, A, A, false, false, CCQ_INPLACE_SAME,
                             "src == dst"},
    [CCQ_KIND_SEND] = {"send", false, false, false, A, N, false, false, CCQ_INPLACE_NONE, NULL},
    [CCQ_KIND_RECV] = {"recv", false, false, false, N, A, false, false, CCQ_INPLACE_NONE, NULL},
    [CCQ_KIND_BROADCAST] = {"broadcast", true, false, true, R, A, false, false, CCQ_INPLACE_SAME,
                            "src == dst"},
    [CCQ_KIND_REDUCE] = {"reduce", true, true, true, A, R, false, false, CCQ_INPLACE_SAME,
                         "src == dst"},
    [CCQ_KIND_ALL_GATHER] = {"all_gather", true, false, false, A, A, false, true,
                             CCQ_INPLACE_SRC_AT_RANK, "src == dst + rank * count"},
    [CCQ_KIND_REDUCE_SCATTER] = {"reduce_scatter", true, true, false, A, A, true, false,
                                 CCQ_INPLACE_DST_AT_RANK, "dst == src + rank * count"},
    [CCQ_KIND_ALL_TO_ALL] = {"all_to_all", true, false, false, A, A, true, true, CCQ_INPLACE_NONE,
                             NULL},
    [CCQ_KIND_GATHER] = {"gather", true, false, true, A, R, false, true, CCQ_INPLACE_SRC_AT_ROOT,
                         "src == dst + root_rank * count, on the root"},
    [CCQ_KIND_SCATTER] = {"scatter", true, false, true, R, A, true, false, CCQ_INPLACE_DST_AT_ROOT,
                          "dst == src + root_rank * count, on the root"},
};
#undef A
#undef R
#undef N

size_t ccq_kind_op_bytes(uint32_t kind, size_t count, size_t esize, uint32_t nranks)
{
    if (!ccq_kinds[kind].collective) /* a pair: the send reads count, the recv writes count */
        return 2 * count * esize;
    /* Every rank but one is a non-root: n - 1 of them, plus the root. */
    return (size_t)(nranks - 1) * (ccq_kind_src_bytes(kind, count, esize, nranks, false) +
                                   ccq_kind_dst_bytes(kind, count, esize, nranks, false)) +
           ccq_kind_src_bytes(kind, count, esize, nranks, true) +
           ccq_kind_dst_bytes(kind, count, esize, nranks, true);
}
