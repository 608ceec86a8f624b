/* Helpers shared by the GPU tests and the GPU benchmark (see gpu_common.h). */
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu_common.h"

int gpu_failures;
int gpu_quiet;

/* Written by gpu_phase, read by the SIGALRM handler: a torn read only garbles a message. */
static char g_phase[256] = "start";

static void on_alarm(int sig)
{
    static const char head[] = "\nFAIL: self-timeout: the program hung in phase: ";
    (void)sig;
    /* Only async-signal-safe calls here. */
    if (write(STDOUT_FILENO, head, sizeof head - 1) < 0 ||
        write(STDOUT_FILENO, g_phase, strnlen(g_phase, sizeof g_phase)) < 0 ||
        write(STDOUT_FILENO, "\n", 1) < 0) {
        /* Nothing left to report it with. */
    }
    _exit(1);
}

void gpu_fail_at(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    const char *base = strrchr(file, '/');
    gpu_failures++;
    printf("FAIL %s:%d [%s]: ", base ? base + 1 : file, line, g_phase);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

void gpu_cuda_require(cudaError_t e, const char *what, const char *file, int line)
{
    if (e == cudaSuccess)
        return;
    gpu_fail_at(file, line, "%s: %s (%s); cannot go on", what, cudaGetErrorString(e),
                cudaGetErrorName(e));
    exit(1);
}

int gpu_ccq_ok(ccq_status st, const char *what, const char *file, int line)
{
    if (st == CCQ_OK)
        return 1;
    gpu_fail_at(file, line, "%s: %s: %s", what, gpu_st(st), ccq_last_error_detail());
    return 0;
}

const char *gpu_st(ccq_status st)
{
    return ccq_status_name(st);
}

void gpu_phase(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_phase, sizeof g_phase, fmt, ap);
    va_end(ap);
}

void gpu_section(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_phase, sizeof g_phase, fmt, ap);
    va_end(ap);
    if (!gpu_quiet)
        printf("-- %s\n", g_phase);
}

uint64_t gpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double gpu_since_ms(uint64_t t0_ns)
{
    return (double)(gpu_now_ns() - t0_ns) / 1e6;
}

void gpu_sleep_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

int gpu_cc_major(int dev)
{
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
        return 0;
    return major;
}

int gpu_init(const char *prog, unsigned alarm_s)
{
    int ndev = 0, drv = 0, rtv = 0;
    cudaError_t e;

    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGALRM, on_alarm);
    alarm(alarm_s);
    e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev <= 0) {
        printf("SKIP %s: no usable GPU: cudaGetDeviceCount: %s (%s)\n", prog,
               e == cudaSuccess ? "0 devices" : cudaGetErrorString(e),
               e == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(e));
        exit(GPU_EXIT_SKIP);
    }
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rtv);
    printf("%s: ccq %s, CUDA driver %d, runtime %d, %d device(s), self-timeout %u s\n", prog,
           CCQ_VERSION_STRING, drv, rtv, ndev, alarm_s);
    for (int d = 0; d < ndev; d++) {
        struct cudaDeviceProp p;
        int major = 0, minor = 0;
        memset(&p, 0, sizeof p);
        cudaGetDeviceProperties(&p, d);
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d);
        printf("  device %d: %s, compute capability %d.%d, %.1f GiB\n", d, p.name, major, minor,
               (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    }
    return ndev;
}

int gpu_finish(const char *prog)
{
    if (gpu_failures == 0) {
        printf("PASS %s\n", prog);
        return 0;
    }
    printf("FAILED %s: %d failed check(s)\n", prog, gpu_failures);
    return 1;
}

ccq_runtime *gpu_runtime(uint64_t timeout_ms, uint32_t max_batch_ops)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_status st;

    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    cfg.timeout_ms = timeout_ms;
    if (max_batch_ops != 0)
        cfg.max_batch_ops = max_batch_ops;
    st = ccq_runtime_create(&cfg, &rt);
    if (st != CCQ_OK || rt == NULL) {
        gpu_fail_at(__FILE__, __LINE__, "ccq_runtime_create(backend nccl): %s: %s; cannot go on",
                    gpu_st(st), ccq_last_error_detail());
        exit(1);
    }
    return rt;
}

void gpu_comm_init(ccq_runtime *rt, const ccq_device_id *devs, size_t n)
{
    uint64_t t0 = gpu_now_ns();
    ccq_status st = ccq_comm_init(rt, devs, n);
    if (st != CCQ_OK) {
        gpu_fail_at(__FILE__, __LINE__, "ccq_comm_init(%zu devices): %s: %s; cannot go on", n,
                    gpu_st(st), ccq_last_error_detail());
        exit(1);
    }
    if (!gpu_quiet)
        printf("   comm of %zu device(s) ready in %.1f ms\n", n, gpu_since_ms(t0));
}

void *gpu_dev_alloc(int dev, size_t bytes)
{
    void *p = NULL;
    int prev = 0;
    CUDA_REQUIRE(cudaGetDevice(&prev));
    CUDA_REQUIRE(cudaSetDevice(dev));
    CUDA_REQUIRE(cudaMalloc(&p, bytes ? bytes : 1));
    CUDA_REQUIRE(cudaSetDevice(prev));
    return p;
}

void gpu_dev_free(int dev, void *p)
{
    int prev = 0;
    if (p == NULL)
        return;
    CUDA_REQUIRE(cudaGetDevice(&prev));
    CUDA_REQUIRE(cudaSetDevice(dev));
    CUDA_REQUIRE(cudaFree(p));
    CUDA_REQUIRE(cudaSetDevice(prev));
}

void gpu_to_dev(int dev, void *dst, const void *src, size_t bytes)
{
    int prev = 0;
    CUDA_REQUIRE(cudaGetDevice(&prev));
    CUDA_REQUIRE(cudaSetDevice(dev));
    CUDA_REQUIRE(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
    /* From pageable memory cudaMemcpy may return before the DMA lands, and ccq's NCCL
     * streams do not wait for the legacy default stream: unbound ccq streams take buffers
     * as ready when the call is made, so make them ready. */
    CUDA_REQUIRE(cudaDeviceSynchronize());
    CUDA_REQUIRE(cudaSetDevice(prev));
}

void gpu_to_host(int dev, void *dst, const void *src, size_t bytes)
{
    (void)dev;
    CUDA_REQUIRE(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

uint64_t gpu_hash(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* ---- Narrow float formats --------------------------------------------------------------- */

typedef struct nfmt {
    int ebits, mbits, bias;
    uint32_t maxfin; /* code of the largest finite value */
    int ieee;        /* exponent all-ones is inf/NaN (not so for e4m3: only S.1111.111 is NaN) */
} nfmt;

static const nfmt fmt_f16 = {5, 10, 15, 0x7BFF, 1};
static const nfmt fmt_bf16 = {8, 7, 127, 0x7F7F, 1};
static const nfmt fmt_e4m3 = {4, 3, 7, 0x7E, 0};
static const nfmt fmt_e5m2 = {5, 2, 15, 0x7B, 1};

static double nf_decode(uint32_t code, const nfmt *f)
{
    uint32_t emask = (1u << f->ebits) - 1, mmask = (1u << f->mbits) - 1;
    uint32_t sign = (code >> (f->ebits + f->mbits)) & 1u;
    uint32_t e = (code >> f->mbits) & emask, m = code & mmask;
    double v;

    if (f->ieee && e == emask)
        v = m == 0 ? INFINITY : NAN;
    else if (!f->ieee && e == emask && m == mmask)
        v = NAN;
    else if (e == 0)
        v = ldexp((double)m, 1 - f->bias - f->mbits);
    else
        v = ldexp((double)((1u << f->mbits) + m), (int)e - f->bias - f->mbits);
    return sign ? -v : v;
}

/* Nearest code, ties to even. Positive codes up to maxfin are ordered like their values,
 * so a binary search over them rounds exactly without format-specific bit tricks. */
static uint32_t nf_encode(double v, const nfmt *f)
{
    uint32_t sign = (uint32_t)(signbit(v) ? 1u : 0u) << (f->ebits + f->mbits);
    uint32_t emask = (1u << f->ebits) - 1;
    uint32_t lo = 0, hi = f->maxfin;
    double a = fabs(v), top = nf_decode(f->maxfin, f);

    if (isnan(v))
        return f->ieee ? (emask << f->mbits) | (1u << (f->mbits - 1)) : 0x7Fu;
    if (a > top) /* saturate (e4m3, as __nv_fp8) or overflow to infinity */
        return sign | (f->ieee && isinf(a) ? emask << f->mbits : f->maxfin);
    while (lo < hi) { /* largest code whose value is <= a */
        uint32_t mid = lo + (hi - lo + 1) / 2;
        if (nf_decode(mid, f) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (lo < f->maxfin) {
        double d0 = a - nf_decode(lo, f), d1 = nf_decode(lo + 1, f) - a;
        if (d1 < d0 || (d1 == d0 && (lo & 1u)))
            lo++;
    }
    return sign | lo;
}

int gpu_is_fp8(ccq_dtype dt)
{
    return dt == CCQ_FLOAT8E4M3 || dt == CCQ_FLOAT8E5M2;
}

int gpu_is_float(ccq_dtype dt)
{
    return dt == CCQ_FLOAT16 || dt == CCQ_FLOAT32 || dt == CCQ_FLOAT64 || dt == CCQ_BFLOAT16 ||
           gpu_is_fp8(dt);
}

int gpu_is_signed(ccq_dtype dt)
{
    return dt == CCQ_INT8 || dt == CCQ_INT32 || dt == CCQ_INT64 || gpu_is_float(dt);
}

double gpu_load(ccq_dtype dt, const void *buf, size_t i)
{
    switch (dt) {
    case CCQ_INT8:
        return ((const int8_t *)buf)[i];
    case CCQ_UINT8:
        return ((const uint8_t *)buf)[i];
    case CCQ_INT32:
        return ((const int32_t *)buf)[i];
    case CCQ_UINT32:
        return ((const uint32_t *)buf)[i];
    case CCQ_INT64:
        return (double)((const int64_t *)buf)[i];
    case CCQ_UINT64:
        return (double)((const uint64_t *)buf)[i];
    case CCQ_FLOAT16:
        return nf_decode(((const uint16_t *)buf)[i], &fmt_f16);
    case CCQ_FLOAT32:
        return ((const float *)buf)[i];
    case CCQ_FLOAT64:
        return ((const double *)buf)[i];
    case CCQ_BFLOAT16:
        return nf_decode(((const uint16_t *)buf)[i], &fmt_bf16);
    case CCQ_FLOAT8E4M3:
        return nf_decode(((const uint8_t *)buf)[i], &fmt_e4m3);
    case CCQ_FLOAT8E5M2:
        return nf_decode(((const uint8_t *)buf)[i], &fmt_e5m2);
    default:
        return NAN;
    }
}

void gpu_store(ccq_dtype dt, void *buf, size_t i, double v)
{
    switch (dt) {
    case CCQ_INT8:
        ((int8_t *)buf)[i] = (int8_t)(int64_t)v;
        break;
    case CCQ_UINT8:
        ((uint8_t *)buf)[i] = (uint8_t)(uint64_t)v;
        break;
    case CCQ_INT32:
        ((int32_t *)buf)[i] = (int32_t)(int64_t)v;
        break;
    case CCQ_UINT32:
        ((uint32_t *)buf)[i] = (uint32_t)(uint64_t)v;
        break;
    case CCQ_INT64:
        ((int64_t *)buf)[i] = (int64_t)v;
        break;
    case CCQ_UINT64:
        ((uint64_t *)buf)[i] = (uint64_t)v;
        break;
    case CCQ_FLOAT16:
        ((uint16_t *)buf)[i] = (uint16_t)nf_encode(v, &fmt_f16);
        break;
    case CCQ_FLOAT32:
        ((float *)buf)[i] = (float)v;
        break;
    case CCQ_FLOAT64:
        ((double *)buf)[i] = v;
        break;
    case CCQ_BFLOAT16:
        ((uint16_t *)buf)[i] = (uint16_t)nf_encode(v, &fmt_bf16);
        break;
    case CCQ_FLOAT8E4M3:
        ((uint8_t *)buf)[i] = (uint8_t)nf_encode(v, &fmt_e4m3);
        break;
    case CCQ_FLOAT8E5M2:
        ((uint8_t *)buf)[i] = (uint8_t)nf_encode(v, &fmt_e5m2);
        break;
    default:
        break;
    }
}

ccq_runtime *gpu_runtime_up(int ndev)
{
    static const ccq_device_id one[1] = {0}, pair[2] = {0, 1};
    ccq_runtime *rt = gpu_runtime(30000, 0);
    gpu_comm_init(rt, one, 1);
    if (ndev >= 2)
        gpu_comm_init(rt, pair, 2);
    return rt;
}

ccq_runtime *gpu_runtime_reset(ccq_runtime *rt, int ndev, const char *why)
{
    printf("   resetting the runtime after: %s\n", why);
    ccq_runtime_destroy(rt);
    return gpu_runtime_up(ndev);
}

double gpu_ref2(ccq_dtype dt, ccq_reduce_op op, double a, double b)
{
    switch (op) {
    case CCQ_SUM:
        return a + b;
    case CCQ_PROD:
        return a * b;
    case CCQ_MAX:
        return a > b ? a : b;
    case CCQ_MIN:
        return a < b ? a : b;
    case CCQ_AVG:
        return gpu_is_float(dt) ? a * 0.5 + b * 0.5 : trunc((a + b) / 2.0);
    default:
        return NAN;
    }
}
