/* Finding a hung rank (docs/tracing.md, "Finding a hung rank"), for real: a world of
 * processes, one host device each, all_reduces #0..#7 over every device of the world on the
 * host backend over MPI; process 1 stops submitting after #4 (as if it hung elsewhere). The
 * others' #5 never completes: the MPI engine gives up after timeout_ms and their fences
 * report it; every process writes its trace dump (trace_file, "%r" = world rank), and
 * `ccq-trace analyze` on the dumps names process 1 and #5. From build/examples:
 *
 *   mkdir -p /tmp/job42
 *   CCQ_TRACE_FILE=/tmp/job42/trace.%r.json CCQ_TIMEOUT_MS=2000 CCQ_BOOTSTRAP=mpi \
 *       mpirun -np 3 ./ccq_hung_rank
 *   ../../tools/ccq-trace analyze /tmp/job42/trace.*.json
 *
 * Each step "computes" for 50 ms first, as a training loop would. Process 1 waits (its
 * "hang") until the others have given up, then every process destroys its runtime, which
 * writes its dump, and exits. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ccq.h"

enum { N = 1024, OPS = 8, STOP_AFTER = 4, STEP_MS = 50 };

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(void)
{
    static float buf[N];
    ccq_config cfg;
    ccq_runtime *rt;
    ccq_device_id first, all[1024];
    uint32_t count;

    ccq_config_init(&cfg); /* CCQ_BOOTSTRAP, CCQ_TRACE_FILE, CCQ_TIMEOUT_MS, the launcher's rank */
    cfg.host_devices = 1;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "ccq_runtime_create: %s\n", ccq_last_error_detail());
        return 1;
    }
    uint32_t rank = ccq_world_rank(rt), n = ccq_device_count(rt);
    ccq_local_devices(rt, &first, &count);
    for (uint32_t d = 0; d < n && d < 1024; d++)
        all[d] = d;
    if (ccq_comm_init(rt, all, n) != CCQ_OK) {
        fprintf(stderr, "process %u: ccq_comm_init: %s\n", rank, ccq_last_error_detail());
        ccq_runtime_destroy(rt);
        return 1;
    }
    for (int i = 0; i < OPS; i++) {
        if (rank == 1 && i > STOP_AFTER)
            break;         /* process 1 "hangs" elsewhere: it never submits #5, #6, #7 */
        sleep_ms(STEP_MS); /* a training step's compute, before its all_reduce */
        for (int k = 0; k < N; k++)
            buf[k] = (float)(rank + 1);
        if (ccq_all_reduce(rt, first, 0, buf, buf, N, CCQ_FLOAT32, CCQ_SUM, all, n) != CCQ_OK)
            fprintf(stderr, "process %u: all_reduce #%d: %s\n", rank, i, ccq_last_error_detail());
        if (i < STOP_AFTER) /* #0-#3 fenced one by one; #4-#7 queue up behind each other */
            ccq_sync_collective(rt, first, 0);
    }
    ccq_status st = ccq_sync_collective(rt, first, 0);
    printf("process %u: fence: %s%s%s\n", rank, ccq_status_name(st), st != CCQ_OK ? ": " : "",
           st != CCQ_OK ? ccq_last_error_detail() : "");
    fflush(stdout);
    if (rank == 1) {
        /* The others give up after timeout_ms; the "hung" process outlives them. */
        ccq_config_init(&cfg);
        sleep_ms(3 * cfg.timeout_ms / 2 + 500);
    }
    ccq_runtime_destroy(rt); /* writes trace_file */
    return 0;
}
