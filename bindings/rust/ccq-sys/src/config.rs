//! `struct ccq_config` and its initialisation.

use crate::ccq_store;
use core::ffi::c_char;

/// Runtime configuration; fill it with [`ccq_config_init`], then change fields.
/// Fields are only ever appended (append new ones at the end, as the header does).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ccq_config {
    pub struct_size: u32,
    pub backend: *const c_char,
    pub host_devices: u32,
    pub max_streams: u32,
    pub queue_depth: u32,
    pub max_batch_ops: u32,
    pub timeout_ms: u64,
    pub host_workers: u32,
    pub flags: u32,
    pub env_error: *const c_char,
    pub spin_us: u32,
    pub fault: *const c_char,
    pub trace_capacity: u32,
    pub trace_file: *const c_char,
    pub host_stream_bytes: u64,
    pub world_rank: u32,
    pub world_size: u32,
    pub bootstrap: *const c_char,
    pub store: *const ccq_store,
    pub mpi_comm: i64,
    /// 1: a SIGUSR1 handler makes every runtime of the process dump its trace file.
    pub trace_signal: u32,
    pub check_signatures: u32,
    /// Job health: heartbeat period (0 = none) and the age that makes a process lost.
    pub heartbeat_ms: u32,
    pub heartbeat_timeout_ms: u32,
    /// NCCL backend: 1 = communication streams with the device's highest priority.
    pub nccl_high_priority: u32,
    /// Fusion of small collectives: operations each below this many bytes fuse, up to this
    /// many bytes per fused operation (0 = off; default 1 MiB).
    pub fusion_bytes: u64,
    /// The host backend's engine across processes: `"ucx"`, `"mpi"`, or NULL (ucx when its
    /// module libccq-ucx.so.0 loads, else mpi when MPI is initialised).
    pub host_engine: *const c_char,
}

extern "C" {
    /// Defaults, then `CCQ_*` environment variables, into the first `size` bytes of `cfg`
    /// (pass `size_of::<ccq_config>()`; C's `ccq_config_init()` macro does).
    pub fn ccq_config_init_sized(cfg: *mut ccq_config, size: usize);
    /// 0.1.0's entry point (kept for binaries built against 0.1.0): fills exactly 0.1.0's
    /// layout. Do not call it from new code; use [`ccq_config_init_sized`].
    pub fn ccq_config_init(cfg: *mut ccq_config);
}
