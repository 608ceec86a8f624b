//! Buffers ccq can use: host slices (host backend) and [`DeviceBuffer`] (any backend).

use crate::error::{check, Error, Result, Status};
use crate::types::{DeviceId, Element};
use crate::Runtime;
use ccq_sys as sys;
use std::ffi::c_void;
use std::ptr::NonNull;

/// Where a buffer's memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// Ordinary host memory (only the host backend's collectives can use it).
    Host,
    /// Memory from `ccq_mem_alloc` of this runtime (the pointer) and device.
    Device(*const sys::ccq_runtime, DeviceId),
}

/// Memory a collective can read: `count` elements at `as_ptr()`.
///
/// # Safety
/// `as_ptr()..as_ptr() + len()` must be valid for reads for as long as `self` is borrowed,
/// and `location()` must say truthfully where it is.
pub unsafe trait Buffer {
    /// The element type.
    type Elem: Element;
    /// Start of the memory.
    fn as_ptr(&self) -> *const Self::Elem;
    /// Number of elements.
    fn len(&self) -> usize;
    /// `len() == 0`.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Where it is.
    fn location(&self) -> Location;
}

/// Memory a collective can write.
///
/// # Safety
/// As [`Buffer`], and valid for writes for as long as `self` is borrowed mutably.
pub unsafe trait BufferMut: Buffer {
    /// Start of the memory, for writing.
    fn as_mut_ptr(&mut self) -> *mut Self::Elem;
}

// SAFETY: a slice is valid for reads of its length while borrowed.
unsafe impl<T: Element> Buffer for [T] {
    type Elem = T;
    fn as_ptr(&self) -> *const T {
        <[T]>::as_ptr(self)
    }
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
    fn location(&self) -> Location {
        Location::Host
    }
}

// SAFETY: a mutable slice is valid for writes while borrowed mutably.
unsafe impl<T: Element> BufferMut for [T] {
    fn as_mut_ptr(&mut self) -> *mut T {
        <[T]>::as_mut_ptr(self)
    }
}

// SAFETY: as for slices (the Vec cannot reallocate while borrowed).
unsafe impl<T: Element> Buffer for Vec<T> {
    type Elem = T;
    fn as_ptr(&self) -> *const T {
        self.as_slice().as_ptr()
    }
    fn len(&self) -> usize {
        self.as_slice().len()
    }
    fn location(&self) -> Location {
        Location::Host
    }
}

// SAFETY: as for slices.
unsafe impl<T: Element> BufferMut for Vec<T> {
    fn as_mut_ptr(&mut self) -> *mut T {
        self.as_mut_slice().as_mut_ptr()
    }
}

// SAFETY: as for slices.
unsafe impl<T: Element, const N: usize> Buffer for [T; N] {
    type Elem = T;
    fn as_ptr(&self) -> *const T {
        self.as_slice().as_ptr()
    }
    fn len(&self) -> usize {
        N
    }
    fn location(&self) -> Location {
        Location::Host
    }
}

// SAFETY: as for slices.
unsafe impl<T: Element, const N: usize> BufferMut for [T; N] {
    fn as_mut_ptr(&mut self) -> *mut T {
        self.as_mut_slice().as_mut_ptr()
    }
}

/// `len` elements of memory of one device, from `ccq_mem_alloc` (host memory on the host
/// backend, `cudaMalloc`'d on NCCL); freed on drop. Its contents are reached with
/// [`DeviceBuffer::write`] and [`DeviceBuffer::read`], which need the buffer not to be
/// borrowed by a [`Scope`](crate::Scope), so they never race with a collective.
///
/// ```
/// let rt = ccq::Runtime::host(2)?;
/// let mut buf = rt.alloc::<f32>(ccq::DeviceId(1), 4)?;
/// buf.write(&[1.0, 2.0, 3.0, 4.0])?;
/// assert_eq!(buf.to_vec()?, [1.0, 2.0, 3.0, 4.0]);
/// # Ok::<(), ccq::Error>(())
/// ```
pub struct DeviceBuffer<'rt, T: Element> {
    rt: &'rt Runtime,
    device: DeviceId,
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: the memory is owned by the buffer; ccq's memory calls are thread-safe.
unsafe impl<T: Element> Send for DeviceBuffer<'_, T> {}
// SAFETY: &DeviceBuffer only reads.
unsafe impl<T: Element> Sync for DeviceBuffer<'_, T> {}

impl<'rt, T: Element> DeviceBuffer<'rt, T> {
    pub(crate) fn new(rt: &'rt Runtime, device: DeviceId, len: usize) -> Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::new(Status::InvalidArgument, "DeviceBuffer: size overflows"))?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: p is a valid out-pointer; ccq checks the device.
        check(unsafe { sys::ccq_mem_alloc(rt.as_ptr(), device.0, bytes.max(1), &mut p) })?;
        let ptr =
            NonNull::new(p.cast::<T>()).ok_or_else(|| Error::new(Status::NoMemory, "ccq_mem_alloc returned NULL"))?;
        Ok(DeviceBuffer { rt, device, ptr, len })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// `len() == 0`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The device it belongs to.
    pub fn device(&self) -> DeviceId {
        self.device
    }
    /// The device pointer (for the `unsafe` raw calls of [`Runtime`]).
    pub fn as_raw(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// Copies `src` (host memory, `len()` elements) into the buffer.
    pub fn write(&mut self, src: &[T]) -> Result<()> {
        self.same_len(src.len())?;
        // SAFETY: both ranges are valid for len elements; &mut self excludes any collective.
        check(unsafe {
            sys::ccq_mem_copy(
                self.rt.as_ptr(),
                self.device.0,
                self.ptr.as_ptr().cast(),
                src.as_ptr().cast(),
                std::mem::size_of_val(src),
                sys::CCQ_COPY_TO_DEVICE,
            )
        })
    }

    /// Copies the buffer into `dst` (host memory, `len()` elements).
    pub fn read(&self, dst: &mut [T]) -> Result<()> {
        self.same_len(dst.len())?;
        // SAFETY: as in write(); a collective can only hold &self (it reads) or nothing.
        check(unsafe {
            sys::ccq_mem_copy(
                self.rt.as_ptr(),
                self.device.0,
                dst.as_mut_ptr().cast(),
                self.ptr.as_ptr().cast(),
                std::mem::size_of_val(dst),
                sys::CCQ_COPY_TO_HOST,
            )
        })
    }

    /// The contents as a `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = Vec::with_capacity(self.len);
        // SAFETY: read() fills all len elements before any is read; on error nothing is read
        // (the Vec is dropped; T is Copy).
        unsafe {
            let s = std::slice::from_raw_parts_mut(v.as_mut_ptr(), self.len);
            self.read(s)?;
            v.set_len(self.len);
        }
        Ok(v)
    }

    fn same_len(&self, n: usize) -> Result<()> {
        if n == self.len {
            return Ok(());
        }
        Err(Error::new(Status::InvalidArgument, format!("DeviceBuffer of {} elements, host slice of {n}", self.len)))
    }
}

impl<T: Element> Drop for DeviceBuffer<'_, T> {
    fn drop(&mut self) {
        // SAFETY: allocated by ccq_mem_alloc on this runtime and device; no collective can
        // still use it (a scope borrowing it has fenced before the borrow ended).
        unsafe { sys::ccq_mem_free(self.rt.as_ptr(), self.device.0, self.ptr.as_ptr().cast()) };
    }
}

impl<T: Element> std::fmt::Debug for DeviceBuffer<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.device)
            .field("len", &self.len)
            .field("dtype", &T::DTYPE)
            .finish()
    }
}

// SAFETY: valid for len elements while the buffer lives; location says which runtime/device.
unsafe impl<T: Element> Buffer for DeviceBuffer<'_, T> {
    type Elem = T;
    fn as_ptr(&self) -> *const T {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
    fn location(&self) -> Location {
        Location::Device(self.rt.as_ptr(), self.device)
    }
}

// SAFETY: as above.
unsafe impl<T: Element> BufferMut for DeviceBuffer<'_, T> {
    fn as_mut_ptr(&mut self) -> *mut T {
        self.ptr.as_ptr()
    }
}
