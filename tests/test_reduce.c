/* Tests of the host reduction kernel and the narrow-float conversions against tools/ref/ref.c. */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <cmocka.h>

#include "backends/host/convert.h"
#include "backends/host/reduce.h"
#include "ref.h"

#define MAX_RANKS 8
#define MAX_COUNT 33333
/* Guard bytes on both sides of every buffer, to catch writes outside [begin, end). */
#define GUARD       64
#define GUARD_BYTE  0xa5
#define POISON_BYTE 0x5a

static const char *const dtype_names[CCQ_DTYPE_COUNT_] = {
    "int8",    "uint8",   "int32",   "uint32",   "int64",      "uint64",
    "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"};
static const char *const op_names[CCQ_REDUCE_OP_COUNT_] = {"sum", "prod", "max", "min", "avg"};

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static int is_float_dtype(ccq_dtype dt)
{
    return dt == CCQ_FLOAT16 || dt == CCQ_FLOAT32 || dt == CCQ_FLOAT64 || dt == CCQ_BFLOAT16 ||
           dt == CCQ_FLOAT8E4M3 || dt == CCQ_FLOAT8E5M2;
}

/* ---- conversions ---------------------------------------------------------------------- */

/* The library's codec for a narrow type, behind one signature. */
static float lib_decode(ccq_dtype dt, uint32_t code)
{
    switch (dt) {
    case CCQ_FLOAT16:
        return ccq_f16_to_f32((uint16_t)code);
    case CCQ_BFLOAT16:
        return ccq_bf16_to_f32((uint16_t)code);
    case CCQ_FLOAT8E4M3:
        return ccq_e4m3_to_f32((uint8_t)code);
    default:
        return ccq_e5m2_to_f32((uint8_t)code);
    }
}

static uint32_t lib_encode(ccq_dtype dt, float f)
{
    switch (dt) {
    case CCQ_FLOAT16:
        return ccq_f32_to_f16(f);
    case CCQ_BFLOAT16:
        return ccq_f32_to_bf16(f);
    case CCQ_FLOAT8E4M3:
        return ccq_f32_to_e4m3(f);
    default:
        return ccq_f32_to_e5m2(f);
    }
}

static uint32_t code_count(ccq_dtype dt)
{
    return (dt == CCQ_FLOAT16 || dt == CCQ_BFLOAT16) ? 65536u : 256u;
}

static int code_is_nan(ccq_dtype dt, uint32_t code)
{
    return isnan(ref_decode(dt, code));
}

/* Every code decodes to the reference value and encodes back to itself (NaN to NaN, and
 * E5M2 infinities to the largest finite value). */
static void check_roundtrip(ccq_dtype dt)
{
    for (uint32_t c = 0; c < code_count(dt); c++) {
        float f = lib_decode(dt, c);
        double want = ref_decode(dt, c);
        uint32_t back = lib_encode(dt, f);
        if (isnan(want)) {
            if (!isnan(f) || !code_is_nan(dt, back))
                fail_msg("%s code 0x%x: decoded %g, re-encoded 0x%x; want NaN", dtype_names[dt], c,
                         (double)f, back);
            continue;
        }
        /* Compare bits, not values, so that the sign of zero counts. E5M2's infinities come
         * back as its largest finite value: its encoder saturates. */
        uint32_t want_back = c;
        if (isinf(want) && dt == CCQ_FLOAT8E5M2)
            want_back = (c & 0x80u) | 0x7bu;
        if (f32_bits(f) != f32_bits((float)want) || back != want_back)
            fail_msg("%s code 0x%x: decoded %.9g (want %.9g), re-encoded 0x%x", dtype_names[dt], c,
                     (double)f, want, back);
    }
}

static void test_f16_roundtrip_exhaustive(void **state)
{
    (void)state;
    check_roundtrip(CCQ_FLOAT16);
#ifdef __FLT16_MAX__
    /* The decoder against the compiler's own binary16 too. */
    for (uint32_t c = 0; c < 65536; c++) {
        uint16_t h = (uint16_t)c;
        _Float16 x;
        memcpy(&x, &h, sizeof x);
        float want = (float)x;
        float got = ccq_f16_to_f32(h);
        if (isnan(want) ? !isnan(got) : f32_bits(got) != f32_bits(want))
            fail_msg("f16 0x%04x: got %.9g want %.9g", c, (double)got, (double)want);
    }
#endif
}

static void test_bf16_roundtrip_exhaustive(void **state)
{
    (void)state;
    check_roundtrip(CCQ_BFLOAT16);
}

static void test_fp8_roundtrip_exhaustive(void **state)
{
    (void)state;
    check_roundtrip(CCQ_FLOAT8E4M3);
    check_roundtrip(CCQ_FLOAT8E5M2);
    /* Spot values from the OCP spec. */
    assert_true(ccq_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(ccq_e4m3_to_f32(0x01) == 0x1p-9f);
    assert_true(isnan(ccq_e4m3_to_f32(0xff)));
    assert_true(ccq_e5m2_to_f32(0x7b) == 57344.0f);
    assert_true(ccq_e5m2_to_f32(0x01) == 0x1p-16f);
    assert_true(isinf(ccq_e5m2_to_f32(0xfc)) && ccq_e5m2_to_f32(0xfc) < 0);
}

/*
 * The float bit patterns a narrow encoder is tested on: a stride through all 2^32 patterns
 * (twice, once aligned, once with a stride that walks the low bits), the specials, and the
 * neighbourhood of every value of the format and of every midpoint between neighbours,
 * including the one past the largest finite value (the overflow or saturation boundary).
 */
typedef int (*pattern_check)(ccq_dtype dt, uint32_t bits, char *msg, size_t len);

static void sweep_patterns(ccq_dtype dt, pattern_check check)
{
    char msg[256];
    uint64_t tested = 0;
#define CHECK_PATTERN(b)                                                                           \
    do {                                                                                           \
        tested++;                                                                                  \
        if (!check(dt, (uint32_t)(b), msg, sizeof msg))                                            \
            fail_msg("%s", msg);                                                                   \
    } while (0)

    for (uint64_t b = 0; b < (1ull << 32); b += 4096)
        CHECK_PATTERN(b);
    for (uint64_t b = 7; b < (1ull << 32); b += 4093)
        CHECK_PATTERN(b);

    static const uint32_t specials[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
                                        0xffc00000, 0x7f800001, 0xff800001, 0x7fa00000, 0x7fffffff,
                                        0xffffffff, 0x7f7fffff, 0xff7fffff, 0x00000001, 0x80000001,
                                        0x007fffff, 0x00800000, 0x3f800000};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        CHECK_PATTERN(specials[i]);

    /* The largest positive finite code: the largest code that decodes to a finite value. */
    uint32_t half_codes = code_count(dt) / 2, max_finite = 0;
    for (uint32_t c = 0; c < half_codes; c++)
        if (isfinite(ref_decode(dt, c)))
            max_finite = c;
    for (uint32_t c = 0; c <= max_finite; c++) {
        double v = ref_decode(dt, c);
        double next = c < max_finite ? ref_decode(dt, c + 1)
                                     : 2.0 * v - ref_decode(dt, c - 1); /* one ulp past */
        /* The midpoint of two narrow values needs one more bit than the format: exact in
         * float, even past bfloat16's largest value. */
        float points[2] = {(float)v, (float)((v + next) / 2.0)};
        for (int p = 0; p < 2; p++) {
            uint32_t base = f32_bits(points[p]);
            for (int d = -2; d <= 2; d++) {
                uint32_t b = base + (uint32_t)d;
                if (base == 0 && d < 0)
                    continue;
                CHECK_PATTERN(b);
                CHECK_PATTERN(b | 0x80000000u);
            }
        }
    }
#undef CHECK_PATTERN
    assert_true(tested > 2000000);
}

static int check_vs_ref(ccq_dtype dt, uint32_t bits, char *msg, size_t len)
{
    float f = bits_f32(bits);
    uint32_t got = lib_encode(dt, f);
    uint32_t want = ref_encode(dt, f);
    if (got == want || (code_is_nan(dt, got) && code_is_nan(dt, want)))
        return 1;
    snprintf(msg, len, "%s encode of %.9g (0x%08x): got 0x%x, want 0x%x", dtype_names[dt],
             (double)f, bits, got, want);
    return 0;
}

#ifdef __FLT16_MAX__
static int check_f16_vs_compiler(ccq_dtype dt, uint32_t bits, char *msg, size_t len)
{
    float f = bits_f32(bits);
    _Float16 h = (_Float16)f;
    uint16_t want;
    memcpy(&want, &h, sizeof want);
    uint32_t got = ccq_f32_to_f16(f);
    int ok = isnan(f) ? code_is_nan(dt, got) : got == want;
    /* The reference must agree with the compiler as well, or the other sweeps prove little. */
    if (ok && !isnan(f) && ref_encode(dt, f) != want) {
        snprintf(msg, len, "ref f16 encode of %.9g (0x%08x): 0x%x, compiler 0x%x", (double)f, bits,
                 ref_encode(dt, f), want);
        return 0;
    }
    if (!ok)
        snprintf(msg, len, "f16 encode of %.9g (0x%08x): got 0x%x, compiler 0x%x", (double)f, bits,
                 got, want);
    return ok;
}
#endif

static void test_f16_encode_vs_compiler(void **state)
{
    (void)state;
#ifdef __FLT16_MAX__
    sweep_patterns(CCQ_FLOAT16, check_f16_vs_compiler);
#else
    skip();
#endif
}

static void test_bf16_encode_vs_ref(void **state)
{
    (void)state;
    sweep_patterns(CCQ_BFLOAT16, check_vs_ref);
    /* Ties to even at the halfway points, and NaN never rounding into inf. */
    assert_int_equal(ccq_f32_to_bf16(bits_f32(0x3f808000)), 0x3f80);
    assert_int_equal(ccq_f32_to_bf16(bits_f32(0x3f818000)), 0x3f82);
    assert_int_equal(ccq_f32_to_bf16(bits_f32(0x7f7fffff)), 0x7f80);
    assert_true(code_is_nan(CCQ_BFLOAT16, ccq_f32_to_bf16(bits_f32(0x7f800001))));
    assert_true(code_is_nan(CCQ_BFLOAT16, ccq_f32_to_bf16(bits_f32(0xffffffff))));
}

static void test_e4m3_encode_vs_ref(void **state)
{
    (void)state;
    sweep_patterns(CCQ_FLOAT8E4M3, check_vs_ref);
    assert_int_equal(ccq_f32_to_e4m3(448.0f), 0x7e);
    assert_int_equal(ccq_f32_to_e4m3(464.0f), 0x7e); /* the tie with "480" saturates */
    assert_int_equal(ccq_f32_to_e4m3(1e9f), 0x7e);
    assert_int_equal(ccq_f32_to_e4m3(-INFINITY), 0xfe);
    assert_int_equal(ccq_f32_to_e4m3(NAN) & 0x7f, 0x7f);
    assert_int_equal(ccq_f32_to_e4m3(0x1p-10f), 0x00); /* tie with 2^-9: to even, 0 */
    assert_int_equal(ccq_f32_to_e4m3(0x3p-10f), 0x02); /* tie 1.5 * 2^-9: to even, 2 */
    assert_int_equal(ccq_f32_to_e4m3(-0.0f), 0x80);
}

static void test_e5m2_encode_vs_ref(void **state)
{
    (void)state;
    sweep_patterns(CCQ_FLOAT8E5M2, check_vs_ref);
    assert_int_equal(ccq_f32_to_e5m2(57344.0f), 0x7b);
    assert_int_equal(ccq_f32_to_e5m2(61440.0f), 0x7b); /* would round to inf; saturates */
    assert_int_equal(ccq_f32_to_e5m2(INFINITY), 0x7b);
    assert_int_equal(ccq_f32_to_e5m2(-INFINITY), 0xfb);
    assert_true(code_is_nan(CCQ_FLOAT8E5M2, ccq_f32_to_e5m2(NAN)));
    assert_int_equal(ccq_f32_to_e5m2(0x1p-17f), 0x00);
    assert_int_equal(ccq_f32_to_e5m2(1.125f), 0x3c); /* tie between 1.0 and 1.25: even */
}

/* ---- the kernel against the reference ---------------------------------------------------- */

/* A buffer with guard bytes on both sides. */
typedef struct gbuf {
    unsigned char *base;
    size_t bytes;
} gbuf;

static gbuf gbuf_alloc(size_t bytes)
{
    gbuf g = {malloc(bytes + 2 * GUARD), bytes};
    assert_non_null(g.base);
    memset(g.base, GUARD_BYTE, bytes + 2 * GUARD);
    return g;
}

static void *gbuf_ptr(const gbuf *g)
{
    return g->base + GUARD;
}

static void gbuf_check(const gbuf *g, const char *what)
{
    for (size_t i = 0; i < GUARD; i++)
        if (g->base[i] != GUARD_BYTE || g->base[GUARD + g->bytes + i] != GUARD_BYTE)
            fail_msg("%s: a guard byte was overwritten", what);
}

/* The code of a NaN (kind 0) or +inf (kind 1) of a narrow type; E4M3 has no infinity, so it
 * gets its largest finite value. E5M2 does have infinities, though its encoder saturates. */
static uint32_t special_code(ccq_dtype dt, int kind)
{
    switch (dt) {
    case CCQ_FLOAT16:
        return kind == 0 ? 0x7e00u : 0x7c00u;
    case CCQ_BFLOAT16:
        return kind == 0 ? 0x7fc0u : 0x7f80u;
    case CCQ_FLOAT8E4M3:
        return kind == 0 ? 0x7fu : 0x7eu;
    default:
        return kind == 0 ? 0x7fu : 0x7cu;
    }
}

/* Puts NaNs and infinities into float inputs at a few spots of different ranks, so that
 * NaN propagation and the overflow rules are exercised by every op (inf - inf at index 17
 * makes a NaN from two non-NaN inputs). */
static void add_specials(ccq_dtype dt, void **in, size_t count)
{
    static const struct {
        uint32_t rank;
        size_t index;
        int kind; /* 0: NaN, 1: +inf, 2: -inf */
    } spots[] = {{0, 3, 0}, {1, 7, 1}, {2, 11, 2}, {7, 13, 0}, {0, 17, 1}, {1, 17, 2}};
    if (!is_float_dtype(dt) || count < 32)
        return;
    size_t sz = ref_dtype_size(dt);
    for (size_t k = 0; k < sizeof spots / sizeof spots[0]; k++) {
        unsigned char *p = (unsigned char *)in[spots[k].rank] + spots[k].index * sz;
        int kind = spots[k].kind;
        double v = kind == 0 ? NAN : (kind == 1 ? INFINITY : -INFINITY);
        if (dt == CCQ_FLOAT32) {
            float f = (float)v;
            memcpy(p, &f, sizeof f);
        } else if (dt == CCQ_FLOAT64) {
            memcpy(p, &v, sizeof v);
        } else {
            uint32_t code = special_code(dt, kind == 0 ? 0 : 1);
            if (kind == 2)
                code |= sz == 1 ? 0x80u : 0x8000u;
            if (sz == 1) {
                *p = (unsigned char)code;
            } else {
                uint16_t c16 = (uint16_t)code;
                memcpy(p, &c16, sizeof c16);
            }
        }
    }
}

typedef struct reduce_fixture {
    gbuf in[MAX_RANKS];
    gbuf out[MAX_RANKS];
    void *want;
} reduce_fixture;

static void fixture_init(reduce_fixture *fx)
{
    for (int r = 0; r < MAX_RANKS; r++) {
        fx->in[r] = gbuf_alloc(MAX_COUNT * 8);
        fx->out[r] = gbuf_alloc(MAX_COUNT * 8);
    }
    fx->want = malloc(MAX_COUNT * 8);
    assert_non_null(fx->want);
}

static void fixture_free(reduce_fixture *fx)
{
    for (int r = 0; r < MAX_RANKS; r++) {
        free(fx->in[r].base);
        free(fx->out[r].base);
    }
    free(fx->want);
}

static void check_outputs(reduce_fixture *fx, ccq_dtype dt, ccq_reduce_op op, uint32_t n,
                          size_t count, const char *mode)
{
    char msg[256];
    for (uint32_t r = 0; r < n; r++) {
        size_t bad = ref_compare(dt, gbuf_ptr(&fx->out[r]), fx->want, count, msg, sizeof msg);
        if (bad != 0)
            fail_msg("%s %s n=%u count=%zu %s, rank %u: %zu mismatches; first: %s", dtype_names[dt],
                     op_names[op], n, count, mode, r, bad, msg);
        gbuf_check(&fx->out[r], mode);
    }
}

static void test_allreduce_vs_ref(void **state)
{
    ccq_dtype dt = *(const ccq_dtype *)*state;
    static const size_t counts[] = {0, 1, 7, 1023, 4099, MAX_COUNT};
    size_t sz = ref_dtype_size(dt);
    reduce_fixture fx;
    fixture_init(&fx);
    void *in[MAX_RANKS], *out[MAX_RANKS];
    for (int r = 0; r < MAX_RANKS; r++) {
        in[r] = gbuf_ptr(&fx.in[r]);
        out[r] = gbuf_ptr(&fx.out[r]);
    }

    /* The inputs are filled once (filling is the slow part) and shorter counts use
     * prefixes. No call below may write to them, which a pristine copy checks. */
    void *pristine[MAX_RANKS];
    for (uint32_t r = 0; r < MAX_RANKS; r++) {
        ref_fill(dt, in[r], MAX_COUNT, 1000 + r);
        pristine[r] = malloc(MAX_COUNT * sz);
        assert_non_null(pristine[r]);
    }
    add_specials(dt, in, MAX_COUNT);
    for (uint32_t r = 0; r < MAX_RANKS; r++)
        memcpy(pristine[r], in[r], MAX_COUNT * sz);

    for (int op = 0; op < CCQ_REDUCE_OP_COUNT_; op++) {
        for (uint32_t n = 1; n <= MAX_RANKS; n++) {
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                size_t count = counts[ci];
                ref_allreduce(dt, (ccq_reduce_op)op, n, (const void *const *)in, fx.want, count);

                /* Out of place, into poisoned outputs. */
                for (uint32_t r = 0; r < n; r++)
                    memset(out[r], POISON_BYTE, MAX_COUNT * sz);
                ccq_host_allreduce_range(dt, (ccq_reduce_op)op, n, (const void *const *)in, out, 0,
                                         count);
                check_outputs(&fx, dt, (ccq_reduce_op)op, n, count, "out of place");
                for (uint32_t r = 0; r < n; r++) {
                    if (memcmp(in[r], pristine[r], MAX_COUNT * sz) != 0)
                        fail_msg("%s %s n=%u count=%zu: input %u was modified", dtype_names[dt],
                                 op_names[op], n, count, r);
                    gbuf_check(&fx.in[r], "input");
                }

                /* In place: each output starts as a copy of its input. */
                for (uint32_t r = 0; r < n; r++)
                    memcpy(out[r], in[r], count * sz);
                ccq_host_allreduce_range(dt, (ccq_reduce_op)op, n, (const void *const *)out, out, 0,
                                         count);
                check_outputs(&fx, dt, (ccq_reduce_op)op, n, count, "in place");
            }
        }
    }
    for (uint32_t r = 0; r < MAX_RANKS; r++)
        free(pristine[r]);
    fixture_free(&fx);
}

/* Splitting the range, at block boundaries or anywhere else, gives the same bytes as one
 * call, and a call writes nothing outside its range. */
static void test_allreduce_subranges(void **state)
{
    (void)state;
    static const ccq_dtype dts[] = {CCQ_INT8,    CCQ_INT64,    CCQ_FLOAT16,    CCQ_FLOAT32,
                                    CCQ_FLOAT64, CCQ_BFLOAT16, CCQ_FLOAT8E4M3, CCQ_UINT32};
    static const ccq_reduce_op ops[] = {CCQ_SUM, CCQ_MAX, CCQ_AVG};
    const size_t count = MAX_COUNT;
    const uint32_t n = 3;
    reduce_fixture fx;
    fixture_init(&fx);
    void *in[MAX_RANKS], *out[MAX_RANKS];
    for (int r = 0; r < MAX_RANKS; r++) {
        in[r] = gbuf_ptr(&fx.in[r]);
        out[r] = gbuf_ptr(&fx.out[r]);
    }
    char msg[256];

    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        ccq_dtype dt = dts[d];
        size_t sz = ref_dtype_size(dt);
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            for (uint32_t r = 0; r < n; r++)
                ref_fill(dt, in[r], count, 77 + r);
            /* One full call gives the expected bytes. */
            ccq_host_allreduce_range(dt, ops[o], n, (const void *const *)in, out, 0, count);
            memcpy(fx.want, out[0], count * sz);

            /* Pieces: empty, one element, a block boundary, odd sizes, the rest. */
            const size_t cuts[] = {0,     0,     1,     8192 / sz, 8192 / sz + 3,
                                   12345, 12345, 20000, count - 1, count};
            for (uint32_t r = 0; r < n; r++)
                memset(out[r], POISON_BYTE, count * sz);
            for (size_t k = 0; k + 1 < sizeof cuts / sizeof cuts[0]; k++) {
                ccq_host_allreduce_range(dt, ops[o], n, (const void *const *)in, out, cuts[k],
                                         cuts[k + 1]);
                /* Nothing past the end of this piece may have been written yet. */
                const unsigned char *o0 = out[0];
                for (size_t b = cuts[k + 1] * sz; b < count * sz; b++)
                    if (o0[b] != POISON_BYTE)
                        fail_msg("%s: range [%zu, %zu) wrote byte %zu", dtype_names[dt], cuts[k],
                                 cuts[k + 1], b);
            }
            for (uint32_t r = 0; r < n; r++) {
                size_t bad = ref_compare(dt, out[r], fx.want, count, msg, sizeof msg);
                if (bad != 0)
                    fail_msg("%s %s split, rank %u: %zu mismatches; first: %s", dtype_names[dt],
                             op_names[ops[o]], r, bad, msg);
                gbuf_check(&fx.out[r], "split");
            }
        }
    }

    /* Invalid dtype or op, n == 0 and an empty range do nothing. */
    memset(out[0], POISON_BYTE, 64);
    ccq_host_allreduce_range(CCQ_DTYPE_COUNT_, CCQ_SUM, 1, (const void *const *)in, out, 0, 8);
    ccq_host_allreduce_range(CCQ_FLOAT32, CCQ_REDUCE_OP_COUNT_, 1, (const void *const *)in, out, 0,
                             8);
    ccq_host_allreduce_range(CCQ_FLOAT32, CCQ_SUM, 0, (const void *const *)in, out, 0, 8);
    ccq_host_allreduce_range(CCQ_FLOAT32, CCQ_SUM, 1, (const void *const *)in, out, 8, 4);
    for (size_t b = 0; b < 64; b++)
        assert_int_equal(((unsigned char *)out[0])[b], POISON_BYTE);
    fixture_free(&fx);
}

/*
 * Streaming stores (CCQ_HOST_REDUCE_NT) give the same bytes as plain ones, whatever the
 * alignment of source and destination and the length (below one 64-byte step, around the
 * 16-byte head, with a tail), and write nothing outside the range; with and without the
 * flag, for the copy the host backend's data-movement collectives use and for the
 * reduction's write-out.
 */
static void test_streaming_stores(void **state)
{
    (void)state;
    enum { CAP = 3 * 8192 + 512 };
    static const size_t lens[] = {0,  1,   15,  16,   17,   63,   64,   65,           79,
                                  80, 127, 128, 1000, 8191, 8192, 8193, 3 * 8192 + 77};
    unsigned char *src = malloc(CAP + 64), *dst = malloc(CAP + 64 + 2 * GUARD);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < CAP + 64; i++)
        src[i] = (unsigned char)(i * 131u + 7u);
    for (unsigned flags = 0; flags <= CCQ_HOST_REDUCE_NT; flags += CCQ_HOST_REDUCE_NT)
        for (size_t so = 0; so < 16; so += 5)
            for (size_t doff = 0; doff < 17; doff += 3)
                for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                    size_t len = lens[li];
                    unsigned char *d = dst + GUARD + doff;
                    memset(dst, GUARD_BYTE, CAP + 64 + 2 * GUARD);
                    ccq_host_copy(d, src + so, len, flags);
                    ccq_host_store_fence(flags);
                    if (memcmp(d, src + so, len) != 0)
                        fail_msg("copy flags %u src+%zu dst+%zu len %zu: wrong bytes", flags, so,
                                 doff, len);
                    for (unsigned char *p = dst; p < d; p++)
                        assert_int_equal(*p, GUARD_BYTE);
                    for (unsigned char *p = d + len; p < dst + CAP + 64 + 2 * GUARD; p++)
                        assert_int_equal(*p, GUARD_BYTE);
                }

    /* The reduction with streaming write-out, misaligned outputs, equals the plain one. */
    enum { N = 3, COUNT = 8192 + 333 };
    float *in[N], *want[N], *got[N];
    for (int r = 0; r < N; r++) {
        in[r] = malloc(COUNT * sizeof(float));
        want[r] = malloc((COUNT + 1) * sizeof(float));
        got[r] = malloc((COUNT + 1) * sizeof(float));
        assert_true(in[r] && want[r] && got[r]);
        ref_fill(CCQ_FLOAT32, in[r], COUNT, 500u + (unsigned)r);
    }
    void *wo[N], *go[N];
    for (int r = 0; r < N; r++) { /* rank r's output starts r floats in: 0, 4 and 8 bytes off */
        wo[r] = want[r] + r % 2;
        go[r] = got[r] + r % 2;
    }
    ccq_host_allreduce_range_ex(CCQ_FLOAT32, CCQ_SUM, N, (const void *const *)in, wo, 0, COUNT, 0);
    ccq_host_allreduce_range_ex(CCQ_FLOAT32, CCQ_SUM, N, (const void *const *)in, go, 0, COUNT,
                                CCQ_HOST_REDUCE_NT);
    for (int r = 0; r < N; r++) {
        assert_memory_equal(go[r], wo[r], COUNT * sizeof(float));
        free(in[r]);
        free(want[r]);
        free(got[r]);
    }
    free(src);
    free(dst);
}

/* ---- specific values ----------------------------------------------------------------------- */

/* Reduces one element per rank in place and returns the first rank's result bytes. */
static void reduce_one(ccq_dtype dt, ccq_reduce_op op, uint32_t n, const void *values, void *result)
{
    unsigned char bufs[MAX_RANKS][8];
    void *ptrs[MAX_RANKS];
    size_t sz = ref_dtype_size(dt);
    for (uint32_t r = 0; r < n; r++) {
        memcpy(bufs[r], (const unsigned char *)values + r * sz, sz);
        ptrs[r] = bufs[r];
    }
    ccq_host_allreduce_range(dt, op, n, (const void *const *)ptrs, ptrs, 0, 1);
    for (uint32_t r = 1; r < n; r++)
        assert_memory_equal(bufs[r], bufs[0], sz);
    memcpy(result, bufs[0], sz);
}

static void test_int32_avg_truncates(void **state)
{
    (void)state;
    const int32_t v[2] = {-7, 0};
    int32_t got;
    reduce_one(CCQ_INT32, CCQ_AVG, 2, v, &got);
    assert_int_equal(got, -3);
    const int32_t w[3] = {INT32_MAX, 1, 0}; /* wraps to INT32_MIN first, then divides */
    reduce_one(CCQ_INT32, CCQ_AVG, 3, w, &got);
    assert_int_equal(got, INT32_MIN / 3);
    const uint8_t u[2] = {255, 2}; /* unsigned: wrapped sum 1, divided: 0 */
    uint8_t ug;
    reduce_one(CCQ_UINT8, CCQ_AVG, 2, u, &ug);
    assert_int_equal(ug, 0);
}

static void test_uint8_sum_wraps(void **state)
{
    (void)state;
    const uint8_t v[2] = {200, 100};
    uint8_t got;
    reduce_one(CCQ_UINT8, CCQ_SUM, 2, v, &got);
    assert_int_equal(got, 44);
    const int64_t w[2] = {INT64_MAX, 1};
    int64_t g64;
    reduce_one(CCQ_INT64, CCQ_SUM, 2, w, &g64);
    assert_true(g64 == INT64_MIN);
}

static void test_int8_max_is_signed(void **state)
{
    (void)state;
    const int8_t v[2] = {-1, -128};
    int8_t got;
    reduce_one(CCQ_INT8, CCQ_MAX, 2, v, &got);
    assert_int_equal(got, -1);
    reduce_one(CCQ_INT8, CCQ_MIN, 2, v, &got);
    assert_int_equal(got, -128);
    const uint8_t u[2] = {0xff, 0x80}; /* the same bits unsigned: 255 and 128 */
    uint8_t ug;
    reduce_one(CCQ_UINT8, CCQ_MAX, 2, u, &ug);
    assert_int_equal(ug, 255);
}

static void test_float32_max_nan_propagates(void **state)
{
    (void)state;
    float got;
    const float a[3] = {1.0f, NAN, 2.0f}; /* NaN in the middle: replaces, then sticks */
    reduce_one(CCQ_FLOAT32, CCQ_MAX, 3, a, &got);
    assert_true(isnan(got));
    const float b[2] = {NAN, 5.0f}; /* NaN first */
    reduce_one(CCQ_FLOAT32, CCQ_MAX, 2, b, &got);
    assert_true(isnan(got));
    reduce_one(CCQ_FLOAT32, CCQ_MIN, 2, b, &got);
    assert_true(isnan(got));
    const float c[2] = {5.0f, NAN}; /* NaN last */
    reduce_one(CCQ_FLOAT32, CCQ_MIN, 2, c, &got);
    assert_true(isnan(got));
    const float d[2] = {-3.0f, 2.5f};
    reduce_one(CCQ_FLOAT32, CCQ_MAX, 2, d, &got);
    assert_true(got == 2.5f);
}

static void test_e4m3_sum_saturates(void **state)
{
    (void)state;
    const uint8_t v[2] = {ccq_f32_to_e4m3(448.0f), ccq_f32_to_e4m3(448.0f)};
    uint8_t got;
    reduce_one(CCQ_FLOAT8E4M3, CCQ_SUM, 2, v, &got);
    assert_int_equal(got, 0x7e);
    assert_true(ccq_e4m3_to_f32(got) == 448.0f);
    const uint8_t w[2] = {0xfe, 0xfe};
    reduce_one(CCQ_FLOAT8E4M3, CCQ_SUM, 2, w, &got);
    assert_int_equal(got, 0xfe);
}

static void test_e5m2_inf_saturates(void **state)
{
    (void)state;
    const uint8_t v[2] = {0x7c /* +inf */, 0x3c /* 1.0 */};
    uint8_t got;
    reduce_one(CCQ_FLOAT8E5M2, CCQ_SUM, 2, v, &got);
    assert_int_equal(got, 0x7b);
    assert_true(ccq_e5m2_to_f32(got) == 57344.0f);
    const uint8_t w[1] = {0xfc};
    reduce_one(CCQ_FLOAT8E5M2, CCQ_MAX, 1, w, &got);
    assert_int_equal(got, 0xfb);
    /* bfloat16 and float16, by contrast, overflow to inf as IEEE rounding says. */
    const uint16_t h[2] = {0x7bff, 0x7bff};
    uint16_t hg;
    reduce_one(CCQ_FLOAT16, CCQ_SUM, 2, h, &hg);
    assert_int_equal(hg, 0x7c00);
}

/* ---- the group ---------------------------------------------------------------------------- */

/* Not const: cmocka passes the initial state as a plain void pointer. */
static ccq_dtype all_dtypes[CCQ_DTYPE_COUNT_] = {
    CCQ_INT8,    CCQ_UINT8,   CCQ_INT32,   CCQ_UINT32,   CCQ_INT64,      CCQ_UINT64,
    CCQ_FLOAT16, CCQ_FLOAT32, CCQ_FLOAT64, CCQ_BFLOAT16, CCQ_FLOAT8E4M3, CCQ_FLOAT8E5M2};

#define ALLREDUCE_TEST(dt, name)                                                                   \
    {                                                                                              \
        "test_allreduce_vs_ref_" name, test_allreduce_vs_ref, NULL, NULL, &all_dtypes[dt]          \
    }

/* ccq_host_divide (AVG's last step in the engines across processes) is the kernels' AVG of
 * a sum: for every dtype and n, bit for bit what the one-input-per-rank AVG kernel gives for
 * n inputs whose sum is x (x, then n - 1 zeros, negative for floats); floats by a power of two as a
 * multiplication by 1/n, which must give exactly the division's bits (checked on random values,
 * subnormal and huge ones included). */
static void test_divide(void **state)
{
    (void)state;
    static const uint32_t ns[] = {1, 2, 3, 4, 5, 8, 16, 1024, 7};
    enum { N = 4099 };
    for (int dt = 0; dt < CCQ_DTYPE_COUNT_; dt++) {
        size_t es = ref_dtype_size((ccq_dtype)dt);
        unsigned char *x = malloc(N * es), *zero = calloc(N, es), *got = malloc(N * es),
                      *want = malloc(N * es), *streamed = malloc(N * es + 16);
        bool is_float = dt == CCQ_FLOAT16 || dt == CCQ_FLOAT32 || dt == CCQ_FLOAT64 ||
                        dt == CCQ_BFLOAT16 || dt == CCQ_FLOAT8E4M3 || dt == CCQ_FLOAT8E5M2;
        /* x + (-0) is x for every x (+0 + -0 is +0, -0 + -0 is -0): the other inputs are
         * negative zeros, so the sum is exactly x. */
        for (size_t i = 0; is_float && i < N; i++)
            zero[i * es + es - 1] = 0x80; /* the sign bit (little endian) */
        ref_fill((ccq_dtype)dt, x, N, 77);
        if (dt == CCQ_FLOAT32) { /* subnormal results and the largest values */
            ((float *)x)[0] = 1.1754944e-38f;
            ((float *)x)[1] = -3.4028235e38f;
            ((float *)x)[2] = 1e-45f;
        }
        if (dt == CCQ_FLOAT64) {
            ((double *)x)[0] = 2.2250738585072014e-308;
            ((double *)x)[1] = 1.7976931348623157e308;
        }
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            const void *in[1024];
            void *out[1] = {want};
            char msg[256];
            in[0] = x;
            for (uint32_t r = 1; r < ns[k]; r++)
                in[r] = zero;
            ccq_host_reduce_range((ccq_dtype)dt, CCQ_AVG, ns[k], in, 1, out, 0, N, 0);
            ccq_host_divide((ccq_dtype)dt, x, got, N, ns[k]);
            if (ref_compare((ccq_dtype)dt, got, want, N, msg, sizeof msg) != 0)
                fail_msg("dtype %d / %u: %s", dt, ns[k], msg);
            memcpy(got, x, N * es); /* in place too */
            ccq_host_divide((ccq_dtype)dt, got, got, N, ns[k]);
            assert_int_equal(ref_compare((ccq_dtype)dt, got, want, N, NULL, 0), 0);
            /* Streamed (the UCX engine's outputs beyond the caches), through its L1 block and
             * into an output 3 bytes off alignment: the same bytes, nothing written past. */
            memset(streamed, GUARD_BYTE, N * es + 16);
            ccq_host_divide_ex((ccq_dtype)dt, x, streamed + 3, N, ns[k], CCQ_HOST_REDUCE_NT);
            ccq_host_store_fence(CCQ_HOST_REDUCE_NT);
            if (memcmp(streamed + 3, want, N * es) != 0)
                fail_msg("dtype %d / %u streamed: wrong bytes", dt, ns[k]);
            for (size_t b = N * es + 3; b < N * es + 16; b++)
                assert_int_equal(streamed[b], GUARD_BYTE);
            assert_int_equal(streamed[0], GUARD_BYTE);
        }
        free(x);
        free(zero);
        free(got);
        free(want);
        free(streamed);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_roundtrip_exhaustive),
        cmocka_unit_test(test_bf16_roundtrip_exhaustive),
        cmocka_unit_test(test_fp8_roundtrip_exhaustive),
        cmocka_unit_test(test_f16_encode_vs_compiler),
        cmocka_unit_test(test_bf16_encode_vs_ref),
        cmocka_unit_test(test_e4m3_encode_vs_ref),
        cmocka_unit_test(test_e5m2_encode_vs_ref),
        ALLREDUCE_TEST(CCQ_INT8, "int8"),
        ALLREDUCE_TEST(CCQ_UINT8, "uint8"),
        ALLREDUCE_TEST(CCQ_INT32, "int32"),
        ALLREDUCE_TEST(CCQ_UINT32, "uint32"),
        ALLREDUCE_TEST(CCQ_INT64, "int64"),
        ALLREDUCE_TEST(CCQ_UINT64, "uint64"),
        ALLREDUCE_TEST(CCQ_FLOAT16, "float16"),
        ALLREDUCE_TEST(CCQ_FLOAT32, "float32"),
        ALLREDUCE_TEST(CCQ_FLOAT64, "float64"),
        ALLREDUCE_TEST(CCQ_BFLOAT16, "bfloat16"),
        ALLREDUCE_TEST(CCQ_FLOAT8E4M3, "float8e4m3"),
        ALLREDUCE_TEST(CCQ_FLOAT8E5M2, "float8e5m2"),
        cmocka_unit_test(test_allreduce_subranges),
        cmocka_unit_test(test_streaming_stores),
        cmocka_unit_test(test_int32_avg_truncates),
        cmocka_unit_test(test_uint8_sum_wraps),
        cmocka_unit_test(test_int8_max_is_signed),
        cmocka_unit_test(test_float32_max_nan_propagates),
        cmocka_unit_test(test_e4m3_sum_saturates),
        cmocka_unit_test(test_e5m2_inf_saturates),
        cmocka_unit_test(test_divide),
    };
    return cmocka_run_group_tests_name("reduce", tests, NULL, NULL);
}
