/* The end-to-end check of issue 14 on a real world of 3 processes (the fake NCCL across
 * processes, the file bootstrap): rank 1 stops submitting after all_reduce #4 (it "hangs"
 * elsewhere) while ranks 0 and 2 go on to #7; their fences fail (timeout, or the fake's
 * absent-peer error), every process writes its dump (trace_file "DIR/trace.%r.json"), and
 * `ccq-trace analyze` on the three dumps exits 1 naming rank 1 and sequence 5. With "skip"
 * rank 1 skips only #5 and goes on: its later parts pair with the others' earlier ones, so the
 * sequence named is the last one, #7 (what a job that skipped a call really shows without
 * the signature check).
 *
 * Built with the NCCL backend (against the fake NCCL across processes, tests/fake/fake_xproc.c);
 * ctest trace_three_ranks_stop and _skip. examples/hung_rank.c is the same story on the host
 * backend over MPI (docs/tracing.md).
 *
 * usage: three_ranks CCQ_TRACE [stop|skip]   (exit 0 when analyze said what it must) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ccq.h"
#include "fake/fake_cuda_nccl.h"
#include "procs.h"

#define N          8 /* all_reduces ranks 0 and 2 submit: #0 .. #7 */
#define TIMEOUT_MS 1500

enum { E_CREATE = 10, E_COMM, E_SUBMIT, E_FENCE_OK, E_FENCE_BAD, E_DESTROY };

typedef struct job {
    char dir[64];
    const char *mode;
} job;

static int rank_main(unsigned rank, unsigned nprocs, void *arg)
{
    const job *j = arg;
    char boot[96], file[128];
    static float buf[1024];
    const ccq_device_id all[3] = {0, 1, 2};
    ccq_config cfg;
    ccq_runtime *rt;

    setenv("CCQ_FAKE_XPROC_TIMEOUT_MS", "3000", 1); /* an absent peer fails the call */
    fake_set_devices(1, 8);
    ccq_config_init(&cfg);
    cfg.backend = "nccl";
    cfg.world_rank = rank;
    cfg.world_size = nprocs;
    snprintf(boot, sizeof boot, "file:%s", j->dir);
    cfg.bootstrap = boot;
    snprintf(file, sizeof file, "%s/trace.%%r.json", j->dir);
    cfg.trace_file = file;
    cfg.trace_capacity = 4096;
    cfg.timeout_ms = TIMEOUT_MS;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "rank %u: create: %s\n", rank, ccq_last_error_detail());
        return E_CREATE;
    }
    if (ccq_comm_init(rt, all, 3) != CCQ_OK) {
        fprintf(stderr, "rank %u: comm_init: %s\n", rank, ccq_last_error_detail());
        return E_COMM;
    }
    for (int i = 0; i < N; i++) {
        if (rank == 1 && i >= 5 && (strcmp(j->mode, "skip") != 0 || i == 5))
            continue;
        if (ccq_all_reduce(rt, rank, 0, buf, buf, 1024, CCQ_FLOAT32, CCQ_SUM, all, 3) != CCQ_OK)
            return E_SUBMIT;
    }
    ccq_status st = ccq_sync_collective(rt, rank, 0);
    fprintf(stderr, "rank %u: fence: %s: %s\n", rank, ccq_status_name(st),
            st != CCQ_OK ? ccq_last_error_detail() : "");
    if (rank == 1) {
        /* "Hung" elsewhere until the others gave up (their fences and dumps). */
        sleep(3 * TIMEOUT_MS / 1000 + 4);
    } else if (st == CCQ_OK) {
        return E_FENCE_OK; /* #5.. cannot have completed without rank 1 */
    }
    if (ccq_runtime_destroy(rt) != CCQ_OK) /* writes trace.<rank>.json */
        return E_DESTROY;
    return 0;
}

int main(int argc, char **argv)
{
    job j = {.mode = argc > 2 ? argv[2] : "stop"};
    int status[3];
    char cmd[1024];

    if (argc < 2) {
        fprintf(stderr, "usage: three_ranks CCQ_TRACE [stop|skip]\n");
        return 2;
    }
    procs_tmpdir(j.dir, sizeof j.dir);
    int bad = procs_run(3, rank_main, &j, 60, status);
    for (unsigned r = 0; r < 3; r++)
        if (status[r] != 0)
            fprintf(stderr, "rank %u exited with %d\n", r, status[r]);
    if (bad) {
        procs_rmdir(j.dir);
        return 1;
    }
    const char *want = strcmp(j.mode, "skip") == 0 ? "not all ranks joined all_reduce #7: "
                                                     "missing rank 1 (device 1, process 1)"
                                                   : "not all ranks joined all_reduce #5: "
                                                     "missing rank 1 (device 1, process 1)";
    snprintf(cmd, sizeof cmd,
             "python3 '%s' analyze %s/trace.0.json %s/trace.1.json %s/trace.2.json > %s/out.txt; "
             "rc=$?; cat %s/out.txt; test $rc = 1 && grep -qF '%s' %s/out.txt",
             argv[1], j.dir, j.dir, j.dir, j.dir, j.dir, want, j.dir);
    int rc = system(cmd);
    procs_rmdir(j.dir);
    if (rc != 0) {
        fprintf(stderr, "ccq-trace analyze did not exit 1 naming \"%s\"\n", want);
        return 1;
    }
    printf("ok: analyze named rank 1 (%s)\n", want);
    return 0;
}
