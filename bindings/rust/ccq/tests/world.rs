//! Worlds of two processes on the host backend: two runtimes on two threads of this process
//! (each its own world rank) meeting through the file bootstrap or a Rust `Store`, and this
//! test binary spawned again as a real second process. Ranks, global device ids, local
//! devices, a refusal of the other process's device, communicators of one process, and
//! stores that fail or panic.
//!
//! Its own test binary: it sets `CCQ_JOB_ID` (a fresh job per test, so that each test's
//! ranks start at bootstrap generation 0 whatever the others did), under one lock.

use ccq::*;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};

static LOCK: Mutex<()> = Mutex::new(());

/// The env var that makes `world_child_process` play rank 1 (holds the directory).
const CHILD_DIR: &str = "CCQ_RS_WORLD_CHILD_DIR";

/// A fresh directory and job id for one test.
fn fresh(name: &str) -> PathBuf {
    let job = format!("ccq-rs-{name}-{}", std::process::id());
    std::env::set_var("CCQ_JOB_ID", &job);
    let dir = std::env::temp_dir().join(job);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A rank of a world of 2 on the host backend's MPI engine, without MPI: communicators
/// spanning the processes are refused, which these tests check (the UCX engine crossing them
/// is `two_ranks_cross_on_the_ucx_engine`).
fn cfg(rank: u32, devices: u32, boot: Bootstrap) -> Config {
    Config::new()
        .backend("host")
        .host_devices(devices)
        .host_workers(1)
        .timeout_ms(10_000)
        .world(rank, 2)
        .bootstrap(boot)
        .host_engine(Some("mpi"))
}

/// Creates both ranks at once (each blocks until the other arrives).
fn pair(c0: Config, c1: Config) -> (Result<Runtime>, Result<Runtime>) {
    std::thread::scope(|t| {
        let h1 = t.spawn(|| Runtime::new(&c1));
        let r0 = Runtime::new(&c0);
        (r0, h1.join().unwrap())
    })
}

/// An all_reduce over this process's devices, checked; then the other process's device
/// is refused.
fn use_local_devices(rt: &Runtime, other: DeviceId) {
    let devs = rt.local_device_ids();
    rt.comm_init(&devs).unwrap();
    let src: Vec<Vec<i32>> = devs.iter().map(|d| vec![d.0 as i32 + 1; 33]).collect();
    let mut dst = vec![vec![0i32; 33]; devs.len()];
    rt.scope(|s| {
        for ((&d, src), dst) in devs.iter().zip(&src).zip(dst.iter_mut()) {
            s.all_reduce(d, StreamId(0), src, dst, ReduceOp::Sum, &devs)?;
        }
        Ok(())
    })
    .unwrap();
    let want: i32 = devs.iter().map(|d| d.0 as i32 + 1).sum();
    assert!(dst.iter().all(|v| v.iter().all(|&x| x == want)));

    assert!(!rt.is_local(other));
    let e = rt.fence_begin(other, StreamId(0)).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.detail().contains(&format!("belongs to process {}", 1 - rt.world_rank())), "{e}");
    let buf = [0u8; 4];
    let e = rt.scope(|s| s.send(devs[0], StreamId(0), &buf, other)).unwrap_err();
    assert_eq!(e.status(), Status::Unsupported, "the host backend cannot span processes: {e}");
}

/// Rank 0 with 2 devices, rank 1 with 1: ids 0..2 and 2..3 of 3.
fn check_world(r0: &Runtime, r1: &Runtime) {
    for (rank, rt) in [r0, r1].into_iter().enumerate() {
        assert_eq!((rt.world_rank(), rt.world_size(), rt.device_count()), (rank as u32, 2, 3));
    }
    assert_eq!(r0.local_devices(), DeviceId(0)..DeviceId(2));
    assert_eq!(r1.local_devices(), DeviceId(2)..DeviceId(3));
    assert_eq!(r1.local_device_ids(), [DeviceId(2)]);
    std::thread::scope(|t| {
        t.spawn(|| use_local_devices(r0, DeviceId(2)));
        t.spawn(|| use_local_devices(r1, DeviceId(0)));
    });
}

#[test]
fn two_ranks_on_threads_meet_through_the_file_bootstrap() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = fresh("file");
    let c0 = cfg(0, 2, Bootstrap::File(dir.clone()));
    assert!(matches!(c0.get_bootstrap(), Some(Bootstrap::File(d)) if *d == dir));
    assert_eq!((c0.get_world_rank(), c0.get_world_size(), c0.get_mpi_comm()), (0, 2, -1));
    let (r0, r1) = pair(c0, cfg(1, 1, Bootstrap::File(dir.clone())));
    let (r0, r1) = (r0.unwrap(), r1.unwrap());
    check_world(&r0, &r1);
    drop((r0, r1));
    let _ = std::fs::remove_dir_all(&dir);
}

#[derive(Default)]
struct MemStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    sets: Mutex<u32>,
}

impl Store for MemStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        assert!(key.starts_with("ccq/"), "{key}");
        *self.sets.lock().unwrap() += 1;
        self.map.lock().unwrap().insert(key.into(), value.into());
        Ok(())
    }
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.map.lock().unwrap().get(key).cloned())
    }
}

#[test]
fn two_ranks_on_threads_meet_through_a_rust_store() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    fresh("store");
    let store = Arc::new(MemStore::default());
    let (r0, r1) = pair(cfg(0, 2, Bootstrap::Store(store.clone())), cfg(1, 1, Bootstrap::Store(store.clone())));
    let (r0, r1) = (r0.unwrap(), r1.unwrap());
    assert!(*store.sets.lock().unwrap() >= 2, "each rank published its device count");
    check_world(&r0, &r1);
    // Each runtime keeps the store until it is destroyed.
    assert_eq!(Arc::strong_count(&store), 3);
    drop((r0, r1));
    assert_eq!(Arc::strong_count(&store), 1);
}

#[test]
fn a_rank_that_destroys_its_runtime_reads_as_left() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    fresh("health");
    let store = Arc::new(MemStore::default());
    let c = |r| cfg(r, 1, Bootstrap::Store(store.clone())).heartbeat_ms(50).heartbeat_timeout_ms(500);
    assert_eq!((c(0).get_heartbeat_ms(), c(0).get_heartbeat_timeout_ms()), (50, 500));
    let (r0, r1) = pair(c(0), c(1));
    let (r0, r1) = (r0.unwrap(), r1.unwrap());
    for rt in [&r0, &r1] {
        assert_eq!(rt.process_state(0).unwrap(), ProcessState::Alive);
        assert_eq!(rt.process_state(1).unwrap(), ProcessState::Alive);
        assert_eq!(rt.process_state(2).unwrap_err().status(), Status::InvalidArgument);
        // No communicator spans the two (the host backend needs MPI for that): no records.
        assert!(rt.world_progress().unwrap().is_empty());
    }
    drop(r1);
    let t0 = std::time::Instant::now();
    while r0.process_state(1).unwrap() != ProcessState::Left {
        assert!(t0.elapsed() < std::time::Duration::from_secs(5), "rank 1 never read as left");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Past its heartbeat timeout it is still left, never lost.
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert_eq!(r0.process_state(1).unwrap(), ProcessState::Left);
    assert_eq!(Status::from_raw(sys::CCQ_ERR_PROCESS_LOST), Some(Status::ProcessLost));
    assert_eq!(EventType::from_raw(sys::CCQ_EV_PROCESS_LOST), EventType::ProcessLost);
}

/// A store whose get fails, or panics, for keys of rank 1.
struct BadStore {
    inner: MemStore,
    panic: bool,
}

impl Store for BadStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(key, value)
    }
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        if key.ends_with("/1") {
            if self.panic {
                panic!("the store went away");
            }
            return Err(Error::new(Status::Backend, "connection refused"));
        }
        self.inner.get(key)
    }
}

#[test]
fn a_failing_or_panicking_store_fails_create_with_its_reason() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for (panic, want) in [(false, "connection refused"), (true, "panicked: the store went away")] {
        fresh(if panic { "panic" } else { "fail" });
        let store = Arc::new(BadStore { inner: MemStore::default(), panic });
        // Rank 0 reads rank 1's record (and fails); rank 1 alone would wait for rank 0's:
        // give it a short deadline.
        let c1 = cfg(1, 1, Bootstrap::Store(store.clone())).timeout_ms(300);
        let (r0, r1) = pair(cfg(0, 1, Bootstrap::Store(store.clone())), c1);
        let e = r0.unwrap_err();
        assert_eq!(e.status(), Status::Backend, "{e}");
        assert!(e.detail().contains(want) && e.detail().contains("get of \"ccq/"), "{e}");
        // Rank 1 only reads rank 0's key: it may meet rank 0 before that failed.
        drop(r1);
    }
}

#[test]
fn bootstrap_specs_and_bad_worlds() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    assert!(matches!(Bootstrap::from_spec("mpi"), Bootstrap::Mpi));
    assert!(matches!(Bootstrap::from_spec("file:/x"), Bootstrap::File(p) if p == std::path::Path::new("/x")));
    assert!(matches!(Bootstrap::from_spec("tcp://h:1"), Bootstrap::Tcp(a) if a == "h:1"));
    assert_eq!(Bootstrap::Tcp("h:1".into()).spec().as_deref(), Some("tcp://h:1"));
    assert!(matches!(Bootstrap::from_spec("pigeon://h"), Bootstrap::Spec(_)));
    assert_eq!(Bootstrap::File("/x".into()).spec().as_deref(), Some("file:/x"));
    assert_eq!(format!("{:?}", Bootstrap::store(MemStore::default())), "Store(..)");
    let e = Runtime::new(&Config::new().backend("host").world(2, 2)).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    // A directory that cannot be created (a missing one is made): below a file.
    let e = Runtime::new(&cfg(0, 1, Bootstrap::File("/dev/null/ccq-no-such-dir".into()))).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.detail().contains("ccq-no-such-dir"), "{e}");
    let e = Runtime::new(&cfg(0, 1, Bootstrap::Spec("pigeon://h".into()))).unwrap_err();
    assert!(e.detail().contains("pigeon://h"), "{e}");
    let e = Runtime::new(&cfg(0, 1, Bootstrap::Tcp("h".into()))).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.detail().contains("expected tcp://HOST:PORT"), "{e}");
    // Alone, as always.
    let rt = Runtime::host(2).unwrap();
    assert_eq!((rt.world_rank(), rt.world_size(), rt.local_devices()), (0, 1, DeviceId(0)..DeviceId(2)));
}

/// Rank 1 as a real process: this test binary spawned again, running only
/// `world_child_process` with the directory in `CHILD_DIR`.
#[test]
fn two_processes_meet_through_the_file_bootstrap() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = fresh("procs");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "world_child_process", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR, &dir)
        .spawn()
        .unwrap();
    let r0 = Runtime::new(&cfg(0, 2, Bootstrap::File(dir.clone())));
    let status = child.wait().unwrap();
    let r0 = r0.unwrap();
    assert!(status.success(), "rank 1's process failed: {status}");
    assert_eq!((r0.world_rank(), r0.world_size(), r0.device_count()), (0, 2, 3));
    assert_eq!(r0.local_devices(), DeviceId(0)..DeviceId(2));
    use_local_devices(&r0, DeviceId(2));
    drop(r0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Only does something in the spawned process: rank 1 of `two_processes_meet_...`.
#[test]
fn world_child_process() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else { return };
    let rt = Runtime::new(&cfg(1, 1, Bootstrap::File(dir.into()))).unwrap();
    assert_eq!((rt.world_rank(), rt.world_size(), rt.device_count()), (1, 2, 3));
    assert_eq!(rt.local_devices(), DeviceId(2)..DeviceId(3));
    use_local_devices(&rt, DeviceId(0));
}

/// Two ranks on threads meet through the tcp rendezvous (rank 0 serves it) and, on the host
/// backend's default engine (UCX, when libccq has it), send to each other and all_reduce over
/// both processes' devices.
#[test]
fn two_ranks_cross_on_the_ucx_engine() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let boot = || Bootstrap::Tcp(format!("127.0.0.1:{port}"));
    // A job of its own: the other tests opened bootstraps of the default job as rank 0 and
    // rank 1 unevenly, and the k-th runtime of a rank meets the k-th of the others.
    std::env::set_var("CCQ_JOB_ID", format!("cross-{port}"));
    let c = |rank, devices| cfg(rank, devices, boot()).host_engine(Some("ucx"));
    let (r0, r1) = pair(c(0, 2), c(1, 1));
    std::env::remove_var("CCQ_JOB_ID");
    let (r0, r1) = match (r0, r1) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) if e.status() == Status::Unsupported => return, // built without UCX
        (a, b) => panic!("{:?} {:?}", a.err(), b.err()),
    };
    let all = [DeviceId(0), DeviceId(1), DeviceId(2)];
    std::thread::scope(|t| {
        t.spawn(|| {
            r0.comm_init(&all).unwrap();
            let src = [vec![1i32; 100], vec![2i32; 100]];
            let mut dst = [vec![0i32; 100], vec![0i32; 100]];
            let (d0, d1) = dst.split_at_mut(1);
            r0.scope(|s| {
                s.all_reduce(DeviceId(0), StreamId(0), &src[0], &mut d0[0], ReduceOp::Sum, &all)?;
                s.all_reduce(DeviceId(1), StreamId(0), &src[1], &mut d1[0], ReduceOp::Sum, &all)
            })
            .unwrap();
            assert!(dst.iter().all(|v| v.iter().all(|&x| x == 1 + 2 + 3)));
            let msg = [7u8; 4096];
            r0.scope(|s| s.send(DeviceId(1), StreamId(1), &msg, DeviceId(2))).unwrap();
        });
        t.spawn(|| {
            r1.comm_init(&all).unwrap();
            let src = vec![3i32; 100];
            let mut dst = vec![0i32; 100];
            r1.scope(|s| s.all_reduce(DeviceId(2), StreamId(0), &src, &mut dst, ReduceOp::Sum, &all)).unwrap();
            assert!(dst.iter().all(|&x| x == 6));
            let mut got = [0u8; 4096];
            r1.scope(|s| s.recv(DeviceId(2), StreamId(1), &mut got, DeviceId(1))).unwrap();
            assert!(got.iter().all(|&x| x == 7));
        });
    });
}
