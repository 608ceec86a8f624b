/* Helpers shared by the GPU tests and the GPU benchmark: skip without a GPU, checks that
 * keep going, a self-timeout naming the phase that hung, and host codecs for every dtype. */
#ifndef CCQ_GPU_COMMON_H
#define CCQ_GPU_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "ccq.h"

/* ctest's SKIP_RETURN_CODE for every GPU program. */
#define GPU_EXIT_SKIP 77

/* Failed expectations so far; gpu_finish() turns it into the exit code. */
extern int gpu_failures;

/* Non-zero: gpu_section and gpu_comm_init print nothing (the benchmark's tables). */
extern int gpu_quiet;

/* Print and count a failed expectation; the program goes on. */
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond))                                                                               \
            gpu_fail_at(__FILE__, __LINE__, __VA_ARGS__);                                          \
    } while (0)

/* A CUDA call the program cannot go on without: on error print it and exit 1. */
#define CUDA_REQUIRE(call) gpu_cuda_require((call), #call, __FILE__, __LINE__)

/* A ccq call expected to return CCQ_OK: on error print status and detail, count a failure
 * and evaluate to false. */
#define CCQ_EXPECT_OK(call) gpu_ccq_ok((call), #call, __FILE__, __LINE__)

void gpu_fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void gpu_cuda_require(cudaError_t e, const char *what, const char *file, int line);
int gpu_ccq_ok(ccq_status st, const char *what, const char *file, int line);

/**
 * Start a GPU program: line-buffered output, a SIGALRM self-timeout after @p alarm_s that
 * prints the current phase and exits 1 (set it below the ctest TIMEOUT), then the devices.
 * Exits GPU_EXIT_SKIP with a message when cudaGetDeviceCount fails or finds no device.
 * @return the number of CUDA devices (>= 1).
 */
int gpu_init(const char *prog, unsigned alarm_s);

/** Record what the program does now, for failure and self-timeout messages. */
void gpu_phase(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/** gpu_phase, and print it as a "-- " heading (unless gpu_quiet). */
void gpu_section(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/** Print the result line and return the exit code (0, or 1 when anything failed). */
int gpu_finish(const char *prog);

uint64_t gpu_now_ns(void);
double gpu_since_ms(uint64_t t0_ns);
void gpu_sleep_ms(unsigned ms);

/** Compute capability major of CUDA device @p dev (0 if unknown). */
int gpu_cc_major(int dev);

/** "CCQ_ERR_TIMEOUT" */
const char *gpu_st(ccq_status st);

/**
 * An NCCL runtime with @p timeout_ms and @p max_batch_ops (0 = default). Prints status and
 * detail and exits 1 if it cannot be created (there is a GPU, so that is a failure).
 */
ccq_runtime *gpu_runtime(uint64_t timeout_ms, uint32_t max_batch_ops);

/** ccq_comm_init, printing status and detail and exiting 1 on failure. */
void gpu_comm_init(ccq_runtime *rt, const ccq_device_id *devs, size_t n);

/**
 * The tests' runtime: timeout_ms 30 s, communicators {0} and, with @p ndev >= 2, {0, 1}.
 * gpu_runtime_reset destroys @p rt (shutdown cancels what is queued) and makes a new one,
 * so that one failure (which may poison an NCCL communicator or leave a lone part waiting)
 * does not fail every later case.
 */
ccq_runtime *gpu_runtime_up(int ndev);
ccq_runtime *gpu_runtime_reset(ccq_runtime *rt, int ndev, const char *why);

/** cudaMalloc on device @p dev (the current device is restored); exits 1 on failure. */
void *gpu_dev_alloc(int dev, size_t bytes);
void gpu_dev_free(int dev, void *p);

/** Host copies (blocking) to and from device memory of device @p dev. */
void gpu_to_dev(int dev, void *dst, const void *src, size_t bytes);
void gpu_to_host(int dev, void *dst, const void *src, size_t bytes);

/** A 64-bit mix (splitmix64's finalizer) for test data. */
uint64_t gpu_hash(uint64_t x);

/**
 * Element i of a buffer of @p dt as a double (float16, bfloat16 and fp8 decoded exactly;
 * integers exact up to 2^53).
 */
double gpu_load(ccq_dtype dt, const void *buf, size_t i);

/** Store @p v as element i of @p dt, rounding to nearest even for the narrow floats. */
void gpu_store(ccq_dtype dt, void *buf, size_t i, double v);

/** True for the float types (float16/32/64, bfloat16, both fp8). */
int gpu_is_float(ccq_dtype dt);
int gpu_is_signed(ccq_dtype dt);
int gpu_is_fp8(ccq_dtype dt);

/** NCCL's result of reducing a and b with @p op: float AVG is a premultiplied sum, integer
 * AVG truncates toward zero. */
double gpu_ref2(ccq_dtype dt, ccq_reduce_op op, double a, double b);

#endif /* CCQ_GPU_COMMON_H */
