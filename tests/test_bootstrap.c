/* The bootstrap (runtime/boot/bootstrap.h) without MPI: the file mechanism with forked processes
 * (1, 2, 3, 4 of them; subsets exchanging concurrently; a process that never arrives;
 * mismatched world sizes and lengths; stale records; cleanup), the store mechanism with a
 * store in shared memory across forked processes and with stores that fail, and argument
 * checks; one process playing several ranks on threads. Forks happen before anything in
 * the process starts a thread (the threaded test runs last); a child reports through its
 * exit status and stderr. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/boot/boot_impl.h" /* ccq_boot_hdr, to forge a stale record */
#include "runtime/boot/bootstrap.h"
#include "child_check.h"

#define MAXP 8

/* ---- helpers -------------------------------------------------------------------------- */

static uint64_t deadline_ms(uint64_t ms)
{
    return ccq_boot_now_ns() + ms * 1000000ull;
}

typedef int (*child_fn)(uint32_t rank, uint32_t size, void *arg);

/* Fork n children running fn(rank, size, arg); returns how many failed. */
static int run_procs(uint32_t n, uint32_t size, child_fn fn, void *arg)
{
    pid_t pids[MAXP];
    int failed = 0;

    assert_true(n <= MAXP);
    fflush(NULL);
    for (uint32_t r = 0; r < n; r++) {
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0)
            _exit(fn(r, size, arg));
    }
    for (uint32_t r = 0; r < n; r++) {
        int ws = 0;
        assert_int_equal(waitpid(pids[r], &ws, 0), pids[r]);
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            fprintf(stderr, "rank %u failed (status 0x%x)\n", r, ws);
            failed++;
        }
    }
    return failed;
}

static char dir[256];
static char spec[300];

static int dir_setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ccq-boot-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(spec, sizeof spec, "file:%s", dir);
    setenv("CCQ_JOB_ID", "test", 1);
    return 0;
}

static size_t dir_count(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    size_t n = 0;

    assert_non_null(d);
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

/* Remove the files of directory p, then p (the bootstrap makes no subdirectories). */
static void remove_dir(const char *p)
{
    DIR *d = opendir(p);
    struct dirent *e;
    char path[600];

    if (d != NULL) {
        while ((e = readdir(d)) != NULL) {
            snprintf(path, sizeof path, "%s/%s", p, e->d_name);
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                unlink(path);
        }
        closedir(d);
    }
    rmdir(p);
}

static int dir_teardown(void **state)
{
    (void)state;
    remove_dir(dir);
    unsetenv("CCQ_JOB_ID");
    return 0;
}

/* What rank r contributes to exchange `salt`. */
static uint64_t value_of(uint32_t r, uint64_t salt)
{
    return 0x1000ull * salt + 17ull * r + 1;
}

static void write_file(const char *name, const void *data, size_t len)
{
    char path[600];
    int fd;

    snprintf(path, sizeof path, "%s/%s", dir, name);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    close(fd);
}

static size_t read_file(const char *name, void *data, size_t cap)
{
    char path[600];
    int fd;
    ssize_t k;

    snprintf(path, sizeof path, "%s/%s", dir, name);
    fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    k = read(fd, data, cap);
    close(fd);
    assert_true(k > 0);
    return (size_t)k;
}

/* ---- the file mechanism: worlds of 1, 2, 3 --------------------------------------------- */

static int world_child(uint32_t rank, uint32_t size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t members[MAXP];
    uint64_t mine = value_of(rank, 1), out[MAXP];
    ccq_status st;

    (void)arg;
    st = ccq_boot_open(spec, NULL, -1, rank, size, &b, &err);
    CHILD_CHECK(st == CCQ_OK, "open: %s: %s", ccq_status_name(st), err.msg);
    CHILD_CHECK(strcmp(ccq_boot_job(b), "test") == 0, "job %s", ccq_boot_job(b));
    for (uint32_t i = 0; i < size; i++)
        members[i] = i;
    st = ccq_boot_exchange(b, "world", members, size, &mine, sizeof mine, out, deadline_ms(10000),
                           &err);
    CHILD_CHECK(st == CCQ_OK, "world: %s: %s", ccq_status_name(st), err.msg);
    for (uint32_t i = 0; i < size; i++)
        CHILD_CHECK(out[i] == value_of(i, 1), "out[%u] = %llu", i, (unsigned long long)out[i]);
    ccq_boot_close(b);
    return 0;
}

static void test_file_worlds(void **state)
{
    (void)state;
    for (uint32_t n = 1; n <= 3; n++) {
        assert_int_equal(run_procs(n, n, world_child, NULL), 0);
        /* The last process to close removed every file of the job. */
        assert_int_equal(dir_count(), 0);
    }
}

/* ---- subsets exchanging at once, posted in different orders ------------------------------ */

/* Four processes: the world, two disjoint pairs, a pair across them and a triple, all
 * posted before any is tested (in an order that depends on the rank), then tested
 * round-robin: the exchanges of one process are in flight together. */
static const struct {
    const char *tag;
    uint32_t n, members[4];
} subsets[] = {
    {"world", 4, {0, 1, 2, 3}}, {"comm/0,1", 2, {0, 1}},      {"comm/2,3", 2, {2, 3}},
    {"comm/1,2", 2, {1, 2}},    {"comm/0,2,3", 3, {0, 2, 3}}, {"comm/3", 1, {3}},
};
#define NSUB (sizeof subsets / sizeof subsets[0])

static int subsets_child(uint32_t rank, uint32_t size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    ccq_boot_xchg *x[NSUB] = {0};
    uint64_t mine[NSUB], out[NSUB][4];
    bool done[NSUB] = {0};
    size_t left = 0;
    ccq_status st;
    uint64_t end = deadline_ms(10000);

    (void)arg;
    st = ccq_boot_open(spec, NULL, -1, rank, size, &b, &err);
    CHILD_CHECK(st == CCQ_OK, "open: %s", err.msg);
    for (size_t k = 0; k < NSUB; k++) {
        size_t s = (rank % 2) ? NSUB - 1 - k : (k + rank) % NSUB;
        bool member = false;
        for (uint32_t i = 0; i < subsets[s].n; i++)
            member |= subsets[s].members[i] == rank;
        if (!member)
            continue;
        mine[s] = value_of(rank, s);
        st = ccq_boot_xchg_post(b, subsets[s].tag, subsets[s].members, subsets[s].n, &mine[s],
                                sizeof mine[s], &x[s], &err);
        CHILD_CHECK(st == CCQ_OK, "post %s: %s", subsets[s].tag, err.msg);
        left++;
    }
    while (left > 0) {
        CHILD_CHECK(ccq_boot_now_ns() < end, "timed out with %zu exchanges left", left);
        for (size_t s = 0; s < NSUB; s++) {
            if (x[s] == NULL || done[s])
                continue;
            st = ccq_boot_xchg_test(x[s], out[s], &err);
            if (st == CCQ_IN_PROGRESS)
                continue;
            CHILD_CHECK(st == CCQ_OK, "test %s: %s", subsets[s].tag, err.msg);
            for (uint32_t i = 0; i < subsets[s].n; i++)
                CHILD_CHECK(out[s][i] == value_of(subsets[s].members[i], s), "%s: out[%u]",
                            subsets[s].tag, i);
            CHILD_CHECK(ccq_boot_xchg_missing(x[s], NULL, 0) == 0, "missing after OK");
            done[s] = true;
            left--;
        }
        usleep(200);
    }
    for (size_t s = 0; s < NSUB; s++)
        ccq_boot_xchg_free(x[s]);
    ccq_boot_close(b);
    return 0;
}

static void test_file_subsets(void **state)
{
    (void)state;
    assert_int_equal(run_procs(4, 4, subsets_child, NULL), 0);
    assert_int_equal(dir_count(), 0);
}

/* ---- a process that never arrives --------------------------------------------------------- */

static int absent_child(uint32_t rank, uint32_t size, void *arg)
{
    ccq_boot *b;
    ccq_boot_xchg *x;
    ccq_errbuf err = {{0}};
    uint32_t members[3] = {0, 1, 2}, miss[3];
    uint64_t mine = rank, out[3];
    ccq_status st;

    (void)arg;
    if (rank == 2)
        return 0; /* never opens the bootstrap */
    st = ccq_boot_open(spec, NULL, -1, rank, size, &b, &err);
    CHILD_CHECK(st == CCQ_OK, "open: %s", err.msg);
    st = ccq_boot_xchg_post(b, "world", members, 3, &mine, sizeof mine, &x, &err);
    CHILD_CHECK(st == CCQ_OK, "post: %s", err.msg);
    st = ccq_boot_xchg_wait(x, out, deadline_ms(300), &err);
    CHILD_CHECK(st == CCQ_ERR_TIMEOUT, "wait: %s (%s)", ccq_status_name(st), err.msg);
    CHILD_CHECK(strstr(err.msg, "process 2 never arrived") != NULL, "detail: %s", err.msg);
    CHILD_CHECK(strstr(err.msg, "'world'") != NULL, "detail: %s", err.msg);
    /* The peer arrived; only 2 is missing (both ranks' waits overlap by 300 ms). */
    CHILD_CHECK(ccq_boot_xchg_missing(x, miss, 3) == 1 && miss[0] == 2, "missing");
    /* A timeout is not sticky: the exchange is still pending, not failed. */
    CHILD_CHECK(ccq_boot_xchg_test(x, out, &err) == CCQ_IN_PROGRESS, "test after timeout");
    ccq_boot_xchg_free(x);
    ccq_boot_close(b);
    return 0;
}

static void test_file_absent_process(void **state)
{
    (void)state;
    assert_int_equal(run_procs(3, 3, absent_child, NULL), 0);
}

/* ---- disagreements ------------------------------------------------------------------------ */

/* Rank 0 believes in a world of 2, rank 1 in a world of 3. */
static int sizes_child(uint32_t rank, uint32_t size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t members[3] = {0, 1, 2}, n = rank == 0 ? 2 : 3;
    uint64_t mine = rank, out[3];
    ccq_status st;

    (void)arg;
    (void)size;
    st = ccq_boot_open(spec, NULL, -1, rank, n, &b, &err);
    CHILD_CHECK(st == CCQ_OK, "open: %s", err.msg);
    st = ccq_boot_exchange(b, "world", members, n, &mine, sizeof mine, out, deadline_ms(10000),
                           &err);
    CHILD_CHECK(st == CCQ_ERR_INVALID_ARGUMENT, "rank %u: %s (%s)", rank, ccq_status_name(st),
                err.msg);
    CHILD_CHECK(strstr(err.msg, rank == 0 ? "process 1 has world_size 3"
                                          : "process 0 has world_size 2") != NULL,
                "detail: %s", err.msg);
    ccq_boot_close(b);
    return 0;
}

static void test_file_world_size_mismatch(void **state)
{
    (void)state;
    assert_int_equal(run_procs(2, 0, sizes_child, NULL), 0);
}

/* Same tag, different lengths, then same tag with different member sets. */
static int lens_child(uint32_t rank, uint32_t size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[3] = {0, 1, 2};
    uint64_t mine[2] = {rank, rank}, out[6];
    ccq_status st;

    (void)arg;
    st = ccq_boot_open(spec, NULL, -1, rank, size, &b, &err);
    CHILD_CHECK(st == CCQ_OK, "open: %s", err.msg);
    if (rank < 2) {
        st = ccq_boot_exchange(b, "lens", all, 2, mine, rank == 0 ? 8 : 16, out, deadline_ms(10000),
                               &err);
        CHILD_CHECK(st == CCQ_ERR_MISMATCH, "lens: %s (%s)", ccq_status_name(st), err.msg);
        CHILD_CHECK(strstr(err.msg, rank == 0
                                        ? "process 1 contributes 16 bytes, this process 8"
                                        : "process 0 contributes 8 bytes, this process 16") != NULL,
                    "detail: %s", err.msg);
    }
    /* Rank 0 and 1 name {0,1}; rank 2 names {0,1,2}: 0 and 1 read each other fine (the
     * exchange completes for them), 2 sees their set differs. */
    if (rank < 2) {
        st = ccq_boot_exchange(b, "sets", all, 2, mine, 8, out, deadline_ms(10000), &err);
        CHILD_CHECK(st == CCQ_OK, "sets: %s (%s)", ccq_status_name(st), err.msg);
    } else {
        st = ccq_boot_exchange(b, "sets", all, 3, mine, 8, out, deadline_ms(10000), &err);
        CHILD_CHECK(st == CCQ_ERR_MISMATCH && strstr(err.msg, "another member set") != NULL,
                    "sets: %s (%s)", ccq_status_name(st), err.msg);
    }
    ccq_boot_close(b);
    return 0;
}

static void test_file_len_and_member_mismatch(void **state)
{
    (void)state;
    /* Rank 2 takes part only in "sets" (it is not a member of "lens"). */
    assert_int_equal(run_procs(3, 3, lens_child, NULL), 0);
}

/* ---- stale records, leftovers ---------------------------------------------------------- */

/* Two handles in this process play ranks 0 and 1 of a world of 2 (each its own boot). */
static void open_pair(ccq_boot **b0, ccq_boot **b1)
{
    ccq_errbuf err = {{0}};
    assert_int_equal(ccq_boot_open(spec, NULL, -1, 0, 2, b0, &err), CCQ_OK);
    assert_int_equal(ccq_boot_open(spec, NULL, -1, 1, 2, b1, &err), CCQ_OK);
}

static void pair_exchange(ccq_boot *b0, ccq_boot *b1, const char *tag)
{
    ccq_errbuf err = {{0}};
    uint32_t members[2] = {0, 1};
    uint64_t v0 = 5, v1 = 6, out[2] = {0, 0};
    ccq_boot_xchg *x0, *x1;

    assert_int_equal(ccq_boot_xchg_post(b0, tag, members, 2, &v0, 8, &x0, &err), CCQ_OK);
    assert_int_equal(ccq_boot_xchg_post(b1, tag, members, 2, &v1, 8, &x1, &err), CCQ_OK);
    assert_int_equal(ccq_boot_xchg_wait(x0, out, deadline_ms(5000), &err), CCQ_OK);
    assert_true(out[0] == 5 && out[1] == 6);
    memset(out, 0, sizeof out);
    assert_int_equal(ccq_boot_xchg_wait(x1, out, deadline_ms(5000), &err), CCQ_OK);
    assert_true(out[0] == 5 && out[1] == 6);
    ccq_boot_xchg_free(x0);
    ccq_boot_xchg_free(x1);
}

/* A record of rank 1 with another nonce than rank 1's earlier records is refused as stale;
 * leftovers of an earlier job are removed by each rank's first open. */
static void test_file_stale_record(void **state)
{
    ccq_boot *b0, *b1;
    ccq_boot_xchg *x0;
    ccq_errbuf err = {{0}};
    uint32_t members[2] = {0, 1};
    uint64_t v = 5, out[2];
    unsigned char rec[512], forged[512];
    ccq_boot_hdr h;
    char name[64], tag[CCQ_BOOT_TAG_MAX + 1];

    (void)state;
    setenv("CCQ_JOB_ID", "stale", 1);
    /* An earlier job's leftovers under rank 0 go at rank 0's first open; rank 1's stay
     * until rank 1 opens. */
    write_file("ccq.stale.0.junk.r0", "old", 3);
    write_file("ccq.stale.3.junk.r1", "old", 3);
    write_file("ccq.other.0.junk.r0", "old", 3); /* another job's: kept */
    assert_int_equal(ccq_boot_open(spec, NULL, -1, 0, 2, &b0, &err), CCQ_OK);
    assert_int_equal(ccq_boot_generation(b0), 0);
    assert_int_equal(dir_count(), 2);
    assert_int_equal(ccq_boot_open(spec, NULL, -1, 1, 2, &b1, &err), CCQ_OK);
    assert_int_equal(dir_count(), 1);

    pair_exchange(b0, b1, "world");
    /* Tags are escaped into file names ('/' and ','), and a long one is hashed. */
    pair_exchange(b0, b1, "comm/0,1");
    memset(tag, '/', CCQ_BOOT_TAG_MAX);
    tag[CCQ_BOOT_TAG_MAX] = '\0';
    pair_exchange(b0, b1, tag);

    /* Forge rank 1's record of "next" from its "world" one with another nonce: what a
     * crashed earlier job with the same id would have left. */
    read_file("ccq.stale.0.world.r1", rec, sizeof rec);
    memcpy(&h, rec, sizeof h);
    h.nonce ^= 0x5a5a;
    h.tag_len = 4;
    memcpy(forged, &h, sizeof h);
    memcpy(forged + sizeof h, "next", 4);
    memcpy(forged + sizeof h + 4, &v, 8);
    write_file("ccq.stale.0.next.r1", forged, sizeof h + 4 + 8);
    assert_int_equal(ccq_boot_xchg_post(b0, "next", members, 2, &v, 8, &x0, &err), CCQ_OK);
    assert_int_equal(ccq_boot_xchg_wait(x0, out, deadline_ms(5000), &err), CCQ_ERR_MISMATCH);
    assert_non_null(strstr(err.msg, "another incarnation"));
    assert_non_null(strstr(err.msg, "\"stale\""));
    ccq_boot_xchg_free(x0);
    /* The same tag twice on one handle is refused. */
    assert_int_equal(ccq_boot_xchg_post(b0, "world", members, 2, &v, 8, &x0, &err),
                     CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "already used"));
    assert_null(x0);
    ccq_boot_close(b0);
    assert_true(dir_count() > 1); /* rank 1 has not closed: nothing is removed yet */
    ccq_boot_close(b1);
    assert_int_equal(dir_count(), 1); /* the other job's file */

    /* A second runtime of the same ranks in this process is at generation 1: it meets its
     * peer's generation 1, never the first one's records. */
    open_pair(&b0, &b1);
    assert_int_equal(ccq_boot_generation(b0), 1);
    assert_int_equal(ccq_boot_generation(b1), 1);
    pair_exchange(b0, b1, "world");
    snprintf(name, sizeof name, "ccq.stale.1.world.r0");
    assert_int_equal(read_file(name, rec, sizeof rec), sizeof h + 5 + 8);
    ccq_boot_close(b0);
    ccq_boot_close(b1);
    assert_int_equal(dir_count(), 1);
}

/* ---- bad input ---------------------------------------------------------------------------- */

static void test_bad_input(void **state)
{
    ccq_boot *b = (ccq_boot *)1;
    ccq_boot_xchg *x;
    ccq_errbuf err = {{0}};
    uint32_t unsorted[2] = {1, 0}, without[1] = {1}, out_of_world[2] = {0, 2};
    uint64_t v = 0;
    char path[600];

    (void)state;
    /* Its own job id: a forked test's children would inherit this process's generations. */
    setenv("CCQ_JOB_ID", "bad", 1);
    assert_int_equal(ccq_boot_open(spec, NULL, -1, 2, 2, &b, &err), CCQ_ERR_INVALID_ARGUMENT);
    assert_null(b);
    assert_non_null(strstr(err.msg, "world_rank 2 is not below world_size 2"));
    assert_int_equal(ccq_boot_open(spec, NULL, -1, 0, 0, &b, &err), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "world_size is 0"));
    assert_int_equal(ccq_boot_open("tcp:host:1", NULL, -1, 0, 2, &b, &err),
                     CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "\"tcp:host:1\""));
    /* A missing directory is created with its missing parents, mode 0700. */
    struct stat sb;
    snprintf(path, sizeof path, "file:%s/new/job", dir);
    assert_int_equal(ccq_boot_open(path, NULL, -1, 0, 2, &b, &err), CCQ_OK);
    ccq_boot_close(b);
    b = NULL;
    snprintf(path, sizeof path, "%s/new/job", dir);
    assert_int_equal(stat(path, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    assert_int_equal(sb.st_mode & 0777, 0700);
    remove_dir(path);
    snprintf(path, sizeof path, "%s/new", dir);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0700);
    remove_dir(path);
    /* No directory; a file that is not a directory; a path through such a file. */
    assert_int_equal(ccq_boot_open("file:", NULL, -1, 0, 2, &b, &err), CCQ_ERR_INVALID_ARGUMENT);
    write_file("plain", "x", 1);
    snprintf(path, sizeof path, "file:%s/plain", dir);
    assert_int_equal(ccq_boot_open(path, NULL, -1, 0, 2, &b, &err), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "not a directory"));
    snprintf(path, sizeof path, "file:%s/plain/sub", dir);
    assert_int_equal(ccq_boot_open(path, NULL, -1, 0, 2, &b, &err), CCQ_ERR_INVALID_ARGUMENT);
    assert_null(b);
    assert_non_null(strstr(err.msg, "/plain/sub"));
    assert_non_null(strstr(err.msg, "Not a directory"));
    /* No bootstrap and no store. */
    assert_int_equal(ccq_boot_open(NULL, NULL, -1, 0, 2, &b, &err), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "CCQ_BOOTSTRAP"));
#ifndef CCQ_HAVE_MPI
    assert_int_equal(ccq_boot_open("mpi", NULL, -1, 0, 2, &b, &err), CCQ_ERR_UNSUPPORTED);
#endif

    /* Exchanges: members unsorted, without this process, outside the world; a bad tag. */
    assert_int_equal(ccq_boot_open(spec, NULL, -1, 0, 2, &b, &err), CCQ_OK);
    assert_int_equal(ccq_boot_xchg_post(b, "t", unsorted, 2, &v, 8, &x, &err),
                     CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "sorted"));
    assert_int_equal(ccq_boot_xchg_post(b, "t", without, 1, &v, 8, &x, &err),
                     CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "not a member"));
    assert_int_equal(ccq_boot_xchg_post(b, "t", out_of_world, 2, &v, 8, &x, &err),
                     CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "member 2 is not below world_size 2"));
    assert_int_equal(ccq_boot_xchg_post(b, "", unsorted, 1, &v, 8, &x, &err),
                     CCQ_ERR_INVALID_ARGUMENT);
    assert_null(x);
    ccq_boot_close(b);
}

/* ---- ccq_boot_world_from_env ---------------------------------------------------------- */

static void clear_world_env(void)
{
    const char *vars[] = {"CCQ_WORLD_RANK",       "CCQ_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                          "OMPI_COMM_WORLD_SIZE", "PMI_RANK",       "PMI_SIZE",
                          "SLURM_PROCID",         "SLURM_NTASKS",   "RANK",
                          "WORLD_SIZE",           "MASTER_ADDR",    "MASTER_PORT"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
}

static void test_world_from_env(void **state)
{
    uint32_t rank = 0, size = 1;
    const char *err = NULL;

    (void)state;
    clear_world_env();
    assert_int_equal(ccq_boot_world_from_env(&rank, &size, &err), CCQ_OK);
    assert_true(rank == 0 && size == 1 && err == NULL);
    assert_null(ccq_boot_spec_from_env());
    /* Precedence, lowest first: torchrun's, Slurm's, PMI's, Open MPI's, ccq's own. */
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "8", 1);
    assert_int_equal(ccq_boot_world_from_env(&rank, &size, &err), CCQ_OK);
    assert_true(rank == 3 && size == 8);
    setenv("MASTER_ADDR", "10.1.2.3", 1);
    assert_null(ccq_boot_spec_from_env()); /* both or nothing */
    setenv("MASTER_PORT", "29500", 1);
    assert_string_equal(ccq_boot_spec_from_env(), "tcp://10.1.2.3:29500");
    /* The same string for the same values (it is interned), another for others. */
    assert_ptr_equal(ccq_boot_spec_from_env(), ccq_boot_spec_from_env());
    setenv("MASTER_ADDR", "fe80::1", 1);
    assert_string_equal(ccq_boot_spec_from_env(), "tcp://[fe80::1]:29500");
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_NTASKS", "6", 1);
    assert_int_equal(ccq_boot_world_from_env(&rank, &size, &err), CCQ_OK);
    assert_true(rank == 5 && size == 6);
    /* A child of torchrun started by srun: torchrun's variables are its own. */
    setenv("TORCHELASTIC_RUN_ID", "job7", 1);
    assert_int_equal(ccq_boot_world_from_env(&rank, &size, &err), CCQ_OK);
    assert_true(rank == 3 && size == 8);
    unsetenv("TORCHELASTIC_RUN_ID");
    setenv("SLURM_PROCID", "6", 1);
    assert_int_equal(ccq_boot_world_from_env(&rank, &size, &err), CCQ_ERR_INVALID_ARGUMENT);
    assert_string_equal(err, "SLURM_PROCID: must be below SLURM_NTASKS");
    err = NULL;
    unsetenv("SLURM_PROCID");
    unsetenv("SLURM_NTASKS");
    setenv("WORLD_SIZE", "x", 1);
    assert_int_equal(ccq_boot_world_from_env(&rank, &size, &err), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "WORLD_SIZE (torchrun's)"));
    err = NULL;
    clear_world_env();
    setenv("PMI_RANK", "1", 1);
    setenv("PMI_SIZE", "4", 1);
    assert_int_equal(ccq_boot_world_from_env(&rank, &size, &err), CCQ_OK);
    assert_true(rank == 1 && size == 4);
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    assert_int_equal(ccq_boot_world_from_env(&rank, &size, &err), CCQ_OK);
    assert_true(rank == 2 && size == 3);
    setenv("CCQ_WORLD_RANK", "0", 1);
    setenv("CCQ_WORLD_SIZE", "2", 1);
    assert_int_equal(ccq_boot_world_from_env(&rank, &size, &err), CCQ_OK);
    assert_true(rank == 0 && size == 2);
    setenv("CCQ_WORLD_RANK", "2", 1);
    assert_int_equal(ccq_boot_world_from_env(&rank, &size, &err), CCQ_ERR_INVALID_ARGUMENT);
    assert_string_equal(err, "CCQ_WORLD_RANK: must be below CCQ_WORLD_SIZE");
    err = NULL;
    setenv("CCQ_WORLD_RANK", "x1", 1);
    assert_int_equal(ccq_boot_world_from_env(&rank, &size, &err), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "CCQ_WORLD_RANK: expected"));
    err = NULL;
    unsetenv("CCQ_WORLD_RANK");
    /* Half a family is refused, not completed from another one. */
    assert_int_equal(ccq_boot_world_from_env(&rank, &size, &err), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "set both or neither"));
    err = NULL;
    setenv("CCQ_WORLD_RANK", "0", 1);
    setenv("CCQ_WORLD_SIZE", "0", 1);
    assert_int_equal(ccq_boot_world_from_env(&rank, &size, &err), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "CCQ_WORLD_SIZE"));
    clear_world_env();
}

/* ---- the store mechanism ------------------------------------------------------------------ */

/* An in-memory store in shared memory, seen by forked processes. */
#define SLOTS 64
typedef struct shm_store {
    pthread_mutex_t lock; /* process-shared */
    uint32_t n;
    uint32_t sets, gets;
    struct {
        char key[300];
        size_t len;
        unsigned char val[600];
    } slot[SLOTS];
} shm_store;

static ccq_status shm_set(void *ctx, const char *key, const void *value, size_t len)
{
    shm_store *s = ctx;
    ccq_status st = CCQ_OK;

    pthread_mutex_lock(&s->lock);
    s->sets++;
    if (s->n == SLOTS || len > sizeof s->slot[0].val || strlen(key) >= sizeof s->slot[0].key) {
        st = CCQ_ERR_NO_MEMORY;
    } else {
        snprintf(s->slot[s->n].key, sizeof s->slot[0].key, "%s", key);
        memcpy(s->slot[s->n].val, value, len);
        s->slot[s->n].len = len;
        s->n++;
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

static ccq_status shm_get(void *ctx, const char *key, void *value, size_t *len)
{
    shm_store *s = ctx;
    ccq_status st = CCQ_IN_PROGRESS;

    pthread_mutex_lock(&s->lock);
    s->gets++;
    for (uint32_t i = 0; i < s->n; i++) {
        if (strcmp(s->slot[i].key, key) != 0)
            continue;
        memcpy(value, s->slot[i].val, s->slot[i].len < *len ? s->slot[i].len : *len);
        *len = s->slot[i].len;
        st = CCQ_OK;
        break;
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

static shm_store *shm_store_new(void)
{
    pthread_mutexattr_t a;
    shm_store *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    assert_true(s != MAP_FAILED);
    memset(s, 0, sizeof *s);
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&s->lock, &a);
    pthread_mutexattr_destroy(&a);
    return s;
}

static int store_child(uint32_t rank, uint32_t size, void *arg)
{
    ccq_store store = {arg, shm_set, shm_get};
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t members[3] = {0, 1, 2}, pair[2] = {1, 2};
    uint64_t mine = value_of(rank, 1), out[3];
    ccq_status st;

    st = ccq_boot_open(NULL, &store, -1, rank, size, &b, &err);
    CHILD_CHECK(st == CCQ_OK, "open: %s", err.msg);
    CHILD_CHECK(strcmp(ccq_boot_name(b), "store") == 0, "name");
    st = ccq_boot_exchange(b, "world", members, size, &mine, sizeof mine, out, deadline_ms(10000),
                           &err);
    CHILD_CHECK(st == CCQ_OK, "world: %s: %s", ccq_status_name(st), err.msg);
    for (uint32_t i = 0; i < size; i++)
        CHILD_CHECK(out[i] == value_of(i, 1), "out[%u]", i);
    if (rank >= 1) {
        mine = value_of(rank, 2);
        st = ccq_boot_exchange(b, "comm/1,2", pair, 2, &mine, sizeof mine, out, deadline_ms(10000),
                               &err);
        CHILD_CHECK(st == CCQ_OK && out[0] == value_of(1, 2) && out[1] == value_of(2, 2),
                    "pair: %s", err.msg);
    }
    ccq_boot_close(b);
    return 0;
}

static void test_store_processes(void **state)
{
    shm_store *s = shm_store_new();

    (void)state;
    assert_int_equal(run_procs(3, 3, store_child, s), 0);
    assert_int_equal(s->sets, 3 + 2);
    for (uint32_t i = 0; i < s->n; i++) {
        char key[64];
        uint32_t r = s->slot[i].key[strlen(s->slot[i].key) - 1] - '0';
        snprintf(key, sizeof key, "ccq/test/0/%s/%u",
                 strncmp(s->slot[i].key, "ccq/test/0/world/", 17) == 0 ? "world" : "comm/1,2", r);
        assert_string_equal(s->slot[i].key, key);
    }
    munmap(s, sizeof *s);
}

/* A long wait asks the store less and less often: process 1 arrives 2 s after process 0,
 * whose exchange asked for its record about 2000 times (one get a millisecond); now each round
 * waits a sixteenth of the wait so far (poll_gap in runtime/boot/bootstrap.c): about 100. */
static int late_child(uint32_t rank, uint32_t size, void *arg)
{
    ccq_store store = {arg, shm_set, shm_get};
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t members[2] = {0, 1};
    uint64_t mine = value_of(rank, 1), out[2];
    ccq_status st;

    if (rank == 1)
        usleep(2000000);
    st = ccq_boot_open(NULL, &store, -1, rank, size, &b, &err);
    CHILD_CHECK(st == CCQ_OK, "open: %s", err.msg);
    st = ccq_boot_exchange(b, "world", members, size, &mine, sizeof mine, out, deadline_ms(20000),
                           &err);
    CHILD_CHECK(st == CCQ_OK && out[0] == value_of(0, 1) && out[1] == value_of(1, 1), "world: %s",
                err.msg);
    ccq_boot_close(b);
    return 0;
}

static void test_store_long_wait(void **state)
{
    shm_store *s = shm_store_new();
    uint64_t t0 = ccq_boot_now_ns(), took_ms;

    (void)state;
    assert_int_equal(run_procs(2, 2, late_child, s), 0);
    took_ms = (ccq_boot_now_ns() - t0) / 1000000u;
    fprintf(stderr, "gets: %u over %llu ms\n", s->gets, (unsigned long long)took_ms);
    /* Fewer under load, never more; and the last arrival is seen within a sixteenth. */
    assert_true(s->gets < 400);
    assert_true(took_ms < 2000 + 2000 / 16 + 1000);
    munmap(s, sizeof *s);
}

/* One process playing 3 ranks on threads, each with its own handle on one store, and two
 * threads sharing rank 0's handle (its calls are serialised by the handle's lock). */
typedef struct rank_thread {
    shm_store *store;
    uint32_t rank;
    ccq_boot *boot; /* rank 0's, shared with the helper */
    const char *tag;
    int rc;
} rank_thread;

static int pair_on(ccq_boot *b, const char *tag)
{
    uint32_t pair[2] = {0, 1};
    uint64_t mine = value_of(ccq_boot_world_rank(b), tag[0]), out[2];
    ccq_errbuf err = {{0}};
    ccq_status st = ccq_boot_exchange(b, tag, pair, 2, &mine, 8, out, deadline_ms(10000), &err);

    CHILD_CHECK(st == CCQ_OK, "%s: %s", tag, err.msg);
    CHILD_CHECK(out[0] == value_of(0, tag[0]) && out[1] == value_of(1, tag[0]), "%s", tag);
    return 0;
}

static void *helper_main(void *arg)
{
    rank_thread *t = arg;
    t->rc = pair_on(t->boot, t->tag);
    return NULL;
}

static int rank_thread_body(rank_thread *t)
{
    ccq_store store = {t->store, shm_set, shm_get};
    ccq_errbuf err = {{0}};
    uint32_t all[3] = {0, 1, 2};
    uint64_t mine = value_of(t->rank, 1), out[3];
    ccq_boot *b;
    ccq_status st = ccq_boot_open(NULL, &store, -1, t->rank, 3, &b, &err);

    CHILD_CHECK(st == CCQ_OK, "open: %s", err.msg);
    st = ccq_boot_exchange(b, "world", all, 3, &mine, 8, out, deadline_ms(10000), &err);
    CHILD_CHECK(st == CCQ_OK, "world: %s", err.msg);
    for (uint32_t i = 0; i < 3; i++)
        CHILD_CHECK(out[i] == value_of(i, 1), "world out[%u]", i);
    if (t->rank == 0) {
        pthread_t h;
        rank_thread helper = {t->store, 0, b, "b-pair", 1};
        CHILD_CHECK(pthread_create(&h, NULL, helper_main, &helper) == 0, "helper");
        int rc = pair_on(b, "a-pair");
        pthread_join(h, NULL);
        CHILD_CHECK(rc == 0 && helper.rc == 0, "pairs on a shared handle");
    } else if (t->rank == 1) {
        CHILD_CHECK(pair_on(b, "b-pair") == 0 && pair_on(b, "a-pair") == 0, "pairs");
    }
    ccq_boot_close(b);
    return 0;
}

static void *rank_thread_main(void *arg)
{
    rank_thread *t = arg;
    t->rc = rank_thread_body(t);
    return NULL;
}

static void test_store_threads(void **state)
{
    shm_store *s = shm_store_new();
    rank_thread t[3];
    pthread_t th[3];

    (void)state;
    setenv("CCQ_JOB_ID", "threads", 1);
    for (uint32_t r = 0; r < 3; r++) {
        t[r] = (rank_thread){s, r, NULL, NULL, 1};
        assert_int_equal(pthread_create(&th[r], NULL, rank_thread_main, &t[r]), 0);
    }
    for (uint32_t r = 0; r < 3; r++) {
        pthread_join(th[r], NULL);
        assert_int_equal(t[r].rc, 0);
    }
    /* Every rank was at generation 0 (the generation counts per rank, not per process). */
    for (uint32_t i = 0; i < s->n; i++)
        assert_int_equal(strncmp(s->slot[i].key, "ccq/threads/0/", 14), 0);
    assert_int_equal(s->sets, 3 + 2 + 2);
    munmap(s, sizeof *s);
}

/* Stores that fail: set, get, and a get that never finds the key. */
static int fail_mode;
static ccq_status bad_set(void *ctx, const char *key, const void *value, size_t len)
{
    if (fail_mode == 0)
        return CCQ_ERR_BACKEND;
    return shm_set(ctx, key, value, len);
}

static ccq_status bad_get(void *ctx, const char *key, void *value, size_t *len)
{
    (void)ctx;
    (void)key;
    (void)value;
    (void)len;
    return fail_mode == 1 ? CCQ_ERR_NO_MEMORY : CCQ_IN_PROGRESS;
}

static void test_store_errors(void **state)
{
    shm_store *s = shm_store_new();
    ccq_store store = {s, bad_set, bad_get};
    ccq_store half = {s, shm_set, NULL};
    ccq_boot *b;
    ccq_boot_xchg *x;
    ccq_errbuf err = {{0}};
    uint32_t members[2] = {0, 1}, miss[2];
    uint64_t v = 1, out[2];

    (void)state;
    setenv("CCQ_JOB_ID", "errors", 1);
    assert_int_equal(ccq_boot_open(NULL, &half, -1, 0, 2, &b, &err), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "get callback is NULL"));

    /* set fails: the post fails, naming the key. */
    fail_mode = 0;
    assert_int_equal(ccq_boot_open("store", &store, -1, 0, 2, &b, &err), CCQ_OK);
    assert_int_equal(ccq_boot_xchg_post(b, "world", members, 2, &v, 8, &x, &err), CCQ_ERR_BACKEND);
    assert_null(x);
    assert_non_null(strstr(err.msg, "set of key \"ccq/errors/0/world/0\" failed: CCQ_ERR_BACKEND"));
    ccq_boot_close(b);

    /* get fails: the exchange fails with the store's status, naming the key, and stays
     * failed. */
    fail_mode = 1;
    assert_int_equal(ccq_boot_open("store", &store, -1, 0, 2, &b, &err), CCQ_OK);
    assert_int_equal(ccq_boot_xchg_post(b, "world", members, 2, &v, 8, &x, &err), CCQ_OK);
    assert_int_equal(ccq_boot_xchg_test(x, out, &err), CCQ_ERR_NO_MEMORY);
    assert_non_null(strstr(err.msg, "get of key \"ccq/errors/1/world/1\" failed"));
    assert_non_null(strstr(err.msg, "exchange 'world'"));
    memset(&err, 0, sizeof err);
    assert_int_equal(ccq_boot_xchg_wait(x, out, 0, &err), CCQ_ERR_NO_MEMORY);
    assert_non_null(strstr(err.msg, "ccq/errors/1/world/1"));
    ccq_boot_close(b);

    /* The key never appears: the wait times out naming process 1. */
    fail_mode = 2;
    assert_int_equal(ccq_boot_open("store", &store, -1, 0, 2, &b, &err), CCQ_OK);
    assert_int_equal(ccq_boot_xchg_post(b, "world", members, 2, &v, 8, &x, &err), CCQ_OK);
    assert_int_equal(ccq_boot_xchg_wait(x, out, deadline_ms(30), &err), CCQ_ERR_TIMEOUT);
    assert_non_null(strstr(err.msg, "process 1 never arrived"));
    assert_int_equal(ccq_boot_xchg_missing(x, miss, 2), 1);
    assert_int_equal(miss[0], 1);
    ccq_boot_xchg_free(x);
    ccq_boot_close(b);
    munmap(s, sizeof *s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_file_worlds, dir_setup, dir_teardown),
        cmocka_unit_test_setup_teardown(test_file_subsets, dir_setup, dir_teardown),
        cmocka_unit_test_setup_teardown(test_file_absent_process, dir_setup, dir_teardown),
        cmocka_unit_test_setup_teardown(test_file_world_size_mismatch, dir_setup, dir_teardown),
        cmocka_unit_test_setup_teardown(test_file_len_and_member_mismatch, dir_setup, dir_teardown),
        cmocka_unit_test_setup_teardown(test_file_stale_record, dir_setup, dir_teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, dir_setup, dir_teardown),
        cmocka_unit_test(test_world_from_env),
        cmocka_unit_test_setup_teardown(test_store_processes, dir_setup, dir_teardown),
        cmocka_unit_test_setup_teardown(test_store_errors, dir_setup, dir_teardown),
        cmocka_unit_test_setup_teardown(test_store_long_wait, dir_setup, dir_teardown),
        /* Last: it starts threads, and the tests above fork. */
        cmocka_unit_test_setup_teardown(test_store_threads, dir_setup, dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
