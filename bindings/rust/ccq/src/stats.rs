//! [`Stats`] and [`Metrics`]: snapshots of a runtime's counters and live metrics.

use ccq_sys as sys;

/// Counters of a runtime (`ccq_stats`): every submitted command ends in exactly one of
/// completed, failed or cancelled, so `submitted == completed + failed + cancelled + pending`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Commands accepted by submitting calls.
    pub submitted: u64,
    /// Commands that completed successfully.
    pub completed: u64,
    /// Commands that ended with an error.
    pub failed: u64,
    /// Commands cancelled by shutdown.
    pub cancelled: u64,
    /// Not ended yet, at the snapshot.
    pub pending: u64,
    /// Backend groups issued.
    pub batches: u64,
    /// Operations (matched collectives, send/recv pairs) issued.
    pub batched_ops: u64,
    /// Largest number of operations in one group.
    pub max_batch_ops: u64,
    /// Groups of 1, 2-3, 4-7, ..., 128+ operations.
    pub batch_size_hist: [u64; 8],
}

impl From<&sys::ccq_stats> for Stats {
    fn from(s: &sys::ccq_stats) -> Self {
        Stats {
            submitted: s.submitted,
            completed: s.completed,
            failed: s.failed,
            cancelled: s.cancelled,
            pending: s.pending,
            batches: s.batches,
            batched_ops: s.batched_ops,
            max_batch_ops: s.max_batch_ops,
            batch_size_hist: s.batch_size_hist,
        }
    }
}

/// Live metrics computed by the scheduler (`ccq_metrics`; see docs/tracing.md).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Metrics {
    /// Since the runtime was created.
    pub uptime_ns: u64,
    /// Completed + failed + cancelled.
    pub commands_ended: u64,
    /// Over the last full second.
    pub commands_per_s: f64,
    /// Over the runtime's life.
    pub commands_per_s_total: f64,
    /// Time in queue (submitted to issued), median, µs.
    pub queue_p50_us: f64,
    /// Time in queue, 99th percentile, µs.
    pub queue_p99_us: f64,
    /// Time in flight (issued to completed), median, µs.
    pub run_p50_us: f64,
    /// Time in flight, 99th percentile, µs.
    pub run_p99_us: f64,
    /// Batches of 1, 2-3, 4-7, ..., 128+ operations.
    pub batch_size_hist: [u64; 8],
    /// Commands queued or in flight on all streams.
    pub queued_now: u64,
    /// The stream with the most of them: its device...
    pub deepest_device: u32,
    /// ...its stream...
    pub deepest_stream: u32,
    /// ...and how many.
    pub deepest_depth: u64,
    /// Events recorded since start (overwritten ones included).
    pub trace_events: u64,
    /// Events overwritten before anyone read them.
    pub trace_dropped: u64,
}

impl From<&sys::ccq_metrics> for Metrics {
    fn from(m: &sys::ccq_metrics) -> Self {
        Metrics {
            uptime_ns: m.uptime_ns,
            commands_ended: m.commands_ended,
            commands_per_s: m.commands_per_s,
            commands_per_s_total: m.commands_per_s_total,
            queue_p50_us: m.queue_p50_us,
            queue_p99_us: m.queue_p99_us,
            run_p50_us: m.run_p50_us,
            run_p99_us: m.run_p99_us,
            batch_size_hist: m.batch_size_hist,
            queued_now: m.queued_now,
            deepest_device: m.deepest_device,
            deepest_stream: m.deepest_stream,
            deepest_depth: m.deepest_depth,
            trace_events: m.trace_events,
            trace_dropped: m.trace_dropped,
        }
    }
}
