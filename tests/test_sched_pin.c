/* Each scheduler on a core of its own while its host's processes outnumber their cores
 * (common/cores.h, ccq_core_pin), end to end: every process confines itself to the same two
 * CPUs, so that 3 or more of them are crowded on any machine, and then looks at its own threads
 * (/proc/self/task/N/status, Cpus_allowed_list):
 *   - once the world formed, exactly one thread (the scheduler) runs on one CPU alone, the one
 *     its world rank takes in turn (all processes share the same cores: ccq_world_home_core):
 *     the first of the two for even ranks, the second for odd;
 *   - while an all_reduce of CCQ_SCHED_PIN_BYTES or more is in flight (process 0 submits it,
 *     the others 400 ms later), no thread is pinned, nor after it; the next small operation
 *     pins the scheduler again;
 *   - "off" (CCQ_SCHED_PIN=0, or a scheduler that calls MPI: the MPI engine or bootstrap, even
 *     with CCQ_SCHED_PIN=2): no thread is ever pinned (built with CCQ_TEST_INIT_MPI, the program
 *     initialises MPI itself, so the MPI engine runs under another bootstrap: the engine alone
 *     says it calls MPI);
 *   - "two" (a file bootstrap): two runtimes per process, their schedulers pinned to the two
 *     CPUs apart in every process;
 *   - "bound" (4 processes): processes 0 and 1 confine themselves to the first CPU alone (as a
 *     launcher's binding would), 2 and 3 keep both: the host's view sees core sets, not first
 *     core and count, so 2 and 3 both pin their schedulers to the second CPU, where by the
 *     order of the processes that share both CPUs process 2 would take the first, the one
 *     processes 0 and 1 are bound to (ccq_world_home_core);
 *   - results exact throughout.
 * Run with tests/launch -n 3..4 and CCQ_BOOTSTRAP, or under mpiexec with CCQ_BOOTSTRAP=mpi
 * (tests/CMakeLists.txt). */
#define _GNU_SOURCE
#include <dirent.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef CCQ_TEST_INIT_MPI
#include <mpi.h>
#endif

#include "ccq.h"
#include "world_check.h"

#define BIG_FLOATS (256u * 1024u) /* 1 MiB: at least CCQ_SCHED_PIN_BYTES (the test sets 64 KiB) */

static uint32_t wrank;
static ccq_device_id world_devs[64]; /* the communicator: one device per process */
static size_t nworld;

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Threads of this process whose affinity is one CPU: how many, the last one's CPU, and in
 * cpus (NULL: not wanted) the set of their CPUs below 32 (bit c: CPU c). */
static int pinned_threads(int *cpu, unsigned *cpus)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;

    CHECK(d != NULL, "opendir /proc/self/task");
    while ((e = readdir(d)) != NULL) {
        char path[300], line[512];
        FILE *f;
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        if ((f = fopen(path, "r")) == NULL)
            continue; /* the thread ended meanwhile */
        while (fgets(line, sizeof line, f) != NULL) {
            char *v;
            if (strncmp(line, "Cpus_allowed_list:", 18) != 0)
                continue;
            v = line + 18;
            v += strspn(v, " \t");
            if (strpbrk(v, ",-") == NULL) {
                n++;
                *cpu = atoi(v);
                if (cpus != NULL && *cpu >= 0 && *cpu < 32)
                    *cpus |= 1u << *cpu;
            }
        }
        fclose(f);
    }
    closedir(d);
    return n;
}

/* Wait up to 2 s for want pinned threads (the scheduler pins again just after the batch ended,
 * a moment after the fence returned). */
static int await_pinned(int want, int *cpu)
{
    int n = -1;
    for (int k = 0; k < 200 && (n = pinned_threads(cpu, NULL)) != want; k++)
        sleep_ms(10);
    return n;
}

static void all_reduce(ccq_runtime *rt, ccq_device_id dev, float *buf, size_t count)
{
    for (size_t i = 0; i < count; i++)
        buf[i] = (float)(wrank + 1);
    CHECK(ccq_all_reduce(rt, dev, 0, buf, buf, count, CCQ_FLOAT32, CCQ_SUM, world_devs, nworld) ==
              CCQ_OK,
          "all_reduce of %zu floats", count);
}

static void expect_sum(ccq_runtime *rt, ccq_device_id dev, const float *buf, size_t count,
                       uint32_t wsize)
{
    float want = (float)(wsize * (wsize + 1) / 2);
    CHECK(ccq_sync_collective(rt, dev, 0) == CCQ_OK, "fence");
    for (size_t i = 0; i < count; i++)
        CHECK(buf[i] == want, "element %zu: %g, expected %g", i, buf[i], want);
}

/* "two" (CCQ_BOOTSTRAP=file:DIR): two runtimes in each process, the second's world meeting in
 * DIR/second; both crowded, so both schedulers pin, on the two CPUs apart in every process (the
 * slot of the process, then the index each claims in it: common/cores.h). */
static void two_runtimes(ccq_config cfg, ccq_runtime *rt, ccq_device_id dev, int a, int b)
{
    static char second[4200];
    ccq_runtime *rt2 = NULL;
    ccq_device_id dev2 = 0;
    uint32_t cnt = 0;
    unsigned cpus = 0;
    int cpu = -1, n = -1;
    float small[8];

    CHECK(strncmp(cfg.bootstrap, "file:", 5) == 0 && strlen(cfg.bootstrap) < 4000,
          "\"two\" wants CCQ_BOOTSTRAP=file:DIR, not %s", cfg.bootstrap);
    snprintf(second, sizeof second, "%s/second", cfg.bootstrap);
    cfg.bootstrap = second;
    CHECK(ccq_runtime_create(&cfg, &rt2) == CCQ_OK, "the second ccq_runtime_create");
    CHECK(ccq_local_devices(rt2, &dev2, &cnt) == CCQ_OK && cnt == 1, "local devices");
    CHECK(ccq_comm_init(rt2, world_devs, nworld) == CCQ_OK, "the second ccq_comm_init");
    for (int round = 0; round < 2; round++) {
        all_reduce(rt, dev, small, 8);
        expect_sum(rt, dev, small, 8, cfg.world_size);
        all_reduce(rt2, dev2, small, 8);
        expect_sum(rt2, dev2, small, 8, cfg.world_size);
    }
    if (b >= 0 && a < 32 && b < 32) {
        for (int k = 0; k < 200; k++, sleep_ms(10)) {
            cpus = 0;
            if ((n = pinned_threads(&cpu, &cpus)) == 2 && cpus == (1u << a | 1u << b))
                break;
        }
        CHECK(n == 2 && cpus == (1u << a | 1u << b),
              "%d threads pinned on CPUs 0x%x, expected the two schedulers on CPUs %d and %d", n,
              cpus, a, b);
    }
    CHECK(ccq_runtime_destroy(rt2) == CCQ_OK, "destroy the second");
    n = await_pinned(1, &cpu);
    CHECK(b < 0 || n == 1, "%d threads pinned once the second runtime ended", n);
}

int main(int argc, char **argv)
{
    bool off = argc > 1 && strcmp(argv[1], "off") == 0;
    bool two_rts = argc > 1 && strcmp(argv[1], "two") == 0;
    bool bound = argc > 1 && strcmp(argv[1], "bound") == 0;
    cpu_set_t all, two;
    int a = -1, b = -1, cpu = -1, n, want;
    bool check; /* this process's scheduler has a core to pin to: look */
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_device_id dev = 0;
    uint32_t cnt = 0, wsize;
    float *small = calloc(8, sizeof *small), *big = calloc(BIG_FLOATS, sizeof *big);

#ifdef CCQ_TEST_INIT_MPI /* MPI this program's own, the world met over CCQ_BOOTSTRAP */
    int provided = 0;
    CHECK(MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) == MPI_SUCCESS &&
              provided >= MPI_THREAD_SERIALIZED,
          "MPI_Init_thread");
#endif
    ccq_config_init(&cfg);
    wrank = cfg.world_rank;
    wsize = cfg.world_size;
    CHECK(wsize >= 3 && wsize <= 64 && cfg.bootstrap != NULL && small != NULL && big != NULL,
          "run me with tests/launch -n 3..8 and CCQ_BOOTSTRAP (world_size %u)", wsize);
    CHECK(sched_getaffinity(0, sizeof all, &all) == 0, "sched_getaffinity");
    for (int c = 0; c < CPU_SETSIZE && b < 0; c++)
        if (CPU_ISSET(c, &all))
            *(a < 0 ? &a : &b) = c;
    if (b >= 0) { /* the same two CPUs for every process: crowded from 3 processes */
        CPU_ZERO(&two);
        CPU_SET(a, &two);
        CPU_SET(b, &two);
        if (bound && wrank < 2)
            CPU_CLR(b, &two);
        CHECK(sched_setaffinity(0, sizeof two, &two) == 0, "confine to CPUs %d and %d", a, b);
    }
    CHECK(!bound || wsize == 4, "\"bound\" wants 4 processes, not %u", wsize);
    check = b >= 0 && !(bound && wrank < 2); /* (one CPU: nothing to pin to) */
    want = bound || wrank % 2 ? b : a;
    cfg.host_devices = 1;
    if (cfg.host_engine == NULL) /* CCQ_HOST_ENGINE=mpi: never pinned (runtime.c) */
        cfg.host_engine = "ucx";
    cfg.timeout_ms = 20000;
    CHECK(ccq_runtime_create(&cfg, &rt) == CCQ_OK, "ccq_runtime_create");
    CHECK(ccq_local_devices(rt, &dev, &cnt) == CCQ_OK && cnt == 1, "local devices");
    nworld = wsize;
    for (uint32_t p = 0; p < wsize; p++)
        world_devs[p] = p;
    CHECK(ccq_comm_init(rt, world_devs, nworld) == CCQ_OK, "ccq_comm_init");

    if (two_rts) {
        two_runtimes(cfg, rt, dev, a, b);
        CHECK(ccq_runtime_destroy(rt) == CCQ_OK, "destroy");
        printf("process %u of %u: two runtimes %s\n", wrank, wsize,
               b < 0 ? "on one CPU: nothing to pin" : "pinned apart");
        free(small);
        free(big);
        return 0;
    }
    all_reduce(rt, dev, small, 8);
    expect_sum(rt, dev, small, 8, wsize);
    if (off) {
        n = pinned_threads(&cpu, NULL);
        CHECK(n == 0 || b < 0, "%d threads pinned with CCQ_SCHED_PIN=0 or MPI in use", n);
    } else if (check) {
        n = await_pinned(1, &cpu);
        CHECK(n == 1 && cpu == want,
              "%d threads pinned (the last on CPU %d), expected the "
              "scheduler alone on CPU %d",
              n, cpu, want);
    }

    /* A large operation: process 0's waits 400 ms for the others, unpinned meanwhile. */
    if (wrank != 0)
        sleep_ms(400);
    all_reduce(rt, dev, big, BIG_FLOATS);
    if (wrank == 0 && check) {
        sleep_ms(150);
        n = pinned_threads(&cpu, NULL);
        CHECK(n == 0, "%d threads pinned (the last on CPU %d) while a 1 MiB all_reduce runs", n,
              cpu);
    }
    expect_sum(rt, dev, big, BIG_FLOATS, wsize);
    if (wrank == 0 && check) { /* a chain of large operations stays unpinned */
        n = pinned_threads(&cpu, NULL);
        CHECK(n == 0, "%d threads pinned (the last on CPU %d) after a 1 MiB all_reduce", n, cpu);
    }
    /* The next small operation pins again. */
    all_reduce(rt, dev, small, 8);
    expect_sum(rt, dev, small, 8, wsize);
    if (!off && check) {
        n = await_pinned(1, &cpu);
        CHECK(n == 1 && cpu == want,
              "%d threads pinned after the small all_reduce that followed the large one (the "
              "last on CPU %d)",
              n, cpu);
    }
    CHECK(ccq_runtime_destroy(rt) == CCQ_OK, "destroy");
    printf("process %u of %u: %s OK\n", wrank, wsize,
           !check ? "one CPU: nothing to pin"
           : off  ? "never pinned"
                  : "pinned, unpinned, pinned");
    free(small);
    free(big);
#ifdef CCQ_TEST_INIT_MPI
    MPI_Finalize();
#endif
    return 0;
}
