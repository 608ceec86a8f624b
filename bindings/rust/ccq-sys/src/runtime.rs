//! Runtime lifetime, communicators, fences and per-stream errors.

use crate::{ccq_config, ccq_device_id, ccq_fence, ccq_runtime, ccq_status, ccq_stream_id};
use core::ffi::c_char;

extern "C" {
    pub fn ccq_runtime_create(cfg: *const ccq_config, out: *mut *mut ccq_runtime) -> ccq_status;
    pub fn ccq_runtime_shutdown(rt: *mut ccq_runtime) -> ccq_status;
    pub fn ccq_runtime_destroy(rt: *mut ccq_runtime) -> ccq_status;
    pub fn ccq_device_count(rt: *const ccq_runtime) -> u32;
    pub fn ccq_backend_name(rt: *const ccq_runtime) -> *const c_char;
    pub fn ccq_comm_init(rt: *mut ccq_runtime, devices: *const ccq_device_id, n: usize) -> ccq_status;
    pub fn ccq_sync_collective(rt: *mut ccq_runtime, device: ccq_device_id, stream: ccq_stream_id) -> ccq_status;
    pub fn ccq_fence_begin(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        out: *mut ccq_fence,
    ) -> ccq_status;
    pub fn ccq_fence_test(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        f: ccq_fence,
    ) -> ccq_status;
    pub fn ccq_fence_wait(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        f: ccq_fence,
        timeout_ms: u64,
    ) -> ccq_status;
    pub fn ccq_stream_last_error(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        buf: *mut c_char,
        len: usize,
    ) -> ccq_status;
}
