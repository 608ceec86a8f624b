//! [`Scope`]: safe submission. Buffers stay borrowed until the scope has fenced every stream
//! it submitted on, as `std::thread::scope` keeps its borrows until it has joined.

use crate::error::{Error, Result, Status};
use crate::fence::Fence;
use crate::memory::{Buffer, BufferMut, Location};
use crate::types::{DeviceId, Element, ReduceOp, StreamId};
use crate::Runtime;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Mutex;

/// A submission scope, made by [`Runtime::scope`]. Every buffer given to it is borrowed for
/// `'scope`, which ends only after the scope has fenced (`ccq_sync_collective`) every
/// (device, stream) it submitted on; so safe code can neither free, move, write nor (for
/// destinations) read a buffer while ccq may still use it. It is `Sync`: threads spawned
/// with `std::thread::scope` inside it can submit through it.
///
/// A buffer declared inside the scope cannot be submitted (it does not live for `'scope`):
///
/// ```compile_fail,E0597
/// let rt = ccq::Runtime::host(1)?;
/// let devs = [ccq::DeviceId(0)];
/// rt.comm_init(&devs)?;
/// rt.scope(|s| {
///     let src = vec![1.0f32; 4];
///     let mut dst = vec![0.0f32; 4];
///     s.all_reduce(devs[0], ccq::StreamId(0), &src, &mut dst, ccq::ReduceOp::Sum, &devs)
/// })?;
/// # Ok::<(), ccq::Error>(())
/// ```
///
/// A destination cannot be read while the scope holds it:
///
/// ```compile_fail,E0502
/// let rt = ccq::Runtime::host(1)?;
/// let devs = [ccq::DeviceId(0)];
/// let src = vec![1.0f32; 4];
/// let mut dst = vec![0.0f32; 4];
/// rt.scope(|s| {
///     s.all_reduce(devs[0], ccq::StreamId(0), &src, &mut dst, ccq::ReduceOp::Sum, &devs)?;
///     println!("{}", dst[0]); // ccq may be writing it
///     Ok(())
/// })?;
/// # Ok::<(), ccq::Error>(())
/// ```
///
/// Nor can a source be written:
///
/// ```compile_fail,E0502
/// let rt = ccq::Runtime::host(1)?;
/// let devs = [ccq::DeviceId(0)];
/// let mut src = vec![1.0f32; 4];
/// rt.scope(|s| {
///     s.send(devs[0], ccq::StreamId(0), &src, devs[0])?;
///     src[0] = 2.0; // ccq may be reading it
///     Ok(())
/// })?;
/// # Ok::<(), ccq::Error>(())
/// ```
///
/// Nor a buffer dropped (freed) while ccq may use it:
///
/// ```compile_fail,E0505
/// let rt = ccq::Runtime::host(1)?;
/// let devs = [ccq::DeviceId(0)];
/// let mut dst = rt.alloc::<f32>(devs[0], 4)?;
/// rt.scope(|s| {
///     s.recv(devs[0], ccq::StreamId(0), &mut dst, devs[0])?;
///     drop(dst);
///     Ok(())
/// })?;
/// # Ok::<(), ccq::Error>(())
/// ```
///
/// The same buffer cannot be a destination twice in one scope:
///
/// ```compile_fail,E0499
/// let rt = ccq::Runtime::host(1)?;
/// let devs = [ccq::DeviceId(0)];
/// let mut buf = vec![0.0f32; 4];
/// rt.scope(|s| {
///     s.recv(devs[0], ccq::StreamId(0), &mut buf, devs[0])?;
///     s.recv(devs[0], ccq::StreamId(1), &mut buf, devs[0])?;
///     Ok(())
/// })?;
/// # Ok::<(), ccq::Error>(())
/// ```
pub struct Scope<'scope, 'env: 'scope> {
    rt: &'env Runtime,
    /// Every (device, stream) submitted on, with a fence value covering the scope's last
    /// command there.
    streams: Mutex<Vec<(DeviceId, StreamId, Option<Fence>)>>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

/// Fences every stream of the scope when dropped: also when the closure panics.
struct FenceOnDrop<'a, 'scope, 'env>(&'a Scope<'scope, 'env>);

impl Drop for FenceOnDrop<'_, '_, '_> {
    fn drop(&mut self) {
        self.0.fence_all();
    }
}

impl Runtime {
    /// Runs `f` with a [`Scope`] to submit on, then fences every (device, stream) the scope
    /// submitted on and returns: `f`'s error if it failed, else the first fence error, else
    /// `f`'s value. The fences also run when `f` panics. Refused inside the event callback.
    ///
    /// The end fences with [`Runtime::sync`], not with fence values, even when
    /// [`Scope::poll`] already said "done" (then the syncs return at once): a value never
    /// clears an error, so a failed command would fail every later value of its stream
    /// (which covers it too) until a `sync` reported it. The borrows end only after those
    /// fences returned, whatever they returned (ccq's rule: the buffers are free then).
    pub fn scope<'env, F, T>(&'env self, f: F) -> Result<T>
    where
        F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<T>,
    {
        if crate::trace::in_callback() {
            return Err(Error::new(Status::InvalidArgument, "scope called from inside the event callback"));
        }
        let scope = Scope { rt: self, streams: Mutex::new(Vec::new()), _scope: PhantomData, _env: PhantomData };
        let guard = FenceOnDrop(&scope);
        let value = f(&scope);
        let fence_err = scope.fence_all();
        drop(guard); // nothing left to fence
        match (value, fence_err) {
            (Err(e), _) | (Ok(_), Some(e)) => Err(e),
            (Ok(v), None) => Ok(v),
        }
    }
}

fn invalid(msg: String) -> Error {
    Error::new(Status::InvalidArgument, msg)
}

/// Writes the safe collectives of a source `S` and a destination `D` of `T` elements
/// (either side an `Option` where only the root has it): each entry is the method's docs,
/// its arguments after (device, stream), and its body; the generics and bounds, the same
/// for all of them, are written here once. Each entry names `self`, `device` and `stream`
/// itself: macro hygiene would hide names the macro made up from the entry's body.
macro_rules! collectives {
    ($($(#[$attr:meta])* fn $name:ident(&$self:ident, $device:ident, $stream:ident, $($arg:ident: $ty:ty),* $(,)?)
        $body:block)*) => {$(
        $(#[$attr])*
        pub fn $name<T, S, D>(&$self, $device: DeviceId, $stream: StreamId, $($arg: $ty),*) -> Result<()>
        where
            T: Element,
            S: Buffer<Elem = T> + ?Sized,
            D: BufferMut<Elem = T> + ?Sized,
        $body
    )*};
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// Fences every stream submitted on so far; the first error.
    fn fence_all(&self) -> Option<Error> {
        let streams = std::mem::take(&mut *self.streams.lock().unwrap_or_else(|e| e.into_inner()));
        let mut first = None;
        for (d, s, _) in streams {
            // ccq's contract: the buffers are released when the fence returns, whatever it
            // returns.
            if let Err(e) = self.rt.sync(d, s) {
                first.get_or_insert(e);
            }
        }
        first
    }

    /// The runtime.
    pub fn runtime(&self) -> &'env Runtime {
        self.rt
    }

    fn check<B: Buffer + ?Sized>(&self, what: &str, device: DeviceId, b: &B) -> Result<()> {
        match b.location() {
            Location::Host if !self.rt.is_host() => Err(invalid(format!(
                "{what}: a host buffer on the \"{}\" backend (use Runtime::alloc, or the raw calls for device memory)",
                self.rt.backend_name()
            ))),
            Location::Device(rt, d) if !std::ptr::eq(rt, self.rt.as_ptr()) || d != device => {
                Err(invalid(format!("{what}: a DeviceBuffer of {d} of another runtime or device, used on {device}")))
            }
            _ => Ok(()),
        }
    }

    fn len_is(what: &str, name: &str, got: usize, want: usize) -> Result<()> {
        if got == want {
            return Ok(());
        }
        Err(invalid(format!("{what}: {name} has {got} elements, expected {want}")))
    }

    /// Records (device, stream) to fence, and a value covering the command, after a
    /// submission succeeded.
    fn submitted(&self, device: DeviceId, stream: StreamId, r: Result<()>) -> Result<()> {
        r?;
        // The stream is recorded whatever begin says: the scope's end must fence it.
        let f = self.rt.fence_begin(device, stream).ok();
        let mut s = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        match s.iter_mut().find(|(d, st, _)| (*d, *st) == (device, stream)) {
            Some(e) => e.2 = f,
            None => s.push((device, stream, f)),
        }
        Ok(())
    }

    /// A fence value of (device, stream) ([`Runtime::fence_begin`]): it covers what this
    /// scope (and anyone else) submitted there so far. Test or wait on it with the
    /// runtime's calls, from any thread; the scope's buffers stay borrowed until the scope
    /// ends all the same (see [`Scope::poll`]).
    pub fn fence(&self, device: DeviceId, stream: StreamId) -> Result<Fence> {
        self.rt.fence_begin(device, stream)
    }

    /// Never blocks: whether every command this scope submitted so far has ended
    /// (`ccq_fence_test` of a value per stream). `Ok(true)`: they all completed, and the
    /// scope's end will not wait for them; `Ok(false)`: some are in progress; `Err`: one
    /// failed (every command of that stream's value ended); the scope's end reports it too,
    /// through its `sync`, which also clears it.
    ///
    /// For event loops that must not block while collectives run:
    ///
    /// ```
    /// # use ccq::{DeviceId, ReduceOp, StreamId};
    /// let rt = ccq::Runtime::host(2)?;
    /// let devs = [DeviceId(0), DeviceId(1)];
    /// rt.comm_init(&devs)?;
    /// let src = [vec![1.0f32; 64], vec![2.0; 64]];
    /// let mut dst = [vec![0.0f32; 64], vec![0.0; 64]];
    /// rt.scope(|s| {
    ///     for (d, (src, dst)) in src.iter().zip(dst.iter_mut()).enumerate() {
    ///         s.all_reduce(DeviceId(d as u32), StreamId(0), src, dst, ReduceOp::Sum, &devs)?;
    ///     }
    ///     while !s.poll()? {
    ///         std::thread::yield_now(); // other work of the event loop
    ///     }
    ///     Ok(())
    /// })?; // its syncs return at once now
    /// assert_eq!(dst[1][0], 3.0);
    /// # Ok::<(), ccq::Error>(())
    /// ```
    ///
    /// Borrows still end with the scope, not with a fence value that says "done": a
    /// buffer cannot be read inside the scope even after the poll says so. A guard
    /// returned out of the closure could not enforce that (safe code may `mem::forget`
    /// it), which is why scopes are closures, as `std::thread::scope`:
    ///
    /// ```compile_fail,E0502
    /// # use ccq::{DeviceId, ReduceOp, StreamId};
    /// let rt = ccq::Runtime::host(1)?;
    /// let devs = [DeviceId(0)];
    /// rt.comm_init(&devs)?;
    /// let src = vec![1.0f32; 4];
    /// let mut dst = vec![0.0f32; 4];
    /// rt.scope(|s| {
    ///     s.all_reduce(devs[0], StreamId(0), &src, &mut dst, ReduceOp::Sum, &devs)?;
    ///     let f = s.fence(devs[0], StreamId(0))?;
    ///     while !s.runtime().fence_wait(&f, None)? {}
    ///     println!("{}", dst[0]); // still borrowed by the scope
    ///     Ok(())
    /// })?;
    /// # Ok::<(), ccq::Error>(())
    /// ```
    pub fn poll(&self) -> Result<bool> {
        let values: Vec<_> = self.streams.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut done = true;
        for (d, s, f) in values {
            let f = match f {
                Some(f) => f,
                None => self.rt.fence_begin(d, s)?,
            };
            done &= self.rt.fence_test(&f)?;
        }
        Ok(done)
    }

    collectives! {
        /// This device's part of an all_reduce of `src` into `dst` (same length) over the
        /// communicator of `devices`.
        fn all_reduce(&self, device, stream, src: &'scope S, dst: &'scope mut D, op: ReduceOp, devices: &[DeviceId]) {
            let (sp, dp) = self.src_dst("all_reduce", device, src, dst)?;
            Self::len_is("all_reduce", "dst", dst.len(), src.len())?;
            // SAFETY: both buffers are checked, of the right length, and borrowed until the
            // scope's fence on (device, stream).
            let r = unsafe { self.rt.all_reduce_raw(device, stream, sp, dp, src.len(), T::DTYPE, op, devices) };
            self.submitted(device, stream, r)
        }
    }

    /// An all_reduce in place: `buf` is both source and destination.
    pub fn all_reduce_in_place<T, B>(
        &self,
        device: DeviceId,
        stream: StreamId,
        buf: &'scope mut B,
        op: ReduceOp,
        devices: &[DeviceId],
    ) -> Result<()>
    where
        T: Element,
        B: BufferMut<Elem = T> + ?Sized,
    {
        self.check("all_reduce_in_place", device, buf)?;
        let p = buf.as_mut_ptr().cast::<c_void>();
        // SAFETY: as in all_reduce; src == dst is ccq's in-place form.
        let r = unsafe { self.rt.all_reduce_raw(device, stream, p, p, buf.len(), T::DTYPE, op, devices) };
        self.submitted(device, stream, r)
    }

    /// Sends `src` to `peer` (matched with `peer`'s recv from `device`, in per-pair order).
    pub fn send<T, S>(&self, device: DeviceId, stream: StreamId, src: &'scope S, peer: DeviceId) -> Result<()>
    where
        T: Element,
        S: Buffer<Elem = T> + ?Sized,
    {
        self.check("send", device, src)?;
        // SAFETY: as in all_reduce.
        let r = unsafe { self.rt.send_raw(device, stream, src.as_ptr().cast(), src.len(), T::DTYPE, peer) };
        self.submitted(device, stream, r)
    }

    /// Receives into `dst` from `peer`.
    pub fn recv<T, D>(&self, device: DeviceId, stream: StreamId, dst: &'scope mut D, peer: DeviceId) -> Result<()>
    where
        T: Element,
        D: BufferMut<Elem = T> + ?Sized,
    {
        self.check("recv", device, dst)?;
        // SAFETY: as in all_reduce.
        let r = unsafe { self.rt.recv_raw(device, stream, dst.as_mut_ptr().cast(), dst.len(), T::DTYPE, peer) };
        self.submitted(device, stream, r)
    }

    collectives! {
        /// Broadcast of `root`'s `src` into every rank's `dst`; `src` is `Some` on the root only
        /// (same length as `dst`).
        fn broadcast(&self, device, stream, src: Option<&'scope S>, dst: &'scope mut D, root: DeviceId,
                     devices: &[DeviceId]) {
            self.check("broadcast", device, dst)?;
            let sp = self.root_src("broadcast", device, root, src, dst.len())?;
            let dp = dst.as_mut_ptr().cast();
            // SAFETY: as in all_reduce.
            let r = unsafe { self.rt.broadcast_raw(device, stream, sp, dp, dst.len(), T::DTYPE, root, devices) };
            self.submitted(device, stream, r)
        }

        /// Reduce of every rank's `src` into `root`'s `dst` (`Some` on the root only).
        #[allow(clippy::too_many_arguments)]
        fn reduce(&self, device, stream, src: &'scope S, dst: Option<&'scope mut D>, op: ReduceOp, root: DeviceId,
                  devices: &[DeviceId]) {
            self.check("reduce", device, src)?;
            let dp = self.root_dst("reduce", device, root, dst, src.len())?;
            let sp = src.as_ptr().cast();
            // SAFETY: as in all_reduce.
            let r = unsafe { self.rt.reduce_raw(device, stream, sp, dp, src.len(), T::DTYPE, op, root, devices) };
            self.submitted(device, stream, r)
        }

        /// All-gather: every rank's `src` into block `rank` of every rank's `dst`
        /// (`src.len() * devices.len()` elements).
        fn all_gather(&self, device, stream, src: &'scope S, dst: &'scope mut D, devices: &[DeviceId]) {
            let (sp, dp) = self.src_dst("all_gather", device, src, dst)?;
            Self::len_is("all_gather", "dst", dst.len(), src.len() * devices.len())?;
            // SAFETY: as in all_reduce.
            let r = unsafe { self.rt.all_gather_raw(device, stream, sp, dp, src.len(), T::DTYPE, devices) };
            self.submitted(device, stream, r)
        }

        /// Reduce-scatter: block r of every rank's `src` (`dst.len() * devices.len()` elements)
        /// reduced into rank r's `dst`.
        fn reduce_scatter(&self, device, stream, src: &'scope S, dst: &'scope mut D, op: ReduceOp,
                          devices: &[DeviceId]) {
            let (sp, dp) = self.src_dst("reduce_scatter", device, src, dst)?;
            Self::len_is("reduce_scatter", "src", src.len(), dst.len() * devices.len())?;
            // SAFETY: as in all_reduce.
            let r = unsafe { self.rt.reduce_scatter_raw(device, stream, sp, dp, dst.len(), T::DTYPE, op, devices) };
            self.submitted(device, stream, r)
        }

        /// All-to-all: block j of rank i's `src` goes to block i of rank j's `dst` (both of
        /// `count * devices.len()` elements).
        fn all_to_all(&self, device, stream, src: &'scope S, dst: &'scope mut D, devices: &[DeviceId]) {
            let (sp, dp) = self.src_dst("all_to_all", device, src, dst)?;
            Self::len_is("all_to_all", "dst", dst.len(), src.len())?;
            let n = devices.len().max(1);
            if src.len() % n != 0 {
                return Err(invalid(format!("all_to_all: {} elements do not split into {n} blocks", src.len())));
            }
            // SAFETY: as in all_reduce.
            let r = unsafe { self.rt.all_to_all_raw(device, stream, sp, dp, src.len() / n, T::DTYPE, devices) };
            self.submitted(device, stream, r)
        }

        /// Gather: every rank's `src` into block `rank` of `root`'s `dst` (`Some` on the root
        /// only, `src.len() * devices.len()` elements).
        fn gather(&self, device, stream, src: &'scope S, dst: Option<&'scope mut D>, root: DeviceId,
                  devices: &[DeviceId]) {
            self.check("gather", device, src)?;
            let dp = self.root_dst("gather", device, root, dst, src.len() * devices.len())?;
            let sp = src.as_ptr().cast();
            // SAFETY: as in all_reduce.
            let r = unsafe { self.rt.gather_raw(device, stream, sp, dp, src.len(), T::DTYPE, root, devices) };
            self.submitted(device, stream, r)
        }

        /// Scatter: block r of `root`'s `src` (`Some` on the root only, `dst.len() *
        /// devices.len()` elements) into rank r's `dst`.
        fn scatter(&self, device, stream, src: Option<&'scope S>, dst: &'scope mut D, root: DeviceId,
                   devices: &[DeviceId]) {
            self.check("scatter", device, dst)?;
            let sp = self.root_src("scatter", device, root, src, dst.len() * devices.len())?;
            let dp = dst.as_mut_ptr().cast();
            // SAFETY: as in all_reduce.
            let r = unsafe { self.rt.scatter_raw(device, stream, sp, dp, dst.len(), T::DTYPE, root, devices) };
            self.submitted(device, stream, r)
        }
    }

    /// Checks `src` and `dst` for `what` on `device`; their pointers.
    fn src_dst<S: Buffer + ?Sized, D: BufferMut + ?Sized>(
        &self,
        what: &str,
        device: DeviceId,
        src: &S,
        dst: &mut D,
    ) -> Result<(*const c_void, *mut c_void)> {
        self.check(what, device, src)?;
        self.check(what, device, dst)?;
        Ok((src.as_ptr().cast(), dst.as_mut_ptr().cast()))
    }

    /// The root's source (required there, of `len` elements; ignored elsewhere).
    fn root_src<S: Buffer + ?Sized>(
        &self,
        what: &str,
        device: DeviceId,
        root: DeviceId,
        src: Option<&S>,
        len: usize,
    ) -> Result<*const c_void> {
        match src {
            Some(s) if device == root => {
                self.check(what, device, s)?;
                Self::len_is(what, "src", s.len(), len)?;
                Ok(s.as_ptr().cast())
            }
            None if device == root => Err(invalid(format!("{what}: the root ({root}) needs a src"))),
            _ => Ok(std::ptr::null()),
        }
    }

    /// The root's destination (required there, of `len` elements; ignored elsewhere).
    fn root_dst<D: BufferMut + ?Sized>(
        &self,
        what: &str,
        device: DeviceId,
        root: DeviceId,
        dst: Option<&mut D>,
        len: usize,
    ) -> Result<*mut c_void> {
        match dst {
            Some(d) if device == root => {
                self.check(what, device, d)?;
                Self::len_is(what, "dst", d.len(), len)?;
                Ok(d.as_mut_ptr().cast())
            }
            None if device == root => Err(invalid(format!("{what}: the root ({root}) needs a dst"))),
            _ => Ok(std::ptr::null_mut()),
        }
    }
}
