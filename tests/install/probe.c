/* What an installed libccq says when a program asks for a module (tests/install/run.sh,
 * tests/package/check_deb.sh): "nccl" creates a runtime on the nccl backend, "mpi" one whose
 * bootstrap is "mpi" with an mpi_comm the MPI module itself refuses before it calls MPI (so
 * the answer shows the module was loaded, without starting MPI). Prints the status and the
 * detail on one line. */
#include <stdio.h>
#include <string.h>

#include <ccq.h>

int main(int argc, char **argv)
{
    ccq_runtime *rt = NULL;
    ccq_config cfg;
    ccq_status st;

    if (argc != 2 || (strcmp(argv[1], "nccl") != 0 && strcmp(argv[1], "mpi") != 0)) {
        fprintf(stderr, "usage: %s nccl|mpi\n", argv[0]);
        return 2;
    }
    ccq_config_init(&cfg);
    if (strcmp(argv[1], "nccl") == 0) {
        cfg.backend = "nccl";
    } else {
        cfg.world_rank = 0;
        cfg.world_size = 2;
        cfg.bootstrap = "mpi";
        cfg.mpi_comm = (int64_t)1 << 40; /* not an MPI_Fint */
    }
    st = ccq_runtime_create(&cfg, &rt);
    printf("%s: %s\n", ccq_status_name(st), st == CCQ_OK ? "" : ccq_last_error_detail());
    if (rt != NULL)
        ccq_runtime_destroy(rt);
    return 0;
}
