/* A world of processes launched by mpiexec (run with -n 3): the world comes from the
 * launcher's environment (OMPI_COMM_WORLD_RANK/SIZE, read by ccq_config_init) and meets
 * through the "mpi" bootstrap, which initialises MPI itself. Each process has rank + 1
 * devices: the global ids, the refusal of another process's device, a communicator of its
 * own devices while the others run theirs, and a communicator spanning processes (formed
 * by the host backend over MPI; CCQ_ERR_UNSUPPORTED in a build whose host backend has no
 * MPI engine). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ccq.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %u: line %d: ", rank, __LINE__);                                 \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " (%s)\n", ccq_last_error_detail());                                   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

int main(void)
{
    enum { N = 1000 };
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_device_id first = 0, devs[64];
    uint32_t count = 0, rank = 0, size;
    float in[8][N], out[8][N];

    ccq_config_init(&cfg);
    rank = cfg.world_rank;
    size = cfg.world_size;
    CHECK(size >= 2, "run me under mpiexec -n 3 (world_size %u)", size);
    cfg.bootstrap = "mpi";
    cfg.host_devices = rank + 1;
    cfg.timeout_ms = 30000;
    CHECK(ccq_runtime_create(&cfg, &rt) == CCQ_OK, "ccq_runtime_create");
    CHECK(ccq_world_rank(rt) == rank && ccq_world_size(rt) == size, "world");
    CHECK(ccq_device_count(rt) == size * (size + 1) / 2, "device count %u",
          ccq_device_count(rt));
    CHECK(ccq_local_devices(rt, &first, &count) == CCQ_OK && first == rank * (rank + 1) / 2 &&
              count == rank + 1,
          "local devices %u+%u", first, count);
    /* Process (rank + 1) % size's first device. */
    uint32_t other = (rank + 1) % size;
    float x[4] = {0};
    CHECK(ccq_send(rt, other * (other + 1) / 2, 0, x, 4, CCQ_FLOAT32, first) ==
                  CCQ_ERR_INVALID_ARGUMENT &&
              strstr(ccq_last_error_detail(), "belongs to process") != NULL,
          "submit on another process's device");

    for (uint32_t i = 0; i < count; i++) {
        devs[i] = first + i;
        for (int k = 0; k < N; k++)
            in[i][k] = (float)(devs[i] * 10 + k % 7);
    }
    CHECK(ccq_comm_init(rt, devs, count) == CCQ_OK, "comm_init of the local devices");
    for (uint32_t i = 0; i < count; i++)
        CHECK(ccq_all_reduce(rt, devs[i], 0, in[i], out[i], N, CCQ_FLOAT32, CCQ_SUM, devs,
                             count) == CCQ_OK,
              "all_reduce");
    for (uint32_t i = 0; i < count; i++)
        CHECK(ccq_sync_collective(rt, devs[i], 0) == CCQ_OK, "fence");
    for (uint32_t i = 0; i < count; i++)
        for (int k = 0; k < N; k++) {
            float want = 0;
            for (uint32_t j = 0; j < count; j++)
                want += in[j][k];
            CHECK(out[i][k] == want, "result [%u][%d] %g != %g", i, k, out[i][k], want);
        }

    uint32_t total = ccq_device_count(rt);
    for (uint32_t d = 0; d < total; d++)
        devs[d] = d;
    ccq_status st = ccq_comm_init(rt, devs, total);
    CHECK(st == CCQ_ERR_UNSUPPORTED || st == CCQ_OK, "comm_init of the world: %s",
          ccq_status_name(st));
    CHECK(ccq_runtime_destroy(rt) == CCQ_OK, "destroy");
    printf("rank %u of %u: OK (devices %u..%u of %u)\n", rank, size, first, first + count - 1,
           total);
    return 0;
}
