/* The data-parallel step of bench/ddp_step.c with MPI alone (one process per rank), for
 * bench/ddp-step.sh: the same parameters in the same order, float32, in place, Mean (a SUM,
 * then a division by the rank count, in the timing):
 *   per-param  one MPI_Allreduce per parameter (what a DDP without bucketing does);
 *   fused      the gradients packed into one buffer, one MPI_Allreduce, unpacked (a bucketing
 *              layer with one bucket: pack and unpack copies are in the timing).
 * The step time is the slowest rank's; median over steps. One JSON object per mode on stdout
 * (rank 0), after a human line on stderr. Built with mpicc by the script.
 * Usage: mpi_ddp_step [-n STEPS] [-w WARMUP] [-r ROUNDS] [--params SPEC] [--order ORDER] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp_params.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, cmp_double);
    size_t k = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
    return v[k < n ? k : n - 1];
}

int main(int argc, char **argv)
{
    int steps = 20, warmup = 3, rounds = 3, rank, nranks;
    const char *spec = DDP_DEFAULT_SPEC, *order = NULL;
    ddp_params p;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-n"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-w"))
            warmup = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-r"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--params"))
            spec = argv[i + 1];
        else if (!strcmp(argv[i], "--order"))
            order = argv[i + 1];
    }
    if (ddp_params_make(&p, spec, order) != 0)
        MPI_Abort(MPI_COMM_WORLD, 2);
    float *grad = malloc(p.total * sizeof *grad), *pack = malloc(p.total * sizeof *pack);
    float scale = 1.0f / (float)nranks;
    double *ms[2];
    for (int m = 0; m < 2; m++)
        ms[m] = calloc((size_t)rounds * steps, sizeof(double));
    for (size_t i = 0; i < p.total; i++)
        grad[i] = (float)(rank + i % 3);
    /* Rounds interleave the modes so both see the same machine. */
    for (int r = 0; r < rounds; r++)
        for (int m = 0; m < 2; m++)
            for (int s = -warmup; s < steps; s++) {
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                if (m == 0) {
                    size_t off = 0;
                    for (size_t i = 0; i < p.n; i++) {
                        float *x = grad + off;
                        MPI_Allreduce(MPI_IN_PLACE, x, (int)p.count[i], MPI_FLOAT, MPI_SUM,
                                      MPI_COMM_WORLD);
                        for (size_t e = 0; e < p.count[i]; e++)
                            x[e] *= scale;
                        off += p.count[i];
                    }
                } else {
                    memcpy(pack, grad, p.total * sizeof *pack); /* the gradients, packed */
                    MPI_Allreduce(MPI_IN_PLACE, pack, (int)p.total, MPI_FLOAT, MPI_SUM,
                                  MPI_COMM_WORLD);
                    for (size_t e = 0; e < p.total; e++)
                        grad[e] = pack[e] * scale; /* unpacked */
                }
                double t = (MPI_Wtime() - t0) * 1e3, tmax;
                MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                if (s >= 0)
                    ms[m][r * steps + s] = tmax;
            }
    if (rank == 0)
        for (int m = 0; m < 2; m++) {
            size_t n = (size_t)rounds * steps;
            double med = pct(ms[m], n, 50), lo = pct(ms[m], n, 0), p90 = pct(ms[m], n, 90);
            const char *name = m ? "mpi-fused" : "mpi-per-param";
            fprintf(stderr,
                    "%s: %d processes, %zu params (%.1f MiB): median %.3f ms (min %.3f, p90 %.3f) "
                    "over %zu steps\n",
                    name, nranks, p.n, (double)p.total * 4 / 1048576.0, med, lo, p90, n);
            printf("{\"mode\": \"%s\", \"procs\": %d, \"devices\": 1, \"params\": %zu, \"bytes\": "
                   "%zu, \"order\": \"%s\", \"median_ms\": %.4f, \"min_ms\": %.4f, \"p90_ms\": "
                   "%.4f, \"steps\": %zu}\n",
                   name, nranks, p.n, p.total * 4, order ? order : "interleaved", med, lo, p90, n);
        }
    ddp_params_free(&p);
    free(grad);
    free(pack);
    free(ms[0]);
    free(ms[1]);
    MPI_Finalize();
    return 0;
}
