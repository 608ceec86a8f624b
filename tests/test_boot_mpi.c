/* The "mpi" bootstrap under mpiexec with 3 processes. Modes:
 *   ccq       ccq initialises MPI; world and subset exchanges in flight together, a late
 *             poster, a member that never posts (timeout naming it), a second bootstrap in
 *             the same process (MPI stays up), a world_rank that disagrees with MPI's.
 *   embedder  the test initialises MPI (MULTIPLE) and hands ccq a communicator whose ranks
 *             are the reverse of MPI_COMM_WORLD's; ccq's messages never reach it. Then a
 *             process that opens its bootstrap late: the others time out, then complete.
 *   funneled  (1 process) MPI initialised at MPI_THREAD_FUNNELED is refused with a detail.
 * A failed check aborts the job (MPI_Abort), so mpiexec exits non-zero. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/boot/bootstrap.h"

static uint32_t me = UINT32_MAX;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            int init_ = 0;                                                                         \
            fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", (int)me, __FILE__, __LINE__,     \
                    #cond);                                                                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            fflush(stderr);                                                                        \
            MPI_Initialized(&init_);                                                               \
            if (init_)                                                                             \
                MPI_Abort(MPI_COMM_WORLD, 1);                                                      \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

static uint64_t deadline_ms(uint64_t ms)
{
    return ccq_boot_now_ns() + ms * 1000000ull;
}

static uint64_t value_of(uint32_t r, uint64_t salt)
{
    return 0x1000ull * salt + 17ull * r + 1;
}

static void world_exchange(ccq_boot *b, uint32_t size, const char *tag)
{
    uint32_t members[8];
    uint64_t mine = value_of(ccq_boot_world_rank(b), 7), out[8];
    ccq_errbuf err = {{0}};
    ccq_status st;

    for (uint32_t i = 0; i < size; i++)
        members[i] = i;
    st =
        ccq_boot_exchange(b, tag, members, size, &mine, sizeof mine, out, deadline_ms(20000), &err);
    CHECK(st == CCQ_OK, "%s: %s: %s", tag, ccq_status_name(st), err.msg);
    for (uint32_t i = 0; i < size; i++)
        CHECK(out[i] == value_of(i, 7), "%s: out[%u] = %llu", tag, i, (unsigned long long)out[i]);
}

static const struct {
    const char *tag;
    uint32_t n, members[3];
} subsets[] = {
    {"comm/0,1", 2, {0, 1}}, {"comm/1,2", 2, {1, 2}},      {"comm/0,2", 2, {0, 2}},
    {"comm/2", 1, {2}},      {"comm/0,1,2", 3, {0, 1, 2}},
};
#define NSUB (sizeof subsets / sizeof subsets[0])

static void subset_exchanges(ccq_boot *b)
{
    uint32_t rank = ccq_boot_world_rank(b);
    ccq_boot_xchg *x[NSUB] = {0};
    uint64_t mine[NSUB], out[NSUB][3];
    ccq_errbuf err = {{0}};
    size_t left = 0;
    uint64_t end = deadline_ms(20000);
    ccq_status st;

    for (size_t k = 0; k < NSUB; k++) {
        size_t s = rank == 1 ? NSUB - 1 - k : (k + rank) % NSUB;
        bool member = false;
        for (uint32_t i = 0; i < subsets[s].n; i++)
            member |= subsets[s].members[i] == rank;
        if (!member)
            continue;
        mine[s] = value_of(rank, s);
        st = ccq_boot_xchg_post(b, subsets[s].tag, subsets[s].members, subsets[s].n, &mine[s], 8,
                                &x[s], &err);
        CHECK(st == CCQ_OK, "post %s: %s", subsets[s].tag, err.msg);
        left++;
    }
    while (left > 0) {
        CHECK(ccq_boot_now_ns() < end, "%zu exchanges left", left);
        for (size_t s = 0; s < NSUB; s++) {
            if (x[s] == NULL)
                continue;
            st = ccq_boot_xchg_test(x[s], out[s], &err);
            if (st == CCQ_IN_PROGRESS)
                continue;
            CHECK(st == CCQ_OK, "test %s: %s", subsets[s].tag, err.msg);
            for (uint32_t i = 0; i < subsets[s].n; i++)
                CHECK(out[s][i] == value_of(subsets[s].members[i], s), "%s out[%u]", subsets[s].tag,
                      i);
            ccq_boot_xchg_free(x[s]);
            x[s] = NULL;
            left--;
        }
        usleep(100);
    }
}

static void mode_ccq(void)
{
    uint32_t rank = 0, size = 1;
    const char *env_err = NULL;
    ccq_errbuf err = {{0}};
    ccq_boot *b, *bad;
    ccq_boot_xchg *x;
    uint32_t all[3] = {0, 1, 2}, miss[3];
    uint64_t v, out[3];
    int init = 1;
    ccq_status st;

    /* mpiexec's OMPI_COMM_WORLD_* give the world. */
    CHECK(ccq_boot_world_from_env(&rank, &size, &env_err) == CCQ_OK, "%s", env_err);
    me = rank;
    CHECK(size == 3, "size %u", size);
    MPI_Initialized(&init);
    CHECK(!init, "MPI initialised before ccq");

    st = ccq_boot_open("mpi", NULL, -1, rank, size, &b, &err);
    CHECK(st == CCQ_OK, "open: %s", err.msg);
    MPI_Initialized(&init);
    CHECK(init, "ccq did not initialise MPI");
    world_exchange(b, size, "world");
    subset_exchanges(b);

    /* A late poster: the others' records wait in its mailbox. */
    if (rank == 2)
        usleep(200000);
    world_exchange(b, size, "late");

    /* Rank 2 never posts "absent": 0 and 1 time out naming it. */
    if (rank < 2) {
        v = rank;
        CHECK(ccq_boot_xchg_post(b, "absent", all, 3, &v, 8, &x, &err) == CCQ_OK, "%s", err.msg);
        st = ccq_boot_xchg_wait(x, out, deadline_ms(300), &err);
        CHECK(st == CCQ_ERR_TIMEOUT, "absent: %s: %s", ccq_status_name(st), err.msg);
        CHECK(strstr(err.msg, "process 2 never arrived") != NULL, "%s", err.msg);
        CHECK(ccq_boot_xchg_missing(x, miss, 3) == 1 && miss[0] == 2, "missing");
        ccq_boot_xchg_free(x);
    }
    world_exchange(b, size, "after");
    ccq_boot_close(b);

    /* A world_rank MPI disagrees with. */
    st = ccq_boot_open("mpi", NULL, -1, (rank + 1) % size, size, &bad, &err);
    CHECK(st == CCQ_ERR_INVALID_ARGUMENT && strstr(err.msg, "must be the same"), "%s: %s",
          ccq_status_name(st), err.msg);

    /* A second bootstrap: MPI is still up (ccq finalizes it only at exit). */
    st = ccq_boot_open("mpi", NULL, -1, rank, size, &b, &err);
    CHECK(st == CCQ_OK, "reopen: %s", err.msg);
    /* Its own duplicate communicator keeps it apart from the first: no generation. */
    CHECK(ccq_boot_generation(b) == 0, "generation %u", ccq_boot_generation(b));
    world_exchange(b, size, "world");
    ccq_boot_close(b);
}

static void mode_embedder(void)
{
    int provided = 0, wrank = 0, wsize = 0, flag = 1;
    MPI_Comm rev;
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    ccq_status st;

    MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    /* Ranks in reverse: world rank r is rank size-1-r in the embedder's communicator. */
    MPI_Comm_split(MPI_COMM_WORLD, 0, wsize - 1 - wrank, &rev);
    me = (uint32_t)(wsize - 1 - wrank);
    st = ccq_boot_open("mpi", NULL, MPI_Comm_c2f(rev), me, (uint32_t)wsize, &b, &err);
    CHECK(st == CCQ_OK, "open: %s", err.msg);
    world_exchange(b, (uint32_t)wsize, "world");
    subset_exchanges(b);
    ccq_boot_close(b);
    /* ccq talked on its own duplicate: nothing of it is pending on ours. */
    MPI_Barrier(rev);
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, rev, &flag, MPI_STATUS_IGNORE);
    CHECK(!flag, "a message reached the embedder's communicator");
    MPI_Comm_free(&rev);

    /* Process 2 opens its bootstrap late: until then the duplication of MPI_COMM_WORLD cannot
     * complete, the others' wait times out saying so (naming 2 among the missing), and a
     * second wait on the same exchange succeeds once 2 arrives. */
    me = (uint32_t)wrank;
    if (wrank == 2)
        usleep(600000);
    st = ccq_boot_open("mpi", NULL, -1, me, (uint32_t)wsize, &b, &err);
    CHECK(st == CCQ_OK, "open: %s", err.msg);
    {
        uint32_t all[3] = {0, 1, 2}, miss[3];
        uint64_t v = value_of(me, 3), out[3];
        ccq_boot_xchg *x;
        size_t nmiss;

        CHECK(ccq_boot_xchg_post(b, "world", all, 3, &v, 8, &x, &err) == CCQ_OK, "%s", err.msg);
        if (wrank < 2) {
            st = ccq_boot_xchg_wait(x, out, deadline_ms(300), &err);
            CHECK(st == CCQ_ERR_TIMEOUT, "%s: %s", ccq_status_name(st), err.msg);
            CHECK(strstr(err.msg, "MPI_Comm_idup over the 3 processes") != NULL, "%s", err.msg);
            nmiss = ccq_boot_xchg_missing(x, miss, 3);
            CHECK(nmiss >= 1 && miss[nmiss - 1] == 2, "missing %zu", nmiss);
        }
        st = ccq_boot_xchg_wait(x, out, deadline_ms(20000), &err);
        CHECK(st == CCQ_OK, "late: %s: %s", ccq_status_name(st), err.msg);
        for (uint32_t i = 0; i < 3; i++)
            CHECK(out[i] == value_of(i, 3), "late out[%u]", i);
        ccq_boot_xchg_free(x);
    }
    ccq_boot_close(b);
    /* ccq did not initialise MPI, so it must not have finalized it. */
    MPI_Finalized(&flag);
    CHECK(!flag, "ccq finalized the embedder's MPI");
    MPI_Finalize();
}

static void mode_funneled(void)
{
    int provided = 0;
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    ccq_status st;

    MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    me = 0;
    st = ccq_boot_open("mpi", NULL, -1, 0, 1, &b, &err);
    if (provided < MPI_THREAD_SERIALIZED) {
        CHECK(st == CCQ_ERR_UNSUPPORTED, "%s: %s", ccq_status_name(st), err.msg);
        CHECK(strstr(err.msg, "MPI_THREAD_SERIALIZED") != NULL, "%s", err.msg);
        CHECK(b == NULL, "handle on error");
    } else {
        CHECK(st == CCQ_OK, "%s", err.msg); /* an MPI that gives more than asked */
        ccq_boot_close(b);
    }
    MPI_Finalize();
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "ccq") == 0)
        mode_ccq();
    else if (argc == 2 && strcmp(argv[1], "embedder") == 0)
        mode_embedder();
    else if (argc == 2 && strcmp(argv[1], "funneled") == 0)
        mode_funneled();
    else {
        fprintf(stderr, "usage: %s ccq|embedder|funneled\n", argv[0]);
        return 2;
    }
    printf("rank %u: ok\n", me);
    return 0;
}
