//! A cubecl-shaped runtime delegating its `ServerCommunication` to ccq, call for call.
//!
//! The trait and its types below have the shape of cubecl-runtime's
//! (`crates/cubecl-runtime/src/server/base.rs`: `comm_init`, `all_reduce`, `send`, `recv`,
//! `sync_collective`, `SERVER_COMM_ENABLED`, `ReduceOperation::{Sum, Mean}`, `ServerError`),
//! with a minimal memory manager standing in for cubecl's (`Handle`, `Binding`,
//! `CopyDescriptor`). `CcqServer` is one device's server: like cubecl's runner threads, each
//! device has its own OS thread that owns its server and submits on several streams
//! (parameters all_reduced in place over all devices, burn's DDP pattern; a Mean over device
//! pairs; a send/recv ring, burn's `to_device`), then fences each stream with
//! `sync_collective` and checks every element.
//!
//! The server owns its memory, so it uses ccq's raw (`unsafe`) calls and keeps ccq's borrow
//! rule itself: a handle given to a collective is "in flight" on that stream until a host
//! fence of the stream, and reading, writing or freeing it first fences those streams.
//!
//! `sync_collective` maps two ways. On GPUs it is `Runtime::nccl_stream_wait`: the
//! server's compute stream waits for the collectives on the GPU and the call returns at
//! once, as cubecl's own `sync_collective` does (cubecl's kernels, reads and frees are
//! ordered on that stream after the wait); the handles stay in flight for the host until a
//! host fence (`read`/`free` settle them). On the host backend there is no GPU stream to
//! order, so it is the blocking fence, `Runtime::sync`, which also hands the handles back.
//!
//! Run: `cargo run --example server_comm [devices] [iterations]` (host backend). The same
//! code runs as a test under `cargo test`.

use ccq::{DType, DeviceBuffer, ReduceOp, Runtime};
use std::collections::HashMap;
use std::ptr::NonNull;

// ---- cubecl's shapes ---------------------------------------------------------------------

/// cubecl's `DeviceId`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    /// The device kind (cubecl: CUDA, ...).
    pub type_id: u16,
    /// Index among the devices of that kind.
    pub index_id: u16,
}

/// cubecl's `StreamId` (one per thread by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamId {
    /// The id.
    pub value: u64,
}

/// cubecl's `ReduceOperation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOperation {
    /// Sum over the devices.
    Sum,
    /// Mean over the devices.
    Mean,
}

/// cubecl's `ElemType`, the part of it collectives care about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ElemType {
    F64,
    F32,
    F16,
    BF16,
    E4M3,
    E5M2,
    I64,
    I32,
    I8,
    U64,
    U32,
    U8,
    Bool,
}

/// cubecl's `ServerError`, the variants used here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerError {
    /// A request the server refuses.
    Validation {
        /// Why.
        message: String,
    },
    /// A failure of the communication library.
    Generic {
        /// ccq's status and detail.
        reason: String,
    },
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerError::Validation { message } => write!(f, "validation: {message}"),
            ServerError::Generic { reason } => write!(f, "{reason}"),
        }
    }
}

impl std::error::Error for ServerError {}

/// A handle to memory of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle {
    id: u64,
}

/// A handle bound for a kernel or collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    /// The memory.
    pub handle: Handle,
}

/// What to copy: a binding with its shape and strides (in elements) and element size.
#[derive(Debug, Clone)]
pub struct CopyDescriptor {
    /// The memory.
    pub binding: Binding,
    /// The tensor's shape.
    pub shape: Vec<usize>,
    /// Its strides.
    pub strides: Vec<usize>,
    /// Bytes per element.
    pub elem_size: usize,
}

/// cubecl-runtime's `ServerCommunication`.
pub trait ServerCommunication {
    /// Whether server-to-server communication is enabled.
    const SERVER_COMM_ENABLED: bool;

    /// Ensure that all queued collective operations of `stream_id` have been executed.
    fn sync_collective(&mut self, stream_id: StreamId) -> Result<(), ServerError> {
        let _ = stream_id;
        unimplemented!("communication is not supported by this server")
    }

    /// Initialize the communication between the devices in `device_ids`.
    fn comm_init(&mut self, device_ids: Vec<DeviceId>) -> Result<(), ServerError> {
        let _ = device_ids;
        unimplemented!("communication is not supported by this server")
    }

    /// All-reduce `src` into `dst` over `device_ids`.
    fn all_reduce(
        &mut self,
        src: Binding,
        dst: Binding,
        dtype: ElemType,
        stream_id: StreamId,
        op: ReduceOperation,
        device_ids: Vec<DeviceId>,
    ) -> Result<(), ServerError> {
        let _ = (src, dst, dtype, stream_id, op, device_ids);
        unimplemented!("communication is not supported by this server")
    }

    /// Send data from this server to `device_id_dst`.
    fn send(
        &mut self,
        desc: CopyDescriptor,
        dtype: ElemType,
        stream_id: StreamId,
        device_id_dst: DeviceId,
    ) -> Result<(), ServerError> {
        let _ = (desc, dtype, stream_id, device_id_dst);
        unimplemented!("communication is not supported by this server")
    }

    /// Receive data from `device_id_src` into `handle`.
    fn recv(
        &mut self,
        handle: Handle,
        dtype: ElemType,
        stream_id: StreamId,
        device_id_src: DeviceId,
    ) -> Result<(), ServerError> {
        let _ = (handle, dtype, stream_id, device_id_src);
        unimplemented!("communication is not supported by this server")
    }
}

// ---- the server on ccq -------------------------------------------------------------------

/// One device's server: its memory, and ccq doing its communication.
pub struct CcqServer<'rt> {
    rt: &'rt Runtime,
    device: ccq::DeviceId,
    memory: HashMap<u64, DeviceBuffer<'rt, u8>>,
    next_handle: u64,
    /// cubecl stream ids (any u64) to ccq streams (0..max_streams), assigned on first use.
    streams: HashMap<StreamId, ccq::StreamId>,
    /// The handles each ccq stream still uses: ccq borrows them until that stream's fence.
    in_flight: HashMap<ccq::StreamId, Vec<u64>>,
    max_streams: u32,
    /// On GPUs: the CUDA compute stream of each ccq stream (a GPU runtime fills it when it
    /// creates its streams, and binds it with `nccl_bind_stream`). Empty on the host backend.
    compute_streams: HashMap<ccq::StreamId, NonNull<ccq::sys::CUstream_st>>,
}

fn ccq_err(e: ccq::Error) -> ServerError {
    ServerError::Generic { reason: e.to_string() }
}

fn dtype_of(e: ElemType) -> Result<DType, ServerError> {
    Ok(match e {
        ElemType::F64 => DType::F64,
        ElemType::F32 => DType::F32,
        ElemType::F16 => DType::F16,
        ElemType::BF16 => DType::BF16,
        ElemType::E4M3 => DType::F8E4M3,
        ElemType::E5M2 => DType::F8E5M2,
        ElemType::I64 => DType::I64,
        ElemType::I32 => DType::I32,
        ElemType::I8 => DType::I8,
        ElemType::U64 => DType::U64,
        ElemType::U32 => DType::U32,
        ElemType::U8 => DType::U8,
        ElemType::Bool => {
            return Err(ServerError::Validation { message: "collectives on bool are not supported".into() })
        }
    })
}

fn ccq_device(d: DeviceId) -> ccq::DeviceId {
    ccq::DeviceId(d.index_id.into())
}

fn ccq_devices(ids: &[DeviceId]) -> Vec<ccq::DeviceId> {
    ids.iter().map(|&d| ccq_device(d)).collect()
}

impl<'rt> CcqServer<'rt> {
    /// The server of `device` on `rt`.
    pub fn new(rt: &'rt Runtime, device: DeviceId, max_streams: u32) -> Self {
        CcqServer {
            rt,
            device: ccq_device(device),
            memory: HashMap::new(),
            next_handle: 0,
            streams: HashMap::new(),
            in_flight: HashMap::new(),
            max_streams,
            compute_streams: HashMap::new(),
        }
    }

    /// Allocates memory holding `data` (cubecl's `create`).
    pub fn create(&mut self, data: &[u8]) -> Result<Handle, ServerError> {
        let mut buf = self.rt.alloc::<u8>(self.device, data.len()).map_err(ccq_err)?;
        buf.write(data).map_err(ccq_err)?;
        self.next_handle += 1;
        self.memory.insert(self.next_handle, buf);
        Ok(Handle { id: self.next_handle })
    }

    /// Allocates `bytes` of zeroed memory (cubecl's `empty`, zeroed to make checks exact).
    pub fn empty(&mut self, bytes: usize) -> Result<Handle, ServerError> {
        self.create(&vec![0; bytes])
    }

    /// Reads a handle back (cubecl's `read`): first fences the streams still using it.
    pub fn read(&mut self, handle: Handle) -> Result<Vec<u8>, ServerError> {
        self.settle(handle.id)?;
        self.buffer(handle.id)?.to_vec().map_err(ccq_err)
    }

    /// Frees a handle, after the streams still using it have fenced.
    pub fn free(&mut self, handle: Handle) -> Result<(), ServerError> {
        self.settle(handle.id)?;
        self.memory.remove(&handle.id);
        Ok(())
    }

    fn buffer(&self, id: u64) -> Result<&DeviceBuffer<'rt, u8>, ServerError> {
        self.memory.get(&id).ok_or_else(|| ServerError::Validation { message: format!("unknown handle {id}") })
    }

    /// The raw memory of a handle, for a collective on `stream` (recorded as in flight).
    fn use_handle(&mut self, id: u64, stream: ccq::StreamId) -> Result<(*mut u8, usize), ServerError> {
        let b = self.buffer(id)?;
        let r = (b.as_raw(), b.len());
        self.in_flight.entry(stream).or_default().push(id);
        Ok(r)
    }

    fn stream(&mut self, s: StreamId) -> Result<ccq::StreamId, ServerError> {
        let (n, max) = (self.streams.len() as u32, self.max_streams);
        match self.streams.get(&s) {
            Some(&st) => Ok(st),
            None if n < max => Ok(*self.streams.entry(s).or_insert(ccq::StreamId(n))),
            None => Err(ServerError::Validation { message: format!("more than {max} streams") }),
        }
    }

    /// Fences every ccq stream that still uses handle `id`.
    fn settle(&mut self, id: u64) -> Result<(), ServerError> {
        let busy: Vec<ccq::StreamId> =
            self.in_flight.iter().filter(|(_, ids)| ids.contains(&id)).map(|(&s, _)| s).collect();
        busy.into_iter().try_for_each(|s| self.fence(s))
    }

    /// The fence of one ccq stream; its handles are free again whatever it returns.
    fn fence(&mut self, s: ccq::StreamId) -> Result<(), ServerError> {
        let r = self.rt.sync(self.device, s).map_err(ccq_err);
        self.in_flight.remove(&s);
        r
    }

    fn count(bytes: usize, dtype: DType) -> Result<usize, ServerError> {
        if bytes % dtype.size() != 0 {
            return Err(ServerError::Validation {
                message: format!("{bytes} bytes is not a whole number of {}", dtype.name()),
            });
        }
        Ok(bytes / dtype.size())
    }
}

impl ServerCommunication for CcqServer<'_> {
    const SERVER_COMM_ENABLED: bool = true;

    fn sync_collective(&mut self, stream_id: StreamId) -> Result<(), ServerError> {
        let Some(&s) = self.streams.get(&stream_id) else {
            return Ok(()); // nothing was ever submitted on it
        };
        match self.compute_streams.get(&s) {
            // GPUs: non-blocking, as cubecl's own sync_collective: the compute stream waits
            // on the GPU. The handles stay in flight until a host fence (settle).
            // SAFETY: a live CUDA stream of this device, created by the server.
            Some(&cuda) => unsafe { self.rt.nccl_stream_wait(self.device, s, cuda) }.map_err(ccq_err),
            // The host backend: the blocking fence, which also hands the handles back.
            None => self.fence(s),
        }
    }

    fn comm_init(&mut self, device_ids: Vec<DeviceId>) -> Result<(), ServerError> {
        self.rt.comm_init(&ccq_devices(&device_ids)).map_err(ccq_err)
    }

    fn all_reduce(
        &mut self,
        src: Binding,
        dst: Binding,
        dtype: ElemType,
        stream_id: StreamId,
        op: ReduceOperation,
        device_ids: Vec<DeviceId>,
    ) -> Result<(), ServerError> {
        let dtype = dtype_of(dtype)?;
        let stream = self.stream(stream_id)?;
        let (s, sbytes) = self.use_handle(src.handle.id, stream)?;
        let (d, dbytes) = self.use_handle(dst.handle.id, stream)?;
        if sbytes != dbytes {
            return Err(ServerError::Validation { message: format!("all_reduce of {sbytes} bytes into {dbytes}") });
        }
        let op = match op {
            ReduceOperation::Sum => ReduceOp::Sum,
            ReduceOperation::Mean => ReduceOp::Avg,
        };
        let count = Self::count(sbytes, dtype)?;
        // SAFETY: both buffers are this server's ccq memory of `self.device`, of sbytes bytes;
        // they are recorded in flight on `stream`, and the server neither frees, reads nor
        // writes them before that stream's fence (settle/fence).
        unsafe {
            self.rt.all_reduce_raw(self.device, stream, s.cast(), d.cast(), count, dtype, op, &ccq_devices(&device_ids))
        }
        .map_err(ccq_err)
    }

    fn send(
        &mut self,
        desc: CopyDescriptor,
        dtype: ElemType,
        stream_id: StreamId,
        device_id_dst: DeviceId,
    ) -> Result<(), ServerError> {
        let dtype = dtype_of(dtype)?;
        let contiguous = desc
            .strides
            .iter()
            .rev()
            .zip(desc.shape.iter().rev())
            .try_fold(1usize, |want, (&st, &n)| (st == want || n == 1).then_some(want * n));
        if contiguous.is_none() || desc.elem_size != dtype.size() {
            return Err(ServerError::Validation {
                message: "send needs a contiguous tensor of dtype's elements".into(),
            });
        }
        let stream = self.stream(stream_id)?;
        let (s, bytes) = self.use_handle(desc.binding.handle.id, stream)?;
        let elems: usize = desc.shape.iter().product();
        if elems * desc.elem_size > bytes {
            return Err(ServerError::Validation { message: "the descriptor is larger than its handle".into() });
        }
        // SAFETY: as in all_reduce.
        unsafe { self.rt.send_raw(self.device, stream, s.cast(), elems, dtype, ccq_device(device_id_dst)) }
            .map_err(ccq_err)
    }

    fn recv(
        &mut self,
        handle: Handle,
        dtype: ElemType,
        stream_id: StreamId,
        device_id_src: DeviceId,
    ) -> Result<(), ServerError> {
        let dtype = dtype_of(dtype)?;
        let stream = self.stream(stream_id)?;
        let (d, bytes) = self.use_handle(handle.id, stream)?;
        let count = Self::count(bytes, dtype)?;
        // SAFETY: as in all_reduce.
        unsafe { self.rt.recv_raw(self.device, stream, d.cast(), count, dtype, ccq_device(device_id_src)) }
            .map_err(ccq_err)
    }
}

// ---- the workload ------------------------------------------------------------------------

const PARAMS: usize = 8;
const ELEMS: usize = 1000;

fn f32_bytes(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(f32::to_ne_bytes).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect()
}

fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap())).collect()
}

fn check(what: &str, got: bool) -> Result<(), ServerError> {
    got.then_some(()).ok_or_else(|| ServerError::Validation { message: format!("wrong result: {what}") })
}

/// One device's thread: `iters` rounds of (PARAMS in-place Sum all_reduces over every
/// device on one stream, a Mean over the device's pair on another, a send/recv ring on a
/// third), each stream fenced with sync_collective, every element checked.
fn device_thread(rt: &Runtime, max_streams: u32, me: usize, n: usize, iters: usize) -> Result<(), ServerError> {
    let dev = |i: usize| DeviceId { type_id: 0, index_id: i as u16 };
    let all: Vec<DeviceId> = (0..n).map(dev).collect();
    // Devices pair up as {0,1}, {2,3}, ...; with an odd count the last one is alone.
    let pair: Vec<DeviceId> = if (me | 1) < n { vec![dev(me & !1), dev(me | 1)] } else { vec![dev(me)] };
    let mut server = CcqServer::new(rt, dev(me), max_streams);
    server.comm_init(all.clone())?;
    server.comm_init(pair.clone())?;
    let (grads, mean, ring) = (StreamId { value: 1_000 + me as u64 }, StreamId { value: 7 }, StreamId { value: 42 });
    for it in 0..iters {
        let val = |d: usize, p: usize, i: usize| (d * 7 + p * 3 + i % 13 + it) as f32;
        let params: Vec<Handle> = (0..PARAMS)
            .map(|p| server.create(&f32_bytes((0..ELEMS).map(|i| val(me, p, i)))))
            .collect::<Result<_, _>>()?;
        for &h in &params {
            let b = Binding { handle: h };
            server.all_reduce(b, b, ElemType::F32, grads, ReduceOperation::Sum, all.clone())?;
        }
        let msrc = server.create(&f32_bytes((0..ELEMS).map(|i| val(me, 99, i))))?;
        let mdst = server.empty(ELEMS * 4)?;
        server.all_reduce(
            Binding { handle: msrc },
            Binding { handle: mdst },
            ElemType::F32,
            mean,
            ReduceOperation::Mean,
            pair.clone(),
        )?;
        let tosend = server.create(
            &(0..ELEMS as i32).flat_map(|i| (i * 31 + me as i32 + it as i32).to_ne_bytes()).collect::<Vec<u8>>(),
        )?;
        let got = server.empty(ELEMS * 4)?;
        let desc =
            CopyDescriptor { binding: Binding { handle: tosend }, shape: vec![ELEMS], strides: vec![1], elem_size: 4 };
        server.send(desc, ElemType::I32, ring, dev((me + 1) % n))?;
        server.recv(got, ElemType::I32, ring, dev((me + n - 1) % n))?;

        for s in [grads, mean, ring] {
            server.sync_collective(s)?;
        }
        for (p, &h) in params.iter().enumerate() {
            let v = f32s(&server.read(h)?);
            check("sum", v.iter().enumerate().all(|(i, &x)| x == (0..n).map(|d| val(d, p, i)).sum::<f32>()))?;
            server.free(h)?;
        }
        let peers: Vec<usize> = pair.iter().map(|d| d.index_id as usize).collect();
        let v = f32s(&server.read(mdst)?);
        check(
            "mean",
            v.iter().enumerate().all(|(i, &x)| {
                let want = peers.iter().map(|&d| val(d, 99, i)).sum::<f32>() / peers.len() as f32;
                (x - want).abs() <= want.abs() * 1e-6
            }),
        )?;
        let from = (me + n - 1) % n;
        let v = i32s(&server.read(got)?);
        check("recv", v.iter().enumerate().all(|(i, &x)| x == i as i32 * 31 + from as i32 + it as i32))?;
        for h in [msrc, mdst, tosend, got] {
            server.free(h)?;
        }
    }
    Ok(())
}

/// `n` devices on the host backend, one OS thread (and server) per device.
pub fn run(n: usize, iters: usize) -> Result<ccq::Stats, Box<dyn std::error::Error>> {
    // A short deadline: a rank that fails stops submitting, and the others' fences then
    // report the desync within seconds instead of the default ten minutes.
    let cfg = ccq::Config::new().backend("host").host_devices(n as u32).timeout_ms(30_000);
    let rt = Runtime::new(&cfg)?;
    let max_streams = cfg.get_max_streams();
    std::thread::scope(|t| {
        let hs: Vec<_> = (0..n)
            .map(|me| {
                let rt = &rt;
                t.spawn(move || device_thread(rt, max_streams, me, n, iters))
            })
            .collect();
        hs.into_iter().try_for_each(|h| h.join().expect("device thread panicked"))
    })?;
    let st = rt.stats()?;
    if st.completed != st.submitted || st.failed + st.cancelled != 0 {
        return Err(format!("ccq counters do not add up: {st:?}").into());
    }
    Ok(st)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let n = args.next().transpose()?.unwrap_or(4);
    let iters = args.next().transpose()?.unwrap_or(50);
    let st = run(n, iters)?;
    println!(
        "server_comm: {n} devices x {iters} iterations on ccq {}: {} commands, {} batches ({:.2} ops per batch), every result checked",
        ccq::VERSION,
        st.submitted,
        st.batches,
        st.batched_ops as f64 / st.batches.max(1) as f64
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn four_devices_delegate_to_ccq() {
        let st = super::run(4, 10).unwrap();
        assert_eq!(st.submitted, 4 * 10 * (super::PARAMS as u64 + 3));
    }

    #[test]
    fn three_devices_odd_pair() {
        super::run(3, 3).unwrap();
    }
}
