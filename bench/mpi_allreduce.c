/* MPI_Allreduce timing for bench/compare-mpi.sh: float32 sum, out of place, the same sizes
 * and statistics as ccq-perf (mean time per op over -n iterations after -w warm-ups; the
 * slowest rank's time, as nccl-tests reports). One JSON object per size on stdout. */
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

int main(int argc, char **argv)
{
    size_t minb = 8, maxb = 64u << 20;
    double factor = 2;
    int iters = 20, warmup = 5, rank, nranks;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-b"))
            minb = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-e"))
            maxb = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-f"))
            factor = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-n"))
            iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-w"))
            warmup = atoi(argv[i + 1]);
    }
    float *src = malloc(maxb + 4), *dst = malloc(maxb + 4);
    for (size_t i = 0; i < maxb / 4 + 1; i++) {
        src[i] = (float)(rank + 1);
        dst[i] = 0;
    }
    for (size_t size = minb; size <= maxb; size = (size_t)((double)size * factor)) {
        int count = (int)(size / sizeof(float));
        for (int i = 0; i < warmup; i++)
            MPI_Allreduce(src, dst, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++)
            MPI_Allreduce(src, dst, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) / iters, tmax;
        MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        int wrong = dst[0] != (float)(nranks * (nranks + 1) / 2) && count > 0;
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
