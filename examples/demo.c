/* ccq demo: several threads per device submit a mix of all_reduce and send/recv on several
 * streams of the host backend, fence, verify every result, and print a summary. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ccq.h"

#define NDEV 4

typedef struct job {
    ccq_runtime *rt;
    ccq_device_id dev;
    int role; /* 0: all_reduce over all 4, 1: all_reduce over a pair, 2: send/recv ring */
    int iters;
    size_t count;
    pthread_barrier_t *start;
    uint64_t ops, errors;
    char first_error[512];
} job;

/* Every device's input is a function of (device, iteration, index), so each thread can
 * compute the expected result of the collective on its own. Values are small integers,
 * so float32 sums are exact whatever the order. */
static float value(ccq_device_id d, int it, size_t i)
{
    return (float)((d + 1) * 3 + it % 7 + (int)(i % 13));
}

static void record(job *j, ccq_status st, const char *what)
{
    if (st == CCQ_OK)
        return;
    if (j->errors++ == 0)
        snprintf(j->first_error, sizeof j->first_error, "device %u %s: %s: %s", j->dev, what,
                 ccq_status_name(st), ccq_last_error_detail());
}

static void *run(void *arg)
{
    job *j = arg;
    ccq_device_id all[NDEV] = {0, 1, 2, 3};
    ccq_device_id pair[2] = {j->dev & ~1u, j->dev | 1u}; /* {0,1} or {2,3} */
    ccq_stream_id stream = (ccq_stream_id)j->role;
    float *src = malloc(j->count * sizeof *src), *dst = malloc(j->count * sizeof *dst);

    if (src == NULL || dst == NULL) {
        record(j, CCQ_ERR_NO_MEMORY, "malloc");
        free(src);
        free(dst);
        return NULL;
    }
    pthread_barrier_wait(j->start);
    for (int it = 0; it < j->iters; it++) {
        ccq_status st;
        for (size_t i = 0; i < j->count; i++)
            src[i] = value(j->dev, it, i);
        if (j->role == 0) {
            st = ccq_all_reduce(j->rt, j->dev, stream, src, dst, j->count, CCQ_FLOAT32, CCQ_SUM,
                                all, NDEV);
        } else if (j->role == 1) {
            st = ccq_all_reduce(j->rt, j->dev, stream, src, dst, j->count, CCQ_FLOAT32, CCQ_MAX,
                                pair, 2);
        } else {
            /* Ring: send to the next device, receive from the previous, on one stream.
             * Both halves go into one batch, as they would in one NCCL group. */
            st = ccq_send(j->rt, j->dev, stream, src, j->count, CCQ_FLOAT32, (j->dev + 1) % NDEV);
            if (st == CCQ_OK) {
                j->ops++;
                st = ccq_recv(j->rt, j->dev, stream, dst, j->count, CCQ_FLOAT32,
                              (j->dev + NDEV - 1) % NDEV);
            }
        }
        record(j, st, "submit");
        if (st == CCQ_OK)
            j->ops++;
        st = ccq_sync_collective(j->rt, j->dev, stream);
        record(j, st, "fence");
        if (st != CCQ_OK)
            continue;
        for (size_t i = 0; i < j->count; i++) {
            float want;
            if (j->role == 0) {
                want = 0;
                for (ccq_device_id d = 0; d < NDEV; d++)
                    want += value(d, it, i);
            } else if (j->role == 1) {
                float a = value(pair[0], it, i), b = value(pair[1], it, i);
                want = a > b ? a : b;
            } else {
                want = value((j->dev + NDEV - 1) % NDEV, it, i);
            }
            if (dst[i] != want) {
                char what[96];
                snprintf(what, sizeof what, "role %d iteration %d element %zu: got %g want %g",
                         j->role, it, i, (double)dst[i], (double)want);
                record(j, CCQ_ERR_MISMATCH, what);
                break;
            }
        }
    }
    free(src);
    free(dst);
    return NULL;
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    size_t count = argc > 2 ? (size_t)atoll(argv[2]) : 1024;
    ccq_config cfg;
    ccq_runtime *rt;
    ccq_status st;
    ccq_device_id all[NDEV] = {0, 1, 2, 3}, p01[2] = {0, 1}, p23[2] = {2, 3};
    job jobs[NDEV * 3];
    pthread_t th[NDEV * 3];
    pthread_barrier_t start;
    struct timespec t0, t1;
    uint64_t ops = 0, errors = 0;
    ccq_stats stats = {.struct_size = sizeof stats};

    ccq_config_init(&cfg);
    cfg.host_devices = NDEV;
    st = ccq_runtime_create(&cfg, &rt);
    if (st != CCQ_OK) {
        fprintf(stderr, "ccq_runtime_create: %s: %s\n", ccq_status_name(st),
                ccq_last_error_detail());
        return 1;
    }
    if ((st = ccq_comm_init(rt, all, NDEV)) != CCQ_OK ||
        (st = ccq_comm_init(rt, p01, 2)) != CCQ_OK || (st = ccq_comm_init(rt, p23, 2)) != CCQ_OK) {
        fprintf(stderr, "ccq_comm_init: %s: %s\n", ccq_status_name(st), ccq_last_error_detail());
        ccq_runtime_destroy(rt);
        return 1;
    }

    printf("ccq %s demo: backend %s, %u devices, 3 threads per device (all_reduce over 4, "
           "all_reduce over pairs, send/recv ring), %d iterations of %zu floats each\n",
           CCQ_VERSION_STRING, ccq_backend_name(rt), ccq_device_count(rt), iters, count);
    pthread_barrier_init(&start, NULL, NDEV * 3 + 1);
    for (int r = 0; r < 3; r++)
        for (ccq_device_id d = 0; d < NDEV; d++) {
            job *j = &jobs[r * NDEV + d];
            memset(j, 0, sizeof *j);
            j->rt = rt;
            j->dev = d;
            j->role = r;
            j->iters = iters;
            j->count = count;
            j->start = &start;
            pthread_create(&th[r * NDEV + d], NULL, run, j);
        }
    pthread_barrier_wait(&start);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int k = 0; k < NDEV * 3; k++)
        pthread_join(th[k], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_barrier_destroy(&start);

    for (int k = 0; k < NDEV * 3; k++) {
        ops += jobs[k].ops;
        errors += jobs[k].errors;
        if (jobs[k].errors)
            fprintf(stderr, "error: %s\n", jobs[k].first_error);
    }
    ccq_get_stats(rt, &stats);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("commands submitted %" PRIu64 ", completed %" PRIu64 ", failed %" PRIu64
           ", cancelled %" PRIu64 "\n",
           stats.submitted, stats.completed, stats.failed, stats.cancelled);
    printf("batches %" PRIu64 ", operations %" PRIu64 " (%.2f per batch, largest %" PRIu64 ")\n",
           stats.batches, stats.batched_ops,
           stats.batches ? (double)stats.batched_ops / (double)stats.batches : 0.0,
           stats.max_batch_ops);
    printf("ops %" PRIu64 ", errors = %" PRIu64 ", %.3f s, %.0f commands/s\n", ops, errors, secs,
           (double)ops / secs);
    ccq_runtime_destroy(rt);
    if (errors == 0 && stats.completed == ops && stats.submitted == ops)
        printf("OK: every result verified\n");
    else
        printf("FAILED\n");
    return errors == 0 && stats.completed == ops ? 0 : 1;
}
