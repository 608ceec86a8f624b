/* Argument validation (DESIGN rule 6) as one table: every public call, each class of bad
 * input, the status it must return, a word its detail must contain, and nothing queued.
 * `test_validation --markdown` prints the same table for docs/reliability.md. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ccq.h"
#include "ccq/ccq_nccl.h"
#include "runtime/internal.h"

enum { NDEV = 4, N = 16 };

/*
 * What every row runs against. `rt` is live (4 host devices, default max_streams = 64,
 * communicator {0,1,2,3} initialised); `down` had the same communicator and has been shut
 * down. The last fields are written by a row for the walker, which cleans up after it.
 */
typedef struct fixture {
    ccq_runtime *rt;
    ccq_runtime *down;
    float buf[64]; /* src = buf, dst = buf + 32: N floats each, disjoint */
    float *src, *dst;
    void *mem; /* ccq_mem_alloc'd on device 0 of rt */
    ccq_device_id all[NDEV];
    ccq_device_id dup[NDEV];      /* {0,1,1,3} */
    ccq_device_id unknown[NDEV];  /* {0,1,2,7} */
    ccq_device_id five[NDEV + 1]; /* {0,1,2,3,0} */
    ccq_device_id no_self[3];     /* {1,2,3}: lacks device 0 */
    ccq_device_id pair[2];        /* {0,1}: never passed to ccq_comm_init on rt */
    char text[32];                /* a caller's buffer for ccq_stream_last_error */
    ccq_runtime *made;            /* a runtime a refused call created anyway */
    void *made_mem;               /* memory a refused ccq_mem_alloc returned anyway */
    char note[160];               /* another broken promise (an out-parameter not reset) */
} fixture;

/* A detail no ccq call writes: if it survives the call, the call set no detail at all. */
static const char stale_detail[] = "(stale: set by the test before the call)";

/* ---- runtime creation ---------------------------------------------------------------- */

/* Create from `cfg` (NULL = defaults); on error `out` must come back NULL. */
static ccq_status try_create(fixture *f, const ccq_config *cfg)
{
    ccq_runtime *out = (ccq_runtime *)(void *)f; /* any non-NULL value */
    ccq_status st = ccq_runtime_create(cfg, &out);

    if (st == CCQ_OK)
        f->made = out;
    else if (out != NULL)
        snprintf(f->note, sizeof f->note, "ccq_runtime_create left *out non-NULL");
    return st;
}

/* Create with a malformed CCQ_* variable in the environment, from ccq_config_init()'s
 * config (`from_init`) or from NULL (which reads the environment itself). */
static ccq_status env_create(fixture *f, const char *name, const char *value, bool from_init)
{
    ccq_config cfg;
    ccq_status st;

    setenv(name, value, 1);
    ccq_config_init(&cfg);
    st = try_create(f, from_init ? &cfg : NULL);
    /* After the call: cfg.backend may point into the environment. */
    unsetenv(name);
    return st;
}

/* A row that changes one field of ccq_config_init()'s config. */
#define CONFIG_ROW(fn, change)                                                                     \
    static ccq_status fn(fixture *f)                                                               \
    {                                                                                              \
        ccq_config cfg;                                                                            \
        ccq_config_init(&cfg);                                                                     \
        change;                                                                                    \
        return try_create(f, &cfg);                                                                \
    }

/* A row that is one call. */
#define ROW(fn, call)                                                                              \
    static ccq_status fn(fixture *f)                                                               \
    {                                                                                              \
        (void)f;                                                                                   \
        return (call);                                                                             \
    }

ROW(create_out_null, ccq_runtime_create(NULL, NULL))
static ccq_status create_out_null_cfg(fixture *f)
{
    ccq_config cfg;
    (void)f;
    ccq_config_init(&cfg);
    return ccq_runtime_create(&cfg, NULL);
}
CONFIG_ROW(create_size_0, cfg.struct_size = 0)
CONFIG_ROW(create_size_3, cfg.struct_size = 3)
CONFIG_ROW(create_size_big, cfg.struct_size = sizeof cfg + 8)
CONFIG_ROW(create_backend_null, cfg.backend = NULL)
CONFIG_ROW(create_backend_tpu, cfg.backend = "tpu")
CONFIG_ROW(create_backend_empty, cfg.backend = "")
CONFIG_ROW(create_devices_0, cfg.host_devices = 0)
CONFIG_ROW(create_devices_big, cfg.host_devices = CCQ_MAX_DEVICES + 1)
CONFIG_ROW(create_streams_0, cfg.max_streams = 0)
CONFIG_ROW(create_streams_big, cfg.max_streams = CCQ_MAX_STREAMS_MAX + 1)
CONFIG_ROW(create_depth_0, cfg.queue_depth = 0)
CONFIG_ROW(create_depth_big, cfg.queue_depth = CCQ_QUEUE_DEPTH_MAX + 1)
CONFIG_ROW(create_batch_0, cfg.max_batch_ops = 0)
CONFIG_ROW(create_batch_big, cfg.max_batch_ops = CCQ_MAX_BATCH_MAX + 1)
/* timeout_ms * 1000000 must fit in 64 bits, as CCQ_TIMEOUT_MS enforces. */
CONFIG_ROW(create_timeout_wrap, cfg.timeout_ms = UINT64_MAX / 1000000u + 1)
CONFIG_ROW(create_spin_big, cfg.spin_us = 1000001)
CONFIG_ROW(create_fault_kind, cfg.fault = "explode:op=1")
CONFIG_ROW(create_fault_syntax, cfg.fault = "fail")
CONFIG_ROW(create_flags_bit, cfg.flags = 0x2u)
CONFIG_ROW(create_flags_high, cfg.flags = CCQ_FLAG_NONBLOCKING_SUBMIT | 0x80000000u)
ROW(env_devices_abc, env_create(f, "CCQ_HOST_DEVICES", "abc", true))
ROW(env_devices_neg, env_create(f, "CCQ_HOST_DEVICES", "-1", true))
ROW(env_streams_big, env_create(f, "CCQ_MAX_STREAMS", "65537", true))
ROW(env_depth_huge, env_create(f, "CCQ_QUEUE_DEPTH", "99999999999999999999999", true))
ROW(env_batch_space, env_create(f, "CCQ_MAX_BATCH_OPS", " ", true))
ROW(env_timeout_word, env_create(f, "CCQ_TIMEOUT_MS", "soon", true))
ROW(env_workers_word, env_create(f, "CCQ_HOST_WORKERS", "many", true))
ROW(env_spin_big, env_create(f, "CCQ_SPIN_US", "2000000", true))
ROW(env_stream_suffix, env_create(f, "CCQ_HOST_STREAM_BYTES", "64M", true))
CONFIG_ROW(create_hb_big, cfg.heartbeat_ms = 3600001)
CONFIG_ROW(create_hb_timeout_short, (cfg.heartbeat_ms = 500, cfg.heartbeat_timeout_ms = 900))
ROW(env_hb_word, env_create(f, "CCQ_HEARTBEAT_MS", "often", true))
ROW(env_hb_timeout_neg, env_create(f, "CCQ_HEARTBEAT_TIMEOUT_MS", "-5", true))
ROW(pstate_null_rt, ccq_world_process_state(NULL, 0, &(ccq_process_state){0}))
ROW(pstate_null_out, ccq_world_process_state(f->rt, 0, NULL))
ROW(pstate_process_1, ccq_world_process_state(f->rt, 1, &(ccq_process_state){0}))
ROW(progress_null_rt, ccq_world_progress(NULL, NULL, 0, &(size_t){0}))
ROW(progress_null_n, ccq_world_progress(f->rt, NULL, 0, NULL))
ROW(progress_null_out, ccq_world_progress(f->rt, NULL, 4, &(size_t){0}))
static ccq_status progress_size_0(fixture *f)
{
    ccq_progress p[2];
    size_t n;
    memset(p, 0, sizeof p);
    return ccq_world_progress(f->rt, p, 2, &n);
}
ROW(env_nonblock_2, env_create(f, "CCQ_NONBLOCKING_SUBMIT", "2", false))
ROW(env_fault_bad, env_create(f, "CCQ_FAULT", "drop:rank=x", false))
ROW(env_backend_unknown, env_create(f, "CCQ_BACKEND", "quantum", false))

ROW(shutdown_null, ccq_runtime_shutdown(NULL))

/* ---- communicators and submissions --------------------------------------------------- */

ROW(comm_null_rt, ccq_comm_init(NULL, f->all, NDEV))
ROW(comm_null_devices, ccq_comm_init(f->rt, NULL, NDEV))
ROW(comm_n0, ccq_comm_init(f->rt, f->all, 0))
ROW(comm_unknown, ccq_comm_init(f->rt, f->unknown, NDEV))
ROW(comm_dup, ccq_comm_init(f->rt, f->dup, NDEV))
ROW(comm_five, ccq_comm_init(f->rt, f->five, NDEV + 1))
ROW(comm_n_max, ccq_comm_init(f->rt, f->all, SIZE_MAX))
ROW(comm_down, ccq_comm_init(f->down, f->all, NDEV))
ROW(comm_down_new, ccq_comm_init(f->down, f->pair, 2))

#define AR(rt, dev, stream, src, dst, count, dtype, op, devs, n)                                   \
    ccq_all_reduce(rt, dev, stream, src, dst, count, dtype, op, devs, n)
ROW(ar_null_rt, AR(NULL, 0, 0, f->src, f->dst, N, CCQ_FLOAT32, CCQ_SUM, f->all, NDEV))
ROW(ar_dev_4, AR(f->rt, 4, 0, f->src, f->dst, N, CCQ_FLOAT32, CCQ_SUM, f->all, NDEV))
ROW(ar_dev_max, AR(f->rt, UINT32_MAX, 0, f->src, f->dst, N, CCQ_FLOAT32, CCQ_SUM, f->all, NDEV))
ROW(ar_stream_64, AR(f->rt, 0, 64, f->src, f->dst, N, CCQ_FLOAT32, CCQ_SUM, f->all, NDEV))
ROW(ar_stream_max, AR(f->rt, 0, UINT32_MAX, f->src, f->dst, N, CCQ_FLOAT32, CCQ_SUM, f->all, NDEV))
ROW(ar_dtype_count, AR(f->rt, 0, 0, f->src, f->dst, N, CCQ_DTYPE_COUNT_, CCQ_SUM, f->all, NDEV))
ROW(ar_dtype_neg, AR(f->rt, 0, 0, f->src, f->dst, N, (ccq_dtype)-1, CCQ_SUM, f->all, NDEV))
ROW(ar_op_count,
    AR(f->rt, 0, 0, f->src, f->dst, N, CCQ_FLOAT32, CCQ_REDUCE_OP_COUNT_, f->all, NDEV))
ROW(ar_op_neg, AR(f->rt, 0, 0, f->src, f->dst, N, CCQ_FLOAT32, (ccq_reduce_op)-1, f->all, NDEV))
ROW(ar_count_wrap,
    AR(f->rt, 0, 0, f->src, f->dst, SIZE_MAX / 2, CCQ_FLOAT32, CCQ_SUM, f->all, NDEV))
ROW(ar_count_ptrdiff, AR(f->rt, 0, 0, f->src, f->dst, SIZE_MAX, CCQ_INT8, CCQ_SUM, f->all, NDEV))
ROW(ar_count_f64,
    AR(f->rt, 0, 0, f->src, f->dst, PTRDIFF_MAX / 8 + 1, CCQ_FLOAT64, CCQ_SUM, f->all, NDEV))
ROW(ar_null_src, AR(f->rt, 0, 0, NULL, f->dst, N, CCQ_FLOAT32, CCQ_SUM, f->all, NDEV))
ROW(ar_null_dst, AR(f->rt, 0, 0, f->src, NULL, N, CCQ_FLOAT32, CCQ_SUM, f->all, NDEV))
ROW(ar_overlap_up, AR(f->rt, 0, 0, f->buf, f->buf + 1, N, CCQ_FLOAT32, CCQ_SUM, f->all, NDEV))
ROW(ar_overlap_down, AR(f->rt, 0, 0, f->buf + 1, f->buf, N, CCQ_FLOAT32, CCQ_SUM, f->all, NDEV))
ROW(ar_overlap_byte, AR(f->rt, 0, 0, f->buf, (char *)f->buf + N * sizeof(float) - 1, N, CCQ_FLOAT32,
                        CCQ_SUM, f->all, NDEV))
ROW(ar_null_devices, AR(f->rt, 0, 0, f->src, f->dst, N, CCQ_FLOAT32, CCQ_SUM, NULL, NDEV))
ROW(ar_n0, AR(f->rt, 0, 0, f->src, f->dst, N, CCQ_FLOAT32, CCQ_SUM, f->all, 0))
ROW(ar_unknown, AR(f->rt, 0, 0, f->src, f->dst, N, CCQ_FLOAT32, CCQ_SUM, f->unknown, NDEV))
ROW(ar_dup, AR(f->rt, 0, 0, f->src, f->dst, N, CCQ_FLOAT32, CCQ_SUM, f->dup, NDEV))
ROW(ar_five, AR(f->rt, 0, 0, f->src, f->dst, N, CCQ_FLOAT32, CCQ_SUM, f->five, NDEV + 1))
ROW(ar_n_max, AR(f->rt, 0, 0, f->src, f->dst, N, CCQ_FLOAT32, CCQ_SUM, f->all, SIZE_MAX))
ROW(ar_no_self, AR(f->rt, 0, 0, f->src, f->dst, N, CCQ_FLOAT32, CCQ_SUM, f->no_self, 3))
ROW(ar_never, AR(f->rt, 0, 0, f->src, f->dst, N, CCQ_FLOAT32, CCQ_SUM, f->pair, 2))
ROW(ar_down, AR(f->down, 0, 0, f->src, f->dst, N, CCQ_FLOAT32, CCQ_SUM, f->all, NDEV))

ROW(send_null_rt, ccq_send(NULL, 0, 0, f->src, N, CCQ_FLOAT32, 1))
ROW(send_dev_4, ccq_send(f->rt, 4, 0, f->src, N, CCQ_FLOAT32, 1))
ROW(send_stream_64, ccq_send(f->rt, 0, 64, f->src, N, CCQ_FLOAT32, 1))
ROW(send_dtype, ccq_send(f->rt, 0, 0, f->src, N, CCQ_DTYPE_COUNT_, 1))
ROW(send_count_wrap, ccq_send(f->rt, 0, 0, f->src, SIZE_MAX / 2, CCQ_FLOAT32, 1))
ROW(send_count_ptrdiff, ccq_send(f->rt, 0, 0, f->src, SIZE_MAX, CCQ_UINT8, 1))
ROW(send_null_src, ccq_send(f->rt, 0, 0, NULL, N, CCQ_FLOAT32, 1))
ROW(send_peer_4, ccq_send(f->rt, 0, 0, f->src, N, CCQ_FLOAT32, 4))
ROW(send_peer_max, ccq_send(f->rt, 0, 0, f->src, N, CCQ_FLOAT32, UINT32_MAX))
ROW(send_down, ccq_send(f->down, 0, 0, f->src, N, CCQ_FLOAT32, 1))

ROW(recv_null_rt, ccq_recv(NULL, 1, 0, f->dst, N, CCQ_FLOAT32, 0))
ROW(recv_dev_4, ccq_recv(f->rt, 4, 0, f->dst, N, CCQ_FLOAT32, 0))
ROW(recv_stream_max, ccq_recv(f->rt, 1, UINT32_MAX, f->dst, N, CCQ_FLOAT32, 0))
ROW(recv_dtype, ccq_recv(f->rt, 1, 0, f->dst, N, (ccq_dtype)-3, 0))
ROW(recv_count_wrap, ccq_recv(f->rt, 1, 0, f->dst, SIZE_MAX / 4 + 1, CCQ_INT64, 0))
ROW(recv_count_ptrdiff, ccq_recv(f->rt, 1, 0, f->dst, SIZE_MAX, CCQ_FLOAT8E4M3, 0))
ROW(recv_null_dst, ccq_recv(f->rt, 1, 0, NULL, N, CCQ_FLOAT32, 0))
ROW(recv_peer_4, ccq_recv(f->rt, 1, 0, f->dst, N, CCQ_FLOAT32, 4))
ROW(recv_down, ccq_recv(f->down, 1, 0, f->dst, N, CCQ_FLOAT32, 0))

/* ---- fences, errors and counters ----------------------------------------------------- */

ROW(sync_null_rt, ccq_sync_collective(NULL, 0, 0))
ROW(sync_dev_4, ccq_sync_collective(f->rt, 4, 0))
ROW(sync_stream_64, ccq_sync_collective(f->rt, 0, 64))
ROW(sync_stream_max, ccq_sync_collective(f->rt, 0, UINT32_MAX))

ROW(last_null_rt, ccq_stream_last_error(NULL, 0, 0, f->text, sizeof f->text))
ROW(last_dev_4, ccq_stream_last_error(f->rt, 4, 0, f->text, sizeof f->text))
ROW(last_stream_64, ccq_stream_last_error(f->rt, 0, 64, f->text, sizeof f->text))
ROW(last_null_buf, ccq_stream_last_error(f->rt, 0, 0, NULL, sizeof f->text))

static ccq_status stats_sized(fixture *f, ccq_runtime *rt, uint32_t size)
{
    ccq_stats st;
    (void)f;
    memset(&st, 0, sizeof st);
    st.struct_size = size;
    return ccq_get_stats(rt, &st);
}
ROW(stats_null_rt, stats_sized(f, NULL, sizeof(ccq_stats)))
ROW(stats_null_out, ccq_get_stats(f->rt, NULL))
ROW(stats_size_0, stats_sized(f, f->rt, 0))
ROW(stats_size_small, stats_sized(f, f->rt, offsetof(ccq_stats, batch_size_hist) - 1))
ROW(stats_size_big, stats_sized(f, f->rt, sizeof(ccq_stats) + 1))

/* ---- memory -------------------------------------------------------------------------- */

/* Allocate; on error `out` must come back NULL. */
static ccq_status try_alloc(fixture *f, ccq_runtime *rt, ccq_device_id device, size_t bytes)
{
    void *out = f; /* any non-NULL value */
    ccq_status st = ccq_mem_alloc(rt, device, bytes, &out);

    if (st == CCQ_OK)
        f->made_mem = out;
    else if (out != NULL)
        snprintf(f->note, sizeof f->note, "ccq_mem_alloc left *out non-NULL");
    return st;
}
ROW(alloc_null_out, ccq_mem_alloc(f->rt, 0, 64, NULL))
ROW(alloc_null_rt, try_alloc(f, NULL, 0, 64))
ROW(alloc_dev_4, try_alloc(f, f->rt, 4, 64))
ROW(alloc_dev_max, try_alloc(f, f->rt, UINT32_MAX, 64))
ROW(alloc_size_max, try_alloc(f, f->rt, 0, SIZE_MAX))

ROW(free_null_rt, ccq_mem_free(NULL, 0, f->mem))
ROW(free_dev_4, ccq_mem_free(f->rt, 4, f->mem))

ROW(copy_null_rt, ccq_mem_copy(NULL, 0, f->mem, f->src, 64, CCQ_COPY_TO_DEVICE))
ROW(copy_dev_4, ccq_mem_copy(f->rt, 4, f->mem, f->src, 64, CCQ_COPY_TO_DEVICE))
ROW(copy_kind_2, ccq_mem_copy(f->rt, 0, f->mem, f->src, 64, (ccq_copy_kind)2))
ROW(copy_kind_neg, ccq_mem_copy(f->rt, 0, f->dst, f->mem, 64, (ccq_copy_kind)-1))
ROW(copy_null_dst, ccq_mem_copy(f->rt, 0, NULL, f->src, 64, CCQ_COPY_TO_DEVICE))
ROW(copy_null_src, ccq_mem_copy(f->rt, 0, f->dst, NULL, 64, CCQ_COPY_TO_HOST))

ROW(bind_null_rt, ccq_nccl_bind_stream(NULL, 0, 0, NULL))
ROW(bind_host, ccq_nccl_bind_stream(f->rt, 0, 0, NULL))
ROW(bind_host_bad_stream, ccq_nccl_bind_stream(f->rt, 0, 64, NULL))

/* ---- the table ----------------------------------------------------------------------- */

typedef struct vcase {
    const char *call;   /* the public call */
    const char *cls;    /* the class of bad input */
    const char *input;  /* the input, in a few words (Markdown) */
    ccq_status want;    /* the status it must return */
    const char *detail; /* must appear in ccq_last_error_detail() */
    ccq_status (*run)(fixture *f);
} vcase;

#define E_ARG  CCQ_ERR_INVALID_ARGUMENT
#define E_DOWN CCQ_ERR_SHUTDOWN

/* clang-format off */
static const vcase cases[] = {
    {"ccq_runtime_create", "NULL pointer", "`out` = NULL, `cfg` = NULL", E_ARG, "out is NULL", create_out_null},
    {"ccq_runtime_create", "NULL pointer", "`out` = NULL, valid `cfg`", E_ARG, "out is NULL", create_out_null_cfg},
    {"ccq_runtime_create", "struct_size", "`struct_size` = 0", E_ARG, "struct_size is 0", create_size_0},
    {"ccq_runtime_create", "struct_size", "`struct_size` = 3 (smaller than any ccq_config)", E_ARG, "struct_size is 3", create_size_3},
    {"ccq_runtime_create", "struct_size", "`struct_size` = sizeof(ccq_config) + 8 (newer than the library)", E_ARG, "struct_size", create_size_big},
    {"ccq_runtime_create", "bad config field", "`backend` = NULL", E_ARG, "backend is NULL", create_backend_null},
    {"ccq_runtime_create", "unknown backend", "`backend` = \"tpu\"", E_ARG, "unknown backend \"tpu\"", create_backend_tpu},
    {"ccq_runtime_create", "unknown backend", "`backend` = \"\"", E_ARG, "unknown backend", create_backend_empty},
    {"ccq_runtime_create", "bad config field", "`host_devices` = 0", E_ARG, "host_devices is 0", create_devices_0},
    {"ccq_runtime_create", "bad config field", "`host_devices` = 1025", E_ARG, "host_devices is 1025", create_devices_big},
    {"ccq_runtime_create", "bad config field", "`max_streams` = 0", E_ARG, "max_streams is 0", create_streams_0},
    {"ccq_runtime_create", "bad config field", "`max_streams` = 65537", E_ARG, "max_streams is 65537", create_streams_big},
    {"ccq_runtime_create", "bad config field", "`queue_depth` = 0", E_ARG, "queue_depth is 0", create_depth_0},
    {"ccq_runtime_create", "bad config field", "`queue_depth` = 2^20 + 1", E_ARG, "queue_depth is 1048577", create_depth_big},
    {"ccq_runtime_create", "bad config field", "`max_batch_ops` = 0", E_ARG, "max_batch_ops is 0", create_batch_0},
    {"ccq_runtime_create", "bad config field", "`max_batch_ops` = 65537", E_ARG, "max_batch_ops is 65537", create_batch_big},
    {"ccq_runtime_create", "bad config field", "`timeout_ms` = UINT64_MAX / 10^6 + 1 (overflows in ns)", E_ARG, "timeout_ms", create_timeout_wrap},
    {"ccq_runtime_create", "bad config field", "`spin_us` = 1000001", E_ARG, "spin_us is 1000001", create_spin_big},
    {"ccq_runtime_create", "bad config field", "`fault` = \"explode:op=1\" (unknown kind)", E_ARG, "ccq_config.fault (CCQ_FAULT): fault spec: unknown kind", create_fault_kind},
    {"ccq_runtime_create", "bad config field", "`fault` = \"fail\" (no key=value)", E_ARG, "ccq_config.fault", create_fault_syntax},
    {"ccq_runtime_create", "bad config field", "`flags` = 0x2 (unknown bit)", E_ARG, "flags has unknown bits 0x2", create_flags_bit},
    {"ccq_runtime_create", "bad config field", "`flags` = NONBLOCKING_SUBMIT + 0x80000000", E_ARG, "unknown bits 0x80000000", create_flags_high},
    {"ccq_runtime_create", "malformed env var", "CCQ_HOST_DEVICES=abc", E_ARG, "CCQ_HOST_DEVICES", env_devices_abc},
    {"ccq_runtime_create", "malformed env var", "CCQ_HOST_DEVICES=-1", E_ARG, "CCQ_HOST_DEVICES", env_devices_neg},
    {"ccq_runtime_create", "malformed env var", "CCQ_MAX_STREAMS=65537", E_ARG, "CCQ_MAX_STREAMS", env_streams_big},
    {"ccq_runtime_create", "malformed env var", "CCQ_QUEUE_DEPTH=99999999999999999999999", E_ARG, "CCQ_QUEUE_DEPTH", env_depth_huge},
    {"ccq_runtime_create", "malformed env var", "CCQ_MAX_BATCH_OPS=\" \"", E_ARG, "CCQ_MAX_BATCH_OPS", env_batch_space},
    {"ccq_runtime_create", "malformed env var", "CCQ_TIMEOUT_MS=soon", E_ARG, "CCQ_TIMEOUT_MS", env_timeout_word},
    {"ccq_runtime_create", "malformed env var", "CCQ_HOST_WORKERS=many", E_ARG, "CCQ_HOST_WORKERS", env_workers_word},
    {"ccq_runtime_create", "malformed env var", "CCQ_SPIN_US=2000000", E_ARG, "CCQ_SPIN_US", env_spin_big},
    {"ccq_runtime_create", "malformed env var", "CCQ_HOST_STREAM_BYTES=64M", E_ARG, "CCQ_HOST_STREAM_BYTES", env_stream_suffix},
    {"ccq_runtime_create", "bad config field", "`heartbeat_ms` = 3600001", E_ARG, "heartbeat_ms is 3600001", create_hb_big},
    {"ccq_runtime_create", "bad config field", "`heartbeat_ms` = 500, `heartbeat_timeout_ms` = 900 (less than two heartbeats)", E_ARG, "at least two heartbeats", create_hb_timeout_short},
    {"ccq_runtime_create", "malformed env var", "CCQ_HEARTBEAT_MS=often", E_ARG, "CCQ_HEARTBEAT_MS", env_hb_word},
    {"ccq_runtime_create", "malformed env var", "CCQ_HEARTBEAT_TIMEOUT_MS=-5", E_ARG, "CCQ_HEARTBEAT_TIMEOUT_MS", env_hb_timeout_neg},
    {"ccq_runtime_create", "malformed env var", "CCQ_NONBLOCKING_SUBMIT=2, `cfg` = NULL", E_ARG, "CCQ_NONBLOCKING_SUBMIT", env_nonblock_2},
    {"ccq_runtime_create", "malformed env var", "CCQ_FAULT=drop:rank=x, `cfg` = NULL", E_ARG, "fault spec", env_fault_bad},
    {"ccq_runtime_create", "unknown backend", "CCQ_BACKEND=quantum, `cfg` = NULL", E_ARG, "unknown backend \"quantum\"", env_backend_unknown},

    {"ccq_runtime_shutdown", "NULL handle", "`rt` = NULL", E_ARG, "rt is NULL", shutdown_null},

    {"ccq_comm_init", "NULL handle", "`rt` = NULL", E_ARG, "rt is NULL", comm_null_rt},
    {"ccq_comm_init", "NULL pointer", "`devices` = NULL", E_ARG, "devices is NULL", comm_null_devices},
    {"ccq_comm_init", "n == 0", "`n` = 0", E_ARG, "n == 0", comm_n0},
    {"ccq_comm_init", "unknown device", "{0,1,2,7}", E_ARG, "devices[3] = 7 does not exist", comm_unknown},
    {"ccq_comm_init", "duplicate device", "{0,1,1,3}", E_ARG, "device 1 appears twice", comm_dup},
    {"ccq_comm_init", "duplicate device", "{0,1,2,3,0}: more devices than the runtime has", E_ARG, "5 devices given", comm_five},
    {"ccq_comm_init", "size overflow", "`n` = SIZE_MAX", E_ARG, "devices given", comm_n_max},
    {"ccq_comm_init", "after shutdown", "{0,1,2,3}, initialised before the shutdown", E_DOWN, "shutting down", comm_down},
    {"ccq_comm_init", "after shutdown", "{0,1}, a new set", E_DOWN, "shutting down", comm_down_new},

    {"ccq_all_reduce", "NULL handle", "`rt` = NULL", E_ARG, "rt is NULL", ar_null_rt},
    {"ccq_all_reduce", "unknown device", "`device` = 4", E_ARG, "device 4 does not exist", ar_dev_4},
    {"ccq_all_reduce", "unknown device", "`device` = UINT32_MAX", E_ARG, "device 4294967295 does not exist", ar_dev_max},
    {"ccq_all_reduce", "stream out of range", "`stream` = 64 (= max_streams)", E_ARG, "stream 64 out of range", ar_stream_64},
    {"ccq_all_reduce", "stream out of range", "`stream` = UINT32_MAX", E_ARG, "stream 4294967295 out of range", ar_stream_max},
    {"ccq_all_reduce", "invalid dtype", "`dtype` = CCQ_DTYPE_COUNT_", E_ARG, "invalid dtype 12", ar_dtype_count},
    {"ccq_all_reduce", "invalid dtype", "`dtype` = -1", E_ARG, "invalid dtype -1", ar_dtype_neg},
    {"ccq_all_reduce", "invalid op", "`op` = CCQ_REDUCE_OP_COUNT_", E_ARG, "invalid reduce op 5", ar_op_count},
    {"ccq_all_reduce", "invalid op", "`op` = -1", E_ARG, "invalid reduce op -1", ar_op_neg},
    {"ccq_all_reduce", "size overflow", "`count` = SIZE_MAX / 2 of float32 (bytes wrap)", E_ARG, "overflows", ar_count_wrap},
    {"ccq_all_reduce", "size overflow", "`count` = SIZE_MAX of int8 (> PTRDIFF_MAX bytes)", E_ARG, "overflows", ar_count_ptrdiff},
    {"ccq_all_reduce", "size overflow", "`count` = PTRDIFF_MAX / 8 + 1 of float64", E_ARG, "overflows", ar_count_f64},
    {"ccq_all_reduce", "NULL pointer", "`src` = NULL, `count` > 0", E_ARG, "src is NULL", ar_null_src},
    {"ccq_all_reduce", "NULL pointer", "`dst` = NULL, `count` > 0", E_ARG, "dst is NULL", ar_null_dst},
    {"ccq_all_reduce", "partial overlap", "`dst` = `src` + 1 element", E_ARG, "src and dst overlap", ar_overlap_up},
    {"ccq_all_reduce", "partial overlap", "`src` = `dst` + 1 element", E_ARG, "src and dst overlap", ar_overlap_down},
    {"ccq_all_reduce", "partial overlap", "last byte of `src` = first byte of `dst`", E_ARG, "src and dst overlap", ar_overlap_byte},
    {"ccq_all_reduce", "NULL pointer", "`devices` = NULL", E_ARG, "devices is NULL", ar_null_devices},
    {"ccq_all_reduce", "n == 0", "`n` = 0", E_ARG, "n == 0", ar_n0},
    {"ccq_all_reduce", "unknown device", "{0,1,2,7}", E_ARG, "devices[3] = 7 does not exist", ar_unknown},
    {"ccq_all_reduce", "duplicate device", "{0,1,1,3}", E_ARG, "device 1 appears twice", ar_dup},
    {"ccq_all_reduce", "duplicate device", "{0,1,2,3,0}: more devices than the runtime has", E_ARG, "5 devices given", ar_five},
    {"ccq_all_reduce", "size overflow", "`n` = SIZE_MAX", E_ARG, "devices given", ar_n_max},
    {"ccq_all_reduce", "missing self", "`device` = 0, set {1,2,3}", E_ARG, "device 0 is not in the device set", ar_no_self},
    {"ccq_all_reduce", "not initialised", "set {0,1}, never passed to ccq_comm_init", CCQ_ERR_NOT_INITIALIZED, "no communicator for device set {0,1}", ar_never},
    {"ccq_all_reduce", "after shutdown", "valid call, runtime shut down", E_DOWN, "shutting down", ar_down},

    {"ccq_send", "NULL handle", "`rt` = NULL", E_ARG, "rt is NULL", send_null_rt},
    {"ccq_send", "unknown device", "`device` = 4", E_ARG, "device 4 does not exist", send_dev_4},
    {"ccq_send", "stream out of range", "`stream` = 64", E_ARG, "stream 64 out of range", send_stream_64},
    {"ccq_send", "invalid dtype", "`dtype` = CCQ_DTYPE_COUNT_", E_ARG, "invalid dtype 12", send_dtype},
    {"ccq_send", "size overflow", "`count` = SIZE_MAX / 2 of float32 (bytes wrap)", E_ARG, "overflows", send_count_wrap},
    {"ccq_send", "size overflow", "`count` = SIZE_MAX of uint8 (> PTRDIFF_MAX bytes)", E_ARG, "overflows", send_count_ptrdiff},
    {"ccq_send", "NULL pointer", "`src` = NULL, `count` > 0", E_ARG, "src is NULL", send_null_src},
    {"ccq_send", "unknown device", "`peer` = 4", E_ARG, "peer device 4 does not exist", send_peer_4},
    {"ccq_send", "unknown device", "`peer` = UINT32_MAX", E_ARG, "peer device 4294967295 does not exist", send_peer_max},
    {"ccq_send", "after shutdown", "valid call, runtime shut down", E_DOWN, "shutting down", send_down},

    {"ccq_recv", "NULL handle", "`rt` = NULL", E_ARG, "rt is NULL", recv_null_rt},
    {"ccq_recv", "unknown device", "`device` = 4", E_ARG, "device 4 does not exist", recv_dev_4},
    {"ccq_recv", "stream out of range", "`stream` = UINT32_MAX", E_ARG, "stream 4294967295 out of range", recv_stream_max},
    {"ccq_recv", "invalid dtype", "`dtype` = -3", E_ARG, "invalid dtype -3", recv_dtype},
    {"ccq_recv", "size overflow", "`count` = SIZE_MAX / 4 + 1 of int64 (bytes wrap)", E_ARG, "overflows", recv_count_wrap},
    {"ccq_recv", "size overflow", "`count` = SIZE_MAX of float8e4m3 (> PTRDIFF_MAX bytes)", E_ARG, "overflows", recv_count_ptrdiff},
    {"ccq_recv", "NULL pointer", "`dst` = NULL, `count` > 0", E_ARG, "dst is NULL", recv_null_dst},
    {"ccq_recv", "unknown device", "`peer` = 4", E_ARG, "peer device 4 does not exist", recv_peer_4},
    {"ccq_recv", "after shutdown", "valid call, runtime shut down", E_DOWN, "shutting down", recv_down},

    {"ccq_world_process_state", "NULL handle", "`rt` = NULL", E_ARG, "rt is NULL", pstate_null_rt},
    {"ccq_world_process_state", "NULL pointer", "`out` = NULL", E_ARG, "out is NULL", pstate_null_out},
    {"ccq_world_process_state", "unknown process", "`process` = 1 (a world of one)", E_ARG, "process 1 is not below world_size 1", pstate_process_1},

    {"ccq_world_progress", "NULL handle", "`rt` = NULL", E_ARG, "rt is NULL", progress_null_rt},
    {"ccq_world_progress", "NULL pointer", "`n` = NULL", E_ARG, "n is NULL", progress_null_n},
    {"ccq_world_progress", "NULL pointer", "`out` = NULL, `cap` = 4", E_ARG, "out is NULL", progress_null_out},
    {"ccq_world_progress", "struct_size", "`out[0].struct_size` = 0", E_ARG, "struct_size is 0", progress_size_0},

    {"ccq_sync_collective", "NULL handle", "`rt` = NULL", E_ARG, "rt is NULL", sync_null_rt},
    {"ccq_sync_collective", "unknown device", "`device` = 4", E_ARG, "device 4 does not exist", sync_dev_4},
    {"ccq_sync_collective", "stream out of range", "`stream` = 64", E_ARG, "stream 64 out of range", sync_stream_64},
    {"ccq_sync_collective", "stream out of range", "`stream` = UINT32_MAX", E_ARG, "stream 4294967295 out of range", sync_stream_max},

    {"ccq_stream_last_error", "NULL handle", "`rt` = NULL", E_ARG, "rt is NULL", last_null_rt},
    {"ccq_stream_last_error", "unknown device", "`device` = 4", E_ARG, "device 4 does not exist", last_dev_4},
    {"ccq_stream_last_error", "stream out of range", "`stream` = 64", E_ARG, "stream 64 out of range", last_stream_64},
    {"ccq_stream_last_error", "NULL pointer", "`buf` = NULL, `len` > 0", E_ARG, "buf is NULL", last_null_buf},

    {"ccq_get_stats", "NULL handle", "`rt` = NULL", E_ARG, "rt is NULL", stats_null_rt},
    {"ccq_get_stats", "NULL pointer", "`out` = NULL", E_ARG, "out is NULL", stats_null_out},
    {"ccq_get_stats", "struct_size", "`out->struct_size` = 0", E_ARG, "struct_size is 0", stats_size_0},
    {"ccq_get_stats", "struct_size", "`out->struct_size` too small for the seed counters", E_ARG, "struct_size", stats_size_small},
    {"ccq_get_stats", "struct_size", "`out->struct_size` = sizeof(ccq_stats) + 1", E_ARG, "struct_size", stats_size_big},

    {"ccq_mem_alloc", "NULL pointer", "`out` = NULL", E_ARG, "out is NULL", alloc_null_out},
    {"ccq_mem_alloc", "NULL handle", "`rt` = NULL", E_ARG, "rt is NULL", alloc_null_rt},
    {"ccq_mem_alloc", "unknown device", "`device` = 4", E_ARG, "device 4 does not exist", alloc_dev_4},
    {"ccq_mem_alloc", "unknown device", "`device` = UINT32_MAX", E_ARG, "device 4294967295 does not exist", alloc_dev_max},
    {"ccq_mem_alloc", "size overflow", "`bytes` = SIZE_MAX", E_ARG, "bytes", alloc_size_max},

    {"ccq_mem_free", "NULL handle", "`rt` = NULL", E_ARG, "rt is NULL", free_null_rt},
    {"ccq_mem_free", "unknown device", "`device` = 4", E_ARG, "device 4 does not exist", free_dev_4},

    {"ccq_mem_copy", "NULL handle", "`rt` = NULL", E_ARG, "rt is NULL", copy_null_rt},
    {"ccq_mem_copy", "unknown device", "`device` = 4", E_ARG, "device 4 does not exist", copy_dev_4},
    {"ccq_mem_copy", "invalid kind", "`kind` = 2", E_ARG, "invalid kind 2", copy_kind_2},
    {"ccq_mem_copy", "invalid kind", "`kind` = -1", E_ARG, "invalid kind -1", copy_kind_neg},
    {"ccq_mem_copy", "NULL pointer", "`dst` = NULL, `bytes` > 0", E_ARG, "dst is NULL", copy_null_dst},
    {"ccq_mem_copy", "NULL pointer", "`src` = NULL, `bytes` > 0", E_ARG, "src is NULL", copy_null_src},

    {"ccq_nccl_bind_stream", "NULL handle", "`rt` = NULL", E_ARG, "rt is NULL", bind_null_rt},
    {"ccq_nccl_bind_stream", "wrong backend", "host runtime", CCQ_ERR_UNSUPPORTED, "not \"nccl\"", bind_host},
    {"ccq_nccl_bind_stream", "wrong backend", "host runtime, `stream` = 64 (backend checked first)", CCQ_ERR_UNSUPPORTED, "not \"nccl\"", bind_host_bad_stream},
};
/* clang-format on */

enum { NCASES = sizeof cases / sizeof cases[0] };

/* ---- fixture ------------------------------------------------------------------------- */

/* Every CCQ_* variable ccq_config_init() reads: the rows must not depend on the caller's. */
static const char *const env_names[] = {
    "CCQ_BACKEND",      "CCQ_HOST_DEVICES",      "CCQ_MAX_STREAMS",
    "CCQ_QUEUE_DEPTH",  "CCQ_MAX_BATCH_OPS",     "CCQ_TIMEOUT_MS",
    "CCQ_HOST_WORKERS", "CCQ_SPIN_US",           "CCQ_NONBLOCKING_SUBMIT",
    "CCQ_FAULT",        "CCQ_HOST_STREAM_BYTES", "CCQ_HEARTBEAT_MS",
    "CCQ_HEARTBEAT_TIMEOUT_MS",
};

static ccq_runtime *make_rt(void)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_status st;

    ccq_config_init(&cfg);
    cfg.host_devices = NDEV;
    cfg.host_workers = 2;
    /* Bounded, so that a row which wrongly queued something fails the final check in
     * seconds (the watchdog) instead of hanging. */
    cfg.timeout_ms = 5000;
    st = ccq_runtime_create(&cfg, &rt);
    if (st != CCQ_OK)
        fail_msg("ccq_runtime_create: %s: %s", ccq_status_name(st), ccq_last_error_detail());
    return rt;
}

static int setup(void **state)
{
    static fixture fx;
    fixture *f = &fx;
    static const ccq_device_id all[NDEV] = {0, 1, 2, 3}, dup[NDEV] = {0, 1, 1, 3},
                               unknown[NDEV] = {0, 1, 2, 7}, five[NDEV + 1] = {0, 1, 2, 3, 0},
                               no_self[3] = {1, 2, 3}, pair[2] = {0, 1};

    for (size_t i = 0; i < sizeof env_names / sizeof env_names[0]; i++)
        unsetenv(env_names[i]);
    memset(f, 0, sizeof *f);
    memcpy(f->all, all, sizeof all);
    memcpy(f->dup, dup, sizeof dup);
    memcpy(f->unknown, unknown, sizeof unknown);
    memcpy(f->five, five, sizeof five);
    memcpy(f->no_self, no_self, sizeof no_self);
    memcpy(f->pair, pair, sizeof pair);
    f->src = f->buf;
    f->dst = f->buf + 32;

    f->rt = make_rt();
    f->down = make_rt();
    if (ccq_comm_init(f->rt, f->all, NDEV) != CCQ_OK ||
        ccq_comm_init(f->down, f->all, NDEV) != CCQ_OK)
        fail_msg("ccq_comm_init: %s", ccq_last_error_detail());
    if (ccq_mem_alloc(f->rt, 0, 256, &f->mem) != CCQ_OK)
        fail_msg("ccq_mem_alloc: %s", ccq_last_error_detail());
    if (ccq_runtime_shutdown(f->down) != CCQ_OK)
        fail_msg("ccq_runtime_shutdown failed");
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;

    if (f == NULL)
        return 0;
    ccq_mem_free(f->rt, 0, f->mem);
    ccq_runtime_destroy(f->rt);
    ccq_runtime_destroy(f->down);
    return 0;
}

static uint64_t submitted(ccq_runtime *rt)
{
    ccq_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    assert_int_equal(ccq_get_stats(rt, &st), CCQ_OK);
    return st.submitted;
}

/* ---- the tests ----------------------------------------------------------------------- */

/* Every row: its status, a detail that is set, non-empty and names the input, nothing
 * queued on either runtime. All rows run; the failures are listed together. */
static void test_table(void **state)
{
    fixture *f = *state;
    size_t failed = 0;

    assert_true(NCASES >= 70);
    for (size_t i = 0; i < NCASES; i++) {
        const vcase *c = &cases[i];
        char detail[CCQ_DETAIL_LEN], why[1024];
        size_t w = 0;
        uint64_t live = submitted(f->rt), down = submitted(f->down);
        ccq_status st;

        f->made = NULL;
        f->made_mem = NULL;
        f->note[0] = '\0';
        ccq_set_detail("%s", stale_detail);
        st = c->run(f);
        snprintf(detail, sizeof detail, "%s", ccq_last_error_detail());
        /* Undo what a call that should have been refused did anyway. */
        if (f->made != NULL)
            ccq_runtime_destroy(f->made);
        if (f->made_mem != NULL)
            ccq_mem_free(f->rt, 0, f->made_mem);

        why[0] = '\0';
        if (st != c->want)
            w += (size_t)snprintf(why + w, sizeof why - w, " status %s, want %s;",
                                  ccq_status_name(st), ccq_status_name(c->want));
        if (strcmp(detail, stale_detail) == 0)
            w += (size_t)snprintf(why + w, sizeof why - w, " detail not set by the call;");
        else if (detail[0] == '\0')
            w += (size_t)snprintf(why + w, sizeof why - w, " empty detail;");
        else if (strstr(detail, c->detail) == NULL)
            w += (size_t)snprintf(why + w, sizeof why - w, " detail lacks \"%s\";", c->detail);
        if (submitted(f->rt) != live || submitted(f->down) != down)
            w += (size_t)snprintf(why + w, sizeof why - w, " a command was queued;");
        if (f->note[0] != '\0')
            w += (size_t)snprintf(why + w, sizeof why - w, " %s;", f->note);
        if (w > 0) {
            print_error("row %zu: %s, %s: %s:%s\n    detail: \"%s\"\n", i + 1, c->call, c->cls,
                        c->input, why, detail);
            failed++;
        }
    }
    if (failed > 0)
        fail_msg("%zu of %d rows do not behave as documented", failed, (int)NCASES);
}

/*
 * After the walk the live runtime still works and no refused call used a sequence number:
 * the first real all_reduce and send/recv match across ranks and give the right data, and
 * the counters show exactly those commands.
 */
static void test_still_works(void **state)
{
    fixture *f = *state;
    int32_t in[NDEV][N], out[NDEV][N], a[N], b[N];
    char text[CCQ_DETAIL_LEN];
    ccq_stats st;

    assert_int_equal(submitted(f->rt), 0);
    for (int d = 0; d < NDEV; d++)
        for (int i = 0; i < N; i++) {
            in[d][i] = (d + 1) * 1000 + i;
            out[d][i] = -1;
        }
    for (ccq_device_id d = 0; d < NDEV; d++)
        assert_int_equal(
            ccq_all_reduce(f->rt, d, 0, in[d], out[d], N, CCQ_INT32, CCQ_SUM, f->all, NDEV),
            CCQ_OK);
    for (ccq_device_id d = 0; d < NDEV; d++) {
        ccq_status s = ccq_sync_collective(f->rt, d, 0);
        if (s != CCQ_OK)
            fail_msg("all_reduce fence on device %u: %s: %s", d, ccq_status_name(s),
                     ccq_last_error_detail());
    }
    for (int d = 0; d < NDEV; d++)
        for (int i = 0; i < N; i++)
            assert_int_equal(out[d][i], 10000 + 4 * i);

    for (int i = 0; i < N; i++) {
        a[i] = 7 * i - 3;
        b[i] = 0;
    }
    assert_int_equal(ccq_send(f->rt, 0, 0, a, N, CCQ_INT32, 1), CCQ_OK);
    assert_int_equal(ccq_recv(f->rt, 1, 0, b, N, CCQ_INT32, 0), CCQ_OK);
    for (ccq_device_id d = 0; d < 2; d++) {
        ccq_status s = ccq_sync_collective(f->rt, d, 0);
        if (s != CCQ_OK)
            fail_msg("send/recv fence on device %u: %s: %s", d, ccq_status_name(s),
                     ccq_last_error_detail());
    }
    assert_memory_equal(a, b, sizeof a);

    /* Refused calls recorded nothing on the stream they named. */
    assert_int_equal(ccq_stream_last_error(f->rt, 0, 0, text, sizeof text), CCQ_OK);
    assert_string_equal(text, "");

    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    assert_int_equal(ccq_get_stats(f->rt, &st), CCQ_OK);
    assert_int_equal(st.submitted, NDEV + 2);
    assert_int_equal(st.completed, NDEV + 2);
    assert_int_equal(st.failed, 0);
    assert_int_equal(st.cancelled, 0);
    assert_int_equal(submitted(f->down), 0);
}

/* The table as Markdown, for docs/reliability.md. */
static void print_markdown(void)
{
    printf("| call | bad input | status | detail contains |\n");
    printf("|---|---|---|---|\n");
    for (size_t i = 0; i < NCASES; i++)
        printf("| `%s` | %s: %s | `%s` | `%s` |\n", cases[i].call, cases[i].cls, cases[i].input,
               ccq_status_name(cases[i].want), cases[i].detail);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_still_works),
    };

    if (argc > 1 && strcmp(argv[1], "--markdown") == 0) {
        print_markdown();
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "usage: %s [--markdown]\n", argv[0]);
        return 2;
    }
    return cmocka_run_group_tests_name("validation", tests, setup, teardown);
}
