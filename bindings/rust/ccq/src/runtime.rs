//! [`Runtime`]: a ccq runtime, its fences, counters, event log and raw submitting calls.

use crate::config::Config;
use crate::error::{check, static_str, Error, Result, Status};
use crate::memory::DeviceBuffer;
use crate::stats::{Metrics, Stats};
use crate::trace::{in_callback, trampoline, Callback, Event};
use crate::types::{raw_devices, DType, DeviceId, Element, ReduceOp, StreamId};
use crate::world::{with_store_error, Bootstrap, StoreCtx};
use ccq_sys as sys;
use std::ffi::{c_void, CStr, CString};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Mutex;

/// A ccq runtime: the devices of one backend, their streams and the scheduler thread.
///
/// `Send + Sync`: every method may be called from any thread at any time (as in C);
/// dropping it (`ccq_runtime_destroy`) needs `&mut`, so it cannot race with them.
///
/// ```
/// use ccq::{DeviceId, ReduceOp, Runtime, StreamId};
/// let rt = Runtime::host(2)?;
/// let devs = [DeviceId(0), DeviceId(1)];
/// rt.comm_init(&devs)?;
/// let src = [vec![1.0f32, 2.0], vec![10.0, 20.0]];
/// let mut dst = [vec![0.0f32; 2], vec![0.0; 2]];
/// rt.scope(|s| {
///     for (d, (src, dst)) in src.iter().zip(dst.iter_mut()).enumerate() {
///         s.all_reduce(DeviceId(d as u32), StreamId(0), src, dst, ReduceOp::Sum, &devs)?;
///     }
///     Ok(())
/// })?; // every stream the scope submitted on is fenced here
/// assert_eq!(dst[0], [11.0, 22.0]);
/// assert_eq!(dst[1], [11.0, 22.0]);
/// # Ok::<(), ccq::Error>(())
/// ```
pub struct Runtime {
    raw: NonNull<sys::ccq_runtime>,
    host: bool,
    /// Every callback ever set: ccq may still be running an old one after it was replaced,
    /// so each lives until destroy. Boxed twice: ccq holds a thin pointer to the inner
    /// (fat) box, which must not move when the Vec grows.
    #[allow(clippy::vec_box)]
    callbacks: Mutex<Vec<Box<Callback>>>,
    /// The store ccq calls (`ctx` points into the box) until destroy returns.
    store: Option<Box<StoreCtx>>,
}

// SAFETY: every ccq call except ccq_runtime_destroy is thread-safe; destroy needs &mut self.
unsafe impl Send for Runtime {}
// SAFETY: as above.
unsafe impl Sync for Runtime {}

fn refuse_in_callback(what: &str) -> Result<()> {
    if in_callback() {
        return Err(Error::new(
            Status::InvalidArgument,
            format!("{what} called from inside the event callback (it would wait for the scheduler thread the callback runs on)"),
        ));
    }
    Ok(())
}

impl Runtime {
    /// Creates a runtime and starts its scheduler thread.
    pub fn new(cfg: &Config) -> Result<Runtime> {
        let mut rt: *mut sys::ccq_runtime = std::ptr::null_mut();
        let store = match cfg.get_bootstrap() {
            Some(Bootstrap::Store(s)) => Some(StoreCtx::new(s.clone())),
            _ => None,
        };
        let raw_store = store.as_ref().map(|s| s.raw());
        // SAFETY: the raw config and its strings are valid for the call (ccq copies them);
        // the store's ctx is kept by the runtime until destroy (below), or dropped when
        // create fails (ccq then keeps nothing).
        let st = cfg.with_raw(raw_store.as_ref(), |raw| unsafe { sys::ccq_runtime_create(raw, &mut rt) })?;
        check(st).map_err(|e| with_store_error(e, store.as_deref()))?;
        let raw = NonNull::new(rt).ok_or_else(|| Error::new(Status::NoMemory, "ccq_runtime_create gave NULL"))?;
        // SAFETY: a live runtime; the name is static.
        let host = unsafe { static_str(sys::ccq_backend_name(raw.as_ptr())) } == "host";
        Ok(Runtime { raw, host, callbacks: Mutex::new(Vec::new()), store })
    }

    /// A host-backend runtime of `devices` virtual devices (other fields from the
    /// defaults and the environment).
    pub fn host(devices: u32) -> Result<Runtime> {
        Runtime::new(&Config::new().backend("host").host_devices(devices))
    }

    /// The raw runtime, for `ccq-sys` calls. It stays valid while `self` lives.
    pub fn as_ptr(&self) -> *mut sys::ccq_runtime {
        self.raw.as_ptr()
    }

    /// Number of devices: the world's (every process's; see [`Runtime::local_devices`]).
    pub fn device_count(&self) -> u32 {
        // SAFETY: live runtime.
        unsafe { sys::ccq_device_count(self.as_ptr()) }
    }

    /// Every device of the world, `DeviceId(0)..`; in a world of several processes only
    /// [`Runtime::local_devices`] can be used here.
    pub fn devices(&self) -> Vec<DeviceId> {
        (0..self.device_count()).map(DeviceId).collect()
    }

    /// The backend's name (`"host"`, `"nccl"`).
    pub fn backend_name(&self) -> &'static str {
        // SAFETY: live runtime; the name is a static string.
        unsafe { static_str(sys::ccq_backend_name(self.as_ptr())) }
    }

    /// Whether host memory (slices) can be given to collectives: the host backend.
    pub fn is_host(&self) -> bool {
        self.host
    }

    /// Creates the communicator of a device set (a no-op if it exists). Refused inside the
    /// event callback.
    pub fn comm_init(&self, devices: &[DeviceId]) -> Result<()> {
        refuse_in_callback("comm_init")?;
        // SAFETY: the ids are valid for the call (copied).
        check(unsafe { sys::ccq_comm_init(self.as_ptr(), raw_devices(devices), devices.len()) })
    }

    /// The fence: waits until every command submitted on (device, stream) before the call
    /// has completed; returns the first error recorded on that stream since the previous
    /// fence. Refused inside the event callback.
    pub fn sync(&self, device: DeviceId, stream: StreamId) -> Result<()> {
        refuse_in_callback("sync")?;
        // SAFETY: live runtime.
        check(unsafe { sys::ccq_sync_collective(self.as_ptr(), device.0, stream.0) })
    }

    /// The last error a fence returned on (device, stream), from any thread.
    pub fn stream_last_error(&self, device: DeviceId, stream: StreamId) -> Result<Option<Error>> {
        let mut buf = vec![0u8; 4096];
        // SAFETY: buf is valid for len bytes; ccq NUL-terminates.
        let st = unsafe {
            sys::ccq_stream_last_error(self.as_ptr(), device.0, stream.0, buf.as_mut_ptr().cast(), buf.len())
        };
        if st == sys::CCQ_ERR_INVALID_ARGUMENT {
            return Err(Error::from_last(st).unwrap());
        }
        let detail = CStr::from_bytes_until_nul(&buf).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(Status::from_raw(st).map(|s| Error::new(s, detail)))
    }

    /// Stops accepting commands, finishes what can finish, cancels the rest. Safe from any
    /// thread, also while others submit or wait; calling it twice is harmless. Refused
    /// inside the event callback.
    pub fn shutdown(&self) -> Result<()> {
        refuse_in_callback("shutdown")?;
        // SAFETY: live runtime.
        check(unsafe { sys::ccq_runtime_shutdown(self.as_ptr()) })
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Result<Stats> {
        let mut s = sys::ccq_stats { struct_size: std::mem::size_of::<sys::ccq_stats>() as u32, ..Default::default() };
        // SAFETY: s is valid and sized.
        check(unsafe { sys::ccq_get_stats(self.as_ptr(), &mut s) })?;
        Ok(Stats::from(&s))
    }

    /// A snapshot of the live metrics.
    pub fn metrics(&self) -> Result<Metrics> {
        let mut m =
            sys::ccq_metrics { struct_size: std::mem::size_of::<sys::ccq_metrics>() as u32, ..Default::default() };
        // SAFETY: m is valid and sized.
        check(unsafe { sys::ccq_get_metrics(self.as_ptr(), &mut m) })?;
        Ok(Metrics::from(&m))
    }

    /// Commands queued or in flight on one stream.
    pub fn stream_queue_depth(&self, device: DeviceId, stream: StreamId) -> Result<u64> {
        let mut d = 0;
        // SAFETY: d is a valid out-pointer.
        check(unsafe { sys::ccq_stream_queue_depth(self.as_ptr(), device.0, stream.0, &mut d) })?;
        Ok(d)
    }

    /// Writes the flight recorder as Chrome Trace Event Format JSON (Perfetto UI,
    /// chrome://tracing).
    pub fn trace_dump(&self, path: impl AsRef<Path>) -> Result<()> {
        let p = CString::new(path.as_ref().to_string_lossy().into_owned())
            .map_err(|_| Error::new(Status::InvalidArgument, "trace_dump: the path contains a NUL byte"))?;
        // SAFETY: p is a valid C string for the call.
        check(unsafe { sys::ccq_trace_dump(self.as_ptr(), p.as_ptr()) })
    }

    /// The newest `cap` events of the recorder, oldest first, and how many events were
    /// overwritten since the runtime started.
    pub fn trace_snapshot(&self, cap: usize) -> Result<(Vec<Event>, u64)> {
        // ccq strides the array by out[0].struct_size: the size of the events we declare.
        let ev = sys::ccq_event { struct_size: std::mem::size_of::<sys::ccq_event>() as u32, ..Default::default() };
        let mut raw = vec![ev; cap.max(1)];
        let (mut n, mut dropped) = (0usize, 0u64);
        // SAFETY: raw holds cap events; n and dropped are valid out-pointers.
        check(unsafe { sys::ccq_trace_snapshot(self.as_ptr(), raw.as_mut_ptr(), cap, &mut n, &mut dropped) })?;
        Ok((raw[..n.min(cap)].iter().map(|&raw| Event { raw }).collect(), dropped))
    }

    /// Sets the event callback (replacing any earlier one).
    ///
    /// The callback contract of docs/tracing.md, and how the types enforce it:
    /// - It runs on the scheduler thread (fence events: on the thread calling the fence),
    ///   possibly on several threads at once: hence `Send + Sync + 'static`.
    /// - It must be fast: every microsecond delays scheduling.
    /// - It must not fence, `comm_init`, shut down or destroy the runtime (they wait for the
    ///   scheduler, which waits for the callback). It gets no `&Runtime`; a runtime it
    ///   reaches anyway (say through an `Arc`) refuses [`Runtime::sync`],
    ///   [`Runtime::fence_wait`], [`Runtime::comm_init`], [`Runtime::shutdown`] and
    ///   [`Runtime::scope`] with
    ///   [`Status::InvalidArgument`] on a callback thread, and a runtime dropped there is
    ///   leaked instead of destroyed. Submitting calls may block on a full stream: avoid them.
    /// - The event is a copy; a panic in the callback is caught and reported on stderr.
    ///
    /// ```
    /// use std::sync::{atomic::{AtomicU64, Ordering}, Arc};
    /// let rt = ccq::Runtime::host(2)?;
    /// let seen = Arc::new(AtomicU64::new(0));
    /// let s = seen.clone();
    /// rt.set_event_callback(move |ev| {
    ///     if ev.event_type() == ccq::EventType::FenceEnd {
    ///         s.fetch_add(1, Ordering::Relaxed);
    ///     }
    /// })?;
    /// rt.sync(ccq::DeviceId(0), ccq::StreamId(0))?;
    /// assert_eq!(seen.load(Ordering::Relaxed), 1); // fence events come on the fencing thread
    /// # Ok::<(), ccq::Error>(())
    /// ```
    pub fn set_event_callback<F>(&self, f: F) -> Result<()>
    where
        F: Fn(&Event) + Send + Sync + 'static,
    {
        let b: Box<Callback> = Box::new(Box::new(f));
        let user = &*b as *const Callback as *mut c_void;
        let mut keep = self.callbacks.lock().unwrap_or_else(|e| e.into_inner());
        keep.push(b);
        // SAFETY: `user` points into a box kept until the runtime is destroyed.
        check(unsafe { sys::ccq_set_event_callback(self.as_ptr(), Some(trampoline), user) })
    }

    /// Clears the event callback.
    pub fn clear_event_callback(&self) -> Result<()> {
        // SAFETY: live runtime.
        check(unsafe { sys::ccq_set_event_callback(self.as_ptr(), None, std::ptr::null_mut()) })
    }

    /// Allocates `len` elements on `device` (see [`DeviceBuffer`]).
    pub fn alloc<T: Element>(&self, device: DeviceId, len: usize) -> Result<DeviceBuffer<'_, T>> {
        DeviceBuffer::new(self, device, len)
    }
}

/// Writes the raw collective calls: each takes (device, stream) then its own arguments, and
/// hands them to its C call after the runtime, device and stream, as written after `=>`.
/// They differ only in those arguments, so each is one entry here.
macro_rules! raw_collectives {
    ($($name:ident($($arg:ident: $ty:ty),* $(,)?) => $c:ident($($c_arg:expr),* $(,)?);)*) => {$(
        #[doc = concat!("`", stringify!($c), "`.")]
        ///
        /// # Safety
        /// See the [`Runtime`] raw calls section.
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $name(&self, device: DeviceId, stream: StreamId, $($arg: $ty),*) -> Result<()> {
            // SAFETY: the caller's contract.
            check(unsafe { sys::$c(self.as_ptr(), device.0, stream.0, $($c_arg),*) })
        }
    )*};
}

/// The raw submitting calls, one per C call, for memory the caller manages itself (device
/// pointers of an embedding runtime). Arguments as in `ccq.h`; counts are elements.
///
/// # Safety (all of them)
/// Every buffer must be memory the backend can use on `device` (host memory on the host
/// backend, device memory of `device` on NCCL), valid for the elements the call reads or
/// writes, and neither freed nor touched (written, for sources; read or written, for
/// destinations) until a fence on (`device`, `stream`) issued after this call has returned,
/// whatever its result: [`Runtime::sync`], or [`Runtime::fence_test`]/[`Runtime::fence_wait`]
/// of a value taken after this call answering anything but `Ok(false)`
/// ([`Runtime::nccl_stream_wait`] hands nothing back). Buffers a rank does not use may be
/// null.
impl Runtime {
    raw_collectives! {
        all_reduce_raw(src: *const c_void, dst: *mut c_void, count: usize, dtype: DType, op: ReduceOp,
                       devices: &[DeviceId])
            => ccq_all_reduce(src, dst, count, dtype.raw(), op.raw(), raw_devices(devices), devices.len());
        send_raw(src: *const c_void, count: usize, dtype: DType, peer: DeviceId)
            => ccq_send(src, count, dtype.raw(), peer.0);
        recv_raw(dst: *mut c_void, count: usize, dtype: DType, peer: DeviceId)
            => ccq_recv(dst, count, dtype.raw(), peer.0);
        broadcast_raw(src: *const c_void, dst: *mut c_void, count: usize, dtype: DType, root: DeviceId,
                      devices: &[DeviceId])
            => ccq_broadcast(src, dst, count, dtype.raw(), root.0, raw_devices(devices), devices.len());
        reduce_raw(src: *const c_void, dst: *mut c_void, count: usize, dtype: DType, op: ReduceOp, root: DeviceId,
                   devices: &[DeviceId])
            => ccq_reduce(src, dst, count, dtype.raw(), op.raw(), root.0, raw_devices(devices), devices.len());
        all_gather_raw(src: *const c_void, dst: *mut c_void, count: usize, dtype: DType, devices: &[DeviceId])
            => ccq_all_gather(src, dst, count, dtype.raw(), raw_devices(devices), devices.len());
        reduce_scatter_raw(src: *const c_void, dst: *mut c_void, count: usize, dtype: DType, op: ReduceOp,
                           devices: &[DeviceId])
            => ccq_reduce_scatter(src, dst, count, dtype.raw(), op.raw(), raw_devices(devices), devices.len());
        all_to_all_raw(src: *const c_void, dst: *mut c_void, count: usize, dtype: DType, devices: &[DeviceId])
            => ccq_all_to_all(src, dst, count, dtype.raw(), raw_devices(devices), devices.len());
        gather_raw(src: *const c_void, dst: *mut c_void, count: usize, dtype: DType, root: DeviceId,
                   devices: &[DeviceId])
            => ccq_gather(src, dst, count, dtype.raw(), root.0, raw_devices(devices), devices.len());
        scatter_raw(src: *const c_void, dst: *mut c_void, count: usize, dtype: DType, root: DeviceId,
                    devices: &[DeviceId])
            => ccq_scatter(src, dst, count, dtype.raw(), root.0, raw_devices(devices), devices.len());
    }

    /// `ccq_nccl_bind_stream`: orders the ccq stream after the embedding runtime's CUDA
    /// stream and makes that stream wait for fenced collectives (NCCL backend only).
    ///
    /// # Safety
    /// `cuda_stream` is a live `cudaStream_t` of `device` (or null to unbind) that outlives
    /// the binding; the call must not race with submissions on the same ccq stream.
    pub unsafe fn nccl_bind_stream(
        &self,
        device: DeviceId,
        stream: StreamId,
        cuda_stream: *mut sys::CUstream_st,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        check(unsafe { sys::ccq_nccl_bind_stream(self.as_ptr(), device.0, stream.0, cuda_stream) })
    }
}

impl Runtime {
    /// `ccq_nccl_stream_wait`: makes `cuda_stream` wait, on the GPU, for every command
    /// submitted on (device, stream) before the call, and returns at once (also when they
    /// are not issued yet): the non-blocking counterpart of [`Runtime::sync`] for GPU work,
    /// what cubecl's `sync_collective` and PyTorch's `work.wait()` do.
    ///
    /// It hands no buffer back: the commands' buffers stay borrowed until a host fence
    /// covering them ([`Runtime::sync`], [`Runtime::fence_test`]/[`Runtime::fence_wait`])
    /// returns, which is also where the errors of failed commands come (a failed command
    /// still releases the waiting GPU stream, so check before trusting the results).
    ///
    /// Errors: [`Status::Unsupported`] on a backend other than `"nccl"` (the host backend),
    /// or when the driver lacks 64-bit stream memory operations (the detail says which):
    /// fence on the host instead; [`Status::InvalidArgument`] for a bad or another
    /// process's device or stream; [`Status::Backend`] if CUDA refused.
    ///
    /// ```
    /// let rt = ccq::Runtime::host(1)?;
    /// let not_a_stream = std::ptr::NonNull::dangling(); // never touched on the host backend
    /// // SAFETY: the host backend refuses before it looks at the stream.
    /// let e = unsafe { rt.nccl_stream_wait(ccq::DeviceId(0), ccq::StreamId(0), not_a_stream) }.unwrap_err();
    /// assert_eq!(e.status(), ccq::Status::Unsupported);
    /// assert!(e.detail().contains("Runtime::fence_wait"), "{e}");
    /// # Ok::<(), ccq::Error>(())
    /// ```
    ///
    /// # Safety
    /// `cuda_stream` is a live `cudaStream_t` of CUDA device `device` (this process's local
    /// index of it) created by the caller (not the legacy default stream). CUDA lets it be
    /// destroyed with the wait still queued.
    pub unsafe fn nccl_stream_wait(
        &self,
        device: DeviceId,
        stream: StreamId,
        cuda_stream: NonNull<sys::CUstream_st>,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        let st = unsafe { sys::ccq_nccl_stream_wait(self.as_ptr(), device.0, stream.0, cuda_stream.as_ptr()) };
        check(st).map_err(|e| {
            if e.status() != Status::Unsupported {
                return e;
            }
            Error::new(
                Status::Unsupported,
                format!(
                    "{} (no GPU-side wait here: fence on the host with Runtime::fence_wait or Runtime::sync)",
                    e.detail()
                ),
            )
        })
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if in_callback() {
            // Destroying would wait for the scheduler, which is running this callback.
            eprintln!("ccq: a Runtime dropped inside its event callback is leaked, not destroyed");
            std::mem::forget(std::mem::take(self.callbacks.get_mut().unwrap_or_else(|e| e.into_inner())));
            std::mem::forget(self.store.take());
            return;
        }
        // SAFETY: &mut self: no other call on it can run; after destroy ccq touches no user
        // buffer and calls no callback or store, so the boxes (dropped after this body) can
        // go.
        unsafe { sys::ccq_runtime_destroy(self.as_ptr()) };
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("backend", &self.backend_name()).field("devices", &self.device_count()).finish()
    }
}
