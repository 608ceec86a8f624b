/* A trace dump as plain data: what runtime/trace/recorder.c copies out of a runtime (under its
 * locks) and runtime/trace/json.c writes, so the writer needs no runtime, no locks, and can be fed
 * a hand-built view (tests/test_trace_json.c) or, later, views read back from files. */
#ifndef CCQ_RUNTIME_TRACE_VIEW_H
#define CCQ_RUNTIME_TRACE_VIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ccq.h"

#define CCQ_TRACE_NOTE_LEN 512

/* The text of an error (watchdog desync report, abort, mismatch, backend failure). */
typedef struct ccq_note {
    uint64_t time_ns; /* CLOCK_MONOTONIC, like the events */
    uint32_t type;    /* ccq_event_type of the event it explains */
    char text[CCQ_TRACE_NOTE_LEN];
} ccq_note;

/* A communicator as events name it (ccq_event.comm indexes the view's array). */
typedef struct ccq_trace_comm {
    char devices[64];         /* its device set, "{0,1,2,3}" (long sets elided) */
    const ccq_device_id *ids; /* the whole set, sorted global ids (NULL: only the text) */
    uint32_t n;
} ccq_trace_comm;

/* The version of the dump's "ccq" header section and of the per-command fields that
 * tools/ccq-trace reads. Bumped when either changes incompatibly; ccq-trace refuses dumps
 * of a format it does not know, and mixes of formats. */
#define CCQ_TRACE_FORMAT 1

/* Who wrote the dump and on which clock: "otherData" and the "ccq" section of the JSON.
 * The identity (world rank and size, the global device ids this process owns, pid, host)
 * and the clock offset let tools/ccq-trace line dumps of several processes up. */
typedef struct ccq_trace_header {
    const char *backend; /* the backend's name */
    uint32_t ndev;       /* this process's devices: events' device - dev_first < ndev */
    uint32_t max_streams;
    uint64_t t0_ns;   /* CLOCK_MONOTONIC time shown as ts 0 (the first event's) */
    uint64_t dropped; /* events lost to overwriting before this copy */
    /* ---- the process in its world (format 1) ---- */
    uint32_t world_rank, world_size;
    uint32_t dev_first; /* global id of this process's first device */
    /* This host's processes outnumber the cores they may run on (ccq_world.crowded): their
     * threads take turns, and the rules that pay with a core each are off. */
    bool crowded;
    int64_t pid;                /* 0: not written (a hand-built view) */
    const char *host;           /* NULL: not written */
    uint64_t dump_ns;           /* CLOCK_MONOTONIC when the copy was taken; 0 = unknown */
    int64_t realtime_offset_ns; /* CLOCK_REALTIME - CLOCK_MONOTONIC, measured at the dump */
    const char *reason; /* why it was written ("destroy", "error", "fence timeout", "signal",
                           "api"); NULL */
} ccq_trace_header;

typedef struct ccq_trace_view {
    ccq_trace_header hdr;
    ccq_event *ev; /* sorted by time (then type, id), as ccq_trace_snapshot returns them */
    size_t nev;
    ccq_note *notes; /* oldest first */
    size_t nnotes;
    ccq_trace_comm *comms; /* by communicator id */
    uint32_t ncomms;
} ccq_trace_view;

/* Write a view as Chrome Trace Event Format JSON (runtime/trace/json.c). Reads only `v`; any
 * thread. Returns 0, or -1 if memory or a write to `f` failed. */
int ccq_trace_write_json(FILE *f, const ccq_trace_view *v);

#endif /* CCQ_RUNTIME_TRACE_VIEW_H */
