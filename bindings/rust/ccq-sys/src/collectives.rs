//! The submitting calls: every buffer is borrowed until the covering fence returns.

use crate::{ccq_device_id, ccq_dtype, ccq_reduce_op, ccq_runtime, ccq_status, ccq_stream_id};
use core::ffi::c_void;

extern "C" {
    pub fn ccq_all_reduce(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        src: *const c_void,
        dst: *mut c_void,
        count: usize,
        dtype: ccq_dtype,
        op: ccq_reduce_op,
        devices: *const ccq_device_id,
        n: usize,
    ) -> ccq_status;
    pub fn ccq_send(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        src: *const c_void,
        count: usize,
        dtype: ccq_dtype,
        peer: ccq_device_id,
    ) -> ccq_status;
    pub fn ccq_recv(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        dst: *mut c_void,
        count: usize,
        dtype: ccq_dtype,
        peer: ccq_device_id,
    ) -> ccq_status;
    pub fn ccq_broadcast(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        src: *const c_void,
        dst: *mut c_void,
        count: usize,
        dtype: ccq_dtype,
        root: ccq_device_id,
        devices: *const ccq_device_id,
        n: usize,
    ) -> ccq_status;
    pub fn ccq_reduce(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        src: *const c_void,
        dst: *mut c_void,
        count: usize,
        dtype: ccq_dtype,
        op: ccq_reduce_op,
        root: ccq_device_id,
        devices: *const ccq_device_id,
        n: usize,
    ) -> ccq_status;
    pub fn ccq_all_gather(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        src: *const c_void,
        dst: *mut c_void,
        count: usize,
        dtype: ccq_dtype,
        devices: *const ccq_device_id,
        n: usize,
    ) -> ccq_status;
    pub fn ccq_reduce_scatter(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        src: *const c_void,
        dst: *mut c_void,
        count: usize,
        dtype: ccq_dtype,
        op: ccq_reduce_op,
        devices: *const ccq_device_id,
        n: usize,
    ) -> ccq_status;
    pub fn ccq_all_to_all(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        src: *const c_void,
        dst: *mut c_void,
        count: usize,
        dtype: ccq_dtype,
        devices: *const ccq_device_id,
        n: usize,
    ) -> ccq_status;
    pub fn ccq_gather(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        src: *const c_void,
        dst: *mut c_void,
        count: usize,
        dtype: ccq_dtype,
        root: ccq_device_id,
        devices: *const ccq_device_id,
        n: usize,
    ) -> ccq_status;
    pub fn ccq_scatter(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        src: *const c_void,
        dst: *mut c_void,
        count: usize,
        dtype: ccq_dtype,
        root: ccq_device_id,
        devices: *const ccq_device_id,
        n: usize,
    ) -> ccq_status;
}
