/* Scalar conversions between float and the narrow float types (binary16, bfloat16, FP8). */
#ifndef CCQ_HOST_CONVERT_H
#define CCQ_HOST_CONVERT_H

#include <stdint.h>
#include <string.h>

/*
 * Every function here is written as straight-line integer arithmetic plus selects (no
 * loops, no tables, no data-dependent branches), so that the reduction loops which call
 * them stay auto-vectorizable. The encoders round to nearest, ties to even.
 *
 * The encoders build their result in the top bits of a 32-bit word and narrow it with one
 * final shift. Computing the small code directly lets GCC's vectorizer demote every
 * intermediate select to 8- or 16-bit lanes, each demotion a shuffle sequence on SSE2;
 * that made the encoders about twice as slow.
 *
 * Results below the target's smallest normal are rounded by adding a "magic" power of two
 * whose ulp equals the target's subnormal step: the float addition does the
 * round-to-nearest-even for us. That relies on the default rounding mode and on
 * single-precision evaluation (FLT_EVAL_METHOD == 0, as on x86-64 and AArch64); none of
 * this is valid under -ffast-math. Flush-to-zero modes do no harm: the sums are normal
 * numbers, and a float subnormal input rounds to zero in the three formats that use the
 * trick. The decoders' float operations are exact.
 */

static inline uint32_t ccq_f32_bits_(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float ccq_bits_f32_(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/*
 * cond ? a : b as a mask blend. With ?: GCC sinks the float operation feeding one arm
 * into a branch, and then (floating-point traps being observable by default) never
 * speculates it again, so the calling loop is not vectorized. Masks keep the code
 * straight-line.
 */
static inline uint32_t ccq_sel32_(int cond, uint32_t a, uint32_t b)
{
    uint32_t m = 0u - (uint32_t)(cond != 0);
    return (a & m) | (b & ~m);
}

/* a > b and a < b for values below 2^31, compared as signed: SSE2 has only signed 32-bit
 * compares, and an unsigned one costs two extra instructions per vector. */
static inline int ccq_gt_(uint32_t a, uint32_t b)
{
    return (int32_t)a > (int32_t)b;
}

static inline int ccq_lt_(uint32_t a, uint32_t b)
{
    return (int32_t)a < (int32_t)b;
}

/* ---- IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits ---- */

static inline float ccq_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    /* Normal, inf and NaN in one go: exponent and mantissa moved into place with the
     * exponent rebiased by +224, then scaled by 2^-112 (net +112 = 127 - 15). Exponent 31
     * lands on 255, so inf stays inf and a NaN stays a NaN (the multiplication quiets it). */
    float norm = ccq_bits_f32_((em << 13) + (224u << 23)) * 0x1p-112f;
    /* Subnormal: mantissa * 2^-24, as (0.5 + mantissa * 2^-24) - 0.5, both steps exact. */
    float sub = ccq_bits_f32_((126u << 23) | em) - 0.5f;
    uint32_t bits = ccq_sel32_(ccq_lt_(em, 0x400u), ccq_f32_bits_(sub), ccq_f32_bits_(norm));
    return ccq_bits_f32_(bits | sign);
}

static inline uint16_t ccq_f32_to_f16(float f)
{
    uint32_t u = ccq_f32_bits_(f);
    uint32_t a = u & 0x7fffffffu;
    /* Normal result: rebias, then add half an ulp minus one plus the kept lsb (ties to
     * even) and keep the top bits; a carry out of the mantissa bumps the exponent, which
     * is what rounding up to the next binade needs. */
    uint32_t x = (a - (112u << 23) + 0xfffu + ((a >> 13) & 1u)) << 3;
    /* Below 2^-14: 0.5f has an ulp of 2^-24, the binary16 subnormal step. */
    uint32_t sub = (ccq_f32_bits_(ccq_bits_f32_(a) + 0.5f) - (126u << 23)) << 16;
    x = ccq_sel32_(ccq_lt_(a, 113u << 23), sub, x);
    /* From 65520, halfway between the largest binary16 and 2^16, IEEE rounds to inf (the
     * carry above gets 65520 itself right; larger values overflow the top 16 bits). */
    x = ccq_sel32_(ccq_gt_(a, 0x477fefffu), 0x7c00u << 16, x);
    /* NaN: keep the top of the payload, force the quiet bit. */
    x = ccq_sel32_(ccq_gt_(a, 0x7f800000u), ((a & 0x7fffffu) << 3) | (0x7e00u << 16), x);
    return (uint16_t)((x | (u & 0x80000000u)) >> 16);
}

/* ---- bfloat16: the top half of a float ---- */

static inline float ccq_bf16_to_f32(uint16_t h)
{
    return ccq_bits_f32_((uint32_t)h << 16);
}

static inline uint16_t ccq_f32_to_bf16(float f)
{
    uint32_t u = ccq_f32_bits_(f);
    /* A NaN must not be rounded as it is: a payload in the low bits only would round up
     * into infinity, or past it into the sign. So it is cut to its top half with the quiet
     * bit set first; the rounding below then adds less than one unit and leaves it be.
     * (Selecting before the rounding rather than after also keeps the vectorized loop
     * in 32-bit lanes until the final narrowing.) */
    u = ccq_sel32_(ccq_gt_(u & 0x7fffffffu, 0x7f800000u), (u | 0x00400000u) & 0xffff0000u, u);
    /* Same exponent range as float, so the only rounding is of the low 16 bits; a finite
     * value that rounds past the largest bfloat16 carries into the infinity code, as IEEE
     * rounding requires. */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* ---- OCP FP8 E4M3 ("fn"): bias 7, no infinities, S.1111.111 is NaN, max 448 ---- */

static inline float ccq_e4m3_to_f32(uint8_t c)
{
    uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    uint32_t em = c & 0x7fu;
    uint32_t norm = (em << 20) + (120u << 23);
    uint32_t sub = ccq_f32_bits_((float)em * 0x1p-9f);
    uint32_t bits = ccq_sel32_((em >> 3) == 0, sub, norm);
    bits = ccq_sel32_(em == 0x7fu, 0x7fc00000u, bits);
    return ccq_bits_f32_(bits | sign);
}

static inline uint8_t ccq_f32_to_e4m3(float f)
{
    uint32_t u = ccq_f32_bits_(f);
    uint32_t a = u & 0x7fffffffu;
    /* As ccq_f32_to_f16, with 20 dropped bits and the code in the top byte. */
    uint32_t x = (a - (120u << 23) + 0x7ffffu + ((a >> 20) & 1u)) << 4;
    /* Below 2^-6: 2^14 has an ulp of 2^-9, the E4M3 subnormal step. */
    uint32_t sub = (ccq_f32_bits_(ccq_bits_f32_(a) + 0x1p14f) - (141u << 23)) << 24;
    x = ccq_sel32_(ccq_lt_(a, 121u << 23), sub, x);
    /* Saturate to 448 above 464, the tie between 448 and the NaN code past it (the tie
     * itself rounds to even 448 above); inf too. */
    x = ccq_sel32_(ccq_gt_(a, 0x43e80000u), 0x7eu << 24, x);
    x = ccq_sel32_(ccq_gt_(a, 0x7f800000u), 0x7fu << 24, x);
    return (uint8_t)((x | (u & 0x80000000u)) >> 24);
}

/* ---- OCP FP8 E5M2: bias 15, IEEE-like, the top byte of a binary16 ---- */

static inline float ccq_e5m2_to_f32(uint8_t c)
{
    /* Exact: every E5M2 value is the binary16 with the same top byte. */
    return ccq_f16_to_f32((uint16_t)((uint16_t)c << 8));
}

static inline uint8_t ccq_f32_to_e5m2(float f)
{
    /* Not via binary16: rounding twice would break ties. */
    uint32_t u = ccq_f32_bits_(f);
    uint32_t a = u & 0x7fffffffu;
    uint32_t x = (a - (112u << 23) + 0xfffffu + ((a >> 21) & 1u)) << 3;
    /* Below 2^-14: 2^7 has an ulp of 2^-16, the E5M2 subnormal step. */
    uint32_t sub = (ccq_f32_bits_(ccq_bits_f32_(a) + 0x1p7f) - (134u << 23)) << 24;
    x = ccq_sel32_(ccq_lt_(a, 113u << 23), sub, x);
    /* Saturate like CUDA's __NV_SATFINITE: from 61440, where rounding would reach inf,
     * the result is 57344; inf too. */
    x = ccq_sel32_(ccq_gt_(a, 0x476fffffu), 0x7bu << 24, x);
    x = ccq_sel32_(ccq_gt_(a, 0x7f800000u), 0x7fu << 24, x);
    return (uint8_t)((x | (u & 0x80000000u)) >> 24);
}

#endif /* CCQ_HOST_CONVERT_H */
