/* The host backend's fused all_reduce kernel: reduce n local buffers, write all n results. */
#ifndef CCQ_HOST_REDUCE_H
#define CCQ_HOST_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "ccq.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Reduce elements [begin, end) of n inputs in rank order and write the result to all n
 * outputs.
 *
 * The range is processed in blocks of CCQ_HOST_REDUCE_BLOCK_BYTES of accumulator kept on
 * the stack: for each block, that block of all n inputs is read and combined in rank order
 * 0..n-1, then the block is written to all n outputs. Every input of a block is read before
 * any output of it is written, so dst[r] == src[r] (in place) is allowed; the buffers of
 * different ranks must not otherwise overlap. Memory traffic is exactly 2 * n * bytes.
 * Disjoint ranges may run concurrently from different threads (that is how the backend
 * splits a large op); the result does not depend on how the range is split.
 *
 * Semantics per type (they match NCCL's where NCCL defines them):
 *  - Integers: SUM and PROD wrap in the type; MAX and MIN compare with the type's
 *    signedness; AVG is the wrapped sum divided by n with C's truncating division, in the
 *    type's signedness.
 *  - float32, float64: accumulate in the type in rank order; AVG is sum / n (a division);
 *    MAX and MIN propagate NaN: max(acc, x) = (acc != acc || acc > x) ? acc : x, and
 *    min(acc, x) = (acc != acc || acc < x) ? acc : x.
 *  - float16, bfloat16, fp8 e4m3, fp8 e5m2: inputs are widened to float, accumulated in
 *    float with the float32 rules, and rounded once at the end with convert.h (nearest
 *    even; binary16/bfloat16 overflow to inf, fp8 saturates to its largest finite value).
 *  - n == 1 copies the input (AVG divides by 1); n == 0, begin >= end, or an invalid
 *    dtype or op does nothing.
 *
 * Element offsets begin and end apply to every buffer. Single-threaded; no allocation.
 */
void ccq_host_allreduce_range(ccq_dtype dtype, ccq_reduce_op op, uint32_t n, const void *const *src,
                              void *const *dst, size_t begin, size_t end);

/* The same, with flags: CCQ_HOST_REDUCE_NT writes the outputs with non-temporal stores
 * (x86 SSE2; ignored elsewhere). Use it for large out-of-place buffers only. */
#define CCQ_HOST_REDUCE_NT 1u
void ccq_host_allreduce_range_ex(ccq_dtype dtype, ccq_reduce_op op, uint32_t n,
                                 const void *const *src, void *const *dst, size_t begin, size_t end,
                                 unsigned flags);

/* Reduce n inputs into nout outputs (reduce: nout = 1; reduce_scatter: one call per output
 * block). Same semantics, blocking and in-place rules as ccq_host_allreduce_range; an output
 * may be one of the inputs. */
void ccq_host_reduce_range(ccq_dtype dtype, ccq_reduce_op op, uint32_t n, const void *const *src,
                           uint32_t nout, void *const *dst, size_t begin, size_t end,
                           unsigned flags);

/* AVG's last step on a sum reduced elsewhere (the engines across processes): dst[i] =
 * src[i] / n with the kernels' AVG semantics (integers: C's truncating division in their
 * signedness; floats: a correctly rounded division, narrow types widened to float and rounded
 * once). For n a power of two a float division is done as a multiplication by 1/n, which
 * gives the same bits (both round the same exact value) and vectorizes. dst may be src. */
void ccq_host_divide(ccq_dtype dtype, const void *src, void *dst, size_t count, uint32_t n);
/* The same, with flags: CCQ_HOST_REDUCE_NT writes dst by streaming stores (then fence, as
 * for ccq_host_copy). */
void ccq_host_divide_ex(ccq_dtype dtype, const void *src, void *dst, size_t count, uint32_t n,
                        unsigned flags);

/* Copy `bytes` from src to dst (not overlapping); with CCQ_HOST_REDUCE_NT by non-temporal
 * stores from the first 16-byte boundary of dst on. Those are weakly ordered: call
 * ccq_host_store_fence(flags) once after the last copy, before the data is published. */
void ccq_host_copy(void *dst, const void *src, size_t bytes, unsigned flags);
void ccq_host_store_fence(unsigned flags);

/* Bytes of accumulator per block: well inside L1 together with the stream of inputs. */
#define CCQ_HOST_REDUCE_BLOCK_BYTES 8192

#ifdef __cplusplus
}
#endif

#endif /* CCQ_HOST_REDUCE_H */
