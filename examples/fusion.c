/* Fusion of small collectives (docs/fusion.md): a data-parallel step submits one Mean
 * all_reduce per gradient, parameter by parameter, and ccq runs the small ones that a batch
 * holds together as one engine operation each, without any bucketing in the caller. The
 * example runs the same step with fusion off and on, prints how many engine operations each
 * took (from the flight recorder's CCQ_EV_FUSED events) and checks that both give the same
 * bits. The same program runs
 *
 *   in one process (2 host devices):   ./ccq_fusion
 *   as a world under mpirun:           CCQ_BOOTSTRAP=mpi mpirun -np 2 ./ccq_fusion
 *
 * (from the build directory's examples/). Across processes the member processes agree on
 * every fusion through the engine, so each fuses exactly the same operations. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ccq.h"

enum { NPARAMS = 64, DEVICES = 2 };

/* Gradient sizes (float32 elements): mostly small, a few big ones that never fuse. */
static size_t size_of(int p)
{
    static const size_t sizes[] = {256, 4096, 64, 1024, 300000, 32, 2048, 512};
    return sizes[p % 8];
}

/* One step on a runtime with the given fusion_bytes: returns the engine operations it took,
 * or -1; the results are left in out[device][param]. */
static long step(uint64_t fusion, float *out[DEVICES][NPARAMS], int *rank, int *procs)
{
    ccq_config cfg;
    ccq_runtime *rt;
    ccq_device_id first, all[1024];
    uint32_t count, total;
    long ops = NPARAMS;
    ccq_event *ev;
    size_t nev = 0, cap = 65536;

    ccq_config_init(&cfg); /* the world from the environment (mpirun), if any */
    cfg.host_devices = DEVICES;
    cfg.fusion_bytes = fusion;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "ccq_runtime_create: %s\n", ccq_last_error_detail());
        return -1;
    }
    ccq_local_devices(rt, &first, &count);
    total = ccq_device_count(rt);
    *rank = (int)ccq_world_rank(rt);
    *procs = (int)ccq_world_size(rt);
    for (uint32_t d = 0; d < total; d++)
        all[d] = d;
    if (ccq_comm_init(rt, all, total) != CCQ_OK) {
        fprintf(stderr, "ccq_comm_init: %s\n", ccq_last_error_detail());
        return -1;
    }
    /* One thread submits every parameter on every local device (as burn's DDP does), in
     * place, then fences each device: no bucketing here. */
    for (int p = 0; p < NPARAMS; p++)
        for (uint32_t k = 0; k < count; k++) {
            float *g = out[k][p];
            for (size_t e = 0; e < size_of(p); e++)
                g[e] = (float)(first + k) + (float)(p % 5) * 0.25f + (float)(e % 7) * 0.125f;
            if (ccq_all_reduce(rt, first + k, 0, g, g, size_of(p), CCQ_FLOAT32, CCQ_AVG, all,
                               total) != CCQ_OK) {
                fprintf(stderr, "ccq_all_reduce: %s\n", ccq_last_error_detail());
                return -1;
            }
        }
    for (uint32_t k = 0; k < count; k++)
        if (ccq_sync_collective(rt, first + k, 0) != CCQ_OK) {
            fprintf(stderr, "fence: %s\n", ccq_last_error_detail());
            return -1;
        }
    /* What ran fused: the recorder's CCQ_EV_FUSED events of communicator 0 (the world's). */
    ev = malloc(cap * sizeof *ev);
    ev[0].struct_size = sizeof *ev;
    ccq_trace_snapshot(rt, ev, cap, &nev, NULL);
    for (size_t i = 0; i < nev; i++)
        if (ev[i].type == CCQ_EV_FUSED && ev[i].comm == 0) {
            if (fusion > 0 && *rank == 0 && ops > NPARAMS - 12) /* the first few */
                printf("  fused %s #%llu-#%llu: %llu ops, %.1f KiB, %.1f us\n",
                       ccq_kind_name(ev[i].kind), (unsigned long long)ev[i].seq,
                       (unsigned long long)(ev[i].seq + ev[i].count - 1),
                       (unsigned long long)ev[i].count, (double)ev[i].bytes / 1024.0,
                       (double)ev[i].dur_ns / 1e3);
            ops -= (long)ev[i].count - 1;
        }
    free(ev);
    ccq_runtime_destroy(rt);
    return ops;
}

int main(void)
{
    static float *off[DEVICES][NPARAMS], *on[DEVICES][NPARAMS];
    int rank = 0, procs = 1, bad = 0;
    long n_off, n_on;

    for (int k = 0; k < DEVICES; k++)
        for (int p = 0; p < NPARAMS; p++) {
            off[k][p] = malloc(size_of(p) * sizeof(float));
            on[k][p] = malloc(size_of(p) * sizeof(float));
        }
    n_off = step(0, off, &rank, &procs);
    if (rank == 0 && n_off >= 0)
        printf("process 0 of %d, %d devices each: %d Mean all_reduces per step\n", procs, DEVICES,
               NPARAMS);
    n_on = step(1u << 20, on, &rank, &procs);
    if (n_off < 0 || n_on < 0)
        return 1;
    for (int k = 0; k < DEVICES; k++)
        for (int p = 0; p < NPARAMS; p++)
            bad += memcmp(off[k][p], on[k][p], size_of(p) * sizeof(float)) != 0;
    if (rank == 0)
        printf("fusion off: %ld engine operations; fusion_bytes 1 MiB: %ld; results %s\n", n_off,
               n_on, bad ? "DIFFER" : "bit-identical");
    for (int k = 0; k < DEVICES; k++)
        for (int p = 0; p < NPARAMS; p++) {
            free(off[k][p]);
            free(on[k][p]);
        }
    return bad != 0;
}
