//! `include/ccq/version.h`: the version the bindings were written against. Same major
//! version = ABI compatible. `ccq_version()`/`ccq_version_number()` give the running
//! library's.

use core::ffi::{c_char, c_uint};

pub const CCQ_VERSION_MAJOR: u32 = 0;
pub const CCQ_VERSION_MINOR: u32 = 2;
pub const CCQ_VERSION_PATCH: u32 = 0;
pub const CCQ_VERSION_HEX: u32 = (CCQ_VERSION_MAJOR << 16) | (CCQ_VERSION_MINOR << 8) | CCQ_VERSION_PATCH;
pub const CCQ_VERSION_STRING: &str = "0.2.0";

extern "C" {
    pub fn ccq_version() -> *const c_char;
    pub fn ccq_version_number() -> c_uint;
}
