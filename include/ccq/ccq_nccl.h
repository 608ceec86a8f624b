/* ccq interop with CUDA streams for the NCCL backend (optional header; needs no CUDA header). */
#ifndef CCQ_NCCL_H
#define CCQ_NCCL_H

#include "ccq.h"

/**
 * @file ccq/ccq_nccl.h
 * Interop of the NCCL backend with the embedder's CUDA streams: order a ccq stream after a
 * CUDA stream (ccq_nccl_bind_stream), and make a CUDA stream wait on the GPU for a ccq
 * stream's commands (ccq_nccl_stream_wait). Needs no CUDA header; on another backend both
 * calls return CCQ_ERR_UNSUPPORTED. docs/nccl.md has the details.
 */

#ifdef __cplusplus
extern "C" {
#endif

/* cudaStream_t is `struct CUstream_st *`; declaring the struct keeps this header free of
 * CUDA includes while staying type-compatible with cudaStream_t. */
struct CUstream_st;

/**
 * Bind the embedding runtime's CUDA stream to the ccq stream (device, stream).
 *
 * After binding, every command submitted on (device, stream) is ordered after the work
 * queued on @p cuda_stream before the submitting call (ccq records an event on it at the
 * call), and a fence that returns CCQ_OK (ccq_sync_collective, ccq_fence_wait; not the
 * polling ccq_fence_test) makes @p cuda_stream wait for the collective's
 * completion, so GPU work queued after the fence sees the data. Unbound streams assume the
 * buffers are ready when the call is made.
 *
 * @param[in] rt           The runtime (backend "nccl").
 * @param[in] device       A device of this process.
 * @param[in] stream       One of its ccq streams.
 * @param[in] cuda_stream  A stream of CUDA device @p device, or NULL to unbind. The caller
 *                         keeps ownership; it must outlive the binding.
 * @return CCQ_OK; CCQ_ERR_UNSUPPORTED if the runtime's backend is not "nccl";
 *         CCQ_ERR_INVALID_ARGUMENT for a bad device/stream or when commands are still
 *         outstanding on the stream (bind before use, or after a fence);
 *         CCQ_ERR_BACKEND if CUDA refused (detail has its message).
 * Thread-safe, but must not race with submissions on the same ccq stream.
 */
CCQ_API ccq_status ccq_nccl_bind_stream(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                        struct CUstream_st *cuda_stream);

/**
 * Make @p cuda_stream wait, on the GPU, for every command submitted on (device, stream)
 * before this call, and return at once, without waiting for the commands, also when they
 * are not issued yet (the scheduler issues them later). Non-blocking counterpart of
 * ccq_sync_collective for GPU work: what cubecl's sync_collective and PyTorch's
 * work.wait() do.
 *
 * ccq keeps per stream a 64-bit count of ended commands in pinned host memory the GPU
 * reads; this queues cuStreamWaitValue64(count >= commands submitted so far) on
 * @p cuda_stream. The communication stream advances the count with cuStreamWriteValue64
 * after each batch, before the batch's completion event. Commands that fail, are aborted,
 * time out or are cancelled by shutdown still advance it (from the host), so no GPU stream
 * waits forever on ccq; their error is returned by the stream's next host fence
 * (ccq_sync_collective, ccq_fence_test/wait), which also is where the buffers of failed
 * commands are handed back. GPU work queued after the wait sees the results of the
 * commands that completed.
 *
 * @param[in] rt           The runtime (backend "nccl").
 * @param[in] device       A device of this process.
 * @param[in] stream       One of its ccq streams.
 * @param[in] cuda_stream  A stream of CUDA device @p device (cudaStream_t, not NULL: a
 *                         stream you created); the caller keeps ownership (CUDA lets it
 *                         be destroyed with the wait still queued).
 * @return CCQ_OK (queued); CCQ_ERR_UNSUPPORTED if the backend is not "nccl", or the driver
 *         lacks 64-bit stream memory operations (cuStreamWaitValue64 through
 *         cudaGetDriverEntryPointByVersion, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS;
 *         the detail says which: fence on the host instead); CCQ_ERR_INVALID_ARGUMENT (bad
 *         device/stream, NULL stream); CCQ_ERR_NO_MEMORY; CCQ_ERR_BACKEND if CUDA refused.
 * Thread-safe: any thread, any number of CUDA streams, concurrently with submissions (a
 * command whose submission races with this call may or may not be covered).
 */
CCQ_API ccq_status ccq_nccl_stream_wait(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                        struct CUstream_st *cuda_stream);

#ifdef __cplusplus
}
#endif

#endif /* CCQ_NCCL_H */
