/* The host backend's fused all_reduce kernel: one generated loop nest per (dtype, op). */
#include "reduce.h"

#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "backends/fuse.h"
#include "convert.h"

/* nout: the outputs the write-out step fills (n for all_reduce, 1 for reduce and
 * reduce_scatter); nt: write them with streaming stores (see put_block). Both are
 * parameters, not thread-locals: the engines' modules are dlopen'ed, where a thread-local
 * costs a __tls_get_addr per call, and GCC 12's ThreadSanitizer intercepts that call and
 * now and then resets a bogus, huge shadow range for a dynamic TLS block, killing the
 * process at random ("failed to allocate 0x1eddffffff000 bytes", seen in CI). */
typedef void (*ccq_reduce_kernel)(uint32_t n, const void *const *src, uint32_t nout,
                                  void *const *dst, size_t begin, size_t end, int nt);

/*
 * One block of one kernel. LEN is either the full block size, a compile-time constant, or
 * the length of the last partial block. The full-block copy matters: at -O2 GCC only
 * vectorizes loops whose trip count is a known multiple of the vector width, so the
 * constant trip count is what makes the common case vectorize without -O3. The tail runs
 * at most once per call and may stay scalar.
 *
 * With two or more ranks the first step combines src[0] and src[1] straight into the
 * accumulator, saving a pass that would only copy src[0]. The accumulator is a local array
 * whose address never escapes, so the compiler needs no aliasing checks between it and
 * the user buffers, and in-place outputs cannot disturb inputs still to be read. PUT
 * writes the finished block to every output.
 */
#define CCQ_REDUCE_BLOCK_(LEN, elem_t, acc_t, LOAD, COMBINE, FINISH, PUT)                          \
    do {                                                                                           \
        const elem_t *s0 = (const elem_t *)src[0] + off;                                           \
        if (n >= 2) {                                                                              \
            const elem_t *s1 = (const elem_t *)src[1] + off;                                       \
            for (size_t i = 0; i < (LEN); i++) {                                                   \
                acc_t a = LOAD(s0[i]);                                                             \
                acc_t b = LOAD(s1[i]);                                                             \
                acc[i] = COMBINE(acc_t, a, b);                                                     \
            }                                                                                      \
        } else {                                                                                   \
            for (size_t i = 0; i < (LEN); i++)                                                     \
                acc[i] = LOAD(s0[i]);                                                              \
        }                                                                                          \
        for (uint32_t r = 2; r < n; r++) {                                                         \
            const elem_t *s = (const elem_t *)src[r] + off;                                        \
            for (size_t i = 0; i < (LEN); i++) {                                                   \
                acc_t a = acc[i];                                                                  \
                acc_t b = LOAD(s[i]);                                                              \
                acc[i] = COMBINE(acc_t, a, b);                                                     \
            }                                                                                      \
        }                                                                                          \
        FINISH(acc_t, LEN);                                                                        \
        PUT(elem_t, LEN);                                                                          \
    } while (0)

#define CCQ_REDUCE_KERNEL_(name, elem_t, acc_t, LOAD, COMBINE, FINISH, PUT)                        \
    static void name(uint32_t n, const void *const *src, uint32_t nout, void *const *dst,          \
                     size_t begin, size_t end, int nt)                                             \
    {                                                                                              \
        enum { block = CCQ_HOST_REDUCE_BLOCK_BYTES / sizeof(acc_t) };                              \
        acc_t acc[block];                                                                          \
        for (size_t off = begin; off < end; off += block) {                                        \
            if (end - off >= (size_t)block) {                                                      \
                CCQ_REDUCE_BLOCK_((size_t)block, elem_t, acc_t, LOAD, COMBINE, FINISH, PUT);       \
            } else {                                                                               \
                size_t len = end - off;                                                            \
                CCQ_REDUCE_BLOCK_(len, elem_t, acc_t, LOAD, COMBINE, FINISH, PUT);                 \
            }                                                                                      \
        }                                                                                          \
    }

/* Output stores. With CCQ_HOST_REDUCE_NT the blocks are written with non-temporal (streaming)
 * stores: for large out-of-place buffers that skips reading every output line before it is
 * overwritten (read-for-ownership), a third of the traffic. For in-place or cache-sized
 * buffers it would hurt (the lines are already in cache), so the caller decides. */
static inline void put_block(void *dst, const void *src, size_t bytes, int nt)
{
#ifdef __SSE2__
    if (nt && bytes >= 64) {
        char *d = dst;
        const char *s = src;
        /* Plain stores up to the first 16-byte boundary of dst, then 64 bytes per step. */
        size_t i = (16 - ((uintptr_t)d & 15)) & 15;
        memcpy(d, s, i);
        for (; i + 64 <= bytes; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
            __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
            _mm_stream_si128((__m128i *)(d + i), a);
            _mm_stream_si128((__m128i *)(d + i + 16), b);
            _mm_stream_si128((__m128i *)(d + i + 32), c);
            _mm_stream_si128((__m128i *)(d + i + 48), e);
        }
        memcpy(d + i, s + i, bytes - i);
        return;
    }
#else
    (void)nt;
#endif
    memcpy(dst, src, bytes);
}

void ccq_host_copy(void *dst, const void *src, size_t bytes, unsigned flags)
{
    put_block(dst, src, bytes, (flags & CCQ_HOST_REDUCE_NT) != 0);
}

/* Streaming stores are weakly ordered: make them visible before whoever reports the chunk
 * done publishes it (the release of that report does not order them). */
void ccq_host_store_fence(unsigned flags)
{
#ifdef __SSE2__
    if (flags & CCQ_HOST_REDUCE_NT)
        _mm_sfence();
#else
    (void)flags;
#endif
}

/* Loads: native types pass through, narrow floats widen to float. */
#define CCQ_ID_(x) (x)

/* Writers. Native types copy the accumulator to each output. Narrow floats are rounded
 * once into a staging block that is then copied: rounding per output would repeat the
 * most expensive step n times. */
#define CCQ_PUT_COPY_(elem_t, LEN)                                                                 \
    do {                                                                                           \
        for (uint32_t r = 0; r < nout; r++)                                                        \
            put_block((elem_t *)dst[r] + off, acc, (LEN) * sizeof(elem_t), nt);                    \
    } while (0)
#define CCQ_PUT_ROUND_(elem_t, LEN, STORE)                                                         \
    do {                                                                                           \
        elem_t narrow_[CCQ_HOST_REDUCE_BLOCK_BYTES / sizeof(float)];                               \
        for (size_t i = 0; i < (LEN); i++)                                                         \
            narrow_[i] = STORE(acc[i]);                                                            \
        for (uint32_t r = 0; r < nout; r++)                                                        \
            put_block((elem_t *)dst[r] + off, narrow_, (LEN) * sizeof(elem_t), nt);                \
    } while (0)
#define CCQ_PUT_F16_(elem_t, LEN)  CCQ_PUT_ROUND_(elem_t, LEN, ccq_f32_to_f16)
#define CCQ_PUT_BF16_(elem_t, LEN) CCQ_PUT_ROUND_(elem_t, LEN, ccq_f32_to_bf16)
#define CCQ_PUT_E4M3_(elem_t, LEN) CCQ_PUT_ROUND_(elem_t, LEN, ccq_f32_to_e4m3)
#define CCQ_PUT_E5M2_(elem_t, LEN) CCQ_PUT_ROUND_(elem_t, LEN, ccq_f32_to_e5m2)

/* Combiners; the cast brings 8-bit integer arithmetic (done in int) back into the type. */
#define CCQ_OP_SUM_(t, a, b)  ((t)((a) + (b)))
#define CCQ_OP_PROD_(t, a, b) ((t)((a) * (b)))
/* NaN-propagating for floats: a NaN accumulator stays, a NaN input replaces it. The | (not
 * ||) evaluates both comparisons unconditionally; with a short circuit GCC builds a branch
 * it cannot if-convert (a float compare may trap), and the loop stays scalar. */
#define CCQ_OP_MAX_(t, a, b) ((((a) != (a)) | ((a) > (b))) ? (a) : (b))
#define CCQ_OP_MIN_(t, a, b) ((((a) != (a)) | ((a) < (b))) ? (a) : (b))

/* Finishers, run once per block on the accumulator. */
#define CCQ_FIN_NONE_(t, LEN) ((void)0)
/* Floats: a true division, not a multiplication by 1/n, so results match sum / n. */
#define CCQ_FIN_AVG_FLOAT_(t, LEN)                                                                 \
    do {                                                                                           \
        t div_ = (t)n;                                                                             \
        for (size_t i = 0; i < (LEN); i++)                                                         \
            acc[i] = acc[i] / div_;                                                                \
    } while (0)
/* Integers: the wrapped sum reinterpreted in the type's signedness, then C's truncating
 * division. The division is done in 64 bits so that any n is exact; converting the
 * unsigned accumulator to a signed type is modular in GCC and Clang. */
#define CCQ_FIN_AVG_INT_(t, stype, LEN)                                                            \
    do {                                                                                           \
        for (size_t i = 0; i < (LEN); i++)                                                         \
            acc[i] = (t)(stype)((int64_t)(stype)acc[i] / (int64_t)n);                              \
    } while (0)
#define CCQ_FIN_AVG_I8_(t, LEN)  CCQ_FIN_AVG_INT_(t, int8_t, LEN)
#define CCQ_FIN_AVG_I32_(t, LEN) CCQ_FIN_AVG_INT_(t, int32_t, LEN)
#define CCQ_FIN_AVG_I64_(t, LEN) CCQ_FIN_AVG_INT_(t, int64_t, LEN)
/* Unsigned: the sum and n are both non-negative, so plain unsigned division truncates. */
#define CCQ_FIN_AVG_UINT_(t, LEN)                                                                  \
    do {                                                                                           \
        for (size_t i = 0; i < (LEN); i++)                                                         \
            acc[i] = (t)((uint64_t)acc[i] / (uint64_t)n);                                          \
    } while (0)

/*
 * Integer kernels. SUM, PROD and AVG run in the unsigned type of the same width, where
 * wrapping is defined; signed and unsigned buffers of one width share the SUM and PROD
 * kernels because the bits are the same (and C allows the access through either type).
 */
#define CCQ_INT_KERNELS_(bits)                                                                     \
    CCQ_REDUCE_KERNEL_(k_u##bits##_sum, uint##bits##_t, uint##bits##_t, CCQ_ID_, CCQ_OP_SUM_,      \
                       CCQ_FIN_NONE_, CCQ_PUT_COPY_)                                               \
    CCQ_REDUCE_KERNEL_(k_u##bits##_prod, uint##bits##_t, uint##bits##_t, CCQ_ID_, CCQ_OP_PROD_,    \
                       CCQ_FIN_NONE_, CCQ_PUT_COPY_)                                               \
    CCQ_REDUCE_KERNEL_(k_u##bits##_max, uint##bits##_t, uint##bits##_t, CCQ_ID_, CCQ_OP_MAX_,      \
                       CCQ_FIN_NONE_, CCQ_PUT_COPY_)                                               \
    CCQ_REDUCE_KERNEL_(k_u##bits##_min, uint##bits##_t, uint##bits##_t, CCQ_ID_, CCQ_OP_MIN_,      \
                       CCQ_FIN_NONE_, CCQ_PUT_COPY_)                                               \
    CCQ_REDUCE_KERNEL_(k_u##bits##_avg, uint##bits##_t, uint##bits##_t, CCQ_ID_, CCQ_OP_SUM_,      \
                       CCQ_FIN_AVG_UINT_, CCQ_PUT_COPY_)                                           \
    CCQ_REDUCE_KERNEL_(k_i##bits##_max, int##bits##_t, int##bits##_t, CCQ_ID_, CCQ_OP_MAX_,        \
                       CCQ_FIN_NONE_, CCQ_PUT_COPY_)                                               \
    CCQ_REDUCE_KERNEL_(k_i##bits##_min, int##bits##_t, int##bits##_t, CCQ_ID_, CCQ_OP_MIN_,        \
                       CCQ_FIN_NONE_, CCQ_PUT_COPY_)                                               \
    CCQ_REDUCE_KERNEL_(k_i##bits##_avg, uint##bits##_t, uint##bits##_t, CCQ_ID_, CCQ_OP_SUM_,      \
                       CCQ_FIN_AVG_I##bits##_, CCQ_PUT_COPY_)

CCQ_INT_KERNELS_(8)
CCQ_INT_KERNELS_(32)
CCQ_INT_KERNELS_(64)

/* Float kernels: elem_t is the storage type, acc_t the type the arithmetic runs in. */
#define CCQ_FLOAT_KERNELS_(tag, elem_t, acc_t, LOAD, PUT)                                          \
    CCQ_REDUCE_KERNEL_(k_##tag##_sum, elem_t, acc_t, LOAD, CCQ_OP_SUM_, CCQ_FIN_NONE_, PUT)        \
    CCQ_REDUCE_KERNEL_(k_##tag##_prod, elem_t, acc_t, LOAD, CCQ_OP_PROD_, CCQ_FIN_NONE_, PUT)      \
    CCQ_REDUCE_KERNEL_(k_##tag##_max, elem_t, acc_t, LOAD, CCQ_OP_MAX_, CCQ_FIN_NONE_, PUT)        \
    CCQ_REDUCE_KERNEL_(k_##tag##_min, elem_t, acc_t, LOAD, CCQ_OP_MIN_, CCQ_FIN_NONE_, PUT)        \
    CCQ_REDUCE_KERNEL_(k_##tag##_avg, elem_t, acc_t, LOAD, CCQ_OP_SUM_, CCQ_FIN_AVG_FLOAT_, PUT)

CCQ_FLOAT_KERNELS_(f32, float, float, CCQ_ID_, CCQ_PUT_COPY_)
CCQ_FLOAT_KERNELS_(f64, double, double, CCQ_ID_, CCQ_PUT_COPY_)
CCQ_FLOAT_KERNELS_(f16, uint16_t, float, ccq_f16_to_f32, CCQ_PUT_F16_)
CCQ_FLOAT_KERNELS_(bf16, uint16_t, float, ccq_bf16_to_f32, CCQ_PUT_BF16_)
CCQ_FLOAT_KERNELS_(e4m3, uint8_t, float, ccq_e4m3_to_f32, CCQ_PUT_E4M3_)
CCQ_FLOAT_KERNELS_(e5m2, uint8_t, float, ccq_e5m2_to_f32, CCQ_PUT_E5M2_)

#define CCQ_ROW_(sum, prod, max, min, avg)                                                         \
    {                                                                                              \
        [CCQ_SUM] = sum, [CCQ_PROD] = prod, [CCQ_MAX] = max, [CCQ_MIN] = min, [CCQ_AVG] = avg      \
    }
#define CCQ_FLOAT_ROW_(tag)                                                                        \
    CCQ_ROW_(k_##tag##_sum, k_##tag##_prod, k_##tag##_max, k_##tag##_min, k_##tag##_avg)

static const ccq_reduce_kernel ccq_reduce_kernels[CCQ_DTYPE_COUNT_][CCQ_REDUCE_OP_COUNT_] = {
    [CCQ_INT8] = CCQ_ROW_(k_u8_sum, k_u8_prod, k_i8_max, k_i8_min, k_i8_avg),
    [CCQ_UINT8] = CCQ_ROW_(k_u8_sum, k_u8_prod, k_u8_max, k_u8_min, k_u8_avg),
    [CCQ_INT32] = CCQ_ROW_(k_u32_sum, k_u32_prod, k_i32_max, k_i32_min, k_i32_avg),
    [CCQ_UINT32] = CCQ_ROW_(k_u32_sum, k_u32_prod, k_u32_max, k_u32_min, k_u32_avg),
    [CCQ_INT64] = CCQ_ROW_(k_u64_sum, k_u64_prod, k_i64_max, k_i64_min, k_i64_avg),
    [CCQ_UINT64] = CCQ_ROW_(k_u64_sum, k_u64_prod, k_u64_max, k_u64_min, k_u64_avg),
    [CCQ_FLOAT16] = CCQ_FLOAT_ROW_(f16),
    [CCQ_FLOAT32] = CCQ_FLOAT_ROW_(f32),
    [CCQ_FLOAT64] = CCQ_FLOAT_ROW_(f64),
    [CCQ_BFLOAT16] = CCQ_FLOAT_ROW_(bf16),
    [CCQ_FLOAT8E4M3] = CCQ_FLOAT_ROW_(e4m3),
    [CCQ_FLOAT8E5M2] = CCQ_FLOAT_ROW_(e5m2),
};

void ccq_host_allreduce_range(ccq_dtype dtype, ccq_reduce_op op, uint32_t n, const void *const *src,
                              void *const *dst, size_t begin, size_t end)
{
    ccq_host_allreduce_range_ex(dtype, op, n, src, dst, begin, end, 0);
}

void ccq_host_allreduce_range_ex(ccq_dtype dtype, ccq_reduce_op op, uint32_t n,
                                 const void *const *src, void *const *dst, size_t begin, size_t end,
                                 unsigned flags)
{
    ccq_host_reduce_range(dtype, op, n, src, n, dst, begin, end, flags);
}

void ccq_host_reduce_range(ccq_dtype dtype, ccq_reduce_op op, uint32_t n, const void *const *src,
                           uint32_t nout, void *const *dst, size_t begin, size_t end,
                           unsigned flags)
{
    /* The runtime validates dtype and op before issuing; this only keeps a bad value from
     * indexing past the table. */
    if ((unsigned)dtype >= CCQ_DTYPE_COUNT_ || (unsigned)op >= CCQ_REDUCE_OP_COUNT_ || n == 0 ||
        begin >= end)
        return;
    ccq_reduce_kernels[dtype][op](n, src, nout, dst, begin, end, (flags & CCQ_HOST_REDUCE_NT) != 0);
    ccq_host_store_fence(flags);
}

/* A float division by n, as a multiplication for powers of two (see reduce.h). */
#define CCQ_DIVIDE_FLOAT_(t, s, d, count, n)                                                       \
    do {                                                                                           \
        if (((n) & ((n)-1)) == 0) {                                                                \
            const t r_ = (t)1 / (t)(n);                                                            \
            for (size_t i = 0; i < (count); i++)                                                   \
                (d)[i] = (s)[i] * r_;                                                              \
        } else {                                                                                   \
            const t f_ = (t)(n);                                                                   \
            for (size_t i = 0; i < (count); i++)                                                   \
                (d)[i] = (s)[i] / f_;                                                              \
        }                                                                                          \
    } while (0)

#define CCQ_DIVIDE_NARROW_(s, d, count, n, TO, FROM)                                               \
    do {                                                                                           \
        const float f_ = (float)(n);                                                               \
        for (size_t i = 0; i < (count); i++)                                                       \
            (d)[i] = FROM(TO((s)[i]) / f_);                                                        \
    } while (0)

#define CCQ_DIVIDE_INT_(t, div_t, s, d, count, n)                                                  \
    do {                                                                                           \
        for (size_t i = 0; i < (count); i++)                                                       \
            (d)[i] = (t)((div_t)(s)[i] / (div_t)(n));                                              \
    } while (0)

void ccq_host_divide(ccq_dtype dtype, const void *src, void *dst, size_t count, uint32_t n)
{
    if (n == 0)
        return;
    switch (dtype) {
    case CCQ_FLOAT32:
        CCQ_DIVIDE_FLOAT_(float, (const float *)src, (float *)dst, count, n);
        break;
    case CCQ_FLOAT64:
        CCQ_DIVIDE_FLOAT_(double, (const double *)src, (double *)dst, count, n);
        break;
    case CCQ_FLOAT16:
        CCQ_DIVIDE_NARROW_((const uint16_t *)src, (uint16_t *)dst, count, n, ccq_f16_to_f32,
                           ccq_f32_to_f16);
        break;
    case CCQ_BFLOAT16:
        CCQ_DIVIDE_NARROW_((const uint16_t *)src, (uint16_t *)dst, count, n, ccq_bf16_to_f32,
                           ccq_f32_to_bf16);
        break;
    case CCQ_FLOAT8E4M3:
        CCQ_DIVIDE_NARROW_((const uint8_t *)src, (uint8_t *)dst, count, n, ccq_e4m3_to_f32,
                           ccq_f32_to_e4m3);
        break;
    case CCQ_FLOAT8E5M2:
        CCQ_DIVIDE_NARROW_((const uint8_t *)src, (uint8_t *)dst, count, n, ccq_e5m2_to_f32,
                           ccq_f32_to_e5m2);
        break;
    case CCQ_INT8:
        CCQ_DIVIDE_INT_(int8_t, int32_t, (const int8_t *)src, (int8_t *)dst, count, n);
        break;
    case CCQ_UINT8:
        CCQ_DIVIDE_INT_(uint8_t, uint32_t, (const uint8_t *)src, (uint8_t *)dst, count, n);
        break;
    case CCQ_INT32:
        CCQ_DIVIDE_INT_(int32_t, int32_t, (const int32_t *)src, (int32_t *)dst, count, n);
        break;
    case CCQ_UINT32:
        CCQ_DIVIDE_INT_(uint32_t, uint32_t, (const uint32_t *)src, (uint32_t *)dst, count, n);
        break;
    case CCQ_INT64:
        CCQ_DIVIDE_INT_(int64_t, int64_t, (const int64_t *)src, (int64_t *)dst, count, n);
        break;
    case CCQ_UINT64:
        CCQ_DIVIDE_INT_(uint64_t, uint64_t, (const uint64_t *)src, (uint64_t *)dst, count, n);
        break;
    default:
        break;
    }
}

void ccq_host_divide_ex(ccq_dtype dtype, const void *src, void *dst, size_t count, uint32_t n,
                        unsigned flags)
{
    size_t es = ccq_fuse_esize((uint8_t)dtype);
    if (!(flags & CCQ_HOST_REDUCE_NT) || es == 0 || src == dst) {
        ccq_host_divide(dtype, src, dst, count, n);
        return;
    }
    /* Block by block through a buffer in L1, then streamed out. */
    _Alignas(64) char block[CCQ_HOST_REDUCE_BLOCK_BYTES];
    size_t per = sizeof block / es;
    for (size_t off = 0; off < count; off += per) {
        size_t len = count - off < per ? count - off : per;
        ccq_host_divide(dtype, (const char *)src + off * es, block, len, n);
        put_block((char *)dst + off * es, block, len * es, 1);
    }
}
