//! `struct ccq_metrics`: live metrics, and per-stream queue depths.

use crate::{ccq_device_id, ccq_runtime, ccq_status, ccq_stream_id};

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ccq_metrics {
    pub struct_size: u32,
    pub uptime_ns: u64,
    pub commands_ended: u64,
    pub commands_per_s: f64,
    pub commands_per_s_total: f64,
    pub queue_p50_us: f64,
    pub queue_p99_us: f64,
    pub run_p50_us: f64,
    pub run_p99_us: f64,
    pub batch_size_hist: [u64; 8],
    pub queued_now: u64,
    pub deepest_device: u32,
    pub deepest_stream: u32,
    pub deepest_depth: u64,
    pub trace_events: u64,
    pub trace_dropped: u64,
}

extern "C" {
    pub fn ccq_get_metrics(rt: *mut ccq_runtime, out: *mut ccq_metrics) -> ccq_status;
    pub fn ccq_stream_queue_depth(
        rt: *mut ccq_runtime,
        device: ccq_device_id,
        stream: ccq_stream_id,
        depth: *mut u64,
    ) -> ccq_status;
}
