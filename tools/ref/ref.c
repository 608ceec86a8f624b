/* The reference collectives (tests and ccq-perf check results against them): element-by-element
 * reductions and search-based narrow-float codecs. */
#include "ref.h"

#include <inttypes.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* A narrow float format, described the way the standards do. */
typedef struct ref_fmt {
    int ebits;           /* exponent field width */
    int mbits;           /* mantissa field width */
    int bias;            /* exponent bias */
    uint32_t max_finite; /* largest positive finite code; codes 0..max_finite ascend */
    int top_is_special;  /* an all-ones exponent means inf (mantissa 0) or NaN, as IEEE */
    int saturate;        /* overflow gives max_finite (fp8) instead of inf (IEEE) */
    uint32_t nan_code;   /* the positive quiet NaN produced by encode */
} ref_fmt;

static const ref_fmt ref_fmt_f16 = {5, 10, 15, 0x7bff, 1, 0, 0x7e00};
static const ref_fmt ref_fmt_bf16 = {8, 7, 127, 0x7f7f, 1, 0, 0x7fc0};
/* E4M3 "fn": the all-ones exponent holds ordinary values except S.1111.111, the NaN. */
static const ref_fmt ref_fmt_e4m3 = {4, 3, 7, 0x7e, 0, 1, 0x7f};
static const ref_fmt ref_fmt_e5m2 = {5, 2, 15, 0x7b, 1, 1, 0x7f};

static const ref_fmt *ref_fmt_of(ccq_dtype dtype)
{
    switch (dtype) {
    case CCQ_FLOAT16:
        return &ref_fmt_f16;
    case CCQ_BFLOAT16:
        return &ref_fmt_bf16;
    case CCQ_FLOAT8E4M3:
        return &ref_fmt_e4m3;
    case CCQ_FLOAT8E5M2:
        return &ref_fmt_e5m2;
    default:
        return NULL;
    }
}

/* 2^e for the exponents the narrow formats need (well inside double's normal range);
 * the same as ldexp(1.0, e), which is several times slower in the encoder's search. */
static double ref_pow2(int e)
{
    uint64_t bits = (uint64_t)(e + 1023) << 52;
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

/*
 * The value of a non-negative finite code. For an IEEE-overflow format, code
 * max_finite + 1 (the infinity code) gives the power of two just past the largest finite
 * value instead: rounding treats it as one more value, and lands on inf from there.
 */
static double ref_fmt_value(const ref_fmt *f, uint32_t code)
{
    uint32_t e = code >> f->mbits;
    uint32_t m = code & ((1u << f->mbits) - 1);
    if (e == 0)
        return (double)m * ref_pow2(1 - f->bias - f->mbits);
    return (double)((1u << f->mbits) + m) * ref_pow2((int)e - f->bias - f->mbits);
}

double ref_decode(ccq_dtype dtype, uint32_t code)
{
    const ref_fmt *f = ref_fmt_of(dtype);
    if (f == NULL)
        return NAN;
    uint32_t signbit = 1u << (f->ebits + f->mbits);
    uint32_t mag = code & (signbit - 1);
    uint32_t emask = (1u << f->ebits) - 1;
    uint32_t mmask = (1u << f->mbits) - 1;
    double v;
    if (f->top_is_special && (mag >> f->mbits) == emask)
        v = (mag & mmask) == 0 ? INFINITY : NAN;
    else if (!f->top_is_special && mag == (signbit - 1))
        v = NAN;
    else
        v = ref_fmt_value(f, mag);
    return (code & signbit) ? -v : v;
}

uint32_t ref_encode(ccq_dtype dtype, float value)
{
    const ref_fmt *f = ref_fmt_of(dtype);
    if (f == NULL)
        return 0;
    uint32_t sign = signbit(value) ? 1u << (f->ebits + f->mbits) : 0u;
    if (isnan(value))
        return sign | f->nan_code;
    double ax = fabs((double)value);
    /* The search range ends at a code whose value ax is known to be below. */
    uint32_t limit;
    if (f->saturate) {
        if (ax >= ref_fmt_value(f, f->max_finite))
            return sign | f->max_finite;
        limit = f->max_finite;
    } else {
        limit = f->max_finite + 1;
        if (ax >= ref_fmt_value(f, limit))
            return sign | limit; /* the infinity code */
    }
    /* The largest code whose value is <= ax (code 0 is +0, so one exists). */
    uint32_t lo = 0, hi = limit;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (ref_fmt_value(f, mid) <= ax)
            lo = mid;
        else
            hi = mid;
    }
    /* Both differences are exact in double: the values have at most 24 significant bits
     * and lie within a factor of two of each other or of zero. */
    double below = ax - ref_fmt_value(f, lo);
    double above = ref_fmt_value(f, lo + 1) - ax;
    uint32_t code;
    if (below < above)
        code = lo;
    else if (above < below)
        code = lo + 1;
    else
        code = (lo & 1) ? lo + 1 : lo;
    return sign | code;
}

size_t ref_dtype_size(ccq_dtype dtype)
{
    switch (dtype) {
    case CCQ_INT8:
    case CCQ_UINT8:
    case CCQ_FLOAT8E4M3:
    case CCQ_FLOAT8E5M2:
        return 1;
    case CCQ_FLOAT16:
    case CCQ_BFLOAT16:
        return 2;
    case CCQ_INT32:
    case CCQ_UINT32:
    case CCQ_FLOAT32:
        return 4;
    case CCQ_INT64:
    case CCQ_UINT64:
    case CCQ_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

static const char *ref_dtype_name(ccq_dtype dtype)
{
    static const char *const names[CCQ_DTYPE_COUNT_] = {
        "int8",    "uint8",   "int32",   "uint32",   "int64",      "uint64",
        "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"};
    return (unsigned)dtype < CCQ_DTYPE_COUNT_ ? names[dtype] : "?";
}

static int ref_is_signed_int(ccq_dtype dtype)
{
    return dtype == CCQ_INT8 || dtype == CCQ_INT32 || dtype == CCQ_INT64;
}

static int ref_is_int(ccq_dtype dtype)
{
    return ref_is_signed_int(dtype) || dtype == CCQ_UINT8 || dtype == CCQ_UINT32 ||
           dtype == CCQ_UINT64;
}

/* The raw bits of element i, zero-extended (little or big endian alike). */
static uint64_t ref_load_bits(ccq_dtype dtype, const void *buf, size_t i)
{
    const unsigned char *p = (const unsigned char *)buf + i * ref_dtype_size(dtype);
    switch (ref_dtype_size(dtype)) {
    case 1:
        return *p;
    case 2: {
        uint16_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case 4: {
        uint32_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    default: {
        uint64_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    }
}

static void ref_store_bits(ccq_dtype dtype, void *buf, size_t i, uint64_t bits)
{
    unsigned char *p = (unsigned char *)buf + i * ref_dtype_size(dtype);
    switch (ref_dtype_size(dtype)) {
    case 1:
        *p = (unsigned char)bits;
        break;
    case 2: {
        uint16_t v = (uint16_t)bits;
        memcpy(p, &v, sizeof v);
        break;
    }
    case 4: {
        uint32_t v = (uint32_t)bits;
        memcpy(p, &v, sizeof v);
        break;
    }
    default:
        memcpy(p, &bits, sizeof bits);
        break;
    }
}

/* Two's complement value of the low `width` bits. */
static int64_t ref_sign_extend(uint64_t bits, unsigned width)
{
    if (width == 64) {
        int64_t v;
        memcpy(&v, &bits, sizeof v);
        return v;
    }
    uint64_t half = 1ull << (width - 1);
    bits &= (half << 1) - 1;
    if (bits < half)
        return (int64_t)bits;
    return -(int64_t)((half << 1) - bits);
}

static uint64_t ref_int_element(ccq_dtype dtype, ccq_reduce_op op, uint32_t n,
                                const void *const *inputs, size_t i)
{
    unsigned width = (unsigned)ref_dtype_size(dtype) * 8;
    uint64_t mask = width == 64 ? ~0ull : (1ull << width) - 1;
    int sgn = ref_is_signed_int(dtype);
    uint64_t acc = ref_load_bits(dtype, inputs[0], i);
    for (uint32_t r = 1; r < n; r++) {
        uint64_t x = ref_load_bits(dtype, inputs[r], i);
        switch (op) {
        case CCQ_SUM:
        case CCQ_AVG:
            acc = (acc + x) & mask; /* arithmetic mod 2^64 agrees mod 2^width */
            break;
        case CCQ_PROD:
            acc = (acc * x) & mask;
            break;
        case CCQ_MAX:
            if (sgn ? ref_sign_extend(x, width) > ref_sign_extend(acc, width) : x > acc)
                acc = x;
            break;
        case CCQ_MIN:
            if (sgn ? ref_sign_extend(x, width) < ref_sign_extend(acc, width) : x < acc)
                acc = x;
            break;
        default:
            break;
        }
    }
    if (op == CCQ_AVG) {
        if (sgn) {
            int64_t q = ref_sign_extend(acc, width) / (int64_t)n;
            uint64_t u;
            memcpy(&u, &q, sizeof u);
            acc = u & mask;
        } else {
            acc = acc / n;
        }
    }
    return acc;
}

static float ref_float_max(float a, float b)
{
    return (isnan(a) || a > b) ? a : b;
}

static float ref_float_min(float a, float b)
{
    return (isnan(a) || a < b) ? a : b;
}

static double ref_double_max(double a, double b)
{
    return (isnan(a) || a > b) ? a : b;
}

static double ref_double_min(double a, double b)
{
    return (isnan(a) || a < b) ? a : b;
}

static float ref_load_float(ccq_dtype dtype, const void *buf, size_t i)
{
    uint64_t bits = ref_load_bits(dtype, buf, i);
    if (dtype == CCQ_FLOAT32) {
        uint32_t b = (uint32_t)bits;
        float f;
        memcpy(&f, &b, sizeof f);
        return f;
    }
    /* Every narrow value is exact in float. */
    return (float)ref_decode(dtype, (uint32_t)bits);
}

/* float32 and the narrow types: accumulate in float in rank order. */
static float ref_float_element(ccq_dtype dtype, ccq_reduce_op op, uint32_t n,
                               const void *const *inputs, size_t i)
{
    float acc = ref_load_float(dtype, inputs[0], i);
    for (uint32_t r = 1; r < n; r++) {
        float x = ref_load_float(dtype, inputs[r], i);
        switch (op) {
        case CCQ_SUM:
        case CCQ_AVG:
            acc = acc + x;
            break;
        case CCQ_PROD:
            acc = acc * x;
            break;
        case CCQ_MAX:
            acc = ref_float_max(acc, x);
            break;
        case CCQ_MIN:
            acc = ref_float_min(acc, x);
            break;
        default:
            break;
        }
    }
    if (op == CCQ_AVG)
        acc = acc / (float)n;
    return acc;
}

static double ref_double_element(ccq_reduce_op op, uint32_t n, const void *const *inputs, size_t i)
{
    double acc, x;
    memcpy(&acc, (const char *)inputs[0] + i * sizeof acc, sizeof acc);
    for (uint32_t r = 1; r < n; r++) {
        memcpy(&x, (const char *)inputs[r] + i * sizeof x, sizeof x);
        switch (op) {
        case CCQ_SUM:
        case CCQ_AVG:
            acc = acc + x;
            break;
        case CCQ_PROD:
            acc = acc * x;
            break;
        case CCQ_MAX:
            acc = ref_double_max(acc, x);
            break;
        case CCQ_MIN:
            acc = ref_double_min(acc, x);
            break;
        default:
            break;
        }
    }
    if (op == CCQ_AVG)
        acc = acc / (double)n;
    return acc;
}

void ref_allreduce(ccq_dtype dtype, ccq_reduce_op op, uint32_t n, const void *const *inputs,
                   void *out, size_t count)
{
    /* Element i of out is written only after element i of every input was read, so out
     * may be one of the inputs. */
    for (size_t i = 0; i < count; i++) {
        if (ref_is_int(dtype)) {
            ref_store_bits(dtype, out, i, ref_int_element(dtype, op, n, inputs, i));
        } else if (dtype == CCQ_FLOAT64) {
            double v = ref_double_element(op, n, inputs, i);
            memcpy((char *)out + i * sizeof v, &v, sizeof v);
        } else if (dtype == CCQ_FLOAT32) {
            float v = ref_float_element(dtype, op, n, inputs, i);
            memcpy((char *)out + i * sizeof v, &v, sizeof v);
        } else {
            float v = ref_float_element(dtype, op, n, inputs, i);
            ref_store_bits(dtype, out, i, ref_encode(dtype, v));
        }
    }
}

/* splitmix64: a good, tiny generator; each call advances *state. */
static uint64_t ref_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A double in about [-4, 4]: mostly uniform, sometimes scaled far down so that the narrow
 * types see subnormals, sometimes a signed zero. */
static double ref_rand_real(uint64_t *state)
{
    uint64_t r = ref_rand(state);
    double u = (double)(r >> 11) * 0x1p-53; /* [0, 1) */
    double v = u * 8.0 - 4.0;
    switch (r & 31) {
    case 0:
        return (r & 32) ? -0.0 : 0.0;
    case 1:
    case 2:
        return ldexp(v, -(int)((r >> 5) % 24));
    default:
        return v;
    }
}

void ref_fill(ccq_dtype dtype, void *buf, size_t count, uint32_t seed)
{
    uint64_t state = ((uint64_t)seed << 32) ^ ((uint64_t)dtype * 0x51ed27u) ^ 0x243f6a88u;
    for (size_t i = 0; i < count; i++) {
        if (ref_is_int(dtype)) {
            uint64_t r = ref_rand(&state);
            uint64_t bits;
            if ((r & 15) == 0) {
                bits = r >> 4; /* full range: exercises wrapping and sign */
            } else if ((r & 63) == 1) {
                bits = 0;
            } else {
                /* 1..4 with a random sign for signed types, 1..8 for unsigned, so that a
                 * product over 8 ranks rarely collapses to zero. */
                uint64_t small = 1 + ((r >> 8) & 3);
                if (ref_is_signed_int(dtype) && ((r >> 12) & 1))
                    bits = 0 - small;
                else
                    bits = ref_is_signed_int(dtype) ? small : small + ((r >> 13) & 4);
            }
            ref_store_bits(dtype, buf, i, bits);
        } else if (dtype == CCQ_FLOAT64) {
            double v = ref_rand_real(&state);
            memcpy((char *)buf + i * sizeof v, &v, sizeof v);
        } else if (dtype == CCQ_FLOAT32) {
            float v = (float)ref_rand_real(&state);
            memcpy((char *)buf + i * sizeof v, &v, sizeof v);
        } else {
            ref_store_bits(dtype, buf, i, ref_encode(dtype, (float)ref_rand_real(&state)));
        }
    }
}

/* NaN test and printable value of element i of a float type; returns 0 for integers. */
static int ref_float_value(ccq_dtype dtype, const void *buf, size_t i, double *value)
{
    if (ref_is_int(dtype))
        return 0;
    if (dtype == CCQ_FLOAT64) {
        memcpy(value, (const char *)buf + i * sizeof *value, sizeof *value);
        return 1;
    }
    *value = (double)ref_load_float(dtype, buf, i);
    return 1;
}

static void ref_describe(ccq_dtype dtype, const void *buf, size_t i, char *out, size_t len)
{
    uint64_t bits = ref_load_bits(dtype, buf, i);
    double v;
    if (ref_float_value(dtype, buf, i, &v))
        snprintf(out, len, "%.17g (0x%" PRIx64 ")", v, bits);
    else if (ref_is_signed_int(dtype))
        snprintf(out, len, "%" PRId64, ref_sign_extend(bits, (unsigned)ref_dtype_size(dtype) * 8));
    else
        snprintf(out, len, "%" PRIu64, bits);
}

size_t ref_compare(ccq_dtype dtype, const void *got, const void *want, size_t count, char *msg,
                   size_t msglen)
{
    size_t bad = 0;
    if (msglen > 0)
        msg[0] = '\0';
    for (size_t i = 0; i < count; i++) {
        if (ref_load_bits(dtype, got, i) == ref_load_bits(dtype, want, i))
            continue;
        double g, w;
        if (ref_float_value(dtype, got, i, &g) && ref_float_value(dtype, want, i, &w) && isnan(g) &&
            isnan(w))
            continue;
        if (bad == 0 && msglen > 0) {
            char gs[64], ws[64];
            ref_describe(dtype, got, i, gs, sizeof gs);
            ref_describe(dtype, want, i, ws, sizeof ws);
            snprintf(msg, msglen, "%s: element %zu: got %s, want %s", ref_dtype_name(dtype), i, gs,
                     ws);
        }
        bad++;
    }
    return bad;
}

/* ---- The other collectives, from their definitions in ccq.h (NCCL's) ---- */

/* Element si of src into element di of dst, bit for bit. */
static void ref_copy_element(ccq_dtype dtype, void *dst, size_t di, const void *src, size_t si)
{
    ref_store_bits(dtype, dst, di, ref_load_bits(dtype, src, si));
}

size_t ref_collective(ccq_kind kind, ccq_dtype dtype, ccq_reduce_op op, uint32_t n, uint32_t root,
                      const void *const *inputs, uint32_t rank, void *out, size_t count)
{
    size_t es = ref_dtype_size(dtype);
    const void *blocks[1024];

    if (n == 0 || n > 1024 || rank >= n || root >= n || es == 0)
        return 0;
    switch (kind) {
    case CCQ_KIND_ALL_REDUCE:
        ref_allreduce(dtype, op, n, inputs, out, count);
        return count;
    case CCQ_KIND_REDUCE:
        if (rank != root)
            return 0;
        ref_allreduce(dtype, op, n, inputs, out, count);
        return count;
    case CCQ_KIND_BROADCAST:
        for (size_t i = 0; i < count; i++)
            ref_copy_element(dtype, out, i, inputs[root], i);
        return count;
    case CCQ_KIND_REDUCE_SCATTER:
        /* Block `rank` of every input, reduced in rank order. */
        for (uint32_t j = 0; j < n; j++)
            blocks[j] = (const char *)inputs[j] + (size_t)rank * count * es;
        ref_allreduce(dtype, op, n, blocks, out, count);
        return count;
    case CCQ_KIND_GATHER: /* the root receives what all_gather gives every rank */
    case CCQ_KIND_ALL_GATHER:
        if (kind == CCQ_KIND_GATHER && rank != root)
            return 0;
        for (uint32_t j = 0; j < n; j++)
            for (size_t i = 0; i < count; i++)
                ref_copy_element(dtype, out, (size_t)j * count + i, inputs[j], i);
        return (size_t)n * count;
    case CCQ_KIND_ALL_TO_ALL:
        /* Block j of out comes from block `rank` of rank j's input. */
        for (uint32_t j = 0; j < n; j++)
            for (size_t i = 0; i < count; i++)
                ref_copy_element(dtype, out, (size_t)j * count + i, inputs[j],
                                 (size_t)rank * count + i);
        return (size_t)n * count;
    case CCQ_KIND_SCATTER:
        for (size_t i = 0; i < count; i++)
            ref_copy_element(dtype, out, i, inputs[root], (size_t)rank * count + i);
        return count;
    default:
        return 0;
    }
}

void ref_fill_exact(ccq_dtype dt, void *buf, size_t count, uint32_t seed)
{
    bool is_float = dt == CCQ_FLOAT16 || dt == CCQ_FLOAT32 || dt == CCQ_FLOAT64 ||
                    dt == CCQ_BFLOAT16 || dt == CCQ_FLOAT8E4M3 || dt == CCQ_FLOAT8E5M2;
    size_t es = ref_dtype_size(dt);
    if (!is_float) {
        ref_fill(dt, buf, count, seed);
        return;
    }
    for (size_t i = 0; i < count; i++) {
        float v = (float)((int)((seed * 7u + i * 3u + (i >> 3)) % 3u) - 1);
        if (dt == CCQ_FLOAT32) {
            memcpy((char *)buf + i * 4, &v, 4);
        } else if (dt == CCQ_FLOAT64) {
            double x = v;
            memcpy((char *)buf + i * 8, &x, 8);
        } else {
            uint32_t code = ref_encode(dt, v);
            memcpy((char *)buf + i * es, &code, es); /* little endian: the low bytes */
        }
    }
}

/* Buffer sizes per kind, stated a second time on purpose: the reference must not take them
 * from common/kinds.c, the table it helps to check. */
size_t ref_src_count(ccq_kind kind, uint32_t n, uint32_t root, uint32_t rank, size_t count)
{
    switch (kind) {
    case CCQ_KIND_ALL_REDUCE:
    case CCQ_KIND_REDUCE:
    case CCQ_KIND_ALL_GATHER:
    case CCQ_KIND_GATHER:
        return count;
    case CCQ_KIND_BROADCAST:
        return rank == root ? count : 0;
    case CCQ_KIND_REDUCE_SCATTER:
    case CCQ_KIND_ALL_TO_ALL:
        return (size_t)n * count;
    case CCQ_KIND_SCATTER:
        return rank == root ? (size_t)n * count : 0;
    default:
        return 0;
    }
}

size_t ref_dst_count(ccq_kind kind, uint32_t n, uint32_t root, uint32_t rank, size_t count)
{
    switch (kind) {
    case CCQ_KIND_ALL_REDUCE:
    case CCQ_KIND_BROADCAST:
    case CCQ_KIND_REDUCE_SCATTER:
    case CCQ_KIND_SCATTER:
        return count;
    case CCQ_KIND_REDUCE:
        return rank == root ? count : 0;
    case CCQ_KIND_ALL_GATHER:
    case CCQ_KIND_ALL_TO_ALL:
        return (size_t)n * count;
    case CCQ_KIND_GATHER:
        return rank == root ? (size_t)n * count : 0;
    default:
        return 0;
    }
}

#ifndef CCQ_REF_NO_RUNTIME /* programs that link only the backend (test_host_mpi) */
ccq_status ref_submit(ccq_runtime *rt, ccq_kind kind, ccq_device_id dev, ccq_stream_id s,
                      const void *src, void *dst, size_t count, ccq_dtype dt, ccq_reduce_op op,
                      ccq_device_id root, const ccq_device_id *devs, size_t n)
{
    switch (kind) {
    case CCQ_KIND_ALL_REDUCE:
        return ccq_all_reduce(rt, dev, s, src, dst, count, dt, op, devs, n);
    case CCQ_KIND_BROADCAST:
        return ccq_broadcast(rt, dev, s, src, dst, count, dt, root, devs, n);
    case CCQ_KIND_REDUCE:
        return ccq_reduce(rt, dev, s, src, dst, count, dt, op, root, devs, n);
    case CCQ_KIND_ALL_GATHER:
        return ccq_all_gather(rt, dev, s, src, dst, count, dt, devs, n);
    case CCQ_KIND_REDUCE_SCATTER:
        return ccq_reduce_scatter(rt, dev, s, src, dst, count, dt, op, devs, n);
    case CCQ_KIND_ALL_TO_ALL:
        return ccq_all_to_all(rt, dev, s, src, dst, count, dt, devs, n);
    case CCQ_KIND_GATHER:
        return ccq_gather(rt, dev, s, src, dst, count, dt, root, devs, n);
    case CCQ_KIND_SCATTER:
        return ccq_scatter(rt, dev, s, src, dst, count, dt, root, devs, n);
    default:
        return CCQ_ERR_INVALID_ARGUMENT;
    }
}
#endif
