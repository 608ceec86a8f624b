/* ccq across processes: one process of a world. Where the world comes from is the
 * environment's business (ccq_config_init reads it), so the same program runs, from the
 * build directory's examples/ (build/examples/ccq_world),
 *
 *   with no launcher:        for r in 0 1; do CCQ_WORLD_RANK=$r CCQ_WORLD_SIZE=2 \
 *                              CCQ_BOOTSTRAP=tcp://127.0.0.1:29500 ./ccq_world & done; wait
 *   as torchrun starts it:   RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (tcp:// to the master)
 *   under mpirun:            CCQ_BOOTSTRAP=mpi mpirun -np 2 ./ccq_world
 *   through a directory:     ... CCQ_BOOTSTRAP=file:/tmp/myjob ./ccq_world ...
 *
 * (the file bootstrap creates /tmp/myjob if needed; examples/world_store.c shows the fifth
 * way, the embedder's own store). Each process prints its place in the world, runs an
 * all_reduce over its own devices, then one over every device of the world, and checks the
 * results. The world's all_reduce needs a backend that spans processes: NCCL, or the host
 * backend through its UCX engine (any of the ways above) or its MPI engine (under mpirun).
 * A host backend that cannot span them (CCQ_HOST_ENGINE=mpi without mpirun, or a ccq built
 * without UCX and MPI) refuses the world's communicator at once (CCQ_ERR_UNSUPPORTED,
 * printed with its reason), which this example reports and accepts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ccq.h"

enum { N = 4096 };

static int all_reduce_over(ccq_runtime *rt, const ccq_device_id *set, uint32_t n,
                           ccq_device_id first, uint32_t count, const char *what)
{
    float *buf[64];
    ccq_status st = ccq_comm_init(rt, set, n);
    if (st != CCQ_OK) {
        printf("  %s: %s: %s\n", what, ccq_status_name(st), ccq_last_error_detail());
        return st == CCQ_ERR_UNSUPPORTED ? 0 : 1;
    }
    /* Device d contributes d + 1 everywhere, so the sum is known to every process. */
    float want = 0;
    for (uint32_t i = 0; i < n; i++)
        want += (float)(set[i] + 1);
    for (uint32_t i = 0; i < count; i++) {
        ccq_device_id d = first + i;
        if (ccq_mem_alloc(rt, d, N * sizeof(float), (void **)&buf[i]) != CCQ_OK)
            return 1;
        float host[N];
        for (int k = 0; k < N; k++)
            host[k] = (float)(d + 1);
        ccq_mem_copy(rt, d, buf[i], host, sizeof host, CCQ_COPY_TO_DEVICE);
        st = ccq_all_reduce(rt, d, 0, buf[i], buf[i], N, CCQ_FLOAT32, CCQ_SUM, set, n);
        if (st != CCQ_OK)
            return printf("  all_reduce: %s\n", ccq_last_error_detail()), 1;
    }
    int bad = 0;
    for (uint32_t i = 0; i < count; i++) {
        ccq_device_id d = first + i;
        float host[N];
        st = ccq_sync_collective(rt, d, 0);
        if (st != CCQ_OK)
            return printf("  fence: %s\n", ccq_last_error_detail()), 1;
        ccq_mem_copy(rt, d, host, buf[i], sizeof host, CCQ_COPY_TO_HOST);
        for (int k = 0; k < N; k++)
            bad += host[k] != want;
        ccq_mem_free(rt, d, buf[i]);
    }
    printf("  %s over %u devices: %s (every element %g)\n", what, n, bad ? "WRONG" : "OK",
           (double)want);
    return bad != 0;
}

int main(void)
{
    ccq_config cfg;
    ccq_runtime *rt;
    ccq_device_id first, all[1024];
    uint32_t count;

    ccq_config_init(&cfg); /* CCQ_WORLD_RANK/SIZE (or the launcher's), CCQ_BOOTSTRAP, ... */
    cfg.host_devices = 2;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "ccq_runtime_create: %s\n", ccq_last_error_detail());
        return 1;
    }
    ccq_local_devices(rt, &first, &count);
    printf("process %u of %u (%s backend): devices %u..%u of %u\n", ccq_world_rank(rt),
           ccq_world_size(rt), ccq_backend_name(rt), first, first + count - 1,
           ccq_device_count(rt));
    for (uint32_t i = 0; i < count; i++)
        all[i] = first + i;
    int bad = all_reduce_over(rt, all, count, first, count, "this process's devices");
    for (uint32_t d = 0; d < ccq_device_count(rt); d++)
        all[d] = d;
    if (ccq_world_size(rt) > 1)
        bad |= all_reduce_over(rt, all, ccq_device_count(rt), first, count, "the world");
    ccq_runtime_destroy(rt);
    return bad;
}
