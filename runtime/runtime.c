/* The public calls: configuration, runtime lifetime, the submit path and the fence. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>

#include "backends/module.h"
#include "ccq/ccq_nccl.h"
#include "common/env.h"
#include "runtime/boot/bootstrap.h"
#include "runtime/fault.h"
#include "runtime/internal.h"

/* ------------------------------------------------------------------------------------ */
/* Configuration                                                                         */
/* ------------------------------------------------------------------------------------ */

/* An unsigned decimal environment value in [min, max]; false (and *err set) if malformed or
 * out of range, so the message names the variable (not the config field). */
static bool env_u64(const char *name, uint64_t min, uint64_t max, uint64_t *out, const char **err,
                    const char *msg)
{
    int r = ccq_env_u64(name, min, max, out);
    if (r < 0 && *err == NULL)
        *err = msg;
    return r > 0;
}

/* 0.1.0's ccq_config: every field up to and including host_stream_bytes (96 bytes on
 * LP64). Frozen: the old ccq_config_init symbol writes exactly this much, whatever is
 * appended later. */
#define CCQ_CONFIG_SIZE_V0 (offsetof(ccq_config, host_stream_bytes) + sizeof(uint64_t))
_Static_assert(sizeof(void *) != 8 || CCQ_CONFIG_SIZE_V0 == 96, "0.1.0's ccq_config layout moved");
/* The seed API's layout (before host_workers): the smallest struct_size accepted. */
#define CCQ_CONFIG_SIZE_MIN offsetof(ccq_config, host_workers)

static void config_defaults(ccq_config *cfg)
{
    const char *err = NULL;
    const char *b;
    uint64_t v;

    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = sizeof *cfg;
    cfg->backend = "host";
    cfg->host_devices = 4;
    cfg->max_streams = 64;
    cfg->queue_depth = 1024;
    cfg->max_batch_ops = 256;
    cfg->timeout_ms = 600000;
    cfg->host_workers = 0;
    cfg->flags = 0;
    cfg->spin_us = 50;
    cfg->fault = NULL;
    cfg->trace_capacity = 65536;
    cfg->trace_file = NULL;
    cfg->host_stream_bytes = 0;
    cfg->world_rank = 0;
    cfg->world_size = 1;
    cfg->bootstrap = NULL;
    cfg->store = NULL;
    cfg->mpi_comm = -1;
    cfg->heartbeat_ms = CCQ_HEARTBEAT_MS_DEFAULT;
    cfg->heartbeat_timeout_ms = 0; /* 10 x heartbeat_ms */
    cfg->fusion_bytes = CCQ_FUSION_BYTES_DEFAULT;
    cfg->host_engine = NULL;

    b = getenv("CCQ_BACKEND");
    if (b != NULL && *b != '\0')
        cfg->backend = b; /* validated by ccq_runtime_create */
    b = getenv("CCQ_TRACE_FILE");
    if (b != NULL && *b != '\0')
        cfg->trace_file = b;
    if (env_u64("CCQ_TRACE_CAPACITY", 0, 1u << 26, &v, &err,
                "CCQ_TRACE_CAPACITY: expected events in [0, 67108864] (0 = off)"))
        cfg->trace_capacity = (uint32_t)v;
    b = getenv("CCQ_FAULT");
    if (b != NULL && *b != '\0')
        cfg->fault = b; /* parsed by ccq_runtime_create */
    if (env_u64("CCQ_HOST_DEVICES", 1, CCQ_MAX_DEVICES, &v, &err,
                "CCQ_HOST_DEVICES: expected an integer in [1, 1024]"))
        cfg->host_devices = (uint32_t)v;
    if (env_u64("CCQ_MAX_STREAMS", 1, CCQ_MAX_STREAMS_MAX, &v, &err,
                "CCQ_MAX_STREAMS: expected an integer in [1, 65536]"))
        cfg->max_streams = (uint32_t)v;
    if (env_u64("CCQ_QUEUE_DEPTH", 1, CCQ_QUEUE_DEPTH_MAX, &v, &err,
                "CCQ_QUEUE_DEPTH: expected an integer in [1, 1048576]"))
        cfg->queue_depth = (uint32_t)v;
    if (env_u64("CCQ_MAX_BATCH_OPS", 1, CCQ_MAX_BATCH_MAX, &v, &err,
                "CCQ_MAX_BATCH_OPS: expected an integer in [1, 65536]"))
        cfg->max_batch_ops = (uint32_t)v;
    if (env_u64("CCQ_TIMEOUT_MS", 0, UINT64_MAX / 1000000u, &v, &err,
                "CCQ_TIMEOUT_MS: expected a number of milliseconds (0 = none)"))
        cfg->timeout_ms = v;
    if (env_u64("CCQ_HOST_WORKERS", 0, 1024, &v, &err,
                "CCQ_HOST_WORKERS: expected an integer in [0, 1024] (0 = one per core)"))
        cfg->host_workers = (uint32_t)v;
    if (env_u64("CCQ_HOST_STREAM_BYTES", 0, UINT64_MAX, &v, &err,
                "CCQ_HOST_STREAM_BYTES: expected a number of bytes (0 = the default, 64 MiB)"))
        cfg->host_stream_bytes = v;
    if (env_u64("CCQ_SPIN_US", 0, 1000000, &v, &err,
                "CCQ_SPIN_US: expected microseconds in [0, 1000000]"))
        cfg->spin_us = (uint32_t)v;
    if (env_u64("CCQ_TRACE_SIGNAL", 0, 1, &v, &err, "CCQ_TRACE_SIGNAL: expected 0 or 1"))
        cfg->trace_signal = (uint32_t)v;
    if (env_u64("CCQ_CHECK_SIGNATURES", 0, 1, &v, &err, "CCQ_CHECK_SIGNATURES: expected 0 or 1"))
        cfg->check_signatures = (uint32_t)v;
    if (env_u64("CCQ_HEARTBEAT_MS", 0, 3600000, &v, &err,
                "CCQ_HEARTBEAT_MS: expected milliseconds in [0, 3600000] (0 = no heartbeats)"))
        cfg->heartbeat_ms = (uint32_t)v;
    if (env_u64("CCQ_HEARTBEAT_TIMEOUT_MS", 0, 36000000, &v, &err,
                "CCQ_HEARTBEAT_TIMEOUT_MS: expected milliseconds in [0, 36000000] (0 = 10 x "
                "heartbeat_ms)"))
        cfg->heartbeat_timeout_ms = (uint32_t)v;
    if (env_u64("CCQ_NCCL_HIGH_PRIORITY", 0, 1, &v, &err,
                "CCQ_NCCL_HIGH_PRIORITY: expected 0 or 1"))
        cfg->nccl_high_priority = (uint32_t)v;
    if (env_u64("CCQ_FUSION_BYTES", 0, CCQ_FUSION_BYTES_MAX, &v, &err,
                "CCQ_FUSION_BYTES: expected a number of bytes in [0, 2^40] (0 = off)"))
        cfg->fusion_bytes = v;
    if (env_u64("CCQ_NONBLOCKING_SUBMIT", 0, 1, &v, &err,
                "CCQ_NONBLOCKING_SUBMIT: expected 0 or 1"))
        cfg->flags = v ? (cfg->flags | CCQ_FLAG_NONBLOCKING_SUBMIT)
                       : (cfg->flags & ~CCQ_FLAG_NONBLOCKING_SUBMIT);
    /* The world: ccq's own variables, else what the launcher (Open MPI, or a PMI one: MPICH,
     * Intel MPI) sets for every process it starts. */
    ccq_boot_world_from_env(&cfg->world_rank, &cfg->world_size, &err);
    b = getenv("CCQ_BOOTSTRAP");
    if (b != NULL && *b != '\0')
        cfg->bootstrap = b; /* checked by ccq_runtime_create */
    else
        cfg->bootstrap = ccq_boot_spec_from_env(); /* torchrun's MASTER_ADDR:MASTER_PORT */
    b = getenv("CCQ_HOST_ENGINE");
    if (b != NULL && *b != '\0')
        cfg->host_engine = b; /* checked by ccq_runtime_create */
    cfg->env_error = err;
}

#undef ccq_config_init

CCQ_API void ccq_config_init_sized(ccq_config *cfg, size_t size)
{
    ccq_config full;

    if (cfg == NULL || size < CCQ_CONFIG_SIZE_MIN)
        return;
    if (size > sizeof full)
        size = sizeof full; /* a newer caller's fields beyond ours are left alone */
    config_defaults(&full);
    full.struct_size = (uint32_t)size;
    memcpy(cfg, &full, size);
}

/* The 0.1.0 symbol (CCQ_0.1 in ccq.map): its callers' struct is 0.1.0's. */
CCQ_API void ccq_config_init(ccq_config *cfg)
{
    ccq_config_init_sized(cfg, CCQ_CONFIG_SIZE_V0);
}

/* Copy a caller's config of any known size; fields it lacks keep their defaults. */
static ccq_status config_import(const ccq_config *in, ccq_config *out)
{
    config_defaults(out);
    out->struct_size = sizeof *out;
    if (in == NULL)
        return CCQ_OK;
    /* Only the caller's struct_size bytes are read: an older caller's struct is shorter. */
    if (in->struct_size < CCQ_CONFIG_SIZE_MIN || in->struct_size > sizeof *in)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.struct_size is %" PRIu32 "; set it with ccq_config_init()",
                        in->struct_size);
    memcpy(out, in, in->struct_size);
    out->struct_size = sizeof *out;
    /* A caller without env_error never saw the environment's verdict on its fields. */
    if (in->struct_size < offsetof(ccq_config, env_error) + sizeof in->env_error)
        out->env_error = NULL;
    return CCQ_OK;
}

/* Check every field; the fault spec is parsed here, once, into *fault. */
static ccq_status config_validate(const ccq_config *c, ccq_fault_plan *fault)
{
    char ferr[256];

    if (c->env_error != NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "environment: %s", c->env_error);
    if (c->backend == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_config.backend is NULL");
    if (c->host_devices < 1 || c->host_devices > CCQ_MAX_DEVICES)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.host_devices is %" PRIu32 "; expected 1..%u", c->host_devices,
                        CCQ_MAX_DEVICES);
    if (c->max_streams < 1 || c->max_streams > CCQ_MAX_STREAMS_MAX)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.max_streams is %" PRIu32 "; expected 1..%u", c->max_streams,
                        CCQ_MAX_STREAMS_MAX);
    if (c->queue_depth < 1 || c->queue_depth > CCQ_QUEUE_DEPTH_MAX)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.queue_depth is %" PRIu32 "; expected 1..%u", c->queue_depth,
                        CCQ_QUEUE_DEPTH_MAX);
    if (c->max_batch_ops < 1 || c->max_batch_ops > CCQ_MAX_BATCH_MAX)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.max_batch_ops is %" PRIu32 "; expected 1..%u", c->max_batch_ops,
                        CCQ_MAX_BATCH_MAX);
    if (c->timeout_ms > UINT64_MAX / 1000000u)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.timeout_ms is %" PRIu64 "; expected at most %" PRIu64
                        " (or 0 for none)",
                        c->timeout_ms, UINT64_MAX / 1000000u);
    if (c->host_workers > 1024)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.host_workers is %" PRIu32
                        "; expected 0..1024 (0 = one per core)",
                        c->host_workers);
    if (c->trace_signal > 1)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.trace_signal is %" PRIu32 "; expected 0 or 1", c->trace_signal);
    if (c->check_signatures > 1)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.check_signatures is %" PRIu32 "; expected 0 or 1",
                        c->check_signatures);
    if (c->host_engine != NULL && strcmp(c->host_engine, "ucx") != 0 &&
        strcmp(c->host_engine, "mpi") != 0)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.host_engine (CCQ_HOST_ENGINE) is \"%.64s\"; expected \"ucx\", "
                        "\"mpi\" or NULL (ucx when its module loads, else mpi)",
                        c->host_engine);
    if (c->nccl_high_priority > 1)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.nccl_high_priority is %" PRIu32 "; expected 0 or 1",
                        c->nccl_high_priority);
    if (c->fusion_bytes > CCQ_FUSION_BYTES_MAX)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.fusion_bytes is %" PRIu64 "; expected at most %" PRIu64
                        " (0 = off)",
                        c->fusion_bytes, (uint64_t)CCQ_FUSION_BYTES_MAX);
    if (c->trace_capacity > (1u << 26))
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.trace_capacity is %" PRIu32 "; expected at most 67108864",
                        c->trace_capacity);
    if (c->spin_us > 1000000)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.spin_us is %" PRIu32 "; expected at most 1000000", c->spin_us);
    if (c->heartbeat_ms > 3600000)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.heartbeat_ms is %" PRIu32
                        "; expected at most 3600000 (0 = off)",
                        c->heartbeat_ms);
    if (c->heartbeat_timeout_ms > 36000000)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.heartbeat_timeout_ms is %" PRIu32
                        "; expected at most 36000000 (0 = 10 x heartbeat_ms)",
                        c->heartbeat_timeout_ms);
    if (c->heartbeat_ms > 0 && c->heartbeat_timeout_ms > 0 &&
        c->heartbeat_timeout_ms < 2 * c->heartbeat_ms)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.heartbeat_timeout_ms is %" PRIu32
                        " but heartbeat_ms is %" PRIu32
                        ": the timeout must span at least two heartbeats",
                        c->heartbeat_timeout_ms, c->heartbeat_ms);
    if (ccq_fault_parse(c->fault, fault, ferr, sizeof ferr) != 0)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_config.fault (CCQ_FAULT): %s", ferr);
    if (c->flags & ~CCQ_FLAG_NONBLOCKING_SUBMIT)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_config.flags has unknown bits 0x%" PRIx32,
                        c->flags & ~CCQ_FLAG_NONBLOCKING_SUBMIT);
    return CCQ_OK;
}

/* The host backend is part of libccq; "nccl" is a module (libccq-nccl.so), loaded here the
 * first time a runtime asks for it. */
static ccq_status find_backend(const char *name, const ccq_backend_ops **out)
{
    const ccq_module *m;
    ccq_errbuf err;
    ccq_status st;

    *out = NULL;
    if (strcmp(name, "host") == 0) {
        *out = &ccq_host_backend_ops;
        return CCQ_OK;
    }
    if (strcmp(name, "nccl") != 0)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "unknown backend \"%s\" (expected \"host\" or \"nccl\")", name);
    st = ccq_module_get("nccl", "the nccl backend", &m, &err);
    if (st == CCQ_OK && m->backend == NULL)
        return ccq_fail(CCQ_ERR_UNSUPPORTED, "ccq's nccl module has no backend");
    if (st != CCQ_OK)
        return ccq_fail(st, "%s", err.msg);
    *out = m->backend;
    return CCQ_OK;
}

/* ------------------------------------------------------------------------------------ */
/* Runtime lifetime                                                                      */
/* ------------------------------------------------------------------------------------ */

static void runtime_free(ccq_runtime *rt)
{
    uint32_t nstreams = rt->ndev * rt->max_streams;

    /* First the health monitor (its last record says this process left; it must not outlive
     * the scheduler's state or the bootstrap it publishes through). */
    ccq_health_destroy(rt);
    ccq_sched_destroy(rt);
    ccq_trace_fini(&rt->trace);
    ccq_comm_free_all(rt);
    /* The backend before the world: its destroy lets messages this process still owes its
     * peers leave (a rendezvous a peer has yet to fetch from this process's memory), and closing
     * the world's bootstrap first (rank 0's tcp server) told the others this process was gone
     * while they still needed it: their operation then failed as a loss (a survivor of
     * test_host_ucx_kill_fused_np3, 1 run in 150). */
    if (rt->be != NULL)
        rt->be_ops->destroy(rt->be);
    ccq_world_fini(&rt->world);
    if (rt->streams != NULL) {
        for (uint32_t i = 0; i < nstreams; i++)
            ccq_stream_fini(&rt->streams[i]);
        free(rt->streams);
    }
    pthread_mutex_destroy(&rt->comm_lock);
    pthread_mutex_destroy(&rt->bound_lock);
    pthread_mutex_destroy(&rt->shutdown_lock);
    free(rt);
}

/* An engine's word that a peer process failed (job health: runtime/health/). */
static void backend_peer_failed(void *arg, uint32_t world_rank)
{
    ccq_health_peer_failed(arg, world_rank);
}

static void backend_notify(void *arg)
{
    ccq_runtime *rt = arg;
    /* Backends publish completions with an atomic RMW (their done-queue push). */
    ccq_wake_signal(&rt->wake);
}

ccq_status ccq_runtime_create_with(const ccq_config *cfg_in, const ccq_backend_ops *ops,
                                   ccq_runtime **out)
{
    ccq_runtime *rt;
    ccq_config cfg;
    ccq_errbuf err = {{0}};
    ccq_be_hooks hooks;
    ccq_fault_plan fault;
    ccq_status st;
    uint32_t nstreams;

    ccq_clear_detail();
    if (out == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_runtime_create: out is NULL");
    *out = NULL;
    st = config_import(cfg_in, &cfg);
    if (st != CCQ_OK)
        return st;
    st = config_validate(&cfg, &fault);
    if (st != CCQ_OK)
        return st;
    if (ops == NULL && (st = find_backend(cfg.backend, &ops)) != CCQ_OK)
        return st;

    rt = ccq_alloc_lines(sizeof *rt);
    if (rt == NULL)
        return ccq_fail(CCQ_ERR_NO_MEMORY, "out of memory allocating the runtime");
    memset(rt, 0, sizeof *rt);
    rt->cfg = cfg;
    rt->cfg.env_error = NULL;
    rt->be_ops = ops;
    pthread_mutex_init(&rt->comm_lock, NULL);
    pthread_mutex_init(&rt->bound_lock, NULL);
    atomic_init(&rt->bound_head, NULL);
    pthread_mutex_init(&rt->shutdown_lock, NULL);
    ccq_wake_init(&rt->wake);
    ccq_signal_init(&rt->exit_ev);
    ccq_mpsc_init(&rt->new_streams);
    ccq_mpsc_init(&rt->comm_reqs);
    atomic_init(&rt->closing, 0);
    atomic_init(&rt->sched_exited, 0);
    atomic_init(&rt->ncomms, 0);
    for (int i = 0; i < CCQ_COMM_BUCKETS; i++)
        atomic_init(&rt->buckets[i], NULL);
    rt->timeout_ns = cfg.timeout_ms == 0 ? UINT64_MAX : cfg.timeout_ms * 1000000ull;
    rt->spin_ns = (uint64_t)cfg.spin_us * 1000u;
    atomic_init(&rt->engine_polling, 0);
    {
        /* Measurements only (docs/performance.md): fence waiters spin even while the
         * scheduler busy-polls an engine. */
        const char *fs = getenv("CCQ_FENCE_SPIN");
        rt->fence_spin_always = fs != NULL && strcmp(fs, "1") == 0;
    }
    rt->fault = fault;
    if (ccq_trace_init(&rt->trace, cfg.trace_capacity, cfg.trace_file) != 0) {
        ccq_trace_fini(&rt->trace);
        pthread_mutex_destroy(&rt->comm_lock);
        pthread_mutex_destroy(&rt->bound_lock);
        pthread_mutex_destroy(&rt->shutdown_lock);
        free(rt);
        return ccq_fail(CCQ_ERR_NO_MEMORY,
                        "out of memory for the flight recorder "
                        "(trace_capacity = %u)",
                        cfg.trace_capacity);
    }
    rt->ring_size = ccq_ring_size(cfg.queue_depth);

    hooks.notify = backend_notify;
    hooks.notify_arg = rt;
    hooks.peer_failed = backend_peer_failed;
    st = ops->create(&rt->cfg, &hooks, &rt->be, &err);
    if (st != CCQ_OK) {
        rt->be = NULL;
        runtime_free(rt);
        return ccq_fail(st, "backend \"%s\": %s", ops->name, err.msg);
    }
    /* Fault injection's fail and delay act between the scheduler and any backend. */
    if (ccq_fault_wrap(&rt->fault, &rt->be_ops, &rt->be) != CCQ_OK) {
        runtime_free(rt);
        return ccq_fail(CCQ_ERR_NO_MEMORY, "out of memory setting up fault injection");
    }
    rt->ndev = rt->be_ops->device_count(rt->be);
    /* Meet the other processes (a world of one needs nobody) and learn the global ids; the
     * backend's blob (the UCX engine's worker address) travels with the meeting. A backend
     * that cannot give one still meets: world_ready then says why it cannot span. */
    {
        unsigned char *blob = NULL;
        size_t blen = 0;
        if (cfg.world_size > 1 && rt->be_ops->world_blob != NULL &&
            (blob = malloc(CCQ_BE_WORLD_BLOB_MAX)) != NULL) {
            ccq_errbuf berr = {{0}};
            blen = CCQ_BE_WORLD_BLOB_MAX;
            if (rt->be_ops->world_blob(rt->be, blob, &blen, &berr) != CCQ_OK)
                blen = 0;
        }
        st = ccq_world_setup(&rt->world, &rt->cfg, rt->be_ops->name, rt->ndev, blob, blen,
                             rt->timeout_ns);
        free(blob);
    }
    if (st != CCQ_OK) {
        char why[CCQ_DETAIL_LEN];
        snprintf(why, sizeof why, "%s", ccq_last_error_detail());
        runtime_free(rt);
        return ccq_fail(st, "%s", why);
    }
    rt->dev_first = rt->world.first[rt->world.rank];
    if (rt->world.size > 1 && rt->be_ops->world_ready != NULL) {
        ccq_errbuf werr = {{0}};
        rt->span_status =
            rt->be_ops->world_ready(rt->be, rt->world.rank, rt->world.size, rt->world.crowded,
                                    rt->world.blob, rt->world.blob_len, &werr);
        snprintf(rt->span_detail, sizeof rt->span_detail, "%s", werr.msg);
    }
    ccq_world_drop_blobs(&rt->world);
    rt->procs_fit_cores = rt->world.size > 1 && !rt->world.crowded;
    {
        /* Batches across processes (backend.h, span_batch_ops), only where this host's
         * processes do not outnumber their cores: 4 x 1 on 2 cores ran a DDP step 0.72-0.79x as
         * fast capped (each cut is one more meeting of 4 processes that take turns on the
         * cores). CCQ_SPAN_BATCH_OPS sets it anyway (0 = no cap; malformed: ignored). */
        uint64_t v;
        if (ccq_env_u64("CCQ_SPAN_BATCH_OPS", 0, CCQ_MAX_BATCH_MAX, &v) == 1)
            rt->span_batch_ops = (uint32_t)v;
        else if (rt->procs_fit_cores)
            rt->span_batch_ops = rt->be_ops->span_batch_ops;
    }
    {
        /* The scheduler's own core (common/cores.h, ccq_core_pin): CCQ_SCHED_PIN=1 (the
         * default) where this host's processes outnumber their cores, 2 even where they do not
         * (measurements), 0 never; and never where the scheduler calls MPI (the MPI engine or
         * bootstrap: Open MPI on an oversubscribed node yields the core in every progress call,
         * and pinned, each yield waited out its core's other threads while the process's MPI
         * lock was held: docs/performance.md, "Each scheduler on a core of its own").
         * CCQ_SCHED_PIN_BYTES the operation size from which a batch runs unpinned (default
         * 1 MiB: 4 x 1 on 2 cores, 8 MiB ran 0.87x as fast pinned, 2 MiB even). */
        uint64_t v = 0;
        int pin = ccq_env_u64("CCQ_SCHED_PIN", 0, 2, &v) == 1 ? (int)v : 1;
        bool calls_mpi =
            (rt->be_ops->calls_mpi != NULL && rt->be_ops->calls_mpi(rt->be)) ||
            (rt->world.boot != NULL && strcmp(ccq_boot_name(rt->world.boot), "mpi") == 0);
        rt->pin = false;
        rt->pin_home = -1;
        if (rt->world.size > 1 && rt->world.procs != NULL && !calls_mpi &&
            (pin == 2 || (pin == 1 && rt->world.crowded))) {
            rt->pin = true;
            rt->pin_home = ccq_world_home_core(rt->world.procs, rt->world.size, rt->world.rank);
        }
        rt->pin_bytes = ccq_env_u64("CCQ_SCHED_PIN_BYTES", 1, UINT64_MAX, &v) == 1
                            ? v
                            : CCQ_SCHED_PIN_BYTES_DEFAULT;
    }
    if (rt->fault.lag_us > 0 && rt->world.boot != NULL)
        ccq_boot_fault_lag(rt->world.boot, (uint64_t)rt->fault.lag_us * 1000u);
    rt->ndev_world = rt->world.first[rt->world.size];
    if (rt->fault.drop_rank >= (int64_t)rt->ndev_world) {
        ccq_status bad = ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                                  "ccq_config.fault (CCQ_FAULT): drop:rank=%" PRId64
                                  " is not a device (%u devices)",
                                  rt->fault.drop_rank, rt->ndev_world);
        runtime_free(rt);
        return bad;
    }
    rt->max_streams = cfg.max_streams;
    nstreams = rt->ndev * rt->max_streams;
    rt->streams = ccq_alloc_lines((size_t)nstreams * sizeof *rt->streams);
    if (rt->streams == NULL) {
        runtime_free(rt);
        return ccq_fail(CCQ_ERR_NO_MEMORY, "out of memory allocating %u streams", nstreams);
    }
    for (uint32_t i = 0; i < nstreams; i++)
        ccq_stream_init(&rt->streams[i], rt->dev_first + i / rt->max_streams, i % rt->max_streams,
                        i);
    st = ccq_sched_create(rt);
    if (st != CCQ_OK) {
        runtime_free(rt);
        return ccq_fail(st, "out of memory creating the scheduler");
    }
    /* Every process runs job health alike (ccq_world_heartbeat): rt->cfg is this runtime's
     * copy, read by job health from here on. */
    if (rt->world.size > 1 && rt->world.procs != NULL)
        ccq_world_heartbeat(rt->world.procs, rt->world.size, &rt->cfg.heartbeat_ms,
                            &rt->cfg.heartbeat_timeout_ms);
    st = ccq_health_create(rt); /* the process table (a world of several) */
    if (st != CCQ_OK) {
        char why[CCQ_DETAIL_LEN];
        snprintf(why, sizeof why, "%s", ccq_last_error_detail());
        runtime_free(rt);
        return ccq_fail(st, "%s", why);
    }
    if (pthread_create(&rt->thread, NULL, ccq_sched_main, rt) != 0) {
        runtime_free(rt);
        return ccq_fail(CCQ_ERR_NO_MEMORY, "cannot start the scheduler thread");
    }
    rt->thread_started = true;
    st = ccq_trace_attach(rt, cfg.trace_signal != 0); /* SIGUSR1 dumps (runtime/trace/signal.c) */
    if (st == CCQ_OK)
        st = ccq_health_start(rt); /* heartbeats (runtime/health/) */
    if (st != CCQ_OK) {
        char why[CCQ_DETAIL_LEN];
        snprintf(why, sizeof why, "%s", ccq_last_error_detail());
        ccq_runtime_destroy(rt);
        return ccq_fail(st, "%s", why);
    }
    *out = rt;
    return CCQ_OK;
}

CCQ_API ccq_status ccq_runtime_create(const ccq_config *cfg, ccq_runtime **out)
{
    return ccq_runtime_create_with(cfg, NULL, out);
}

static bool sched_exited(void *arg)
{
    ccq_runtime *rt = arg;
    return atomic_load_explicit(&rt->sched_exited, memory_order_acquire) != 0;
}

CCQ_API ccq_status ccq_runtime_shutdown(ccq_runtime *rt)
{
    uint32_t nstreams;

    if (rt == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_runtime_shutdown: rt is NULL");
    ccq_clear_detail();
    if (ccq_tls_inside != 0)
        return ccq_refuse_inside("ccq_runtime_shutdown");
    pthread_mutex_lock(&rt->shutdown_lock);
    if (!atomic_load_explicit(&rt->closing, memory_order_relaxed)) {
        /* Close every stream first: a submitter either got its ticket before this (and
         * will push; the scheduler waits for exactly those) or sees the closed bit. */
        nstreams = rt->ndev * rt->max_streams;
        for (uint32_t i = 0; i < nstreams; i++)
            ccq_stream_close(&rt->streams[i]);
        atomic_store_explicit(&rt->closing, 1, memory_order_release);
        ccq_wake_signal_fenced(&rt->wake);
    }
    pthread_mutex_unlock(&rt->shutdown_lock);
    ccq_signal_wait(&rt->exit_ev, sched_exited, rt, UINT64_MAX);
    return CCQ_OK;
}

CCQ_API ccq_status ccq_runtime_destroy(ccq_runtime *rt)
{
    if (rt == NULL)
        return CCQ_OK;
    ccq_clear_detail();
    if (ccq_tls_inside != 0)
        return ccq_refuse_inside("ccq_runtime_destroy");
    ccq_runtime_shutdown(rt);
    if (rt->thread_started)
        pthread_join(rt->thread, NULL);
    ccq_trace_autodump(rt, "destroy"); /* trace_file: the whole story, at the end */
    runtime_free(rt);
    return CCQ_OK;
}

CCQ_API uint32_t ccq_device_count(const ccq_runtime *rt)
{
    return rt == NULL ? 0 : rt->ndev_world;
}

CCQ_API uint32_t ccq_world_rank(const ccq_runtime *rt)
{
    return rt == NULL ? 0 : rt->world.rank;
}

CCQ_API uint32_t ccq_world_size(const ccq_runtime *rt)
{
    return rt == NULL ? 0 : rt->world.size;
}

CCQ_API ccq_status ccq_local_devices(const ccq_runtime *rt, ccq_device_id *first, uint32_t *count)
{
    ccq_clear_detail();
    if (rt == NULL || first == NULL || count == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_local_devices: %s is NULL",
                        rt == NULL      ? "rt"
                        : first == NULL ? "first"
                                        : "count");
    *first = rt->dev_first;
    *count = rt->ndev;
    return CCQ_OK;
}

CCQ_API const char *ccq_backend_name(const ccq_runtime *rt)
{
    return rt == NULL ? "" : rt->be_ops->name;
}

/* ------------------------------------------------------------------------------------ */
/* Argument checks shared by the calls                                                   */
/* ------------------------------------------------------------------------------------ */

/* Sort and check a device set into `out` (n <= ndev). */
static ccq_status normalize_set(const ccq_runtime *rt, const char *fn, const ccq_device_id *devices,
                                size_t n, ccq_device_id *out)
{
    if (devices == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "%s: devices is NULL", fn);
    if (n == 0)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "%s: the device set is empty (n == 0)", fn);
    if (n > rt->ndev_world)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "%s: %zu devices given but the runtime has %u (duplicates?)", fn, n,
                        rt->ndev_world);
    for (size_t i = 0; i < n; i++) {
        ccq_device_id d = devices[i];
        size_t j = i;
        if (d >= rt->ndev_world)
            return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                            "%s: devices[%zu] = %u does not exist (%u devices)", fn, i, d,
                            rt->ndev_world);
        /* Insertion sort: sets are small, and this keeps the call allocation-free. */
        while (j > 0 && out[j - 1] > d) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = d;
    }
    for (size_t i = 1; i < n; i++)
        if (out[i] == out[i - 1])
            return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "%s: device %u appears twice in the set", fn,
                            out[i]);
    return CCQ_OK;
}

/* Whether a sorted set holds one of this process's devices (its ids are contiguous). */
static bool set_has_local(const ccq_runtime *rt, const ccq_device_id *sorted, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ccq_is_local(rt, sorted[i]))
            return true;
    return false;
}

typedef struct comm_wait {
    ccq_runtime *rt;
    ccq_comm *c;
} comm_wait;

/* Ready, failed, or never going to be created (the scheduler has exited). */
static bool comm_settled(void *arg)
{
    comm_wait *w = arg;
    return atomic_load_explicit(&w->c->state, memory_order_acquire) != CCQ_COMM_PENDING ||
           atomic_load_explicit(&w->rt->sched_exited, memory_order_acquire);
}

static ccq_status comm_status(ccq_comm *c, const char *fn)
{
    char set[128];
    if (atomic_load_explicit(&c->aborted, memory_order_acquire)) {
        ccq_describe_comm(set, sizeof set, c);
        if (atomic_load_explicit(&c->lost, memory_order_acquire))
            return ccq_fail(CCQ_ERR_PROCESS_LOST, "%s: communicator %s lost a member process: %s",
                            fn, set, c->lost_detail);
        return ccq_fail(CCQ_ERR_ABORTED, "%s: communicator %s was aborted: %s", fn, set,
                        c->init_detail);
    }
    if (atomic_load_explicit(&c->state, memory_order_acquire) == CCQ_COMM_FAILED) {
        ccq_describe_comm(set, sizeof set, c);
        return ccq_fail(c->init_status, "%s: communicator %s could not be created: %s", fn, set,
                        c->init_detail);
    }
    return CCQ_OK;
}

CCQ_API ccq_status ccq_comm_init(ccq_runtime *rt, const ccq_device_id *devices, size_t n)
{
    ccq_device_id sorted[CCQ_MAX_DEVICES];
    ccq_comm *c;
    ccq_status st;
    uint64_t deadline;

    ccq_clear_detail();
    if (rt == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_comm_init: rt is NULL");
    if (ccq_tls_inside != 0)
        return ccq_refuse_inside("ccq_comm_init");
    st = normalize_set(rt, "ccq_comm_init", devices, n, sorted);
    if (st != CCQ_OK)
        return st;
    if (atomic_load_explicit(&rt->closing, memory_order_acquire))
        return ccq_fail(CCQ_ERR_SHUTDOWN, "ccq_comm_init: the runtime is shutting down");
    if (!set_has_local(rt, sorted, n))
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_comm_init: this process (world rank %u, devices %u..%u) owns no "
                        "device of the set; only the processes that own its devices call it",
                        rt->world.rank, rt->dev_first, rt->dev_first + rt->ndev - 1);
    /* A set with a lost process's device never forms again (runtime/health/). */
    st = ccq_health_check_set(rt, "ccq_comm_init", sorted, (uint32_t)n);
    if (st != CCQ_OK)
        return st;
    st = ccq_comm_get_or_create(rt, sorted, (uint32_t)n, &c);
    if (st != CCQ_OK)
        return st;
    ccq_comm_request_init(rt, c);
    /* The scheduler fails a communicator that did not form within timeout_ms, naming the
     * processes that never joined; the grace lets that verdict arrive first. */
    deadline = ccq_deadline_in(ccq_add_sat(rt->timeout_ns, rt->timeout_ns / 4 + 100000000ull));
    comm_wait w = {rt, c};
    if (!ccq_signal_wait_spin(&c->ev, comm_settled, &w, deadline, rt->spin_ns))
        return ccq_fail(CCQ_ERR_TIMEOUT, "ccq_comm_init: the backend did not create the "
                                         "communicator within timeout_ms");
    if (atomic_load_explicit(&c->state, memory_order_acquire) == CCQ_COMM_PENDING)
        return ccq_fail(CCQ_ERR_SHUTDOWN, "ccq_comm_init: the runtime shut down before the "
                                          "communicator could be created");
    return comm_status(c, "ccq_comm_init");
}

/* ------------------------------------------------------------------------------------ */
/* The submit path                                                                       */
/* ------------------------------------------------------------------------------------ */

typedef struct submit_args {
    uint8_t kind;
    ccq_device_id device;
    ccq_stream_id stream;
    const void *src;
    void *dst;
    size_t count;
    ccq_dtype dtype;
    ccq_reduce_op op;
    ccq_device_id peer; /* send/recv: the other device; rooted collectives: the root */
} submit_args;

/* The buffers a part uses: not NULL when they hold bytes, and not overlapping except at
 * the one in-place position NCCL defines for the kind (see ccq.h). */
static ccq_status check_buffers(const char *fn, const ccq_kind_info *k, const submit_args *a,
                                size_t esize, uint32_t n, uint32_t rank, uint32_t root)
{
    bool is_root = rank == root;
    size_t sb = ccq_kind_src_bytes(a->kind, a->count, esize, n, is_root);
    size_t db = ccq_kind_dst_bytes(a->kind, a->count, esize, n, is_root);
    size_t block = a->count * esize; /* one rank's block */
    uintptr_t s0 = (uintptr_t)a->src, d0 = (uintptr_t)a->dst;

    if (sb > 0 && a->src == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "%s: src is NULL", fn);
    if (db > 0 && a->dst == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "%s: dst is NULL", fn);
    if (sb == 0 || db == 0 || !(s0 < d0 + db && d0 < s0 + sb))
        return CCQ_OK;
    /* The one in-place position of the kind (common/kinds.h), in bytes from the other. */
    switch (k->inplace) {
    case CCQ_INPLACE_SAME:
        if (s0 == d0)
            return CCQ_OK;
        break;
    case CCQ_INPLACE_SRC_AT_RANK:
        if (s0 == d0 + rank * block)
            return CCQ_OK;
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "%s: src and dst overlap (in place needs %s; rank %u)", fn, k->inplace_rule,
                        rank);
    case CCQ_INPLACE_DST_AT_RANK:
        if (d0 == s0 + rank * block)
            return CCQ_OK;
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "%s: src and dst overlap (in place needs %s; rank %u)", fn, k->inplace_rule,
                        rank);
    case CCQ_INPLACE_SRC_AT_ROOT:
        if (s0 == d0 + root * block)
            return CCQ_OK;
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "%s: src and dst overlap (in place needs %s; root rank %u)", fn,
                        k->inplace_rule, root);
    case CCQ_INPLACE_DST_AT_ROOT:
        if (d0 == s0 + root * block)
            return CCQ_OK;
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "%s: src and dst overlap (in place needs %s; root rank %u)", fn,
                        k->inplace_rule, root);
    default:
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "%s: src and dst overlap (%s has no in-place form)", fn, k->name);
    }
    return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "%s: src and dst overlap (in place needs %s)", fn,
                    k->inplace_rule);
}

static ccq_status submit(ccq_runtime *rt, const char *fn, const submit_args *a,
                         const ccq_device_id *devices, size_t n)
{
    ccq_device_id sorted[CCQ_MAX_DEVICES];
    ccq_comm *comm = NULL;
    ccq_stream *s;
    ccq_cmd *ring, *c;
    ccq_be_submit be_sub;
    ccq_status st;
    const ccq_kind_info *k = &ccq_kinds[a->kind];
    size_t esize;
    uint32_t nset, rank = 0, root = 0, chan = 0, part = 0;
    uint64_t t = 0, seq;
    _Atomic uint64_t *counter = NULL;

    ccq_clear_detail();
    if (rt == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "%s: rt is NULL", fn);
    st = ccq_check_stream(rt, fn, a->device, a->stream);
    if (st != CCQ_OK)
        return st;
    esize = ccq_dtype_size(a->dtype);
    if (esize == 0)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "%s: invalid dtype %d", fn, (int)a->dtype);
    if (k->reduces && (unsigned)a->op >= CCQ_REDUCE_OP_COUNT_)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "%s: invalid reduce op %d", fn, (int)a->op);
    if (a->count > SIZE_MAX / esize || a->count * esize > (size_t)PTRDIFF_MAX)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "%s: count %zu of %s overflows the address space",
                        fn, a->count, ccq_dtype_name(a->dtype));

    /* Refuse early once shutdown has begun, before the communicator lookup can give a
     * less useful answer; reserve_ticket() checks again, race-free. */
    if (atomic_load_explicit(&rt->closing, memory_order_acquire))
        return ccq_fail(CCQ_ERR_SHUTDOWN, "%s: the runtime is shutting down", fn);

    /* The communicator and this device's rank in it. */
    if (k->collective) {
        st = normalize_set(rt, fn, devices, n, sorted);
        if (st != CCQ_OK)
            return st;
        nset = (uint32_t)n;
        while (rank < nset && sorted[rank] != a->device)
            rank++;
        if (rank == nset)
            return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                            "%s: device %u is not in the device set it submits to", fn, a->device);
        if (k->rooted) {
            while (root < nset && sorted[root] != a->peer)
                root++;
            if (root == nset)
                return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                                "%s: root device %u is not in the device set", fn, a->peer);
        }
        if ((k->src_n || k->dst_n) && a->count * esize > (size_t)PTRDIFF_MAX / nset)
            return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                            "%s: count %zu x %u ranks of %s overflows the address space", fn,
                            a->count, nset, ccq_dtype_name(a->dtype));
        comm = ccq_comm_lookup(rt, sorted, nset);
        if (comm == NULL) {
            char set[128];
            size_t w = ccq_format(set, sizeof set, "{");
            for (uint32_t i = 0; i < nset && w < sizeof set; i++)
                w += ccq_format(set + w, sizeof set - w, i ? ",%u" : "%u", sorted[i]);
            ccq_format(set + w, sizeof set - w, "}");
            return ccq_fail(CCQ_ERR_NOT_INITIALIZED,
                            "%s: no communicator for device set %s; call ccq_comm_init first", fn,
                            set);
        }
        chan = CCQ_CHAN_COLL;
        part = rank - comm->first_local; /* its index among this process's parts */
        counter = &comm->coll_seq[rank].v;
    } else {
        ccq_device_id self = a->device, peer = a->peer;
        if (peer >= rt->ndev_world)
            return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                            "%s: peer device %u does not exist (%u devices)", fn, peer,
                            rt->ndev_world);
        nset = self == peer ? 1 : 2;
        sorted[0] = self < peer ? self : peer;
        sorted[1] = self < peer ? peer : self;
        rank = self == sorted[0] ? 0 : 1;
    }
    st = check_buffers(fn, k, a, esize, nset, rank, root);
    if (st != CCQ_OK)
        return st;
    if (!k->collective) {
        st = ccq_comm_get_or_create(rt, sorted, nset, &comm);
        if (st != CCQ_OK)
            return st;
        ccq_comm_request_init(rt, comm);
        /* Direction: from the sender's rank to the receiver's. */
        uint32_t from = a->kind == CCQ_KIND_SEND ? rank : (a->peer == sorted[0] ? 0 : 1);
        uint32_t dir = nset == 1 ? 0 : from;
        chan = CCQ_CHAN_P2P0 + dir;
        /* A pair inside this process has both halves (send first); a pair with another
         * process's device has only this one. */
        part = comm->nlocal == nset && a->kind == CCQ_KIND_RECV ? 1 : 0;
        counter = a->kind == CCQ_KIND_SEND ? &comm->p2p_send[dir].v : &comm->p2p_recv[dir].v;
    }
    st = comm_status(comm, fn);
    if (st != CCQ_OK)
        return st;
    be_sub.device = ccq_backend_device(rt, a->device);
    be_sub.stream_index = be_sub.device * rt->max_streams + a->stream;
    be_sub.kind = a->kind;
    be_sub.dtype = (uint8_t)a->dtype;
    be_sub.redop = (uint8_t)a->op;
    be_sub.devices = sorted + comm->first_local;
    be_sub.ndevices = comm->nlocal;
    be_sub.device_first = rt->dev_first;
    /* The backend's handle once formed (set before the state is published READY). */
    be_sub.comm = atomic_load_explicit(&comm->state, memory_order_acquire) == CCQ_COMM_READY
                      ? comm->be
                      : NULL;
    if (rt->be_ops->check != NULL) {
        ccq_errbuf err = {{0}};
        st = rt->be_ops->check(rt->be, &be_sub, &err);
        if (st != CCQ_OK)
            return ccq_fail(st, "%s: %s", fn, err.msg);
    }

    s = ccq_stream_at(rt, a->device, a->stream);
    ring = ccq_stream_ring(rt, s);
    if (ring == NULL)
        return ccq_fail(CCQ_ERR_NO_MEMORY, "%s: out of memory allocating the stream's queue", fn);
    st = ccq_stream_reserve(rt, s, fn, &t);
    if (st != CCQ_OK)
        return st;

    /* From here on the command is accepted: nothing may fail. */
    c = &ring[t & (rt->ring_size - 1)];
    /* Claim the slot with an atomic exchange. It is free unless a producer holding an
     * older ticket for the same slot was preempted between its ticket and its claim while
     * queue_depth newer commands went through (or that older command is still queued):
     * then whoever claims first uses it, and the other waits until it ends, which the
     * watchdog bounds. A plain load + store here would let both fill the same slot. */
    while (atomic_exchange_explicit(&c->busy, 1, memory_order_acquire) != 0)
        sched_yield();
    c->kind = a->kind;
    c->dtype = (uint8_t)a->dtype;
    c->redop = (uint8_t)a->op;
    c->chan = (uint8_t)chan;
    c->part = part;
    c->rank = rank;
    c->root = root;
    c->device = a->device;
    c->peer = a->peer;
    c->count = a->count;
    c->src = a->src;
    c->dst = a->dst;
    c->comm = comm;
    c->stream = s;
    c->submit_ns = ccq_now_ns();
    c->thread = ccq_thread_id();
    c->pre_status = CCQ_OK;
    c->pre_detail = NULL;
    if (rt->be_ops->submit != NULL) {
        ccq_errbuf err = {{0}};
        be_sub.slot = c->slot;
        c->pre_status = rt->be_ops->submit(rt->be, &be_sub, &err);
        if (c->pre_status != CCQ_OK)
            c->pre_detail = strdup(err.msg);
    }
    /* After its event was recorded on the bound stream: the GPU-side waits queued there
     * before it, which the scheduler must respect (runtime/gpu_wait.h). */
    c->gw_mark = ccq_gw_mark(s);
    seq = atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
    c->seq = seq;
    ccq_mpsc_push_mpsc(&s->q, &c->qnode);
    ccq_wake_signal(&rt->wake);
    return CCQ_OK;
}

CCQ_API ccq_status ccq_all_reduce(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                  const void *src, void *dst, size_t count, ccq_dtype dtype,
                                  ccq_reduce_op op, const ccq_device_id *devices, size_t n)
{
    submit_args a = {CCQ_KIND_ALL_REDUCE, device, stream, src, dst, count, dtype, op, 0};
    return submit(rt, "ccq_all_reduce", &a, devices, n);
}

CCQ_API ccq_status ccq_broadcast(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                 const void *src, void *dst, size_t count, ccq_dtype dtype,
                                 ccq_device_id root, const ccq_device_id *devices, size_t n)
{
    submit_args a = {CCQ_KIND_BROADCAST, device, stream, src, dst, count, dtype, CCQ_SUM, root};
    return submit(rt, "ccq_broadcast", &a, devices, n);
}

CCQ_API ccq_status ccq_reduce(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                              const void *src, void *dst, size_t count, ccq_dtype dtype,
                              ccq_reduce_op op, ccq_device_id root, const ccq_device_id *devices,
                              size_t n)
{
    submit_args a = {CCQ_KIND_REDUCE, device, stream, src, dst, count, dtype, op, root};
    return submit(rt, "ccq_reduce", &a, devices, n);
}

CCQ_API ccq_status ccq_all_gather(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                  const void *src, void *dst, size_t count, ccq_dtype dtype,
                                  const ccq_device_id *devices, size_t n)
{
    submit_args a = {CCQ_KIND_ALL_GATHER, device, stream, src, dst, count, dtype, CCQ_SUM, 0};
    return submit(rt, "ccq_all_gather", &a, devices, n);
}

CCQ_API ccq_status ccq_reduce_scatter(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                      const void *src, void *dst, size_t count, ccq_dtype dtype,
                                      ccq_reduce_op op, const ccq_device_id *devices, size_t n)
{
    submit_args a = {CCQ_KIND_REDUCE_SCATTER, device, stream, src, dst, count, dtype, op, 0};
    return submit(rt, "ccq_reduce_scatter", &a, devices, n);
}

CCQ_API ccq_status ccq_all_to_all(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                  const void *src, void *dst, size_t count, ccq_dtype dtype,
                                  const ccq_device_id *devices, size_t n)
{
    submit_args a = {CCQ_KIND_ALL_TO_ALL, device, stream, src, dst, count, dtype, CCQ_SUM, 0};
    return submit(rt, "ccq_all_to_all", &a, devices, n);
}

CCQ_API ccq_status ccq_gather(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                              const void *src, void *dst, size_t count, ccq_dtype dtype,
                              ccq_device_id root, const ccq_device_id *devices, size_t n)
{
    submit_args a = {CCQ_KIND_GATHER, device, stream, src, dst, count, dtype, CCQ_SUM, root};
    return submit(rt, "ccq_gather", &a, devices, n);
}

CCQ_API ccq_status ccq_scatter(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                               const void *src, void *dst, size_t count, ccq_dtype dtype,
                               ccq_device_id root, const ccq_device_id *devices, size_t n)
{
    submit_args a = {CCQ_KIND_SCATTER, device, stream, src, dst, count, dtype, CCQ_SUM, root};
    return submit(rt, "ccq_scatter", &a, devices, n);
}

CCQ_API ccq_status ccq_send(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                            const void *src, size_t count, ccq_dtype dtype, ccq_device_id peer)
{
    submit_args a = {CCQ_KIND_SEND, device, stream, src, NULL, count, dtype, CCQ_SUM, peer};
    return submit(rt, "ccq_send", &a, NULL, 0);
}

CCQ_API ccq_status ccq_recv(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream, void *dst,
                            size_t count, ccq_dtype dtype, ccq_device_id peer)
{
    submit_args a = {CCQ_KIND_RECV, device, stream, NULL, dst, count, dtype, CCQ_SUM, peer};
    return submit(rt, "ccq_recv", &a, NULL, 0);
}

/* ------------------------------------------------------------------------------------ */
/* Counters                                                                              */
/* ------------------------------------------------------------------------------------ */

CCQ_API ccq_status ccq_get_stats(ccq_runtime *rt, ccq_stats *out)
{
    ccq_stats st;
    uint32_t nstreams;
    uint64_t ended;

    if (rt == NULL || out == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_get_stats: %s is NULL",
                        rt == NULL ? "rt" : "out");
    if (out->struct_size < offsetof(ccq_stats, batch_size_hist) || out->struct_size > sizeof *out)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_get_stats: out->struct_size is %u; set it to sizeof(ccq_stats)",
                        out->struct_size);
    memset(&st, 0, sizeof st);
    st.struct_size = out->struct_size;
    /* Ends first, submissions last, so pending never reads negative. */
    st.completed = atomic_load_explicit(&rt->stats.completed, memory_order_acquire);
    st.failed = atomic_load_explicit(&rt->stats.failed, memory_order_acquire);
    st.cancelled = atomic_load_explicit(&rt->stats.cancelled, memory_order_acquire);
    st.batches = atomic_load_explicit(&rt->stats.batches, memory_order_relaxed);
    st.batched_ops = atomic_load_explicit(&rt->stats.batched_ops, memory_order_relaxed);
    st.max_batch_ops = atomic_load_explicit(&rt->stats.max_batch_ops, memory_order_relaxed);
    for (int i = 0; i < 8; i++)
        st.batch_size_hist[i] = atomic_load_explicit(&rt->stats.hist[i], memory_order_relaxed);
    ended = st.completed + st.failed + st.cancelled;
    nstreams = rt->ndev * rt->max_streams;
    for (uint32_t i = 0; i < nstreams; i++)
        st.submitted += atomic_load_explicit(&rt->streams[i].tickets, memory_order_acquire) &
                        ~CCQ_TICKET_CLOSED;
    st.pending = st.submitted > ended ? st.submitted - ended : 0;
    memcpy(out, &st, out->struct_size);
    return CCQ_OK;
}

/* ------------------------------------------------------------------------------------ */
/* Backend interop                                                                       */
/* ------------------------------------------------------------------------------------ */

CCQ_API ccq_status ccq_nccl_bind_stream(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                        struct CUstream_st *cuda_stream)
{
    ccq_errbuf err = {{0}};
    ccq_stream *s;
    ccq_status st;

    ccq_clear_detail();
    if (rt == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_nccl_bind_stream: rt is NULL");
    if (strcmp(rt->be_ops->name, "nccl") != 0 || rt->be_ops->bind_stream == NULL)
        return ccq_fail(CCQ_ERR_UNSUPPORTED,
                        "ccq_nccl_bind_stream: the runtime's backend is \"%s\", not \"nccl\"",
                        rt->be_ops->name);
    st = ccq_check_stream(rt, "ccq_nccl_bind_stream", device, stream);
    if (st != CCQ_OK)
        return st;
    s = ccq_stream_at(rt, device, stream);
    if (ccq_stream_outstanding(s) != 0)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_nccl_bind_stream: device %u stream %u has commands outstanding; "
                        "bind before submitting or after a fence",
                        device, stream);
    st = rt->be_ops->bind_stream(rt->be, ccq_backend_device(rt, device), s->index, cuda_stream,
                                 &err);
    if (st != CCQ_OK)
        return ccq_fail(st, "ccq_nccl_bind_stream: %s", err.msg);
    return ccq_gw_bind(rt, s, cuda_stream);
}

/* ------------------------------------------------------------------------------------ */
/* Device memory for tools and tests                                                     */
/* ------------------------------------------------------------------------------------ */

CCQ_API ccq_status ccq_mem_alloc(ccq_runtime *rt, ccq_device_id device, size_t bytes, void **out)
{
    ccq_errbuf err = {{0}};
    ccq_status st;

    ccq_clear_detail();
    if (out == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_mem_alloc: out is NULL");
    *out = NULL;
    if (rt == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_mem_alloc: rt is NULL");
    if (ccq_check_device(rt, "ccq_mem_alloc", device) != CCQ_OK)
        return CCQ_ERR_INVALID_ARGUMENT;
    if (bytes > (size_t)PTRDIFF_MAX / 2)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_mem_alloc: bytes = %zu is too large", bytes);
    st = rt->be_ops->mem_alloc(rt->be, ccq_backend_device(rt, device), bytes, out, &err);
    return st == CCQ_OK ? CCQ_OK : ccq_fail(st, "ccq_mem_alloc: %s", err.msg);
}

CCQ_API ccq_status ccq_mem_free(ccq_runtime *rt, ccq_device_id device, void *ptr)
{
    ccq_clear_detail();
    if (rt == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_mem_free: rt is NULL");
    if (ccq_check_device(rt, "ccq_mem_free", device) != CCQ_OK)
        return CCQ_ERR_INVALID_ARGUMENT;
    if (ptr != NULL)
        rt->be_ops->mem_free(rt->be, ccq_backend_device(rt, device), ptr);
    return CCQ_OK;
}

CCQ_API ccq_status ccq_mem_copy(ccq_runtime *rt, ccq_device_id device, void *dst, const void *src,
                                size_t bytes, ccq_copy_kind kind)
{
    ccq_errbuf err = {{0}};
    ccq_status st;

    ccq_clear_detail();
    if (rt == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_mem_copy: rt is NULL");
    if (ccq_check_device(rt, "ccq_mem_copy", device) != CCQ_OK)
        return CCQ_ERR_INVALID_ARGUMENT;
    if (kind != CCQ_COPY_TO_DEVICE && kind != CCQ_COPY_TO_HOST)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_mem_copy: invalid kind %d", (int)kind);
    if (bytes > 0 && (dst == NULL || src == NULL))
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_mem_copy: %s is NULL",
                        dst == NULL ? "dst" : "src");
    if (bytes == 0)
        return CCQ_OK;
    st = rt->be_ops->mem_copy(rt->be, ccq_backend_device(rt, device), dst, src, bytes,
                              kind == CCQ_COPY_TO_DEVICE, &err);
    return st == CCQ_OK ? CCQ_OK : ccq_fail(st, "ccq_mem_copy: %s", err.msg);
}
