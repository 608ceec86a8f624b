/* The heartbeat record: what each process publishes through its bootstrap every
 * heartbeat_ms (runtime/health/monitor.c), and what tools/ccq-trace's `status` reads. A
 * fixed header, the processes this one knows to be lost, then its progress on each
 * communicator spanning processes. Native byte order (a world is one architecture); the
 * layout is documented in docs/multiprocess.md ("The heartbeat record") for tools. */
#ifndef CCQ_RUNTIME_HEALTH_RECORD_H
#define CCQ_RUNTIME_HEALTH_RECORD_H

#include <stddef.h>
#include <stdint.h>

#define CCQ_HB_MAGIC   0x48514343u /* "CCQH" */
#define CCQ_HB_VERSION 2u          /* 2: suspicions (CCQ_HOW_SUSPECT) in the loss list */

/* The writer's own state (ccq_process_state values). */
enum {
    CCQ_HB_ALIVE = 0,
    CCQ_HB_LOST = 1 /* fenced off: it learned it was declared lost */,
    CCQ_HB_LEFT = 2
};

/* How a loss was seen (ccq_hb_lost.how). */
enum {
    CCQ_HOW_HEARTBEAT = 0, /* its heartbeat was older than heartbeat_timeout_ms */
    CCQ_HOW_EXITED = 1,    /* the OS said its process exited (pidfd, same host) */
    CCQ_HOW_CLOSED = 2,    /* its rendezvous connection closed */
    CCQ_HOW_ENGINE = 3,    /* the data engine reported the peer failed (UCX peer error) */
    CCQ_HOW_SILENT = 4,    /* it served the tcp rendezvous, and nothing came from it for
                            * heartbeat_timeout_ms (stopped: its connection stays open) */
    CCQ_HOW_CUT_OFF = 5,   /* it declared itself: it heard no quorum of the processes for
                            * 2 x heartbeat_timeout_ms (a network partition, its own link) */
    CCQ_HOW_SUSPECT = 6,   /* not a loss: the writer's data engine reported that peer failed,
                            * and the judge has not decided yet (runtime/health/judge.c); listed
                            * after the losses, by == the writer, never relayed */
    CCQ_HOW_COUNT_
};

typedef struct ccq_hb_head {
    uint32_t magic;
    uint16_t version;
    uint16_t head_size; /* sizeof(ccq_hb_head) */
    uint32_t world_size;
    uint32_t rank;
    uint64_t nonce;       /* the writer's bootstrap nonce (an earlier job's record is refused) */
    uint64_t beat;        /* 1, 2, ...: a reader sees it advance */
    uint64_t realtime_ns; /* CLOCK_REALTIME when written (for tools; ccq itself times ages
                             with its own clock from when `beat` advanced) */
    uint32_t state;       /* CCQ_HB_* */
    uint32_t pid;
    uint64_t host_id;    /* hash of the boot id and pid namespace: same value = same host,
                            where the pid can be watched (pidfd) */
    uint64_t start_time; /* the process's start time (clock ticks since boot), so a pid reused
                            by another process is not taken for it */
    uint32_t heartbeat_ms, heartbeat_timeout_ms;
    uint32_t first_device, ndevices; /* its global device ids */
    uint32_t nlost;                  /* ccq_hb_lost entries that follow */
    uint32_t ncomms;                 /* ccq_hb_comm entries after those */
    char hostname[64];
} ccq_hb_head;

/* A process the writer knows to be lost: it saw it (by == the writer) or learned it from
 * another process's record (by == that one, relayed so the word outlives its first bearer).
 * After the losses, the writer's own suspicions (how CCQ_HOW_SUSPECT): no loss, only its data
 * engine's word, which the judge weighs with the others' (runtime/health/judge.c). */
typedef struct ccq_hb_lost {
    uint32_t rank;
    uint32_t by;  /* the process that saw it first */
    uint32_t how; /* CCQ_HOW_* */
    uint32_t reserved;
    uint64_t hb_age_ns;   /* age of its last heartbeat when it was declared */
    uint64_t realtime_ns; /* when it was declared (CLOCK_REALTIME of `by`) */
} ccq_hb_lost;

/* The writer's progress on one communicator spanning processes, followed by nranges pairs
 * of uint32_t (first, last): its sorted device set as ranges. */
typedef struct ccq_hb_comm {
    uint64_t hash; /* the runtime's hash of the device set (the same in every process) */
    uint32_t ndevices, nranges;
    uint64_t submitted, completed;
    uint32_t pending_kind; /* ccq_kind, or UINT32_MAX when nothing is pending */
    uint32_t reserved;
    uint64_t pending_seq;
    uint64_t pending_age_ns;
} ccq_hb_comm;

/* At most this many communicators (and ranges per communicator) go into one record; the
 * rest are left out (the record stays below the bootstrap's CCQ_BOOT_BEAT_MAX). */
#define CCQ_HB_MAX_COMMS  128u
#define CCQ_HB_MAX_RANGES 16u

/* A decoded record: pointers into the bytes it was decoded from. */
typedef struct ccq_hb_view {
    const ccq_hb_head *head;
    const ccq_hb_lost *lost;    /* [head->nlost] */
    const unsigned char *comms; /* head->ncomms entries, each ccq_hb_comm + ranges */
} ccq_hb_view;

/* Check a record's framing (magic, version, sizes, counts within len); aligned copies are the
 * caller's (records come from malloc). 0 on success, else -1 with why. */
int ccq_hb_decode(const void *rec, size_t len, ccq_hb_view *out, const char **why);
/* The next communicator entry of a decoded record (cursor starts at view->comms); ranges
 * points at its 2 * nranges uint32_t. */
const ccq_hb_comm *ccq_hb_next_comm(const unsigned char **cursor, const uint32_t **ranges);
/* Bytes of one communicator entry with nranges ranges. */
static inline size_t ccq_hb_comm_size(uint32_t nranges)
{
    return sizeof(ccq_hb_comm) + (size_t)nranges * 2 * sizeof(uint32_t);
}

#endif /* CCQ_RUNTIME_HEALTH_RECORD_H */
