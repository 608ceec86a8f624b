//! `include/ccq/version.h`: the version the bindings were written against. Same major
//! version = ABI compatible.

pub const CCQ_VERSION_MAJOR: u32 = 0;
pub const CCQ_VERSION_MINOR: u32 = 1;
pub const CCQ_VERSION_PATCH: u32 = 0;
pub const CCQ_VERSION_HEX: u32 = (CCQ_VERSION_MAJOR << 16) | (CCQ_VERSION_MINOR << 8) | CCQ_VERSION_PATCH;
pub const CCQ_VERSION_STRING: &str = "0.1.0";
