/* What an installed libccq says when a program asks for a module (tests/install/run.sh,
 * tests/package/check_deb.sh): "nccl" creates a runtime on the nccl backend, "mpi" one whose
 * bootstrap is "mpi" with an mpi_comm the MPI module itself refuses before it calls MPI (so
 * the answer shows the module was loaded, without starting MPI), "ucx" a world of two forked
 * processes (file bootstrap) on the host backend's ucx engine whose communicator spans both
 * (CCQ_OK: the module loaded and its engine ran an all_reduce). Prints the status and the
 * detail on one line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ccq.h>

/* Process `rank` of the world of two: create, span both, all_reduce; 0 prints the answer. */
static int ucx_rank(uint32_t rank, const char *dir)
{
    ccq_device_id all[2] = {0, 1};
    float x[4] = {1, 2, 3, 4}, y[4] = {0};
    char boot[300];
    ccq_runtime *rt = NULL;
    ccq_config cfg;
    ccq_status st;

    ccq_config_init(&cfg);
    snprintf(boot, sizeof boot, "file:%s", dir);
    cfg.bootstrap = boot;
    cfg.world_rank = rank;
    cfg.world_size = 2;
    cfg.host_devices = 1;
    cfg.host_engine = "ucx";
    cfg.timeout_ms = 20000;
    st = ccq_runtime_create(&cfg, &rt);
    if (st == CCQ_OK)
        st = ccq_comm_init(rt, all, 2);
    if (st == CCQ_OK)
        st = ccq_all_reduce(rt, rank, 0, x, y, 4, CCQ_FLOAT32, CCQ_SUM, all, 2);
    if (st == CCQ_OK)
        st = ccq_sync_collective(rt, rank, 0);
    if (st == CCQ_OK && y[3] != 8.0f) {
        printf("wrong result: %g, want 8\n", (double)y[3]);
        fflush(stdout);
        return 1;
    }
    if (rank == 0) {
        printf("%s: %s\n", ccq_status_name(st), st == CCQ_OK ? "" : ccq_last_error_detail());
        fflush(stdout);
    }
    if (rt != NULL)
        ccq_runtime_destroy(rt);
    return 0;
}

static int probe_ucx(void)
{
    char dir[] = "/tmp/ccq-probe-XXXXXX";
    int status = 0, rc;
    pid_t pid;

    if (mkdtemp(dir) == NULL)
        return 1;
    pid = fork();
    if (pid == 0)
        _exit(ucx_rank(1, dir));
    rc = ucx_rank(0, dir);
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0)
        rc = 1;
    { /* the bootstrap's files */
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0)
            rc = 1;
    }
    return rc;
}

int main(int argc, char **argv)
{
    ccq_runtime *rt = NULL;
    ccq_config cfg;
    ccq_status st;

    if (argc != 2 || (strcmp(argv[1], "nccl") != 0 && strcmp(argv[1], "mpi") != 0 &&
                      strcmp(argv[1], "ucx") != 0)) {
        fprintf(stderr, "usage: %s nccl|mpi|ucx\n", argv[0]);
        return 2;
    }
    if (strcmp(argv[1], "ucx") == 0)
        return probe_ucx();
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
