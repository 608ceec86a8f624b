//! [`Config`]: a builder over every field of `ccq_config`.

use crate::error::{Error, Result, Status};
use crate::world::Bootstrap;
use ccq_sys as sys;
use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Runtime configuration: every field of `ccq_config`, starting from ccq's defaults with the
/// `CCQ_*` environment variables applied (what `ccq_config_init` does), then changed with
/// the builder methods.
///
/// ```
/// let cfg = ccq::Config::new().backend("host").host_devices(2).timeout_ms(5_000);
/// assert_eq!(cfg.get_host_devices(), 2);
/// assert_eq!(cfg.get_backend(), "host");
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    raw: sys::ccq_config,
    backend: String,
    fault: Option<String>,
    trace_file: Option<PathBuf>,
    bootstrap: Option<Bootstrap>,
    host_engine: Option<String>,
    env_error: Option<String>,
}

// SAFETY: the raw pointers in `raw` are only set (from the owned strings and the store) for
// the duration of Runtime::new; `env_error` points to a static string of libccq; the store
// is `Send + Sync`.
unsafe impl Send for Config {}
// SAFETY: as above; nothing is mutated through &Config.
unsafe impl Sync for Config {}

/// Copies a C string field (NULL = None).
///
/// # Safety
/// `p` is NULL or a valid NUL-terminated string.
unsafe fn owned(p: *const c_char) -> Option<String> {
    // SAFETY: the caller's contract.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// The one place that initialises a raw `ccq_config` (defaults + environment), as C's
/// `ccq_config_init()` macro does: the sized entry point with the size of the struct these
/// bindings declare, so a newer library never writes past it and knows which fields we have.
fn init_raw() -> sys::ccq_config {
    let mut raw = std::mem::MaybeUninit::<sys::ccq_config>::zeroed();
    // SAFETY: it writes at most size_of::<ccq_config>() bytes; it only reads the environment.
    unsafe { sys::ccq_config_init_sized(raw.as_mut_ptr(), std::mem::size_of::<sys::ccq_config>()) };
    // SAFETY: zeroed then filled by ccq: every field holds a valid value.
    unsafe { raw.assume_init() }
}

impl Default for Config {
    fn default() -> Self {
        Config::new()
    }
}

impl Config {
    /// ccq's defaults, then the `CCQ_*` environment variables (as `ccq_config_init`).
    pub fn new() -> Config {
        let raw = init_raw();
        // SAFETY: the strings ccq_config_init set are NULL, static or from the environment;
        // they are copied at once.
        unsafe {
            Config {
                backend: owned(raw.backend).unwrap_or_else(|| "host".into()),
                fault: owned(raw.fault),
                trace_file: owned(raw.trace_file).map(PathBuf::from),
                bootstrap: owned(raw.bootstrap).map(|s| Bootstrap::from_spec(&s)),
                host_engine: owned(raw.host_engine),
                env_error: owned(raw.env_error),
                raw,
            }
        }
    }

    /// The backend: `"host"` (default) or `"nccl"`. Env: `CCQ_BACKEND`.
    pub fn backend(mut self, name: &str) -> Self {
        self.backend = name.into();
        self
    }
    /// Host backend: virtual devices (default 4). Env: `CCQ_HOST_DEVICES`.
    pub fn host_devices(mut self, n: u32) -> Self {
        self.raw.host_devices = n;
        self
    }
    /// Streams per device (default 64). Env: `CCQ_MAX_STREAMS`.
    pub fn max_streams(mut self, n: u32) -> Self {
        self.raw.max_streams = n;
        self
    }
    /// Commands outstanding per stream before backpressure (default 1024).
    /// Env: `CCQ_QUEUE_DEPTH`.
    pub fn queue_depth(mut self, n: u32) -> Self {
        self.raw.queue_depth = n;
        self
    }
    /// Operations in one backend group (default 256). Env: `CCQ_MAX_BATCH_OPS`.
    pub fn max_batch_ops(mut self, n: u32) -> Self {
        self.raw.max_batch_ops = n;
        self
    }
    /// Watchdog and fence deadline in ms; 0 = none (default 600000). Env: `CCQ_TIMEOUT_MS`.
    pub fn timeout_ms(mut self, ms: u64) -> Self {
        self.raw.timeout_ms = ms;
        self
    }
    /// [`Config::timeout_ms`] from a `Duration` (`None` = no deadline).
    pub fn timeout(self, t: Option<Duration>) -> Self {
        self.timeout_ms(t.map_or(0, |t| t.as_millis().clamp(1, u64::MAX as u128) as u64))
    }
    /// Host backend worker threads; 0 = number of cores this process may run on (its CPU
    /// affinity). Env: `CCQ_HOST_WORKERS`.
    pub fn host_workers(mut self, n: u32) -> Self {
        self.raw.host_workers = n;
        self
    }
    /// All `CCQ_FLAG_*` bits at once. Env: `CCQ_NONBLOCKING_SUBMIT=1`.
    pub fn flags(mut self, flags: u32) -> Self {
        self.raw.flags = flags;
        self
    }
    /// Submitting calls return [`Status::QueueFull`] at once instead of waiting for room
    /// (`CCQ_FLAG_NONBLOCKING_SUBMIT`).
    pub fn nonblocking_submit(mut self, on: bool) -> Self {
        if on {
            self.raw.flags |= sys::CCQ_FLAG_NONBLOCKING_SUBMIT;
        } else {
            self.raw.flags &= !sys::CCQ_FLAG_NONBLOCKING_SUBMIT;
        }
        self
    }
    /// How long ccq's threads poll before they sleep, in µs (default 50). Env: `CCQ_SPIN_US`.
    pub fn spin_us(mut self, us: u32) -> Self {
        self.raw.spin_us = us;
        self
    }
    /// Fault injection for tests (grammar in docs/reliability.md); `None` = off.
    /// Env: `CCQ_FAULT`.
    pub fn fault(mut self, spec: Option<&str>) -> Self {
        self.fault = spec.map(Into::into);
        self
    }
    /// Events the flight recorder keeps (default 65536; 0 disables it).
    /// Env: `CCQ_TRACE_CAPACITY`.
    pub fn trace_capacity(mut self, n: u32) -> Self {
        self.raw.trace_capacity = n;
        self
    }
    /// Write the recorder as Chrome/Perfetto JSON there at destroy and on errors.
    /// Env: `CCQ_TRACE_FILE`.
    pub fn trace_file(mut self, path: Option<&Path>) -> Self {
        self.trace_file = path.map(Into::into);
        self
    }
    /// `true`: ccq installs a SIGUSR1 handler that makes every runtime of the process dump
    /// its trace file ([`Config::trace_file`]); it only wakes a ccq thread that writes the
    /// dumps, chains to the handler installed before it, and stays installed for the life of
    /// the process. Default off. Env: `CCQ_TRACE_SIGNAL=1`.
    pub fn trace_signal(mut self, on: bool) -> Self {
        self.raw.trace_signal = on.into();
        self
    }
    /// `true`: before an operation whose communicator spans processes runs, its member
    /// processes compare kind, count, dtype, op and root through the bootstrap, so a
    /// mismatch between processes fails every part with [`crate::Status::Mismatch`] instead
    /// of hanging; costs a bootstrap round trip per operation. Default off. Env:
    /// `CCQ_CHECK_SIGNATURES=1`.
    pub fn check_signatures(mut self, on: bool) -> Self {
        self.raw.check_signatures = on.into();
        self
    }
    /// NCCL backend: `true` creates its communication streams with the device's highest
    /// priority, so communication kernels are scheduled ahead of compute waiting for SMs (as
    /// PyTorch's `TORCH_NCCL_HIGH_PRIORITY=1`). Default off; other backends ignore it. Env:
    /// `CCQ_NCCL_HIGH_PRIORITY=1`.
    pub fn nccl_high_priority(mut self, on: bool) -> Self {
        self.raw.nccl_high_priority = on.into();
        self
    }
    /// Job health, in a world of several processes: how often this process publishes its
    /// heartbeat (with its progress) through the bootstrap; 0 = no heartbeats. Default 1000.
    /// Env: `CCQ_HEARTBEAT_MS`.
    pub fn heartbeat_ms(mut self, ms: u32) -> Self {
        self.raw.heartbeat_ms = ms;
        self
    }
    /// A process whose heartbeat is older than this is declared lost (0 = 10 x
    /// heartbeat_ms, the default). Env: `CCQ_HEARTBEAT_TIMEOUT_MS`.
    pub fn heartbeat_timeout_ms(mut self, ms: u32) -> Self {
        self.raw.heartbeat_timeout_ms = ms;
        self
    }
    /// Fusion of small collectives (docs/fusion.md): operations of one batch on one
    /// communicator with the same kind, dtype and op, each below `bytes`, run as one engine
    /// operation over their concatenation, up to `bytes` per fused operation; every command
    /// keeps its own completion and error. 0 = off; default 1 MiB. Env: `CCQ_FUSION_BYTES`.
    pub fn fusion_bytes(mut self, bytes: u64) -> Self {
        self.raw.fusion_bytes = bytes;
        self
    }
    /// Host backend: operations moving at least this many bytes use streaming stores
    /// (0 = default, 64 MiB; `u64::MAX` = never). Env: `CCQ_HOST_STREAM_BYTES`.
    pub fn host_stream_bytes(mut self, bytes: u64) -> Self {
        self.raw.host_stream_bytes = bytes;
        self
    }
    /// A world of `size` processes, this one of rank `rank` (default: 0 of 1, alone).
    /// Every process of the world is given the same size and its own rank, and a
    /// [`Config::bootstrap`] to meet through. Env: `CCQ_WORLD_RANK` and `CCQ_WORLD_SIZE`,
    /// else the launcher's (`OMPI_COMM_WORLD_RANK`/`_SIZE`, `PMI_RANK`/`PMI_SIZE`,
    /// `SLURM_PROCID`/`SLURM_NTASKS`, torchrun's `RANK`/`WORLD_SIZE`).
    pub fn world(mut self, rank: u32, size: u32) -> Self {
        self.raw.world_rank = rank;
        self.raw.world_size = size;
        self
    }
    /// How the processes of the world meet ([`Bootstrap`]); `None`: no bootstrap (a world
    /// of one needs none). Env: `CCQ_BOOTSTRAP` (`mpi`, `file:DIR`, `tcp://HOST:PORT`), else
    /// `tcp://MASTER_ADDR:MASTER_PORT` when torchrun's variables are set.
    pub fn bootstrap(mut self, b: impl Into<Option<Bootstrap>>) -> Self {
        self.bootstrap = b.into();
        self
    }
    /// The host backend's engine across processes: `Some("ucx")` (UCX: shared memory, TCP,
    /// InfiniBand; ccq's own schedules), `Some("mpi")` (needs MPI initialised: mpirun), or
    /// `None` (default: ucx when its module libccq-ucx.so.0 loads, else mpi). Env: `CCQ_HOST_ENGINE`.
    pub fn host_engine(mut self, engine: Option<&str>) -> Self {
        self.host_engine = engine.map(Into::into);
        self
    }
    /// For [`Bootstrap::Mpi`]: `MPI_Comm_c2f()` of the embedder's communicator (its rank and
    /// size must be the world's); -1 (the default) = `MPI_COMM_WORLD`.
    pub fn mpi_comm(mut self, fortran_handle: i64) -> Self {
        self.raw.mpi_comm = fortran_handle;
        self
    }

    /// The backend name.
    pub fn get_backend(&self) -> &str {
        &self.backend
    }
    /// Host backend devices.
    pub fn get_host_devices(&self) -> u32 {
        self.raw.host_devices
    }
    /// Streams per device.
    pub fn get_max_streams(&self) -> u32 {
        self.raw.max_streams
    }
    /// Queue depth per stream.
    pub fn get_queue_depth(&self) -> u32 {
        self.raw.queue_depth
    }
    /// Operations per backend group.
    pub fn get_max_batch_ops(&self) -> u32 {
        self.raw.max_batch_ops
    }
    /// Deadline in ms (0 = none).
    pub fn get_timeout_ms(&self) -> u64 {
        self.raw.timeout_ms
    }
    /// Host worker threads (0 = cores).
    pub fn get_host_workers(&self) -> u32 {
        self.raw.host_workers
    }
    /// `CCQ_FLAG_*` bits.
    pub fn get_flags(&self) -> u32 {
        self.raw.flags
    }
    /// Poll time in µs.
    pub fn get_spin_us(&self) -> u32 {
        self.raw.spin_us
    }
    /// Fault injection spec.
    pub fn get_fault(&self) -> Option<&str> {
        self.fault.as_deref()
    }
    /// Recorder capacity.
    pub fn get_trace_capacity(&self) -> u32 {
        self.raw.trace_capacity
    }
    /// Automatic trace file.
    pub fn get_trace_file(&self) -> Option<&Path> {
        self.trace_file.as_deref()
    }
    /// Whether the SIGUSR1 dump handler is asked for.
    pub fn get_trace_signal(&self) -> bool {
        self.raw.trace_signal != 0
    }
    /// Whether the cross-process signature check is asked for.
    pub fn get_check_signatures(&self) -> bool {
        self.raw.check_signatures != 0
    }
    /// Whether the NCCL backend's communication streams get the highest priority.
    pub fn get_nccl_high_priority(&self) -> bool {
        self.raw.nccl_high_priority != 0
    }
    /// Heartbeat period (0 = none).
    pub fn get_heartbeat_ms(&self) -> u32 {
        self.raw.heartbeat_ms
    }
    /// Heartbeat age that makes a process lost (0 = 10 x heartbeat_ms).
    pub fn get_heartbeat_timeout_ms(&self) -> u32 {
        self.raw.heartbeat_timeout_ms
    }
    /// Fusion threshold (0 = off).
    pub fn get_fusion_bytes(&self) -> u64 {
        self.raw.fusion_bytes
    }
    /// Streaming-store threshold.
    pub fn get_host_stream_bytes(&self) -> u64 {
        self.raw.host_stream_bytes
    }
    /// This process's world rank.
    pub fn get_world_rank(&self) -> u32 {
        self.raw.world_rank
    }
    /// Processes in the world.
    pub fn get_world_size(&self) -> u32 {
        self.raw.world_size
    }
    /// The bootstrap.
    pub fn get_bootstrap(&self) -> Option<&Bootstrap> {
        self.bootstrap.as_ref()
    }
    /// The host backend's engine (`None`: ccq chooses).
    pub fn get_host_engine(&self) -> Option<&str> {
        self.host_engine.as_deref()
    }
    /// The MPI communicator's Fortran handle (-1: `MPI_COMM_WORLD`).
    pub fn get_mpi_comm(&self) -> i64 {
        self.raw.mpi_comm
    }
    /// The text of a malformed `CCQ_*` variable; creating a runtime from this config fails
    /// with it (as in C).
    pub fn env_error(&self) -> Option<&str> {
        self.env_error.as_deref()
    }

    /// Runs `f` with the raw config, its string fields pointing at C copies of this config's
    /// strings that live until `f` returns, and `store` as its store when the bootstrap is
    /// [`Bootstrap::Store`] (the caller keeps what it points to alive for the runtime's life).
    pub(crate) fn with_raw<R>(
        &self,
        store: Option<&sys::ccq_store>,
        f: impl FnOnce(&sys::ccq_config) -> R,
    ) -> Result<R> {
        fn c(s: &str, what: &str) -> Result<CString> {
            CString::new(s).map_err(|_| Error::new(Status::InvalidArgument, format!("{what} contains a NUL byte")))
        }
        let backend = c(&self.backend, "Config::backend")?;
        let fault = self.fault.as_deref().map(|s| c(s, "Config::fault")).transpose()?;
        let trace = self.trace_file.as_deref().map(|p| c(&p.to_string_lossy(), "Config::trace_file")).transpose()?;
        let boot = self.bootstrap.as_ref().and_then(Bootstrap::spec).map(|s| c(&s, "Config::bootstrap")).transpose()?;
        let engine = self.host_engine.as_deref().map(|s| c(s, "Config::host_engine")).transpose()?;
        let mut raw = self.raw;
        raw.bootstrap = boot.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        raw.store = match (&self.bootstrap, store) {
            (Some(Bootstrap::Store(_)), Some(st)) => st,
            _ => std::ptr::null(),
        };
        raw.backend = backend.as_ptr();
        raw.fault = fault.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        raw.trace_file = trace.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        raw.host_engine = engine.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        Ok(f(&raw))
    }
}
