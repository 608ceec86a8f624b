/* ccq interop with CUDA streams for the NCCL backend (optional header; needs no CUDA header). */
#ifndef CCQ_NCCL_H
#define CCQ_NCCL_H

#include "ccq.h"

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
 * call), and a fence that returns CCQ_OK makes @p cuda_stream wait for the collective's
 * completion, so GPU work queued after the fence sees the data. Unbound streams assume the
 * buffers are ready when the call is made.
 *
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

#ifdef __cplusplus
}
#endif

#endif /* CCQ_NCCL_H */
