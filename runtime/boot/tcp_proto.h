/* The tcp:// rendezvous: its wire format and its server, without sockets (runtime/boot/tcp.c
 * moves the bytes; tests/fuzz/fuzz_tcp.c feeds the server hostile ones).
 *
 * Frames: u32 magic "CCQT", u16 version, u16 type, u32 length, then length bytes; native
 * byte order, as the bootstrap's records (a world is one architecture; a byte-swapped magic
 * is refused as another protocol). A client says HELLO (its world rank and size, its
 * bootstrap generation, nonce and job id); the server (world rank 0) WELCOMEs it or REFUSEs
 * it with a reason. Then PUT publishes this process's record of an exchange (the
 * bootstrap's record, checked: the writer's rank, world size, generation, tag), GET asks for
 * every other member's record of that exchange, sent as REC when it arrives. A record leaves
 * the server's memory once every member took it. BYE says the process leaves cleanly; the
 * server tells every other process when one LEFT or was LOST (its connection closed without
 * BYE), as PEER. Job health (runtime/health/): BEAT replaces this process's heartbeat record
 * at the server, which passes the latest of each process to every other one as BEATS (a
 * reader that falls behind gets only the newest: at most one record per process queued).
 * Taking over: every process but 0 listens from the start and says where (ADDR, its first
 * frame once WELCOMEd, so whoever got a record of it knows where it would serve); the server
 * tells everyone (ADDRS). When the serving process is lost, the lowest surviving process
 * serves in its place, seeded with the states its peers are known to be in, and every
 * survivor connects to it, says HELLO again and re-sends its open exchanges, and offers the
 * records of the exchanges it finished lately (HAD: a member may not have been sent them
 * before the server was lost; the server passes them to whoever asks and forgets them once
 * every member still there has its own in or had them) (runtime/boot/tcp.c): losing process 0
 * is survivable like any other loss.
 * An observer that is not a process of the job (`ccq-trace status tcp://...`) says LOOK
 * instead of HELLO: it gets the world's states and every heartbeat record once (LOOKED, then
 * BEATS), and the server closes; it takes no rank, so it cannot disturb the job.
 * A stopped server: with heartbeats on, the server sends every process something at least
 * every heartbeat_ms (PING when nothing else went), so a process that hears nothing from it
 * for heartbeat_timeout_ms knows it stopped (SIGSTOP, a hung host) and takes over as for a
 * closed connection. The server, continued, finds its clients' connections closed after a
 * gap in its own run: before it reports any of them lost it asks the lowest other process
 * that would serve (LOOK, as an observer): when that one serves and lists this process as
 * lost, this process was given up, and it stops serving and is fenced off (runtime/boot/
 * tcp.c, "given up"). */
#ifndef CCQ_RUNTIME_BOOT_TCP_PROTO_H
#define CCQ_RUNTIME_BOOT_TCP_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h" /* ccq_errbuf */

#define CCQ_TCP_MAGIC   0x54514343u /* "CCQT" */
#define CCQ_TCP_VERSION 1u          /* HAD came later, additive: a server without it refuses it */
#define CCQ_TCP_HDR     12u         /* magic, version, type, length */

enum {
    CCQ_TCP_HELLO = 1,   /* c->s: u32 rank, u32 size, u32 gen, u32 0, u64 nonce, job bytes */
    CCQ_TCP_WELCOME = 2, /* s->c: u32 size */
    CCQ_TCP_REFUSE = 3,  /* s->c: u32 code (CCQ_TCP_REFUSE_*), text */
    CCQ_TCP_PUT = 4,     /* c->s: u16 tag length, tag, record */
    CCQ_TCP_GET = 5,     /* c->s: u16 tag length, tag */
    CCQ_TCP_REC = 6,     /* s->c: u32 writer rank, u16 tag length, tag, record */
    CCQ_TCP_BYE = 7,     /* c->s: nothing */
    CCQ_TCP_PEER = 8,    /* s->c: u32 rank, u32 state (CCQ_BOOT_PEER_*) */
    CCQ_TCP_ERR = 9,     /* s->c: u16 tag length, tag, text: a PUT or GET of it refused */
    CCQ_TCP_BEAT = 10,   /* c->s: this process's heartbeat record (CCQ_BOOT_BEAT_MAX at most) */
    CCQ_TCP_BEATS = 11,  /* s->c: u32 rank, that process's latest heartbeat record */
    CCQ_TCP_LOOK = 12,   /* c->s, instead of HELLO: an observer (`ccq-trace status`): job bytes */
    CCQ_TCP_LOOKED = 13, /* s->c: u32 size, u32 gen, u8 state per process, job bytes; then one
                          * BEATS per process that has a record; then the server closes */
    CCQ_TCP_ADDR = 14,   /* c->s: u16 port, address text: where this process would serve */
    CCQ_TCP_ADDRS = 15,  /* s->c: u32 rank, u16 port, address text: another process's ADDR */
    CCQ_TCP_PING = 16,   /* s->c: nothing; the server runs (nothing else went for heartbeat_ms) */
    CCQ_TCP_HAD = 17,    /* c->s: u16 tag length, tag, u32 n, n member ranks, record: an
                          * exchange this process finished, offered to a server taking over */
};

/* The longest address text of ADDR (an IPv6 address in text is at most 45 bytes). */
#define CCQ_TCP_ADDR_MAX 64u

/* REFUSE codes: final, or "try again" (the server serves another generation of the job: the
 * process 0 of an earlier runtime still runs, the one for this runtime comes next). */
enum { CCQ_TCP_REFUSE_FINAL = 1, CCQ_TCP_REFUSE_RETRY = 2 };

/* One parsed frame; payload points into the parsed buffer. */
typedef struct ccq_tcp_frame {
    uint16_t type;
    uint32_t len;
    const uint8_t *payload;
} ccq_tcp_frame;

/* The frame at the start of buf[0..len): 1 with *f and *used (bytes it takes), 0 when more
 * bytes are needed, -1 when it is not a frame of this protocol or longer than frame_max
 * (err says which). */
int ccq_tcp_parse(const uint8_t *buf, size_t len, size_t frame_max, ccq_tcp_frame *f, size_t *used,
                  ccq_errbuf *err);

/* A growable byte queue (what a connection has to send, or has received). */
typedef struct ccq_tcp_buf {
    uint8_t *p;
    size_t off, len, cap; /* bytes [off, len) are pending */
} ccq_tcp_buf;

/* Append a frame of type whose payload is the concatenation of up to three pieces; false when
 * out of memory or the queue would exceed max bytes pending. */
bool ccq_tcp_put_frame(ccq_tcp_buf *b, size_t max, uint16_t type, const void *a, size_t alen,
                       const void *b2, size_t blen, const void *c, size_t clen);
void ccq_tcp_buf_consume(ccq_tcp_buf *b, size_t n);
/* Room for `more` bytes after what is pending; false when out of memory. */
bool ccq_tcp_buf_reserve(ccq_tcp_buf *b, size_t more);
void ccq_tcp_buf_free(ccq_tcp_buf *b);

/* ---- the server ------------------------------------------------------------------------- */

typedef struct ccq_tcp_limits {
    size_t frame_max;   /* largest frame accepted (a record and its tag) */
    size_t mem_max;     /* records held at once, in bytes, over every exchange */
    size_t out_max;     /* bytes queued for one connection (a client that does not read) */
    uint32_t conns_max; /* connections at once (world_size of them, plus ones not yet known) */
    uint32_t tags_max;  /* exchanges held at once */
    uint64_t hello_ns;  /* a connection must say HELLO within this */
    uint64_t stall_ns;  /* a frame begun must end, queued output must drain, within this */
} ccq_tcp_limits;

/* Defaults (CCQ_TCP_STALL_MS overrides hello_ns and stall_ns: tests of slow clients). */
void ccq_tcp_default_limits(ccq_tcp_limits *lim, uint32_t world_size);

typedef struct ccq_tcp_server ccq_tcp_server;

/* A process's state as the server sees it (CCQ_BOOT_PEER_* values). */
ccq_tcp_server *ccq_tcp_server_new(const char *job, uint32_t world_size, uint32_t gen,
                                   const ccq_tcp_limits *lim);
void ccq_tcp_server_free(ccq_tcp_server *s);
/* A new connection: its id (>= 0), or -1 when the server holds conns_max already (close it). */
int ccq_tcp_server_open(ccq_tcp_server *s, uint64_t now_ns);
/* Bytes read from connection id. false: close it once its output is written (it was refused,
 * or sent what is not this protocol). */
bool ccq_tcp_server_input(ccq_tcp_server *s, int id, const void *data, size_t len, uint64_t now_ns);
/* What connection id has to send: *p and *len (0 when nothing); then say how much went out. */
void ccq_tcp_server_output(ccq_tcp_server *s, int id, const uint8_t **p, size_t *len);
void ccq_tcp_server_sent(ccq_tcp_server *s, int id, size_t n, uint64_t now_ns);
/* True when id is to be closed (after its output, if any, is written). */
bool ccq_tcp_server_closing(const ccq_tcp_server *s, int id);
/* The connection is gone (closed by either side): forget it; a process that had said HELLO
 * and not BYE is LOST, and the others are told. */
void ccq_tcp_server_closed(ccq_tcp_server *s, int id, uint64_t now_ns);
/* Timeouts: ids of connections to close now (at most cap); *next_ns: when to look again. */
size_t ccq_tcp_server_tick(ccq_tcp_server *s, uint64_t now_ns, int *ids, size_t cap,
                           uint64_t *next_ns);
/* Heartbeats on: queue a PING to every process that was sent nothing for interval_ns
 * (ccq_tcp_server_tick does it), so its silence means it stopped; 0 (the default): none. */
void ccq_tcp_server_keepalive(ccq_tcp_server *s, uint64_t interval_ns);
/* Whether connection id is a process of the job that said HELLO and not BYE (its close
 * would make it LOST): true with *rank. */
bool ccq_tcp_server_conn_member(const ccq_tcp_server *s, int id, uint32_t *rank);
/* A server taking over from a lost one: rank is already LEFT or LOST (state), so it cannot
 * rejoin and newcomers are told. */
void ccq_tcp_server_mark(ccq_tcp_server *s, uint32_t rank, uint32_t state);
/* The server's own process leaves cleanly: tell every connection it is LEFT. */
void ccq_tcp_server_leaving(ccq_tcp_server *s, uint32_t rank, uint64_t now_ns);
/* Bytes the server holds (records, heartbeats, queued output, input buffers): bounded by the
 * limits. */
size_t ccq_tcp_server_memory(const ccq_tcp_server *s);
/* How many connections it has (ids are below this bound). */
int ccq_tcp_server_conn_bound(const ccq_tcp_server *s);

#endif /* CCQ_RUNTIME_BOOT_TCP_PROTO_H */
