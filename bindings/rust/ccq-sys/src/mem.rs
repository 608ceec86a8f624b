//! Backend memory: host memory on the host backend, `cudaMalloc`'d memory on NCCL.

use crate::{ccq_device_id, ccq_runtime, ccq_status};
use core::ffi::{c_uint, c_void};

/// `enum ccq_copy_kind`.
pub type ccq_copy_kind = c_uint;

pub const CCQ_COPY_TO_DEVICE: ccq_copy_kind = 0;
pub const CCQ_COPY_TO_HOST: ccq_copy_kind = 1;

extern "C" {
    pub fn ccq_mem_alloc(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        bytes: usize,
        out: *mut *mut c_void,
    ) -> ccq_status;
    pub fn ccq_mem_free(rt: *mut ccq_runtime, device: ccq_device_id, ptr: *mut c_void) -> ccq_status;
    pub fn ccq_mem_copy(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: ccq_copy_kind,
    ) -> ccq_status;
}
