/* A training loop that survives the loss of a process (docs/multiprocess.md, "When a process
 * dies"): catch CCQ_ERR_PROCESS_LOST at the fence, init a communicator over the surviving
 * devices, agree on the step to go on from (the survivors may have failed at different steps),
 * go on.
 *
 *   ./ccq_survive [processes] [--kill P] [--stall P] [--steps N] [--boot tcp://HOST:PORT]
 *
 * Forks `processes` (default 3) processes that meet in a fresh directory (the file bootstrap),
 * or at a tcp:// rendezvous served by process 0 with --boot, and run a loop of all_reduce steps
 * over every device of the world (one GPU each: the NCCL backend). With --kill P (the default: the
 * last process) this program kills process P with SIGKILL once it has done a few steps. With
 * --stall P, process P stops submitting instead (alive, its heartbeats go on) and the others wait
 * for it: `ccq-trace status DIR` (or the tcp:// address) shows who they wait for and where, live
 * (docs/tracing.md). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ccq.h"

enum { N = 1024 };

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The lowest `step` of the group's processes, into *step (an all_reduce MIN). */
static ccq_status agree_step(ccq_runtime *rt, ccq_device_id dev, const ccq_device_id *group,
                             uint32_t n, int *step)
{
    int64_t v = *step, *buf;
    ccq_status st = ccq_mem_alloc(rt, dev, sizeof v, (void **)&buf);
    if (st != CCQ_OK)
        return st;
    ccq_mem_copy(rt, dev, buf, &v, sizeof v, CCQ_COPY_TO_DEVICE);
    st = ccq_all_reduce(rt, dev, 0, buf, buf, 1, CCQ_INT64, CCQ_MIN, group, n);
    if (st == CCQ_OK)
        st = ccq_sync_collective(rt, dev, 0);
    ccq_mem_copy(rt, dev, &v, buf, sizeof v, CCQ_COPY_TO_HOST);
    ccq_mem_free(rt, dev, buf);
    *step = (int)v;
    return st;
}

/* One process of the job: its loop of steps. */
static int train(unsigned rank, unsigned nprocs, const char *where, int stall, int steps, int ready)
{
    ccq_config cfg;
    ccq_runtime *rt;
    char boot[256], cuda[16];
    ccq_device_id first, group[64];
    uint32_t count, n;
    float *grad, *sum;
    int rc = 0;

    /* One GPU per process (NCCL refuses two ranks on one GPU). */
    snprintf(cuda, sizeof cuda, "%u", rank);
    setenv("CUDA_VISIBLE_DEVICES", cuda, 0);
    ccq_config_init(&cfg);
    if (getenv("CCQ_BACKEND") == NULL)
        cfg.backend = "nccl";
    cfg.world_rank = rank;
    cfg.world_size = nprocs;
    snprintf(boot, sizeof boot, "%s%s", strncmp(where, "tcp://", 6) == 0 ? "" : "file:", where);
    cfg.bootstrap = boot;
    cfg.heartbeat_ms = 200; /* a stopped process is declared lost after 2 s */
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "process %u: ccq_runtime_create: %s\n", rank, ccq_last_error_detail());
        return 1;
    }
    ccq_local_devices(rt, &first, &count);
    /* The group: every device of the world (here each process has the same count, so process
     * p owns ids p * count .. p * count + count - 1). */
    n = ccq_device_count(rt);
    for (uint32_t d = 0; d < n; d++)
        group[d] = d;
    if (ccq_comm_init(rt, group, n) != CCQ_OK) {
        fprintf(stderr, "process %u: ccq_comm_init: %s\n", rank, ccq_last_error_detail());
        return 1;
    }
    ccq_mem_alloc(rt, first, N * sizeof(float), (void **)&grad);
    ccq_mem_alloc(rt, first, N * sizeof(float), (void **)&sum);
    float *host = malloc(N * sizeof(float));

    for (int step = 0; step < steps;) {
        if (step == 12 && ready >= 0) { /* tell the parent it may act now */
            if (write(ready, "r", 1) != 1)
                perror("write");
            close(ready);
            ready = -1;
        }
        if ((int)rank == stall && step == 15) {
            printf("process %u: step %d: stops submitting (it stays alive)\n", rank, step);
            fflush(stdout);
            nap_ms(600000);
        }
        for (int k = 0; k < N; k++) /* this step's "gradient": 1 from every device */
            host[k] = 1.0f;
        ccq_mem_copy(rt, first, grad, host, N * sizeof(float), CCQ_COPY_TO_DEVICE);
        ccq_status st = ccq_all_reduce(rt, first, 0, grad, sum, N, CCQ_FLOAT32, CCQ_SUM, group, n);
        if (st == CCQ_OK)
            st = ccq_sync_collective(rt, first, 0);
        if (st == CCQ_ERR_PROCESS_LOST) {
            /* A member process is gone: continue with the devices of those still alive. */
            printf("process %u: step %d: %s: %s\n", rank, step, ccq_status_name(st),
                   ccq_last_error_detail());
            uint32_t m = 0;
            for (uint32_t p = 0; p < nprocs; p++) {
                ccq_process_state ps;
                if (ccq_world_process_state(rt, p, &ps) == CCQ_OK && ps == CCQ_PROCESS_ALIVE)
                    for (uint32_t i = 0; i < count; i++)
                        group[m++] = p * count + i;
            }
            n = m;
            st = ccq_comm_init(rt, group, n);
            printf("process %u: ccq_comm_init over the %u surviving devices: %s\n", rank, n,
                   ccq_status_name(st));
            /* The survivors may have failed at different steps (one finished a step another
             * failed): go on from the lowest, as from a checkpoint they all have. */
            if (st == CCQ_OK)
                st = agree_step(rt, first, group, n, &step);
            if (st != CCQ_OK) {
                rc = 1;
                break;
            }
            continue; /* from that step, over the survivors */
        }
        if (st != CCQ_OK) {
            printf("process %u: step %d: %s: %s\n", rank, step, ccq_status_name(st),
                   ccq_last_error_detail());
            rc = 1;
            break;
        }
        ccq_mem_copy(rt, first, host, sum, N * sizeof(float), CCQ_COPY_TO_HOST);
        if (step % 10 == 9 || step == steps - 1)
            printf("process %u: step %d: every element %g (%u devices)\n", rank, step,
                   (double)host[0], n);
        step++;
        nap_ms(20); /* the step's compute */
    }
    fflush(stdout);
    ccq_mem_free(rt, first, grad);
    ccq_mem_free(rt, first, sum);
    free(host);
    ccq_runtime_destroy(rt);
    return rc;
}

int main(int argc, char **argv)
{
    unsigned nprocs = 3;
    int kill_p = -1, stall = -1, steps = 30;
    char dir[] = "/tmp/ccq-survive-XXXXXX";
    const char *where = dir; /* the file bootstrap's directory, or --boot's tcp:// address */
    pid_t pid[64];
    int ready[64];

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--kill") == 0 && i + 1 < argc)
            kill_p = atoi(argv[++i]);
        else if (strcmp(argv[i], "--stall") == 0 && i + 1 < argc)
            stall = atoi(argv[++i]);
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--boot") == 0 && i + 1 < argc)
            where = argv[++i];
        else
            nprocs = (unsigned)atoi(argv[i]);
    }
    if (nprocs < 2 || nprocs > 64) {
        fprintf(stderr, "usage: ccq_survive [processes] [--kill P] [--stall P] [--steps N] "
                        "[--boot tcp://HOST:PORT]\n");
        return 2;
    }
    if (kill_p < 0 && stall < 0)
        kill_p = (int)nprocs - 1;
    setvbuf(stdout, NULL, _IOLBF, 0); /* one line at a time from every process */
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    printf("%u processes meeting in %s%s\n", nprocs, where,
           stall >= 0 ? " (watch them: ccq-trace status <that place>)" : "");
    fflush(stdout);
    for (unsigned r = 0; r < nprocs; r++) {
        int fd[2];
        if (pipe(fd) != 0) {
            perror("pipe");
            return 1;
        }
        pid[r] = fork();
        if (pid[r] == 0) {
            close(fd[0]);
            _exit(train(r, nprocs, where, stall, steps, fd[1]));
        }
        close(fd[1]);
        ready[r] = fd[0];
    }
    if (kill_p >= 0 && kill_p < (int)nprocs) {
        char c;
        if (read(ready[kill_p], &c, 1) == 1) {
            printf("killing process %d (pid %d) with SIGKILL\n", kill_p, (int)pid[kill_p]);
            fflush(stdout);
            kill(pid[kill_p], SIGKILL);
        }
    }
    int bad = 0;
    for (unsigned r = 0; r < nprocs; r++) {
        int st;
        if ((int)r == stall)
            continue;
        waitpid(pid[r], &st, 0);
        bad += (int)r != kill_p && !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        close(ready[r]);
    }
    if (stall >= 0 && stall < (int)nprocs) { /* the others gave up on it: end it */
        kill(pid[stall], SIGTERM);
        waitpid(pid[stall], NULL, 0);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return bad ? 1 : 0;
}
