/* ccq: the public API of the collective command queue (the only header a user needs). */
#ifndef CCQ_H
#define CCQ_H

#include <stddef.h>
#include <stdint.h>

#include "ccq/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Marks the calls libccq exports (default visibility while the library is built, which
 * hides everything else; empty in programs using it). */
#if defined(CCQ_BUILDING_LIBRARY) && defined(__GNUC__)
#define CCQ_API __attribute__((visibility("default")))
#else
#define CCQ_API
#endif

/**
 * @file ccq.h
 *
 * ccq turns collective-communication calls made from any thread into commands on
 * per-stream lock-free queues. One scheduler thread matches the parts of each collective
 * across the local ranks, batches what is ready into one backend group (one
 * ncclGroupStart/ncclGroupEnd on GPUs, one fused pass on the host backend) and tracks
 * completion. ccq_sync_collective() is the per-stream fence.
 *
 * Threading: every call is safe from any thread at any time, except
 * ccq_runtime_destroy(), which must not race with other calls on the same runtime.
 *
 * Ownership: user buffers passed to a submitting call are borrowed from the call until
 * a fence that covers the command returns, whatever its result: ccq_sync_collective, or
 * ccq_fence_test/ccq_fence_wait on a covering value answering anything but CCQ_IN_PROGRESS.
 * (ccq_nccl_stream_wait orders GPU work after the commands; it hands nothing back.)
 *
 * Errors: every call that can fail returns a ccq_status. After a call returned an error,
 * ccq_last_error_detail() on the same thread gives a readable detail (which argument,
 * which op, which ranks, which fields).
 */

/** Every status as X(name, value, text), in one list so that the enum, ccq_status_name() and
 * ccq_status_string() cannot drift apart (as libuv's UV_ERRNO_MAP); bindings can expand it
 * too. The text is what ccq_status_string() returns. */
#define CCQ_STATUS_MAP(X)                                                                          \
    X(CCQ_OK, 0, "success")                                                                        \
    X(CCQ_IN_PROGRESS, 1, "in progress")                                                           \
    X(CCQ_ERR_INVALID_ARGUMENT, -1, "invalid argument")                                            \
    X(CCQ_ERR_NO_MEMORY, -2, "out of memory")                                                      \
    X(CCQ_ERR_QUEUE_FULL, -3, "stream queue full")                                                 \
    X(CCQ_ERR_NOT_INITIALIZED, -4, "communicator not initialized")                                 \
    X(CCQ_ERR_MISMATCH, -5, "collective parts do not match across ranks")                          \
    X(CCQ_ERR_TIMEOUT, -6, "timed out")                                                            \
    X(CCQ_ERR_BACKEND, -7, "backend error")                                                        \
    X(CCQ_ERR_ABORTED, -8, "communicator aborted")                                                 \
    X(CCQ_ERR_SHUTDOWN, -9, "runtime is shutting down")                                            \
    X(CCQ_ERR_UNSUPPORTED, -10, "unsupported")                                                     \
    X(CCQ_ERR_PROCESS_LOST, -11, "a member process was lost")

/**
 * Status codes (from CCQ_STATUS_MAP). Negative values are errors; CCQ_IN_PROGRESS (positive)
 * is not an error but "not done yet": a non-blocking call (ccq_fence_test, a ccq_store's get)
 * has nothing to report yet and is asked again later. After an error,
 * ccq_last_error_detail() says what exactly went wrong.
 *
 * | status | value | meaning |
 * |---|---|---|
 * | CCQ_OK | 0 | success |
 * | CCQ_IN_PROGRESS | 1 | not done yet (a fence value, a store's key) |
 * | CCQ_ERR_INVALID_ARGUMENT | -1 | a bad argument or config field; nothing was done |
 * | CCQ_ERR_NO_MEMORY | -2 | out of memory |
 * | CCQ_ERR_QUEUE_FULL | -3 | the stream is full (non-blocking mode, or for timeout_ms) |
 * | CCQ_ERR_NOT_INITIALIZED | -4 | the device set has no communicator (ccq_comm_init) |
 * | CCQ_ERR_MISMATCH | -5 | the parts disagree (kind, count, dtype, op or root) |
 * | CCQ_ERR_TIMEOUT | -6 | not done within timeout_ms (the detail names who is missing) |
 * | CCQ_ERR_BACKEND | -7 | CUDA, NCCL, MPI or the file system failed (message in detail) |
 * | CCQ_ERR_ABORTED | -8 | the communicator was aborted |
 * | CCQ_ERR_SHUTDOWN | -9 | the runtime is shutting down (cancelled, or refused) |
 * | CCQ_ERR_UNSUPPORTED | -10 | not possible with this backend, build or driver |
 * | CCQ_ERR_PROCESS_LOST | -11 | a member process died or was declared lost (the detail names it) |
 */
typedef enum ccq_status {
#define CCQ_STATUS_ENUM_(name, value, text) name = value,
    CCQ_STATUS_MAP(CCQ_STATUS_ENUM_)
#undef CCQ_STATUS_ENUM_
} ccq_status;

/** Element types (names and widths as NCCL's ncclDataType_t). */
typedef enum ccq_dtype {
    CCQ_INT8,        /**< 8-bit signed integer. */
    CCQ_UINT8,       /**< 8-bit unsigned integer. */
    CCQ_INT32,       /**< 32-bit signed integer. */
    CCQ_UINT32,      /**< 32-bit unsigned integer. */
    CCQ_INT64,       /**< 64-bit signed integer. */
    CCQ_UINT64,      /**< 64-bit unsigned integer. */
    CCQ_FLOAT16,     /**< IEEE 754 half precision. */
    CCQ_FLOAT32,     /**< IEEE 754 single precision. */
    CCQ_FLOAT64,     /**< IEEE 754 double precision. */
    CCQ_BFLOAT16,    /**< bfloat16 (the upper half of a float32). */
    CCQ_FLOAT8E4M3,  /**< 8-bit float, 4 exponent and 3 mantissa bits (OCP FP8 E4M3). */
    CCQ_FLOAT8E5M2,  /**< 8-bit float, 5 exponent and 2 mantissa bits (OCP FP8 E5M2). */
    CCQ_DTYPE_COUNT_ /**< Not a type: the number of types. */
} ccq_dtype;

/** Reduction operations. AVG on integer types divides with truncation, as NCCL does. */
typedef enum ccq_reduce_op {
    CCQ_SUM,             /**< Sum. */
    CCQ_PROD,            /**< Product. */
    CCQ_MAX,             /**< Maximum. */
    CCQ_MIN,             /**< Minimum. */
    CCQ_AVG,             /**< Average: the sum divided by the number of ranks. */
    CCQ_REDUCE_OP_COUNT_ /**< Not an op: the number of ops. */
} ccq_reduce_op;

/** A device, by its global id: 0 .. ccq_device_count() - 1 (in a world of processes each
 * process owns a contiguous range of them, see ccq_local_devices()). */
typedef uint32_t ccq_device_id;
/** A stream of a device: 0 .. max_streams - 1. Commands on one stream behave as if they ran
 * in submission order; streams are independent. */
typedef uint32_t ccq_stream_id;

/** An opaque runtime: the devices of one backend, their streams and the scheduler. */
typedef struct ccq_runtime ccq_runtime;

/**
 * The embedder's key-value store, for a world of processes that meet through the
 * embedder's own rendezvous (a TCP store, a Redis or etcd client, torch's Store...)
 * instead of MPI or a shared directory (see docs/multiprocess.md, "Bootstrap").
 *
 * Keys are NUL-terminated strings that ccq builds as "ccq/<job>/<generation>/<tag>/<rank>"
 * (docs/multiprocess.md); every process of the world must see the values the others set.
 * Values are small binary records (tens to hundreds of bytes). Exchange records are written
 * once; the heartbeat keys ("ccq/<job>/<generation>/~hb/<rank>", one per process, see
 * ccq_config.heartbeat_ms) are set again every heartbeat: the store must accept a key set
 * again, and get returns the last value set (last write wins). ccq never deletes a key (the
 * store's owner drops them with the job).
 *
 * Ownership: ccq copies this struct; @p ctx and the functions must stay valid until
 * ccq_runtime_destroy() of every runtime using the store has returned.
 *
 * Threads: ccq calls set and get from the thread calling ccq_runtime_create, the runtime's
 * scheduler thread and its health monitor thread (heartbeats), but never two calls at once for
 * one runtime (a lock of the runtime serialises them). Several runtimes sharing one store, in one
 * process, can call it concurrently: such a store must be thread-safe. The callbacks must not call
 * ccq, and get must not wait for the key: ccq polls it, sleeping in between (about once a
 * millisecond), until it appears or timeout_ms ends.
 */
typedef struct ccq_store {
    void *ctx; /**< Passed back to set and get as their first argument. */
    /** Publish @p len bytes of @p value under @p key for every process of the world.
     * @return CCQ_OK, or an error (the exchange that needed the key fails; the runtime's
     *         detail names the key and the status). */
    ccq_status (*set)(void *ctx, const char *key, const void *value, size_t len);
    /** Never blocks. @p len in: the room at @p value; out: the value's size.
     * @return CCQ_OK with min(size, room) bytes copied (when size > room ccq calls again with
     *         room >= size); CCQ_IN_PROGRESS while the key is not there yet; or an error
     *         (the exchange fails, the detail names the key). */
    ccq_status (*get)(void *ctx, const char *key, void *value, size_t *len);
} ccq_store;

/** Submitting calls return CCQ_ERR_QUEUE_FULL at once instead of waiting for room. */
#define CCQ_FLAG_NONBLOCKING_SUBMIT 0x1u

/**
 * Runtime configuration. Fill it with ccq_config_init(), then change fields.
 * Fields are only ever appended. ccq_config_init() passes the size of the ccq_config the
 * caller was compiled with, so the library never writes past it, and records it in
 * struct_size, from which ccq_runtime_create knows which fields the caller has (the others
 * keep their defaults): a binary built against an older ccq keeps working with a newer one.
 */
typedef struct ccq_config {
    uint32_t struct_size;  /**< sizeof(ccq_config); set by ccq_config_init. */
    const char *backend;   /**< "host" (default) or "nccl". Env: CCQ_BACKEND. */
    uint32_t host_devices; /**< Host backend: virtual devices (default 4). Env: CCQ_HOST_DEVICES. */
    uint32_t max_streams;  /**< Streams per device (default 64). Env: CCQ_MAX_STREAMS. */
    uint32_t queue_depth;  /**< Commands outstanding per stream before backpressure
                                (default 1024; a blocked producer resumes once a quarter
                                is free, or one slot after 1 ms). Env: CCQ_QUEUE_DEPTH. */
    uint32_t max_batch_ops; /**< Operations in one backend group (default 256).
                                 Env: CCQ_MAX_BATCH_OPS. */
    uint64_t timeout_ms;    /**< Watchdog and fence deadline; 0 = none (default 600000).
                                 Env: CCQ_TIMEOUT_MS. */
    /* ---- appended after the seed API ---- */
    uint32_t host_workers;   /**< Host backend worker threads; 0 = number of cores this
                                  process may run on (its CPU affinity); at most 1024.
                                  Env: CCQ_HOST_WORKERS. */
    uint32_t flags;          /**< CCQ_FLAG_* bits. Env: CCQ_NONBLOCKING_SUBMIT=1. */
    const char *env_error;   /**< Set by ccq_config_init when a CCQ_* variable is malformed;
                                  ccq_runtime_create then fails with its text. */
    uint32_t spin_us;        /**< How long ccq's threads (scheduler, host workers) and callers
                                  waiting in a fence poll, yielding the core between polls, before
                                  they sleep (default 50; 0 = sleep at once). Trades a little CPU
                                  for latency: a futex wake-up costs tens of microseconds.
                                  Env: CCQ_SPIN_US. */
    const char *fault;       /**< Fault injection for tests and drills, off when NULL or "" (the
                                  default): e.g. "fail:op=17;delay:us=5000,op=3;drop:rank=2".
                                  Grammar in docs/reliability.md. Env: CCQ_FAULT. */
    uint32_t trace_capacity; /**< Events the flight recorder keeps (the newest; older ones
                                  are overwritten and counted), rounded up to a power of two;
                                  at most 2^26 (67108864). Default 65536; 0 disables it.
                                  Env: CCQ_TRACE_CAPACITY. */
    const char *trace_file;  /**< If set, the recorder is written there as Chrome/Perfetto
                                  JSON at destroy and when the watchdog or an error fires
                                  (at most once a second). Env: CCQ_TRACE_FILE. */
    /** Host backend: an operation that reads plus writes at least this many bytes writes its
     * outputs with streaming (non-temporal) stores, which skip reading each output line before
     * overwriting it; worth it once the working set is well beyond the last-level cache.
     * 0 = the default (64 MiB); UINT64_MAX = never. Env: CCQ_HOST_STREAM_BYTES. */
    uint64_t host_stream_bytes;
    /* ---- appended in 0.2: a world of processes (docs/multiprocess.md) ---- */
    uint32_t world_rank;           /**< This process (default 0). Env: CCQ_WORLD_RANK, else the
                                        launcher's: OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID,
                                        RANK (torchrun), in that order. */
    uint32_t world_size;           /**< Processes in the job (default 1: this one alone). Env:
                                        CCQ_WORLD_SIZE, else OMPI_COMM_WORLD_SIZE, PMI_SIZE,
                                        SLURM_NTASKS, WORLD_SIZE (torchrun). */
    const char *bootstrap;         /**< How processes meet: "mpi", "file:DIR" (a directory every
                                        process sees; created, mode 0700, if missing),
                                        "tcp://HOST:PORT" (world rank 0 serves a rendezvous at
                                        HOST:PORT, on every interface when HOST is "*"; the others
                                        connect and stay connected), "torchstore://HOST:PORT"
                                        (the same, rank 0 on a port of its own that it names in
                                        torch's TCPStore at HOST:PORT), or NULL to use `store`.
                                        Env: CCQ_BOOTSTRAP, else tcp://MASTER_ADDR:MASTER_PORT
                                        when torchrun's variables are set (torchstore:// where
                                        torchrun's agent serves its store there). */
    const struct ccq_store *store; /**< The embedder's key-value store (bootstrap NULL). Borrowed
                                        until ccq_runtime_destroy returns. */
    int64_t mpi_comm; /**< For "mpi": MPI_Comm_c2f() of the embedder's communicator; -1 (the
                           default) = MPI_COMM_WORLD. */
    /** 1 = ccq installs a SIGUSR1 handler that makes every runtime of the process dump its
     * trace file (trace_file); 0 (default) = no handler. The handler only wakes a thread of
     * ccq's that writes the dumps, and chains to the handler installed before it; it stays
     * installed for the life of the process. Env: CCQ_TRACE_SIGNAL=1. */
    uint32_t trace_signal;
    /** 1 = before an operation whose communicator spans processes runs, its member
     * processes compare what they submitted for that sequence number (kind, count, dtype,
     * op, root; count and dtype for send/recv) through the bootstrap, so a mismatch between
     * processes fails every part with CCQ_ERR_MISMATCH naming the processes and fields
     * instead of hanging or corrupting data. Costs a bootstrap round trip per operation
     * (docs/tracing.md); 0 (default) = off. Env: CCQ_CHECK_SIGNATURES=1. */
    uint32_t check_signatures;
    /* ---- appended in 0.3: job health (docs/multiprocess.md, "When a process dies") ---- */
    /** How often this process publishes its heartbeat (a small record with its progress)
     * through the bootstrap, in a world of several processes: default 1000; 0 = no
     * heartbeats (then a lost process is found only by timeout_ms). The "mpi" bootstrap has
     * none (under mpirun the launcher ends the job when a process dies). The processes of a
     * world run one setting: none if any process has none, else the longest interval and the
     * longest heartbeat_timeout_ms any asks for. Env: CCQ_HEARTBEAT_MS. */
    uint32_t heartbeat_ms;
    /** A process whose heartbeat is older than this is declared lost (0 = the default,
     * 10 x heartbeat_ms). A process that hears no quorum of the others (more than half of
     * those that may be alive, or half with the lowest) for twice this long declares itself
     * lost: across a cut network only one side goes on. Env: CCQ_HEARTBEAT_TIMEOUT_MS. */
    uint32_t heartbeat_timeout_ms;
    /* ---- appended in 0.3: NCCL stream priority ---- */
    /** NCCL backend: 1 = its communication streams (where NCCL runs ccq's work) are created
     * with the device's highest stream priority, so the GPU schedules communication kernels
     * ahead of compute kernels waiting for SMs (as PyTorch's TORCH_NCCL_HIGH_PRIORITY=1);
     * 0 (default) = the default priority. Other backends ignore it.
     * Env: CCQ_NCCL_HIGH_PRIORITY=1. */
    uint32_t nccl_high_priority;
    /* ---- appended in 0.3: fusion of small collectives ---- */
    /** Fusion of small collectives (docs/fusion.md): operations of one batch on one
     * communicator with the same kind, dtype, op (and root), each moving fewer than this many
     * bytes (count x dtype size), run as one engine operation over their concatenation, up
     * to fusion_bytes per fused operation, in submission order; results are bit-identical
     * (with the limits docs/fusion.md states for the engine across processes), and each
     * command keeps its own completion, error and trace entry. Across processes the member
     * processes agree on each fusion, and a communicator uses the smallest value of its
     * members. 0 = off. Default 1048576 (1 MiB). Env: CCQ_FUSION_BYTES. */
    uint64_t fusion_bytes;
    /* ---- appended in 0.3: the host backend's engine across processes ---- */
    /** Host backend across processes: the engine that moves data between them. "ucx" (UCX's
     * UCP: shared memory, TCP, InfiniBand; ccq's own schedules, every message checked), "mpi"
     * (needs MPI initialised: launch under mpirun), or NULL (the default) = "ucx" when its
     * module (libccq-ucx.so.0) loads and UCX starts, else "mpi" when MPI is initialised. Each
     * engine is a module loaded on first need (README.md, Install). docs/multiprocess-host.md.
     * Env: CCQ_HOST_ENGINE. */
    const char *host_engine;
} ccq_config;

/**
 * Counters of a runtime. Every submitted command ends in exactly one of completed, failed
 * or cancelled, so submitted == completed + failed + cancelled + pending.
 */
typedef struct ccq_stats {
    uint32_t struct_size;   /**< Set by the caller to sizeof(ccq_stats). */
    uint64_t submitted;     /**< Commands accepted by submitting calls. */
    uint64_t completed;     /**< Commands that completed successfully. */
    uint64_t failed;        /**< Commands that ended with an error (mismatch, timeout, ...). */
    uint64_t cancelled;     /**< Commands cancelled by shutdown (CCQ_ERR_SHUTDOWN). */
    uint64_t pending;       /**< submitted - completed - failed - cancelled, at the snapshot. */
    uint64_t batches;       /**< Backend groups issued. */
    uint64_t batched_ops;   /**< Operations (matched collectives, send/recv pairs) issued. */
    uint64_t max_batch_ops; /**< Largest number of operations seen in one group. */
    uint64_t batch_size_hist[8]; /**< Groups of 1, 2-3, 4-7, ..., 128+ operations. */
} ccq_stats;

/**
 * Fill the first @p size bytes of @p cfg with defaults, then apply CCQ_* environment
 * variables, and set cfg->struct_size to the number of bytes written (the smaller of
 * @p size and this library's sizeof(ccq_config)). Never writes beyond @p size. Call it
 * through the ccq_config_init() macro, which passes sizeof(ccq_config).
 * @param[out] cfg   Configuration to fill; NULL is a no-op.
 * @param      size  sizeof the caller's ccq_config; below offsetof(ccq_config, host_workers)
 *                   (the oldest layout) nothing is written.
 * Thread-safe (reads the environment only). Since 0.2.0.
 */
CCQ_API void ccq_config_init_sized(ccq_config *cfg, size_t size);

/**
 * 0.1.0's entry point, kept for binaries built against 0.1.0: fills exactly 0.1.0's
 * ccq_config (every field up to host_stream_bytes). Source code gets the macro below.
 */
CCQ_API void(ccq_config_init)(ccq_config *cfg);

/** Fill @p cfg (a ccq_config *) with defaults and the CCQ_* environment variables. */
#define ccq_config_init(cfg) ccq_config_init_sized((cfg), sizeof(ccq_config))

/**
 * Create a runtime and start its scheduler thread.
 * @param[in]  cfg  Configuration (NULL = defaults from ccq_config_init). Copied; the caller
 *                  keeps ownership.
 * @param[out] out  The runtime, or NULL on error.
 * @return CCQ_OK; CCQ_ERR_INVALID_ARGUMENT for a bad field (detail names it);
 *         CCQ_ERR_UNSUPPORTED for a backend that is not built in or cannot run here;
 *         CCQ_ERR_NO_MEMORY.
 */
CCQ_API ccq_status ccq_runtime_create(const ccq_config *cfg, ccq_runtime **out);

/**
 * Stop accepting commands, finish what can still finish (issued or ready work, up to
 * timeout_ms), cancel with CCQ_ERR_SHUTDOWN what never can (parts whose other ranks never
 * came), and stop the scheduler. Safe from any thread, also while others submit or wait;
 * later submitting calls return CCQ_ERR_SHUTDOWN. Fences still report what happened.
 * Calling it twice is harmless. @return CCQ_OK, or CCQ_ERR_INVALID_ARGUMENT for NULL.
 */
CCQ_API ccq_status ccq_runtime_shutdown(ccq_runtime *rt);

/**
 * Shut down (as ccq_runtime_shutdown) and free the runtime. Must not race with any other
 * call on @p rt. User buffers are never touched after it returns. NULL is a no-op.
 */
CCQ_API ccq_status ccq_runtime_destroy(ccq_runtime *rt);

/** Number of devices in the world (every process's; in a world of one, this process's
 * backend's devices); 0 for NULL. Device ids are global: 0 .. ccq_device_count() - 1, process
 * p owning a contiguous range (see ccq_local_devices). Thread-safe. */
CCQ_API uint32_t ccq_device_count(const ccq_runtime *rt);

/** This process's rank in the world (ccq_config.world_rank); 0 for NULL. Thread-safe. */
CCQ_API uint32_t ccq_world_rank(const ccq_runtime *rt);

/** Processes in the world (ccq_config.world_size); 0 for NULL. Thread-safe. */
CCQ_API uint32_t ccq_world_size(const ccq_runtime *rt);

/**
 * The global device ids this process owns: [*first, *first + *count). Only these can be
 * submitted on, fenced, bound or allocated on here. Thread-safe.
 * @return CCQ_OK; CCQ_ERR_INVALID_ARGUMENT for a NULL argument.
 */
CCQ_API ccq_status ccq_local_devices(const ccq_runtime *rt, ccq_device_id *first, uint32_t *count);

/* ------------------------------------------------------------------------------------ */
/* Job health: lost processes and live progress (docs/multiprocess.md)                  */
/* ------------------------------------------------------------------------------------ */

/** What this process knows of another process of the world (ccq_world_process_state). */
typedef enum ccq_process_state {
    CCQ_PROCESS_ALIVE = 0, /**< Heartbeats arrive (or heartbeats are off). */
    CCQ_PROCESS_LOST = 1,  /**< Died, or silent past heartbeat_timeout_ms: excluded for good.
                                Every process of the world agrees on it. */
    CCQ_PROCESS_LEFT = 2   /**< Destroyed its runtime cleanly. */
} ccq_process_state;

/**
 * The state of world rank @p process as this process knows it. A process declared lost while
 * it was in fact alive (stopped, cut off) learns it within heartbeat_timeout_ms of running
 * again and then reads its own state as CCQ_PROCESS_LOST. Thread-safe, never blocks.
 * @param[in]  rt       The runtime.
 * @param[in]  process  A world rank (this process's own included).
 * @param[out] out      Its state.
 * @return CCQ_OK; CCQ_ERR_INVALID_ARGUMENT (NULL, process >= world_size).
 */
CCQ_API ccq_status ccq_world_process_state(ccq_runtime *rt, uint32_t process,
                                           ccq_process_state *out);

/** Live progress: one record per (process, communicator spanning processes), from the
 * latest heartbeat of that process (this process's own are current). Fields are only ever
 * appended. */
typedef struct ccq_progress {
    uint32_t struct_size;      /**< Set by the caller in out[0] (the element size), as in
                                    ccq_trace_snapshot. */
    uint32_t process;          /**< World rank. */
    uint32_t state;            /**< ccq_process_state. */
    uint32_t comm;             /**< Communicator id (this process's, as in events). */
    uint64_t submitted;        /**< Operations that process submitted on it (its next
                                    sequence number). */
    uint64_t completed;        /**< Operations it completed. */
    uint32_t pending_kind;     /**< ccq_kind of its oldest pending operation, or UINT32_MAX. */
    uint64_t pending_seq;      /**< That operation's sequence number. */
    uint64_t pending_age_ns;   /**< How long it had been pending when the record was made. */
    uint64_t heartbeat_age_ns; /**< Age of the record this answer comes from (0 for this
                                    process's own). */
} ccq_progress;

/**
 * The latest progress records of every process for the communicators spanning processes
 * that this process also belongs to, this process's own included (current), in process
 * order. Thread-safe; waits at most a scheduler pass for this process's own records.
 * @param[in]     rt   The runtime.
 * @param[in,out] out  An array of @p cap records: set out[0].struct_size = sizeof(ccq_progress)
 *                     (may be NULL when cap is 0).
 * @param[in]     cap  Records @p out has room for (0: only count them).
 * @param[out]    n    Records available; min(cap, *n) are copied.
 * @return CCQ_OK; CCQ_ERR_INVALID_ARGUMENT (NULL n, NULL out with cap > 0, a struct_size
 *         that is not a released ccq_progress size).
 */
CCQ_API ccq_status ccq_world_progress(ccq_runtime *rt, ccq_progress *out, size_t cap, size_t *n);

/** Name of the runtime's backend ("host", "nccl"); "" for NULL. Thread-safe. */
CCQ_API const char *ccq_backend_name(const ccq_runtime *rt);

/**
 * Version of the library that is running, as "MAJOR.MINOR.PATCH" (CCQ_VERSION_STRING of the
 * build of libccq that was loaded). Compare it, or ccq_version_number(), with the
 * CCQ_VERSION_* macros of the header the program was built with: a different major
 * version is not ABI compatible; an older minor version lacks the calls added since.
 * Static storage; thread-safe.
 */
CCQ_API const char *ccq_version(void);

/**
 * The running library's version as CCQ_VERSION_HEX encodes it ((MAJOR << 16) |
 * (MINOR << 8) | PATCH, as libuv's uv_version()), so that
 * `ccq_version_number() >= CCQ_VERSION_HEX` says the library is at least as new as the
 * header. Thread-safe.
 */
CCQ_API unsigned ccq_version_number(void);

/** Static text of a status ("invalid argument"); "unknown status" for other values. */
CCQ_API const char *ccq_status_string(ccq_status s);

/** Name of a status constant ("CCQ_ERR_TIMEOUT"). */
CCQ_API const char *ccq_status_name(ccq_status s);

/**
 * Detail of the last error a ccq call returned on the calling thread (thread-local, like
 * dlerror); "" if none. Valid until the next ccq call on this thread. At most 511
 * characters: a longer one ends with "... [truncated]" (ccq_stream_last_error has it whole).
 */
CCQ_API const char *ccq_last_error_detail(void);

/**
 * Create the communicator of a device set. Keyed by the sorted set; calling it again with
 * the same set (in any order, from any thread) is a no-op that returns once it is ready.
 * In a world of processes every process owning a device of the set calls it, and it returns
 * once the communicator is ready here (docs/multiprocess.md).
 * @param[in] rt       The runtime.
 * @param[in] devices  Device ids, each < ccq_device_count(rt), no duplicates. Copied.
 * @param[in] n        Number of devices (>= 1).
 * @return CCQ_OK; CCQ_ERR_INVALID_ARGUMENT (unknown or duplicate device, n == 0, NULL);
 *         CCQ_ERR_BACKEND when the backend could not create it (detail has its message);
 *         CCQ_ERR_TIMEOUT; CCQ_ERR_SHUTDOWN; CCQ_ERR_PROCESS_LOST at once when the set holds a
 *         device of a lost process (also if it had formed before), or spans processes while
 *         this one was declared lost (ccq_world_process_state).
 */
CCQ_API ccq_status ccq_comm_init(ccq_runtime *rt, const ccq_device_id *devices, size_t n);

/**
 * Queue this device's part of an all_reduce over the communicator of @p devices.
 * Returns once the command is queued (or refused); it runs when every rank's part has been
 * queued and its stream predecessors allow it. Results are visible after the fence.
 * @param[in]  rt      The runtime.
 * @param[in]  device  The device whose part this is (a device of this process).
 * @param[in]  stream  The stream of @p device to queue it on.
 * @param[in]  src     count elements of dtype (host memory on the host backend, device
 *                     memory of @p device on NCCL). Borrowed until the covering fence returns.
 * @param[out] dst     count elements; src == dst is in place. Must not partly overlap src.
 * @param[in]  count   Elements per rank; 0 is accepted and moves nothing (every buffer may
 *                     be NULL; the command is still matched and completes).
 * @param[in]  dtype   Element type.
 * @param[in]  op      Reduction.
 * @param[in]  devices, n  The communicator's device set (as given to ccq_comm_init, any
 *                     order); must contain @p device.
 * @return CCQ_OK (queued); CCQ_ERR_INVALID_ARGUMENT; CCQ_ERR_NOT_INITIALIZED (the set was
 *         never passed to ccq_comm_init; a pair's communicator also exists once ccq_send or
 *         ccq_recv between the two devices created it); CCQ_ERR_QUEUE_FULL (non-blocking
 *         mode, or the stream stayed full for timeout_ms); CCQ_ERR_ABORTED (the
 *         communicator was aborted); CCQ_ERR_PROCESS_LOST (a member process was lost);
 *         CCQ_ERR_SHUTDOWN. On any error nothing is queued.
 */
CCQ_API ccq_status ccq_all_reduce(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                  const void *src, void *dst, size_t count, ccq_dtype dtype,
                                  ccq_reduce_op op, const ccq_device_id *devices, size_t n);

/**
 * Queue a send of @p count elements from @p device to @p peer. Matches the recv on
 * @p peer from @p device in per-pair order. Uses the communicator of {device, peer},
 * created on first use. peer == device sends to self. Errors as ccq_all_reduce.
 * Stream order: a later command of the stream that overwrites @p src (an in-place exchange
 * or ring shift: recv into the same buffer) does not change what is sent; the host backend
 * stages the data, the NCCL backend fails such a set with CCQ_ERR_UNSUPPORTED.
 * After one side of a pair fails (e.g. a recv times out), the other side's next operation
 * of that pair takes the failed one's place and fails at once with its status; after that
 * the pair is back in step (docs/semantics.md, "Matching").
 */
CCQ_API ccq_status ccq_send(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                            const void *src, size_t count, ccq_dtype dtype, ccq_device_id peer);

/** Queue a receive into @p dst on @p device from @p peer. See ccq_send (per-pair order, also
 * after a timed-out recv: the peer's next send to this device pairs with it and fails). */
CCQ_API ccq_status ccq_recv(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream, void *dst,
                            size_t count, ccq_dtype dtype, ccq_device_id peer);

/**
 * @name The other collectives
 * They go through the same path as ccq_all_reduce (matching by
 * per-(communicator, rank) sequence number, signature checks, batching, fences, errors) and
 * follow NCCL's definitions. A rank's position in the sorted device set orders the blocks of
 * all_gather, reduce_scatter, all_to_all, gather and scatter; a root is a device id (it must
 * be in the set). Buffers are borrowed until the covering fence returns. In place as NCCL:
 * broadcast/reduce: src == dst; all_gather: src == dst + rank*count; reduce_scatter:
 * dst == src + rank*count; gather (root): src == dst + root_rank*count; scatter (root):
 * dst == src + root_rank*count (in elements). all_to_all has no in-place form. Any other
 * overlap is CCQ_ERR_INVALID_ARGUMENT. A buffer a rank does not use (dst of a non-root
 * reduce/gather, src of a non-root broadcast/scatter) is ignored: never read, written or checked.
 * The parts must agree on count, dtype, op (reductions) and root (rooted ones), or they all fail
 * with CCQ_ERR_MISMATCH. count = 0 moves nothing (every buffer may be NULL). Arguments and
 * errors as ccq_all_reduce; docs/collectives.md has a diagram of each.
 * @{
 */

/** Copy @p count elements from @p root's @p src to every rank's @p dst (src is read on the
 * root only; it may be NULL elsewhere). */
CCQ_API ccq_status ccq_broadcast(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                 const void *src, void *dst, size_t count, ccq_dtype dtype,
                                 ccq_device_id root, const ccq_device_id *devices, size_t n);

/** Reduce every rank's @p src (count elements) into @p root's @p dst (NULL elsewhere). */
CCQ_API ccq_status ccq_reduce(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                              const void *src, void *dst, size_t count, ccq_dtype dtype,
                              ccq_reduce_op op, ccq_device_id root, const ccq_device_id *devices,
                              size_t n);

/** Every rank's @p src (count elements) into block `rank` of every rank's @p dst
 * (count * n elements). */
CCQ_API ccq_status ccq_all_gather(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                  const void *src, void *dst, size_t count, ccq_dtype dtype,
                                  const ccq_device_id *devices, size_t n);

/** Reduce block r (count elements) of every rank's @p src (count * n elements) into rank
 * r's @p dst (count elements). */
CCQ_API ccq_status ccq_reduce_scatter(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                      const void *src, void *dst, size_t count, ccq_dtype dtype,
                                      ccq_reduce_op op, const ccq_device_id *devices, size_t n);

/** Block j (count elements) of rank i's @p src goes to block i of rank j's @p dst (both
 * count * n elements). */
CCQ_API ccq_status ccq_all_to_all(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                  const void *src, void *dst, size_t count, ccq_dtype dtype,
                                  const ccq_device_id *devices, size_t n);

/** Every rank's @p src (count elements) into block `rank` of @p root's @p dst (count * n
 * elements; NULL elsewhere). */
CCQ_API ccq_status ccq_gather(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                              const void *src, void *dst, size_t count, ccq_dtype dtype,
                              ccq_device_id root, const ccq_device_id *devices, size_t n);

/** Block r (count elements) of @p root's @p src (count * n elements; NULL elsewhere) into
 * rank r's @p dst (count elements). */
CCQ_API ccq_status ccq_scatter(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                               const void *src, void *dst, size_t count, ccq_dtype dtype,
                               ccq_device_id root, const ccq_device_id *devices, size_t n);
/** @} */

/**
 * Fence: wait until every command submitted on (device, stream) before this call has
 * completed, or until timeout_ms (plus a short grace so the watchdog can report first).
 * Never spins a core. Other streams are not affected.
 * @return CCQ_OK; or the first error recorded on that stream since the previous fence
 *         (then cleared; ccq_last_error_detail() and ccq_stream_last_error() give its
 *         detail); or CCQ_ERR_TIMEOUT; CCQ_ERR_INVALID_ARGUMENT for a bad device/stream.
 */
CCQ_API ccq_status ccq_sync_collective(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream);

/**
 * A fence value: what ccq_fence_begin() captured of one stream (a clear epoch and a ticket
 * count, packed in 64 bits). A plain value: copy it, keep it, test it from any thread.
 * Meaningful only with the (device, stream) it was taken on.
 */
typedef uint64_t ccq_fence;

/**
 * Capture every command submitted on (device, stream) so far (every submitting call that
 * returned before this one). Never blocks: two atomic loads. Values are ordered: a later
 * ccq_fence_begin on the same stream covers at least what an earlier one did.
 * Thread-safe; any number of threads may begin, test and wait at once.
 * @param[in]  rt      The runtime.
 * @param[in]  device  A device of this process.
 * @param[in]  stream  One of its streams.
 * @param[out] out     The value.
 * @return CCQ_OK; CCQ_ERR_INVALID_ARGUMENT (NULL, bad device/stream).
 */
CCQ_API ccq_status ccq_fence_begin(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                   ccq_fence *out);

/**
 * Test a fence value without blocking (two atomic loads when nothing failed since the value
 * was taken). Thread-safe; the same value gives the same final answer every time, from every
 * thread. Does not clear the stream's error (ccq_sync_collective still reports it once).
 * On NCCL, CCQ_OK means the commands completed on the GPU; unlike ccq_fence_wait it does not
 * touch a bound CUDA stream (ccq_nccl_bind_stream).
 * @return CCQ_IN_PROGRESS while some covered command has not ended; then CCQ_OK, or the
 *         error ccq_sync_collective would have returned for them: the first error recorded
 *         on the stream since the last error ccq_sync_collective reported before the value
 *         was taken, if that error's command is one the value covers (detail in
 *         ccq_last_error_detail()). An error is reported only once every covered command
 *         ended, so the covered commands' buffers are free whenever the answer is not
 *         CCQ_IN_PROGRESS. CCQ_ERR_INVALID_ARGUMENT for a bad device/stream, a value not of
 *         this stream, or a value older than 16 error reports by ccq_sync_collective on the
 *         stream (their records are not kept).
 */
CCQ_API ccq_status ccq_fence_test(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                  ccq_fence f);

/**
 * Wait until ccq_fence_test() would not return CCQ_IN_PROGRESS, at most @p timeout_ms
 * (0 = the runtime's timeout_ms; none if that is 0 too). Sleeps (no spinning beyond spin_us).
 * Thread-safe; any number of threads may wait on the same value.
 * @return What ccq_fence_test() returns then; CCQ_IN_PROGRESS when the wait ended first (the
 *         commands are still pending: nothing failed; the watchdog still ends them).
 */
CCQ_API ccq_status ccq_fence_wait(ccq_runtime *rt, ccq_device_id device, ccq_stream_id stream,
                                  ccq_fence f, uint64_t timeout_ms);

/**
 * The last error a fence returned on (device, stream), with its detail, from any thread.
 * The detail is kept whole (a desync report of a big communicator can run to kilobytes,
 * while ccq_last_error_detail() keeps at most 511 characters); a detail cut to fit @p len
 * ends with "... [truncated]". (Errors returned by ccq_sync_collective, which reports and
 * clears them; fence values only read them.)
 * @param[in]  rt      The runtime.
 * @param[in]  device  A device of this process.
 * @param[in]  stream  One of its streams.
 * @param[out] buf     Receives the NUL-terminated detail ("" if none); may be NULL if
 *                     len == 0.
 * @param[in]  len     Bytes at @p buf.
 * @return That error's status, CCQ_OK if the stream never returned one, or
 *         CCQ_ERR_INVALID_ARGUMENT.
 */
CCQ_API ccq_status ccq_stream_last_error(ccq_runtime *rt, ccq_device_id device,
                                         ccq_stream_id stream, char *buf, size_t len);

/**
 * Snapshot the runtime's counters. Set @p out->struct_size first (`ccq_stats stats =
 * {.struct_size = sizeof stats};`): a size below the seed layout's or above this library's
 * is CCQ_ERR_INVALID_ARGUMENT; only that many bytes are written.
 * Thread-safe; the counters are read one by one, so a snapshot taken while commands are
 * in flight is approximate; it is exact once the runtime is idle or shut down.
 */
CCQ_API ccq_status ccq_get_stats(ccq_runtime *rt, ccq_stats *out);

/* ------------------------------------------------------------------------------------ */
/* Event log: flight recorder, trace export, event callback, live metrics                */
/* ------------------------------------------------------------------------------------ */

/** What an event records. */
typedef enum ccq_event_type {
    CCQ_EV_SUBMITTED,    /**< A command was queued (time = the submitting call). */
    CCQ_EV_MATCHED,      /**< Every part of an operation has been queued and they agree. */
    CCQ_EV_ISSUED,       /**< A command went to the backend in batch `batch`. */
    CCQ_EV_COMPLETED,    /**< A command completed successfully. */
    CCQ_EV_FAILED,       /**< A command ended with an error (`status`): mismatch, timeout,
                              abort, backend error, cancellation by shutdown. */
    CCQ_EV_BATCH,        /**< The scheduler issued batch `id` of `count` operations; `bytes`
                              holds how long issuing took (ns). */
    CCQ_EV_BATCH_DONE,   /**< Batch `id` came back from the backend (`status`). */
    CCQ_EV_FENCE_BEGIN,  /**< ccq_sync_collective was called on (device, stream). */
    CCQ_EV_FENCE_END,    /**< ... and returned `status`. */
    CCQ_EV_WATCHDOG,     /**< The watchdog failed operation `seq` of communicator `comm`. */
    CCQ_EV_ABORT,        /**< Communicator `comm` was aborted (`status`). */
    CCQ_EV_PROCESS_LOST, /**< Process `peer` (a world rank; peer_valid 1) was lost: it died or
                              was silent past heartbeat_timeout_ms. `status` is
                              CCQ_ERR_PROCESS_LOST, `device` its first device, `comm` ~0. */
    CCQ_EV_FUSED,        /**< A fused engine operation ran (docs/fusion.md): `id` its own id
                              (unique per runtime, apart from command ids), `batch`, `comm`, the
                              operations `seq` .. `seq` + `count` - 1 it ran, `bytes` theirs in
                              all, their `kind`, `dtype` and `op`; `time_ns` when it started,
                              `dur_ns` how long it ran, `status` its outcome. Recorded when its
                              batch comes back; each part's COMPLETED or FAILED event names it
                              in `fused`. */
    CCQ_EV_TYPE_COUNT_   /**< Not a type: the number of types. */
} ccq_event_type;

/** Kinds of commands in events. */
typedef enum ccq_kind {
    CCQ_KIND_ALL_REDUCE,     /**< ccq_all_reduce */
    CCQ_KIND_SEND,           /**< ccq_send */
    CCQ_KIND_RECV,           /**< ccq_recv */
    CCQ_KIND_BROADCAST,      /**< ccq_broadcast */
    CCQ_KIND_REDUCE,         /**< ccq_reduce */
    CCQ_KIND_ALL_GATHER,     /**< ccq_all_gather */
    CCQ_KIND_REDUCE_SCATTER, /**< ccq_reduce_scatter */
    CCQ_KIND_ALL_TO_ALL,     /**< ccq_all_to_all */
    CCQ_KIND_GATHER,         /**< ccq_gather */
    CCQ_KIND_SCATTER,        /**< ccq_scatter */
    CCQ_KIND_COUNT_          /**< Not a kind: the number of kinds. */
} ccq_kind;

/** Name of a command kind ("all_gather"), or "?". */
CCQ_API const char *ccq_kind_name(uint32_t kind);

/**
 * One event. Fields that do not apply to a type are 0 (or ~0 for device/stream).
 * Fields are only ever appended: struct_size says which of them an event holds, so an
 * array of events (ccq_trace_snapshot) and the callback keep working when it grows.
 */
typedef struct ccq_event {
    uint32_t struct_size; /**< Bytes of this event the library filled: sizeof(ccq_event) of
                               the running library in callbacks, the caller's element size
                               in ccq_trace_snapshot's array (which the caller sets in
                               out[0] before the call). */
    uint32_t type;        /**< ccq_event_type */
    uint64_t time_ns;     /**< CLOCK_MONOTONIC, the one clock of all events. */
    uint64_t id;          /**< Command id (unique per runtime), or batch id for batch events. */
    uint64_t batch;       /**< Batch that issued the command. */
    uint64_t seq;         /**< Sequence number of the operation in its communicator (per
                               direction for send/recv). */
    uint64_t count;       /**< Elements of the command; operations for batch events. */
    uint64_t bytes;       /**< Bytes of the command (count x dtype size). */
    uint32_t thread;      /**< Thread that submitted the command, or that fenced (Linux tid). */
    uint32_t device;      /**< The command's device (fence events: the fenced one); ~0 otherwise. */
    uint32_t stream;      /**< The command's stream (fence events: the fenced one); ~0 otherwise. */
    uint32_t comm;        /**< Communicator id (creation order, starting at 0). */
    uint8_t kind;         /**< ccq_kind */
    uint8_t dtype;        /**< ccq_dtype */
    uint8_t op;           /**< ccq_reduce_op */
    uint8_t peer_valid;   /**< 1 when `peer` holds a device (send/recv, rooted collectives). */
    int32_t status;       /**< ccq_status, where it applies. */
    uint32_t peer;        /**< send/recv: the other device; rooted collectives: the root device
                               (peer_valid is 1 in both cases). */
    /* ---- fields appended after 0.2.0 go here ---- */
    uint64_t fused;  /**< COMPLETED/FAILED: the id of the CCQ_EV_FUSED operation this command's
                          operation ran in, 0 when it ran alone. */
    uint64_t dur_ns; /**< CCQ_EV_FUSED: how long the fused operation ran. */
} ccq_event;

/**
 * Event callback. Called on the scheduler thread for every event except fence events,
 * which are delivered on the thread calling ccq_sync_collective. It must be fast (it
 * delays scheduling) and thread-safe. It must not call ccq_sync_collective, ccq_fence_wait,
 * ccq_comm_init, ccq_runtime_shutdown or ccq_runtime_destroy (they wait for a scheduler): from
 * inside a callback they fail at once with CCQ_ERR_INVALID_ARGUMENT and do nothing
 * (ccq_fence_test and ccq_nccl_stream_wait never wait, and are fine). Submitting calls
 * from a callback never wait for room: a full stream gives CCQ_ERR_QUEUE_FULL at once.
 */
typedef void (*ccq_event_fn)(const ccq_event *ev, void *user);

/** Set (or clear with NULL) the event callback. Thread-safe; takes effect within a pass. */
CCQ_API ccq_status ccq_set_event_callback(ccq_runtime *rt, ccq_event_fn fn, void *user);

/**
 * Write the flight recorder as Chrome Trace Event Format JSON (opens in Perfetto UI and
 * chrome://tracing): one process per device with tracks per stream, a scheduler track with
 * one slice per batch, flow arrows from each submission to the batch that issued it.
 * Thread-safe. @return CCQ_OK; CCQ_ERR_INVALID_ARGUMENT (NULL, or the recorder is
 * disabled); CCQ_ERR_BACKEND if the file cannot be written (detail has errno's text).
 */
CCQ_API ccq_status ccq_trace_dump(ccq_runtime *rt, const char *path);

/**
 * Copy the recorder's events, oldest first, into @p out (at most @p cap). Thread-safe.
 * @param[in]     rt    The runtime.
 * @param[in,out] out   An array of @p cap events of the caller's ccq_event: set
 *                      out[0].struct_size = sizeof(ccq_event) before the call (the library
 *                      strides the array by it and writes that many bytes of each event,
 *                      with struct_size set, so a program built against an older ccq.h
 *                      keeps working). May be NULL when @p cap is 0.
 * @param[in]  cap      Events @p out has room for.
 * @param[out] n        Events copied.
 * @param[out] dropped  Events lost to overwriting since the runtime started (may be NULL).
 * @return CCQ_OK; CCQ_ERR_INVALID_ARGUMENT (NULL; out[0].struct_size is not the size of a
 *         released ccq_event layout, 0.2.0's or a later one up to this library's);
 *         CCQ_ERR_NO_MEMORY (an older layout needs a temporary copy).
 */
CCQ_API ccq_status ccq_trace_snapshot(ccq_runtime *rt, ccq_event *out, size_t cap, size_t *n,
                                      uint64_t *dropped);

/** Name of an event type ("submitted"), or "?". */
CCQ_API const char *ccq_event_type_name(uint32_t type);

/** Live metrics, computed by the scheduler as it runs. */
typedef struct ccq_metrics {
    uint32_t struct_size;        /**< Set by the caller to sizeof(ccq_metrics). */
    uint64_t uptime_ns;          /**< Since ccq_runtime_create. */
    uint64_t commands_ended;     /**< Completed + failed + cancelled. */
    double commands_per_s;       /**< Over the last full second. */
    double commands_per_s_total; /**< Over the runtime's life. */
    double queue_p50_us;         /**< Time in queue (submitted -> issued), all commands: median. */
    double queue_p99_us;         /**< ... and 99th percentile. */
    double run_p50_us;           /**< Time in flight (issued -> completed): median. */
    double run_p99_us;           /**< ... and 99th percentile. */
    uint64_t batch_size_hist[8]; /**< Batches of 1, 2-3, 4-7, ..., 128+ operations. */
    uint64_t queued_now;         /**< Commands queued or in flight on all streams. */
    uint32_t deepest_device;     /**< The device of the stream with the most of them... */
    uint32_t deepest_stream;     /**< ... that stream... */
    uint64_t deepest_depth;      /**< ...and how many. */
    uint64_t trace_events;       /**< Events recorded since start (incl. overwritten). */
    uint64_t trace_dropped;      /**< Events overwritten before anyone read them. */
} ccq_metrics;

/** Snapshot the live metrics. Thread-safe; percentiles come from log2 histograms (within
 * a factor of 2^(1/4)). @p out->struct_size: sizeof(ccq_metrics), or a smaller size from
 * offsetof(ccq_metrics, trace_events) up (only that many bytes are written); anything else
 * is CCQ_ERR_INVALID_ARGUMENT. */
CCQ_API ccq_status ccq_get_metrics(ccq_runtime *rt, ccq_metrics *out);

/** Commands queued or in flight on one stream (submitted and not ended). Thread-safe. */
CCQ_API ccq_status ccq_stream_queue_depth(ccq_runtime *rt, ccq_device_id device,
                                          ccq_stream_id stream, uint64_t *depth);

/** Direction of ccq_mem_copy. */
typedef enum ccq_copy_kind {
    CCQ_COPY_TO_DEVICE, /**< host memory -> device memory */
    CCQ_COPY_TO_HOST,   /**< device memory -> host memory */
} ccq_copy_kind;

/**
 * Allocate @p bytes of memory that @p device's collectives can use (host memory on the host
 * backend, cudaMalloc'd device memory on NCCL), 64-byte aligned at least. Lets tools and
 * tests stay backend-neutral. Thread-safe.
 * @return CCQ_OK; CCQ_ERR_INVALID_ARGUMENT; CCQ_ERR_NO_MEMORY; CCQ_ERR_BACKEND.
 */
CCQ_API ccq_status ccq_mem_alloc(ccq_runtime *rt, ccq_device_id device, size_t bytes, void **out);

/** Free memory from ccq_mem_alloc (NULL is a no-op). Thread-safe. */
CCQ_API ccq_status ccq_mem_free(ccq_runtime *rt, ccq_device_id device, void *ptr);

/**
 * Copy between host memory and memory from ccq_mem_alloc on @p device; returns when the
 * copy is complete. Thread-safe. Not ordered with queued commands: fence first.
 */
CCQ_API ccq_status ccq_mem_copy(ccq_runtime *rt, ccq_device_id device, void *dst, const void *src,
                                size_t bytes, ccq_copy_kind kind);

/** Size in bytes of one element of @p dtype (0 for an invalid value). */
CCQ_API size_t ccq_dtype_size(ccq_dtype dtype);

/** Name of a dtype ("float32"), or "?" */
CCQ_API const char *ccq_dtype_name(ccq_dtype dtype);

/** Name of a reduce op ("sum"), or "?" */
CCQ_API const char *ccq_reduce_op_name(ccq_reduce_op op);

#ifdef __cplusplus
}
#endif

#endif /* CCQ_H */
