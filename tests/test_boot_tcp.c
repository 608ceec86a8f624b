/* The tcp:// bootstrap (runtime/boot/tcp.c) with forked processes on loopback: worlds of 1 to
 * 4 processes, subsets, a second runtime after the first (generations), rank 0 on every
 * interface ("*"); what it refuses: another job's process, another world size, a duplicate
 * rank, bad specs, a port in use; raw clients that send garbage, another protocol version,
 * an oversized frame, half a frame and then nothing, or nothing at all, while real processes
 * keep exchanging; peers' states (LOST when a process dies, LEFT when it closes, rank 0's
 * death seen by everyone); a stopped rank 0 (SIGSTOP): found by its silence, the rendezvous
 * taken over, and rank 0, continued, learns it was given up; many generations back to back at
 * random moments; a record the server refused fails the exchange where it was published; an
 * exchange one member finished and the other was not sent the last record of when process 0
 * was lost (a fake process 0 that holds that record back): the finished one offers it to the
 * successor. The server's logic alone (tcp_server.c, no sockets): records forgotten once
 * delivered, its memory bounded, its keepalives, finished exchanges offered to it (HAD).
 *
 * Forks happen before the parent starts any thread; children report by exit status. Ports
 * are free ones below the kernel's ephemeral range (free_port.h: one the kernel picks may be
 * taken as a connection's own port before process 0 listens on it). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/boot/boot_impl.h"
#include "runtime/boot/bootstrap.h"
#include "child_check.h"
#include "runtime/boot/tcp_proto.h"
#include "free_port.h"
#include "procs.h"

#define MAXP 8

static uint64_t deadline_ms(uint64_t ms)
{
    return ccq_boot_now_ns() + ms * 1000000ull;
}

static void sleep_ms(unsigned ms)
{
    struct timespec t = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* A port nobody uses right now, below the ephemeral range (free_port.h). */
static unsigned free_port(void)
{
    return (unsigned)ccq_test_free_port();
}

/* Fork n children (procs.h); how many did not exit 0 (killed after 60 s). */
static int run_procs(unsigned n, procs_fn fn, void *arg)
{
    int status[MAXP];
    return procs_run(n, fn, arg, 60, status);
}

static char spec[64];

static ccq_status open_tcp(uint32_t rank, uint32_t size, ccq_boot **b, ccq_errbuf *err)
{
    return ccq_boot_open(spec, NULL, -1, rank, size, b, err);
}

static uint64_t value_of(uint32_t rank, uint32_t round)
{
    return 0x1000000ull * round + 977ull * rank + 5;
}

/* ---- worlds ------------------------------------------------------------------------------- */

static int world_child(unsigned rank, unsigned size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[MAXP], sub[2] = {0, size - 1};
    uint64_t mine = value_of(rank, 1), out[MAXP];
    ccq_status st;
    int gens = arg != NULL ? *(int *)arg : 1;

    for (uint32_t p = 0; p < size; p++)
        all[p] = p;
    for (int g = 0; g < gens; g++) {
        st = open_tcp(rank, size, &b, &err);
        CHILD_CHECK(st == CCQ_OK, "open: %s", err.msg);
        CHILD_CHECK(strncmp(ccq_boot_name(b), "tcp://", 6) == 0, "name %s", ccq_boot_name(b));
        mine = value_of(rank, 1 + (uint32_t)g);
        st = ccq_boot_exchange(b, "world", all, size, &mine, sizeof mine, out, deadline_ms(20000),
                               &err);
        CHILD_CHECK(st == CCQ_OK, "world: %s: %s", ccq_status_name(st), err.msg);
        for (uint32_t p = 0; p < size; p++)
            CHILD_CHECK(out[p] == value_of(p, 1 + (uint32_t)g), "world out[%u]", p);
        /* The first and the last process alone; the others meanwhile nothing. */
        if (size > 1 && (rank == 0 || rank == size - 1)) {
            mine = value_of(rank, 50);
            st = ccq_boot_exchange(b, "ends", sub, 2, &mine, sizeof mine, out, deadline_ms(20000),
                                   &err);
            CHILD_CHECK(st == CCQ_OK && out[0] == value_of(0, 50) &&
                            out[1] == value_of(size - 1, 50),
                        "ends: %s", err.msg);
        }
        /* A larger record (a UCX worker address is a few hundred bytes; allow for more). */
        {
            static unsigned char big[MAXP][5000];
            unsigned char me[5000];
            memset(me, (int)rank + 1, sizeof me);
            st = ccq_boot_exchange(b, "big", all, size, me, sizeof me, big, deadline_ms(20000),
                                   &err);
            CHILD_CHECK(st == CCQ_OK, "big: %s", err.msg);
            for (uint32_t p = 0; p < size; p++)
                CHILD_CHECK(big[p][0] == p + 1 && big[p][4999] == p + 1, "big[%u]", p);
        }
        for (uint32_t p = 0; p < size; p++)
            CHILD_CHECK(ccq_boot_peer_state(b, p) != CCQ_BOOT_PEER_LOST, "peer %u lost", p);
        ccq_boot_close(b);
    }
    return 0;
}

static void test_tcp_worlds(void **state)
{
    int two = 2;
    (void)state;
    for (uint32_t n = 1; n <= 4; n++) {
        snprintf(spec, sizeof spec, "tcp://127.0.0.1:%u", free_port());
        assert_int_equal(run_procs(n, world_child, NULL), 0);
    }
    /* A second bootstrap after the first in every process (generation 1 meets generation 1),
     * process 0 serving every interface. */
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%u", free_port());
    assert_int_equal(run_procs(3, world_child, &two), 0);
}

/* Many generations back to back, each process opening and closing at its own random moments
 * (a runtime per test case, as test_fusion_world does): a process that closed one generation
 * and opened the next while another still closes the earlier one must meet the next one only.
 * By hand: CCQ_TEST_GENS (how many, default 12), CCQ_TEST_GENS_PAUSE (the longest random pause,
 * ms, default 15), CCQ_TEST_GENS_LATE (ms the last process comes late to every third one). */
static unsigned gens_pause = 15;
static int gens_child(unsigned rank, unsigned size, void *arg)
{
    uint32_t all[MAXP];
    unsigned gens = *(unsigned *)arg, seed = 7919u * (rank + 1);
    (void)size;
    for (uint32_t p = 0; p < size; p++)
        all[p] = p;
    for (unsigned g = 0; g < gens; g++) {
        ccq_boot *b;
        ccq_errbuf err = {{0}};
        uint64_t mine = value_of(rank, 1 + g), out[MAXP];
        static unsigned char big[MAXP][600];
        unsigned char me[600];
        if (getenv("CCQ_TEST_GENS_LATE") != NULL && rank == size - 1 && g % 3 == 1)
            sleep_ms((unsigned)atoi(getenv("CCQ_TEST_GENS_LATE")));
        CHILD_CHECK(open_tcp(rank, size, &b, &err) == CCQ_OK, "gen %u: open: %s", g, err.msg);
        sleep_ms(rand_r(&seed) % gens_pause);
        ccq_status st = ccq_boot_exchange(b, "world", all, size, &mine, sizeof mine, out,
                                          deadline_ms(20000), &err);
        CHILD_CHECK(st == CCQ_OK, "gen %u: world: %s: %s", g, ccq_status_name(st), err.msg);
        for (uint32_t p = 0; p < size; p++)
            CHILD_CHECK(out[p] == value_of(p, 1 + g), "gen %u: world out[%u]", g, p);
        memset(me, (int)(rank + 1 + g), sizeof me);
        st = ccq_boot_exchange(b, "world/backend", all, size, me, sizeof me, big,
                               deadline_ms(20000), &err);
        CHILD_CHECK(st == CCQ_OK, "gen %u: backend: %s: %s", g, ccq_status_name(st), err.msg);
        for (uint32_t p = 0; p < size; p++)
            CHILD_CHECK(big[p][0] == (unsigned char)(p + 1 + g), "gen %u: big[%u]", g, p);
        sleep_ms(rand_r(&seed) % gens_pause);
        ccq_boot_close(b);
        sleep_ms(rand_r(&seed) % (gens_pause / 3 + 1));
    }
    return 0;
}

static void test_tcp_generations(void **state)
{
    const char *env = getenv("CCQ_TEST_GENS");
    unsigned gens = env != NULL ? (unsigned)atoi(env) : 12;
    if (getenv("CCQ_TEST_GENS_PAUSE") != NULL)
        gens_pause = (unsigned)atoi(getenv("CCQ_TEST_GENS_PAUSE"));
    int status[MAXP];
    (void)state;
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%u", free_port());
    assert_int_equal(procs_run(4, gens_child, &gens, 30 + gens * 2, status), 0);
}

/* Process 0 on "*", the others on its address. */
static int any_child(unsigned rank, unsigned size, void *arg)
{
    char s[64];
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[2] = {0, 1};
    uint64_t mine = rank, out[2];
    unsigned port = *(unsigned *)arg;
    snprintf(s, sizeof s, rank == 0 ? "tcp://*:%u" : "tcp://127.0.0.1:%u", port);
    CHILD_CHECK(ccq_boot_open(s, NULL, -1, rank, size, &b, &err) == CCQ_OK, "open: %s", err.msg);
    CHILD_CHECK(ccq_boot_exchange(b, "w", all, 2, &mine, 8, out, deadline_ms(20000), &err) ==
                        CCQ_OK &&
                    out[0] == 0 && out[1] == 1,
                "w: %s", err.msg);
    ccq_boot_close(b);
    return 0;
}

static void test_tcp_any_interface(void **state)
{
    unsigned port = free_port();
    (void)state;
    assert_int_equal(run_procs(2, any_child, &port), 0);
}

/* ---- refusals ----------------------------------------------------------------------------- */

/* Rank 1 of another job comes first (and is refused, for good), then the real one. */
static int job_child(unsigned rank, unsigned size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[2] = {0, 1};
    uint64_t mine = rank, out[2];
    ccq_status st;
    (void)arg;
    size = 2;        /* a world of 2, and a third process: */
    if (rank == 2) { /* the impostor: rank 1 of job "other" */
        setenv("CCQ_JOB_ID", "other", 1);
        CHILD_CHECK(open_tcp(1, size, &b, &err) == CCQ_OK, "open: %s", err.msg);
        st = ccq_boot_exchange(b, "w", all, 2, &mine, 8, out, deadline_ms(10000), &err);
        CHILD_CHECK(st == CCQ_ERR_BACKEND && strstr(err.msg, "another job") != NULL &&
                        strstr(err.msg, "\"other\"") != NULL,
                    "impostor: %s: %s", ccq_status_name(st), err.msg);
        ccq_boot_close(b);
        return 0;
    }
    if (rank == 1)
        sleep_ms(500); /* after the impostor */
    setenv("CCQ_JOB_ID", "mine", 1);
    CHILD_CHECK(open_tcp(rank, size, &b, &err) == CCQ_OK, "open: %s", err.msg);
    st = ccq_boot_exchange(b, "w", all, 2, &mine, 8, out, deadline_ms(20000), &err);
    CHILD_CHECK(st == CCQ_OK && out[0] == 0 && out[1] == 1, "w: %s: %s", ccq_status_name(st),
                err.msg);
    ccq_boot_close(b);
    return 0;
}

/* A process that thinks the world has 3 processes. */
static int size_child(unsigned rank, unsigned size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[3] = {0, 1, 2};
    uint64_t mine = rank, out[3];
    ccq_status st;
    (void)arg;
    (void)size;
    if (rank == 1) {
        CHILD_CHECK(open_tcp(1, 3, &b, &err) == CCQ_OK, "open: %s", err.msg);
        st = ccq_boot_exchange(b, "w", all, 3, &mine, 8, out, deadline_ms(10000), &err);
        CHILD_CHECK(st == CCQ_ERR_INVALID_ARGUMENT && strstr(err.msg, "world_size 3") != NULL,
                    "%s: %s", ccq_status_name(st), err.msg);
        ccq_boot_close(b);
        return 0;
    }
    CHILD_CHECK(open_tcp(0, 2, &b, &err) == CCQ_OK, "open: %s", err.msg);
    sleep_ms(1500); /* serve a while, then leave */
    ccq_boot_close(b);
    return 0;
}

static void test_tcp_refusals(void **state)
{
    ccq_boot *b = NULL;
    ccq_errbuf err = {{0}};
    int fd;
    struct sockaddr_in a;
    (void)state;

    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%u", free_port());
    assert_int_equal(run_procs(3, job_child, NULL), 0);
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%u", free_port());
    assert_int_equal(run_procs(2, size_child, NULL), 0);

    /* Specs. */
    const char *bad[] = {"tcp://",           "tcp://host", "tcp://host:",   "tcp://host:0",
                         "tcp://host:65536", "tcp://:80",  "tcp://[::1:80", "tcp://host:12x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(ccq_boot_open(bad[i], NULL, -1, 0, 2, &b, &err), CCQ_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(err.msg, "expected tcp://HOST:PORT"));
        assert_null(b);
    }
    /* "*" is where process 0 listens: the others need its address. */
    assert_int_equal(ccq_boot_open("tcp://*:4000", NULL, -1, 1, 2, &b, &err),
                     CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "ADDRESS_OF_0"));
    /* A port in use: process 0 says so, with what to do. */
    fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 1), 0);
    {
        socklen_t l = sizeof a;
        char s[64];
        getsockname(fd, (struct sockaddr *)&a, &l);
        snprintf(s, sizeof s, "tcp://127.0.0.1:%u", ntohs(a.sin_port));
        assert_int_equal(ccq_boot_open(s, NULL, -1, 0, 2, &b, &err), CCQ_ERR_BACKEND);
        assert_non_null(strstr(err.msg, "Address already in use"));
        assert_non_null(strstr(err.msg, "CCQ_BOOTSTRAP"));
    }
    close(fd);
}

/* ---- hostile clients ---------------------------------------------------------------------- */

/* A raw connection to the rendezvous at spec's port. */
static int raw_connect(void)
{
    unsigned port = (unsigned)atoi(strrchr(spec, ':') + 1);
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int k = 0; k < 200 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0; k++) {
        close(fd);
        sleep_ms(20);
        fd = socket(AF_INET, SOCK_STREAM, 0);
    }
    return fd;
}

/* Read until the server closes the connection (or 5 s): what it said. */
static size_t read_all(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    while (n + 1 < cap) {
        ssize_t k = recv(fd, buf + n, cap - 1 - n, 0);
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    buf[n] = '\0';
    for (size_t i = 0; i < n; i++) /* the frame's binary header, for strstr */
        if (buf[i] == '\0')
            buf[i] = ' ';
    return n;
}

static void frame(int fd, uint16_t type, uint16_t version, uint32_t len, const void *p, size_t plen)
{
    uint8_t h[12];
    uint32_t magic = CCQ_TCP_MAGIC;
    memcpy(h, &magic, 4);
    memcpy(h + 4, &version, 2);
    memcpy(h + 6, &type, 2);
    memcpy(h + 8, &len, 4);
    assert_int_equal(send(fd, h, 12, 0), 12);
    if (plen)
        assert_int_equal(send(fd, p, plen, 0), (ssize_t)plen);
}

/* ---- a record the server refused ----------------------------------------------------------- */

/* Rank 1 of 2 against a fake server that WELCOMEs it, refuses its record (ERR) and still
 * relays rank 0's: the exchange must fail with the server's reason, not complete here while
 * the others can never complete it (the CI flake of 2026-12-03: a process went on past
 * 'world' while the others waited for its record until their deadline). */
static int refused_child(unsigned rank, unsigned size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[2] = {0, 1};
    uint64_t mine = 11, out[2];
    ccq_status st;
    (void)rank;
    (void)arg;
    CHILD_CHECK(ccq_boot_open(spec, NULL, -1, 1, size, &b, &err) == CCQ_OK, "open: %s", err.msg);
    st = ccq_boot_exchange(b, "w", all, 2, &mine, 8, out, deadline_ms(10000), &err);
    CHILD_CHECK(st == CCQ_ERR_BACKEND, "the exchange ended with %s: %s", ccq_status_name(st),
                err.msg);
    CHILD_CHECK(strstr(err.msg, "fake refusal") != NULL, "detail: %s", err.msg);
    ccq_boot_close(b);
    return 0;
}

/* Read frames from fd until one of `type` (its payload copied to p, up to cap): its length. */
static size_t read_frame_of(int fd, uint16_t type, uint8_t *p, size_t cap)
{
    static uint8_t buf[65536];
    static size_t have;
    for (;;) {
        ccq_tcp_frame f;
        size_t used = 0;
        ccq_errbuf err;
        int r = ccq_tcp_parse(buf, have, sizeof buf, &f, &used, &err);
        assert_true(r >= 0);
        if (r > 0) {
            size_t n = f.len < cap ? f.len : cap;
            bool match = f.type == type;
            if (match)
                memcpy(p, f.payload, n);
            memmove(buf, buf + used, have - used);
            have -= used;
            if (match)
                return n;
            continue;
        }
        ssize_t k = recv(fd, buf + have, sizeof buf - have, 0);
        assert_true(k > 0);
        have += (size_t)k;
    }
}

static void send_frame_to(int fd, uint16_t type, const void *a, size_t alen, const void *b2,
                          size_t blen, const void *c, size_t clen)
{
    ccq_tcp_buf o = {0};
    assert_true(ccq_tcp_put_frame(&o, SIZE_MAX, type, a, alen, b2, blen, c, clen));
    assert_int_equal(send(fd, o.p + o.off, o.len - o.off, 0), (ssize_t)(o.len - o.off));
    ccq_tcp_buf_free(&o);
}

static void test_tcp_refused_record(void **state)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    int lfd = socket(AF_INET, SOCK_STREAM, 0), fd, ws;
    uint8_t hello[512], rec[sizeof(ccq_boot_hdr) + 1 + 8];
    uint32_t size = 2, all[2] = {0, 1}, r0 = 0;
    uint16_t tl = 1;
    uint64_t v0 = 10;
    ccq_boot_hdr h;
    pid_t pid;
    (void)state;

    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(lfd, 4), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &al), 0);
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%u", ntohs(a.sin_port));
    fflush(NULL);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(refused_child(1, 2, NULL));
    fd = accept(lfd, NULL, NULL);
    assert_true(fd >= 0);
    assert_true(read_frame_of(fd, CCQ_TCP_HELLO, hello, sizeof hello) >= 24);
    send_frame_to(fd, CCQ_TCP_WELCOME, &size, 4, NULL, 0, NULL, 0);
    (void)read_frame_of(fd, CCQ_TCP_GET, rec, sizeof rec); /* after its PUT */
    /* Its record refused, as the real server's tag_err does, then rank 0's record, in one
     * write (the real server answers the PUT and the GET in one pass): the client reads both
     * before its exchange looks. */
    memset(&h, 0, sizeof h);
    h.magic = CCQ_BOOT_MAGIC;
    h.version = CCQ_BOOT_VERSION;
    h.hdr_size = sizeof h;
    h.world_size = 2;
    h.rank = 0;
    memcpy(&h.gen, hello + 8, 4); /* the child's generation, from its HELLO */
    h.nmembers = 2;
    h.nonce = 99;
    h.members_hash = ccq_boot_fnv1a(all, sizeof all, CCQ_FNV_OFFSET);
    h.tag_len = 1;
    h.len = 8;
    memcpy(rec, &h, sizeof h);
    rec[sizeof h] = 'w';
    memcpy(rec + sizeof h + 1, &v0, 8);
    {
        uint8_t head[6];
        ccq_tcp_buf o = {0};
        memcpy(head, &r0, 4);
        memcpy(head + 4, &tl, 2);
        assert_true(
            ccq_tcp_put_frame(&o, SIZE_MAX, CCQ_TCP_ERR, &tl, 2, "w", 1, "fake refusal", 12));
        assert_true(ccq_tcp_put_frame(&o, SIZE_MAX, CCQ_TCP_REC, head, 6, "w", 1, rec, sizeof rec));
        assert_int_equal(send(fd, o.p + o.off, o.len - o.off, 0), (ssize_t)(o.len - o.off));
        ccq_tcp_buf_free(&o);
    }
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
    close(fd);
    close(lfd);
}

/* ---- a finished exchange at takeover --------------------------------------------------------- */

static int finished_pipe[2];

/* Ranks 1 and 2 of 3 exchange "x" through a fake process 0 (the parent) that passes rank 1's
 * record to rank 2 and is lost before it sends rank 2's to rank 1. Rank 2 finished and freed
 * "x"; rank 1 serves in 0's place, and rank 2 offers it the record of "x" (HAD): rank 1's "x"
 * completes, then both meet through rank 1. */
static int finished_child(unsigned rank, unsigned size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t two[2] = {1, 2};
    uint64_t mine = 100 + rank, out[2];
    (void)arg;
    CHILD_CHECK(open_tcp(rank, size, &b, &err) == CCQ_OK, "open: %s", err.msg);
    CHILD_CHECK(ccq_boot_exchange(b, "x", two, 2, &mine, 8, out, deadline_ms(15000), &err) ==
                        CCQ_OK &&
                    out[0] == 101 && out[1] == 102,
                "x: %s", err.msg);
    if (rank == 2)
        CHILD_CHECK(write(finished_pipe[1], "f", 1) == 1, "pipe");
    mine += 10;
    CHILD_CHECK(ccq_boot_exchange(b, "after", two, 2, &mine, 8, out, deadline_ms(15000), &err) ==
                        CCQ_OK &&
                    out[0] == 111 && out[1] == 112,
                "after: %s", err.msg);
    ccq_boot_close(b);
    return 0;
}

/* What the fake process 0 writes to connection id of s: *p and the bytes from it, all it has
 * for the connection, but for process 1 only what goes before its first record of "x"
 * (*held once something was kept back). */
static size_t writable(ccq_tcp_server *s, int id, const uint8_t **p, bool *held)
{
    const char *tag = "x";
    size_t len, off = 0;
    uint32_t r;
    ccq_tcp_server_output(s, id, p, &len);
    if (!ccq_tcp_server_conn_member(s, id, &r) || r != 1)
        return len;
    while (off < len) {
        ccq_tcp_frame f;
        size_t used = 0;
        ccq_errbuf err;
        uint16_t tl;
        assert_int_equal(ccq_tcp_parse(*p + off, len - off, SIZE_MAX, &f, &used, &err), 1);
        if (f.type == CCQ_TCP_REC && (memcpy(&tl, f.payload + 4, 2), tl == strlen(tag)) &&
            memcmp(f.payload + 6, tag, tl) == 0) {
            *held = true;
            break;
        }
        off += used;
    }
    return off;
}

static void test_tcp_finished_at_takeover(void **state)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), fd[3] = {-1, -1, -1}, id[3], ws;
    ccq_tcp_limits lim;
    ccq_tcp_server *s;
    bool held = false, lost = false;
    uint64_t until = deadline_ms(20000);
    pid_t pid[3];
    (void)state;

    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(lfd, 4), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &al), 0);
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%u", ntohs(a.sin_port));
    assert_int_equal(pipe(finished_pipe), 0);
    setenv("CCQ_JOB_ID", "finished-at-takeover", 1); /* generation 0: the parent opens none */
    fflush(NULL);
    for (unsigned r = 1; r < 3; r++) {
        pid[r] = fork();
        assert_true(pid[r] >= 0);
        if (pid[r] == 0) {
            close(lfd);
            close(finished_pipe[0]);
            _exit(finished_child(r, 3, NULL));
        }
    }
    unsetenv("CCQ_JOB_ID");
    close(finished_pipe[1]);
    ccq_tcp_default_limits(&lim, 3);
    s = ccq_tcp_server_new("finished-at-takeover", 3, 0, &lim);
    assert_non_null(s);
    /* Serve (the real server's logic) until rank 2 finished "x": nothing of rank 1's output
     * from its record of "x" on is written. */
    while (!lost && ccq_boot_now_ns() < until) {
        struct pollfd pf[4] = {{.fd = lfd, .events = POLLIN},
                               {.fd = finished_pipe[0], .events = POLLIN}};
        int n = 2, slot[4] = {-1, -1, -1, -1};
        for (int c = 0; c < 3; c++) {
            const uint8_t *p;
            size_t len;
            if (fd[c] < 0)
                continue;
            len = writable(s, id[c], &p, &held);
            pf[n] = (struct pollfd){.fd = fd[c], .events = POLLIN | (len > 0 ? POLLOUT : 0)};
            slot[n++] = c;
        }
        assert_true(poll(pf, (nfds_t)n, 100) >= 0);
        if (pf[0].revents & POLLIN) {
            for (int c = 0; c < 3; c++)
                if (fd[c] < 0) {
                    fd[c] = accept(lfd, NULL, NULL);
                    if (fd[c] >= 0)
                        id[c] = ccq_tcp_server_open(s, ccq_boot_now_ns());
                    break;
                }
        }
        if (pf[1].revents & POLLIN)
            lost = true;
        for (int j = 2; j < n; j++) {
            int c = slot[j];
            if (pf[j].revents & POLLIN) {
                uint8_t buf[65536];
                ssize_t k = recv(fd[c], buf, sizeof buf, MSG_DONTWAIT);
                if (k > 0)
                    assert_true(ccq_tcp_server_input(s, id[c], buf, (size_t)k, ccq_boot_now_ns()));
                if (k == 0) { /* a process gave up early: its own check says why */
                    ccq_tcp_server_closed(s, id[c], ccq_boot_now_ns());
                    close(fd[c]);
                    fd[c] = -1;
                    continue;
                }
            }
            if (pf[j].revents & POLLOUT) {
                const uint8_t *p;
                size_t len = writable(s, id[c], &p, &held);
                ssize_t k = send(fd[c], p, len, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (k > 0)
                    ccq_tcp_server_sent(s, id[c], (size_t)k, ccq_boot_now_ns());
            }
        }
    }
    assert_true(lost);
    assert_true(held); /* rank 1 was never sent rank 2's record by process 0 */
    /* Process 0 is lost: every connection closes at once. */
    for (int c = 0; c < 3; c++)
        if (fd[c] >= 0)
            close(fd[c]);
    close(lfd);
    ccq_tcp_server_free(s);
    for (unsigned r = 1; r < 3; r++) {
        assert_int_equal(waitpid(pid[r], &ws, 0), pid[r]);
        assert_true(WIFEXITED(ws));
        assert_int_equal(WEXITSTATUS(ws), 0);
    }
    close(finished_pipe[0]);
}

/* Ranks 0 and 1 exchange repeatedly while the parent attacks the server. */
static int steady_child(unsigned rank, unsigned size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[2] = {0, 1};
    (void)arg;
    CHILD_CHECK(open_tcp(rank, size, &b, &err) == CCQ_OK, "open: %s", err.msg);
    for (uint32_t round = 0; round < 30; round++) {
        char tag[32];
        uint64_t mine = value_of(rank, round), out[2];
        snprintf(tag, sizeof tag, "round/%u", round);
        ccq_status st = ccq_boot_exchange(b, tag, all, 2, &mine, 8, out, deadline_ms(20000), &err);
        CHILD_CHECK(st == CCQ_OK && out[0] == value_of(0, round) && out[1] == value_of(1, round),
                    "%s: %s", tag, err.msg);
        sleep_ms(50);
    }
    ccq_boot_close(b);
    return 0;
}

static void test_tcp_hostile_clients(void **state)
{
    pid_t pid[2];
    char got[4096];
    int fd, ws;
    (void)state;

    setenv("CCQ_TCP_STALL_MS", "300", 1); /* inherited by the server's process */
    setenv("CCQ_JOB_ID", "hostile", 1);
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%u", free_port());
    fflush(NULL);
    for (int r = 0; r < 2; r++)
        if ((pid[r] = fork()) == 0) {
            alarm(60);
            _exit(steady_child((uint32_t)r, 2, NULL));
        }

    /* Not this protocol at all. */
    fd = raw_connect();
    assert_int_equal(send(fd, "GET / HTTP/1.0\r\n\r\n", 18, 0), 18);
    read_all(fd, got, sizeof got);
    assert_non_null(strstr(got, "not the ccq rendezvous protocol"));
    close(fd);
    /* Another version of it. */
    fd = raw_connect();
    frame(fd, CCQ_TCP_HELLO, 99, 0, NULL, 0);
    read_all(fd, got, sizeof got);
    assert_non_null(strstr(got, "version 99"));
    close(fd);
    /* A frame far beyond any record. */
    fd = raw_connect();
    frame(fd, CCQ_TCP_PUT, CCQ_TCP_VERSION, 0x7fffffffu, NULL, 0);
    read_all(fd, got, sizeof got);
    assert_non_null(strstr(got, "a frame of 2147483647 bytes"));
    close(fd);
    /* A malformed HELLO, and a PUT before any HELLO. */
    fd = raw_connect();
    frame(fd, CCQ_TCP_HELLO, CCQ_TCP_VERSION, 3, "abc", 3);
    read_all(fd, got, sizeof got);
    assert_non_null(strstr(got, "malformed HELLO"));
    close(fd);
    fd = raw_connect();
    frame(fd, CCQ_TCP_GET, CCQ_TCP_VERSION, 4, "\2\0ab", 4);
    read_all(fd, got, sizeof got);
    assert_non_null(strstr(got, "HELLO first"));
    close(fd);
    /* A duplicate of rank 1 (whose real process is connected). */
    sleep_ms(300);
    {
        uint8_t h[24 + 7];
        uint32_t v[4] = {1, 2, 0, 0};
        uint64_t nonce = 7;
        const char *job = "hostile";
        size_t jl = strlen(job) < 7 ? strlen(job) : 7;
        memcpy(h, v, 16);
        memcpy(h + 16, &nonce, 8);
        memcpy(h + 24, job, jl);
        fd = raw_connect();
        frame(fd, CCQ_TCP_HELLO, CCQ_TCP_VERSION, (uint32_t)(24 + jl), h, 24 + jl);
        read_all(fd, got, sizeof got);
        assert_non_null(strstr(got, "connected already"));
        close(fd);
    }
    /* Half a frame, then silence; and a connection that never says anything: both dropped
     * after CCQ_TCP_STALL_MS (the read ends with the server's close, well before 5 s). */
    {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        fd = raw_connect();
        assert_int_equal(send(fd, "CCQT", 4, 0), 4);
        read_all(fd, got, sizeof got);
        close(fd);
        fd = raw_connect();
        read_all(fd, got, sizeof got);
        close(fd);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        assert_true(t1.tv_sec - t0.tv_sec < 4);
    }
    unsetenv("CCQ_TCP_STALL_MS");
    unsetenv("CCQ_JOB_ID");
    /* Meanwhile the real processes kept exchanging. */
    for (int r = 0; r < 2; r++) {
        assert_int_equal(waitpid(pid[r], &ws, 0), pid[r]);
        assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    }
}

/* ---- the server's own leave ------------------------------------------------------------ */

static int leave_pipe[2];

/* Rank 0 (the server): opens, waits for the word, leaves cleanly. */
static int leaver_child(unsigned rank, unsigned size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    char go;
    (void)arg;
    CHILD_CHECK(open_tcp(rank, size, &b, &err) == CCQ_OK, "open: %s", err.msg);
    CHILD_CHECK(read(leave_pipe[0], &go, 1) == 1, "the word to leave");
    uint64_t t0 = deadline_ms(0);
    ccq_boot_close(b);
    /* A member that never closes its side (stopped) holds the drain a second at most. */
    CHILD_CHECK(deadline_ms(0) - t0 < 3000000000ull, "the server's close took %.1f s",
                (double)(deadline_ms(0) - t0) / 1e9);
    return 0;
}

/* The server's process leaves while a member is still sending (here a PUT a byte at a time):
 * the member must see the connection end in order (what the server sent, then the end), never a
 * reset, whose arrival discards what the member's kernel had not delivered yet (over a real
 * network, the server's last notices). Before, the server closed its members' sockets with
 * their latest bytes unread, which makes the kernel send a reset. */
/* A rendezvous server's process of a world of 2 (leaver_child) on a free port, addr its
 * address; it leaves when told through leave_pipe. */
static pid_t start_leaver(char *addr, size_t len)
{
    pid_t pid;
    snprintf(addr, len, "tcp://127.0.0.1:%u", free_port());
    assert_int_equal(pipe(leave_pipe), 0);
    fflush(NULL);
    if ((pid = fork()) == 0) {
        alarm(30);
        _exit(leaver_child(0, 2, NULL));
    }
    return pid;
}

static void test_tcp_server_leave_drains(void **state)
{
    uint8_t h[24 + 6];
    uint32_t v[4] = {1, 2, 0, 0};
    uint64_t nonce = 3;
    uint32_t put_len = 60000;
    int resets = 0;
    (void)state;

    setenv("CCQ_JOB_ID", "drains", 1);
    for (int run = 0; run < 20; run++) {
        char got[4096];
        size_t sent = 0;
        pid_t pid;
        int fd, ws, flags;
        uint64_t until;
        bool ended = false;

        pid = start_leaver(spec, sizeof spec);
        memcpy(h, v, 16);
        memcpy(h + 16, &nonce, 8);
        memcpy(h + 24, "drains", 6);
        fd = raw_connect();
        frame(fd, CCQ_TCP_HELLO, CCQ_TCP_VERSION, sizeof h, h, sizeof h);
        (void)read_frame_of(fd, CCQ_TCP_WELCOME, (uint8_t *)got, sizeof got);
        frame(fd, CCQ_TCP_PUT, CCQ_TCP_VERSION, put_len, NULL, 0);
        assert_int_equal(write(leave_pipe[1], "x", 1), 1);
        flags = fcntl(fd, F_GETFL);
        assert_int_equal(fcntl(fd, F_SETFL, flags | O_NONBLOCK), 0);
        until = deadline_ms(10000);
        while (!ended && deadline_ms(0) < until) {
            ssize_t k;
            if (sent < put_len && send(fd, "p", 1, MSG_NOSIGNAL) == 1)
                sent++;
            k = recv(fd, got, sizeof got, 0);
            if (k > 0)
                continue; /* what the server says (its PEER notices); then the end */
            if (k == 0) {
                ended = true; /* in order */
            } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                resets += errno == ECONNRESET;
                ended = true;
            }
        }
        assert_true(ended);
        (void)shutdown(fd, SHUT_WR); /* the server's drain reads to here */
        close(fd);
        close(leave_pipe[0]);
        close(leave_pipe[1]);
        assert_int_equal(waitpid(pid, &ws, 0), pid);
        assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    }
    assert_int_equal(resets, 0);

    /* A member that never reads nor closes (as a stopped process): the server's process
     * still leaves, within its drain's second. */
    {
        pid_t pid;
        int fd, ws;
        char got[256];
        pid = start_leaver(spec, sizeof spec);
        fd = raw_connect();
        frame(fd, CCQ_TCP_HELLO, CCQ_TCP_VERSION, sizeof h, h, sizeof h);
        (void)read_frame_of(fd, CCQ_TCP_WELCOME, (uint8_t *)got, sizeof got);
        frame(fd, CCQ_TCP_PUT, CCQ_TCP_VERSION, put_len, "p", 1); /* unread input at its leave */
        assert_int_equal(write(leave_pipe[1], "x", 1), 1);
        assert_int_equal(waitpid(pid, &ws, 0), pid);
        assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
        close(fd);
        close(leave_pipe[0]);
        close(leave_pipe[1]);
    }
    unsetenv("CCQ_JOB_ID");
}

/* ---- peers' states ------------------------------------------------------------------------ */

/* Counted by the rendezvous thread, read by the test's (atomic: the watcher runs after the
 * state it reports is readable, so the test waits for the counts too). */
typedef struct seen {
    _Atomic int lost[MAXP], left[MAXP];
} seen;

static void watcher(void *arg, uint32_t rank, ccq_boot_peer st)
{
    seen *s = arg;
    if (rank < MAXP && st == CCQ_BOOT_PEER_LOST)
        s->lost[rank]++;
    if (rank < MAXP && st == CCQ_BOOT_PEER_LEFT)
        s->left[rank]++;
}

/* What process q's record holds now, for a failure's message. */
static const char *beat_text(ccq_boot *b, uint32_t q)
{
    static char text[64];
    void *rec = NULL;
    size_t len = 0;
    ccq_errbuf err = {{0}};
    ccq_status st = ccq_boot_beat_fetch(b, q, &rec, &len, &err);
    if (st != CCQ_OK)
        snprintf(text, sizeof text, "none (%s)", ccq_status_name(st));
    else
        snprintf(text, sizeof text, "\"%.*s\" (%zu bytes)", (int)(len < 40 ? len : 40),
                 (const char *)rec, len);
    free(rec);
    return text;
}

/* Wait until rank q's latest heartbeat record is `want` (job health's records). */
static bool beat_is(ccq_boot *b, uint32_t q, const char *want)
{
    for (int k = 0; k < 500; k++) {
        void *rec = NULL;
        size_t len = 0;
        ccq_errbuf err = {{0}};
        ccq_status st = ccq_boot_beat_fetch(b, q, &rec, &len, &err);
        bool same = st == CCQ_OK && len == strlen(want) + 1 && memcmp(rec, want, len) == 0;
        free(rec);
        if (same)
            return true;
        sleep_ms(10);
    }
    return false;
}

/* Rank 1 dies without closing; rank 2 closes cleanly; ranks 0 and 3 watch. Each publishes a
 * heartbeat record first: every other process reads it, also after its writer went. */
static int peers_child(unsigned rank, unsigned size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[4] = {0, 1, 2, 3}, two[2] = {0, 3}, closed[4];
    uint64_t mine = rank, out[4];
    char beat[32];
    static seen s;
    (void)arg;
    CHILD_CHECK(open_tcp(rank, size, &b, &err) == CCQ_OK, "open: %s", err.msg);
    CHILD_CHECK(ccq_boot_watch_peers(b, watcher, &s) == CCQ_OK, "watch");
    CHILD_CHECK(ccq_boot_has_heartbeats(b), "tcp carries heartbeats");
    snprintf(beat, sizeof beat, "beat %u.1", rank);
    CHILD_CHECK(ccq_boot_beat_publish(b, beat, strlen(beat) + 1, &err) == CCQ_OK, "beat: %s",
                err.msg);
    for (uint32_t q = 0; q < size; q++) {
        char want[32];
        snprintf(want, sizeof want, "beat %u.1", q);
        CHILD_CHECK(q == rank || beat_is(b, q, want), "process %u's beat not read", q);
    }
    CHILD_CHECK(ccq_boot_exchange(b, "w", all, 4, &mine, 8, out, deadline_ms(20000), &err) ==
                    CCQ_OK,
                "w: %s", err.msg);
    if (rank == 1)
        _exit(0); /* gone, without a goodbye */
    if (rank == 2) {
        sleep_ms(300);
        ccq_boot_close(b);
        return 0;
    }
    for (int k = 0; k < 500 && (ccq_boot_peer_state(b, 1) != CCQ_BOOT_PEER_LOST ||
                                ccq_boot_peer_state(b, 2) != CCQ_BOOT_PEER_LEFT || s.lost[1] == 0 ||
                                s.left[2] == 0);
         k++)
        sleep_ms(10);
    CHILD_CHECK(ccq_boot_peer_state(b, 1) == CCQ_BOOT_PEER_LOST, "1: %d",
                ccq_boot_peer_state(b, 1));
    CHILD_CHECK(ccq_boot_peer_state(b, 2) == CCQ_BOOT_PEER_LEFT, "2: %d",
                ccq_boot_peer_state(b, 2));
    CHILD_CHECK(s.lost[1] == 1 && s.left[2] == 1 && s.lost[2] == 0, "watcher: %d %d %d", s.lost[1],
                s.left[2], s.lost[2]);
    /* Job health's closed connections: the lost one, once; not the one that left. */
    CHILD_CHECK(ccq_boot_closed_peers(b, closed, 4) == 1 && closed[0] == 1, "closed: 1");
    CHILD_CHECK(ccq_boot_closed_peers(b, closed, 4) == 0, "closed: reported once");
    /* The last records of those gone stay readable; a new beat replaces the old one. */
    CHILD_CHECK(beat_is(b, 1, "beat 1.1") && beat_is(b, 2, "beat 2.1"), "last beats");
    snprintf(beat, sizeof beat, "beat %u.2", rank);
    CHILD_CHECK(ccq_boot_beat_publish(b, beat, strlen(beat) + 1, &err) == CCQ_OK, "beat: %s",
                err.msg);
    CHILD_CHECK(beat_is(b, 3 - rank, rank == 0 ? "beat 3.2" : "beat 0.2"), "second beat");
    /* The survivors still meet. */
    mine = rank + 100;
    CHILD_CHECK(ccq_boot_exchange(b, "after", two, 2, &mine, 8, out, deadline_ms(20000), &err) ==
                        CCQ_OK &&
                    out[0] == 100 && out[1] == 103,
                "after: %s", err.msg);
    if (rank == 0) {
        sleep_ms(300); /* let rank 3 see everything above first */
        _exit(0);      /* process 0 dies: rank 3 learns it */
    }
    for (int k = 0; k < 500 && ccq_boot_peer_state(b, 0) != CCQ_BOOT_PEER_LOST; k++)
        sleep_ms(10);
    CHILD_CHECK(ccq_boot_peer_state(b, 0) == CCQ_BOOT_PEER_LOST, "0: %d",
                ccq_boot_peer_state(b, 0));
    CHILD_CHECK(ccq_boot_closed_peers(b, closed, 4) == 1 && closed[0] == 0, "closed: 0");
    /* The lowest survivor (3, the only one) serves the rendezvous in 0's place: an exchange
     * among the survivors works; one with a member that left waits for it until its deadline
     * and names it. */
    {
        uint32_t only[2] = {2, 3}, me[1] = {3};
        ccq_status st = ccq_boot_exchange(b, "late", me, 1, &mine, 8, out, deadline_ms(5000), &err);
        CHILD_CHECK(st == CCQ_OK && out[0] == 103, "late: %s: %s", ccq_status_name(st), err.msg);
        st = ccq_boot_exchange(b, "later", only, 2, &mine, 8, out, deadline_ms(500), &err);
        CHILD_CHECK(st == CCQ_ERR_TIMEOUT && strstr(err.msg, "process 2 never arrived") != NULL,
                    "later: %s: %s", ccq_status_name(st), err.msg);
    }
    ccq_boot_close(b);
    return 0;
}

static void test_tcp_peers(void **state)
{
    (void)state;
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%u", free_port());
    assert_int_equal(run_procs(4, peers_child, NULL), 0);
}

/* ---- a record published as the server is lost ---------------------------------------------- */

typedef struct {
    ccq_boot *b;
    unsigned rank;
} publisher;

/* Publishes "lost R" from the bootstrap's own thread the moment it reports the server lost:
 * before the client moves to the successor (server_lost), when the health monitor may too. */
static void publish_on_loss(void *arg, uint32_t rank, ccq_boot_peer state)
{
    publisher *p = arg;
    char rec[32];
    ccq_errbuf err = {{0}};
    if (rank != 0 || state != CCQ_BOOT_PEER_LOST)
        return;
    snprintf(rec, sizeof rec, "lost %u", p->rank);
    (void)ccq_boot_beat_publish(p->b, rec, strlen(rec) + 1, &err);
}

/* Process 0, which serves, dies; 1 and 2 each publish a record as they see it, then meet
 * through 1: each reads the other's record (it was once dropped with what was queued for the
 * lost server: test_tcp_stopped_server under TSan, 1 run in ~20). Process 0 dies once the
 * others have its record of "all" (told through a pipe: its server could otherwise die with
 * that record unsent, and "all" would wait for it in vain); "two" races its death: the old
 * server may pass one's record of "two" and not the other's (finished_at_takeover makes that
 * happen every time). */
static int record_pipe[2];

static int record_child(unsigned rank, unsigned size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[3] = {0, 1, 2}, two[2] = {1, 2};
    uint64_t mine = rank, out[3];
    static publisher p;
    char want[32];
    (void)arg;
    CHILD_CHECK(open_tcp(rank, size, &b, &err) == CCQ_OK, "open: %s", err.msg);
    p.b = b;
    p.rank = rank;
    CHILD_CHECK(ccq_boot_watch_peers(b, publish_on_loss, &p) == CCQ_OK, "watch");
    CHILD_CHECK(ccq_boot_exchange(b, "all", all, 3, &mine, 8, out, deadline_ms(20000), &err) ==
                    CCQ_OK,
                "all: %s", err.msg);
    if (rank == 0) {
        char got[2];
        CHILD_CHECK(read(record_pipe[0], got, 1) == 1 && read(record_pipe[0], got, 1) == 1, "pipe");
        _exit(0);
    }
    CHILD_CHECK(write(record_pipe[1], "a", 1) == 1, "pipe");
    CHILD_CHECK(ccq_boot_exchange(b, "two", two, 2, &mine, 8, out, deadline_ms(20000), &err) ==
                        CCQ_OK &&
                    out[0] == 1 && out[1] == 2,
                "two: %s", err.msg);
    snprintf(want, sizeof want, "lost %u", 3 - rank);
    CHILD_CHECK(beat_is(b, 3 - rank, want), "process %u's record: %s (want \"%s\")", 3 - rank,
                beat_text(b, 3 - rank), want);
    ccq_boot_close(b);
    return 0;
}

static void test_tcp_record_at_takeover(void **state)
{
    (void)state;
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%u", free_port());
    assert_int_equal(pipe(record_pipe), 0);
    assert_int_equal(run_procs(3, record_child, NULL), 0);
    close(record_pipe[0]);
    close(record_pipe[1]);
}

/* ---- a stopped server ------------------------------------------------------------------- */

#ifndef CCQ_TEST_BEAT_SCALE
#define CCQ_TEST_BEAT_SCALE 1 /* sanitizer builds: 4 (tests/CMakeLists.txt) */
#endif

/* Heartbeats on (50 ms, silent after 500 ms; 4x that under a sanitizer). Rank 0, which serves,
 * stops itself; ranks 1 and 2 find it silent, rank 1 serves in its place, they meet through it, and
 * rank 1 continues rank 0: rank 0 learns it was given up (by asking rank 1), reports none of the
 * others lost, and its exchanges fail; nothing it does reaches the others. */
static int stopped_child(unsigned rank, unsigned size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[3] = {0, 1, 2}, two[2] = {1, 2}, ranks[4], by = 99;
    uint64_t mine = (uint64_t)getpid(), pids[3], out[3];
    char beat[32];
    ccq_status st;
    (void)arg;
    CHILD_CHECK(open_tcp(rank, size, &b, &err) == CCQ_OK, "open: %s", err.msg);
    ccq_boot_beat_config(b, 50000000ull * CCQ_TEST_BEAT_SCALE, 500000000ull * CCQ_TEST_BEAT_SCALE);
    CHILD_CHECK(ccq_boot_exchange(b, "pids", all, 3, &mine, 8, pids, deadline_ms(20000), &err) ==
                    CCQ_OK,
                "pids: %s", err.msg);
    if (rank != 0)
        CHILD_CHECK(write(record_pipe[1], "p", 1) == 1, "pipe");
    if (rank == 0) {
        char got[1];
        /* Not before the others have their answers: a server stopped while an answer was still
         * on its way leaves that exchange to fail, as it must (its record is nowhere else;
         * CI 2026-12-07: "exchange 'pids': timed out"), which is not what this test is about. */
        CHILD_CHECK(read(record_pipe[0], got, 1) == 1 && read(record_pipe[0], got, 1) == 1, "pipe");
        raise(SIGSTOP); /* until rank 1 continues it, after the others took over */
        for (int k = 0; k < 300 && !ccq_boot_given_up(b, &by); k++)
            sleep_ms(10);
        CHILD_CHECK(ccq_boot_given_up(b, &by) && by == 1, "given up: by %u", by);
        /* The others closed their connections because they gave it up: not losses. */
        CHILD_CHECK(ccq_boot_closed_peers(b, ranks, 4) == 0, "closed: %u", ranks[0]);
        CHILD_CHECK(ccq_boot_silent_peers(b, ranks, 4) == 0, "silent: %u", ranks[0]);
        CHILD_CHECK(ccq_boot_peer_state(b, 1) != CCQ_BOOT_PEER_LOST &&
                        ccq_boot_peer_state(b, 2) != CCQ_BOOT_PEER_LOST,
                    "peers: %d %d", ccq_boot_peer_state(b, 1), ccq_boot_peer_state(b, 2));
        /* The successor's answer carried the others' heartbeat records. */
        CHILD_CHECK(beat_is(b, 1, "beat 1.after"), "rank 1's record after the takeover: %s",
                    beat_text(b, 1));
        st = ccq_boot_exchange(b, "late", all, 3, &mine, 8, out, deadline_ms(2000), &err);
        CHILD_CHECK(st == CCQ_ERR_PROCESS_LOST && strstr(err.msg, "fenced off") != NULL,
                    "late: %s: %s", ccq_status_name(st), err.msg);
        ccq_boot_close(b);
        return 0;
    }
    for (int k = 0; k < 500 && ccq_boot_peer_state(b, 0) != CCQ_BOOT_PEER_LOST; k++)
        sleep_ms(10);
    CHILD_CHECK(ccq_boot_peer_state(b, 0) == CCQ_BOOT_PEER_LOST, "0: %d",
                ccq_boot_peer_state(b, 0));
    /* Silent, not closed: job health says how it was seen. */
    {
        size_t ns = ccq_boot_silent_peers(b, ranks, 4);
        CHILD_CHECK(ns == 1 && ranks[0] == 0, "silent: %zu processes, the first %u (want 0 only)",
                    ns, ns > 0 ? ranks[0] : 0);
    }
    CHILD_CHECK(ccq_boot_closed_peers(b, ranks, 4) == 0, "closed: %u", ranks[0]);
    snprintf(beat, sizeof beat, "beat %u.after", rank);
    CHILD_CHECK(ccq_boot_beat_publish(b, beat, strlen(beat) + 1, &err) == CCQ_OK, "beat: %s",
                err.msg);
    /* The survivors meet through rank 1 (its beat went first on the same connection). */
    mine = rank + 100;
    CHILD_CHECK(ccq_boot_exchange(b, "after", two, 2, &mine, 8, out, deadline_ms(20000), &err) ==
                        CCQ_OK &&
                    out[0] == 101 && out[1] == 102,
                "after: %s", err.msg);
    if (rank == 1)
        kill((pid_t)pids[0], SIGCONT);
    /* Rank 0 runs again: nobody else is lost, and the survivors still meet. */
    sleep_ms(1500);
    CHILD_CHECK(ccq_boot_peer_state(b, 3 - rank) != CCQ_BOOT_PEER_LOST, "%u: %d", 3 - rank,
                ccq_boot_peer_state(b, 3 - rank));
    CHILD_CHECK(ccq_boot_closed_peers(b, ranks, 4) == 0, "closed after: %u", ranks[0]);
    CHILD_CHECK(ccq_boot_exchange(b, "end", two, 2, &mine, 8, out, deadline_ms(20000), &err) ==
                    CCQ_OK,
                "end: %s", err.msg);
    ccq_boot_close(b);
    return 0;
}

/* A port another program holds (it listens and never answers; so does a stopped process 0,
 * whose kernel completes the handshake): a process's timeout says that its hello went
 * unanswered, not "connecting". In a child, as every process here: a boot opened in this
 * process would move the bootstrap generation the later tests' children inherit. */
static int unanswered_child(unsigned rank, unsigned size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[2] = {0, 1};
    uint64_t mine = 1, out[2];
    ccq_status st;
    (void)rank, (void)size, (void)arg;

    CHILD_CHECK(open_tcp(1, 2, &b, &err) == CCQ_OK, "open: %s", err.msg);
    st = ccq_boot_exchange(b, "all", all, 2, &mine, 8, out, deadline_ms(800), &err);
    CHILD_CHECK(st == CCQ_ERR_TIMEOUT && strstr(err.msg, "hello was never answered") != NULL,
                "%s: %s", ccq_status_name(st), err.msg);
    ccq_boot_close(b);
    return 0;
}

static void test_tcp_unanswered_hello(void **state)
{
    unsigned port = free_port();
    struct sockaddr_in a;
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    (void)state;

    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one), 0);
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(lfd, 8), 0); /* never accepted */
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%u", port);
    assert_int_equal(run_procs(1, unanswered_child, NULL), 0);
    close(lfd);
}

static void test_tcp_stopped_server(void **state)
{
    (void)state;
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%u", free_port());
    assert_int_equal(pipe(record_pipe), 0);
    assert_int_equal(run_procs(3, stopped_child, NULL), 0);
    close(record_pipe[0]);
    close(record_pipe[1]);
}

/* Ranks 1 and 2 turn heartbeats on at once and wait for an exchange; rank 0, which serves,
 * turns them on only after twice the silence bound (its process met the others later: a
 * sanitizer build's process 0 once took 2 s longer, and its clients took over from a running
 * server). Its server sent no keepalive in that time, which is not silence: nobody takes over,
 * nobody is lost, the exchange completes; and once its keepalives began, they keep the others
 * from taking over while nothing else is said. */
static int late_keepalive_child(unsigned rank, unsigned size, void *arg)
{
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[3] = {0, 1, 2}, ranks[4], by = 99;
    uint64_t mine = rank, out[3];
    const uint64_t hb = 50000000ull * CCQ_TEST_BEAT_SCALE,
                   silent = 500000000ull * CCQ_TEST_BEAT_SCALE;
    (void)arg;
    CHILD_CHECK(open_tcp(rank, size, &b, &err) == CCQ_OK, "open: %s", err.msg);
    if (rank == 0)
        sleep_ms((unsigned)(2 * silent / 1000000u));
    ccq_boot_beat_config(b, hb, silent);
    CHILD_CHECK(ccq_boot_exchange(b, "all", all, 3, &mine, 8, out, deadline_ms(20000), &err) ==
                        CCQ_OK &&
                    out[0] == 0 && out[1] == 1 && out[2] == 2,
                "all: %s", err.msg);
    /* Quiet for three silence bounds: only keepalives go. */
    sleep_ms((unsigned)(3 * silent / 1000000u));
    for (uint32_t r = 0; r < 3; r++)
        CHILD_CHECK(ccq_boot_peer_state(b, r) != CCQ_BOOT_PEER_LOST, "process %u lost", r);
    CHILD_CHECK(ccq_boot_silent_peers(b, ranks, 4) == 0, "silent: %u", ranks[0]);
    CHILD_CHECK(ccq_boot_closed_peers(b, ranks, 4) == 0, "closed: %u", ranks[0]);
    CHILD_CHECK(!ccq_boot_given_up(b, &by), "given up by %u", by);
    mine = rank + 10;
    CHILD_CHECK(ccq_boot_exchange(b, "end", all, 3, &mine, 8, out, deadline_ms(20000), &err) ==
                        CCQ_OK &&
                    out[0] == 10 && out[2] == 12,
                "end: %s", err.msg);
    ccq_boot_close(b);
    return 0;
}

static void test_tcp_late_keepalive(void **state)
{
    (void)state;
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%u", free_port());
    assert_int_equal(run_procs(3, late_keepalive_child, NULL), 0);
}

/* ---- the server's logic alone ----------------------------------------------------------- */

static void put_hello(ccq_tcp_server *s, int id, uint32_t rank)
{
    ccq_tcp_buf b = {0};
    uint32_t v[4] = {rank, 3, 0, 0};
    uint64_t nonce = rank + 1;
    ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_HELLO, v, 16, &nonce, 8, "job", 3);
    assert_true(ccq_tcp_server_input(s, id, b.p, b.len, 1));
    ccq_tcp_buf_free(&b);
}

/* A record of a world of 3 as the bootstrap writes it: header, tag, len zero bytes (*rl bytes
 * in all; free it). */
static uint8_t *test_record(uint32_t rank, const char *tag, uint32_t nmembers, uint64_t hash,
                            size_t len, size_t *rl)
{
    size_t tl = strlen(tag);
    uint8_t *rec = calloc(1, sizeof(ccq_boot_hdr) + tl + len);
    ccq_boot_hdr h;
    memset(&h, 0, sizeof h);
    h.magic = CCQ_BOOT_MAGIC;
    h.version = CCQ_BOOT_VERSION;
    h.hdr_size = sizeof h;
    h.world_size = 3;
    h.rank = rank;
    h.nmembers = nmembers;
    h.members_hash = hash;
    h.tag_len = (uint32_t)tl;
    h.len = len;
    memcpy(rec, &h, sizeof h);
    memcpy(rec + sizeof h, tag, tl);
    *rl = sizeof h + tl + len;
    return rec;
}

static void put_record(ccq_tcp_server *s, int id, uint32_t rank, const char *tag, size_t len)
{
    ccq_tcp_buf b = {0};
    uint16_t tl = (uint16_t)strlen(tag);
    size_t rl;
    uint8_t *rec = test_record(rank, tag, 3, 0, len, &rl);
    ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_PUT, &tl, 2, tag, tl, rec, rl);
    ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_GET, &tl, 2, tag, tl, NULL, 0);
    assert_true(ccq_tcp_server_input(s, id, b.p, b.len, 2));
    ccq_tcp_buf_free(&b);
    free(rec);
}

static void drain(ccq_tcp_server *s, int id)
{
    const uint8_t *p;
    size_t len;
    ccq_tcp_server_output(s, id, &p, &len);
    ccq_tcp_server_sent(s, id, len, 3);
}

static void test_tcp_server_memory(void **state)
{
    ccq_tcp_limits lim;
    ccq_tcp_server *s;
    int id[3];
    (void)state;

    ccq_tcp_default_limits(&lim, 3);
    lim.mem_max = 1u << 20;
    s = ccq_tcp_server_new("job", 3, 0, &lim);
    assert_non_null(s);
    for (uint32_t r = 0; r < 3; r++) {
        id[r] = ccq_tcp_server_open(s, 0);
        put_hello(s, id[r], r);
    }
    /* Exchanges every member finished with are forgotten: the memory comes back. */
    for (int k = 0; k < 100; k++) {
        char tag[32];
        snprintf(tag, sizeof tag, "x/%d", k);
        for (uint32_t r = 0; r < 3; r++)
            put_record(s, id[r], r, tag, 4000);
        for (uint32_t r = 0; r < 3; r++)
            drain(s, id[r]);
    }
    size_t after = ccq_tcp_server_memory(s);
    assert_true(after < 3 * 64 * 1024); /* buffers' capacity only, no records */
    /* Records nobody takes hit the memory bound and are refused, not kept. */
    for (int k = 0; k < 1000; k++) {
        char tag[32];
        snprintf(tag, sizeof tag, "held/%d", k);
        put_record(s, id[0], 0, tag, 4000);
        drain(s, id[0]);
    }
    assert_true(ccq_tcp_server_memory(s) < lim.mem_max + 3 * 64 * 1024);
    /* A process that goes: the others hear it. */
    ccq_tcp_server_closed(s, id[2], 4);
    {
        const uint8_t *p;
        size_t len;
        ccq_tcp_server_output(s, id[1], &p, &len);
        assert_true(len >= 12 + 8); /* a PEER frame */
    }
    ccq_tcp_server_free(s);
}

/* Heartbeats through the server: each process's latest goes to every other one; a reader
 * that does not read is sent only the newest of each (its queue stays one frame per process);
 * the records are bounded like the others. */
static void test_tcp_server_beats(void **state)
{
    ccq_tcp_limits lim;
    ccq_tcp_server *s;
    int id[3];
    uint8_t rec[1000];
    const uint8_t *p;
    size_t len, held;
    (void)state;

    ccq_tcp_default_limits(&lim, 3);
    s = ccq_tcp_server_new("job", 3, 0, &lim);
    assert_non_null(s);
    for (uint32_t r = 0; r < 3; r++) {
        id[r] = ccq_tcp_server_open(s, 0);
        put_hello(s, id[r], r);
        drain(s, id[r]);
    }
    held = ccq_tcp_server_memory(s);
    for (int k = 0; k < 1000; k++) {
        ccq_tcp_buf b = {0};
        memset(rec, k & 0xff, sizeof rec);
        ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_BEAT, rec, sizeof rec, NULL, 0, NULL, 0);
        assert_true(ccq_tcp_server_input(s, id[0], b.p, b.len, 2));
        ccq_tcp_buf_free(&b);
        drain(s, id[1]); /* process 1 reads; process 2 does not */
    }
    /* Process 2 holds the first beat queued and the newest due, nothing more. */
    ccq_tcp_server_output(s, id[2], &p, &len);
    assert_int_equal(len, 12 + 4 + sizeof rec);
    assert_int_equal(p[12 + 4], 0); /* the first beat */
    ccq_tcp_server_sent(s, id[2], len, 3);
    ccq_tcp_server_output(s, id[2], &p, &len);
    assert_int_equal(len, 12 + 4 + sizeof rec);
    assert_int_equal(p[12 + 4], 999 & 0xff); /* then the newest */
    ccq_tcp_server_sent(s, id[2], len, 3);
    ccq_tcp_server_output(s, id[2], &p, &len);
    assert_int_equal(len, 0);
    /* The server holds one record per process (and the buffers it had). */
    assert_true(ccq_tcp_server_memory(s) <= held + sizeof rec + 64 * 1024);
    /* A process that went cannot come back as the same world rank (a restarted process joins
     * a new job). */
    ccq_tcp_server_closed(s, id[2], 4);
    {
        ccq_tcp_buf b = {0};
        uint32_t v[4] = {2, 3, 0, 0};
        uint64_t nonce = 9;
        id[2] = ccq_tcp_server_open(s, 5);
        ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_HELLO, v, 16, &nonce, 8, "job", 3);
        assert_false(ccq_tcp_server_input(s, id[2], b.p, b.len, 5));
        ccq_tcp_buf_free(&b);
        ccq_tcp_server_output(s, id[2], &p, &len);
        assert_true(len > 12 && memmem(p, len, "was here", 8) != NULL);
    }
    ccq_tcp_server_free(s);
}

/* HAD (tcp_proto.h): a finished exchange offered to a server taking over, as
 * runtime/boot/tcp.c's server_lost sends it: u16 tag length, tag, u32 n, the members, record
 * (made for those members, or, hash not 0, for the members of that hash). */
static bool put_had(ccq_tcp_server *s, int id, uint32_t rank, const char *tag,
                    const uint32_t *members, uint32_t n, size_t len, uint64_t hash)
{
    ccq_tcp_buf b = {0};
    uint16_t tl = (uint16_t)strlen(tag);
    size_t rl, hl = 2u + tl + 4u + 4u * n;
    uint8_t *rec = test_record(rank, tag, n,
                               hash ? hash : ccq_boot_fnv1a(members, 4u * n, CCQ_FNV_OFFSET), len,
                               &rl),
            *head = malloc(hl);
    bool ok;
    memcpy(head, &tl, 2);
    memcpy(head + 2, tag, tl);
    memcpy(head + 2 + tl, &n, 4);
    memcpy(head + 6 + tl, members, 4u * n);
    ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_HAD, head, hl, rec, rl, NULL, 0);
    ok = ccq_tcp_server_input(s, id, b.p, b.len, 2);
    ccq_tcp_buf_free(&b);
    free(rec);
    free(head);
    return ok;
}

/* How many frames of each type (below 32) are in what the server has for id; then it is all
 * sent. */
typedef struct {
    int n[32];
} frame_counts;

static frame_counts sent_frames(ccq_tcp_server *s, int id)
{
    const uint8_t *p;
    size_t len, off = 0;
    frame_counts c = {{0}};
    ccq_tcp_server_output(s, id, &p, &len);
    while (off < len) {
        ccq_tcp_frame f;
        size_t used = 0;
        ccq_errbuf err;
        assert_int_equal(ccq_tcp_parse(p + off, len - off, SIZE_MAX, &f, &used, &err), 1);
        assert_true(f.type < 32);
        c.n[f.type]++;
        off += used;
    }
    drain(s, id);
    return c;
}

/* A server taking over from lost process 0 is offered the exchanges process 2 finished: process
 * 1, which had not, gets 2's record when it asks, 2 is sent nothing, and each exchange is
 * forgotten once every member still there is served (0, gone, never asks): ten of them within
 * a bound of two. One offered and never asked for stays until the member that did not ask
 * goes. Offers whose members do not include the sender or do not match the record are
 * refused. */
static void test_tcp_server_had(void **state)
{
    ccq_tcp_limits lim;
    ccq_tcp_server *s;
    int id[3];
    uint32_t all[3] = {0, 1, 2}, not_mine[2] = {0, 1}, just_2[1] = {2};
    char tag[32];
    frame_counts c1, c2;
    (void)state;

    ccq_tcp_default_limits(&lim, 3);
    lim.mem_max = 1280u << 10;
    s = ccq_tcp_server_new("job", 3, 0, &lim);
    assert_non_null(s);
    ccq_tcp_server_mark(s, 0, CCQ_BOOT_PEER_LOST);
    for (uint32_t r = 1; r < 3; r++) {
        id[r] = ccq_tcp_server_open(s, 0);
        put_hello(s, id[r], r);
        drain(s, id[r]);
    }
    for (int k = 0; k < 10; k++) {
        snprintf(tag, sizeof tag, "x/%d", k);
        assert_true(put_had(s, id[2], 2, tag, all, 3, 512u << 10, 0));
        put_record(s, id[1], 1, tag, 512u << 10);
        c1 = sent_frames(s, id[1]);
        c2 = sent_frames(s, id[2]);
        assert_int_equal(c1.n[CCQ_TCP_REC], 1);
        assert_int_equal(c1.n[CCQ_TCP_ERR], 0);
        assert_int_equal(c2.n[CCQ_TCP_REC], 0);
        assert_int_equal(c2.n[CCQ_TCP_ERR], 0);
    }
    /* Offered, never asked for: held (the bound refuses a third), until rank 1 goes. */
    assert_true(put_had(s, id[2], 2, "held/0", all, 3, 512u << 10, 0));
    assert_true(put_had(s, id[2], 2, "held/1", all, 3, 512u << 10, 0));
    assert_true(put_had(s, id[2], 2, "held/2", all, 3, 512u << 10, 0));
    assert_int_equal(sent_frames(s, id[2]).n[CCQ_TCP_ERR], 1);
    ccq_tcp_server_closed(s, id[1], 3);
    assert_true(put_had(s, id[2], 2, "held/3", all, 3, 512u << 10, 0));
    assert_true(put_had(s, id[2], 2, "held/4", all, 3, 512u << 10, 0));
    assert_int_equal(sent_frames(s, id[2]).n[CCQ_TCP_ERR], 0);
    /* Members without the sender; a member list the record was not made for. */
    assert_true(put_had(s, id[2], 2, "z/0", not_mine, 2, 8, 0));
    assert_int_equal(sent_frames(s, id[2]).n[CCQ_TCP_ERR], 1);
    assert_true(put_had(s, id[2], 2, "z/1", just_2, 1, 8, 12345)); /* not FNV-1a of {2} */
    assert_int_equal(sent_frames(s, id[2]).n[CCQ_TCP_ERR], 1);
    /* No members at all: malformed, the connection is refused. */
    {
        ccq_tcp_buf b = {0};
        uint8_t head[2 + 3 + 4] = {3, 0, 'z', '/', '2', 0, 0, 0, 0};
        ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_HAD, head, sizeof head, NULL, 0, NULL, 0);
        assert_false(ccq_tcp_server_input(s, id[2], b.p, b.len, 5));
        ccq_tcp_buf_free(&b);
        assert_int_equal(sent_frames(s, id[2]).n[CCQ_TCP_REFUSE], 1);
    }
    ccq_tcp_server_free(s);
}

/* Keepalives: off by default; on, a PING to each process sent nothing for the interval (one
 * that was sent something meanwhile gets none), and the server wakes for the next one. */
static void test_tcp_server_keepalive(void **state)
{
    ccq_tcp_limits lim;
    ccq_tcp_server *s;
    int id[3], gone[4], hush;
    const uint8_t *p;
    size_t len;
    uint64_t next, t = 1000000000ull;
    uint32_t rank = 99;
    uint16_t type;
    uint8_t rec[40] = {0};
    ccq_tcp_buf b = {0};
    (void)state;

    ccq_tcp_default_limits(&lim, 3);
    s = ccq_tcp_server_new("job", 3, 0, &lim);
    assert_non_null(s);
    for (uint32_t r = 0; r < 3; r++) {
        id[r] = ccq_tcp_server_open(s, 0);
        put_hello(s, id[r], r);
        drain(s, id[r]);
    }
    assert_int_equal(ccq_tcp_server_tick(s, t, gone, 4, &next), 0);
    ccq_tcp_server_output(s, id[0], &p, &len);
    assert_int_equal(len, 0);
    ccq_tcp_server_keepalive(s, 100);
    assert_int_equal(ccq_tcp_server_tick(s, t, gone, 4, &next), 0);
    assert_int_equal(next, t + 100);
    for (uint32_t r = 0; r < 3; r++) {
        ccq_tcp_server_output(s, id[r], &p, &len);
        assert_int_equal(len, CCQ_TCP_HDR);
        memcpy(&type, p + 6, 2);
        assert_int_equal(type, CCQ_TCP_PING);
        ccq_tcp_server_sent(s, id[r], len, t);
    }
    /* Process 0 beats at t + 50: 1 and 2 are sent its record, so at t + 120 only 0 is pinged. */
    ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_BEAT, rec, sizeof rec, NULL, 0, NULL, 0);
    assert_true(ccq_tcp_server_input(s, id[0], b.p, b.len, t + 50));
    ccq_tcp_buf_free(&b);
    drain(s, id[1]);
    drain(s, id[2]);
    assert_int_equal(ccq_tcp_server_tick(s, t + 120, gone, 4, &next), 0);
    assert_int_equal(next, t + 150);
    ccq_tcp_server_output(s, id[0], &p, &len);
    assert_int_equal(len, CCQ_TCP_HDR);
    for (int r = 1; r < 3; r++) {
        ccq_tcp_server_output(s, id[r], &p, &len);
        assert_int_equal(len, 0);
    }
    /* Members: a process that said HELLO; not once it said BYE, nor a connection without one. */
    assert_true(ccq_tcp_server_conn_member(s, id[1], &rank) && rank == 1);
    ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_BYE, NULL, 0, NULL, 0, NULL, 0);
    assert_true(ccq_tcp_server_input(s, id[2], b.p, b.len, t + 130));
    ccq_tcp_buf_free(&b);
    assert_false(ccq_tcp_server_conn_member(s, id[2], &rank));
    hush = ccq_tcp_server_open(s, t + 130);
    assert_false(ccq_tcp_server_conn_member(s, hush, &rank));
    ccq_tcp_server_free(s);
}

/* The type of the frame after `skip` whole frames in p[0..len) (0: none there). */
static uint16_t frame_type_at(const uint8_t *p, size_t len, unsigned skip)
{
    size_t off = 0;
    uint16_t type;
    uint32_t flen;
    for (;;) {
        if (off + CCQ_TCP_HDR > len)
            return 0;
        memcpy(&type, p + off + 6, 2);
        memcpy(&flen, p + off + 8, 4);
        if (skip-- == 0)
            return type;
        off += CCQ_TCP_HDR + flen;
    }
}

/* The first PING goes at once, whatever was queued just before (a client judges silence only
 * once it had one, tcp.c): to a member when keepalives begin, and right after the WELCOME of a
 * member that says HELLO while they are on, before anything an exchange sends it. */
static void test_tcp_server_first_ping(void **state)
{
    ccq_tcp_limits lim;
    ccq_tcp_server *s;
    int id[2], gone[4];
    const uint8_t *p;
    size_t len;
    uint64_t next, t = 1000000000ull;
    (void)state;

    ccq_tcp_default_limits(&lim, 3);
    s = ccq_tcp_server_new("job", 3, 0, &lim);
    assert_non_null(s);
    id[0] = ccq_tcp_server_open(s, t);
    put_hello(s, id[0], 0);
    ccq_tcp_server_output(s, id[0], &p, &len);
    assert_int_equal(frame_type_at(p, len, 0), CCQ_TCP_WELCOME);
    assert_int_equal(frame_type_at(p, len, 1), 0); /* keepalives off: no PING */
    ccq_tcp_server_sent(s, id[0], len, t);
    ccq_tcp_server_keepalive(s, 100000000ull);
    /* Something was queued 0 ns ago: a later PING would wait 100 ms, the first goes now. */
    assert_int_equal(ccq_tcp_server_tick(s, t, gone, 4, &next), 0);
    ccq_tcp_server_output(s, id[0], &p, &len);
    assert_int_equal(frame_type_at(p, len, 0), CCQ_TCP_PING);
    ccq_tcp_server_sent(s, id[0], len, t);
    assert_int_equal(ccq_tcp_server_tick(s, t + 1, gone, 4, &next), 0);
    ccq_tcp_server_output(s, id[0], &p, &len);
    assert_int_equal(len, 0); /* then every keepalive_ns */
    assert_int_equal(next, t + 100000000ull);
    id[1] = ccq_tcp_server_open(s, t + 2);
    put_hello(s, id[1], 1);
    ccq_tcp_server_output(s, id[1], &p, &len);
    assert_int_equal(frame_type_at(p, len, 0), CCQ_TCP_WELCOME);
    assert_int_equal(frame_type_at(p, len, 1), CCQ_TCP_PING);
    ccq_tcp_server_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        /* clang-format off */
        cmocka_unit_test(test_tcp_worlds),
        cmocka_unit_test(test_tcp_generations),
        cmocka_unit_test(test_tcp_refused_record),
        cmocka_unit_test(test_tcp_any_interface),
        cmocka_unit_test(test_tcp_refusals),
        cmocka_unit_test(test_tcp_hostile_clients),
        cmocka_unit_test(test_tcp_server_leave_drains),
        cmocka_unit_test(test_tcp_peers),
        cmocka_unit_test(test_tcp_server_memory),
        cmocka_unit_test(test_tcp_server_beats),
        cmocka_unit_test(test_tcp_server_had),
        cmocka_unit_test(test_tcp_record_at_takeover),
        cmocka_unit_test(test_tcp_finished_at_takeover),
        cmocka_unit_test(test_tcp_stopped_server),
        cmocka_unit_test(test_tcp_unanswered_hello),
        cmocka_unit_test(test_tcp_late_keepalive),
        cmocka_unit_test(test_tcp_server_keepalive),
        cmocka_unit_test(test_tcp_server_first_ping),
        /* clang-format on */
    };
    /* CCQ_TEST_FILTER=pattern runs only the matching tests (cmocka's wildcard syntax). */
    const char *filter = getenv("CCQ_TEST_FILTER");
    if (filter != NULL && *filter != '\0')
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
