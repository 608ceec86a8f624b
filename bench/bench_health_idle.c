/* What job health costs an idle world: 4 processes (forked, the file bootstrap in a fresh
 * directory, the host backend with one device each) create their runtimes and then do nothing
 * for `seconds`; each measures the CPU time its whole process used meanwhile (getrusage: the
 * scheduler, the health monitor, every thread). Run once per heartbeat_ms in the list, 0 being
 * heartbeats off, side by side:
 *
 *   bench_health_idle [seconds] [heartbeat_ms...]       (default: 10 s; 0 1000 100)
 *
 * Prints, per setting, the CPU milliseconds per second of each process and of the world. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "ccq.h"

enum { NPROCS = 4 };

static int one(const char *dir, unsigned rank, unsigned hb_ms, double seconds, double *out)
{
    ccq_config cfg;
    ccq_runtime *rt;
    char boot[128];

    ccq_config_init(&cfg);
    cfg.host_devices = 1;
    cfg.host_workers = 1;
    cfg.world_rank = rank;
    cfg.world_size = NPROCS;
    snprintf(boot, sizeof boot, "file:%s", dir);
    cfg.bootstrap = boot;
    cfg.heartbeat_ms = hb_ms;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "process %u: %s\n", rank, ccq_last_error_detail());
        return 1;
    }
    bench_sleep_s(1.0); /* past start-up */
    double c0 = bench_cpu_s();
    bench_sleep_s(seconds);
    *out = (bench_cpu_s() - c0) / seconds;
    ccq_runtime_destroy(rt);
    return 0;
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 10.0;
    unsigned settings[16] = {0, 1000, 100}, nset = 3;
    double *cpu =
        mmap(NULL, NPROCS * sizeof *cpu, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    if (argc > 2) {
        nset = 0;
        for (int i = 2; i < argc && nset < 16; i++)
            settings[nset++] = (unsigned)atoi(argv[i]);
    }
    if (seconds <= 0 || cpu == MAP_FAILED) {
        fprintf(stderr, "usage: bench_health_idle [seconds] [heartbeat_ms...]\n");
        return 2;
    }
    printf("an idle world of %d processes (file bootstrap, host backend), %.0f s each\n", NPROCS,
           seconds);
    printf("%-14s %s\n", "heartbeat_ms", "CPU ms per second: each process, and the world");
    for (unsigned s = 0; s < nset; s++) {
        char dir[] = "/tmp/ccq-idle-XXXXXX";
        pid_t pid[NPROCS];
        int bad = 0;
        if (mkdtemp(dir) == NULL) {
            perror("mkdtemp");
            return 1;
        }
        fflush(stdout);
        for (unsigned r = 0; r < NPROCS; r++) {
            pid[r] = fork();
            if (pid[r] == 0)
                _exit(one(dir, r, settings[s], seconds, &cpu[r]));
        }
        for (unsigned r = 0; r < NPROCS; r++) {
            int st;
            waitpid(pid[r], &st, 0);
            bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
        }
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", dir);
        if (bad)
            return 1;
        double total = 0;
        printf("%-14u", settings[s]);
        for (unsigned r = 0; r < NPROCS; r++) {
            printf(" %6.3f", cpu[r] * 1e3);
            total += cpu[r];
        }
        printf("   world %6.3f\n", total * 1e3);
    }
    return 0;
}
