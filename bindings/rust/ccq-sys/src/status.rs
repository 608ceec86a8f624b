//! Status codes (`CCQ_STATUS_MAP` in `ccq.h`) and the calls that describe them.

use core::ffi::{c_char, c_int};

/// `enum ccq_status`: negative values are errors; `CCQ_IN_PROGRESS` (positive) means "not
/// done yet" (a non-blocking call with nothing to report).
pub type ccq_status = c_int;

pub const CCQ_OK: ccq_status = 0;
pub const CCQ_IN_PROGRESS: ccq_status = 1;
pub const CCQ_ERR_INVALID_ARGUMENT: ccq_status = -1;
pub const CCQ_ERR_NO_MEMORY: ccq_status = -2;
pub const CCQ_ERR_QUEUE_FULL: ccq_status = -3;
pub const CCQ_ERR_NOT_INITIALIZED: ccq_status = -4;
pub const CCQ_ERR_MISMATCH: ccq_status = -5;
pub const CCQ_ERR_TIMEOUT: ccq_status = -6;
pub const CCQ_ERR_BACKEND: ccq_status = -7;
pub const CCQ_ERR_ABORTED: ccq_status = -8;
pub const CCQ_ERR_SHUTDOWN: ccq_status = -9;
pub const CCQ_ERR_UNSUPPORTED: ccq_status = -10;
pub const CCQ_ERR_PROCESS_LOST: ccq_status = -11;

extern "C" {
    pub fn ccq_status_string(s: ccq_status) -> *const c_char;
    pub fn ccq_status_name(s: ccq_status) -> *const c_char;
    pub fn ccq_last_error_detail() -> *const c_char;
}
