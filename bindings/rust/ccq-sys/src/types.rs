//! Element types, reduction operations, ids and the opaque runtime.

use crate::ccq_status;
use core::ffi::{c_char, c_uint, c_void};
use core::marker::{PhantomData, PhantomPinned};

/// `enum ccq_dtype` (names and widths as NCCL's `ncclDataType_t`).
pub type ccq_dtype = c_uint;

pub const CCQ_INT8: ccq_dtype = 0;
pub const CCQ_UINT8: ccq_dtype = 1;
pub const CCQ_INT32: ccq_dtype = 2;
pub const CCQ_UINT32: ccq_dtype = 3;
pub const CCQ_INT64: ccq_dtype = 4;
pub const CCQ_UINT64: ccq_dtype = 5;
pub const CCQ_FLOAT16: ccq_dtype = 6;
pub const CCQ_FLOAT32: ccq_dtype = 7;
pub const CCQ_FLOAT64: ccq_dtype = 8;
pub const CCQ_BFLOAT16: ccq_dtype = 9;
pub const CCQ_FLOAT8E4M3: ccq_dtype = 10;
pub const CCQ_FLOAT8E5M2: ccq_dtype = 11;
pub const CCQ_DTYPE_COUNT_: ccq_dtype = 12;

/// `enum ccq_reduce_op`.
pub type ccq_reduce_op = c_uint;

pub const CCQ_SUM: ccq_reduce_op = 0;
pub const CCQ_PROD: ccq_reduce_op = 1;
pub const CCQ_MAX: ccq_reduce_op = 2;
pub const CCQ_MIN: ccq_reduce_op = 3;
pub const CCQ_AVG: ccq_reduce_op = 4;
pub const CCQ_REDUCE_OP_COUNT_: ccq_reduce_op = 5;

pub type ccq_device_id = u32;
pub type ccq_stream_id = u32;
/// A fence value of one stream (`ccq_fence_begin`).
pub type ccq_fence = u64;

/// The opaque `struct ccq_runtime`; only ever used behind a pointer.
#[repr(C)]
pub struct ccq_runtime {
    _private: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

pub const CCQ_FLAG_NONBLOCKING_SUBMIT: u32 = 0x1;

/// The embedder's key-value store for a world of processes (`struct ccq_store`; see
/// docs/multiprocess.md): ccq copies it; `ctx` and the functions must outlive every runtime
/// using it. `get` never blocks (`CCQ_IN_PROGRESS` while the key is missing).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ccq_store {
    pub ctx: *mut c_void,
    pub set: Option<
        unsafe extern "C" fn(ctx: *mut c_void, key: *const c_char, value: *const c_void, len: usize) -> ccq_status,
    >,
    pub get: Option<
        unsafe extern "C" fn(ctx: *mut c_void, key: *const c_char, value: *mut c_void, len: *mut usize) -> ccq_status,
    >,
}

extern "C" {
    pub fn ccq_dtype_size(dtype: ccq_dtype) -> usize;
    pub fn ccq_dtype_name(dtype: ccq_dtype) -> *const c_char;
    pub fn ccq_reduce_op_name(op: ccq_reduce_op) -> *const c_char;
}
