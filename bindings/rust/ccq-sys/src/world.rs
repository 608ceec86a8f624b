//! A world of processes: this process's rank, the world's size and its own global device ids;
//! job health (lost processes, live progress).

use crate::{ccq_device_id, ccq_runtime, ccq_status};
use core::ffi::c_uint;

/// `enum ccq_process_state`.
pub type ccq_process_state = c_uint;

pub const CCQ_PROCESS_ALIVE: ccq_process_state = 0;
pub const CCQ_PROCESS_LOST: ccq_process_state = 1;
pub const CCQ_PROCESS_LEFT: ccq_process_state = 2;

/// One process's progress on one communicator spanning processes (`ccq_world_progress`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ccq_progress {
    pub struct_size: u32,
    pub process: u32,
    pub state: u32,
    pub comm: u32,
    pub submitted: u64,
    pub completed: u64,
    pub pending_kind: u32,
    pub pending_seq: u64,
    pub pending_age_ns: u64,
    pub heartbeat_age_ns: u64,
}

extern "C" {
    pub fn ccq_world_rank(rt: *const ccq_runtime) -> u32;
    pub fn ccq_world_size(rt: *const ccq_runtime) -> u32;
    pub fn ccq_local_devices(rt: *const ccq_runtime, first: *mut ccq_device_id, count: *mut u32) -> ccq_status;
    pub fn ccq_world_process_state(rt: *mut ccq_runtime, process: u32, out: *mut ccq_process_state) -> ccq_status;
    pub fn ccq_world_progress(rt: *mut ccq_runtime, out: *mut ccq_progress, cap: usize, n: *mut usize) -> ccq_status;
}
