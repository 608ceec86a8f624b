//! Raw FFI bindings to ccq, the collective command queue.
//!
//! One module per area of the C API, each mirroring its part of `include/ccq.h`,
//! `include/ccq/version.h` and `include/ccq/ccq_nccl.h` declaration for declaration; all
//! of them are re-exported at the crate root under their C names. The documentation of
//! every call (ownership, threads, errors) is the Doxygen comment in the header.
//!
//! The declarations cannot drift from the headers silently: `build.rs` parses both the
//! headers and these sources, compiles a C program that prints the size and alignment of
//! every struct and typedef, the offset and size of every field and the value of every
//! constant, and `tests/layout.rs` compares that with `size_of`/`offset_of!` here, and
//! checks that every public item of the headers has a declaration here.
//!
//! Linking: see `build.rs` (`CCQ_LIB_DIR`/`CCQ_INCLUDE_DIR`, else pkg-config `ccq`, else
//! this repository's CMake project built into `OUT_DIR`) and `bindings/rust/README.md`.
//!
//! Conventions the build script's parser relies on (keep them when adding items): one
//! `pub const NAME: TYPE = VALUE;` per line, `pub type NAME = TYPE;`, `#[repr(C)] pub
//! struct NAME {` with one `pub field: Type,` per line (opaque types have no `pub`
//! fields), and `pub fn NAME(` inside `extern "C"` blocks.
#![no_std]
#![allow(non_camel_case_types)]
#![allow(missing_docs)] // every item is documented in the C header it mirrors

mod collectives;
mod config;
mod mem;
mod metrics;
mod nccl;
mod runtime;
mod stats;
mod status;
mod trace;
mod types;
mod version;
mod world;

pub use collectives::*;
pub use config::*;
pub use mem::*;
pub use metrics::*;
pub use nccl::*;
pub use runtime::*;
pub use stats::*;
pub use status::*;
pub use trace::*;
pub use types::*;
pub use version::*;
pub use world::*;

pub use core::ffi::{c_char, c_int, c_uint, c_void};
