//! The safe API on the host backend: every collective through a scope, errors, counters,
//! the event log and the callback rules.

use ccq::*;
use std::sync::{Arc, Mutex, Weak};

fn rt(n: u32) -> Runtime {
    Runtime::new(&Config::new().backend("host").host_devices(n).host_workers(1).timeout_ms(20_000)).unwrap()
}

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn runtime_scope_and_buffers_are_send_sync() {
    assert_send_sync::<Runtime>();
    assert_send_sync::<Scope<'_, '_>>();
    assert_send_sync::<DeviceBuffer<'_, f32>>();
    assert_send_sync::<Config>();
}

#[test]
fn elements_have_the_size_of_their_dtype() {
    fn size<T: Element>() {
        assert_eq!(std::mem::size_of::<T>(), T::DTYPE.size(), "{}", T::DTYPE.name());
    }
    size::<i8>();
    size::<u8>();
    size::<i32>();
    size::<u32>();
    size::<i64>();
    size::<u64>();
    size::<f32>();
    size::<f64>();
    size::<F16>();
    size::<BF16>();
    size::<F8E4M3>();
    size::<F8E5M2>();
    for d in DType::ALL {
        assert_eq!(DType::from_raw(d.raw()), Some(d));
        assert_ne!(d.name(), "?");
    }
    assert_eq!(DType::F32.name(), "float32");
    assert_eq!(ReduceOp::Avg.name(), "avg");
    assert_eq!(BF16::from_f32(1.5).to_f32(), 1.5);
    assert_eq!(BF16::from_f32(-3.0).0, 0xc040);
}

#[test]
fn status_and_error() {
    for raw in -10..0 {
        let s = Status::from_raw(raw).unwrap();
        assert_eq!(s.raw(), raw);
        assert!(s.name().starts_with("CCQ_ERR_"));
    }
    assert_eq!(Status::from_raw(0), None);
    assert_eq!(Status::from_raw(-99), Some(Status::Other(-99)));
    let e = Error::new(Status::Timeout, "all_reduce #2 missing rank 3");
    assert_eq!(e.to_string(), "CCQ_ERR_TIMEOUT: all_reduce #2 missing rank 3");
    assert_eq!(Error::new(Status::Timeout, "").to_string(), "CCQ_ERR_TIMEOUT (timed out)");
    let _: &dyn std::error::Error = &e;
}

#[test]
fn config_builder_sets_every_field() {
    let c = Config::new()
        .backend("host")
        .host_devices(3)
        .max_streams(8)
        .queue_depth(64)
        .max_batch_ops(16)
        .timeout_ms(1234)
        .host_workers(2)
        .nonblocking_submit(true)
        .spin_us(0)
        .fault(Some("delay:us=1,op=1000000"))
        .trace_capacity(1024)
        .trace_file(Some(std::path::Path::new("/dev/null")))
        .trace_signal(false)
        .host_stream_bytes(u64::MAX);
    assert_eq!(c.get_backend(), "host");
    assert_eq!(c.get_host_devices(), 3);
    assert_eq!(c.get_max_streams(), 8);
    assert_eq!(c.get_queue_depth(), 64);
    assert_eq!(c.get_max_batch_ops(), 16);
    assert_eq!(c.get_timeout_ms(), 1234);
    assert_eq!(c.get_host_workers(), 2);
    assert_eq!(c.get_flags() & sys::CCQ_FLAG_NONBLOCKING_SUBMIT, 1);
    assert_eq!(c.get_spin_us(), 0);
    assert_eq!(c.get_fault(), Some("delay:us=1,op=1000000"));
    assert_eq!(c.get_trace_capacity(), 1024);
    assert_eq!(c.get_host_stream_bytes(), u64::MAX);
    assert!(!c.get_trace_signal() && Config::new().trace_signal(true).get_trace_signal());
    assert!(!c.get_nccl_high_priority() && Config::new().nccl_high_priority(true).get_nccl_high_priority());
    let rt = Runtime::new(&c.clone().trace_file(None)).unwrap();
    assert_eq!(rt.device_count(), 3);
    assert_eq!(rt.backend_name(), "host");
    let bad = Runtime::new(&c.clone().backend("nosuch")).unwrap_err();
    assert_eq!(bad.status(), Status::InvalidArgument, "{bad}");
    assert!(bad.detail().contains("nosuch"), "{bad}");
    let bad = Runtime::new(&c.max_streams(0)).unwrap_err();
    assert_eq!(bad.status(), Status::InvalidArgument);
    assert!(bad.detail().contains("max_streams"), "{bad}");
}

/// One thread per device, each submitting every collective on its own stream set.
#[test]
fn every_collective_through_a_scope() {
    const N: usize = 4;
    const C: usize = 5;
    let rt = rt(N as u32);
    let devs = rt.devices();
    rt.comm_init(&devs).unwrap();
    let root = DeviceId(2);
    let src: Vec<Vec<i64>> = (0..N).map(|d| (0..C * N).map(|i| (d * 1000 + i) as i64).collect()).collect();
    struct Out {
        ar: Vec<i64>,
        ip: Vec<i64>,
        bc: Vec<i64>,
        red: Vec<i64>,
        ag: Vec<i64>,
        rs: Vec<i64>,
        a2a: Vec<i64>,
        ga: Vec<i64>,
        sc: Vec<i64>,
        rv: Vec<i64>,
    }
    let mut out: Vec<Out> = (0..N)
        .map(|d| Out {
            ar: vec![0; C],
            ip: src[d][..C].to_vec(),
            bc: vec![0; C],
            red: vec![0; C],
            ag: vec![0; C * N],
            rs: vec![0; C],
            a2a: vec![0; C * N],
            ga: vec![0; C * N],
            sc: vec![0; C],
            rv: vec![0; C],
        })
        .collect();
    let devs = &devs[..];
    rt.scope(|s| {
        std::thread::scope(|t| {
            let hs: Vec<_> = out
                .iter_mut()
                .zip(&src)
                .enumerate()
                .map(|(d, (o, src))| {
                    t.spawn(move || -> Result<()> {
                        let dev = DeviceId(d as u32);
                        let st = StreamId;
                        let is_root = dev == root;
                        s.all_reduce(dev, st(0), &src[..C], &mut o.ar, ReduceOp::Sum, devs)?;
                        s.all_reduce_in_place(dev, st(1), &mut o.ip, ReduceOp::Max, devs)?;
                        s.broadcast(dev, st(2), is_root.then_some(&src[..C]), &mut o.bc, root, devs)?;
                        s.reduce(dev, st(3), &src[..C], is_root.then_some(&mut o.red), ReduceOp::Sum, root, devs)?;
                        s.all_gather(dev, st(4), &src[..C], &mut o.ag, devs)?;
                        s.reduce_scatter(dev, st(5), &src[..], &mut o.rs, ReduceOp::Sum, devs)?;
                        s.all_to_all(dev, st(6), &src[..], &mut o.a2a, devs)?;
                        s.gather(dev, st(7), &src[..C], is_root.then_some(&mut o.ga), root, devs)?;
                        s.scatter(dev, st(8), is_root.then_some(&src[..]), &mut o.sc, root, devs)?;
                        // A ring: send to the next device, receive from the previous one.
                        s.send(dev, st(9), &src[..C], DeviceId(((d + 1) % N) as u32))?;
                        s.recv(dev, st(9), &mut o.rv, DeviceId(((d + N - 1) % N) as u32))
                    })
                })
                .collect();
            hs.into_iter().try_for_each(|h| h.join().unwrap())
        })
    })
    .unwrap();
    let x = |d: usize, i: usize| (d * 1000 + i) as i64;
    for (d, o) in out.iter().enumerate() {
        for i in 0..C {
            assert_eq!(o.ar[i], (0..N).map(|r| x(r, i)).sum::<i64>());
            assert_eq!(o.ip[i], x(N - 1, i));
            assert_eq!(o.bc[i], x(2, i));
            assert_eq!(o.rs[i], (0..N).map(|r| x(r, d * C + i)).sum::<i64>());
            assert_eq!(o.sc[i], x(2, d * C + i));
            assert_eq!(o.rv[i], x((d + N - 1) % N, i));
            for r in 0..N {
                assert_eq!(o.ag[r * C + i], x(r, i));
                assert_eq!(o.a2a[r * C + i], x(r, d * C + i));
                if d == 2 {
                    assert_eq!(o.ga[r * C + i], x(r, i));
                }
            }
            if d == 2 {
                assert_eq!(o.red[i], (0..N).map(|r| x(r, i)).sum::<i64>());
            }
        }
    }
    let st = rt.stats().unwrap();
    assert_eq!(st.submitted, (N * 11) as u64);
    assert_eq!(st.completed, st.submitted);
    assert_eq!(st.pending, 0);
}

#[test]
fn device_buffers_work_like_slices() {
    let rt = rt(2);
    let devs = rt.devices();
    rt.comm_init(&devs).unwrap();
    let mut bufs: Vec<DeviceBuffer<'_, BF16>> = devs.iter().map(|&d| rt.alloc(d, 3).unwrap()).collect();
    for (d, b) in bufs.iter_mut().enumerate() {
        b.write(&[BF16::from_f32(d as f32 + 1.0); 3]).unwrap();
    }
    rt.scope(|s| {
        for (d, b) in bufs.iter_mut().enumerate() {
            s.all_reduce_in_place(DeviceId(d as u32), StreamId(0), b, ReduceOp::Avg, &devs)?;
        }
        Ok(())
    })
    .unwrap();
    for b in &bufs {
        assert!(b.to_vec().unwrap().iter().all(|v| v.to_f32() == 1.5));
    }
    // A buffer of device 1 given to device 0's part is refused before anything is queued.
    let src = rt.alloc::<BF16>(DeviceId(1), 3).unwrap();
    let mut dst = vec![BF16::default(); 3];
    let e = rt.scope(|s| s.all_reduce(DeviceId(0), StreamId(0), &src, &mut dst, ReduceOp::Sum, &devs)).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert_eq!(rt.alloc::<f32>(DeviceId(9), 1).unwrap_err().status(), Status::InvalidArgument);
}

#[test]
fn errors_carry_their_detail() {
    let rt = rt(2);
    let devs = rt.devices();
    let (a, mut b) = (vec![1.0f32; 4], vec![0.0f32; 4]);
    // No comm_init: refused at submission.
    let e = rt.scope(|s| s.all_reduce(DeviceId(0), StreamId(0), &a, &mut b, ReduceOp::Sum, &devs)).unwrap_err();
    assert_eq!(e.status(), Status::NotInitialized, "{e}");
    assert!(!e.detail().is_empty());
    // Lengths that disagree: refused by the Rust side.
    let mut short = vec![0.0f32; 3];
    let e = rt.scope(|s| s.all_reduce(DeviceId(0), StreamId(0), &a, &mut short, ReduceOp::Sum, &devs)).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    // Parts that disagree across ranks: the fence at the end of the scope reports it.
    rt.comm_init(&devs).unwrap();
    let (mut b0, mut b1) = (vec![0.0f32; 4], vec![0.0f32; 3]);
    let e = rt
        .scope(|s| {
            s.all_reduce(DeviceId(0), StreamId(0), &a, &mut b0, ReduceOp::Sum, &devs)?;
            s.all_reduce(DeviceId(1), StreamId(0), &a[..3], &mut b1, ReduceOp::Sum, &devs)
        })
        .unwrap_err();
    assert_eq!(e.status(), Status::Mismatch, "{e}");
    assert!(e.detail().contains("count"), "{e}");
    let last = rt.stream_last_error(DeviceId(0), StreamId(0)).unwrap().unwrap();
    assert_eq!(last.status(), Status::Mismatch);
    assert_eq!(rt.stream_last_error(DeviceId(0), StreamId(5)).unwrap(), None);
    rt.shutdown().unwrap();
    let e = rt.scope(|s| s.all_reduce(DeviceId(0), StreamId(0), &a, &mut b0, ReduceOp::Sum, &devs)).unwrap_err();
    assert_eq!(e.status(), Status::Shutdown);
}

#[test]
fn a_panicking_scope_still_fences() {
    let rt = rt(1);
    let devs = [DeviceId(0)];
    rt.comm_init(&devs).unwrap();
    let src = vec![7u32; 1 << 16];
    let mut dst = vec![0u32; 1 << 16];
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.scope(|s| -> Result<()> {
            s.all_reduce(DeviceId(0), StreamId(0), &src, &mut dst, ReduceOp::Sum, &devs)?;
            panic!("after submitting");
        })
    }));
    assert!(r.is_err());
    assert_eq!(rt.stream_queue_depth(DeviceId(0), StreamId(0)).unwrap(), 0);
    assert!(dst.iter().all(|&v| v == 7));
}

#[test]
fn stats_metrics_and_the_trace() {
    let rt = rt(2);
    let devs = rt.devices();
    rt.comm_init(&devs).unwrap();
    let src = [vec![1u8; 8], vec![2u8; 8]];
    let mut dst = [vec![0u8; 8], vec![0u8; 8]];
    rt.scope(|s| {
        for (d, (src, dst)) in src.iter().zip(dst.iter_mut()).enumerate() {
            s.all_reduce(DeviceId(d as u32), StreamId(3), src, dst, ReduceOp::Sum, &devs)?;
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(dst[1], [3u8; 8]);
    let m = rt.metrics().unwrap();
    assert_eq!(m.commands_ended, 2);
    assert!(m.trace_events > 0);
    let (events, dropped) = rt.trace_snapshot(1024).unwrap();
    assert_eq!(dropped, 0);
    let submitted: Vec<_> = events.iter().filter(|e| e.event_type() == EventType::Submitted).collect();
    assert_eq!(submitted.len(), 2);
    for e in &submitted {
        assert_eq!(e.kind(), Kind::AllReduce);
        assert_eq!(e.dtype(), Some(DType::U8));
        assert_eq!(e.stream(), Some(StreamId(3)));
        assert_eq!(e.type_name(), "submitted");
    }
    let path = std::env::temp_dir().join(format!("ccq-rust-trace-{}.json", std::process::id()));
    rt.trace_dump(&path).unwrap();
    let json = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(json.trim_start().starts_with('{') && json.contains("all_reduce"));
}

#[test]
fn the_callback_sees_events_and_cannot_wait_for_the_scheduler() {
    let rt = Arc::new(rt(1));
    let devs = [DeviceId(0)];
    rt.comm_init(&devs).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let refused = Arc::new(Mutex::new(None));
    let weak: Weak<Runtime> = Arc::downgrade(&rt);
    let (seen2, refused2) = (seen.clone(), refused.clone());
    rt.set_event_callback(move |ev| {
        seen2.lock().unwrap().push(ev.event_type());
        if ev.event_type() == EventType::Completed {
            if let Some(rt) = weak.upgrade() {
                // Would deadlock in C; the Rust side refuses it.
                *refused2.lock().unwrap() = Some(rt.sync(DeviceId(0), StreamId(0)).map_err(|e| e.status()));
            }
        }
    })
    .unwrap();
    let mut buf = vec![1.0f64; 4];
    rt.scope(|s| s.all_reduce_in_place(DeviceId(0), StreamId(0), &mut buf, ReduceOp::Sum, &devs)).unwrap();
    let seen = seen.lock().unwrap().clone();
    for t in [EventType::Submitted, EventType::Issued, EventType::Completed, EventType::FenceBegin, EventType::FenceEnd]
    {
        assert!(seen.contains(&t), "{t:?} not in {seen:?}");
    }
    assert_eq!(*refused.lock().unwrap(), Some(Err(Status::InvalidArgument)));
    rt.clear_event_callback().unwrap();
}
