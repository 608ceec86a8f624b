/* The "tcp://HOST:PORT" bootstrap: world rank 0 serves a rendezvous at HOST:PORT (every
 * interface when HOST is "*"), every process (rank 0 too) connects to it and stays connected
 * for the job. A process publishes its record of an exchange (PUT) and asks for the others'
 * (GET); rank 0's server relays them (tcp_server.c holds the protocol and its limits). A
 * closed connection is how rank 0 learns that a process died, and how the others learn that
 * rank 0 did; rank 0 tells everyone of the others (ccq_boot_peer_state,
 * ccq_boot_watch_peers, and for job health ccq_boot_closed_peers: each process whose
 * connection closed without a goodbye, once). Heartbeat records (runtime/health/) travel
 * over the same connection: each process sends its own, rank 0 passes on the latest of
 * each to every other process, which keeps the latest of each here.
 *
 * A stopped server (SIGSTOP, a hung host) keeps its connections open: with heartbeats on
 * (ccq_boot_beat_config) it sends every process something at least every heartbeat_ms, and a
 * process that hears nothing from it for heartbeat_timeout_ms, once it had a PING from it
 * (the first goes at once: tcp_server.c, ping_now), takes over as for a closed connection
 * (server_lost), reporting it as silent (ccq_boot_silent_peers). The server, when it
 * runs again, notices the gap in its own run; a client's connection that closes then is checked
 * with the successor before anyone is reported lost (ask_successor): when the others gave this
 * process up, it stops serving and is fenced off (ccq_boot_given_up).
 *
 * Threads: each handle runs one I/O thread, asleep in poll() while nothing moves. It owns the
 * sockets; the bootstrap's calls (with the handle's lock held) only queue output and read
 * what the thread received, under this mechanism's own mutex `mu` (order: the handle's lock,
 * then mu; the thread takes mu only, and calls the peer watcher holding neither). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/thread_name.h"
#include "runtime/boot/boot_impl.h"
#include "runtime/boot/tcp_proto.h"
#include "runtime/boot/torch_store.h"

/* How long close() lets the I/O thread flush a goodbye (and rank 0 its last notices). */
#define LINGER_NS (200u * 1000000u)
/* ...and up to this long to see the server take its goodbye (drain_close; a server thread
 * starved on a loaded machine may take that long to read it: closing sooner can reset the
 * connection with the goodbye unread, and the others then hear of a loss). Only a server that
 * does not read makes close wait that long. */
#define DRAIN_MIN_NS (1000u * 1000000u)
/* Connecting to a rendezvous not up yet: retry after this, doubling up to RETRY_MAX_NS. */
#define RETRY_NS     (10u * 1000000u)
#define RETRY_MAX_NS (200u * 1000000u)
/* A connection not up after this gives way to the next address the name resolves to (a
 * firewall that drops, a route to nowhere: the kernel would try for about two minutes). */
#define CONNECT_TRY_NS (3000u * 1000000u)
/* A client's queue of frames not sent yet (its own records and requests). */
#define CLIENT_OUT_MAX (64u << 20)
/* The longest a continued server waits for its successor's answer (ask_successor). */
#define ASK_MAX_NS (2000u * 1000000ull)
/* Exchanges finished here whose records a server taking over is offered (HAD): the latest
 * this many, up to this many bytes. Only a member that was not sent a record before the
 * server was lost needs it, so only exchanges that finished just before count; a member
 * so far behind that it needs an older one (stopped for that long) waits until its deadline. */
#define KEPT_MAX       64u
#define KEPT_BYTES_MAX (4u << 20)

enum { C_IDLE, C_CONNECTING, C_HELLO, C_READY, C_FAILED, C_CLOSED };

typedef struct mail {
    struct mail *next;
    char *tag;
    uint32_t rank;
    uint8_t *rec;
    size_t len;
} mail;

/* An exchange this process published and has not freed: re-sent to a server taking over. Or,
 * kept, one it finished: offered to a server taking over (HAD, its head made when kept). */
typedef struct open_xchg {
    struct open_xchg *next;
    char *tag;
    uint8_t *rec;
    size_t len;
    uint8_t *had_head; /* kept: u16 tag length, tag, u32 n, the n members */
    size_t had_len;
} open_xchg;

typedef struct dead_tag {
    struct dead_tag *next;
    char *tag;
    char *why; /* NULL: the exchange was freed here (its late records are dropped) */
} dead_tag;

typedef struct tcp_boot {
    /* Fixed after open. */
    uint32_t rank, size, gen;
    uint64_t nonce;
    char job[256];
    char host[256], port[16]; /* where the rendezvous is (rank 0: where it connects itself) */
    /* "torchstore://": torch's store, where process 0 says its port (port "" until read). */
    char store_host[256], store_port[16], store_key[320];
    int store_fd; /* the I/O thread's connection to it while it looks, -1 */
    char spec[300];
    ccq_tcp_limits lim;
    int wake[2];
    pthread_t thread;
    bool thread_started;
    /* The I/O thread's own. */
    int fd;            /* connection to the rendezvous, -1 */
    int listen_fd;     /* the listening socket (every process: one serves if the server is lost) */
    uint16_t own_port; /* where listen_fd listens (ranks other than 0) */
    bool own_v6;       /* listen_fd takes IPv6 (and IPv4) connections, not IPv4's alone */
    bool addr_told;    /* its ADDR went to a server: the others may pick it to serve */
    ccq_tcp_server *srv;
    int *srv_fd;      /* [conns_max]: the socket of each server connection id */
    size_t peak_held; /* the most the server held (CCQ_TCP_STATS prints it) */
    ccq_tcp_buf in;   /* client: bytes received, not parsed yet */
    ccq_tcp_buf hello;
    uint64_t retry_at, retry_ns;
    unsigned addr_turn;      /* client: the address of host's to try next (its index, mod n) */
    unsigned addr_left;      /* ...and how many of this round are untried (0: a new round) */
    uint64_t connect_until;  /* C_CONNECTING: when this address gives way to the next */
    char addr_text[64];      /* the numeric address tried last (its errors name it) */
    uint64_t last_recv_ns;   /* client: when the server last sent anything (the silence check) */
    bool server_pinged;      /* client: the server it is connected to sent a PING (judge_silence) */
    _Atomic uint64_t lag_ns; /* ccq_boot_fault_lag: 0 (drills only) */
    uint64_t suspect_until;  /* server: after a gap in this thread's run, closes are checked */
    bool given_up;           /* the others gave this process up: stop serving, fence off */
    uint64_t ran_ns;         /* when this thread last ran (note_run; ask_successor's answer) */
    /* Shared, under mu. */
    pthread_mutex_t mu;
    int state;          /* C_* */
    ccq_status fail_st; /* C_FAILED: what exchanges fail with */
    char why[512];      /* C_FAILED, C_CLOSED, or the last attempt's error */
    ccq_tcp_buf out;    /* frames for the server, sent once WELCOMEd */
    mail *mail;
    dead_tag *dead;
    uint8_t *peer;     /* [size] ccq_boot_peer */
    uint8_t *reported; /* [size] LOST told by closed_peers already */
    struct {
        uint8_t *rec; /* NULL: none yet */
        size_t len;
    } * beats; /* [size]: each process's latest heartbeat record */
    struct {
        uint8_t *rec; /* NULL: none published yet */
        size_t len;
    } mine; /* this process's latest record: sent again to a successor (server_lost) */
    void (*watch)(void *, uint32_t, ccq_boot_peer);
    void *watch_arg;
    bool stop;
    uint32_t server_rank; /* the process serving the rendezvous now (0, then its successor) */
    struct {
        uint16_t port; /* 0: not told */
        char text[CCQ_TCP_ADDR_MAX + 1];
    } * addrs;       /* [size]: where each process would serve (ADDRS) */
    open_xchg *open; /* this process's open exchanges */
    open_xchg *kept; /* exchanges it finished, newest first (KEPT_MAX, KEPT_BYTES_MAX) */
    size_t nkept, kept_bytes;
    uint64_t hb_ns, silent_ns; /* ccq_boot_beat_config: 0 when heartbeats are off */
    uint8_t *silent;           /* [size] LOST because it fell silent (silent_peers, once) */
    uint64_t ready_since;      /* when this process last was WELCOMEd (relay_window) */
    uint64_t relayed_ns;       /* when it last read frames from the server, ready (relay_window) */
    uint64_t arrivals;         /* frames read and state changes (tcp_arrivals, tcp_wait) */
    pthread_cond_t arrived;    /* signalled with each (CLOCK_MONOTONIC) */
    bool gave_up;              /* ccq_boot_given_up (set with given_up_by) */
    uint32_t given_up_by;
} tcp_boot;

static uint64_t now_ns(void)
{
    return ccq_boot_now_ns();
}

static void wake_thread(tcp_boot *t)
{
    char c = 1;
    ssize_t k = write(t->wake[1], &c, 1);
    (void)k; /* a full pipe already wakes it */
}

/* Wake the callers asleep in ccq_boot_xchg_wait (tcp_wait): a frame was read or the
 * connection's state changed. With mu held. */
static void tell_waiters_locked(tcp_boot *t)
{
    t->arrivals++;
    pthread_cond_broadcast(&t->arrived);
}

static void no_delay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Write what is pending in b to fd: false when the connection broke. */
static bool flush_buf(int fd, ccq_tcp_buf *b)
{
    while (b->len > b->off) {
        ssize_t k = send(fd, b->p + b->off, b->len - b->off, MSG_NOSIGNAL);
        if (k > 0) {
            ccq_tcp_buf_consume(b, (size_t)k);
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
    return true;
}

/* A clean close of connections whose last frames are written: half-close each, then read (and
 * drop) until the other side closes too (it does once it read the end) or until `until`;
 * fds[i] < 0 are skipped, none is closed here. Closing with the other side's frames unread
 * would send a reset, which discards what the kernel had not delivered yet: a client's goodbye
 * still unread at the server (it would then tell everyone this process was lost: test_boot_tcp
 * under ASan, once), and, at the server's own leave, its last notices to a member over a real
 * network (on loopback they are already in the member's socket). */
static void drain_close_all(const int *fds, int n, uint64_t until)
{
    char buf[4096];
    struct pollfd *pf = calloc(n > 0 ? (size_t)n : 1, sizeof *pf);
    int open = 0;

    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            (void)shutdown(fds[i], SHUT_WR);
    if (pf == NULL)
        return; /* (out of memory: half-closed, not drained) */
    for (int i = 0; i < n; i++) {
        pf[i].fd = fds[i];
        pf[i].events = POLLIN;
        open += fds[i] >= 0;
    }
    while (open > 0) {
        uint64_t now = now_ns();
        int r;
        if (now >= until)
            break;
        r = poll(pf, (nfds_t)n, (int)((until - now + 999999) / 1000000));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        for (int i = 0; i < n; i++) {
            if (pf[i].fd < 0 || pf[i].revents == 0)
                continue;
            for (;;) {
                ssize_t k = recv(pf[i].fd, buf, sizeof buf, 0);
                if (k > 0 || (k < 0 && errno == EINTR))
                    continue;
                if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                    break;
                pf[i].fd = -1; /* it closed (0) or the connection broke */
                open--;
                break;
            }
        }
    }
    free(pf);
}

static void drain_close(int fd, uint64_t until)
{
    drain_close_all(&fd, 1, until);
}

/* ---- the peers' states --------------------------------------------------------------- */

/* Record that rank is now st; call the watcher (mu not held by the caller). */
static void peer_changed(tcp_boot *t, uint32_t rank, ccq_boot_peer st)
{
    void (*fn)(void *, uint32_t, ccq_boot_peer);
    void *arg;
    if (rank >= t->size)
        return;
    pthread_mutex_lock(&t->mu);
    if (t->peer[rank] == st || t->peer[rank] >= CCQ_BOOT_PEER_LEFT) {
        pthread_mutex_unlock(&t->mu);
        return;
    }
    t->peer[rank] = (uint8_t)st;
    fn = t->watch;
    arg = t->watch_arg;
    pthread_mutex_unlock(&t->mu);
    if (fn != NULL && st >= CCQ_BOOT_PEER_LEFT)
        fn(arg, rank, st);
}

/* ---- the client's connection -------------------------------------------------------- */

static void client_fail(tcp_boot *t, int state, ccq_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void client_fail(tcp_boot *t, int state, ccq_status st, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&t->mu);
    va_start(ap, fmt);
    vsnprintf(t->why, sizeof t->why, fmt, ap);
    va_end(ap);
    t->state = state;
    t->fail_st = st;
    tell_waiters_locked(t);
    pthread_mutex_unlock(&t->mu);
}

static void client_drop(tcp_boot *t)
{
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
    t->in.off = t->in.len = 0;
    t->hello.off = t->hello.len = 0;
}

/* The connection is dropped, why said (a deadline's detail shows it): the client is idle until
 * it connects again. */
static void client_idle(tcp_boot *t, const char *why)
{
    client_drop(t);
    pthread_mutex_lock(&t->mu);
    snprintf(t->why, sizeof t->why, "%s", why);
    if (t->state != C_FAILED && t->state != C_CLOSED)
        t->state = C_IDLE;
    tell_waiters_locked(t); /* the timeout detail's note changes */
    pthread_mutex_unlock(&t->mu);
}

/* Try again later (the rendezvous is not up yet, or serves an earlier runtime). */
static void client_retry(tcp_boot *t, const char *why)
{
    client_idle(t, why);
    t->addr_left = 0; /* after the pause, every address again, from the one tried last */
    t->retry_at = now_ns() + t->retry_ns;
    t->retry_ns = t->retry_ns * 2 > RETRY_MAX_NS ? RETRY_MAX_NS : t->retry_ns * 2;
}

/* Connecting to the address tried failed: the next one host resolves to, at once; once every
 * one failed, the first again after the retry's pause. A name may resolve to addresses that
 * do not all reach process 0 (IPv6 and IPv4, one an interface it does not listen on): one
 * refused, or silent, must not hide the others. */
static void client_next_address(tcp_boot *t, const char *why)
{
    t->addr_turn++;
    if (t->addr_left <= 1) {
        client_retry(t, why);
        return;
    }
    t->addr_left--;
    client_idle(t, why);
    t->retry_at = 0;
}

/* HOST:PORT as a user writes it: an IPv6 address in brackets ("[fd00::2]:29500"; a
 * successor's address is the bare text inet_ntop gave). */
typedef struct host_port_text {
    char s[sizeof((tcp_boot *)0)->host + sizeof((tcp_boot *)0)->port + 3];
} host_port_text;

static const char *host_port(host_port_text *b, const char *host, const char *port)
{
    snprintf(b->s, sizeof b->s, strchr(host, ':') != NULL ? "[%s]:%s" : "%s:%s", host, port);
    return b->s;
}

/* "HOST:PORT", and the address tried where HOST is a name ("node0:29500 (127.0.1.1)"). */
static void client_where(const tcp_boot *t, char *buf, size_t len)
{
    host_port_text hp;
    if (t->addr_text[0] != '\0' && strcmp(t->addr_text, t->host) != 0)
        snprintf(buf, len, "%s (%s)", host_port(&hp, t->host, t->port), t->addr_text);
    else
        snprintf(buf, len, "%s", host_port(&hp, t->host, t->port));
}

/* "torchstore://": where process 0 serves, from torch's store (true), or a retry arranged. */
static bool client_port_from_store(tcp_boot *t)
{
    char why[sizeof t->why], val[16], *end;
    size_t vl = 0;
    unsigned long port;
    int got = -1;
    uint64_t deadline = now_ns() + 2000000000ull; /* one question: the store answers at once */

    if (t->store_fd < 0)
        t->store_fd =
            ccq_torch_store_connect(t->store_host, t->store_port, deadline, why, sizeof why);
    if (t->store_fd >= 0)
        got = ccq_torch_store_get_if_set(t->store_fd, t->store_key, val, sizeof val - 1, &vl,
                                         deadline, why, sizeof why);
    if (got == 1) {
        val[vl] = '\0';
        port = strtoul(val, &end, 10);
        if (vl == 0 || *end != '\0' || port == 0 || port > 65535) {
            snprintf(why, sizeof why,
                     "torch's store at %.100s:%s holds \"%s\" at %.200s, not a port", t->store_host,
                     t->store_port, val, t->store_key);
            got = -1;
        } else {
            snprintf(t->port, sizeof t->port, "%lu", port);
        }
    }
    if (got != 0 && t->store_fd >= 0) { /* found, or the connection is no good */
        close(t->store_fd);
        t->store_fd = -1;
    }
    if (got == 1)
        return true;
    if (got == 0)
        snprintf(why, sizeof why,
                 "process 0 has not said where it serves yet (torch's store at %.100s:%s, key "
                 "%.200s)",
                 t->store_host, t->store_port, t->store_key);
    client_retry(t, why);
    return false;
}

static void client_connect(tcp_boot *t)
{
    struct addrinfo hints, *res = NULL, *ai;
    char why[480], where[360];
    unsigned n = 0;
    int rc;

    if (t->port[0] == '\0' && !client_port_from_store(t))
        return;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(t->host, t->port, &hints, &res);
    if (rc != 0) {
        snprintf(why, sizeof why, "cannot resolve %s: %s", t->host, gai_strerror(rc));
        client_retry(t, why);
        return;
    }
    for (ai = res; ai != NULL; ai = ai->ai_next)
        n++;
    if (t->addr_left == 0 || t->addr_left > n)
        t->addr_left = n;
    snprintf(why, sizeof why, "%s resolves to no address", t->host);
    while (t->fd < 0 && t->addr_left > 0) {
        int fd;
        ai = res;
        for (unsigned i = 0; i < t->addr_turn % n; i++)
            ai = ai->ai_next;
        if (getnameinfo(ai->ai_addr, ai->ai_addrlen, t->addr_text, sizeof t->addr_text, NULL, 0,
                        NI_NUMERICHOST) != 0)
            t->addr_text[0] = '\0';
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd >= 0) {
            no_delay(fd);
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS) {
                t->fd = fd;
                break;
            }
        }
        int ce = errno;
        client_where(t, where, sizeof where);
        snprintf(why, sizeof why, "connecting to %s: %s", where, strerror(ce));
        if (fd >= 0)
            close(fd);
        t->addr_turn++;
        t->addr_left--;
    }
    freeaddrinfo(res);
    if (t->fd < 0) {
        client_retry(t, why);
        return;
    }
    t->connect_until = now_ns() + CONNECT_TRY_NS;
    pthread_mutex_lock(&t->mu);
    t->state = C_CONNECTING;
    pthread_mutex_unlock(&t->mu);
}

/* A connection to a port in the kernel's ephemeral range that nobody listens on yet can be
 * given that very port as its own and connect to itself (TCP's simultaneous open): it would
 * then hold the port process 0 is about to listen on ("Address already in use" there) and wait
 * for an answer from itself. Possible whenever a process connects before process 0 listens on
 * such a port (tests/free_port.h keeps the tests' ports below that range). */
static bool self_connected(int fd)
{
    struct sockaddr_storage a, b;
    socklen_t al = sizeof a, bl = sizeof b;
    if (getsockname(fd, (struct sockaddr *)&a, &al) != 0 ||
        getpeername(fd, (struct sockaddr *)&b, &bl) != 0)
        return false;
    return al == bl && memcmp(&a, &b, al) == 0;
}

/* The connection is up: say who this is. */
static void client_hello(tcp_boot *t)
{
    uint32_t v[4] = {t->rank, t->size, t->gen, 0};
    t->hello.off = t->hello.len = 0;
    ccq_tcp_put_frame(&t->hello, SIZE_MAX, CCQ_TCP_HELLO, v, sizeof v, &t->nonce, 8, t->job,
                      strlen(t->job));
    pthread_mutex_lock(&t->mu);
    t->state = C_HELLO;
    pthread_mutex_unlock(&t->mu);
}

/* Tell the server where this process would serve in its place (ADDR): the address of this
 * end of the connection (the interface that reaches the server), and the port it listens on.
 * Ahead of every frame queued (nothing of t->out went on this connection before its WELCOME):
 * the server tells the others before it passes on any record of this process, so a process
 * that has a record of it knows where it would serve, and every survivor of a lost server
 * picks the same successor (one that did not know would serve alone: test_boot_tcp's record
 * at takeover). */
static void send_own_addr(tcp_boot *t)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char text[CCQ_TCP_ADDR_MAX];
    ccq_tcp_buf b = {0};

    if (t->own_port == 0 || getsockname(t->fd, (struct sockaddr *)&ss, &sl) != 0)
        return;
    if (ss.ss_family == AF_INET) {
        if (inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, text, sizeof text) == NULL)
            return;
    } else if (ss.ss_family == AF_INET6 && t->own_v6) {
        const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
        /* A link-local address means something on this link's interface alone, which the
         * others name otherwise: no successor here (docs/multiprocess.md). */
        if (IN6_IS_ADDR_LINKLOCAL(a) || inet_ntop(AF_INET6, a, text, sizeof text) == NULL)
            return;
    } else {
        return; /* IPv6 to the server, listening on IPv4 alone: no successor here */
    }
    pthread_mutex_lock(&t->mu);
    size_t queued = t->out.len - t->out.off;
    if (ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_ADDR, &t->own_port, 2, text, strlen(text), NULL,
                          0) &&
        ccq_tcp_buf_reserve(&b, queued)) {
        if (queued > 0)
            memcpy(b.p + b.len, t->out.p + t->out.off, queued);
        b.len += queued;
        ccq_tcp_buf_free(&t->out);
        t->out = b;
        t->addr_told = true;
    } else {
        ccq_tcp_buf_free(&b); /* out of memory: no ADDR, so nobody picks this one to serve */
    }
    pthread_mutex_unlock(&t->mu);
}

/* A record of an exchange this process is done with (freed after a failure, or finished and
 * kept): dropped (a server taking over sends a finished one's records again). */
static bool tag_is_done(tcp_boot *t, const char *tag, size_t tl)
{
    for (dead_tag *d = t->dead; d != NULL; d = d->next)
        if (d->why == NULL && strlen(d->tag) == tl && memcmp(d->tag, tag, tl) == 0)
            return true;
    for (open_xchg *o = t->kept; o != NULL; o = o->next)
        if (strlen(o->tag) == tl && memcmp(o->tag, tag, tl) == 0)
            return true;
    return false;
}

/* BEATS: another process's latest heartbeat record, kept (replacing the one before). */
static void keep_beat(tcp_boot *t, const ccq_tcp_frame *f)
{
    uint32_t r;
    uint8_t *m;
    size_t n;

    if (f->len < 5 || f->len - 4 > CCQ_BOOT_BEAT_MAX)
        return;
    memcpy(&r, f->payload, 4);
    if (r >= t->size || r == t->rank)
        return;
    n = f->len - 4u;
    if ((m = malloc(n)) == NULL)
        return; /* this beat is missed; the next one replaces it */
    memcpy(m, f->payload + 4, n);
    pthread_mutex_lock(&t->mu);
    free(t->beats[r].rec);
    t->beats[r].rec = m;
    t->beats[r].len = n;
    pthread_mutex_unlock(&t->mu);
}

/* One frame from the server. */
static void client_frame(tcp_boot *t, const ccq_tcp_frame *f)
{
    const uint8_t *p = f->payload;
    uint32_t u[2];
    uint16_t tl;

    switch (f->type) {
    case CCQ_TCP_WELCOME:
        t->server_pinged = false; /* a server newly joined: its silence counts once it pings */
        pthread_mutex_lock(&t->mu);
        if (t->state == C_HELLO)
            t->state = C_READY;
        if (t->stop) /* leaving: the goodbye tcp_close could not queue (io_main, shaking) */
            ccq_tcp_put_frame(&t->out, SIZE_MAX, CCQ_TCP_BYE, NULL, 0, NULL, 0, NULL, 0);
        t->why[0] = '\0';
        t->ready_since = now_ns();
        pthread_mutex_unlock(&t->mu);
        t->retry_ns = RETRY_NS;
        send_own_addr(t);
        peer_changed(t, t->server_rank, CCQ_BOOT_PEER_ALIVE);
        break;
    case CCQ_TCP_REFUSE: {
        char why[400];
        uint32_t code = 0;
        if (f->len >= 4)
            memcpy(&code, p, 4);
        snprintf(why, sizeof why, "%.*s", f->len >= 4 ? (int)(f->len - 4) : 0, (const char *)p + 4);
        if (code == CCQ_TCP_REFUSE_RETRY) {
            char w[480];
            snprintf(w, sizeof w, "refused for now: %s", why);
            client_retry(t, w);
        } else {
            host_port_text hp;
            client_drop(t);
            client_fail(t, C_FAILED,
                        strstr(why, "world_size") != NULL ? CCQ_ERR_INVALID_ARGUMENT
                                                          : CCQ_ERR_BACKEND,
                        "the rendezvous at %s (process 0) refused this process: %s",
                        host_port(&hp, t->host, t->port), why);
        }
        break;
    }
    case CCQ_TCP_REC: {
        mail *m;
        if (f->len < 6)
            break;
        memcpy(&u[0], p, 4);
        memcpy(&tl, p + 4, 2);
        if (tl == 0 || tl > CCQ_BOOT_TAG_MAX || f->len < 6u + tl)
            break;
        pthread_mutex_lock(&t->mu);
        if (!tag_is_done(t, (const char *)p + 6, tl) && (m = calloc(1, sizeof *m)) != NULL) {
            m->tag = strndup((const char *)p + 6, tl);
            m->len = f->len - 6u - tl;
            m->rec = malloc(m->len ? m->len : 1);
            m->rank = u[0];
            if (m->tag == NULL || m->rec == NULL) {
                free(m->tag);
                free(m->rec);
                free(m);
            } else {
                memcpy(m->rec, p + 6 + tl, m->len);
                m->next = t->mail;
                t->mail = m;
            }
        }
        pthread_mutex_unlock(&t->mu);
        break;
    }
    case CCQ_TCP_ERR: {
        dead_tag *d;
        if (f->len < 2)
            break;
        memcpy(&tl, p, 2);
        if (tl == 0 || tl > CCQ_BOOT_TAG_MAX || f->len < 2u + tl)
            break;
        if ((d = calloc(1, sizeof *d)) == NULL)
            break;
        d->tag = strndup((const char *)p + 2, tl);
        d->why = strndup((const char *)p + 2 + tl, f->len - 2u - tl);
        pthread_mutex_lock(&t->mu);
        d->next = t->dead;
        t->dead = d;
        pthread_mutex_unlock(&t->mu);
        break;
    }
    case CCQ_TCP_BEATS:
        keep_beat(t, f);
        break;
    case CCQ_TCP_ADDRS:
        if (f->len >= 7 && f->len - 6 <= CCQ_TCP_ADDR_MAX) {
            memcpy(&u[0], p, 4);
            if (u[0] >= t->size)
                break;
            pthread_mutex_lock(&t->mu);
            memcpy(&t->addrs[u[0]].port, p + 4, 2);
            memcpy(t->addrs[u[0]].text, p + 6, f->len - 6);
            t->addrs[u[0]].text[f->len - 6] = '\0';
            pthread_mutex_unlock(&t->mu);
        }
        break;
    case CCQ_TCP_PEER:
        if (f->len >= 8) {
            memcpy(u, p, 8);
            if (u[1] == CCQ_BOOT_PEER_LEFT || u[1] == CCQ_BOOT_PEER_LOST)
                peer_changed(t, u[0], (ccq_boot_peer)u[1]);
        }
        break;
    case CCQ_TCP_PING: /* the server runs, and sends keepalives: its silence now counts */
        t->server_pinged = true;
        break;
    default: /* what a later version sends */
        break;
    }
}

static void server_lost(tcp_boot *t, const char *how);

/* Fault injection (ccq_boot_fault_lag): this thread preempted between a read and its frames,
 * once per wake-up (client_read). */
static void lag_now(tcp_boot *t)
{
    uint64_t ns = atomic_load_explicit(&t->lag_ns, memory_order_relaxed);
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    while (ns != 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void client_read(tcp_boot *t)
{
    bool lagged = false;

    for (;;) {
        uint8_t buf[65536];
        ssize_t k = recv(t->fd, buf, sizeof buf, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (k <= 0) {
            int state;
            pthread_mutex_lock(&t->mu);
            state = t->state;
            pthread_mutex_unlock(&t->mu);
            if (state == C_READY) {
                server_lost(t, "closed the connection");
            } else if (state == C_HELLO || state == C_CONNECTING) {
                client_retry(t, "the rendezvous closed the connection before answering");
            }
            return;
        }
        t->last_recv_ns = now_ns();
        if (!lagged) { /* once per wake-up: a lag at every read never let the loop end */
            lag_now(t);
            lagged = true;
        }
        if (!ccq_tcp_buf_reserve(&t->in, (size_t)k)) {
            client_retry(t, "out of memory");
            return;
        }
        memcpy(t->in.p + t->in.len, buf, (size_t)k);
        t->in.len += (size_t)k;
        for (;;) {
            ccq_tcp_frame f;
            size_t used = 0;
            ccq_errbuf err;
            int r = ccq_tcp_parse(t->in.p + t->in.off, t->in.len - t->in.off, t->lim.frame_max, &f,
                                  &used, &err);
            if (r == 0)
                break;
            if (r < 0) {
                host_port_text hp;
                client_drop(t);
                client_fail(t, C_FAILED, CCQ_ERR_BACKEND,
                            "the rendezvous at %s sent what ccq cannot read: %s",
                            host_port(&hp, t->host, t->port), err.msg);
                return;
            }
            client_frame(t, &f);
            if (t->fd < 0) /* refused or retrying: the rest is of no use */
                return;
            ccq_tcp_buf_consume(&t->in, used);
        }
        /* Noted after the frames took effect (the records they carried are kept, a WELCOME
         * set ready_since), never before: a monitor that reads the window and then the records
         * must find in them whatever the window counts (relay_window). */
        pthread_mutex_lock(&t->mu);
        if (t->state == C_READY)
            t->relayed_ns = now_ns();
        tell_waiters_locked(t);
        pthread_mutex_unlock(&t->mu);
    }
}

/* ---- a server given up ------------------------------------------------------------------ */

int ccq_boot_wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd pf = {fd, events, 0};
        uint64_t now = now_ns();
        int r;
        if (now >= deadline)
            return 0;
        r = poll(&pf, 1, (int)((deadline - now + 999999) / 1000000));
        if (r < 0 && errno == EINTR)
            continue;
        if (r > 0 && (pf.revents & (POLLERR | POLLNVAL)) && !(pf.revents & events))
            return -1;
        return r;
    }
}

/* Ask process r, which would serve in this one's place, as an observer (LOOK, as `ccq-trace
 * status` does): 1 when it serves and answered (*lost: it lists this process as lost; the
 * heartbeat records it sent are kept, they say who declared it and how), 0 when it does not
 * answer by the deadline (it does not serve), -1 when it cannot be reached (gone: ask the
 * next one). */
static int ask_one(tcp_boot *t, const char *host, uint16_t port, uint64_t deadline, bool *lost)
{
    struct addrinfo hints, *res = NULL;
    char service[8];
    ccq_tcp_buf out = {0}, in = {0};
    int fd, e = 0, ret = 0;
    socklen_t el = sizeof e;

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    snprintf(service, sizeof service, "%u", (unsigned)port);
    if (getaddrinfo(host, service, &hints, &res) != 0)
        return -1;
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || (connect(fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS)) {
        if (fd >= 0)
            close(fd);
        freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    if (ccq_boot_wait_fd(fd, POLLOUT, deadline) <= 0 ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0 || e != 0) {
        close(fd);
        return e != 0 ? -1 : 0;
    }
    if (!ccq_tcp_put_frame(&out, SIZE_MAX, CCQ_TCP_LOOK, t->job, strlen(t->job), NULL, 0, NULL, 0))
        goto done;
    while (out.len > out.off) {
        if (!flush_buf(fd, &out) ||
            (out.len > out.off && ccq_boot_wait_fd(fd, POLLOUT, deadline) <= 0))
            goto done;
    }
    /* LOOKED, one BEATS per process with a record, then it closes. */
    for (;;) {
        uint8_t buf[16384];
        ssize_t k;
        if (ccq_boot_wait_fd(fd, POLLIN, deadline) <= 0)
            break;
        k = recv(fd, buf, sizeof buf, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (k <= 0 || !ccq_tcp_buf_reserve(&in, (size_t)k))
            break;
        memcpy(in.p + in.len, buf, (size_t)k);
        in.len += (size_t)k;
        for (;;) {
            ccq_tcp_frame f;
            size_t used = 0;
            ccq_errbuf err;
            int r =
                ccq_tcp_parse(in.p + in.off, in.len - in.off, t->lim.frame_max, &f, &used, &err);
            uint32_t v[2];
            if (r < 0)
                goto done;
            if (r == 0)
                break;
            if (f.type == CCQ_TCP_LOOKED && f.len >= 8) {
                memcpy(v, f.payload, 8);
                if (v[0] != t->size || v[1] != t->gen || f.len < 8u + t->size)
                    goto done; /* another world behind that address */
                *lost = f.payload[8 + t->rank] == CCQ_BOOT_PEER_LOST;
                ret = 1;
            } else if (f.type == CCQ_TCP_BEATS && ret == 1) {
                keep_beat(t, &f);
            } else if (f.type == CCQ_TCP_REFUSE) {
                goto done;
            }
            ccq_tcp_buf_consume(&in, used);
        }
    }
done:
    ccq_tcp_buf_free(&out);
    ccq_tcp_buf_free(&in);
    close(fd);
    return ret;
}

/* This process serves the rendezvous, ran again after a gap (it was stopped, or starved), and
 * a process's connection closed: did the others give it up meanwhile? Ask the processes that
 * would serve in its place, lowest first (the one they all picked), as an observer. True with
 * *by when one serves and lists this process as lost. This blocks the I/O thread (at most
 * ASK_MAX_NS): until it is known, nothing it would tell anyone is worth telling. */
static bool ask_successor(tcp_boot *t, uint64_t budget_ns, uint32_t *by)
{
    uint64_t deadline = now_ns() + (budget_ns < ASK_MAX_NS ? budget_ns : ASK_MAX_NS);

    for (uint32_t r = 0; r < t->size; r++) {
        char host[CCQ_TCP_ADDR_MAX + 1];
        uint16_t port;
        bool lost = false;
        int a;
        pthread_mutex_lock(&t->mu);
        port = t->addrs[r].port;
        snprintf(host, sizeof host, "%s", t->addrs[r].text);
        if (t->peer[r] >= CCQ_BOOT_PEER_LEFT)
            port = 0;
        pthread_mutex_unlock(&t->mu);
        if (r == t->rank || port == 0)
            continue;
        a = ask_one(t, host, port, deadline, &lost);
        t->ran_ns = now_ns(); /* the time it took is no pause of this process */
        if (a < 0)
            continue; /* gone: the others passed it over too */
        if (a == 1 && lost)
            *by = r;
        return a == 1 && lost;
    }
    return false;
}

/* The others gave this process up while it served (it was stopped): it serves no more and
 * tells nobody anything (every connection closes as it is, without PEER notices: the others
 * know their states), listens no more, and its exchanges fail from now on. */
static void give_up(tcp_boot *t, uint32_t by)
{
    for (int i = 0; t->srv != NULL && i < ccq_tcp_server_conn_bound(t->srv); i++)
        if (t->srv_fd[i] >= 0)
            close(t->srv_fd[i]);
    ccq_tcp_server_free(t->srv);
    free(t->srv_fd);
    t->srv = NULL;
    t->srv_fd = NULL;
    if (t->listen_fd >= 0)
        close(t->listen_fd);
    t->listen_fd = -1;
    t->own_port = 0;
    t->given_up = true;
    client_drop(t);
    client_fail(t, C_CLOSED, CCQ_ERR_PROCESS_LOST,
                "this process (%u) served the rendezvous and fell silent past "
                "heartbeat_timeout_ms (it was stopped or hung): the others declared it lost and "
                "process %u serves in its place; it is fenced off",
                t->rank, by);
    pthread_mutex_lock(&t->mu);
    t->gave_up = true;
    t->given_up_by = by;
    pthread_mutex_unlock(&t->mu);
}

/* This thread runs again at `now`, having meant to sleep slept_ns since it last ran: a longer
 * absence (the process was stopped, or starved) says nothing of the server's silence meanwhile,
 * so the server counts as heard now. And if this process serves and was away long enough that a
 * process may have heard nothing from it for heartbeat_timeout_ms (its last keepalive went up to
 * a heartbeat before), a connection that closes now may have given it up: server_close_conn
 * asks before it tells anyone. A shorter pause is not suspect (nobody asks, nobody waits).
 * Checked after poll(), again before the silence check at the top of the loop, and before a
 * server connection's close is judged: a stop can land anywhere in between, and rank 0, a
 * client of its own server, once took its own gap for its server's silence (TSan,
 * test_boot_tcp's stopped server). */
static void note_run(tcp_boot *t, uint64_t now, uint64_t slept_ns, uint64_t silent, uint64_t hb)
{
    uint64_t away = now - t->ran_ns > slept_ns ? now - t->ran_ns - slept_ns : 0;

    if (silent != 0 && away > silent / 2)
        t->last_recv_ns = now;
    if (silent != 0 && t->srv != NULL && away > silent / 2 && away + 2 * hb >= silent)
        t->suspect_until = now + silent;
    t->ran_ns = now;
}

/* ---- the server (world rank 0, or the process serving in its place) ------------------------ */

static void server_close_conn(tcp_boot *t, int id)
{
    uint32_t r, by;
    uint64_t now = now_ns(), silent, hb;

    pthread_mutex_lock(&t->mu);
    silent = t->silent_ns;
    hb = t->hb_ns;
    pthread_mutex_unlock(&t->mu);
    /* A stop may have landed since this thread last looked (after poll(), in the reads of this
     * same pass): seen here, right before the close is judged (drill_health_tcp_stop0 with
     * CCQ_FAULT lag, beside a busy core: process 0 continued told of a loss it had caused). */
    note_run(t, now, 0, silent, hb);
    /* A process's connection that closes right after this thread did not run for a while: it
     * may have given this process up. Known before anyone is told it was lost. */
    if (t->suspect_until > now && ccq_tcp_server_conn_member(t->srv, id, &r) && r != t->rank) {
        t->suspect_until = 0; /* one answer is enough */
        if (ask_successor(t, silent, &by)) {
            give_up(t, by);
            return;
        }
    }
    if (t->srv_fd[id] >= 0)
        close(t->srv_fd[id]);
    t->srv_fd[id] = -1;
    ccq_tcp_server_closed(t->srv, id, now_ns());
}

static void server_accept(tcp_boot *t)
{
    for (;;) {
        int fd = accept4(t->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK), id;
        if (fd < 0)
            return; /* EAGAIN, or an error the next poll shows again */
        no_delay(fd);
        id = ccq_tcp_server_open(t->srv, now_ns());
        if (id < 0) { /* full: the limits bound what anyone can make it hold */
            close(fd);
            continue;
        }
        t->srv_fd[id] = fd;
    }
}

static void server_io(tcp_boot *t, int id, short revents)
{
    const uint8_t *p;
    size_t len;
    int fd = t->srv_fd[id];

    if (revents & POLLIN) {
        for (;;) {
            uint8_t buf[65536];
            ssize_t k = recv(fd, buf, sizeof buf, 0);
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                break;
            if (k <= 0) {
                server_close_conn(t, id);
                return;
            }
            if (!ccq_tcp_server_input(t->srv, id, buf, (size_t)k, now_ns()))
                break; /* refused: it is told why below, then closed */
        }
    } else if (revents & (POLLHUP | POLLERR)) {
        server_close_conn(t, id);
        return;
    }
    ccq_tcp_server_output(t->srv, id, &p, &len);
    while (len > 0) {
        ssize_t k = send(fd, p, len, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return;
            server_close_conn(t, id);
            return;
        }
        ccq_tcp_server_sent(t->srv, id, (size_t)k, now_ns());
        ccq_tcp_server_output(t->srv, id, &p, &len);
    }
    if (ccq_tcp_server_closing(t->srv, id))
        server_close_conn(t, id);
}

/* The server, on a listening socket already open: rank 0 at start, or a successor taking over
 * (seeded with the states of the processes known to have gone, so they cannot rejoin and
 * newcomers are told). */
static ccq_status server_start(tcp_boot *t)
{
    t->srv = ccq_tcp_server_new(t->job, t->size, t->gen, &t->lim);
    t->srv_fd = malloc(t->lim.conns_max * sizeof *t->srv_fd);
    if (t->srv == NULL || t->srv_fd == NULL) {
        ccq_tcp_server_free(t->srv);
        free(t->srv_fd);
        t->srv = NULL;
        t->srv_fd = NULL;
        return CCQ_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < t->lim.conns_max; i++)
        t->srv_fd[i] = -1;
    pthread_mutex_lock(&t->mu);
    for (uint32_t r = 0; r < t->size; r++)
        if (t->peer[r] >= CCQ_BOOT_PEER_LEFT)
            ccq_tcp_server_mark(t->srv, r, t->peer[r]);
    pthread_mutex_unlock(&t->mu);
    return CCQ_OK;
}

/* The process serving the rendezvous is gone (its connection closed or broke: `how`). The
 * lowest surviving process serves in its place (every survivor picks the same one from the
 * states and addresses the servers told it), and this process connects there, says HELLO
 * again and re-sends its open exchanges, and offers the records of those it finished lately
 * (HAD): the lost server may have passed a record to some members and not to others, and a
 * member that finished does not publish again (test_boot_tcp's record at takeover, 1 run in 30
 * under ASan before). With nobody to take over (no address known), exchanges fail from now
 * on. */
static void server_lost(tcp_boot *t, const char *how)
{
    uint32_t lost = t->server_rank, next = UINT32_MAX;
    char host[CCQ_TCP_ADDR_MAX + 1];
    uint16_t port = 0;

    client_drop(t);
    peer_changed(t, lost, CCQ_BOOT_PEER_LOST); /* no-op when it said goodbye first */
    pthread_mutex_lock(&t->mu);
    for (uint32_t r = 0; r < t->size && next == UINT32_MAX; r++) {
        if (r == lost || t->peer[r] >= CCQ_BOOT_PEER_LEFT)
            continue;
        /* Itself only where it told its address: the others know it then (those that got any
         * record of it), and pick it too; else they pass it over, and it must as well. */
        if (r == t->rank && t->own_port != 0 && t->addr_told) {
            next = r;
            snprintf(host, sizeof host, "127.0.0.1");
            port = t->own_port;
        } else if (r != t->rank && t->addrs[r].port != 0) {
            next = r;
            snprintf(host, sizeof host, "%s", t->addrs[r].text);
            port = t->addrs[r].port;
        }
    }
    pthread_mutex_unlock(&t->mu);
    if (next == t->rank && t->srv == NULL && server_start(t) != CCQ_OK)
        next = UINT32_MAX;
    if (next == UINT32_MAX) {
        host_port_text hp;
        client_fail(t, C_CLOSED, CCQ_ERR_BACKEND,
                    "the rendezvous at %s (process %u) %s: process %u left or died, and no "
                    "surviving process can serve in its place",
                    host_port(&hp, t->host, t->port), lost, how, lost);
        return;
    }
    pthread_mutex_lock(&t->mu);
    snprintf(t->host, sizeof t->host, "%s", host);
    snprintf(t->port, sizeof t->port, "%u", (unsigned)port);
    t->server_rank = next;
    /* What was queued for the lost server may be cut mid-frame: start afresh with this
     * process's record and then its open exchanges, the order they were published in (a
     * record published just now, once this process saw the loss, was queued before the reset:
     * it must not be lost, nor come after an exchange published after it). */
    t->out.off = t->out.len = 0;
    if (t->mine.rec != NULL)
        ccq_tcp_put_frame(&t->out, CLIENT_OUT_MAX, CCQ_TCP_BEAT, t->mine.rec, t->mine.len, NULL, 0,
                          NULL, 0);
    for (open_xchg *o = t->kept; o != NULL; o = o->next)
        ccq_tcp_put_frame(&t->out, CLIENT_OUT_MAX, CCQ_TCP_HAD, o->had_head, o->had_len, o->rec,
                          o->len, NULL, 0);
    for (open_xchg *o = t->open; o != NULL; o = o->next) {
        uint16_t tl = (uint16_t)strlen(o->tag);
        ccq_tcp_put_frame(&t->out, CLIENT_OUT_MAX, CCQ_TCP_PUT, &tl, 2, o->tag, tl, o->rec, o->len);
        ccq_tcp_put_frame(&t->out, CLIENT_OUT_MAX, CCQ_TCP_GET, &tl, 2, o->tag, tl, NULL, 0);
    }
    snprintf(t->why, sizeof t->why,
             "process %u, which served the rendezvous, %s: process %u serves "
             "it now",
             lost, how, next);
    if (t->state != C_FAILED && t->state != C_CLOSED)
        t->state = C_IDLE;
    tell_waiters_locked(t);
    pthread_mutex_unlock(&t->mu);
    t->retry_ns = RETRY_NS;
    t->retry_at = 0; /* connect now */
}

/* ---- the I/O thread ------------------------------------------------------------------ */

static void *io_main(void *arg)
{
    tcp_boot *t = arg;
    int nfd_cap = 3 + (int)t->lim.conns_max; /* any process may come to serve */
    struct pollfd *pf = calloc((size_t)nfd_cap, sizeof *pf);
    int *ids = calloc((size_t)nfd_cap, sizeof *ids);
    uint64_t linger_until = 0, shake_until = 0, silent_was = 0;

    ccq_thread_name("ccq-tcp-io");
    if (pf == NULL || ids == NULL) {
        client_fail(t, C_FAILED, CCQ_ERR_NO_MEMORY, "out of memory in the bootstrap's thread");
        free(pf);
        free(ids);
        return NULL;
    }
    for (;;) {
        int n = 0, state, timeout_ms = -1;
        bool stop, out_pending;
        uint64_t now = now_ns(), next = UINT64_MAX, hb, silent, heard;

        pthread_mutex_lock(&t->mu);
        stop = t->stop;
        state = t->state;
        out_pending = t->out.len > t->out.off;
        hb = t->hb_ns;
        silent = t->silent_ns;
        pthread_mutex_unlock(&t->mu);
        if (silent != silent_was) /* heartbeats just began: the server is heard from now on */
            t->last_recv_ns = now;
        silent_was = silent;
        note_run(t, now, 0, silent, hb);
        if (t->srv != NULL)
            ccq_tcp_server_keepalive(t->srv, hb);
        /* Nothing from the server for heartbeat_timeout_ms while it should send something every
         * heartbeat_ms: it stopped (its connection stays open). Take over as for a close. Only
         * once it pinged (server_pinged): until then its process may not have turned
         * keepalives on yet (it met the others later than this one did: a sanitizer build's
         * process 0 once took 2 s longer, and its clients took over from a running server,
         * test_boot_tcp's stopped server), which is not silence. */
        heard = t->last_recv_ns;
        bool judge_silence = silent != 0 && t->server_pinged && state == C_READY && t->fd >= 0;
        if (judge_silence && !stop && now - heard > silent) {
            char how[200];
            pthread_mutex_lock(&t->mu);
            if (t->server_rank < t->size)
                t->silent[t->server_rank] = 1;
            pthread_mutex_unlock(&t->mu);
            snprintf(how, sizeof how,
                     "fell silent (nothing from it for %.1f s, heartbeat_timeout_ms %llu: "
                     "stopped or hung)",
                     (double)(now - heard) / 1e9, (unsigned long long)(silent / 1000000u));
            server_lost(t, how);
            continue;
        }
        if (judge_silence)
            next = heard + silent + 1000000u;
        if (stop && linger_until == 0) {
            linger_until = now + LINGER_NS;
            shake_until = now + DRAIN_MIN_NS;
            /* Process 0 leaves cleanly: everyone hears it before its connections close. */
            if (t->srv != NULL)
                ccq_tcp_server_leaving(t->srv, t->rank, now);
        }
        /* Leaving with a connection to the server in its handshake (just after a takeover, or
         * before the first WELCOME), or between servers after a takeover: finish it, up to
         * DRAIN_MIN_NS, to say goodbye (a WELCOME while stopping queues it): a connection that
         * closes after its HELLO without a goodbye reads at the server as a loss (test_boot_tcp's
         * worlds, 7 runs in 40 under load, 2026-12-03: the last process closing while it
         * reconnected to process 0's successor). */
        bool shaking =
            stop && now < shake_until && !t->given_up && t->server_rank != t->rank &&
            (state == C_CONNECTING || state == C_HELLO || (state == C_IDLE && t->ready_since != 0));
        if (stop) {
            bool srv_busy = false;
            for (int i = 0; t->srv != NULL && i < ccq_tcp_server_conn_bound(t->srv); i++) {
                const uint8_t *p;
                size_t len;
                ccq_tcp_server_output(t->srv, i, &p, &len);
                srv_busy |= t->srv_fd[i] >= 0 && len > 0;
            }
            if (!shaking && (state != C_READY || !out_pending) && !srv_busy) {
                if (state == C_READY && t->fd >= 0 && t->srv == NULL)
                    drain_close(t->fd, linger_until > now + DRAIN_MIN_NS ? linger_until
                                                                         : now + DRAIN_MIN_NS);
                break;
            }
            if (!shaking && now >= linger_until) {
                /* Past the linger without a write: this thread did not run for that long (a
                 * loaded machine: test_boot_tcp under ASan once saw a clean close as a loss).
                 * One last non-blocking try, so that a goodbye the socket can take is said,
                 * and, serving, what the members' sockets can take of what it owes them (a
                 * record an exchange it answered still waits for). */
                for (int i = 0; t->srv != NULL && i < ccq_tcp_server_conn_bound(t->srv); i++)
                    if (t->srv_fd[i] >= 0)
                        server_io(t, i, POLLOUT);
                if (state == C_READY && t->fd >= 0) {
                    pthread_mutex_lock(&t->mu);
                    (void)flush_buf(t->fd, &t->out);
                    pthread_mutex_unlock(&t->mu);
                    if (t->srv == NULL)
                        drain_close(t->fd, now + DRAIN_MIN_NS);
                }
                break;
            }
        }
        if (state == C_CONNECTING && t->fd >= 0) {
            if (now >= t->connect_until) {
                char why[480], where[360];
                client_where(t, where, sizeof where);
                snprintf(why, sizeof why,
                         "connecting to %s: no answer in %u s (a firewall that drops, or no "
                         "route there)",
                         where, CONNECT_TRY_NS / 1000000000u);
                client_next_address(t, why);
                continue;
            }
            if (t->connect_until < next)
                next = t->connect_until;
        }
        if (state == C_IDLE && t->fd < 0 && (!stop || shaking)) {
            if (now >= t->retry_at)
                client_connect(t);
            /* Not due yet, or failed at once (a name that does not resolve yet, an address
             * refused on the spot, torch's store without the port yet): poll wakes for the
             * retry it arranged (it slept until something else woke it, the deadline). */
            if (t->fd < 0 && t->retry_at < next)
                next = t->retry_at;
        }
        /* Timeouts and keepalives first: what they queue is polled for below. */
        if (t->srv != NULL) {
            int gone[64];
            uint64_t when;
            size_t held = ccq_tcp_server_memory(t->srv);
            t->peak_held = held > t->peak_held ? held : t->peak_held;
            size_t k = ccq_tcp_server_tick(t->srv, now, gone, 64, &when);
            for (size_t j = 0; j < k && t->srv != NULL; j++)
                server_close_conn(t, gone[j]);
            if (when < next)
                next = when;
        }
        pf[n].fd = t->wake[0];
        pf[n].events = POLLIN;
        ids[n++] = -3;
        if (t->listen_fd >= 0 && t->srv != NULL && !stop) {
            pf[n].fd = t->listen_fd;
            pf[n].events = POLLIN;
            ids[n++] = -2;
        }
        if (t->fd >= 0) {
            pthread_mutex_lock(&t->mu);
            state = t->state;
            out_pending = t->out.len > t->out.off;
            pthread_mutex_unlock(&t->mu);
            pf[n].fd = t->fd;
            pf[n].events = POLLIN;
            if (state == C_CONNECTING || t->hello.len > t->hello.off ||
                (state == C_READY && out_pending))
                pf[n].events |= POLLOUT;
            ids[n++] = -1;
        }
        for (int i = 0; t->srv != NULL && i < ccq_tcp_server_conn_bound(t->srv); i++) {
            const uint8_t *p;
            size_t len;
            if (t->srv_fd[i] < 0 || n >= nfd_cap)
                continue;
            ccq_tcp_server_output(t->srv, i, &p, &len);
            pf[n].fd = t->srv_fd[i];
            pf[n].events = POLLIN | (len > 0 ? POLLOUT : 0);
            ids[n++] = i;
        }
        if (stop && linger_until < next)
            next = linger_until;
        if (shaking && shake_until < next)
            next = shake_until;
        if (next != UINT64_MAX)
            timeout_ms = next <= now ? 0 : (int)((next - now + 999999) / 1000000);
        /* With heartbeats on, wake at least every heartbeat: a gap in this thread's run is
         * then seen below. */
        if (hb != 0 && (timeout_ms < 0 || (uint64_t)timeout_ms > hb / 1000000u))
            timeout_ms = (int)(hb / 1000000u);
        if (poll(pf, (nfds_t)n, timeout_ms) < 0 && errno != EINTR)
            break;
        now = now_ns();
        note_run(t, now, (uint64_t)timeout_ms * 1000000u, silent, hb);
        for (int j = 0; j < n; j++) {
            if (pf[j].revents == 0)
                continue;
            if (ids[j] == -3) {
                char drain[64];
                while (read(t->wake[0], drain, sizeof drain) > 0)
                    ;
            } else if (ids[j] == -2) {
                if (t->srv != NULL)
                    server_accept(t);
            } else if (ids[j] >= 0) {
                if (t->srv != NULL && t->srv_fd[ids[j]] == pf[j].fd)
                    server_io(t, ids[j], pf[j].revents);
            } else if (t->fd == pf[j].fd) {
                if (state == C_CONNECTING && (pf[j].revents & (POLLOUT | POLLERR | POLLHUP))) {
                    int e = 0;
                    socklen_t el = sizeof e;
                    getsockopt(t->fd, SOL_SOCKET, SO_ERROR, &e, &el);
                    if (e != 0) {
                        char why[480], where[360];
                        client_where(t, where, sizeof where);
                        snprintf(why, sizeof why,
                                 "connecting to %s: %s (is process 0 running, and is this its "
                                 "address?)",
                                 where, strerror(e));
                        client_next_address(t, why);
                        continue;
                    }
                    if (self_connected(t->fd)) {
                        client_retry(t, "nobody listens there yet (the connection met itself)");
                        continue;
                    }
                    t->addr_left = 0; /* this address reaches it: the first tried next time */
                    client_hello(t);
                }
                if (t->fd >= 0 && (pf[j].revents & POLLIN))
                    client_read(t);
                if (t->fd >= 0 && !flush_buf(t->fd, &t->hello)) {
                    client_retry(t, "the connection broke while saying hello");
                    continue;
                }
                if (t->fd >= 0) {
                    bool ok;
                    pthread_mutex_lock(&t->mu);
                    ok = t->state != C_READY || flush_buf(t->fd, &t->out);
                    pthread_mutex_unlock(&t->mu);
                    if (!ok)
                        server_lost(t, "broke the connection");
                }
            }
        }
    }
    free(pf);
    free(ids);
    return NULL;
}

/* ---- the mechanism --------------------------------------------------------------------- */

static ccq_status tcp_publish(ccq_boot *b, ccq_boot_xchg *x, ccq_errbuf *err)
{
    tcp_boot *t = b->impl;
    uint16_t tl = (uint16_t)strlen(x->tag);
    bool ok;

    open_xchg *o = calloc(1, sizeof *o);

    if (o != NULL && ((o->tag = strdup(x->tag)) == NULL ||
                      (o->rec = malloc(x->rec_len ? x->rec_len : 1)) == NULL)) {
        free(o->tag);
        free(o);
        o = NULL;
    }
    if (o == NULL) {
        ccq_boot_err(err, "bootstrap: out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    memcpy(o->rec, x->rec, x->rec_len);
    o->len = x->rec_len;
    pthread_mutex_lock(&t->mu);
    ok = ccq_tcp_put_frame(&t->out, CLIENT_OUT_MAX, CCQ_TCP_PUT, &tl, 2, x->tag, tl, x->rec,
                           x->rec_len) &&
         ccq_tcp_put_frame(&t->out, CLIENT_OUT_MAX, CCQ_TCP_GET, &tl, 2, x->tag, tl, NULL, 0);
    o->next = t->open; /* kept for a server that takes over (server_lost) */
    t->open = o;
    pthread_mutex_unlock(&t->mu);
    if (!ok) {
        ccq_boot_err(err, "more than %u bytes waiting for the rendezvous (or out of memory)",
                     CLIENT_OUT_MAX);
        return CCQ_ERR_NO_MEMORY;
    }
    wake_thread(t);
    return CCQ_OK;
}

static ccq_status tcp_fetch(ccq_boot *b, ccq_boot_xchg *x, uint32_t rank, void **rec, size_t *len,
                            ccq_errbuf *err)
{
    tcp_boot *t = b->impl;
    ccq_status st = CCQ_IN_PROGRESS;

    pthread_mutex_lock(&t->mu);
    /* The server refused this process's record or request first: the exchange cannot complete
     * for the others (they never get this record), so it must not complete here either, even
     * with every record it asked for already in (it would go on while they wait out their
     * deadline; the server answers a PUT before the GET that follows it). */
    for (dead_tag *d = t->dead; d != NULL; d = d->next)
        if (d->why != NULL && strcmp(d->tag, x->tag) == 0) {
            ccq_boot_err(err, "the rendezvous (process %u) refused this exchange: %s",
                         t->server_rank, d->why);
            st = CCQ_ERR_BACKEND;
        }
    for (mail **pp = &t->mail; st == CCQ_IN_PROGRESS && *pp != NULL; pp = &(*pp)->next) {
        mail *m = *pp;
        if (m->rank == rank && strcmp(m->tag, x->tag) == 0) {
            *pp = m->next;
            *rec = m->rec;
            *len = m->len;
            free(m->tag);
            free(m);
            pthread_mutex_unlock(&t->mu);
            return CCQ_OK;
        }
    }
    if (st == CCQ_IN_PROGRESS && (t->state == C_FAILED || t->state == C_CLOSED)) {
        ccq_boot_err(err, "%s", t->why);
        st = t->fail_st ? t->fail_st : CCQ_ERR_BACKEND;
    }
    /* What a timeout's detail adds (the handle's lock is held: note is the handle's). */
    if (t->state == C_READY)
        b->note[0] = '\0';
    else if (t->state == C_HELLO) /* (an earlier attempt's why is stale) */
        snprintf(b->note, sizeof b->note,
                 "connected to %.60s, but its hello was never answered (a ccq rendezvous answers "
                 "at once: is another program listening on that port, or is process 0 stopped?)",
                 t->spec);
    else
        snprintf(b->note, sizeof b->note, "not connected to the rendezvous at %.60s: %.150s",
                 t->spec, t->why[0] ? t->why : "connecting");
    pthread_mutex_unlock(&t->mu);
    return st;
}

static void open_free(open_xchg *o)
{
    free(o->tag);
    free(o->rec);
    free(o->had_head);
    free(o);
}

/* Exchange o finished among the n members: keep it to offer a server taking over (its HAD's
 * head made now), dropping the oldest beyond KEPT_MAX or KEPT_BYTES_MAX. mu held. */
static void keep_finished(tcp_boot *t, open_xchg *o, const uint32_t *members, uint32_t n)
{
    uint16_t tl = (uint16_t)strlen(o->tag);
    size_t hl = 2u + tl + 4u + 4u * (size_t)n;

    if ((o->had_head = malloc(hl)) == NULL) {
        open_free(o);
        return;
    }
    memcpy(o->had_head, &tl, 2);
    memcpy(o->had_head + 2, o->tag, tl);
    memcpy(o->had_head + 2 + tl, &n, 4);
    memcpy(o->had_head + 6 + tl, members, 4u * (size_t)n);
    o->had_len = hl;
    o->next = t->kept;
    t->kept = o;
    t->nkept++;
    t->kept_bytes += hl + o->len;
    while (t->nkept > KEPT_MAX || t->kept_bytes > KEPT_BYTES_MAX) {
        open_xchg **pp = &t->kept;
        while ((*pp)->next != NULL)
            pp = &(*pp)->next;
        t->nkept--;
        t->kept_bytes -= (*pp)->had_len + (*pp)->len;
        open_free(*pp);
        *pp = NULL;
    }
}

static void tcp_xchg_free(ccq_boot *b, ccq_boot_xchg *x)
{
    tcp_boot *t = b->impl;
    pthread_mutex_lock(&t->mu);
    for (open_xchg **pp = &t->open; *pp != NULL;) {
        open_xchg *o = *pp;
        if (strcmp(o->tag, x->tag) != 0) {
            pp = &o->next;
            continue;
        }
        *pp = o->next;
        if (x->status == CCQ_OK && x->n > 1)
            keep_finished(t, o, x->members, x->n);
        else
            open_free(o);
    }
    for (mail **pp = &t->mail; *pp != NULL;) {
        mail *m = *pp;
        if (strcmp(m->tag, x->tag) != 0) {
            pp = &m->next;
            continue;
        }
        *pp = m->next;
        free(m->tag);
        free(m->rec);
        free(m);
    }
    if (x->status != CCQ_OK && x->n > 1) { /* records may still come: drop them */
        dead_tag *d = calloc(1, sizeof *d);
        if (d != NULL && (d->tag = strdup(x->tag)) != NULL) {
            d->next = t->dead;
            t->dead = d;
        } else {
            free(d);
        }
    }
    pthread_mutex_unlock(&t->mu);
}

static void tcp_close(ccq_boot *b)
{
    tcp_boot *t = b->impl;

    pthread_mutex_lock(&t->mu);
    if (t->state == C_READY)
        ccq_tcp_put_frame(&t->out, SIZE_MAX, CCQ_TCP_BYE, NULL, 0, NULL, 0, NULL, 0);
    t->stop = true;
    pthread_mutex_unlock(&t->mu);
    if (t->thread_started) {
        wake_thread(t);
        pthread_join(t->thread, NULL);
    }
    if (t->srv != NULL && getenv("CCQ_TCP_STATS") != NULL) /* measurements (performance.md) */
        fprintf(stderr, "ccq tcp rendezvous %s: world of %u, peak %zu bytes held by the server\n",
                t->spec, t->size, t->peak_held);
    client_drop(t);
    if (t->store_fd >= 0)
        close(t->store_fd);
    if (t->listen_fd >= 0)
        close(t->listen_fd);
    if (t->srv != NULL) {
        /* Serving to the end: the members read this process's last notices (it left) before
         * their connections close (a process given up closed them as they were: give_up). */
        int n = ccq_tcp_server_conn_bound(t->srv);
        drain_close_all(t->srv_fd, n, now_ns() + DRAIN_MIN_NS);
        for (int i = 0; i < n; i++)
            if (t->srv_fd[i] >= 0)
                close(t->srv_fd[i]);
    }
    ccq_tcp_server_free(t->srv);
    free(t->srv_fd);
    while (t->mail != NULL) {
        mail *m = t->mail;
        t->mail = m->next;
        free(m->tag);
        free(m->rec);
        free(m);
    }
    while (t->open != NULL) {
        open_xchg *o = t->open;
        t->open = o->next;
        open_free(o);
    }
    while (t->kept != NULL) {
        open_xchg *o = t->kept;
        t->kept = o->next;
        open_free(o);
    }
    while (t->dead != NULL) {
        dead_tag *d = t->dead;
        t->dead = d->next;
        free(d->tag);
        free(d->why);
        free(d);
    }
    ccq_tcp_buf_free(&t->in);
    ccq_tcp_buf_free(&t->hello);
    ccq_tcp_buf_free(&t->out);
    close(t->wake[0]);
    close(t->wake[1]);
    pthread_cond_destroy(&t->arrived);
    pthread_mutex_destroy(&t->mu);
    for (uint32_t r = 0; t->beats != NULL && r < t->size; r++)
        free(t->beats[r].rec);
    free(t->beats);
    free(t->mine.rec);
    free(t->addrs);
    free(t->reported);
    free(t->silent);
    free(t->peer);
    free(t);
}

static ccq_boot_peer tcp_peer_state(ccq_boot *b, uint32_t rank)
{
    tcp_boot *t = b->impl;
    ccq_boot_peer st;
    if (rank == t->rank)
        return CCQ_BOOT_PEER_ALIVE;
    pthread_mutex_lock(&t->mu);
    st = (ccq_boot_peer)t->peer[rank];
    pthread_mutex_unlock(&t->mu);
    return st;
}

static ccq_status tcp_watch(ccq_boot *b, void (*fn)(void *, uint32_t, ccq_boot_peer), void *arg)
{
    tcp_boot *t = b->impl;
    uint8_t *known = malloc(t->size);

    pthread_mutex_lock(&t->mu);
    t->watch = fn;
    t->watch_arg = arg;
    if (known != NULL)
        memcpy(known, t->peer, t->size);
    pthread_mutex_unlock(&t->mu);
    for (uint32_t r = 0; fn != NULL && known != NULL && r < t->size; r++)
        if (known[r] >= CCQ_BOOT_PEER_LEFT)
            fn(arg, r, (ccq_boot_peer)known[r]);
    free(known);
    return CCQ_OK;
}

static ccq_status tcp_beat_publish(ccq_boot *b, const void *rec, size_t len, ccq_errbuf *err)
{
    tcp_boot *t = b->impl;
    uint8_t *copy = malloc(len > 0 ? len : 1); /* kept as this process's record (mine) */
    bool ok;

    if (copy == NULL) {
        ccq_boot_err(err, "bootstrap: out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    memcpy(copy, rec, len);
    pthread_mutex_lock(&t->mu);
    ok = ccq_tcp_put_frame(&t->out, CLIENT_OUT_MAX, CCQ_TCP_BEAT, rec, len, NULL, 0, NULL, 0);
    if (ok) {
        free(t->mine.rec);
        t->mine.rec = copy;
        t->mine.len = len;
        copy = NULL;
    }
    pthread_mutex_unlock(&t->mu);
    free(copy);
    if (!ok) {
        ccq_boot_err(err, "more than %u bytes waiting for the rendezvous (or out of memory)",
                     CLIENT_OUT_MAX);
        return CCQ_ERR_NO_MEMORY;
    }
    wake_thread(t);
    return CCQ_OK;
}

static ccq_status tcp_beat_fetch(ccq_boot *b, uint32_t rank, void **rec, size_t *len,
                                 ccq_errbuf *err)
{
    tcp_boot *t = b->impl;
    ccq_status st = CCQ_IN_PROGRESS;

    pthread_mutex_lock(&t->mu);
    if (t->beats[rank].rec != NULL) {
        *rec = malloc(t->beats[rank].len);
        if (*rec == NULL) {
            ccq_boot_err(err, "bootstrap: out of memory");
            st = CCQ_ERR_NO_MEMORY;
        } else {
            memcpy(*rec, t->beats[rank].rec, t->beats[rank].len);
            *len = t->beats[rank].len;
            st = CCQ_OK;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

/* The lost processes not reported yet whose loss was (silent) or was not (!silent) a server
 * going silent, each reported once. */
static size_t take_lost(tcp_boot *t, uint32_t *ranks, size_t cap, bool silent)
{
    size_t n = 0;

    pthread_mutex_lock(&t->mu);
    for (uint32_t r = 0; r < t->size && n < cap; r++)
        if (t->peer[r] == CCQ_BOOT_PEER_LOST && !t->reported[r] && (bool)t->silent[r] == silent) {
            t->reported[r] = 1;
            ranks[n++] = r;
        }
    pthread_mutex_unlock(&t->mu);
    return n;
}

/* Processes whose connection closed without a goodbye (rank 0 saw it and told everyone; or,
 * for rank 0 itself, this process's connection to it). */
static size_t tcp_closed_peers(ccq_boot *b, uint32_t *ranks, size_t cap)
{
    return take_lost(b->impl, ranks, cap, false);
}

/* The server this process stopped hearing from (its connection open). */
static size_t tcp_silent_peers(ccq_boot *b, uint32_t *ranks, size_t cap)
{
    return take_lost(b->impl, ranks, cap, true);
}

static void tcp_beat_config(ccq_boot *b, uint64_t hb_ns, uint64_t timeout_ns)
{
    tcp_boot *t = b->impl;

    pthread_mutex_lock(&t->mu);
    t->hb_ns = timeout_ns != 0 ? hb_ns : 0;
    t->silent_ns = hb_ns != 0 ? timeout_ns : 0;
    pthread_mutex_unlock(&t->mu);
    wake_thread(t);
}

static void tcp_fault_lag(ccq_boot *b, uint64_t lag_ns)
{
    tcp_boot *t = b->impl;
    atomic_store_explicit(&t->lag_ns, lag_ns, memory_order_relaxed);
}

static bool tcp_given_up(ccq_boot *b, uint32_t *by)
{
    tcp_boot *t = b->impl;
    bool up;

    pthread_mutex_lock(&t->mu);
    up = t->gave_up;
    *by = t->given_up_by;
    pthread_mutex_unlock(&t->mu);
    return up;
}

/* Records come through the server: since this process last connected to it, until a
 * heartbeat after this process last read frames from it (it sends something every heartbeat:
 * later than that, it is the silent one, which the I/O thread sees). Both read under mu, and
 * from what the frames did, not from last_recv_ns: that one moves when bytes arrive, before
 * their frames are parsed, and when this thread was away (note_run), and a window that
 * reached past the records at hand made a live process look silent (drill_health_tcp_stop0
 * under TSan: read between the successor's first bytes and its WELCOME, the old connection's
 * start and the new one's time made every record 1 s old). */
static void tcp_relay_window(ccq_boot *b, uint64_t *since, uint64_t *until)
{
    tcp_boot *t = b->impl;

    pthread_mutex_lock(&t->mu);
    *since = t->ready_since;
    if (t->silent_ns != 0)
        *until = t->relayed_ns + t->hb_ns;
    pthread_mutex_unlock(&t->mu);
}

static uint64_t tcp_arrivals(ccq_boot *b)
{
    tcp_boot *t = b->impl;
    uint64_t n;
    pthread_mutex_lock(&t->mu);
    n = t->arrivals;
    pthread_mutex_unlock(&t->mu);
    return n;
}

/* Asleep until the I/O thread reads a frame or the connection changes (tell_waiters): a
 * process waiting for a late peer takes no CPU (polling every 20 us cost a third of a core
 * per waiting process). */
static void tcp_wait(ccq_boot *b, uint64_t seen, uint64_t until_ns)
{
    tcp_boot *t = b->impl;
    struct timespec ts = {(time_t)(until_ns / 1000000000ull), (long)(until_ns % 1000000000ull)};
    pthread_mutex_lock(&t->mu);
    while (t->arrivals == seen && now_ns() < until_ns)
        if (pthread_cond_timedwait(&t->arrived, &t->mu, &ts) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&t->mu);
}

static const ccq_boot_mech tcp_mech = {
    .name = "tcp",
    /* A test is a look at what the I/O thread already received (no system call). */
    .poll_ns = 20000,
    .arrivals = tcp_arrivals,
    .wait = tcp_wait,
    .publish = tcp_publish,
    .fetch = tcp_fetch,
    .xchg_free = tcp_xchg_free,
    .close = tcp_close,
    .beat_publish = tcp_beat_publish,
    .beat_fetch = tcp_beat_fetch,
    .closed_peers = tcp_closed_peers,
    .beat_config = tcp_beat_config,
    .fault_lag = tcp_fault_lag,
    .silent_peers = tcp_silent_peers,
    .given_up = tcp_given_up,
    .relay_window = tcp_relay_window,
    .peer_state = tcp_peer_state,
    .watch_peers = tcp_watch,
};

/* "HOST:PORT", "[V6]:PORT", "*:PORT" into host and port. */
static ccq_status parse_spec(const char *spec, char *host, size_t hl, char *port, size_t pl,
                             ccq_errbuf *err)
{
    const char *colon;
    size_t n;
    char *end;
    unsigned long pn;

    if (spec[0] == '[') {
        const char *close_br = strchr(spec, ']');
        if (close_br == NULL || close_br[1] != ':')
            goto bad;
        n = (size_t)(close_br - spec - 1);
        colon = close_br + 1;
        spec++;
    } else {
        colon = strrchr(spec, ':');
        if (colon == NULL)
            goto bad;
        n = (size_t)(colon - spec);
    }
    if (n == 0 || n >= hl)
        goto bad;
    memcpy(host, spec, n);
    host[n] = '\0';
    pn = strtoul(colon + 1, &end, 10);
    if (*end != '\0' || colon[1] < '0' || colon[1] > '9' || pn == 0 || pn > 65535)
        goto bad;
    snprintf(port, pl, "%lu", pn);
    return CCQ_OK;
bad:
    ccq_boot_err(err,
                 "bootstrap \"tcp://%s\": expected tcp://HOST:PORT (HOST a name, an address, "
                 "[an IPv6 address] or * for every interface; PORT 1 to 65535)",
                 spec);
    return CCQ_ERR_INVALID_ARGUMENT;
}

static bool is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    return sa->sa_family == AF_INET6 &&
           IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

/* Whether host is this machine's own name (short or qualified) and resolves here to loopback
 * addresses only: Debian's and Ubuntu's /etc/hosts say "127.0.1.1 HOSTNAME", so process 0
 * given its machine's name (MASTER_ADDR=node0, as Slurm recipes set it) would listen where no
 * other machine can reach it, while their resolvers give node0's network address. */
static bool own_name_on_loopback(const char *host, const struct addrinfo *res)
{
    char me[256];
    size_t hl = strlen(host), ml;
    unsigned char probe[sizeof(struct in6_addr)];

    if (inet_pton(AF_INET, host, probe) == 1 || inet_pton(AF_INET6, host, probe) == 1)
        return false; /* an address: the interface the user chose */
    if (gethostname(me, sizeof me - 1) != 0)
        return false;
    me[sizeof me - 1] = '\0';
    ml = strlen(me);
    if (ml == 0 ||
        !(strcmp(host, me) == 0 || (hl > ml && strncmp(host, me, ml) == 0 && host[ml] == '.') ||
          (ml > hl && strncmp(me, host, hl) == 0 && me[hl] == '.')))
        return false;
    for (const struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next)
        if (!is_loopback(ai->ai_addr))
            return false;
    return res != NULL;
}

/* Bind and listen at one of res's addresses (every interface: IPv6's, taking IPv4 too, first);
 * the socket, or -1 with *e the last error. */
static int listen_at(const struct addrinfo *res, bool every_interface, int *e)
{
    for (int pass = every_interface ? 0 : 1; pass < 2; pass++) {
        for (const struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
            int fd, one = 1, zero = 0;
            if (pass == 0 && ai->ai_family != AF_INET6)
                continue;
            fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                        ai->ai_protocol);
            if (fd < 0) {
                *e = errno;
                continue;
            }
            /* Rebind at once after an earlier runtime's server (its connections in TIME_WAIT). */
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            /* "::" serves IPv4 too where the system allows it (bindv6only 0 is Linux's default,
             * but a system may set it): else the next pass binds IPv4's "0.0.0.0". */
            if (pass == 0 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) != 0) {
                close(fd);
                continue;
            }
            if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0)
                return fd;
            *e = errno;
            close(fd);
        }
    }
    return -1;
}

/* The port a listening socket got (0 where it cannot say), and its address family. */
static uint16_t bound_port(int fd, int *family)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;

    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
        return 0;
    *family = ss.ss_family;
    return ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                          : ((struct sockaddr_in *)&ss)->sin_port);
}

/* Every process but 0: a listening socket from the start (every interface, as process 0's
 * for "*": listen_at; a port the kernel picks), so it can serve in place of a lost server;
 * nobody connects before that. */
static void listen_own(tcp_boot *t)
{
    struct addrinfo hints, *res = NULL;
    int e = 0, family = 0;

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(NULL, "0", &hints, &res) != 0)
        return; /* it cannot serve: the others pass it over (it sends no ADDR) */
    t->listen_fd = listen_at(res, true, &e);
    freeaddrinfo(res);
    t->own_port = t->listen_fd >= 0 ? bound_port(t->listen_fd, &family) : 0;
    t->own_v6 = family == AF_INET6;
    if (t->listen_fd >= 0 && t->own_port == 0) {
        close(t->listen_fd);
        t->listen_fd = -1;
    }
}

/* World rank 0: listen at host:port (every interface for "*", or for its own machine's name
 * where that resolves here to loopback only). */
static ccq_status serve(tcp_boot *t, ccq_errbuf *err)
{
    struct addrinfo hints, *res = NULL;
    bool any = strcmp(t->host, "*") == 0;
    int rc, e = 0;

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    rc = getaddrinfo(any ? NULL : t->host, t->port, &hints, &res);
    if (rc == 0 && !any && own_name_on_loopback(t->host, res)) {
        freeaddrinfo(res);
        res = NULL;
        any = true; /* its own connection still goes to t->host, a loopback address here */
        rc = getaddrinfo(NULL, t->port, &hints, &res);
    }
    if (rc != 0) {
        ccq_boot_err(err, "bootstrap %s: cannot resolve %s: %s", t->spec, t->host,
                     gai_strerror(rc));
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    t->listen_fd = listen_at(res, any, &e);
    freeaddrinfo(res);
    if (t->listen_fd < 0) {
        host_port_text hp;
        ccq_boot_err(err, "bootstrap %s: process 0 cannot serve the rendezvous at %s: %s%s",
                     t->spec, host_port(&hp, t->host, t->port), strerror(e),
                     e == EADDRINUSE ? " (another job, an earlier runtime, or torch.distributed's "
                                       "store on MASTER_PORT: give ccq a port of its own with "
                                       "CCQ_BOOTSTRAP=tcp://HOST:PORT)"
                                     : "");
        return CCQ_ERR_BACKEND;
    }
    if (server_start(t) != CCQ_OK) {
        ccq_boot_err(err, "bootstrap: out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    /* It connects to itself like everyone else: on loopback when it serves every interface. */
    if (strcmp(t->host, "*") == 0)
        snprintf(t->host, sizeof t->host, "127.0.0.1");
    return CCQ_OK;
}

/* "torchstore://", process 0: serve on every interface at a port the kernel picks, and say
 * which in torch's store (the others read it there: client_port_from_store). */
static ccq_status serve_via_store(tcp_boot *t, ccq_errbuf *err)
{
    char why[400];
    ccq_status st;
    int fd, family;

    snprintf(t->host, sizeof t->host, "*");
    snprintf(t->port, sizeof t->port, "0");
    st = serve(t, err);
    if (st != CCQ_OK)
        return st;
    uint16_t port = bound_port(t->listen_fd, &family);
    if (port == 0) {
        ccq_boot_err(err, "bootstrap %s: getsockname: %s", t->spec, strerror(errno));
        return CCQ_ERR_BACKEND;
    }
    snprintf(t->port, sizeof t->port, "%u", (unsigned)port);
    /* The store is up before the processes start (torchrun's agent serves it): a short wait. */
    fd = ccq_torch_store_connect(t->store_host, t->store_port, now_ns() + 10000000000ull, why,
                                 sizeof why);
    if (fd < 0 || !ccq_torch_store_set(fd, t->store_key, t->port, strlen(t->port),
                                       now_ns() + 10000000000ull, why, sizeof why)) {
        if (fd >= 0)
            close(fd);
        ccq_boot_err(err, "bootstrap %s: process 0 cannot say where it serves: %s", t->spec, why);
        return CCQ_ERR_BACKEND;
    }
    close(fd);
    return CCQ_OK;
}

ccq_status ccq_boot_tcp_open(ccq_boot *b, const char *spec, bool via_torch_store, ccq_errbuf *err)
{
    tcp_boot *t = calloc(1, sizeof *t);
    ccq_status st;

    if (t == NULL) {
        ccq_boot_err(err, "bootstrap: out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    t->fd = t->listen_fd = t->wake[0] = t->wake[1] = t->store_fd = -1;
    t->ran_ns = now_ns();
    atomic_init(&t->lag_ns, 0);
    t->rank = b->rank;
    t->size = b->size;
    t->gen = b->gen;
    t->nonce = b->nonce;
    t->retry_ns = RETRY_NS;
    snprintf(t->job, sizeof t->job, "%s", b->job);
    snprintf(t->spec, sizeof t->spec, "%s%.280s", via_torch_store ? "torchstore://" : "tcp://",
             spec);
    ccq_tcp_default_limits(&t->lim, b->size);
    pthread_mutex_init(&t->mu, NULL);
    {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&t->arrived, &ca);
        pthread_condattr_destroy(&ca);
    }
    t->peer = calloc(b->size, 1);
    t->reported = calloc(b->size, 1);
    t->silent = calloc(b->size, 1);
    t->beats = calloc(b->size, sizeof *t->beats);
    t->addrs = calloc(b->size, sizeof *t->addrs);
    st = parse_spec(spec, t->host, sizeof t->host, t->port, sizeof t->port, err);
    if (st == CCQ_OK && (t->peer == NULL || t->reported == NULL || t->silent == NULL ||
                         t->beats == NULL || t->addrs == NULL)) {
        ccq_boot_err(err, "bootstrap: out of memory");
        st = CCQ_ERR_NO_MEMORY;
    }
    if (st == CCQ_OK && via_torch_store) {
        /* Keyed by job, torchrun's restart (its store outlives a restart's processes) and
         * this process's runtime (generation): never an earlier one's port. */
        const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");
        snprintf(t->store_host, sizeof t->store_host, "%s", t->host);
        snprintf(t->store_port, sizeof t->store_port, "%s", t->port);
        snprintf(t->store_key, sizeof t->store_key, "ccq/rendezvous/%.200s/%s/%u", t->job,
                 restart != NULL && *restart != '\0' ? restart : "0", t->gen);
        t->port[0] = '\0'; /* ccq's own: read from the store */
        if (strcmp(t->host, "*") == 0) {
            ccq_boot_err(err,
                         "bootstrap %s: \"*\" names no store: give the address of torch's "
                         "store (torchstore://MASTER_ADDR:MASTER_PORT)",
                         t->spec);
            st = CCQ_ERR_INVALID_ARGUMENT;
        }
    }
    if (st == CCQ_OK && strcmp(t->host, "*") == 0 && b->rank != 0) {
        ccq_boot_err(err,
                     "bootstrap %s: \"*\" says where process 0 listens; the others need its "
                     "address (give every process other than 0 tcp://ADDRESS_OF_0:%s)",
                     t->spec, t->port);
        st = CCQ_ERR_INVALID_ARGUMENT;
    }
    if (st == CCQ_OK && pipe2(t->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        ccq_boot_err(err, "bootstrap: pipe: %s", strerror(errno));
        st = CCQ_ERR_BACKEND;
    }
    if (st == CCQ_OK && b->rank == 0)
        st = via_torch_store ? serve_via_store(t, err) : serve(t, err);
    else if (st == CCQ_OK)
        listen_own(t);
    if (st == CCQ_OK) {
        b->mech = &tcp_mech;
        b->impl = t;
        if (pthread_create(&t->thread, NULL, io_main, t) != 0) {
            ccq_boot_err(err, "bootstrap: cannot start its I/O thread");
            st = CCQ_ERR_NO_MEMORY;
        } else {
            t->thread_started = true;
        }
    }
    if (st != CCQ_OK) {
        b->mech = NULL;
        b->impl = NULL;
        if (t->listen_fd >= 0)
            close(t->listen_fd);
        if (t->wake[0] >= 0) {
            close(t->wake[0]);
            close(t->wake[1]);
        }
        ccq_tcp_server_free(t->srv);
        free(t->srv_fd);
        free(t->peer);
        free(t->reported);
        free(t->silent);
        free(t->beats);
        free(t->addrs);
        pthread_cond_destroy(&t->arrived);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return st;
    }
    return CCQ_OK;
}
