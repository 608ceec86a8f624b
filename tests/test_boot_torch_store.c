/* "torchstore://HOST:PORT": processes meet through torch's TCPStore, as under torchrun, whose
 * agent serves it at MASTER_ADDR:MASTER_PORT (so ccq's rendezvous cannot listen there):
 * process 0 serves the rendezvous on a port of its own and says which in the store.
 *
 * torch is not installed where CI runs, so the store here is a stand-in that speaks what
 * runtime/boot/torch_store.c sends (VALIDATE, SET, CHECK, GET, as a torch 2.5.1 client does),
 * in a process of its own, and refuses anything else by closing the connection as torch's
 * server does. tests/torchrun_world.sh runs the real torchrun where torch is installed. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/boot/bootstrap.h"
#include "child_check.h"
#include "free_port.h"
#include "procs.h"

/* ---- the stand-in store ------------------------------------------------------------------- */

#define KEYS   16
#define CONNS  16
#define BUFMAX 4096

static struct {
    char key[300];
    char val[64];
    size_t vlen;
} keys[KEYS];
static int nkeys;

static int find_key(const char *k)
{
    for (int i = 0; i < nkeys; i++)
        if (strcmp(keys[i].key, k) == 0)
            return i;
    return -1;
}

static uint64_t u64_at(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* A length-prefixed string at p (have bytes): its length in *n, or false when incomplete. */
static bool str_at(const uint8_t *p, size_t have, char *out, size_t cap, size_t *used)
{
    uint64_t len;
    if (have < 8)
        return false;
    len = u64_at(p);
    if (len >= cap || have < 8 + len)
        return false;
    memcpy(out, p + 8, len);
    out[len] = '\0';
    *used = 8 + len;
    return true;
}

/* One query from buf: the bytes it took (0: incomplete), or -1 to close the connection. */
static long serve_query(int fd, const uint8_t *buf, size_t have, bool *validated)
{
    char k[300], v[64];
    size_t a = 0, b = 0;
    int i;

    if (have < 1)
        return 0;
    if (!*validated) { /* torch's server: the first query must be VALIDATE and its magic */
        if (have < 5)
            return 0;
        if (buf[0] != 0 || buf[1] != 0xCE || buf[2] != 0xF7 || buf[3] != 0x85 || buf[4] != 0x3C)
            return -1;
        *validated = true;
        return 5;
    }
    switch (buf[0]) {
    case 1: /* SET key value */
        if (!str_at(buf + 1, have - 1, k, sizeof k, &a) ||
            !str_at(buf + 1 + a, have - 1 - a, v, sizeof v, &b))
            return 0;
        i = find_key(k);
        if (i < 0 && nkeys < KEYS)
            i = nkeys++;
        if (i >= 0) {
            snprintf(keys[i].key, sizeof keys[i].key, "%s", k);
            memcpy(keys[i].val, v, b - 8);
            keys[i].vlen = b - 8;
        }
        return (long)(1 + a + b);
    case 5: { /* CHECK n keys: one key here */
        uint8_t answer;
        if (have < 9)
            return 0;
        if (u64_at(buf + 1) != 1)
            return -1;
        if (!str_at(buf + 9, have - 9, k, sizeof k, &a))
            return 0;
        answer = find_key(k) >= 0 ? 0 : 1;
        if (send(fd, &answer, 1, MSG_NOSIGNAL) != 1)
            return -1;
        return (long)(9 + a);
    }
    case 3: { /* GET key: its value (torch's server fails a missing one: closes) */
        uint8_t out[8 + 64];
        if (!str_at(buf + 1, have - 1, k, sizeof k, &a))
            return 0;
        i = find_key(k);
        if (i < 0)
            return -1;
        for (int j = 0; j < 8; j++)
            out[j] = (uint8_t)((uint64_t)keys[i].vlen >> (8 * j));
        memcpy(out + 8, keys[i].val, keys[i].vlen);
        if (send(fd, out, 8 + keys[i].vlen, MSG_NOSIGNAL) != (ssize_t)(8 + keys[i].vlen))
            return -1;
        return (long)(1 + a);
    }
    default:
        return -1;
    }
}

/* The store's process: serve on 127.0.0.1:port until killed; stale keys first (k=v pairs). */
static void store_main(int port, const char *const *stale)
{
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct pollfd pf[1 + CONNS];
    static uint8_t in[CONNS][BUFMAX];
    size_t have[CONNS] = {0};
    bool validated[CONNS] = {false};
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

    for (; stale != NULL && stale[0] != NULL; stale += 2) {
        snprintf(keys[nkeys].key, sizeof keys[nkeys].key, "%s", stale[0]);
        keys[nkeys].vlen = strlen(stale[1]);
        memcpy(keys[nkeys].val, stale[1], keys[nkeys].vlen);
        nkeys++;
    }
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, 64) != 0)
        _exit(3);
    pf[0].fd = lfd;
    pf[0].events = POLLIN;
    for (int c = 0; c < CONNS; c++)
        pf[1 + c].fd = -1;
    for (;;) {
        if (poll(pf, 1 + CONNS, -1) < 0 && errno != EINTR)
            _exit(4);
        if (pf[0].revents & POLLIN) {
            int fd = accept(lfd, NULL, NULL);
            for (int c = 0; c < CONNS && fd >= 0; c++)
                if (pf[1 + c].fd < 0) {
                    pf[1 + c].fd = fd;
                    pf[1 + c].events = POLLIN;
                    have[c] = 0;
                    validated[c] = false;
                    fd = -1;
                }
            if (fd >= 0)
                close(fd);
        }
        for (int c = 0; c < CONNS; c++) {
            ssize_t k;
            long took;
            if (pf[1 + c].fd < 0 || !(pf[1 + c].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            k = recv(pf[1 + c].fd, in[c] + have[c], BUFMAX - have[c], 0);
            if (k <= 0)
                goto drop;
            have[c] += (size_t)k;
            while ((took = serve_query(pf[1 + c].fd, in[c], have[c], &validated[c])) > 0) {
                memmove(in[c], in[c] + took, have[c] - (size_t)took);
                have[c] -= (size_t)took;
            }
            if (took == 0 && have[c] < BUFMAX)
                continue;
        drop:
            close(pf[1 + c].fd);
            pf[1 + c].fd = -1;
        }
    }
}

static pid_t store_start(int port, const char *const *stale)
{
    pid_t pid;
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test (killed at its timeout) */
        store_main(port, stale);
    }
    assert_true(pid > 0);
    for (int i = 0; i < 200 && ccq_test_port_free(port); i++)
        usleep(10000); /* listening */
    return pid;
}

static void store_stop(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* ---- the worlds --------------------------------------------------------------------------- */

typedef struct {
    char spec[96];
    unsigned late_ms; /* process 0 starts this late */
} world_args;

static int meet_child(unsigned rank, unsigned size, void *arg)
{
    const world_args *w = arg;
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[4] = {0, 1, 2, 3};
    uint64_t mine = 500u + rank, out[4];
    ccq_status st;

    if (rank == 0)
        usleep(w->late_ms * 1000u);
    CHILD_CHECK(ccq_boot_open(w->spec, NULL, -1, rank, size, &b, &err) == CCQ_OK, "open %s: %s",
                w->spec, err.msg);
    st = ccq_boot_exchange(b, "w", all, size, &mine, sizeof mine, out,
                           ccq_boot_now_ns() + 15000000000ull, &err);
    CHILD_CHECK(st == CCQ_OK, "process %u: %s: %s", rank, ccq_status_name(st), err.msg);
    for (unsigned p = 0; p < size; p++)
        CHILD_CHECK(out[p] == 500u + p, "out[%u]", p);
    ccq_boot_close(b);
    return 0;
}

/* Three processes meet through the store; process 0 comes a second after the others, which
 * look for its port until it is there (a retry after a look that found nothing was left
 * asleep: they waited for the deadline). */
static void test_torch_store_world(void **state)
{
    int port = ccq_test_free_port(), status[3];
    pid_t store = store_start(port, NULL);
    world_args w = {.late_ms = 1000};
    (void)state;
    setenv("TORCHELASTIC_RESTART_COUNT", "0", 1);
    setenv("CCQ_JOB_ID", "ts-world", 1);
    snprintf(w.spec, sizeof w.spec, "torchstore://127.0.0.1:%d", port);
    int bad = procs_run(3, meet_child, &w, 60, status);
    store_stop(store); /* first: a store left running would hold the test's output open */
    assert_int_equal(bad, 0);
}

/* torchrun restarted the job: the store still holds the first attempt's port, of a process 0
 * long gone; the second attempt's processes meet on their own (its key names the restart). */
static void test_torch_store_restart(void **state)
{
    int port = ccq_test_free_port(), status[2];
    static const char *const stale[] = {"ccq/rendezvous/ts-restart/0/0", "9", NULL};
    pid_t store = store_start(port, stale);
    world_args w = {.late_ms = 1000};
    (void)state;
    setenv("TORCHELASTIC_RESTART_COUNT", "1", 1);
    setenv("CCQ_JOB_ID", "ts-restart", 1);
    snprintf(w.spec, sizeof w.spec, "torchstore://127.0.0.1:%d", port);
    int bad = procs_run(2, meet_child, &w, 60, status);
    store_stop(store); /* first: a store left running would hold the test's output open */
    assert_int_equal(bad, 0);
}

/* Without a store at that address, process 0 fails at once, naming it. */
static void test_torch_store_absent(void **state)
{
    char spec[96];
    ccq_boot *b = NULL;
    ccq_errbuf err = {{0}};
    ccq_status st;
    (void)state;
    snprintf(spec, sizeof spec, "torchstore://127.0.0.1:%d", ccq_test_free_port());
    st = ccq_boot_open(spec, NULL, -1, 0, 2, &b, &err);
    assert_int_equal(st, CCQ_ERR_BACKEND);
    assert_non_null(strstr(err.msg, "cannot say where it serves"));
    assert_non_null(strstr(err.msg, "torch's store at 127.0.0.1"));
}

/* Under torchrun (its agent's store at MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True) the
 * bootstrap from its variables goes through the store; without the agent's, ccq listens there. */
static void test_torch_store_from_env(void **state)
{
    const char *spec;
    (void)state;
    setenv("MASTER_ADDR", "10.1.2.3", 1);
    setenv("MASTER_PORT", "29511", 1);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    spec = ccq_boot_spec_from_env();
    assert_non_null(spec);
    assert_string_equal(spec, "torchstore://10.1.2.3:29511");
    setenv("TORCHELASTIC_USE_AGENT_STORE", "False", 1);
    assert_string_equal(ccq_boot_spec_from_env(), "tcp://10.1.2.3:29511");
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    assert_string_equal(ccq_boot_spec_from_env(), "tcp://10.1.2.3:29511");
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_torch_store_world),
        cmocka_unit_test(test_torch_store_restart),
        cmocka_unit_test(test_torch_store_absent),
        cmocka_unit_test(test_torch_store_from_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
