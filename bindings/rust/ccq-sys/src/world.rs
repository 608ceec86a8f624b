//! A world of processes: this process's rank, the world's size and its own global device ids.

use crate::{ccq_device_id, ccq_runtime, ccq_status};

extern "C" {
    pub fn ccq_world_rank(rt: *const ccq_runtime) -> u32;
    pub fn ccq_world_size(rt: *const ccq_runtime) -> u32;
    pub fn ccq_local_devices(rt: *const ccq_runtime, first: *mut ccq_device_id, count: *mut u32) -> ccq_status;
}
