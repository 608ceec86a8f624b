//! The event log: event types, command kinds, `struct ccq_event`, the callback, dumps.

use crate::{ccq_runtime, ccq_status};
use core::ffi::{c_char, c_uint, c_void};

/// `enum ccq_event_type`.
pub type ccq_event_type = c_uint;

pub const CCQ_EV_SUBMITTED: ccq_event_type = 0;
pub const CCQ_EV_MATCHED: ccq_event_type = 1;
pub const CCQ_EV_ISSUED: ccq_event_type = 2;
pub const CCQ_EV_COMPLETED: ccq_event_type = 3;
pub const CCQ_EV_FAILED: ccq_event_type = 4;
pub const CCQ_EV_BATCH: ccq_event_type = 5;
pub const CCQ_EV_BATCH_DONE: ccq_event_type = 6;
pub const CCQ_EV_FENCE_BEGIN: ccq_event_type = 7;
pub const CCQ_EV_FENCE_END: ccq_event_type = 8;
pub const CCQ_EV_WATCHDOG: ccq_event_type = 9;
pub const CCQ_EV_ABORT: ccq_event_type = 10;
pub const CCQ_EV_PROCESS_LOST: ccq_event_type = 11;
pub const CCQ_EV_TYPE_COUNT_: ccq_event_type = 12;

/// `enum ccq_kind`.
pub type ccq_kind = c_uint;

pub const CCQ_KIND_ALL_REDUCE: ccq_kind = 0;
pub const CCQ_KIND_SEND: ccq_kind = 1;
pub const CCQ_KIND_RECV: ccq_kind = 2;
pub const CCQ_KIND_BROADCAST: ccq_kind = 3;
pub const CCQ_KIND_REDUCE: ccq_kind = 4;
pub const CCQ_KIND_ALL_GATHER: ccq_kind = 5;
pub const CCQ_KIND_REDUCE_SCATTER: ccq_kind = 6;
pub const CCQ_KIND_ALL_TO_ALL: ccq_kind = 7;
pub const CCQ_KIND_GATHER: ccq_kind = 8;
pub const CCQ_KIND_SCATTER: ccq_kind = 9;
pub const CCQ_KIND_COUNT_: ccq_kind = 10;

/// One event (fields that do not apply are 0, or `!0` for device/stream).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ccq_event {
    /// Bytes of this event the library filled; set `out[0].struct_size` before
    /// `ccq_trace_snapshot`. Fields are only ever appended.
    pub struct_size: u32,
    pub r#type: u32,
    pub time_ns: u64,
    pub id: u64,
    pub batch: u64,
    pub seq: u64,
    pub count: u64,
    pub bytes: u64,
    pub thread: u32,
    pub device: u32,
    pub stream: u32,
    pub comm: u32,
    pub kind: u8,
    pub dtype: u8,
    pub op: u8,
    pub peer_valid: u8,
    pub status: i32,
    pub peer: u32,
}

/// The event callback (runs on the scheduler thread; see `docs/tracing.md`).
pub type ccq_event_fn = Option<unsafe extern "C" fn(ev: *const ccq_event, user: *mut c_void)>;

extern "C" {
    pub fn ccq_kind_name(kind: u32) -> *const c_char;
    pub fn ccq_set_event_callback(rt: *mut ccq_runtime, fn_: ccq_event_fn, user: *mut c_void) -> ccq_status;
    pub fn ccq_trace_dump(rt: *mut ccq_runtime, path: *const c_char) -> ccq_status;
    pub fn ccq_trace_snapshot(
        rt: *mut ccq_runtime,
        out: *mut ccq_event,
        cap: usize,
        n: *mut usize,
        dropped: *mut u64,
    ) -> ccq_status;
    pub fn ccq_event_type_name(r#type: u32) -> *const c_char;
}
