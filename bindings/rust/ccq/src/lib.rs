//! Safe Rust API of ccq, the collective command queue: collectives (all_reduce, send/recv,
//! broadcast, reduce, all_gather, reduce_scatter, all_to_all, gather, scatter) between the
//! devices of one process, submitted from any thread onto lock-free per-stream queues, and
//! batched by one scheduler thread into backend groups (one fused pass on the host backend,
//! one `ncclGroupStart`/`ncclGroupEnd` on NCCL). Built on [`ccq_sys`].
//!
//! ```
//! use ccq::{Config, DeviceId, ReduceOp, Runtime, StreamId};
//!
//! let rt = Runtime::new(&Config::new().backend("host").host_devices(4))?;
//! let devs = rt.devices();
//! rt.comm_init(&devs)?;
//! let src: Vec<Vec<f32>> = (0..4).map(|d| vec![d as f32; 1024]).collect();
//! let mut dst = vec![vec![0.0f32; 1024]; 4];
//! // One OS thread per device, all submitting through the same scope.
//! let devs = &devs[..];
//! rt.scope(|s| {
//!     std::thread::scope(|t| {
//!         let handles: Vec<_> = src
//!             .iter()
//!             .zip(dst.iter_mut())
//!             .zip(devs)
//!             .map(|((src, dst), &d)| t.spawn(move || s.all_reduce(d, StreamId(0), src, dst, ReduceOp::Sum, devs)))
//!             .collect();
//!         handles.into_iter().try_for_each(|h| h.join().unwrap())
//!     })
//! })?;
//! assert!(dst.iter().all(|v| v.iter().all(|&x| x == 6.0)));
//! # Ok::<(), ccq::Error>(())
//! ```
//!
//! # The model
//! - A [`Runtime`] owns the devices of one backend (`"host"`: virtual devices in this process;
//!   `"nccl"`: the GPUs) with `max_streams` streams each ([`DeviceId`], [`StreamId`]). It is
//!   `Send + Sync`: share it (`&Runtime`, `Arc<Runtime>`) between the threads that submit.
//! - [`Runtime::comm_init`] creates the communicator of a device set, once.
//! - Submitting calls queue one device's part of a collective and return; it runs when
//!   every rank's part is queued. The per-stream fence ([`Runtime::sync`],
//!   `ccq_sync_collective`) waits for it and reports its errors.
//! - Fence values ([`Fence`]: [`Runtime::fence_begin`], [`Runtime::fence_test`],
//!   [`Runtime::fence_wait`]) tell without blocking whether what a stream had so far has
//!   ended; [`Scope::poll`] tests a scope's streams. They never end a borrow (see
//!   [`Scope::poll`] for why). On NCCL, [`Runtime::nccl_stream_wait`] makes a CUDA stream
//!   wait on the GPU instead.
//! - A world of processes ([`Config::world`], [`Config::bootstrap`]: MPI, a shared
//!   directory or the embedder's [`Store`]): every process has its runtime; device ids are
//!   global, [`Runtime::local_devices`] this process's.
//!
//! # Borrowing: scopes and raw calls
//! ccq borrows every buffer from the submitting call until the fence that covers it.
//! [`Runtime::scope`] makes that a Rust borrow: buffers given to a [`Scope`] are borrowed
//! until the scope has fenced every stream it submitted on (as `std::thread::scope` joins),
//! so safe code cannot free, move, write or read them meanwhile (see the `compile_fail`
//! examples on [`Scope`]). Host slices work on the host backend; [`DeviceBuffer`]
//! (`ccq_mem_alloc`) works on every backend. A runtime that owns its device memory (as
//! cubecl's servers do) uses the `unsafe` raw calls ([`Runtime::all_reduce_raw`] and
//! friends) and keeps the borrow rule itself: see `examples/server_comm.rs`.
//!
//! # Threads
//! Every method may be called from any thread. Dropping the runtime destroys it
//! (`ccq_runtime_destroy`): it shuts down, then frees; `&mut` makes sure nothing else runs.
//! The event callback ([`Runtime::set_event_callback`]) runs on the scheduler thread and
//! must not fence, `comm_init`, shut down or destroy; the types and runtime checks enforce
//! that (see there).
//!
//! # Errors
//! Every call that can fail returns [`Error`]: a [`Status`] and ccq's readable detail
//! (which argument, op, ranks; the desync report of a watchdog timeout).
//!
//! # cubecl
//! cubecl-runtime's `ServerCommunication` maps call for call: `comm_init` to
//! [`Runtime::comm_init`], `all_reduce`/`send`/`recv` to the submitting calls (`Mean` is
//! [`ReduceOp::Avg`]), `sync_collective` to [`Runtime::nccl_stream_wait`] on GPUs (the
//! compute stream waits, the host does not) and to the blocking [`Runtime::sync`] on the
//! host backend. `examples/server_comm.rs` is a
//! per-device server implementing that trait on ccq; `bindings/rust/README.md` has the table.

#![warn(missing_docs)]

mod config;
mod error;
mod fence;
mod memory;
mod runtime;
mod scope;
mod stats;
mod trace;
mod types;
mod world;

pub use ccq_sys as sys;
pub use config::Config;
pub use error::{Error, Result, Status};
pub use fence::Fence;
pub use memory::{Buffer, BufferMut, DeviceBuffer, Location};
pub use runtime::Runtime;
pub use scope::Scope;
pub use stats::{Metrics, Stats};
pub use trace::{Event, EventType, Kind};
pub use types::{DType, DeviceId, Element, ReduceOp, StreamId, BF16, F16, F8E4M3, F8E5M2};
pub use world::{Bootstrap, ProcessState, Progress, Store};

/// The version of the libccq headers the bindings were written against (`CCQ_VERSION_STRING`).
pub const VERSION: &str = sys::CCQ_VERSION_STRING;

/// The version of the libccq that is running (`ccq_version()`), e.g. `"0.2.0"`. A different
/// major version than [`VERSION`]'s is not ABI compatible.
///
/// ```
/// assert_eq!(ccq::library_version().split('.').next(), ccq::VERSION.split('.').next());
/// assert!(ccq::library_version_number() >= ccq::sys::CCQ_VERSION_HEX);
/// ```
pub fn library_version() -> &'static str {
    // SAFETY: static storage.
    unsafe { error::static_str(sys::ccq_version()) }
}

/// The running libccq's version as `CCQ_VERSION_HEX` encodes it (`ccq_version_number()`).
pub fn library_version_number() -> u32 {
    // SAFETY: takes nothing, returns a value.
    unsafe { sys::ccq_version_number() }
}
