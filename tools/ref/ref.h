/* A slow, independent reference for reductions and narrow-float conversions, for tests. */
#ifndef CCQ_TESTS_REF_H
#define CCQ_TESTS_REF_H

#include <stddef.h>
#include <stdint.h>

#include "ccq.h"

/*
 * Everything here is written element by element, from the definitions, without sharing
 * code or tricks with the library, so that a test comparing the two really cross-checks.
 * All functions are thread-safe (no global state).
 */

/* Bytes per element of dtype, or 0 for an invalid value. */
size_t ref_dtype_size(ccq_dtype dtype);

/*
 * out[i] = inputs[0][i] op inputs[1][i] op ... op inputs[n-1][i], with the semantics of
 * ccq_host_allreduce_range (see backends/host/reduce.h): integers wrap, AVG truncates in
 * the type's signedness; float32/float64 accumulate in the type; float16, bfloat16 and the
 * fp8 types accumulate in float and round once; MAX/MIN propagate NaN; AVG is sum / n.
 * out may be one of the inputs. n >= 1.
 */
void ref_allreduce(ccq_dtype dtype, ccq_reduce_op op, uint32_t n, const void *const *inputs,
                   void *out, size_t count);

/* Deterministic pseudo-random values for the type: small integers (with some full-range
 * ones mixed in), floats in about [-4, 4] with some zeros, never NaN. */
void ref_fill(ccq_dtype dtype, void *buf, size_t count, uint32_t seed);

/* Like ref_fill, but float types get values in {-1, 0, 1}: every sum and product of a few
 * ranks is exact in every float type, so results compare bit for bit whatever order an engine
 * (MPI, NCCL) reduces in. Integer types as ref_fill. */
void ref_fill_exact(ccq_dtype dtype, void *buf, size_t count, uint32_t seed);

/*
 * Number of elements whose bits differ (two NaNs of the type count as equal). When there
 * is a mismatch and msglen > 0, msg receives the first one: index, got, want.
 */
size_t ref_compare(ccq_dtype dtype, const void *got, const void *want, size_t count, char *msg,
                   size_t msglen);

/*
 * Narrow-float codecs for CCQ_FLOAT16, CCQ_BFLOAT16, CCQ_FLOAT8E4M3 and CCQ_FLOAT8E5M2 (the
 * code is in the low bits). Decoding evaluates the format's formula; encoding searches the
 * ordered finite codes for the nearest value, ties to the even code, then applies the
 * format's overflow rule: float16 and bfloat16 round to +-inf like IEEE, the fp8 types
 * saturate to their largest finite value (inf too); NaN gives a quiet NaN code.
 */
double ref_decode(ccq_dtype dtype, uint32_t code);
uint32_t ref_encode(ccq_dtype dtype, float value);

/*
 * The collectives of ccq.h other than send/recv, from their definitions (NCCL's): what rank
 * `rank`'s dst holds afterwards. Ranks are positions in the sorted device set; inputs[r] is
 * rank r's src (ref_src_count elements; only inputs[root] is read for broadcast and
 * scatter, the others may be NULL), root is a rank. Reductions use ref_allreduce's
 * semantics in rank order. Writes ref_dst_count elements to out and returns that number;
 * 0 when the rank's dst is not written (non-root ranks of reduce and gather). out must not
 * overlap the inputs.
 */
size_t ref_collective(ccq_kind kind, ccq_dtype dtype, ccq_reduce_op op, uint32_t n, uint32_t root,
                      const void *const *inputs, uint32_t rank, void *out, size_t count);

/* Elements rank `rank`'s src and dst hold for a collective of `count` (0 = not used). */
size_t ref_src_count(ccq_kind kind, uint32_t n, uint32_t root, uint32_t rank, size_t count);
size_t ref_dst_count(ccq_kind kind, uint32_t n, uint32_t root, uint32_t rank, size_t count);

/* Not a reference: one part of a collective of any kind through its public call, so tests
 * and tools drive every kind the same way. root is a device id; op and root are ignored by
 * the kinds that have none. An unknown kind returns CCQ_ERR_INVALID_ARGUMENT. */
ccq_status ref_submit(ccq_runtime *rt, ccq_kind kind, ccq_device_id dev, ccq_stream_id stream,
                      const void *src, void *dst, size_t count, ccq_dtype dtype, ccq_reduce_op op,
                      ccq_device_id root, const ccq_device_id *devs, size_t n);

#endif /* CCQ_TESTS_REF_H */
