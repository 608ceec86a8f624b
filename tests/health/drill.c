/* Job-health drills with real processes (fork, no launcher): a world of 3 or 4 processes on the
 * fake NCCL across processes (tests/fake/fake_xproc.c: real data between real processes),
 * meeting through the file bootstrap, a store in shared memory or the tcp:// rendezvous (its
 * process 0 serves it; when process 0 is the victim, killed or stopped, the lowest survivor
 * takes the rendezvous over, so the survivors' communicator still forms), runs a loop of exact
 * all_reduces over every device; the driver (this process) kills one process with SIGKILL, or
 * stops it with SIGSTOP and later lets it go on with SIGCONT, at a random moment. Then:
 *
 *  - every survivor's fence returns CCQ_ERR_PROCESS_LOST naming that process, within
 *    heartbeat_timeout_ms + 1 s of the signal (measured and printed), and every survivor reads
 *    the same processes as lost (agreement);
 *  - ccq_comm_init of the old set fails at once with CCQ_ERR_PROCESS_LOST; a communicator of
 *    two processes without the lost one, formed before, keeps working untouched;
 *  - the survivors init a communicator over the surviving devices and run 100 more steps with
 *    exact results;
 *  - a stopped process, once continued, learns it was declared lost: its fence fails naming
 *    itself, it reads its own state as lost; the survivors' buffers of the operation that
 *    failed are never written (nothing it sends reaches them);
 *  - nothing hangs: each drill is bounded, and a drill the driver has to end by force counts
 *    as a hang.
 *
 *   drill_health [--procs 3|4|0] [--boot file|store|tcp|any] [--mode kill|stop|any] [--drills N]
 *                [--hb MS] [--hb-timeout MS] [--devices 1|2|0] [--seed S] [--nccl-version V]
 *
 * 0 / any = chosen at random per drill. Prints one line per drill and a summary (detection
 * time p50 and max per kind); exits 1 on any hang, wrong result or failed check. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ccq.h"
#include "fake/fake_cuda_nccl.h"
#include "free_port.h"

enum { MAXP = 4, N = 257, AFTER_STEPS = 100, PAIR_STEPS = 10 };
enum { MODE_KILL, MODE_STOP };
enum { BOOT_FILE, BOOT_STORE, BOOT_TCP };

/* ---- a store in shared memory (last write wins, as ccq_store's heartbeat keys need) ---- */

enum { SKEYS = 512, SKEY_LEN = 200, SVAL_LEN = 4096 };
typedef struct shm_store {
    pthread_mutex_t lock; /* process-shared, robust: a process may be killed holding it */
    uint32_t n;
    struct {
        char key[SKEY_LEN];
        size_t len;
        unsigned char val[SVAL_LEN];
    } e[SKEYS];
} shm_store;

static void store_lock(shm_store *s)
{
    if (pthread_mutex_lock(&s->lock) == EOWNERDEAD)
        pthread_mutex_consistent(&s->lock);
}

static ccq_status store_set(void *ctx, const char *key, const void *value, size_t len)
{
    shm_store *s = ctx;
    ccq_status st = CCQ_OK;
    uint32_t i = 0;
    if (strlen(key) >= SKEY_LEN || len > SVAL_LEN)
        return CCQ_ERR_INVALID_ARGUMENT;
    store_lock(s);
    while (i < s->n && strcmp(s->e[i].key, key) != 0)
        i++;
    if (i == SKEYS) {
        st = CCQ_ERR_NO_MEMORY;
    } else {
        snprintf(s->e[i].key, SKEY_LEN, "%s", key);
        memcpy(s->e[i].val, value, len);
        s->e[i].len = len;
        s->n += i == s->n;
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

static ccq_status store_get(void *ctx, const char *key, void *value, size_t *len)
{
    shm_store *s = ctx;
    ccq_status st = CCQ_IN_PROGRESS;
    store_lock(s);
    for (uint32_t i = 0; i < s->n; i++) {
        if (strcmp(s->e[i].key, key) != 0)
            continue;
        memcpy(value, s->e[i].val, s->e[i].len < *len ? s->e[i].len : *len);
        *len = s->e[i].len;
        st = CCQ_OK;
        break;
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* ---- what the driver and the workers share ---- */

typedef struct result {
    int rc;               /* 0: every check passed; else the line that failed */
    int lost_seen;        /* its fence returned CCQ_ERR_PROCESS_LOST */
    uint64_t detect_ns;   /* when (CLOCK_MONOTONIC) */
    uint64_t wrong;       /* elements that differed from the exact result */
    uint64_t steps_after; /* steps over the survivors */
    int events;           /* CCQ_EV_PROCESS_LOST events naming the victim */
    int shrinks, revokes; /* ncclCommShrink / ncclCommRevoke calls (the fake's log) */
    char detail[640];     /* the fence's detail */
    char why[256];        /* a failed check */
} result;

typedef struct shared {
    /* the drill */
    int nprocs, devices, boot, mode, victim;
    int port; /* BOOT_TCP: the rendezvous's */
    uint32_t hb_ms, hb_timeout_ms;
    int nccl_version;
    char dir[64];
    /* progress and signals */
    _Atomic uint64_t steps[MAXP];
    _Atomic int ready[MAXP];   /* 1: formed its communicators, stepping */
    _Atomic uint64_t event_ns; /* when the driver killed or stopped the victim */
    _Atomic uint64_t cont_ns;  /* when it sent SIGCONT (stop drills) */
    _Atomic int release;       /* 1: survivors may finish (the victim is done) */
    _Atomic int finished;      /* survivors done with every operation with the others */
    result res[MAXP];
    shm_store store;
} shared;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void nap_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Device d's input at step s: small integers, so float sums are exact in any order. */
static float input(uint32_t d, uint64_t s, int k)
{
    return (float)((d + 1) * 3 + (int)(s % 13) + k % 7);
}

#define SENTINEL (-12345.0f)

/* A failed check: its text (cut to fit) and its line go to the driver. */
static void failed(result *me, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void failed(result *me, int line, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(me->why, buf, sizeof me->why - 1);
    me->why[sizeof me->why - 1] = '\0';
    me->rc = line;
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failed(me, __LINE__, __VA_ARGS__);                                                     \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

typedef struct ev_count {
    _Atomic int n;
    uint32_t victim;
} ev_count;

static void on_event(const ccq_event *ev, void *user)
{
    ev_count *c = user;
    if (ev->type == CCQ_EV_PROCESS_LOST && ev->peer_valid && ev->peer == c->victim &&
        ev->status == CCQ_ERR_PROCESS_LOST)
        atomic_fetch_add(&c->n, 1);
}

/* One all_reduce over `devs` on every local device of it, fenced. CCQ_OK with the results
 * checked (wrong elements counted), or the first error of the fences. */
static ccq_status step(ccq_runtime *rt, const uint32_t *devs, uint32_t n, uint64_t s, float **in,
                       float **out, uint32_t first, uint32_t count, uint64_t *wrong, char *detail,
                       size_t dlen)
{
    ccq_status st = CCQ_OK;
    for (uint32_t i = 0; i < count; i++) {
        for (int k = 0; k < N; k++) {
            in[i][k] = input(first + i, s, k);
            out[i][k] = SENTINEL;
        }
        ccq_status sub =
            ccq_all_reduce(rt, first + i, 0, in[i], out[i], N, CCQ_FLOAT32, CCQ_SUM, devs, n);
        if (sub != CCQ_OK && st == CCQ_OK) {
            st = sub;
            snprintf(detail, dlen, "%s", ccq_last_error_detail());
        }
    }
    for (uint32_t i = 0; i < count; i++) {
        ccq_status f = ccq_sync_collective(rt, first + i, 0);
        if (f != CCQ_OK && st == CCQ_OK) {
            st = f;
            snprintf(detail, dlen, "%s", ccq_last_error_detail());
        }
    }
    if (st != CCQ_OK)
        return st;
    for (uint32_t i = 0; i < count; i++)
        for (int k = 0; k < N; k++) {
            float want = 0;
            for (uint32_t j = 0; j < n; j++)
                want += input(devs[j], s, k);
            *wrong += out[i][k] != want;
        }
    return CCQ_OK;
}

static int worker(shared *sh, int rank)
{
    result *me = &sh->res[rank];
    ccq_runtime *rt = NULL;
    ccq_config cfg;
    char boot[96], word[32];
    ccq_store store = {&sh->store, store_set, store_get};
    uint32_t first = 0, count = 0, total, all[2 * MAXP], surv[2 * MAXP], nsurv = 0;
    float *in[2], *out[2], *lost_out[2] = {NULL, NULL}, *lost_copy[2] = {NULL, NULL};
    ev_count evc = {0, (uint32_t)sh->victim};
    ccq_status st;
    uint64_t s = 0;
    int partner = sh->nprocs == 4 ? rank ^ 1 : -1;
    uint32_t pair[4];
    uint32_t npair = 0;
    bool counted = false; /* in sh->finished */

    fake_reset();
    fake_set_devices(sh->devices, 9);
    if (sh->nccl_version > 0)
        fake_set_nccl_version(sh->nccl_version);
    fake_set_xproc_timeout_ms(120000); /* ccq's health must speak long before the fake */
    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    cfg.world_rank = (uint32_t)rank;
    cfg.world_size = (uint32_t)sh->nprocs;
    cfg.timeout_ms = 20000; /* the drill's own bound (60 s) is longer: a failure shows as one */
    cfg.heartbeat_ms = sh->hb_ms;
    cfg.heartbeat_timeout_ms = sh->hb_timeout_ms;
    if (sh->boot == BOOT_FILE) {
        snprintf(boot, sizeof boot, "file:%s", sh->dir);
        cfg.bootstrap = boot;
    } else if (sh->boot == BOOT_TCP) {
        snprintf(boot, sizeof boot, "tcp://127.0.0.1:%d", sh->port);
        cfg.bootstrap = boot;
    } else {
        cfg.bootstrap = NULL;
        cfg.store = &store;
    }
    st = ccq_runtime_create(&cfg, &rt);
    CHECK(st == CCQ_OK, "create: %s", ccq_last_error_detail());
    ccq_set_event_callback(rt, on_event, &evc);
    ccq_local_devices(rt, &first, &count);
    total = ccq_device_count(rt);
    for (uint32_t d = 0; d < total; d++)
        all[d] = d;
    for (uint32_t i = 0; i < count; i++) {
        in[i] = malloc(N * sizeof(float));
        out[i] = malloc(N * sizeof(float));
    }
    CHECK(ccq_comm_init(rt, all, total) == CCQ_OK, "comm_init(world): %s", ccq_last_error_detail());
    if (partner >= 0) { /* {rank, partner}: a communicator of two processes */
        int lo = rank < partner ? rank : partner;
        for (int p = lo; p < lo + 2; p++)
            for (int i = 0; i < sh->devices; i++)
                pair[npair++] = (uint32_t)(p * sh->devices + i);
        CHECK(ccq_comm_init(rt, pair, npair) == CCQ_OK, "comm_init(pair): %s",
              ccq_last_error_detail());
    }
    atomic_store(&sh->ready[rank], 1);

    /* The loop the driver interrupts. */
    for (;; s++) {
        char detail[sizeof me->detail];
        uint64_t wrong = 0;
        st = step(rt, all, total, s, in, out, first, count, &wrong, detail, sizeof detail);
        me->wrong += wrong;
        if (st == CCQ_OK) {
            atomic_store(&sh->steps[rank], s + 1);
            CHECK(s < 100000, "no loss after %" PRIu64 " steps", s);
            continue;
        }
        me->detect_ns = mono_ns();
        me->lost_seen = st == CCQ_ERR_PROCESS_LOST;
        snprintf(me->detail, sizeof me->detail, "%s", detail);
        CHECK(st == CCQ_ERR_PROCESS_LOST, "step %" PRIu64 ": %s: %s", s, ccq_status_name(st),
              detail);
        snprintf(word, sizeof word, "process %d ", sh->victim);
        CHECK(strstr(detail, word) != NULL, "the detail does not name process %d: %s", sh->victim,
              detail);
        /* Keep the failed operation's outputs as they are now: nothing may write them from
         * now on (they may hold its result: one that ran to its end as the loss was applied
         * still fails, as with the watchdog's aborts). */
        for (uint32_t i = 0; i < count; i++) {
            lost_out[i] = out[i];
            lost_copy[i] = malloc(N * sizeof(float));
            memcpy(lost_copy[i], out[i], N * sizeof(float));
            out[i] = malloc(N * sizeof(float));
        }
        break;
    }

    if (rank == sh->victim) {
        /* Stopped and continued: it learned it was declared lost, and is fenced off. */
        ccq_process_state self = CCQ_PROCESS_ALIVE;
        CHECK(strstr(me->detail, "(this process") != NULL, "the victim's detail: %s", me->detail);
        CHECK(ccq_world_process_state(rt, (uint32_t)rank, &self) == CCQ_OK &&
                  self == CCQ_PROCESS_LOST,
              "the victim reads its own state as %d", (int)self);
        CHECK(ccq_comm_init(rt, all, total) == CCQ_ERR_PROCESS_LOST, "victim's comm_init: %s",
              ccq_last_error_detail());
        goto out;
    }

    /* Agreement: exactly the victim is lost, in every survivor. */
    for (int p = 0; p < sh->nprocs; p++) {
        ccq_process_state ps;
        CHECK(ccq_world_process_state(rt, (uint32_t)p, &ps) == CCQ_OK, "process_state");
        CHECK(ps == (p == sh->victim ? CCQ_PROCESS_LOST : CCQ_PROCESS_ALIVE),
              "process %d reads as %d", p, (int)ps);
        for (int i = 0; p != sh->victim && i < sh->devices; i++)
            surv[nsurv++] = (uint32_t)(p * sh->devices + i);
    }
    /* The old set never forms again; the survivors' does. */
    uint64_t t0 = mono_ns();
    CHECK(ccq_comm_init(rt, all, total) == CCQ_ERR_PROCESS_LOST, "comm_init(world) again: %s",
          ccq_status_name(ccq_comm_init(rt, all, total)));
    CHECK(mono_ns() - t0 < 100000000u, "comm_init of a lost set took %" PRIu64 " ms",
          (mono_ns() - t0) / 1000000u);
    CHECK(ccq_comm_init(rt, surv, nsurv) == CCQ_OK, "comm_init(survivors): %s",
          ccq_last_error_detail());
    /* The survivors failed at different steps (one may have finished the step another
     * failed): they go on from an agreed step, as a training loop from its checkpoint. */
    s = 1000000;
    /* NCCL >= 2.28 shrinks the revoked world; an older one inits afresh. */
    me->shrinks = (int)fake_log_count("ncclCommShrink");
    me->revokes = (int)fake_log_count("ncclCommRevoke");
    {
        bool has = sh->nccl_version == 0 || sh->nccl_version >= 22800;
        CHECK(has ? me->shrinks == (int)count && me->revokes >= (int)count
                  : me->shrinks == 0 && me->revokes == 0,
              "%d ncclCommShrink, %d ncclCommRevoke calls with NCCL %d", me->shrinks, me->revokes,
              sh->nccl_version);
    }
    for (uint64_t k = 0; k < AFTER_STEPS; k++, s++) {
        char detail[256];
        uint64_t wrong = 0;
        st = step(rt, surv, nsurv, s, in, out, first, count, &wrong, detail, sizeof detail);
        CHECK(st == CCQ_OK, "survivors' step %" PRIu64 ": %s: %s", k, ccq_status_name(st), detail);
        me->wrong += wrong;
        me->steps_after++;
    }
    /* A communicator without the lost process is untouched; one with it fails. */
    if (partner >= 0) {
        for (uint64_t k = 0; k < PAIR_STEPS; k++, s++) {
            char detail[256];
            uint64_t wrong = 0;
            st = step(rt, pair, npair, s, in, out, first, count, &wrong, detail, sizeof detail);
            if (partner == sh->victim) {
                CHECK(st == CCQ_ERR_PROCESS_LOST, "pair with the lost process: %s",
                      ccq_status_name(st));
                break;
            }
            CHECK(st == CCQ_OK, "pair step %" PRIu64 ": %s: %s", k, ccq_status_name(st), detail);
            me->wrong += wrong;
        }
    }
    /* No survivor leaves while another still has an operation with it in flight: an
     * operation finishes at different times in different processes, and a process seen to
     * exit before its "left" record arrives is lost to the others (job health), failing what
     * was in flight with it (seen on tcp: a survivor's last step failed as process 3's loss
     * once process 3 had finished it and left). */
    counted = true;
    atomic_fetch_add(&sh->finished, 1);
    while (atomic_load(&sh->finished) < sh->nprocs - 1)
        nap_ms(5);
    /* Once the victim is done (continued, fenced off, exited; or killed), the failed
     * operation's outputs still hold what they held. */
    while (!atomic_load(&sh->release))
        nap_ms(5);
    for (uint32_t i = 0; i < count; i++)
        CHECK(memcmp(lost_out[i], lost_copy[i], N * sizeof(float)) == 0,
              "the failed all_reduce's output was written after its fence returned");
    me->events = atomic_load(&evc.n);
    CHECK(me->events >= 1, "no CCQ_EV_PROCESS_LOST event for process %d", sh->victim);
out:
    if (!counted && rank != sh->victim) /* failed early: nobody waits for it */
        atomic_fetch_add(&sh->finished, 1);
    if (me->rc == 0) { /* nothing the real NCCL would punish (the fake counts misuse) */
        char msg[512];
        ccq_runtime_destroy(rt);
        rt = NULL;
        if (fake_errors(msg, sizeof msg) != 0)
            failed(me, __LINE__, "the fake NCCL saw misuse: %s", msg);
    }
    ccq_runtime_destroy(rt);
    return me->rc == 0 ? 0 : 1;
}

/* ---- the driver ---- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

#ifndef CCQ_DRILL_SLACK_MS
#define CCQ_DRILL_SLACK_MS 0 /* more time to detect, in sanitizer builds (tests/CMakeLists.txt) */
#endif

typedef struct opts {
    int procs, devices, boot, mode, drills, nccl_version, victim;
    uint32_t hb_ms, hb_timeout_ms;
    unsigned seed;
} opts;

/* One drill: 0 ok, 1 a check failed, 2 a hang. Detection times (ms after the signal, one per
 * survivor; for a stop drill, the victim's after SIGCONT) go to det / det_victim. */
static int drill(shared *sh, int idx, uint64_t **det, size_t *ndet, uint64_t *det_victim,
                 size_t *ndet_victim, unsigned *rnd)
{
    pid_t pid[MAXP];
    int status[MAXP], bad = 0, hang = 0;
    uint64_t deadline, t_signal, limit_ms = sh->hb_timeout_ms + 1000u + CCQ_DRILL_SLACK_MS;
    uint64_t min_steps = 1 + (uint64_t)(rand_r(rnd) % 30);
    unsigned delay_us = (unsigned)(rand_r(rnd) % 20000);
    char cmd[256];

    fflush(NULL);
    for (int r = 0; r < sh->nprocs; r++) {
        pid[r] = fork();
        if (pid[r] == 0)
            _exit(worker(sh, r));
    }
    /* The random moment: everyone formed and did min_steps steps, then delay_us more. */
    deadline = mono_ns() + 60000000000ull;
    for (;;) {
        bool go = true;
        for (int r = 0; r < sh->nprocs; r++)
            go &= atomic_load(&sh->ready[r]) && atomic_load(&sh->steps[r]) >= min_steps;
        if (go || mono_ns() > deadline)
            break;
        nap_ms(1);
    }
    usleep(delay_us);
    t_signal = mono_ns();
    atomic_store(&sh->event_ns, t_signal);
    kill(pid[sh->victim], sh->mode == MODE_KILL ? SIGKILL : SIGSTOP);

    if (sh->mode == MODE_STOP) {
        /* Continue it once every survivor saw the loss (or well after it should have). */
        uint64_t until = t_signal + (limit_ms + 5000) * 1000000ull;
        for (;;) {
            bool all = true;
            for (int r = 0; r < sh->nprocs; r++)
                if (r != sh->victim)
                    all &= sh->res[r].detect_ns != 0 || sh->res[r].rc != 0;
            if (all || mono_ns() > until)
                break;
            nap_ms(2);
        }
        nap_ms(50);
        atomic_store(&sh->cont_ns, mono_ns());
        kill(pid[sh->victim], SIGCONT);
    }
    /* Reap the victim first (the survivors wait for `release`), then the rest. */
    deadline = mono_ns() + 60000000000ull;
    for (int left = sh->nprocs; left > 0;) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < sh->nprocs; r++)
                if (pid[r] == p) {
                    status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                    pid[r] = 0;
                    if (r == sh->victim)
                        atomic_store(&sh->release, 1);
                }
            left--;
            continue;
        }
        if (mono_ns() > deadline) {
            for (int r = 0; r < sh->nprocs; r++)
                if (pid[r] > 0) {
                    kill(pid[r], SIGCONT);
                    kill(pid[r], SIGKILL);
                    waitpid(pid[r], NULL, 0);
                    status[r] = 255;
                    pid[r] = 0;
                }
            hang = 1;
            break;
        }
        nap_ms(1);
    }

    /* The verdict. */
    printf("drill %3d: %d procs x %d dev, %s, %-4s process %d after %" PRIu64 " steps:", idx,
           sh->nprocs, sh->devices,
           sh->boot == BOOT_FILE  ? "file "
           : sh->boot == BOOT_TCP ? "tcp  "
                                  : "store",
           sh->mode == MODE_KILL ? "kill" : "stop", sh->victim, min_steps);
    for (int r = 0; r < sh->nprocs; r++) {
        result *x = &sh->res[r];
        if (r == sh->victim) {
            if (sh->mode == MODE_KILL) {
                bad |= status[r] != 128 + SIGKILL;
                continue;
            }
            uint64_t cont = atomic_load(&sh->cont_ns);
            uint64_t d = x->detect_ns > cont ? (x->detect_ns - cont) / 1000000u : 0;
            printf(" [victim fenced %" PRIu64 " ms after SIGCONT]", d);
            det_victim[(*ndet_victim)++] = d;
            if (status[r] != 0 || !x->lost_seen || d > limit_ms) {
                bad = 1;
                printf(" VICTIM FAILED (exit %d: %s %s)", status[r], x->why, x->detail);
            }
            continue;
        }
        uint64_t d = x->detect_ns > t_signal ? (x->detect_ns - t_signal) / 1000000u : 0;
        det[sh->mode][ndet[sh->mode]++] = d;
        printf(" %" PRIu64 "ms", d);
        if (status[r] != 0 || x->wrong != 0 || !x->lost_seen || d > limit_ms) {
            bad = 1;
            printf(" [process %d FAILED: exit %d, %" PRIu64 " wrong, %s; %s]", r, status[r],
                   x->wrong, x->why, x->detail);
        }
    }
    printf("%s%s\n",
           hang  ? " HANG"
           : bad ? " FAILED"
                 : " ok",
           sh->res[sh->victim == 0 ? 1 : 0].shrinks ? " (shrunk)" : " (fresh init)");
    if (getenv("DRILL_VERBOSE") != NULL && sh->nprocs > 0) {
        printf("  detail (process %d): %s\n", sh->victim == 0 ? 1 : 0,
               sh->res[sh->victim == 0 ? 1 : 0].detail);
        if (sh->mode == MODE_STOP)
            printf("  detail (the victim, %d): %s\n", sh->victim, sh->res[sh->victim].detail);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'/* '%s'/.ccq* 2>/dev/null", sh->dir, sh->dir);
    if (system(cmd) != 0) {
        /* a leftover only costs disk */
    }
    fake_xproc_cleanup();
    return hang ? 2 : bad;
}

static void usage(void)
{
    fprintf(stderr, "usage: drill_health [--procs 3|4|0] [--boot file|store|tcp|any] "
                    "[--mode kill|stop|any] [--drills N] [--hb MS] [--hb-timeout MS] "
                    "[--devices 1|2|0] [--seed S] [--nccl-version V] [--victim P]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    opts o = {0, 0, -1, -1, 1, 0, -1, 100, 1000, 0};
    shared *sh;
    static uint64_t det_kill[4096], det_stop[4096], detv[1024];
    uint64_t *det[2] = {det_kill, det_stop};
    size_t ndet[2] = {0, 0}, ndetv = 0;
    int hangs = 0, failed = 0;
    char dir[] = "/tmp/ccq-drill-XXXXXX";

    o.seed = (unsigned)time(NULL);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL)
            usage();
        if (strcmp(a, "--procs") == 0)
            o.procs = atoi(v);
        else if (strcmp(a, "--devices") == 0)
            o.devices = atoi(v);
        else if (strcmp(a, "--boot") == 0)
            o.boot = strcmp(v, "file") == 0    ? BOOT_FILE
                     : strcmp(v, "store") == 0 ? BOOT_STORE
                     : strcmp(v, "tcp") == 0   ? BOOT_TCP
                                               : -1;
        else if (strcmp(a, "--mode") == 0)
            o.mode = strcmp(v, "kill") == 0 ? MODE_KILL : strcmp(v, "stop") == 0 ? MODE_STOP : -1;
        else if (strcmp(a, "--drills") == 0)
            o.drills = atoi(v);
        else if (strcmp(a, "--hb") == 0)
            o.hb_ms = (uint32_t)atoi(v);
        else if (strcmp(a, "--hb-timeout") == 0)
            o.hb_timeout_ms = (uint32_t)atoi(v);
        else if (strcmp(a, "--seed") == 0)
            o.seed = (unsigned)strtoul(v, NULL, 10);
        else if (strcmp(a, "--nccl-version") == 0)
            o.nccl_version = atoi(v);
        else if (strcmp(a, "--victim") == 0)
            o.victim = atoi(v);
        else
            usage();
        i++;
    }
    if (o.drills < 1 || o.drills > 1000 || (o.procs != 0 && (o.procs < 3 || o.procs > 4)))
        usage();
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 2;
    }
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    printf("drill_health: seed %u, heartbeat_ms %u, heartbeat_timeout_ms %u\n", o.seed, o.hb_ms,
           o.hb_timeout_ms);
    unsigned rnd = o.seed;
    for (int d = 0; d < o.drills; d++) {
        pthread_mutexattr_t a;
        memset(sh, 0, sizeof *sh);
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&sh->store.lock, &a);
        pthread_mutexattr_destroy(&a);
        sh->nprocs = o.procs ? o.procs : 3 + (int)(rand_r(&rnd) % 2);
        sh->devices = o.devices ? o.devices : 1 + (int)(rand_r(&rnd) % 2);
        sh->boot = o.boot >= 0 ? o.boot : (int)(rand_r(&rnd) % 3);
        sh->mode = o.mode >= 0 ? o.mode : (int)(rand_r(&rnd) % 2);
        sh->victim = (int)(rand_r(&rnd) % (unsigned)sh->nprocs);
        if (o.victim >= 0)
            sh->victim = o.victim % sh->nprocs;
        if (sh->boot == BOOT_TCP)
            /* Below the ephemeral range (free_port.h): a port the kernel picked could be
             * taken as a connection's own before process 0 listened (CI 2026-12-03,
             * drill_health_tcp_rank0: no process met). */
            sh->port = ccq_test_free_port();
        sh->hb_ms = o.hb_ms;
        sh->hb_timeout_ms = o.hb_timeout_ms;
        sh->nccl_version = o.nccl_version;
        snprintf(sh->dir, sizeof sh->dir, "%s", dir);
        int r = drill(sh, d, det, ndet, detv, &ndetv, &rnd);
        hangs += r == 2;
        failed += r == 1;
        fflush(stdout);
    }
    printf("drill_health: %d drills, %d hangs, %d failed\n", o.drills, hangs, failed);
    for (int m = 0; m < 2; m++) {
        if (ndet[m] == 0)
            continue;
        qsort(det[m], ndet[m], sizeof det[m][0], cmp_u64);
        printf(
            "  %s: survivors' fences returned CCQ_ERR_PROCESS_LOST after the signal: p50 %" PRIu64
            " ms, max %" PRIu64 " ms (%zu fences)\n",
            m == MODE_KILL ? "SIGKILL" : "SIGSTOP", det[m][ndet[m] / 2], det[m][ndet[m] - 1],
            ndet[m]);
    }
    if (ndetv > 0) {
        qsort(detv, ndetv, sizeof detv[0], cmp_u64);
        printf("  stopped processes fenced off after SIGCONT: p50 %" PRIu64 " ms, max %" PRIu64
               " ms (%zu)\n",
               detv[ndetv / 2], detv[ndetv - 1], ndetv);
    }
    rmdir(dir);
    return hangs || failed ? 1 : 0;
}
