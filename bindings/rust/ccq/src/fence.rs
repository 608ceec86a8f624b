//! [`Fence`]: fence values, fences that never block (`ccq_fence_begin/test/wait`).

use crate::error::{check, Error, Result, Status};
use crate::runtime::Runtime;
use crate::types::{DeviceId, StreamId};
use ccq_sys as sys;
use std::cmp::Ordering;
use std::time::Duration;

/// The command count is the low 48 bits of a value, compared modulo 2^48 (`runtime/stream.h`);
/// the clear epoch is the high 16 bits.
const TARGET_BITS: u32 = 48;
const TARGET_MASK: u64 = (1 << TARGET_BITS) - 1;

/// A fence value: what [`Runtime::fence_begin`] captured of one (device, stream), every
/// command whose submitting call returned before it. A plain value (`Copy`, `Send`,
/// `Sync`): keep it, hand it to other threads, test it from any of them
/// ([`Runtime::fence_test`], [`Runtime::fence_wait`]); every test of one value gives the
/// same final answer.
///
/// Values of one stream are ordered: `a <= b` means `b` covers at least what `a` covers (a
/// later `fence_begin` on the same stream is never below an earlier one). Values of
/// different streams are not comparable (`partial_cmp` is `None`).
///
/// A value only *tells* when commands ended; it never releases a [`Scope`](crate::Scope)'s
/// borrows, which end with the scope. Code that owns its memory (the `unsafe` raw calls)
/// may reuse a buffer once a value covering its command answers anything but "in progress":
/// that is ccq's borrow rule (`ccq.h`).
///
/// ```
/// use ccq::{DeviceId, ReduceOp, StreamId};
/// let rt = ccq::Runtime::host(2)?;
/// let devs = [DeviceId(0), DeviceId(1)];
/// rt.comm_init(&devs)?;
/// let st = StreamId(0);
/// let before = rt.fence_begin(devs[0], st)?;
/// assert!(rt.fence_test(&before)?); // nothing submitted yet: done
/// let src = [vec![1i32; 8], vec![2; 8]];
/// let mut dst = [vec![0i32; 8], vec![0; 8]];
/// let [d0, d1] = &mut dst;
/// rt.scope(|s| {
///     s.all_reduce(devs[0], st, &src[0], d0, ReduceOp::Sum, &devs)?;
///     let f = s.fence(devs[0], st)?; // covers the all_reduce above
///     assert!(f > before && f.device() == devs[0]);
///     s.all_reduce(devs[1], st, &src[1], d1, ReduceOp::Sum, &devs)?;
///     assert!(rt.fence_wait(&f, None)?); // done (it was in progress until device 1's part)
///     Ok(())
/// })?;
/// assert_eq!(dst[0], [3; 8]);
/// # Ok::<(), ccq::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fence {
    device: DeviceId,
    stream: StreamId,
    raw: sys::ccq_fence,
}

impl Fence {
    /// A value from its parts: a raw `ccq_fence` of (device, stream), say from C code.
    /// A value that is not one of that stream's gets [`Status::InvalidArgument`] from the
    /// tests when ccq can tell; the safe API never lets one release a borrow.
    pub fn from_raw(device: DeviceId, stream: StreamId, raw: sys::ccq_fence) -> Fence {
        Fence { device, stream, raw }
    }

    /// The device it was taken on.
    pub fn device(&self) -> DeviceId {
        self.device
    }

    /// The stream it was taken on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The raw `ccq_fence`.
    pub fn raw(&self) -> sys::ccq_fence {
        self.raw
    }

    /// Whether `self` covers every command `other` covers (same stream, `self >= other`).
    pub fn covers(&self, other: &Fence) -> bool {
        matches!(self.partial_cmp(other), Some(Ordering::Greater | Ordering::Equal))
    }
}

/// `a` before `b` modulo 2^bits, as ccq compares them (values never lie half the range apart).
fn modular(a: u64, b: u64, mask: u64) -> Ordering {
    let d = b.wrapping_sub(a) & mask;
    if d == 0 {
        Ordering::Equal
    } else if d <= mask >> 1 {
        Ordering::Less
    } else {
        Ordering::Greater
    }
}

impl PartialOrd for Fence {
    /// By the commands covered (the count, modulo 2^48 as ccq compares it), then by the clear
    /// epoch (a value taken after a `sync` reported an error is the later one); `None`
    /// across streams.
    fn partial_cmp(&self, other: &Fence) -> Option<Ordering> {
        if (self.device, self.stream) != (other.device, other.stream) {
            return None;
        }
        let by_count = modular(self.raw & TARGET_MASK, other.raw & TARGET_MASK, TARGET_MASK);
        Some(by_count.then(modular(self.raw >> TARGET_BITS, other.raw >> TARGET_BITS, 0xffff)))
    }
}

/// `Ok(true)` for CCQ_OK, `Ok(false)` for CCQ_IN_PROGRESS, else the error.
fn answer(raw: sys::ccq_status) -> Result<bool> {
    match raw {
        sys::CCQ_IN_PROGRESS => Ok(false),
        r => check(r).map(|()| true),
    }
}

impl Runtime {
    /// `ccq_fence_begin`: a value covering every command submitted on (device, stream)
    /// so far (every submitting call that returned before this one). Never blocks (two
    /// atomic loads); any thread. Errors: [`Status::InvalidArgument`] for a bad or another
    /// process's device, or a stream out of range.
    pub fn fence_begin(&self, device: DeviceId, stream: StreamId) -> Result<Fence> {
        let mut raw = 0;
        // SAFETY: live runtime; raw is a valid out-pointer.
        check(unsafe { sys::ccq_fence_begin(self.as_ptr(), device.0, stream.0, &mut raw) })?;
        Ok(Fence { device, stream, raw })
    }

    /// `ccq_fence_test`: never blocks. `Ok(false)` while a covered command has not ended;
    /// then always the same final answer: `Ok(true)`, or the error [`Runtime::sync`] would
    /// have returned for the covered commands (reported only once every covered command
    /// ended). Unlike `sync` it does not clear the stream's error, so the next `sync` still
    /// reports it. [`Status::InvalidArgument`] for a value not of its stream, or older than
    /// 16 error reports by `sync` on it. Fine inside the event callback.
    pub fn fence_test(&self, fence: &Fence) -> Result<bool> {
        // SAFETY: live runtime; the value is plain data.
        answer(unsafe { sys::ccq_fence_test(self.as_ptr(), fence.device.0, fence.stream.0, fence.raw) })
    }

    /// `ccq_fence_wait`: sleeps until [`Runtime::fence_test`] would not say "in progress",
    /// at most `timeout` (`None`: the runtime's `timeout_ms`, no limit if that is 0; a
    /// timeout below a millisecond waits one), and returns its answer: `Ok(false)` when the
    /// wait ended first (nothing failed; the watchdog still ends commands that never can
    /// run). On NCCL its `Ok(true)` makes a bound CUDA stream ([`Runtime::nccl_bind_stream`])
    /// wait for the work, as `sync` does. Refused inside the event callback.
    pub fn fence_wait(&self, fence: &Fence, timeout: Option<Duration>) -> Result<bool> {
        if crate::trace::in_callback() {
            return Err(Error::new(
                Status::InvalidArgument,
                "fence_wait called from inside the event callback (it would wait for the scheduler thread the callback runs on)",
            ));
        }
        let ms = timeout.map_or(0, |t| t.as_micros().div_ceil(1000).clamp(1, u64::MAX as u128) as u64);
        // SAFETY: live runtime; the value is plain data.
        answer(unsafe { sys::ccq_fence_wait(self.as_ptr(), fence.device.0, fence.stream.0, fence.raw, ms) })
    }
}
