/* The tcp rendezvous and the addresses a HOST names: what a name resolves to differs between
 * machines and between families, and every process must still meet process 0.
 *
 * A name that resolves to several addresses is made here without DNS: this program defines
 * getaddrinfo (the library is linked in statically, so its calls bind to this one), answers
 * for the names below as a resolver would (each machine its own answer: process 0's lookup to
 * listen, AI_PASSIVE, is told where "its" machine's hosts file points) and passes every other
 * name to the C library's. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/boot/bootstrap.h"
#include "child_check.h"
#include "free_port.h"
#include "procs.h"

/* ---- the resolver ------------------------------------------------------------------------ */

/* The first address refuses (nobody listens on 127.0.0.3), the second is process 0's. */
#define NAME_REFUSED_FIRST "ccq-refused-first.test"
/* The first address never answers (a listener whose queue is full drops the SYN), the second
 * is process 0's. */
#define NAME_SILENT_FIRST "ccq-silent-first.test"
#define SILENT_ADDR       "127.0.0.4"
/* Not resolvable for its first two seconds in each process (a Kubernetes headless service's
 * record appears after its pod starts), then 127.0.0.1. */
#define NAME_LATE "ccq-late.test"

static char own_name[256]; /* this machine's name: 127.0.1.1 on process 0's (Debian's hosts) */

typedef int (*gai_fn)(const char *, const char *, const struct addrinfo *, struct addrinfo **);

/* The addresses a name resolves to, NULL-terminated; NULL: not a name of this test. */
static const char *const *fake_answer(const char *node, const struct addrinfo *hints)
{
    static const char *const refused_first[] = {"127.0.0.3", "127.0.0.1", NULL};
    static const char *const silent_first[] = {SILENT_ADDR, "127.0.0.1", NULL};
    static const char *const loopback[] = {"127.0.0.1", NULL};
    static const char *const debian_own[] = {"127.0.1.1", NULL};
    bool passive = hints != NULL && (hints->ai_flags & AI_PASSIVE);

    if (node == NULL)
        return NULL;
    /* Process 0 listens where its machine says the name is: the loopback address. */
    if (strcmp(node, NAME_REFUSED_FIRST) == 0 || strcmp(node, NAME_SILENT_FIRST) == 0)
        return passive                                 ? loopback
               : strcmp(node, NAME_REFUSED_FIRST) == 0 ? refused_first
                                                       : silent_first;
    /* Process 0's machine names itself 127.0.1.1 (Debian's and Ubuntu's /etc/hosts); every
     * other machine's resolver gives its network address (here 127.0.0.1). */
    if (own_name[0] != '\0' && strcmp(node, own_name) == 0)
        return passive ? debian_own : loopback;
    return NULL;
}

/* NAME_LATE: whether it resolves yet (the first lookup in this process starts the clock). */
static bool late_name_resolves(void)
{
    static struct timespec first;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (first.tv_sec == 0)
        first = now;
    return now.tv_sec - first.tv_sec >= 2;
}

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    static gai_fn real;
    const char *const *answer = fake_answer(node, hints);
    struct addrinfo h, *head = NULL, **tail = &head;

    if (real == NULL)
        real = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");
    if (node != NULL && strcmp(node, NAME_LATE) == 0) {
        static const char *const loopback[] = {"127.0.0.1", NULL};
        if (!(hints != NULL && (hints->ai_flags & AI_PASSIVE)) && !late_name_resolves())
            return EAI_NONAME;
        answer = loopback;
    }
    if (answer == NULL)
        return real(node, service, hints, res);
    memset(&h, 0, sizeof h);
    if (hints != NULL)
        h = *hints;
    h.ai_flags |= AI_NUMERICHOST;
    for (; *answer != NULL; answer++) {
        struct addrinfo *one = NULL;
        int rc = real(*answer, service, &h, &one);
        if (rc != 0) {
            freeaddrinfo(head);
            return rc;
        }
        *tail = one;
        while (*tail != NULL)
            tail = &(*tail)->ai_next;
    }
    *res = head;
    return 0;
}

/* ---- the worlds -------------------------------------------------------------------------- */

typedef struct {
    const char *spec[4]; /* each process's bootstrap */
    uint64_t deadline_ms;
} world_args;

/* Every process meets the others through its own spec, exchanges, and closes. */
static int meet_child(unsigned rank, unsigned size, void *arg)
{
    const world_args *w = arg;
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[4] = {0, 1, 2, 3};
    uint64_t mine = 1000u + rank, out[4];
    ccq_status st;

    CHILD_CHECK(ccq_boot_open(w->spec[rank], NULL, -1, rank, size, &b, &err) == CCQ_OK,
                "open %s: %s", w->spec[rank], err.msg);
    st = ccq_boot_exchange(b, "w", all, size, &mine, sizeof mine, out,
                           ccq_boot_now_ns() + w->deadline_ms * 1000000ull, &err);
    CHILD_CHECK(st == CCQ_OK, "process %u (%s): %s: %s", rank, w->spec[rank], ccq_status_name(st),
                err.msg);
    for (unsigned p = 0; p < size; p++)
        CHILD_CHECK(out[p] == 1000u + p, "out[%u] %llu", p, (unsigned long long)out[p]);
    ccq_boot_close(b);
    return 0;
}

static int meet(unsigned n, world_args *w)
{
    int status[4];
    return procs_run(n, meet_child, w, 60, status);
}

/* Whether this machine can listen on IPv6's loopback (some containers have no IPv6). */
static bool ipv6_loopback(void)
{
    struct sockaddr_in6 sa = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int fd = socket(AF_INET6, SOCK_STREAM, 0), ok;
    if (fd < 0)
        return false;
    ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(fd, 1) == 0;
    close(fd);
    return ok;
}

/* Process 0 on "*" serves both families: a process given its IPv6 address and one given its
 * IPv4 address meet it (it listened on IPv4 alone: the IPv6 one was refused until its
 * deadline). */
static void test_tcp_any_serves_ipv6(void **state)
{
    char s0[64], s6[64], s4[64];
    unsigned port = (unsigned)ccq_test_free_port();
    world_args w = {{s0, s6, s4}, 15000};
    (void)state;
    if (!ipv6_loopback())
        skip();
    snprintf(s0, sizeof s0, "tcp://*:%u", port);
    snprintf(s6, sizeof s6, "tcp://[::1]:%u", port);
    snprintf(s4, sizeof s4, "tcp://127.0.0.1:%u", port);
    assert_int_equal(meet(3, &w), 0);
}

/* A name whose first address refuses: the processes try the next one (they tried the first
 * again and again until their deadline). */
static void test_tcp_every_address(void **state)
{
    char s[96];
    world_args w = {{s, s, s}, 15000};
    (void)state;
    snprintf(s, sizeof s, "tcp://" NAME_REFUSED_FIRST ":%d", ccq_test_free_port());
    assert_int_equal(meet(3, &w), 0);
}

/* A name that does not resolve yet when the processes start: they look it up again until it
 * does (the first failure left the connecting thread asleep until something else woke it: the
 * exchange waited for its deadline). */
static void test_tcp_name_resolves_late(void **state)
{
    char s[96];
    world_args w = {{s, s, s}, 15000};
    (void)state;
    snprintf(s, sizeof s, "tcp://" NAME_LATE ":%d", ccq_test_free_port());
    assert_int_equal(meet(3, &w), 0);
}

/* A name whose first address never answers (a firewall that drops, a route to nowhere): a
 * connection that does not complete in a few seconds gives way to the next address (it waited
 * for the kernel to give up, about two minutes, then tried the same address again). */
static void test_tcp_silent_address(void **state)
{
    char s[96];
    int port = ccq_test_free_port();
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int lfd = socket(AF_INET, SOCK_STREAM, 0), fill[4];
    world_args w = {{s, s}, 20000};
    (void)state;

    /* A listener that never accepts, its queue full: further connections hang in SYN_SENT. */
    inet_pton(AF_INET, SILENT_ADDR, &sa.sin_addr);
    assert_true(lfd >= 0);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, 0) != 0) {
        close(lfd);
        skip(); /* 127.0.0.4 is not this machine's (not Linux's loopback /8) */
    }
    for (int i = 0; i < 4; i++) {
        fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        (void)connect(fill[i], (struct sockaddr *)&sa, sizeof sa);
    }
    snprintf(s, sizeof s, "tcp://" NAME_SILENT_FIRST ":%d", port);
    assert_int_equal(meet(2, &w), 0);
    for (int i = 0; i < 4; i++)
        close(fill[i]);
    close(lfd);
}

/* Over IPv6, process 0 (which serves) dies and the others go on through a successor: every
 * process listens on IPv6 too and says its IPv6 address (they listened on IPv4 alone and said
 * nothing over IPv6: "no surviving process can serve in its place"). Process 0 dies once the
 * others have its record (told through a pipe). */
static int takeover_pipe[2];

static int takeover_child(unsigned rank, unsigned size, void *arg)
{
    const world_args *w = arg;
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[3] = {0, 1, 2}, two[2] = {1, 2};
    uint64_t mine = rank, out[3];
    ccq_status st;

    CHILD_CHECK(ccq_boot_open(w->spec[rank], NULL, -1, rank, size, &b, &err) == CCQ_OK, "open: %s",
                err.msg);
    st = ccq_boot_exchange(b, "all", all, 3, &mine, 8, out, ccq_boot_now_ns() + 15000000000ull,
                           &err);
    CHILD_CHECK(st == CCQ_OK, "all: %s", err.msg);
    if (rank == 0) {
        char got[2];
        CHILD_CHECK(read(takeover_pipe[0], got, 1) == 1 && read(takeover_pipe[0], got, 1) == 1,
                    "pipe");
        _exit(0); /* no goodbye: lost */
    }
    CHILD_CHECK(write(takeover_pipe[1], "a", 1) == 1, "pipe");
    /* Once its loss is seen: "two" then goes through the successor, not process 0. */
    for (int i = 0; i < 1000 && ccq_boot_peer_state(b, 0) != CCQ_BOOT_PEER_LOST; i++)
        usleep(10000);
    CHILD_CHECK(ccq_boot_peer_state(b, 0) == CCQ_BOOT_PEER_LOST, "process 0 not lost in 10 s");
    st = ccq_boot_exchange(b, "two", two, 2, &mine, 8, out, ccq_boot_now_ns() + 15000000000ull,
                           &err);
    CHILD_CHECK(st == CCQ_OK && out[0] == 1 && out[1] == 2, "two: %s: %s", ccq_status_name(st),
                err.msg);
    ccq_boot_close(b);
    return 0;
}

static void test_tcp_takeover_ipv6(void **state)
{
    char s[64];
    world_args w = {{s, s, s}, 15000};
    int status[3];
    (void)state;
    if (!ipv6_loopback())
        skip();
    snprintf(s, sizeof s, "tcp://[::1]:%d", ccq_test_free_port());
    assert_int_equal(pipe(takeover_pipe), 0);
    assert_int_equal(procs_run(3, takeover_child, &w, 60, status), 0);
    close(takeover_pipe[0]);
    close(takeover_pipe[1]);
}

/* Details name an IPv6 rendezvous as a user writes it, in brackets: "[::1]:PORT" (they said
 * "::1:PORT", where the port reads as part of the address). Process 1 of 2, process 0 never
 * there: its exchange times out, saying where it tried to connect. */
static int brackets_child(unsigned rank, unsigned size, void *arg)
{
    const char *spec = arg;
    char want[48];
    ccq_boot *b;
    ccq_errbuf err = {{0}};
    uint32_t all[2] = {0, 1};
    uint64_t mine = 1, out[2];
    ccq_status st;
    (void)rank;
    (void)size;

    snprintf(want, sizeof want, "connecting to [::1]:%s", strrchr(spec, ':') + 1);
    CHILD_CHECK(ccq_boot_open(spec, NULL, -1, 1, 2, &b, &err) == CCQ_OK, "open: %s", err.msg);
    st = ccq_boot_exchange(b, "x", all, 2, &mine, 8, out, ccq_boot_now_ns() + 1500000000ull, &err);
    ccq_boot_close(b);
    CHILD_CHECK(st != CCQ_OK && strstr(err.msg, want) != NULL, "%s: the detail does not say %s: %s",
                ccq_status_name(st), want, err.msg);
    return 0;
}

static void test_tcp_ipv6_named_in_brackets(void **state)
{
    char s[64];
    int status[1];
    (void)state;
    if (!ipv6_loopback())
        skip();
    snprintf(s, sizeof s, "tcp://[::1]:%d", ccq_test_free_port());
    assert_int_equal(procs_run(1, brackets_child, s, 30, status), 0);
}

/* Process 0 given its own machine's name, which that machine's hosts file points at a
 * loopback address (Debian and Ubuntu write "127.0.1.1 HOSTNAME"), while the others resolve
 * it to the machine's network address: process 0 listens on every interface (it listened on
 * 127.0.1.1, where nobody else can reach it: refused until the deadline). */
static void test_tcp_own_name_loopback(void **state)
{
    char s[320];
    world_args w = {{s, s, s}, 15000};
    (void)state;
    if (gethostname(own_name, sizeof own_name - 1) != 0 || own_name[0] == '\0')
        skip();
    snprintf(s, sizeof s, "tcp://%s:%d", own_name, ccq_test_free_port());
    assert_int_equal(meet(3, &w), 0);
    own_name[0] = '\0';
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_any_serves_ipv6),
        cmocka_unit_test(test_tcp_every_address),
        cmocka_unit_test(test_tcp_silent_address),
        cmocka_unit_test(test_tcp_own_name_loopback),
        cmocka_unit_test(test_tcp_takeover_ipv6),
        cmocka_unit_test(test_tcp_ipv6_named_in_brackets),
        cmocka_unit_test(test_tcp_name_resolves_late),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
