//! The event log: [`Event`]s, the event callback and its contract.

use crate::error::static_str;
use crate::types::{DType, DeviceId, ReduceOp, StreamId};
use ccq_sys as sys;
use std::cell::Cell;
use std::ffi::c_void;

/// What an event records (`ccq_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventType {
    /// A command was queued (time = the submitting call).
    Submitted,
    /// Every part of an operation has been queued and they agree.
    Matched,
    /// A command went to the backend in batch `batch`.
    Issued,
    /// A command completed successfully.
    Completed,
    /// A command ended with an error (`status`).
    Failed,
    /// The scheduler issued batch `id` of `count` operations (`bytes` = ns issuing took).
    Batch,
    /// Batch `id` came back from the backend (`status`).
    BatchDone,
    /// A fence was called on (device, stream).
    FenceBegin,
    /// ... and returned `status`.
    FenceEnd,
    /// The watchdog failed operation `seq` of communicator `comm`.
    Watchdog,
    /// Communicator `comm` was aborted.
    Abort,
    /// Process `peer` (a world rank) was lost; `device` is its first device.
    ProcessLost,
    /// A type this crate does not know (a newer libccq).
    Other(u32),
}

impl EventType {
    /// The type of a raw `ccq_event_type`.
    pub fn from_raw(raw: u32) -> EventType {
        match raw {
            sys::CCQ_EV_SUBMITTED => EventType::Submitted,
            sys::CCQ_EV_MATCHED => EventType::Matched,
            sys::CCQ_EV_ISSUED => EventType::Issued,
            sys::CCQ_EV_COMPLETED => EventType::Completed,
            sys::CCQ_EV_FAILED => EventType::Failed,
            sys::CCQ_EV_BATCH => EventType::Batch,
            sys::CCQ_EV_BATCH_DONE => EventType::BatchDone,
            sys::CCQ_EV_FENCE_BEGIN => EventType::FenceBegin,
            sys::CCQ_EV_FENCE_END => EventType::FenceEnd,
            sys::CCQ_EV_WATCHDOG => EventType::Watchdog,
            sys::CCQ_EV_ABORT => EventType::Abort,
            sys::CCQ_EV_PROCESS_LOST => EventType::ProcessLost,
            r => EventType::Other(r),
        }
    }
}

/// Kinds of commands (`ccq_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)]
pub enum Kind {
    AllReduce,
    Send,
    Recv,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Gather,
    Scatter,
    /// A kind this crate does not know.
    Other(u32),
}

impl Kind {
    /// The kind of a raw `ccq_kind`.
    pub fn from_raw(raw: u32) -> Kind {
        match raw {
            sys::CCQ_KIND_ALL_REDUCE => Kind::AllReduce,
            sys::CCQ_KIND_SEND => Kind::Send,
            sys::CCQ_KIND_RECV => Kind::Recv,
            sys::CCQ_KIND_BROADCAST => Kind::Broadcast,
            sys::CCQ_KIND_REDUCE => Kind::Reduce,
            sys::CCQ_KIND_ALL_GATHER => Kind::AllGather,
            sys::CCQ_KIND_REDUCE_SCATTER => Kind::ReduceScatter,
            sys::CCQ_KIND_ALL_TO_ALL => Kind::AllToAll,
            sys::CCQ_KIND_GATHER => Kind::Gather,
            sys::CCQ_KIND_SCATTER => Kind::Scatter,
            r => Kind::Other(r),
        }
    }
}

/// One event of the log (a copy of `ccq_event`). Fields that do not apply to a type are 0
/// (see the table in docs/tracing.md); [`Event::device`] and [`Event::stream`] are `None`
/// for scheduler events that are not about one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Event {
    /// The raw event.
    pub raw: sys::ccq_event,
}

impl Event {
    /// What it records.
    pub fn event_type(&self) -> EventType {
        EventType::from_raw(self.raw.r#type)
    }
    /// ccq's name of the type, e.g. `"submitted"`.
    pub fn type_name(&self) -> &'static str {
        // SAFETY: returns a static string for any value.
        unsafe { static_str(sys::ccq_event_type_name(self.raw.r#type)) }
    }
    /// `CLOCK_MONOTONIC` time in ns.
    pub fn time_ns(&self) -> u64 {
        self.raw.time_ns
    }
    /// Command id, or batch id for batch events.
    pub fn id(&self) -> u64 {
        self.raw.id
    }
    /// The command's device.
    pub fn device(&self) -> Option<DeviceId> {
        (self.raw.device != u32::MAX).then_some(DeviceId(self.raw.device))
    }
    /// The command's (or fence's) stream.
    pub fn stream(&self) -> Option<StreamId> {
        (self.raw.stream != u32::MAX).then_some(StreamId(self.raw.stream))
    }
    /// The command kind (meaningful for command events).
    pub fn kind(&self) -> Kind {
        Kind::from_raw(self.raw.kind.into())
    }
    /// The element type (meaningful for command events).
    pub fn dtype(&self) -> Option<DType> {
        DType::from_raw(self.raw.dtype.into())
    }
    /// The reduction (meaningful for reductions).
    pub fn op(&self) -> Option<ReduceOp> {
        ReduceOp::from_raw(self.raw.op.into())
    }
    /// send/recv: the other device; rooted collectives: the root.
    pub fn peer(&self) -> Option<DeviceId> {
        (self.raw.peer_valid != 0).then_some(DeviceId(self.raw.peer))
    }
    /// The status, where it applies (0 = `CCQ_OK`).
    pub fn status(&self) -> i32 {
        self.raw.status
    }
}

/// The boxed event callback a [`Runtime`](crate::Runtime) keeps until it is dropped.
pub(crate) type Callback = Box<dyn Fn(&Event) + Send + Sync + 'static>;

thread_local! {
    /// Set while this thread runs an event callback: the calls that wait for the scheduler
    /// refuse to run then (they would deadlock), and dropping a runtime leaks it.
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is inside an event callback.
pub(crate) fn in_callback() -> bool {
    IN_CALLBACK.with(Cell::get)
}

/// Runs `f` as a callback: the calls that wait for the scheduler refuse, and dropping a
/// runtime leaks it (also for the store's callbacks, which must not call ccq either).
/// `f` must not unwind (callers catch panics inside it).
pub(crate) fn as_callback<R>(f: impl FnOnce() -> R) -> R {
    let was = IN_CALLBACK.with(|c| c.replace(true));
    let r = f();
    IN_CALLBACK.with(|c| c.set(was));
    r
}

/// The C callback: `user` is a `*const Callback` the runtime keeps alive until destroy.
pub(crate) unsafe extern "C" fn trampoline(ev: *const sys::ccq_event, user: *mut c_void) {
    // SAFETY: ccq passes a valid event for the call's duration and our `user`.
    let (ev, f) = unsafe { (Event { raw: *ev }, &*(user as *const Callback)) };
    let was = IN_CALLBACK.with(|c| c.replace(true));
    // A panic must not unwind into C (the scheduler thread): report it and go on.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&ev)));
    IN_CALLBACK.with(|c| c.set(was));
    if r.is_err() {
        eprintln!("ccq: the event callback panicked (event ignored)");
    }
}
