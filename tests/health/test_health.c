/* Job health (runtime/health/) with real processes forked by the test, on the fake NCCL across
 * processes, meeting through the file bootstrap: heartbeat records in the directory; a
 * process that destroys its runtime reads as left, never lost; one that dies without
 * destroying it is lost: CCQ_EV_PROCESS_LOST reaches the callback, a dump is written, the old
 * set refuses ccq_comm_init at once; ccq_world_progress shows who is behind; the watchdog's
 * detail of a batch that waits for a process says how that process is doing; the config's
 * fields and variables; a world of one. (tests/health/drill.c has the kill and stop drills.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ccq.h"
#include "fake/fake_cuda_nccl.h"
#include "runtime/health/health.h" /* ccq_health_peer_failed: what an engine calls */
#include "procs.h"
#include "test_util.h"

enum { N = 64 };

typedef struct hcase {
    char dir[64];
    char trace[128]; /* trace_file ("" = none) */
    uint32_t hb_ms, hb_timeout_ms;
    uint64_t timeout_ms;
    /* shared with the parent (MAP_SHARED): what the children saw */
    char detail[3][1024];
    ccq_progress prog[3][16];
    size_t nprog[3];
    int events[3];
    uint32_t event_device[3];
    uint32_t bad; /* gray_child: the process whose data link is down */
    bool pair;    /* gray_child: only the link between processes 1 and 2 is cut */
} hcase;

#define FAIL(code, ...)                                                                            \
    do {                                                                                           \
        fprintf(stderr, "process %u: ", rank);                                                     \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, " (%s)\n", ccq_last_error_detail());                                       \
        rc = (code);                                                                               \
        goto out;                                                                                  \
    } while (0)

static hcase *hcase_new(uint32_t hb_ms, uint32_t hb_timeout_ms, uint64_t timeout_ms)
{
    hcase *c = mmap(NULL, sizeof *c, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(c != MAP_FAILED);
    memset(c, 0, sizeof *c);
    procs_tmpdir(c->dir, sizeof c->dir);
    c->hb_ms = hb_ms;
    c->hb_timeout_ms = hb_timeout_ms;
    c->timeout_ms = timeout_ms;
    return c;
}

static void hcase_free(hcase *c)
{
    procs_rmdir(c->dir);
    fake_xproc_cleanup();
    munmap(c, sizeof *c);
}

static ccq_runtime *runtime(const hcase *c, unsigned rank, unsigned nprocs)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    char boot[96];

    fake_reset();
    fake_set_devices(1, 9);
    fake_set_xproc_timeout_ms(60000);
    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    cfg.timeout_ms = c->timeout_ms;
    cfg.world_rank = rank;
    cfg.world_size = nprocs;
    cfg.heartbeat_ms = c->hb_ms;
    cfg.heartbeat_timeout_ms = c->hb_timeout_ms;
    if (c->trace[0] != '\0')
        cfg.trace_file = c->trace;
    snprintf(boot, sizeof boot, "file:%s", c->dir);
    cfg.bootstrap = boot;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK)
        fprintf(stderr, "process %u: ccq_runtime_create: %s\n", rank, ccq_last_error_detail());
    return rt;
}

/* Poll a process's state until it is `want` or ms pass. */
static bool wait_state(ccq_runtime *rt, uint32_t p, ccq_process_state want, unsigned ms)
{
    for (unsigned t = 0; t < ms; t += 5) {
        ccq_process_state st;
        if (ccq_world_process_state(rt, p, &st) == CCQ_OK && st == want)
            return true;
        sleep_ms(5);
    }
    return false;
}

/* Wait (at most 5 s) until the heartbeats of every one of n processes say it completed `ops`
 * operations on the (one) communicator spanning them: a process may then act on its own. */
static void all_completed(ccq_runtime *rt, size_t n, uint64_t ops)
{
    for (int t = 0; t < 500; t++) {
        ccq_progress pr[8];
        size_t got = 0, done = 0;
        pr[0].struct_size = sizeof pr[0];
        ccq_world_progress(rt, pr, 8, &got);
        for (size_t k = 0; k < got && k < 8; k++)
            done += pr[k].completed >= ops;
        if (done == n)
            return;
        sleep_ms(10);
    }
}

/* Whether process p reads as lost now (alive and left are not). */
static bool lost(ccq_runtime *rt, uint32_t p)
{
    ccq_process_state st;
    return ccq_world_process_state(rt, p, &st) != CCQ_OK || st == CCQ_PROCESS_LOST;
}

static size_t count_files(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    size_t n = 0;
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
        n += strstr(e->d_name, part) != NULL;
    if (d != NULL)
        closedir(d);
    return n;
}

/* Wait (at most 1 s) until every one of nprocs processes has a heartbeat record in the
 * directory: how many there are. */
static size_t wait_records(const hcase *c, unsigned nprocs)
{
    for (int t = 0; t < 200 && count_files(c->dir, "~hb.r") < nprocs; t++)
        sleep_ms(5);
    return count_files(c->dir, "~hb.r");
}

/* ---- a process that leaves cleanly reads as left, never lost ---- */

static int left_child(unsigned rank, unsigned nprocs, void *arg)
{
    hcase *c = arg;
    ccq_runtime *rt = runtime(c, rank, nprocs);
    int rc = 0;

    if (rt == NULL)
        return 10;
    /* Heartbeat records appear in the directory (one per process). */
    size_t records = wait_records(c, nprocs);
    if (records < nprocs)
        FAIL(11, "heartbeat records: %zu", records);
    if (rank == 2) {
        sleep_ms(200);
        ccq_runtime_destroy(rt);
        return 0; /* exits: the others must not take that for a death */
    }
    if (!wait_state(rt, 2, CCQ_PROCESS_LEFT, c->hb_timeout_ms + 2000))
        FAIL(12, "process 2 does not read as left");
    sleep_ms(c->hb_timeout_ms + 300); /* and stays left, past its heartbeat timeout */
    if (!wait_state(rt, 2, CCQ_PROCESS_LEFT, 10))
        FAIL(13, "process 2 left, then turned into something else");
    /* The other one is alive, or left already (it may finish first): never lost. */
    if (!wait_state(rt, rank, CCQ_PROCESS_ALIVE, 10) || lost(rt, 1 - rank))
        FAIL(14, "a live process does not read as alive");
out:
    ccq_runtime_destroy(rt);
    return rc;
}

static void test_left_not_lost(void **state)
{
    hcase *c = hcase_new(100, 1000, 20000);
    int status[3];
    (void)state;
    assert_int_equal(procs_run(3, left_child, c, 60, status), 0);
    hcase_free(c);
}

/* ---- a process that dies: the event, the dump, ccq_comm_init refused at once ---- */

typedef struct ev_seen {
    _Atomic int n;
    _Atomic uint32_t device, peer, status, peer_valid;
} ev_seen;

static void on_event(const ccq_event *ev, void *user)
{
    ev_seen *s = user;
    if (ev->type != CCQ_EV_PROCESS_LOST)
        return;
    atomic_store(&s->device, ev->device);
    atomic_store(&s->peer, ev->peer);
    atomic_store(&s->peer_valid, ev->peer_valid);
    atomic_store(&s->status, (uint32_t)ev->status);
    atomic_fetch_add(&s->n, 1);
}

static int died_child(unsigned rank, unsigned nprocs, void *arg)
{
    hcase *c = arg;
    ccq_runtime *rt = runtime(c, rank, nprocs);
    ccq_device_id all[3] = {0, 1, 2}, two[2] = {0, 1};
    ev_seen seen = {0};
    float in[N] = {0}, out[N];
    int rc = 0;
    char path[256];
    FILE *f;

    if (rt == NULL)
        return 10;
    ccq_set_event_callback(rt, on_event, &seen);
    if (ccq_comm_init(rt, all, 3) != CCQ_OK)
        FAIL(11, "comm_init");
    /* One all_reduce together (everyone's communicator is ready), then process 2 dies. */
    if (ccq_all_reduce(rt, rank, 0, in, out, N, CCQ_FLOAT32, CCQ_SUM, all, 3) != CCQ_OK ||
        ccq_sync_collective(rt, rank, 0) != CCQ_OK)
        FAIL(22, "the first all_reduce");
    if (rank == 2) {
        /* Once the others completed it too (their heartbeats say so), it dies without
         * destroying its runtime. */
        all_completed(rt, 3, 1);
        _exit(0);
    }
    /* Its loss fails the world's next all_reduce, naming it and its device. */
    if (ccq_all_reduce(rt, rank, 0, in, out, N, CCQ_FLOAT32, CCQ_SUM, all, 3) != CCQ_OK)
        FAIL(12, "all_reduce");
    ccq_status st = ccq_sync_collective(rt, rank, 0);
    snprintf(c->detail[rank], sizeof c->detail[rank], "%s", ccq_last_error_detail());
    if (st != CCQ_ERR_PROCESS_LOST || strstr(c->detail[rank], "process 2 (device 2)") == NULL)
        FAIL(13, "fence: %s", ccq_status_name(st));
    if (!wait_state(rt, 2, CCQ_PROCESS_LOST, 10))
        FAIL(14, "process 2 does not read as lost");
    /* The old set is refused at once, also though it had formed; a set without it forms. */
    uint64_t t0 = now_ns();
    if (ccq_comm_init(rt, all, 3) != CCQ_ERR_PROCESS_LOST ||
        strstr(ccq_last_error_detail(), "process 2") == NULL || now_ns() - t0 > 50000000u)
        FAIL(15, "comm_init of the old set");
    /* Submitting on it fails too, at the call. */
    if (ccq_all_reduce(rt, rank, 0, in, out, N, CCQ_FLOAT32, CCQ_SUM, all, 3) !=
        CCQ_ERR_PROCESS_LOST)
        FAIL(16, "all_reduce on the old set");
    if (ccq_comm_init(rt, two, 2) != CCQ_OK)
        FAIL(17, "comm_init of the survivors");
    if (ccq_all_reduce(rt, rank, 0, in, out, N, CCQ_FLOAT32, CCQ_SUM, two, 2) != CCQ_OK ||
        ccq_sync_collective(rt, rank, 0) != CCQ_OK)
        FAIL(18, "all_reduce of the survivors");
    /* The event reached the callback, with the fields DESIGN.md promises. */
    if (atomic_load(&seen.n) != 1 || atomic_load(&seen.peer) != 2 ||
        atomic_load(&seen.peer_valid) != 1 || atomic_load(&seen.device) != 2 ||
        (int32_t)atomic_load(&seen.status) != CCQ_ERR_PROCESS_LOST)
        FAIL(19, "event: %d seen, peer %u, device %u", atomic_load(&seen.n),
             atomic_load(&seen.peer), atomic_load(&seen.device));
    /* A dump was written when the loss was applied (before the fence could report it). */
    snprintf(path, sizeof path, "%s/trace.%u.json", c->dir, rank);
    f = fopen(path, "r");
    if (f == NULL)
        FAIL(20, "no dump at %s", path);
    char *text = calloc(1, 1 << 22);
    size_t got = fread(text, 1, (1 << 22) - 1, f);
    fclose(f);
    bool ok = got > 0 && strstr(text, "\"reason\":\"process_lost\"") != NULL &&
              strstr(text, "process 2 lost") != NULL;
    free(text);
    if (!ok)
        FAIL(21, "the dump has no process_lost reason or mark");
    c->events[rank] = atomic_load(&seen.n);
out:
    ccq_runtime_destroy(rt);
    return rc;
}

static void test_died(void **state)
{
    hcase *c = hcase_new(100, 1000, 20000);
    int status[3];
    (void)state;
    snprintf(c->trace, sizeof c->trace, "%s/trace.%%r.json", c->dir);
    procs_run(3, died_child, c, 60, status);
    assert_int_equal(status[0], 0);
    assert_int_equal(status[1], 0);
    fprintf(stderr, "the fence's detail: %s\n", c->detail[0]);
    hcase_free(c);
}

/* ---- live progress and the watchdog's detail ---- */

/* Processes 0 and 1 submit 3 all_reduces over the world, process 2 only 2 and then waits:
 * ccq_world_progress shows it behind; the watchdog aborts the batch that waits for it, saying
 * it is alive and how far it got. */
static int behind_child(unsigned rank, unsigned nprocs, void *arg)
{
    hcase *c = arg;
    ccq_runtime *rt = runtime(c, rank, nprocs);
    ccq_device_id all[3] = {0, 1, 2};
    float in[N] = {0}, out[N];
    int rc = 0;
    ccq_progress pr[16];
    size_t n = 0;

    if (rt == NULL)
        return 10;
    if (ccq_comm_init(rt, all, 3) != CCQ_OK)
        FAIL(11, "comm_init");
    for (int k = 0; k < 2; k++)
        if (ccq_all_reduce(rt, rank, 0, in, out, N, CCQ_FLOAT32, CCQ_SUM, all, 3) != CCQ_OK ||
            ccq_sync_collective(rt, rank, 0) != CCQ_OK)
            FAIL(12, "all_reduce %d", k);
    if (rank == 2) {
        /* Behind: it stays alive (heartbeats go on) but submits nothing more. */
        sleep_ms((unsigned)c->timeout_ms + 2500);
        goto out;
    }
    if (ccq_all_reduce(rt, rank, 0, in, out, N, CCQ_FLOAT32, CCQ_SUM, all, 3) != CCQ_OK)
        FAIL(13, "all_reduce 2");
    sleep_ms(400); /* a few heartbeats */
    /* Argument checks. */
    if (ccq_world_progress(rt, NULL, 0, &n) != CCQ_OK || n != 3)
        FAIL(14, "ccq_world_progress counting: %zu records", n);
    pr[0].struct_size = 12;
    if (ccq_world_progress(rt, pr, 16, &n) != CCQ_ERR_INVALID_ARGUMENT ||
        ccq_world_progress(rt, pr, 16, NULL) != CCQ_ERR_INVALID_ARGUMENT)
        FAIL(15, "ccq_world_progress argument checks");
    pr[0].struct_size = sizeof pr[0];
    if (ccq_world_progress(rt, pr, 1, &n) != CCQ_OK || n != 3 || pr[0].process != 0)
        FAIL(16, "ccq_world_progress with room for one: n %zu", n);
    pr[0].struct_size = sizeof pr[0];
    if (ccq_world_progress(rt, pr, 16, &n) != CCQ_OK || n != 3)
        FAIL(17, "ccq_world_progress: %zu records", n);
    memcpy(c->prog[rank], pr, n * sizeof pr[0]);
    c->nprog[rank] = n;
    for (size_t k = 0; k < n; k++) {
        const ccq_progress *p = &pr[k];
        if (p->struct_size != sizeof *p || p->process != k || p->state != CCQ_PROCESS_ALIVE ||
            p->comm != 0)
            FAIL(18, "record %zu: process %u, state %u, comm %u", k, p->process, p->state, p->comm);
        if (p->submitted != (p->process == 2 ? 2u : 3u) || p->completed != 2)
            FAIL(19, "process %u: submitted %llu, completed %llu", p->process,
                 (unsigned long long)p->submitted, (unsigned long long)p->completed);
        bool pending = p->process != 2;
        if (pending != (p->pending_kind == CCQ_KIND_ALL_REDUCE) ||
            (pending && (p->pending_seq != 2 || p->pending_age_ns < 100000000u)))
            FAIL(20, "process %u: pending kind %u seq %llu age %llu", p->process, p->pending_kind,
                 (unsigned long long)p->pending_seq, (unsigned long long)p->pending_age_ns);
        if ((p->process == rank) != (p->heartbeat_age_ns == 0) || p->heartbeat_age_ns > 1000000000u)
            FAIL(21, "process %u: heartbeat age %llu", p->process,
                 (unsigned long long)p->heartbeat_age_ns);
    }
    /* The watchdog gives up on the batch that waits for process 2, and says why. */
    ccq_status st = ccq_sync_collective(rt, rank, 0);
    snprintf(c->detail[rank], sizeof c->detail[rank], "%s", ccq_last_error_detail());
    if (st != CCQ_ERR_ABORTED ||
        strstr(c->detail[rank], "process 2 is alive (heartbeat ") == NULL ||
        strstr(c->detail[rank], "but has not submitted #2 yet: has submitted 2 and completed 2") ==
            NULL)
        FAIL(22, "the watchdog's verdict: %s", ccq_status_name(st));
out:
    ccq_runtime_destroy(rt);
    return rc;
}

static void test_progress_and_watchdog(void **state)
{
    hcase *c = hcase_new(100, 5000, 2000);
    int status[3];
    (void)state;
    procs_run(3, behind_child, c, 60, status);
    fprintf(stderr, "the watchdog's detail: %s\n", c->detail[0]);
    assert_int_equal(status[0], 0);
    assert_int_equal(status[1], 0);
    assert_int_equal(status[2], 0);
    hcase_free(c);
}

/* ---- a member that never joins: alive, says its heartbeat ---- */

static int absent_child(unsigned rank, unsigned nprocs, void *arg)
{
    hcase *c = arg;
    ccq_runtime *rt = runtime(c, rank, nprocs);
    ccq_device_id all[3] = {0, 1, 2};
    int rc = 0;

    if (rt == NULL)
        return 10;
    if (rank == 2) { /* alive, heartbeats going, but elsewhere */
        sleep_ms((unsigned)c->timeout_ms + 1500);
        goto out;
    }
    ccq_status st = ccq_comm_init(rt, all, 3);
    snprintf(c->detail[rank], sizeof c->detail[rank], "%s", ccq_last_error_detail());
    if (st != CCQ_ERR_TIMEOUT || strstr(c->detail[rank], "process 2 never joined") == NULL ||
        strstr(c->detail[rank], "process 2 is alive (heartbeat ") == NULL)
        FAIL(11, "comm_init without process 2: %s", ccq_status_name(st));
out:
    ccq_runtime_destroy(rt);
    return rc;
}

static void test_absent_member(void **state)
{
    hcase *c = hcase_new(100, 5000, 1500);
    int status[3];
    (void)state;
    procs_run(3, absent_child, c, 60, status);
    fprintf(stderr, "comm_init's detail: %s\n", c->detail[0]);
    assert_int_equal(status[0], 0);
    assert_int_equal(status[1], 0);
    assert_int_equal(status[2], 0);
    hcase_free(c);
}

/* ---- an engine's word: a peer failed ---- */

/* Process 0's data engine reports process 1 failed (UCX's peer error handling would): every
 * process agrees that 1 is lost, saying who saw it and how; process 1 itself, alive, learns
 * it and is fenced off: its state reads lost and its spanning communicator fails naming
 * itself, while a communicator of its own devices keeps working. */
static int engine_child(unsigned rank, unsigned nprocs, void *arg)
{
    hcase *c = arg;
    ccq_runtime *rt = runtime(c, rank, nprocs);
    ccq_device_id all[3] = {0, 1, 2}, mine[1] = {rank};
    float in[N] = {0}, out[N];
    int rc = 0;

    if (rt == NULL)
        return 10;
    if (ccq_comm_init(rt, all, 3) != CCQ_OK || ccq_comm_init(rt, mine, 1) != CCQ_OK)
        FAIL(11, "comm_init");
    if (ccq_all_reduce(rt, rank, 0, in, out, N, CCQ_FLOAT32, CCQ_SUM, all, 3) != CCQ_OK ||
        ccq_sync_collective(rt, rank, 0) != CCQ_OK)
        FAIL(12, "the first all_reduce");
    if (rank == 0) {
        all_completed(rt, 3, 1); /* the others' first all_reduce is over too */
        ccq_health_peer_failed(rt, 1);
    }
    if (!wait_state(rt, 1, CCQ_PROCESS_LOST, c->hb_timeout_ms))
        FAIL(13, "process 1 does not read as lost");
    if (lost(rt, rank == 1 ? 0 : 2 - rank) || lost(rt, rank == 1 ? 2 : rank))
        FAIL(14, "another process reads as lost");
    ccq_status st = CCQ_OK;
    if (ccq_all_reduce(rt, rank, 0, in, out, N, CCQ_FLOAT32, CCQ_SUM, all, 3) == CCQ_OK)
        st = ccq_sync_collective(rt, rank, 0);
    else
        st = CCQ_ERR_PROCESS_LOST; /* refused at the call: the same verdict */
    snprintf(c->detail[rank], sizeof c->detail[rank], "%s", ccq_last_error_detail());
    if (st != CCQ_ERR_PROCESS_LOST || strstr(c->detail[rank], "process 1 ") == NULL ||
        strstr(c->detail[rank],
               rank == 1 ? "(this process" : "the data engine reported it failed") == NULL)
        FAIL(15, "the world's all_reduce after the loss: %s", ccq_status_name(st));
    /* Its own devices' communicator spans no process: untouched, also in process 1. */
    if (ccq_all_reduce(rt, rank, 1, in, out, N, CCQ_FLOAT32, CCQ_SUM, mine, 1) != CCQ_OK ||
        ccq_sync_collective(rt, rank, 1) != CCQ_OK)
        FAIL(16, "the local communicator");
out:
    ccq_runtime_destroy(rt);
    return rc;
}

static void test_engine_peer_error(void **state)
{
    hcase *c = hcase_new(100, 1000, 20000);
    int status[3];
    (void)state;
    procs_run(3, engine_child, c, 60, status);
    fprintf(stderr, "process 0's detail: %s\nprocess 1's detail: %s\n", c->detail[0], c->detail[1]);
    assert_int_equal(status[0], 0);
    assert_int_equal(status[1], 0);
    assert_int_equal(status[2], 0);
    hcase_free(c);
}

/* A process fenced off still has an engine: once the others gave it up, its reports of the
 * peers it can no longer reach (the processes that go on) count for nothing. Process 0's
 * engine reports process 2 failed; once process 2 reads itself lost, its engine reports 0
 * and 1 failed: 0 and 1 stay alive in every view, process 2's own included (it read them as
 * lost, "seen by process 2": its state queries, trace and details blamed the processes that
 * went on, and its records listed them for anyone still reading it). */
static int fenced_child(unsigned rank, unsigned nprocs, void *arg)
{
    hcase *c = arg;
    ccq_runtime *rt = runtime(c, rank, nprocs);
    int rc = 0;

    if (rt == NULL)
        return 10;
    if (wait_records(c, nprocs) < nprocs)
        FAIL(14, "heartbeat records");
    if (rank == 0)
        ccq_health_peer_failed(rt, 2);
    if (!wait_state(rt, 2, CCQ_PROCESS_LOST, c->hb_timeout_ms))
        FAIL(11, "process 2 does not read as lost");
    if (rank == 2) {
        ccq_health_peer_failed(rt, 0);
        ccq_health_peer_failed(rt, 1);
        sleep_ms(300);
        if (lost(rt, 0) || lost(rt, 1))
            FAIL(13, "process 2, fenced off, reads as lost process 0 (%d) or 1 (%d)", lost(rt, 0),
                 lost(rt, 1));
        sleep_ms(1700); /* its records go on, listing what it knows */
        goto out;
    }
    sleep_ms(1500); /* 15 of process 2's heartbeats */
    if (lost(rt, 0) || lost(rt, 1))
        FAIL(12, "a process that goes on reads as lost (process 0: %d, process 1: %d)", lost(rt, 0),
             lost(rt, 1));
out:
    ccq_runtime_destroy(rt);
    return rc;
}

static void test_engine_fenced(void **state)
{
    hcase *c = hcase_new(100, 1000, 20000);
    int status[3];
    (void)state;
    procs_run(3, fenced_child, c, 60, status);
    assert_int_equal(status[0], 0);
    assert_int_equal(status[1], 0);
    assert_int_equal(status[2], 0);
    hcase_free(c);
}

/* ---- a gray failure: the data network cut, the bootstrap still carrying every heartbeat ---- */

/* Process c->bad's data link is down: its engine reports every other process failed, at once
 * (the worst order for a rule that takes the first word), and each of the others reports it
 * 100-300 ms later, as their keepalives notice. Or (c->pair) only the link between processes 1
 * and 2 is cut: both report the other at the same moment. The judge (runtime/health/judge.c)
 * weighs the suspicions: exactly one process is lost in every view, the one they point at
 * (c->bad; of the pair, the higher, 2), and every other process stays alive in every view,
 * the lost one's own view included. Declared on the spot, the bad process's word had fenced
 * off the processes that could go on, and a cut pair had lost both. */
static int gray_child(unsigned rank, unsigned nprocs, void *arg)
{
    hcase *c = arg;
    ccq_runtime *rt = runtime(c, rank, nprocs);
    uint32_t doomed = c->pair ? 2 : c->bad;
    int rc = 0;

    if (rt == NULL)
        return 10;
    if (wait_records(c, nprocs) < nprocs)
        FAIL(11, "heartbeat records");
    if (c->pair) {
        if (rank == 1 || rank == 2)
            ccq_health_peer_failed(rt, 3 - rank);
    } else if (rank == c->bad) {
        for (uint32_t q = 0; q < nprocs; q++)
            if (q != c->bad)
                ccq_health_peer_failed(rt, q);
    } else {
        sleep_ms(100 + 100 * (rank % 3));
        ccq_health_peer_failed(rt, c->bad);
    }
    if (!wait_state(rt, doomed, CCQ_PROCESS_LOST, 3 * c->hb_timeout_ms))
        FAIL(12, "process %u does not read as lost", doomed);
    sleep_ms(10 * c->hb_ms); /* whatever else the reports could still bring about */
    for (uint32_t q = 0; q < nprocs; q++)
        if (q != doomed && lost(rt, q))
            FAIL(13, "process %u reads as lost too (only %u should)", q, doomed);
out:
    ccq_runtime_destroy(rt);
    return rc;
}

static void gray_run(unsigned nprocs, uint32_t bad, bool pair)
{
    hcase *c = hcase_new(100, 1000, 20000);
    int status[4];
    c->bad = bad;
    c->pair = pair;
    procs_run(nprocs, gray_child, c, 60, status);
    for (unsigned r = 0; r < nprocs; r++)
        assert_int_equal(status[r], 0);
    hcase_free(c);
}

static void test_engine_gray_last(void **state)
{
    (void)state;
    gray_run(4, 3, false);
}

static void test_engine_gray_judge(void **state) /* the judge's own link: it declares itself */
{
    (void)state;
    gray_run(4, 0, false);
}

static void test_engine_gray_pair(void **state)
{
    (void)state;
    gray_run(3, 0, true);
}

/* ---- configuration ---- */

static void test_config(void **state)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    (void)state;

    ccq_config_init(&cfg);
    assert_int_equal(cfg.heartbeat_ms, 1000);
    assert_int_equal(cfg.heartbeat_timeout_ms, 0);
    cfg.heartbeat_ms = 500;
    cfg.heartbeat_timeout_ms = 900;
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "heartbeat_timeout_ms"));
    setenv("CCQ_HEARTBEAT_MS", "soon", 1);
    ccq_config_init(&cfg);
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "CCQ_HEARTBEAT_MS"));
    setenv("CCQ_HEARTBEAT_MS", "250", 1);
    setenv("CCQ_HEARTBEAT_TIMEOUT_MS", "3000", 1);
    ccq_config_init(&cfg);
    assert_int_equal(cfg.heartbeat_ms, 250);
    assert_int_equal(cfg.heartbeat_timeout_ms, 3000);
    unsetenv("CCQ_HEARTBEAT_MS");
    unsetenv("CCQ_HEARTBEAT_TIMEOUT_MS");

    /* A world of one: alive, no progress records. */
    ccq_config_init(&cfg);
    assert_int_equal(ccq_runtime_create(&cfg, &rt), CCQ_OK);
    ccq_process_state ps = CCQ_PROCESS_LOST;
    size_t n = 99;
    assert_int_equal(ccq_world_process_state(rt, 0, &ps), CCQ_OK);
    assert_int_equal(ps, CCQ_PROCESS_ALIVE);
    assert_int_equal(ccq_world_process_state(rt, 1, &ps), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_world_process_state(rt, 0, NULL), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_world_progress(rt, NULL, 0, &n), CCQ_OK);
    assert_int_equal(n, 0);
    assert_string_equal(ccq_status_name(CCQ_ERR_PROCESS_LOST), "CCQ_ERR_PROCESS_LOST");
    assert_string_equal(ccq_event_type_name(CCQ_EV_PROCESS_LOST), "process_lost");
    ccq_runtime_destroy(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_left_not_lost),
        cmocka_unit_test(test_died),
        cmocka_unit_test(test_progress_and_watchdog),
        cmocka_unit_test(test_engine_peer_error),
        cmocka_unit_test(test_engine_fenced),
        cmocka_unit_test(test_engine_gray_last),
        cmocka_unit_test(test_engine_gray_judge),
        cmocka_unit_test(test_engine_gray_pair),
        cmocka_unit_test(test_absent_member),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
