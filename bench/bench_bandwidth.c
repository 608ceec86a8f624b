/* Host all_reduce bandwidth, 8 B to 256 MiB on 2 and 4 devices, against the memory-bandwidth
 * floor: an all_reduce of N buffers of S bytes must read N*S and write N*S bytes, so it
 * cannot beat 2*N*S bytes at the machine's copy rate. The copy rate is measured in the same
 * run, at the same size and working set, with as many threads as the host backend has
 * workers (a parallel memcpy of the N buffers). */
#define _GNU_SOURCE
#include <pthread.h>
#include <unistd.h>

#include "bench_common.h"
#include "ccq.h"

#define MAXDEV 4

/* ---- a parallel memcpy of N buffers, the floor's reference ---- */
typedef struct copier {
    int nthreads;
    pthread_barrier_t start, done;
    pthread_t th[64];
    int id[64];
    void **src, **dst;
    int nbuf;
    size_t bytes;
    volatile int quit;
} copier;

static copier cp;

static void *copy_main(void *arg)
{
    int id = *(int *)arg;
    for (;;) {
        pthread_barrier_wait(&cp.start);
        if (cp.quit)
            return NULL;
        /* Thread id takes an equal slice of every buffer (as the all_reduce slice owners). */
        size_t per = (cp.bytes / (size_t)cp.nthreads + 63) & ~(size_t)63;
        size_t b = per * (size_t)id, e = b + per < cp.bytes ? b + per : cp.bytes;
        for (int k = 0; k < cp.nbuf && b < e; k++)
            memcpy((char *)cp.dst[k] + b, (char *)cp.src[k] + b, e - b);
        pthread_barrier_wait(&cp.done);
    }
}

static double copy_time_s(void **src, void **dst, int nbuf, size_t bytes)
{
    uint64_t t0 = bench_now_ns();
    if (bytes < (1u << 20)) { /* small: threads would only add their wake-up cost */
        for (int k = 0; k < nbuf; k++)
            memcpy(dst[k], src[k], bytes);
    } else {
        cp.src = src;
        cp.dst = dst;
        cp.nbuf = nbuf;
        cp.bytes = bytes;
        pthread_barrier_wait(&cp.start);
        pthread_barrier_wait(&cp.done);
    }
    return (double)(bench_now_ns() - t0) / 1e9;
}

int main(int argc, char **argv)
{
    size_t maxbytes = (size_t)bench_opt(argc, argv, "--max-mib", 256) << 20;
    int iters = (int)bench_opt(argc, argv, "--iters", 0);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    bench_json js;
    int errors = 0;

    cp.nthreads = cores > 0 && cores < 64 ? (int)cores : 1;
    pthread_barrier_init(&cp.start, NULL, (unsigned)cp.nthreads + 1);
    pthread_barrier_init(&cp.done, NULL, (unsigned)cp.nthreads + 1);
    for (int i = 0; i < cp.nthreads; i++) {
        cp.id[i] = i;
        pthread_create(&cp.th[i], NULL, copy_main, &cp.id[i]);
    }
    bench_json_open(&js, argc, argv, "bandwidth");
    printf("# Host all_reduce (float32 sum, out of place) vs the memory-bandwidth floor\n");
    printf("# floor = time to move 2*N*S bytes at the parallel memcpy rate measured here "
           "(%d threads); median of runs\n",
           cp.nthreads);
    printf("# %4s %12s %12s %12s %10s %10s %8s\n", "N", "size(B)", "ccq(us)", "floor(us)",
           "ccq GB/s", "copy GB/s", "of floor");

    for (int ndev = 2; ndev <= MAXDEV; ndev += 2) {
        ccq_config cfg;
        ccq_runtime *rt;
        ccq_device_id devs[MAXDEV] = {0, 1, 2, 3};
        void *src[MAXDEV], *dst[MAXDEV];

        ccq_config_init(&cfg);
        cfg.host_devices = (uint32_t)ndev;
        if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
            fprintf(stderr, "create: %s\n", ccq_last_error_detail());
            return 1;
        }
        ccq_comm_init(rt, devs, (size_t)ndev);
        for (int d = 0; d < ndev; d++) {
            ccq_mem_alloc(rt, (ccq_device_id)d, maxbytes, &src[d]);
            ccq_mem_alloc(rt, (ccq_device_id)d, maxbytes, &dst[d]);
            /* Touch every page so page faults stay out of the timings. */
            for (size_t i = 0; i < maxbytes / sizeof(float); i++) {
                ((float *)src[d])[i] = (float)(d + 1);
                ((float *)dst[d])[i] = 0;
            }
        }
        for (size_t size = 8; size <= maxbytes; size *= 2) {
            size_t count = size / sizeof(float);
            /* Enough repetitions for ~0.2 s per size, at least 5. */
            int n = iters ? iters : (int)(1e8 / (double)(size * (size_t)ndev + 20000));
            if (n < 5)
                n = 5;
            if (n > 2000)
                n = 2000;
            double *tc = calloc((size_t)n, sizeof(double)), *tm = calloc((size_t)n, sizeof(double));
            for (int it = -1; it < n; it++) { /* it == -1 is a warm-up */
                uint64_t t0 = bench_now_ns();
                for (int d = 0; d < ndev; d++)
                    errors += ccq_all_reduce(rt, (ccq_device_id)d, 0, src[d], dst[d], count,
                                             CCQ_FLOAT32, CCQ_SUM, devs, (size_t)ndev) != CCQ_OK;
                for (int d = 0; d < ndev; d++)
                    errors += ccq_sync_collective(rt, (ccq_device_id)d, 0) != CCQ_OK;
                double t = (double)(bench_now_ns() - t0) / 1e9;
                double m = copy_time_s(src, dst, ndev, size);
                if (it >= 0) {
                    tc[it] = t;
                    tm[it] = m;
                }
            }
            /* The copy overwrote dst: check the reduction once more. */
            for (int d = 0; d < ndev; d++)
                errors += ccq_all_reduce(rt, (ccq_device_id)d, 0, src[d], dst[d], count,
                                         CCQ_FLOAT32, CCQ_SUM, devs, (size_t)ndev) != CCQ_OK;
            for (int d = 0; d < ndev; d++)
                errors += ccq_sync_collective(rt, (ccq_device_id)d, 0) != CCQ_OK;
            float want = (float)(ndev * (ndev + 1) / 2);
            for (int d = 0; d < ndev; d++)
                for (size_t i = 0; i < count; i += 997)
                    errors += ((float *)dst[d])[i] != want;

            double ccq_s = bench_median(tc, (size_t)n), copy_s = bench_median(tm, (size_t)n);
            double moved = 2.0 * ndev * (double)size; /* bytes an all_reduce must move */
            double copy_rate = moved / copy_s;        /* memcpy moves the same bytes */
            double floor_s = moved / copy_rate;
            printf("  %4d %12zu %12.2f %12.2f %10.2f %10.2f %7.0f%%\n", ndev, size, ccq_s * 1e6,
                   floor_s * 1e6, moved / ccq_s / 1e9, copy_rate / 1e9, 100.0 * floor_s / ccq_s);
            bench_json_record(
                &js,
                "\"ndev\": %d, \"size\": %zu, \"ccq_us\": %.3f, \"floor_us\": %.3f, "
                "\"ccq_gbps\": %.3f, \"copy_gbps\": %.3f, \"fraction_of_floor\": %.4f",
                ndev, size, ccq_s * 1e6, floor_s * 1e6, moved / ccq_s / 1e9, copy_rate / 1e9,
                floor_s / ccq_s);
            fflush(stdout);
            free(tc);
            free(tm);
        }
        for (int d = 0; d < ndev; d++) {
            ccq_mem_free(rt, (ccq_device_id)d, src[d]);
            ccq_mem_free(rt, (ccq_device_id)d, dst[d]);
        }
        ccq_runtime_destroy(rt);
    }
    cp.quit = 1;
    pthread_barrier_wait(&cp.start);
    for (int i = 0; i < cp.nthreads; i++)
        pthread_join(cp.th[i], NULL);
    bench_json_close(&js);
    if (errors)
        fprintf(stderr, "%d errors (submission, fence or wrong result)\n", errors);
    return errors ? 1 : 0;
}
