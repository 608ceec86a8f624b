/* The bootstrap's private parts: the handle, an exchange, the record every mechanism
 * carries, and the interface each mechanism (file.c, store.c, mpi.c, tcp.c)
 * implements. Only the files of runtime/boot/ and modules/mpi.c include this. */
#ifndef CCQ_RUNTIME_BOOT_IMPL_H
#define CCQ_RUNTIME_BOOT_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "runtime/boot/bootstrap.h"

/*
 * What a process publishes for one exchange: this header, the tag (tag_len bytes, no NUL),
 * then len bytes of payload. The header lets every receiver check what all members must
 * agree on (world size, generation, member set, len, the tag itself when a key or name is a
 * hash of it) and who wrote it (rank, nonce), so a wrong or stale record is refused with a
 * detail instead of being taken as data. Native byte order: a world is one architecture
 * (a byte-swapped magic is reported as such).
 */
#define CCQ_BOOT_MAGIC   0x42514343u /* "CCQB" */
#define CCQ_BOOT_VERSION 1u
typedef struct ccq_boot_hdr {
    uint32_t magic;
    uint16_t version;
    uint16_t hdr_size;
    uint32_t world_size;
    uint32_t rank; /* the writer's world rank */
    uint32_t gen;  /* the writer's boot generation (see ccq_boot.gen) */
    uint32_t nmembers;
    uint64_t nonce;        /* the writer's boot nonce: random per ccq_boot_open */
    uint64_t members_hash; /* FNV-1a of the member list */
    uint32_t tag_len;
    uint32_t reserved;
    uint64_t len; /* payload bytes */
} ccq_boot_hdr;

struct ccq_boot_mech;

struct ccq_boot {
    const struct ccq_boot_mech *mech;
    void *impl; /* the mechanism's state */
    /* Serialises every call on the handle and its exchanges (see bootstrap.h). */
    pthread_mutex_t lock;
    char name[1024]; /* "mpi", "file:DIR", "store" */
    char job[256];
    uint32_t rank, size;
    /* How many ccq_boot_open calls for this job and world rank this process made before
     * this one: the k-th runtime of each rank meets the k-th of the others, so a second
     * runtime in the same process never reads the first one's records (the store cannot
     * delete them). 0 for mechanisms with a private channel per handle (MPI). */
    uint32_t gen;
    uint64_t nonce;
    uint64_t *nonces;            /* per world rank: the nonce first seen from it, 0 = none */
    struct ccq_boot_xchg *xchgs; /* live exchanges (freed at close) */
    char **tags;                 /* tags posted so far (a tag is used once) */
    char note[256]; /* set by a mechanism: what it still waits for (added to timeouts) */
    size_t ntags, tags_cap;
};

struct ccq_boot_xchg {
    ccq_boot *boot;
    struct ccq_boot_xchg *next, *prev;
    char *tag;
    uint32_t *members;
    uint32_t n, self; /* self: this process's index in members */
    uint64_t members_hash;
    size_t len;
    unsigned char *data; /* n * len: the records' payloads in member order */
    bool *got;
    uint32_t ngot;
    unsigned char *rec; /* this process's encoded record (header, tag, payload) */
    size_t rec_len;
    ccq_status status;     /* CCQ_IN_PROGRESS, CCQ_OK or the sticky error */
    uint64_t next_poll_ns; /* no mechanism round before this (see xchg_test_locked) */
    uint64_t start_ns;     /* when this process opened it (poll_gap) */
    ccq_errbuf detail;
    void *mech_priv;
};

/* A mechanism. Called with the boot's lock held. */
typedef struct ccq_boot_mech {
    const char *name;
    uint64_t poll_ns; /* suggested interval between tests */
    /* A mechanism whose every round asks a shared service (a file system, the embedder's
     * store): an exchange that has waited long tests less often, up to this (0: every
     * poll_ns however long it waits; see poll_gap in bootstrap.c). */
    uint64_t poll_max_ns;
    /* Each handle talks on a channel of its own (MPI: its own communicator), so records of
     * another handle can never be read and the generation is not needed (always 0). */
    bool private_channel;
    /* Publish x->rec to the other members (or store it to send later). */
    ccq_status (*publish)(ccq_boot *b, ccq_boot_xchg *x, ccq_errbuf *err);
    /* Optional, once per test before fetching: progress (MPI: sends, incoming). CCQ_OK,
     * CCQ_IN_PROGRESS when nothing can arrive yet, or an error. */
    ccq_status (*progress)(ccq_boot *b, ccq_boot_xchg *x, ccq_errbuf *err);
    /* Member `rank`'s record for x: CCQ_OK with *rec (malloc'd; the caller frees it) and
     * *len, CCQ_IN_PROGRESS while absent, or an error. */
    ccq_status (*fetch)(ccq_boot *b, ccq_boot_xchg *x, uint32_t rank, void **rec, size_t *len,
                        ccq_errbuf *err);
    /* Optional: x is being freed. */
    void (*xchg_free)(ccq_boot *b, ccq_boot_xchg *x);
    void (*close)(ccq_boot *b);
    /* Job health (runtime/health/), optional: NULL when the mechanism carries no heartbeats
     * (MPI). Publish this process's heartbeat record, replacing the previous one (file:
     * rewritten in place; store: the key set again; tcp: over its open connection). */
    ccq_status (*beat_publish)(ccq_boot *b, const void *rec, size_t len, ccq_errbuf *err);
    /* The latest heartbeat record of `rank`: CCQ_OK with *rec (malloc'd; the caller frees it)
     * and *len, CCQ_IN_PROGRESS while it has none, or an error. */
    ccq_status (*beat_fetch)(ccq_boot *b, uint32_t rank, void **rec, size_t *len, ccq_errbuf *err);
    /* Optional: the processes whose connection closed (the OS says they are gone; tcp):
     * writes up to cap world ranks, returns how many there are. Each is reported once. */
    size_t (*closed_peers)(ccq_boot *b, uint32_t *ranks, size_t cap);
    /* Optional (tcp): ccq_boot_beat_config, ccq_boot_silent_peers, ccq_boot_given_up,
     * ccq_boot_relay_window. */
    void (*beat_config)(ccq_boot *b, uint64_t hb_ns, uint64_t timeout_ns);
    size_t (*silent_peers)(ccq_boot *b, uint32_t *ranks, size_t cap);
    bool (*given_up)(ccq_boot *b, uint32_t *by);
    void (*relay_window)(ccq_boot *b, uint64_t *since, uint64_t *until);
    /* Optional (tcp): ccq_boot_fault_lag. */
    void (*fault_lag)(ccq_boot *b, uint64_t lag_ns);
    /* Optional (tcp): ccq_boot_peer_state and ccq_boot_watch_peers. */
    ccq_boot_peer (*peer_state)(ccq_boot *b, uint32_t rank);
    ccq_status (*watch_peers)(ccq_boot *b, void (*fn)(void *, uint32_t, ccq_boot_peer), void *arg);
    /* Optional (tcp: its I/O thread receives on its own), called without the boot's lock:
     * ccq_boot_xchg_wait sleeps in `wait` instead of polling. `arrivals` counts what may end
     * an exchange (a record, a refusal, a change of the connection); `wait` returns once it
     * differs from `seen` (read before the test that found nothing) or at until_ns. */
    uint64_t (*arrivals)(ccq_boot *b);
    void (*wait)(ccq_boot *b, uint64_t seen, uint64_t until_ns);
} ccq_boot_mech;

/* The largest heartbeat record a mechanism carries (runtime/health/record.h stays below). */
#define CCQ_BOOT_BEAT_MAX (64u * 1024u)

/* Mechanism constructors: fill b->mech and b->impl, or fail with err. */
ccq_status ccq_boot_file_open(ccq_boot *b, const char *dir, ccq_errbuf *err);
ccq_status ccq_boot_store_open(ccq_boot *b, const ccq_store *store, ccq_errbuf *err);
/* In libccq-mpi.so (modules/mpi.c), reached through its ccq_boot_module. */
ccq_status ccq_boot_mpi_open(ccq_boot *b, int64_t mpi_comm, ccq_errbuf *err);
/* spec: what follows "tcp://" ("HOST:PORT", "*:PORT", "[V6]:PORT"), or "torchstore://"
 * (via_torch_store: HOST:PORT is torch's TCPStore, where process 0 says its own port). */
ccq_status ccq_boot_tcp_open(ccq_boot *b, const char *spec, bool via_torch_store, ccq_errbuf *err);
/* tcp.c: wait for fd to be ready for `events` until deadline (ns, ccq_boot_now_ns's clock): > 0
 * ready, 0 not in time, < 0 an error (torch_store.c's blocking calls use it too). */
int ccq_boot_wait_fd(int fd, short events, uint64_t deadline);

/* A mechanism in a module (backends/module.h: ccq_module.bootstrap): its constructor. The
 * handle and exchange structs above, the record header and ccq_boot_mech cross the module
 * boundary with it: changing them changes CCQ_MODULE_ABI. */
typedef struct ccq_boot_module {
    ccq_status (*open)(ccq_boot *b, int64_t mpi_comm, ccq_errbuf *err);
} ccq_boot_module;

/* Stateless helpers (helpers.c; the MPI module links its own copy). */
void ccq_boot_err(ccq_errbuf *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint64_t ccq_boot_fnv1a(const void *p, size_t n, uint64_t h);
#define CCQ_FNV_OFFSET 0xcbf29ce484222325ull

#endif /* CCQ_RUNTIME_BOOT_IMPL_H */
