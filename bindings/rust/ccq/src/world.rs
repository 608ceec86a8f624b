//! A world of processes: [`Bootstrap`], the embedder's [`Store`], and the runtime's rank,
//! size and local devices (docs/multiprocess.md).

use crate::error::{Error, Result};
use crate::runtime::Runtime;
use crate::types::DeviceId;
use ccq_sys as sys;
use std::ffi::{c_char, c_void, CStr};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// How the processes of a world meet (`ccq_config.bootstrap` and `store`; env
/// `CCQ_BOOTSTRAP`). A world of one process (the default) uses none.
#[derive(Clone)]
#[non_exhaustive]
pub enum Bootstrap {
    /// `"mpi"`: point-to-point messages on a duplicate of the embedder's communicator
    /// ([`Config::mpi_comm`](crate::Config::mpi_comm), default `MPI_COMM_WORLD`); for jobs
    /// launched with `mpirun`/`srun`. Needs a libccq built with MPI.
    Mpi,
    /// `"file:DIR"`: one file per record in a directory every process sees (created, mode
    /// 0700, if it does not exist), as Gloo's and PyTorch's `FileStore`.
    File(PathBuf),
    /// `"tcp://HOST:PORT"` (this holds `HOST:PORT`): world rank 0 serves a rendezvous there
    /// (on every interface when HOST is `*`), every process connects and stays connected
    /// for the job; no launcher needed.
    Tcp(String),
    /// The embedder's key-value store (a TCP store, Redis, etcd, torch's `Store`...).
    Store(Arc<dyn Store>),
    /// A spec string as `ccq.h` takes it, as `CCQ_BOOTSTRAP` gave it when it is none of the
    /// above (ccq refuses it at [`Runtime::new`] with a detail).
    Spec(String),
}

impl Bootstrap {
    /// [`Bootstrap::Store`] of `store`.
    pub fn store(store: impl Store + 'static) -> Bootstrap {
        Bootstrap::Store(Arc::new(store))
    }

    /// The variant of a spec string (`"mpi"`, `"file:DIR"`, `"tcp://HOST:PORT"`, else
    /// [`Bootstrap::Spec`]).
    pub fn from_spec(spec: &str) -> Bootstrap {
        if spec == "mpi" {
            Bootstrap::Mpi
        } else if let Some(dir) = spec.strip_prefix("file:") {
            Bootstrap::File(dir.into())
        } else if let Some(addr) = spec.strip_prefix("tcp://") {
            Bootstrap::Tcp(addr.into())
        } else {
            Bootstrap::Spec(spec.into())
        }
    }

    /// The spec string ccq takes (`None` for a store).
    pub fn spec(&self) -> Option<String> {
        match self {
            Bootstrap::Mpi => Some("mpi".into()),
            Bootstrap::File(dir) => Some(format!("file:{}", dir.display())),
            Bootstrap::Tcp(addr) => Some(format!("tcp://{addr}")),
            Bootstrap::Store(_) => None,
            Bootstrap::Spec(s) => Some(s.clone()),
        }
    }
}

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bootstrap::Store(_) => f.write_str("Store(..)"),
            b => write!(f, "{:?}", b.spec().unwrap_or_default()),
        }
    }
}

/// The embedder's key-value store, through which the processes of a world meet
/// ([`Bootstrap::Store`]; C's `ccq_store`).
///
/// Keys are `ccq/<job>/<generation>/<tag>/<rank>`; every process of the world must see the
/// values the others set. Values are small binary records (tens to hundreds of bytes),
/// never deleted by ccq (the store's owner drops them with the job). Exchange records are set
/// once; each process's heartbeat key (`ccq/<job>/<generation>/~hb/<rank>`) is set again at
/// every heartbeat: `set` replaces the value and `get` returns the last one (last write wins).
///
/// Threads (ccq.h's rule): ccq calls `set` and `get` from the thread creating the runtime,
/// the runtime's scheduler thread and its health monitor thread (heartbeats), never two calls
/// at once for one runtime; several
/// runtimes sharing one store (threads of one process each playing a world rank) call it
/// concurrently: hence `Send + Sync`. The methods must not call ccq (a runtime they reach
/// refuses the calls that wait), and `get` must not wait for the key: ccq polls it, about
/// once a millisecond, until it appears or `timeout_ms` ends.
///
/// The runtime keeps the store (an `Arc`) until it is destroyed: ccq may call it until
/// `ccq_runtime_destroy` returns. An `Err` fails the exchange that needed the key (and so
/// [`Runtime::new`] or [`Runtime::comm_init`]) with its status; its text is added to the
/// detail of a failed `Runtime::new`. A panic is caught (it must not unwind into C) and
/// counts as a [`Status::Backend`](crate::Status::Backend) error.
///
/// ```
/// use std::{collections::HashMap, sync::Mutex};
/// #[derive(Default)]
/// struct MemStore(Mutex<HashMap<String, Vec<u8>>>);
/// impl ccq::Store for MemStore {
///     fn set(&self, key: &str, value: &[u8]) -> ccq::Result<()> {
///         self.0.lock().unwrap().insert(key.into(), value.into());
///         Ok(())
///     }
///     fn get(&self, key: &str) -> ccq::Result<Option<Vec<u8>>> {
///         Ok(self.0.lock().unwrap().get(key).cloned())
///     }
/// }
/// // Two world ranks on two threads of this process, meeting through one store.
/// let store = std::sync::Arc::new(MemStore::default());
/// let rts: Vec<ccq::Runtime> = std::thread::scope(|t| {
///     let hs: Vec<_> = (0..2)
///         .map(|rank| {
///             let cfg = ccq::Config::new()
///                 .backend("host")
///                 .host_devices(1 + rank)
///                 .world(rank, 2)
///                 .bootstrap(ccq::Bootstrap::Store(store.clone()));
///             t.spawn(move || ccq::Runtime::new(&cfg))
///         })
///         .collect();
///     hs.into_iter().map(|h| h.join().unwrap()).collect::<ccq::Result<_>>()
/// })?;
/// assert_eq!(rts[1].world_rank(), 1);
/// assert_eq!(rts[0].device_count(), 3); // 1 + 2 devices in the world
/// assert_eq!(rts[1].local_devices(), ccq::DeviceId(1)..ccq::DeviceId(3));
/// # Ok::<(), ccq::Error>(())
/// ```
pub trait Store: Send + Sync {
    /// Publishes `value` under `key` for every process of the world.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Never blocks: the value of `key`, or `Ok(None)` while it is not there yet.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>>;
}

/// What ccq's `ctx` points to: kept (boxed, so the pointer is stable) by the runtime until
/// destroy.
pub(crate) struct StoreCtx {
    store: Arc<dyn Store>,
    /// The last error or panic of the store, for the detail of a failed `Runtime::new`.
    last_error: Mutex<Option<String>>,
}

impl StoreCtx {
    pub(crate) fn new(store: Arc<dyn Store>) -> Box<StoreCtx> {
        Box::new(StoreCtx { store, last_error: Mutex::new(None) })
    }

    /// The C callbacks over this context. `self` must outlive every runtime using them.
    pub(crate) fn raw(&self) -> sys::ccq_store {
        sys::ccq_store { ctx: self as *const StoreCtx as *mut c_void, set: Some(store_set), get: Some(store_get) }
    }

    pub(crate) fn take_error(&self) -> Option<String> {
        self.last_error.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Runs one store call: as a callback (ccq's waiting calls refuse), panics caught, an
    /// error kept for the detail and turned into a negative status.
    fn call(&self, what: &str, key: &str, f: impl FnOnce(&dyn Store) -> Result<sys::ccq_status>) -> sys::ccq_status {
        let r =
            crate::trace::as_callback(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&*self.store))));
        let (st, msg) = match r {
            Ok(Ok(st)) => return st,
            Ok(Err(e)) => {
                let raw = e.status().raw();
                (if raw < 0 { raw } else { sys::CCQ_ERR_BACKEND }, format!("the store's {what} of \"{key}\": {e}"))
            }
            Err(p) => {
                let why = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                (sys::CCQ_ERR_BACKEND, format!("the store's {what} of \"{key}\" panicked: {why}"))
            }
        };
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(msg);
        st
    }
}

/// # Safety
/// `ctx` is a live `StoreCtx`; `key` a NUL-terminated string; `value` valid for `len` bytes.
unsafe extern "C" fn store_set(
    ctx: *mut c_void,
    key: *const c_char,
    value: *const c_void,
    len: usize,
) -> sys::ccq_status {
    // SAFETY: ccq passes back our ctx and valid arguments for the call's duration.
    let (cx, key, value) = unsafe {
        let value = if len == 0 { &[][..] } else { std::slice::from_raw_parts(value.cast::<u8>(), len) };
        (&*(ctx as *const StoreCtx), CStr::from_ptr(key).to_string_lossy(), value)
    };
    cx.call("set", &key, |s| s.set(&key, value).map(|()| sys::CCQ_OK))
}

/// # Safety
/// As `store_set`; `len` is valid, `value` valid for `*len` bytes of writes.
unsafe extern "C" fn store_get(
    ctx: *mut c_void,
    key: *const c_char,
    value: *mut c_void,
    len: *mut usize,
) -> sys::ccq_status {
    // SAFETY: as in store_set.
    let (cx, key, room) = unsafe { (&*(ctx as *const StoreCtx), CStr::from_ptr(key).to_string_lossy(), *len) };
    cx.call("get", &key, |s| {
        Ok(match s.get(&key)? {
            None => sys::CCQ_IN_PROGRESS,
            Some(v) => {
                let n = v.len().min(room);
                // SAFETY: value has room for `room` >= n bytes; len is valid (ccq's contract).
                unsafe {
                    if n > 0 {
                        std::ptr::copy_nonoverlapping(v.as_ptr(), value.cast::<u8>(), n);
                    }
                    *len = v.len();
                }
                sys::CCQ_OK
            }
        })
    })
}

impl Runtime {
    /// This process's rank in the world (`Config::world`'s rank; 0 alone).
    pub fn world_rank(&self) -> u32 {
        // SAFETY: live runtime.
        unsafe { sys::ccq_world_rank(self.as_ptr()) }
    }

    /// Processes in the world (1 alone).
    pub fn world_size(&self) -> u32 {
        // SAFETY: live runtime.
        unsafe { sys::ccq_world_size(self.as_ptr()) }
    }

    /// The global device ids this process owns, `first..first + count`: only these can be
    /// submitted on, fenced, bound or allocated on here (another process's device is
    /// refused with [`Status::InvalidArgument`](crate::Status::InvalidArgument), naming its owner). Device ids are global:
    /// [`Runtime::device_count`] and [`Runtime::devices`] are the world's, process p owning
    /// the ids after those of lower processes. In a world of one, every device.
    pub fn local_devices(&self) -> Range<DeviceId> {
        let (mut first, mut count) = (0, 0);
        // SAFETY: live runtime; valid out-pointers.
        let st = unsafe { sys::ccq_local_devices(self.as_ptr(), &mut first, &mut count) };
        debug_assert_eq!(st, sys::CCQ_OK, "ccq_local_devices of a live runtime");
        DeviceId(first)..DeviceId(first + count)
    }

    /// This process's devices, as a list (see [`Runtime::local_devices`]).
    pub fn local_device_ids(&self) -> Vec<DeviceId> {
        let r = self.local_devices();
        (r.start.0..r.end.0).map(DeviceId).collect()
    }

    /// Whether `device` is one of this process's.
    pub fn is_local(&self, device: DeviceId) -> bool {
        self.local_devices().contains(&device)
    }

    /// What this process knows of world rank `process` (job health): alive, lost (died, or
    /// silent past `heartbeat_timeout_ms`; every survivor agrees) or left (destroyed its
    /// runtime cleanly). A process declared lost while it was in fact alive reads its own
    /// state as lost once it learns it.
    pub fn process_state(&self, process: u32) -> crate::Result<ProcessState> {
        let mut st = sys::CCQ_PROCESS_ALIVE;
        // SAFETY: live runtime; valid out-pointer.
        crate::error::check(unsafe { sys::ccq_world_process_state(self.as_ptr(), process, &mut st) })?;
        Ok(match st {
            sys::CCQ_PROCESS_LOST => ProcessState::Lost,
            sys::CCQ_PROCESS_LEFT => ProcessState::Left,
            _ => ProcessState::Alive,
        })
    }

    /// The latest progress of every process on the communicators spanning processes this
    /// process belongs to, from their heartbeats (this process's own is current).
    pub fn world_progress(&self) -> crate::Result<Vec<Progress>> {
        let mut n = 0usize;
        // SAFETY: live runtime; cap 0 with a NULL array only counts.
        crate::error::check(unsafe { sys::ccq_world_progress(self.as_ptr(), std::ptr::null_mut(), 0, &mut n) })?;
        let mut raw = vec![sys::ccq_progress::default(); n + 8]; // room for a few more meanwhile
        raw[0].struct_size = std::mem::size_of::<sys::ccq_progress>() as u32;
        // SAFETY: `raw` has raw.len() elements of the size declared in raw[0].
        crate::error::check(unsafe { sys::ccq_world_progress(self.as_ptr(), raw.as_mut_ptr(), raw.len(), &mut n) })?;
        raw.truncate(n.min(raw.len()));
        Ok(raw
            .into_iter()
            .map(|p| Progress {
                process: p.process,
                state: match p.state {
                    sys::CCQ_PROCESS_LOST => ProcessState::Lost,
                    sys::CCQ_PROCESS_LEFT => ProcessState::Left,
                    _ => ProcessState::Alive,
                },
                comm: p.comm,
                submitted: p.submitted,
                completed: p.completed,
                pending: (p.pending_kind != u32::MAX).then(|| {
                    (
                        crate::Kind::from_raw(p.pending_kind),
                        p.pending_seq,
                        std::time::Duration::from_nanos(p.pending_age_ns),
                    )
                }),
                heartbeat_age: std::time::Duration::from_nanos(p.heartbeat_age_ns),
            })
            .collect())
    }
}

/// What a process knows of another one ([`Runtime::process_state`]; `ccq_process_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProcessState {
    /// Its heartbeats arrive (or heartbeats are off).
    Alive,
    /// Died, or silent past `heartbeat_timeout_ms`: excluded for good.
    Lost,
    /// Destroyed its runtime cleanly.
    Left,
}

/// One process's progress on one communicator spanning processes ([`Runtime::world_progress`];
/// `ccq_progress`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// World rank.
    pub process: u32,
    /// Its state as this process knows it.
    pub state: ProcessState,
    /// The communicator's id (this process's, as in events).
    pub comm: u32,
    /// Operations it submitted on the communicator (its next sequence number).
    pub submitted: u64,
    /// Operations it completed.
    pub completed: u64,
    /// Its oldest pending operation: kind, sequence number, how long it had been pending.
    pub pending: Option<(crate::Kind, u64, std::time::Duration)>,
    /// Age of the heartbeat this comes from (zero for this process's own).
    pub heartbeat_age: std::time::Duration,
}

/// `Runtime::new`'s error, with what the store said when it failed.
pub(crate) fn with_store_error(e: Error, cx: Option<&StoreCtx>) -> Error {
    match cx.and_then(StoreCtx::take_error) {
        Some(msg) => Error::new(e.status(), format!("{} ({msg})", e.detail())),
        None => e,
    }
}
