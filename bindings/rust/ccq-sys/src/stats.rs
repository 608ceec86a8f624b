//! `struct ccq_stats`: the runtime's counters.

use crate::{ccq_runtime, ccq_status};

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ccq_stats {
    pub struct_size: u32,
    pub submitted: u64,
    pub completed: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub pending: u64,
    pub batches: u64,
    pub batched_ops: u64,
    pub max_batch_ops: u64,
    pub batch_size_hist: [u64; 8],
}

extern "C" {
    pub fn ccq_get_stats(rt: *mut ccq_runtime, out: *mut ccq_stats) -> ccq_status;
}
