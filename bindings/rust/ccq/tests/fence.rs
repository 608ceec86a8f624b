//! Fence values on the host backend: done and in progress (a delayed operation, a missing
//! part), their errors, their order, the scope's poll, and `nccl_stream_wait` off NCCL.

use ccq::*;
use std::time::{Duration, Instant};

const S: StreamId = StreamId(0);

fn rt(cfg: Config) -> Runtime {
    Runtime::new(&cfg.backend("host").host_devices(2).host_workers(1)).unwrap()
}

#[test]
fn a_delayed_operation_is_in_progress_then_done() {
    // Operation 0 starts 600 ms late: long enough to see it in progress, well below the
    // deadline.
    let rt = rt(Config::new().fault(Some("delay:us=600000,op=0")).timeout_ms(20_000));
    let devs = rt.devices();
    rt.comm_init(&devs).unwrap();
    let src = [vec![1u32; 100], vec![2; 100]];
    let mut dst = [vec![0u32; 100], vec![0; 100]];
    let [d0, d1] = &mut dst;
    let t0 = Instant::now();
    rt.scope(|s| {
        let before = s.fence(devs[0], S)?;
        s.all_reduce(devs[0], S, &src[0], d0, ReduceOp::Sum, &devs)?;
        s.all_reduce(devs[1], S, &src[1], d1, ReduceOp::Sum, &devs)?;
        let f = s.fence(devs[0], S)?;
        assert!(f > before && f.covers(&before) && !before.covers(&f));
        assert!(rt.fence_test(&before)?, "nothing was pending before");
        assert!(!rt.fence_test(&f)?, "the delayed all_reduce is done already");
        assert!(!s.poll()?);
        assert!(!rt.fence_wait(&f, Some(Duration::from_millis(20)))?, "a 20 ms wait outlived a 600 ms delay");
        // Another thread may wait on the same value.
        let other = std::thread::scope(|t| t.spawn(|| rt.fence_wait(&f, None)).join().unwrap());
        assert_eq!(other, Ok(true));
        assert!(rt.fence_wait(&f, None)?);
        assert!(rt.fence_test(&f)?, "the same value gives the same answer");
        // Device 1's value: its part ended with the operation.
        assert!(rt.fence_test(&s.fence(devs[1], S)?)?);
        assert!(s.poll()?);
        Ok(())
    })
    .unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(550), "{:?}", t0.elapsed());
    assert_eq!(dst, [vec![3; 100], vec![3; 100]]);
}

#[test]
fn a_missing_part_times_out_and_every_test_reports_it() {
    let rt = rt(Config::new().timeout_ms(500));
    let devs = rt.devices();
    rt.comm_init(&devs).unwrap();
    let src = vec![1.0f32; 16];
    let mut dst = vec![0.0f32; 16];
    let mut seen = None;
    let r = rt.scope(|s| {
        // Device 1 never submits its part.
        s.all_reduce(devs[0], S, &src, &mut dst, ReduceOp::Sum, &devs)?;
        let f = s.fence(devs[0], S)?;
        assert!(!rt.fence_test(&f)?);
        // The wait (timeout_ms) may end just before the watchdog (timeout_ms too) fails the
        // operation: then it says "in progress", and is asked again.
        let t0 = Instant::now();
        let e = loop {
            match rt.fence_wait(&f, None) {
                Ok(done) => assert!(!done && t0.elapsed() < Duration::from_secs(10)),
                Err(e) => break e,
            }
        };
        assert_eq!(e.status(), Status::Timeout, "{e}");
        // Final: the same error from every test, and from the scope's poll.
        assert_eq!(rt.fence_test(&f), Err(e.clone()));
        assert_eq!(s.poll(), Err(e.clone()));
        seen = Some(e);
        Ok(())
    });
    // The scope's sync reports the error once and clears it.
    let e = r.unwrap_err();
    assert_eq!(Some(e.status()), seen.map(|e| e.status()));
    rt.sync(devs[0], S).unwrap();
    // A value taken after the report does not see it.
    assert!(rt.fence_test(&rt.fence_begin(devs[0], S).unwrap()).unwrap());
}

#[test]
fn bad_values_and_streams_are_refused() {
    let rt = rt(Config::new().max_streams(4));
    let e = rt.fence_begin(DeviceId(0), StreamId(4)).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    let e = rt.fence_begin(DeviceId(7), S).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    // A value covering more commands than the stream ever had is not one of its values.
    let bogus = Fence::from_raw(DeviceId(0), S, 12345);
    let e = rt.fence_test(&bogus).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.detail().contains("not a value of this stream"), "{e}");
    assert_eq!(rt.fence_wait(&bogus, Some(Duration::from_millis(1))).unwrap_err().status(), Status::InvalidArgument);
    // Values of different streams are not ordered.
    let (a, b) = (rt.fence_begin(DeviceId(0), S).unwrap(), rt.fence_begin(DeviceId(1), S).unwrap());
    assert_eq!(a.partial_cmp(&b), None);
    assert!(!a.covers(&b));
    assert_eq!(a.partial_cmp(&rt.fence_begin(DeviceId(0), S).unwrap()), Some(std::cmp::Ordering::Equal));
    assert_eq!((a.device(), a.stream(), Fence::from_raw(a.device(), a.stream(), a.raw())), (DeviceId(0), S, a));
}

#[test]
fn fence_wait_is_refused_in_the_event_callback_and_test_is_not() {
    use std::sync::{Arc, Mutex};
    let rt = Arc::new(rt(Config::new()));
    let f = rt.fence_begin(DeviceId(0), S).unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let (w, g) = (Arc::downgrade(&rt), got.clone());
    rt.set_event_callback(move |ev| {
        if ev.event_type() == EventType::FenceBegin {
            if let Some(rt) = w.upgrade() {
                g.lock().unwrap().push((rt.fence_test(&f), rt.fence_wait(&f, None).map_err(|e| e.status())));
            }
        }
    })
    .unwrap();
    rt.sync(DeviceId(0), S).unwrap();
    rt.clear_event_callback().unwrap();
    assert_eq!(*got.lock().unwrap(), [(Ok(true), Err(Status::InvalidArgument))]);
}

#[test]
fn nccl_stream_wait_is_unsupported_on_the_host_backend() {
    let rt = rt(Config::new());
    // SAFETY: the host backend refuses before it looks at the stream.
    let e = unsafe { rt.nccl_stream_wait(DeviceId(0), S, std::ptr::NonNull::dangling()) }.unwrap_err();
    assert_eq!(e.status(), Status::Unsupported, "{e}");
    assert!(e.detail().contains("not \"nccl\"") && e.detail().contains("Runtime::sync"), "{e}");
    // A bad device is named first.
    // SAFETY: as above.
    let e = unsafe { rt.nccl_stream_wait(DeviceId(9), S, std::ptr::NonNull::dangling()) }.unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
}
