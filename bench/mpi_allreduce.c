/* MPI_Allreduce timing for bench/compare-mpi.sh: float32 sum, out of place, the same sizes
 * and statistics as ccq-perf (mean time per op over -n iterations after -w warm-ups; the
 * slowest rank's time, as nccl-tests reports). One JSON object per size on stdout.
 *
 * With --copy-floor, no MPI_Allreduce: every process copies its src into its dst (memcpy), all
 * at once (a barrier before each copy, outside nothing: the barrier is timed too, a few
 * microseconds against the milliseconds of the sizes this is for). That is the least memory
 * traffic any out-of-place all_reduce has (each process reads its input and writes its
 * output, nothing exchanged, nothing reduced), on the same cores at the same time: an
 * all_reduce of those processes cannot take less, so other / floor is the most any
 * implementation could be faster than `other` on this machine (bench/compare-world.sh's
 * "floor" column). Meaningful for sizes beyond the caches only. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'G' || *end == 'g')
        v *= 1024.0 * 1024.0 * 1024.0;
    else if (*end == 'M' || *end == 'm')
        v *= 1024.0 * 1024.0;
    else if (*end == 'K' || *end == 'k')
        v *= 1024.0;
    return (size_t)v;
}

/* One timed operation: the all_reduce, or (copy_floor) the copy of src into dst after a
 * barrier, so that every process copies at the same time. */
static void one_op(int copy_floor, const float *src, float *dst, int count)
{
    if (copy_floor) {
        MPI_Barrier(MPI_COMM_WORLD);
        memcpy(dst, src, (size_t)count * sizeof(float));
        __asm__ volatile("" ::"r"(dst) : "memory"); /* the copy is used */
    } else {
        MPI_Allreduce(src, dst, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
}

int main(int argc, char **argv)
{
    size_t minb = 8, maxb = 64u << 20;
    double factor = 2;
    int iters = 20, warmup = 5, rank, nranks, copy_floor = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--copy-floor")) {
            copy_floor = 1;
            continue;
        }
        if (i + 1 == argc)
            break;
        if (!strcmp(argv[i], "-b"))
            minb = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "-e"))
            maxb = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "-f"))
            factor = atof(argv[++i]);
        else if (!strcmp(argv[i], "-n"))
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-w"))
            warmup = atoi(argv[++i]);
    }
    float *src = malloc(maxb + 4), *dst = malloc(maxb + 4);
    for (size_t i = 0; i < maxb / 4 + 1; i++) {
        src[i] = (float)(rank + 1);
        dst[i] = 0;
    }
    for (size_t size = minb; size <= maxb; size = (size_t)((double)size * factor)) {
        int count = (int)(size / sizeof(float));
        for (int i = 0; i < warmup; i++)
            one_op(copy_floor, src, dst, count);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++)
            one_op(copy_floor, src, dst, count);
        double t = (MPI_Wtime() - t0) / iters, tmax;
        MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        float want = copy_floor ? (float)(rank + 1) : (float)(nranks * (nranks + 1) / 2);
        int wrong = dst[0] != want && count > 0;
        if (rank == 0) {
            double algbw = (double)size / tmax / 1e9;
            printf("{\"size\": %zu, \"count\": %d, \"time_us\": %.3f, \"algbw\": %.4f, "
                   "\"busbw\": %.4f, \"wrong\": %d}\n",
                   size, count, tmax * 1e6, algbw, algbw * 2.0 * (nranks - 1) / nranks, wrong);
            fflush(stdout);
        }
        if (factor <= 1)
            break;
    }
    free(src);
    free(dst);
    MPI_Finalize();
    return 0;
}
