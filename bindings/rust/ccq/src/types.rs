//! Ids, element types and reduction operations.

use crate::error::static_str;
use ccq_sys as sys;
use std::fmt;

/// A device of the runtime's backend (`0..device_count()`).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DeviceId(pub u32);

/// A stream of a device (`0..max_streams`); commands on one stream run in order.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId(pub u32);

impl From<u32> for DeviceId {
    fn from(v: u32) -> Self {
        DeviceId(v)
    }
}

impl From<u32> for StreamId {
    fn from(v: u32) -> Self {
        StreamId(v)
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {}", self.0)
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {}", self.0)
    }
}

/// The raw ids of a device set (`DeviceId` is `repr(transparent)` over `u32`).
pub(crate) fn raw_devices(devices: &[DeviceId]) -> *const sys::ccq_device_id {
    devices.as_ptr().cast()
}

/// Element types, as NCCL's `ncclDataType_t`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum DType {
    I8 = sys::CCQ_INT8,
    U8 = sys::CCQ_UINT8,
    I32 = sys::CCQ_INT32,
    U32 = sys::CCQ_UINT32,
    I64 = sys::CCQ_INT64,
    U64 = sys::CCQ_UINT64,
    F16 = sys::CCQ_FLOAT16,
    F32 = sys::CCQ_FLOAT32,
    F64 = sys::CCQ_FLOAT64,
    BF16 = sys::CCQ_BFLOAT16,
    F8E4M3 = sys::CCQ_FLOAT8E4M3,
    F8E5M2 = sys::CCQ_FLOAT8E5M2,
}

impl DType {
    /// Every element type.
    pub const ALL: [DType; 12] = [
        DType::I8,
        DType::U8,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::F16,
        DType::F32,
        DType::F64,
        DType::BF16,
        DType::F8E4M3,
        DType::F8E5M2,
    ];

    /// The raw `ccq_dtype`.
    pub fn raw(self) -> sys::ccq_dtype {
        self as sys::ccq_dtype
    }

    /// The type of a raw value, if it is one.
    pub fn from_raw(raw: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.raw() == raw)
    }

    /// Bytes per element (`ccq_dtype_size`).
    pub fn size(self) -> usize {
        // SAFETY: takes a value, returns a value.
        unsafe { sys::ccq_dtype_size(self.raw()) }
    }

    /// ccq's name of it, e.g. `"float32"`.
    pub fn name(self) -> &'static str {
        // SAFETY: returns a static string.
        unsafe { static_str(sys::ccq_dtype_name(self.raw())) }
    }
}

/// Reduction operations. `Avg` on integers divides with truncation, as NCCL does.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum ReduceOp {
    Sum = sys::CCQ_SUM,
    Prod = sys::CCQ_PROD,
    Max = sys::CCQ_MAX,
    Min = sys::CCQ_MIN,
    Avg = sys::CCQ_AVG,
}

impl ReduceOp {
    /// The raw `ccq_reduce_op`.
    pub fn raw(self) -> sys::ccq_reduce_op {
        self as sys::ccq_reduce_op
    }

    /// The op of a raw value, if it is one.
    pub fn from_raw(raw: u32) -> Option<ReduceOp> {
        [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg]
            .into_iter()
            .find(|o| o.raw() == raw)
    }

    /// ccq's name of it, e.g. `"sum"`.
    pub fn name(self) -> &'static str {
        // SAFETY: returns a static string.
        unsafe { static_str(sys::ccq_reduce_op_name(self.raw())) }
    }
}

/// A Rust type whose values ccq can move and reduce as elements of [`Element::DTYPE`].
///
/// # Safety
/// `Self` must have exactly the size and bit layout of one `DTYPE` element, and every bit
/// pattern ccq may write must be a valid `Self` (ccq writes results into `&mut [Self]`).
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// Its ccq element type.
    const DTYPE: DType;
}

macro_rules! elements {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        // SAFETY: the primitive has the width and layout of the ccq type; all bit patterns
        // are valid values.
        unsafe impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

/// IEEE 754 binary16, as its bits (same layout as `half::f16`: convert with `from_bits`).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct F16(pub u16);

/// bfloat16, as its bits (same layout as `half::bf16`).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BF16(pub u16);

/// OCP FP8 E4M3, as its bits.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct F8E4M3(pub u8);

/// OCP FP8 E5M2, as its bits.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct F8E5M2(pub u8);

impl BF16 {
    /// The bfloat16 nearest to `v` (round to nearest even; NaN stays NaN).
    pub fn from_f32(v: f32) -> BF16 {
        let b = v.to_bits();
        if v.is_nan() {
            return BF16((b >> 16) as u16 | 0x40);
        }
        BF16(((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16)
    }

    /// Its value as an `f32` (exact).
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

elements! {
    i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
    f32 => F32, f64 => F64, F16 => F16, BF16 => BF16, F8E4M3 => F8E4M3, F8E5M2 => F8E5M2,
}
