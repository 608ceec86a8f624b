//! `include/ccq/ccq_nccl.h`: interop with CUDA streams (NCCL backend; the call exists in
//! every build and returns `CCQ_ERR_UNSUPPORTED` on other backends).

use crate::{ccq_device_id, ccq_runtime, ccq_status, ccq_stream_id};
use core::marker::{PhantomData, PhantomPinned};

/// CUDA's `struct CUstream_st` (`cudaStream_t` is a pointer to it); opaque.
#[repr(C)]
pub struct CUstream_st {
    _private: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

extern "C" {
    pub fn ccq_nccl_bind_stream(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        cuda_stream: *mut CUstream_st,
    ) -> ccq_status;
    pub fn ccq_nccl_stream_wait(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        cuda_stream: *mut CUstream_st,
    ) -> ccq_status;
}
