//! `Config::new` applies the CCQ_* environment as ccq_config_init does (its own test
//! binary: it changes the process environment).

use ccq::{Bootstrap, Config, Runtime, Status};

#[test]
fn the_environment_is_applied_and_checked() {
    std::env::set_var("CCQ_HOST_DEVICES", "3");
    std::env::set_var("CCQ_TIMEOUT_MS", "4321");
    let c = Config::new();
    assert_eq!((c.get_host_devices(), c.get_timeout_ms()), (3, 4321));
    assert_eq!(c.env_error(), None);
    assert_eq!(Runtime::new(&c.backend("host")).unwrap().device_count(), 3);
    // The builder overrides the environment.
    assert_eq!(Config::new().host_devices(2).get_host_devices(), 2);

    std::env::set_var("CCQ_MAX_STREAMS", "many");
    let c = Config::new();
    assert!(c.env_error().unwrap().contains("CCQ_MAX_STREAMS"));
    let e = Runtime::new(&c).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.detail().contains("CCQ_MAX_STREAMS"), "{e}");
    std::env::remove_var("CCQ_MAX_STREAMS");

    // The world's variables, and the bootstrap's spec parsed into its variant.
    std::env::set_var("CCQ_WORLD_RANK", "1");
    std::env::set_var("CCQ_WORLD_SIZE", "3");
    std::env::set_var("CCQ_BOOTSTRAP", "file:/tmp/ccq-job");
    let c = Config::new();
    assert_eq!((c.get_world_rank(), c.get_world_size()), (1, 3));
    assert!(matches!(c.get_bootstrap(), Some(Bootstrap::File(d)) if d == std::path::Path::new("/tmp/ccq-job")));
    assert!(Config::new().bootstrap(None).get_bootstrap().is_none());
    std::env::set_var("CCQ_BOOTSTRAP", "mpi");
    assert!(matches!(Config::new().get_bootstrap(), Some(Bootstrap::Mpi)));
    std::env::set_var("CCQ_BOOTSTRAP", "tcp://10.0.0.7:29500");
    assert!(matches!(Config::new().get_bootstrap(), Some(Bootstrap::Tcp(a)) if a == "10.0.0.7:29500"));
    for v in ["CCQ_WORLD_RANK", "CCQ_WORLD_SIZE", "CCQ_BOOTSTRAP"] {
        std::env::remove_var(v);
    }
    assert!(Config::new().get_bootstrap().is_none());

    // torchrun's variables: the world, and the rendezvous at MASTER_ADDR:MASTER_PORT.
    std::env::set_var("RANK", "2");
    std::env::set_var("WORLD_SIZE", "4");
    std::env::set_var("MASTER_ADDR", "node7");
    std::env::set_var("MASTER_PORT", "29501");
    let c = Config::new();
    assert_eq!((c.get_world_rank(), c.get_world_size()), (2, 4));
    assert!(matches!(c.get_bootstrap(), Some(Bootstrap::Tcp(a)) if a == "node7:29501"));
    for v in ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"] {
        std::env::remove_var(v);
    }

    // The host backend's engine.
    assert_eq!(Config::new().get_host_engine(), None);
    std::env::set_var("CCQ_HOST_ENGINE", "mpi");
    assert_eq!(Config::new().get_host_engine(), Some("mpi"));
    assert_eq!(Config::new().host_engine(Some("ucx")).get_host_engine(), Some("ucx"));
    std::env::set_var("CCQ_HOST_ENGINE", "carrier-pigeon");
    let e = Runtime::new(&Config::new()).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.detail().contains("host_engine"), "{e}");
    std::env::remove_var("CCQ_HOST_ENGINE");
}
