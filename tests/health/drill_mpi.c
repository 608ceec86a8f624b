/* The kill drill on the host backend's MPI engine, under mpiexec (Open MPI: --mca
 * orte_abort_on_non_zero_status 0, so the launcher lets the others run when one dies):
 * every process loops exact all_reduces over every device of the world; the victim kills
 * itself with SIGKILL at a step; every survivor's fence returns CCQ_ERR_PROCESS_LOST naming
 * it (the OS's word: the processes share this host), measured; the survivors init a
 * communicator over the surviving devices (a new MPI communicator among them) and run 100
 * more steps with exact results.
 *
 *   mpiexec -n 3|4 --mca orte_abort_on_non_zero_status 0 drill_mpi VICTIM STEP BOOT MODE
 *
 * BOOT: "mpi" (only the OS tells: the processes share this host), or file:DIR (MPI initialised
 * by the program, and heartbeats through DIR). MODE: kill (SIGKILL), or stop (SIGSTOP; needs
 * heartbeats, so file:DIR): the survivors declare it lost after heartbeat_timeout_ms, and once
 * they ran their 100 steps the lowest one continues it (SIGCONT): it learns that it was
 * declared lost and its fence fails naming itself. The victim writes its pid and the time of
 * the signal in DIR (or /tmp), so the survivors print how long detection took. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <mpi.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ccq.h"

enum { N = 1000, AFTER = 100 };

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int rank_;
static char detail_[1024]; /* the first error's detail of the last step() */

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "process %d: line %d: ", rank_, __LINE__);                             \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " (%s)\n", ccq_last_error_detail());                                   \
            fflush(stderr);                                                                        \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

static float input(uint32_t d, uint64_t s, int k)
{
    return (float)((int)((d + 1 + s + (uint64_t)k) % 5) - 2); /* in [-2, 2]: exact in any order */
}

/* One all_reduce over devs from this process's devices in it; its fences' first error. */
static ccq_status step(ccq_runtime *rt, const uint32_t *devs, uint32_t n, uint64_t s, float *in,
                       float *out, uint32_t first, uint32_t count, uint64_t *wrong)
{
    ccq_status st = CCQ_OK;
    for (uint32_t i = 0; i < count; i++) {
        for (int k = 0; k < N; k++)
            in[i * N + k] = input(first + i, s, k);
        ccq_status x = ccq_all_reduce(rt, first + i, 0, in + i * N, out + i * N, N, CCQ_FLOAT32,
                                      CCQ_SUM, devs, n);
        if (x != CCQ_OK && st == CCQ_OK) {
            st = x;
            snprintf(detail_, sizeof detail_, "%s", ccq_last_error_detail());
        }
    }
    for (uint32_t i = 0; i < count; i++) {
        ccq_status x = ccq_sync_collective(rt, first + i, 0);
        if (x != CCQ_OK && st == CCQ_OK) {
            st = x;
            snprintf(detail_, sizeof detail_, "%s", ccq_last_error_detail());
        }
    }
    for (uint32_t i = 0; i < count && st == CCQ_OK; i++)
        for (int k = 0; k < N; k++) {
            float want = 0;
            for (uint32_t j = 0; j < n; j++)
                want += input(devs[j], s, k);
            *wrong += out[i * N + k] != want;
        }
    return st;
}

static void victim_file(char *path, size_t len, const char *boot)
{
    snprintf(path, len, "%s/drill_mpi.victim", strncmp(boot, "file:", 5) == 0 ? boot + 5 : "/tmp");
}

int main(int argc, char **argv)
{
    int provided, size;
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    uint32_t first, count, total, all[64], surv[64], nsurv = 0;
    uint64_t wrong = 0, s = 0;
    float *in, *out;
    char word[32], vpath[512];

    if (argc < 5) {
        fprintf(stderr, "usage: drill_mpi VICTIM STEP mpi|file:DIR kill|stop\n");
        return 2;
    }
    int victim = atoi(argv[1]);
    uint64_t signal_step = strtoull(argv[2], NULL, 10);
    bool stop = strcmp(argv[4], "stop") == 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    victim_file(vpath, sizeof vpath, argv[3]);
    ccq_config_init(&cfg);
    cfg.host_devices = 1 + (uint32_t)rank_ % 2;
    cfg.timeout_ms = 20000;
    cfg.heartbeat_ms = 100;
    cfg.heartbeat_timeout_ms = 1000;
    cfg.bootstrap = argv[3];
    CHECK(ccq_runtime_create(&cfg, &rt) == CCQ_OK, "create");
    ccq_local_devices(rt, &first, &count);
    total = ccq_device_count(rt);
    for (uint32_t d = 0; d < total; d++)
        all[d] = d;
    in = malloc(2 * N * sizeof *in);
    out = malloc(2 * N * sizeof *out);
    CHECK(ccq_comm_init(rt, all, total) == CCQ_OK, "comm_init(world)");

    /* The loop; the victim dies (or stops) in it. */
    uint64_t t_lost = 0;
    for (;; s++) {
        if (rank_ == victim && s == signal_step) {
            FILE *f = fopen(vpath, "w");
            CHECK(f != NULL, "cannot write %s", vpath);
            fprintf(f, "%d %" PRIu64 "\n", (int)getpid(), mono_ns());
            fclose(f);
            raise(stop ? SIGSTOP : SIGKILL);
        }
        ccq_status st = step(rt, all, total, s, in, out, first, count, &wrong);
        if (st == CCQ_OK)
            continue;
        t_lost = mono_ns();
        snprintf(word, sizeof word, "process %d ", victim);
        CHECK(st == CCQ_ERR_PROCESS_LOST && strstr(detail_, word) != NULL,
              "step %" PRIu64 ": %s: %s", s, ccq_status_name(st), detail_);
        break;
    }
    if (rank_ == victim) {
        /* Continued after the others gave it up: fenced off, it reads itself as lost. */
        ccq_process_state self;
        char detail[1024];
        snprintf(detail, sizeof detail, "%s", detail_);
        CHECK(strstr(detail, "(this process") != NULL, "the victim's detail: %s", detail);
        CHECK(ccq_world_process_state(rt, (uint32_t)rank_, &self) == CCQ_OK &&
                  self == CCQ_PROCESS_LOST,
              "the victim reads itself as %d", (int)self);
        printf("process %d (continued): fenced off: %s\n", rank_, detail);
        fflush(stdout);
        ccq_runtime_destroy(rt);
        _exit(0);
    }
    int vpid = 0;
    uint64_t t_signal = 0;
    FILE *f = fopen(vpath, "r");
    CHECK(f != NULL && fscanf(f, "%d %" SCNu64, &vpid, &t_signal) == 2, "reading %s", vpath);
    fclose(f);
    printf("process %d: fence returned CCQ_ERR_PROCESS_LOST %.1f ms after the %s: %s\n", rank_,
           (double)(t_lost - t_signal) / 1e6, stop ? "SIGSTOP" : "SIGKILL", detail_);
    for (int p = 0; p < size; p++) {
        ccq_process_state ps;
        CHECK(ccq_world_process_state(rt, (uint32_t)p, &ps) == CCQ_OK, "state");
        CHECK(ps == (p == victim ? CCQ_PROCESS_LOST : CCQ_PROCESS_ALIVE), "process %d is %d", p,
              (int)ps);
        if (p != victim)
            for (uint32_t i = 0; i < 1 + (uint32_t)p % 2; i++) {
                uint32_t f0 = 0;
                for (int q = 0; q < p; q++)
                    f0 += 1 + (uint32_t)q % 2;
                surv[nsurv++] = f0 + i;
            }
    }
    CHECK(ccq_comm_init(rt, all, total) == CCQ_ERR_PROCESS_LOST, "comm_init(world) again");
    CHECK(ccq_comm_init(rt, surv, nsurv) == CCQ_OK, "comm_init(survivors)");
    /* The survivors failed at different steps: an operation that ran to its end on one process
     * as the loss was applied on another still fails there (as with the watchdog's aborts), so
     * one survivor may be a step behind. They go on from an agreed step, as a training loop
     * from its checkpoint (with each its own step, every survivor's sum would be wrong). */
    s = 1000000;
    for (uint64_t k = 0; k < AFTER; k++, s++)
        CHECK(step(rt, surv, nsurv, s, in, out, first, count, &wrong) == CCQ_OK,
              "survivors' step %" PRIu64, k);
    CHECK(wrong == 0, "%" PRIu64 " wrong elements", wrong);
    printf("process %d: %d more steps over the %u surviving devices, exact\n", rank_, AFTER, nsurv);
    fflush(stdout);
    if (stop && rank_ == (victim == 0 ? 1 : 0))
        kill(vpid, SIGCONT);
    ccq_runtime_destroy(rt);
    free(in);
    free(out);
    /* MPI_Finalize would wait for the lost process: leave without it (documented). */
    _exit(0);
}
