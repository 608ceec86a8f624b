//! [`Error`]: a ccq status plus its readable detail.

use ccq_sys as sys;
use std::ffi::CStr;
use std::fmt;

/// The error statuses of ccq (`ccq_status` without `CCQ_OK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// `CCQ_ERR_INVALID_ARGUMENT`: a bad argument (the detail names it).
    InvalidArgument,
    /// `CCQ_ERR_NO_MEMORY`.
    NoMemory,
    /// `CCQ_ERR_QUEUE_FULL`: non-blocking submission, or the stream stayed full.
    QueueFull,
    /// `CCQ_ERR_NOT_INITIALIZED`: the device set never went through `comm_init`.
    NotInitialized,
    /// `CCQ_ERR_MISMATCH`: the parts of a collective disagree across ranks.
    Mismatch,
    /// `CCQ_ERR_TIMEOUT`: the watchdog or a fence deadline fired.
    Timeout,
    /// `CCQ_ERR_BACKEND`: the backend failed (the detail has its message).
    Backend,
    /// `CCQ_ERR_ABORTED`: the communicator was aborted.
    Aborted,
    /// `CCQ_ERR_SHUTDOWN`: the runtime is shutting down.
    Shutdown,
    /// `CCQ_ERR_UNSUPPORTED`.
    Unsupported,
    /// `CCQ_ERR_PROCESS_LOST`: a member process of the communicator died or was declared
    /// lost (the detail names it, its devices, who saw it and how).
    ProcessLost,
    /// A status this crate does not know (a newer libccq).
    Other(i32),
}

impl Status {
    /// The status of a raw `ccq_status`; `None` for `CCQ_OK` and other non-negative values.
    pub fn from_raw(raw: sys::ccq_status) -> Option<Status> {
        Some(match raw {
            sys::CCQ_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::CCQ_ERR_NO_MEMORY => Status::NoMemory,
            sys::CCQ_ERR_QUEUE_FULL => Status::QueueFull,
            sys::CCQ_ERR_NOT_INITIALIZED => Status::NotInitialized,
            sys::CCQ_ERR_MISMATCH => Status::Mismatch,
            sys::CCQ_ERR_TIMEOUT => Status::Timeout,
            sys::CCQ_ERR_BACKEND => Status::Backend,
            sys::CCQ_ERR_ABORTED => Status::Aborted,
            sys::CCQ_ERR_SHUTDOWN => Status::Shutdown,
            sys::CCQ_ERR_UNSUPPORTED => Status::Unsupported,
            sys::CCQ_ERR_PROCESS_LOST => Status::ProcessLost,
            r if r >= 0 => return None,
            r => Status::Other(r),
        })
    }

    /// The raw `ccq_status` value.
    pub fn raw(self) -> sys::ccq_status {
        match self {
            Status::InvalidArgument => sys::CCQ_ERR_INVALID_ARGUMENT,
            Status::NoMemory => sys::CCQ_ERR_NO_MEMORY,
            Status::QueueFull => sys::CCQ_ERR_QUEUE_FULL,
            Status::NotInitialized => sys::CCQ_ERR_NOT_INITIALIZED,
            Status::Mismatch => sys::CCQ_ERR_MISMATCH,
            Status::Timeout => sys::CCQ_ERR_TIMEOUT,
            Status::Backend => sys::CCQ_ERR_BACKEND,
            Status::Aborted => sys::CCQ_ERR_ABORTED,
            Status::Shutdown => sys::CCQ_ERR_SHUTDOWN,
            Status::Unsupported => sys::CCQ_ERR_UNSUPPORTED,
            Status::ProcessLost => sys::CCQ_ERR_PROCESS_LOST,
            Status::Other(r) => r,
        }
    }

    /// The constant's name, e.g. `"CCQ_ERR_TIMEOUT"` (from `ccq_status_name`).
    pub fn name(self) -> &'static str {
        // SAFETY: ccq_status_name returns a static NUL-terminated string for any value.
        unsafe { static_str(sys::ccq_status_name(self.raw())) }
    }

    /// Its description, e.g. `"timed out"` (from `ccq_status_string`).
    pub fn description(self) -> &'static str {
        // SAFETY: as in name().
        unsafe { static_str(sys::ccq_status_string(self.raw())) }
    }
}

/// # Safety
/// `p` is NULL or a NUL-terminated string that lives for the program.
pub(crate) unsafe fn static_str(p: *const std::ffi::c_char) -> &'static str {
    if p.is_null() {
        return "";
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("?")
}

/// A failed ccq call: its status and the detail ccq gave (which argument, op, ranks...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    detail: String,
}

impl Error {
    /// An error with this status and detail.
    pub fn new(status: Status, detail: impl Into<String>) -> Error {
        Error { status, detail: detail.into() }
    }

    /// The error of a raw status just returned on this thread, with
    /// `ccq_last_error_detail()`; `None` for a non-error status.
    pub fn from_last(raw: sys::ccq_status) -> Option<Error> {
        let status = Status::from_raw(raw)?;
        // SAFETY: the detail is a NUL-terminated thread-local string, valid until the next
        // ccq call on this thread; it is copied at once.
        let detail = unsafe { CStr::from_ptr(sys::ccq_last_error_detail()) };
        Some(Error::new(status, detail.to_string_lossy()))
    }

    /// The status.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The detail ("" if ccq gave none).
    pub fn detail(&self) -> &str {
        &self.detail
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.detail.is_empty() {
            write!(f, "{} ({})", self.status.name(), self.status.description())
        } else {
            write!(f, "{}: {}", self.status.name(), self.detail)
        }
    }
}

impl std::error::Error for Error {}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `Ok(())` for `CCQ_OK` (and other non-negative statuses), else the error and its detail.
pub(crate) fn check(raw: sys::ccq_status) -> Result<()> {
    match Error::from_last(raw) {
        None => Ok(()),
        Some(e) => Err(e),
    }
}
