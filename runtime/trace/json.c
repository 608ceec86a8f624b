/* The flight recorder as Chrome Trace Event Format JSON (Perfetto UI, chrome://tracing).
 *
 * Layout: one process per device, and per stream s three tracks (tid = 3s + k):
 *   k = 0 "stream s: submitted"  a short slice at each submission (the start of its flow arrow)
 *   k = 1 "stream s: in flight"  one slice per command, issued -> completed/failed; a stream
 *                                has one batch in flight at a time, so these never overlap
 *   k = 2 "stream s: fences"     one slice per ccq_sync_collective call
 * Time spent queued (submitted -> issued) is an async slice per command ("queued" category),
 * which viewers stack as needed. One more process, "ccq scheduler", has a "batches" track
 * (one slice per batch, from the start of issuing to its end) and a "matching" track
 * (instants when an operation has all its parts); flow arrows go from each submission to the
 * batch that issued it. Watchdog timeouts and aborts are global instants. Fused engine
 * operations (docs/fusion.md) are slices on the scheduler's "fused operations" track, with a
 * flow arrow from each part's in-flight slice to the fused operation it ran in.
 *
 * The writer reads only a ccq_trace_view (runtime/trace/view.h): plain data, no runtime, no
 * locks. Each section has its emitter; events are written in the view's (time) order. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/kinds.h"
#include "runtime/trace/view.h"

#define SUBMIT_SLICE_US                                                                            \
    0.2 /* widest submission marker slice (narrower if the next one is                             \
           closer: slices of one track must nest, never partly overlap) */

/* A command's state at the dump, the newest event of it the view holds ("state" in every
 * event about it: what tools/ccq-trace judges). */
enum { ST_NONE, ST_QUEUED, ST_ISSUED, ST_COMPLETED, ST_FAILED };
static const char *const state_names[] = {"?", "queued", "issued", "completed", "failed"};

typedef struct cmd_info {
    uint64_t submit, issue, batch;
    size_t submit_k, issue_k; /* the SUBMITTED and ISSUED events' indexes in the view */
    bool have_submit, have_issue;
    uint8_t state; /* ST_* */
} cmd_info;

/* The writer's state: the view, and what it learns from the events as it goes. */
typedef struct jw {
    FILE *f;
    const ccq_trace_view *v;
    uint64_t t0;
    uint32_t sched_pid; /* the "ccq scheduler" process, after the devices (pid = global id) */
    bool first;         /* nothing written to traceEvents yet (no separator) */
    cmd_info *ci;       /* per command id in [idmin, idmax] */
    uint64_t idmin, idmax;
    uint64_t *next_sub; /* per submission event: the next one's time on its stream */
    struct {
        uint64_t id, t0;
    } * fused; /* the fused operations seen so far (their start: where parts' flows point) */
    size_t nfused, capfused;
    char name[96];
} jw;

static const char *sep(jw *w)
{
    return w->first ? (w->first = false, "") : ",\n";
}

/* A JSON string literal (escapes quotes, backslashes and control characters). */
static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static double us(uint64_t t, uint64_t t0)
{
    return t >= t0 ? (double)(t - t0) / 1e3 : -(double)(t0 - t) / 1e3;
}

static const char *op_name(jw *w, const ccq_event *e)
{
    switch (e->kind) {
    case CCQ_KIND_SEND:
        snprintf(w->name, sizeof w->name, "send #%" PRIu64 " to %u", e->seq, e->peer);
        break;
    case CCQ_KIND_RECV:
        snprintf(w->name, sizeof w->name, "recv #%" PRIu64 " from %u", e->seq, e->peer);
        break;
    default:
        snprintf(w->name, sizeof w->name, "%s #%" PRIu64, ccq_kind_name(e->kind), e->seq);
        break;
    }
    return w->name;
}

/* Whether the event is about one of this process's streams (device ids are global: this
 * process owns dev_first .. dev_first + ndev - 1). */
static bool on_stream(const jw *w, const ccq_event *e)
{
    return e->device - w->v->hdr.dev_first < w->v->hdr.ndev && e->stream < w->v->hdr.max_streams;
}

/* The track index of a stream of this process. */
static size_t track_of(const jw *w, const ccq_event *e)
{
    return (size_t)(e->device - w->v->hdr.dev_first) * w->v->hdr.max_streams + e->stream;
}

static void op_args(jw *w, const ccq_event *e, const cmd_info *ci)
{
    FILE *f = w->f;
    const char *set = e->comm < w->v->ncomms ? w->v->comms[e->comm].devices : "?";
    bool known = e->kind < CCQ_KIND_COUNT_;
    /* What a cross-process analysis keys on (tools/ccq-trace): the communicator (its device
     * set, the same text in every process; comm_id indexes the "ccq" header's comms), the
     * sequence number, the signature, and the command's state at the dump. */
    fprintf(f,
            "{\"id\":%" PRIu64 ",\"comm\":\"%s\",\"comm_id\":%u,\"rank\":%u,\"seq\":%" PRIu64
            ",\"kind\":\"%s\",\"state\":\"%s\",\"dtype\":\"%s\",\"count\":%" PRIu64
            ",\"bytes\":%" PRIu64 ",\"thread\":%u",
            e->id, set, e->comm, w->v->hdr.world_rank, e->seq, known ? ccq_kind_name(e->kind) : "?",
            state_names[ci != NULL ? ci->state : ST_NONE], ccq_dtype_name((ccq_dtype)e->dtype),
            e->count, e->bytes, e->thread);
    if (known && ccq_kinds[e->kind].reduces)
        fprintf(f, ",\"op\":\"%s\"", ccq_reduce_op_name((ccq_reduce_op)e->op));
    if (e->peer_valid && known && ccq_kinds[e->kind].rooted)
        fprintf(f, ",\"root\":%u", e->peer);
    if (e->peer_valid && known && !ccq_kinds[e->kind].collective)
        fprintf(f, ",\"peer\":%u", e->peer);
    if (ci != NULL && ci->have_issue) {
        fprintf(f, ",\"batch\":%" PRIu64, ci->batch);
        if (ci->have_submit)
            fprintf(f, ",\"queued_us\":%.3f", (double)(ci->issue - ci->submit) / 1e3);
    }
    if (e->type == CCQ_EV_COMPLETED || e->type == CCQ_EV_FAILED)
        fprintf(f, ",\"status\":\"%s\"", ccq_status_name((ccq_status)e->status));
    if ((e->type == CCQ_EV_COMPLETED || e->type == CCQ_EV_FAILED) && e->fused != 0)
        fprintf(f, ",\"fused\":%" PRIu64, e->fused);
    fputc('}', f);
}

/* Before writing: one cmd_info per command id (ids are dense: a range), and for each
 * submission when the next one on the same stream happens (a backward pass). */
static int scan(jw *w)
{
    const ccq_trace_view *v = w->v;
    size_t ntracks = (size_t)v->hdr.ndev * v->hdr.max_streams;
    uint64_t *last = malloc((ntracks + 1) * sizeof *last);
    w->idmin = UINT64_MAX;
    w->next_sub = malloc((v->nev ? v->nev : 1) * sizeof *w->next_sub);
    for (size_t k = 0; k < ntracks && last != NULL; k++)
        last[k] = UINT64_MAX;
    for (size_t k = v->nev; k-- > 0 && last != NULL && w->next_sub != NULL;) {
        const ccq_event *e = &v->ev[k];
        if (e->type <= CCQ_EV_FAILED && e->type != CCQ_EV_MATCHED) {
            w->idmin = e->id < w->idmin ? e->id : w->idmin;
            w->idmax = e->id > w->idmax ? e->id : w->idmax;
        }
        w->next_sub[k] = UINT64_MAX;
        if (e->type != CCQ_EV_SUBMITTED || !on_stream(w, e))
            continue;
        size_t tr = track_of(w, e);
        w->next_sub[k] = last[tr];
        last[tr] = e->time_ns;
    }
    bool ok = last != NULL && w->next_sub != NULL;
    if (ok && w->idmin <= w->idmax)
        ok = (w->ci = calloc(w->idmax - w->idmin + 1, sizeof *w->ci)) != NULL;
    for (size_t k = 0; ok && w->ci != NULL && k < v->nev; k++) { /* each command's last state */
        const ccq_event *e = &v->ev[k];
        static const uint8_t st[] = {[CCQ_EV_SUBMITTED] = ST_QUEUED,
                                     [CCQ_EV_ISSUED] = ST_ISSUED,
                                     [CCQ_EV_COMPLETED] = ST_COMPLETED,
                                     [CCQ_EV_FAILED] = ST_FAILED};
        if (e->type > CCQ_EV_FAILED || e->type == CCQ_EV_MATCHED)
            continue;
        cmd_info *c = &w->ci[e->id - w->idmin];
        if (st[e->type] > c->state)
            c->state = st[e->type];
    }
    free(last);
    return ok ? 0 : -1;
}

/* otherData (for viewers), then the "ccq" section (for tools/ccq-trace): who wrote the dump,
 * its place in the world, its clock, and the communicators' device sets in full. */
static void emit_header(jw *w)
{
    const ccq_trace_header *h = &w->v->hdr;
    fprintf(w->f,
            "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"producer\":\"ccq %s\","
            "\"backend\":\"%s\",\"devices\":%u,\"events\":%zu,\"dropped_events\":%" PRIu64
            ",\"clock\":\"CLOCK_MONOTONIC\",\"t0_ns\":%" PRIu64 "},\n",
            CCQ_VERSION_STRING, h->backend, h->ndev, w->v->nev, h->dropped, h->t0_ns);
    fprintf(w->f,
            "\"ccq\":{\"format\":%d,\"version\":\"%s\",\"world_rank\":%u,\"world_size\":%u,"
            "\"local_devices\":[%u,%u],\"crowded\":%s,\"max_streams\":%u,\"pid\":%" PRId64
            ",\"hostname\":",
            CCQ_TRACE_FORMAT, CCQ_VERSION_STRING, h->world_rank, h->world_size, h->dev_first,
            h->ndev, h->crowded ? "true" : "false", h->max_streams, h->pid);
    json_str(w->f, h->host != NULL ? h->host : "");
    fprintf(w->f, ",\"backend\":\"%s\",\"reason\":", h->backend);
    json_str(w->f, h->reason != NULL ? h->reason : "");
    fprintf(w->f,
            ",\"events\":%zu,\"dropped_events\":%" PRIu64 ",\"clock\":{\"domain\":"
            "\"CLOCK_MONOTONIC\",\"t0_ns\":%" PRIu64 ",\"dump_ns\":%" PRIu64
            ",\"realtime_offset_ns\":%" PRId64 "},\"comms\":[",
            w->v->nev, h->dropped, h->t0_ns, h->dump_ns, h->realtime_offset_ns);
    for (uint32_t k = 0; k < w->v->ncomms; k++) {
        const ccq_trace_comm *c = &w->v->comms[k];
        fprintf(w->f, "%s{\"id\":%u,\"set\":\"%s\",\"devices\":[", k ? "," : "", k, c->devices);
        for (uint32_t i = 0; c->ids != NULL && i < c->n; i++)
            fprintf(w->f, i ? ",%u" : "%u", c->ids[i]);
        fputs("]}", w->f);
    }
    fputs("]},\n\"traceEvents\":[\n", w->f);
}

/* Process and thread names: every device, the scheduler, and each stream that has events. */
static int emit_names(jw *w)
{
    const ccq_trace_view *v = w->v;
    bool *stream_seen = calloc((size_t)v->hdr.ndev * v->hdr.max_streams, sizeof *stream_seen);
    if (stream_seen == NULL)
        return -1;
    for (uint32_t d = v->hdr.dev_first; d - v->hdr.dev_first < v->hdr.ndev; d++)
        fprintf(w->f,
                "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%u,\"args\":{\"name\":"
                "\"device %u\"}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%u,"
                "\"args\":{\"sort_index\":%u}}",
                sep(w), d, d, d, d);
    fprintf(w->f,
            "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%u,\"args\":{\"name\":\"ccq "
            "scheduler\"}},\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%u,\"tid\":0,"
            "\"args\":{\"name\":\"batches\"}},\n{\"ph\":\"M\",\"name\":\"thread_name\","
            "\"pid\":%u,\"tid\":1,\"args\":{\"name\":\"matching\"}},\n{\"ph\":\"M\","
            "\"name\":\"thread_name\",\"pid\":%u,\"tid\":2,\"args\":{\"name\":\"fused "
            "operations\"}}",
            sep(w), w->sched_pid, w->sched_pid, w->sched_pid, w->sched_pid);
    for (size_t k = 0; k < v->nev; k++) {
        const ccq_event *e = &v->ev[k];
        if (!on_stream(w, e))
            continue;
        bool *seen = &stream_seen[track_of(w, e)];
        if (*seen)
            continue;
        *seen = true;
        static const char *const track[3] = {"submitted", "in flight", "fences"};
        for (uint32_t t = 0; t < 3; t++)
            fprintf(w->f,
                    "%s{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%u,\"tid\":%u,"
                    "\"args\":{\"name\":\"stream %u: %s\"}},\n{\"ph\":\"M\",\"name\":"
                    "\"thread_sort_index\",\"pid\":%u,\"tid\":%u,\"args\":{\"sort_index\":%u}}",
                    sep(w), e->device, e->stream * 3 + t, e->stream, track[t], e->device,
                    e->stream * 3 + t, e->stream * 3 + t);
    }
    free(stream_seen);
    return 0;
}

/* A submission: a short slice on its stream's "submitted" track, and its queued slice begins. */
static void emit_submit(jw *w, size_t k, const ccq_event *e, cmd_info *c)
{
    const char *name = op_name(w, e);
    double dur = SUBMIT_SLICE_US;
    if (c != NULL) {
        c->submit = e->time_ns;
        c->submit_k = k;
        c->have_submit = true;
    }
    if (w->next_sub[k] != UINT64_MAX && (double)(w->next_sub[k] - e->time_ns) / 2e3 < dur)
        dur = (double)((w->next_sub[k] - e->time_ns) / 2) / 1e3; /* whole ns: no overlap */
    fprintf(w->f,
            "%s{\"ph\":\"X\",\"cat\":\"submit\",\"name\":\"%s\",\"pid\":%u,\"tid\":%u,"
            "\"ts\":%.3f,\"dur\":%.3f,\"args\":",
            sep(w), name, e->device, e->stream * 3, us(e->time_ns, w->t0), dur);
    op_args(w, e, c);
    fprintf(w->f,
            "},\n{\"ph\":\"b\",\"cat\":\"queued\",\"name\":\"%s\",\"id\":\"q%" PRIu64
            "\",\"pid\":%u,\"tid\":%u,\"ts\":%.3f}",
            name, e->id, e->device, e->stream * 3, us(e->time_ns, w->t0));
}

/* An issue: its queued slice ends, and a flow arrow goes from the submission to the batch. */
static void emit_issue(jw *w, const ccq_event *e, cmd_info *c)
{
    const char *name = op_name(w, e);
    uint32_t pid = e->device, tid = e->stream * 3;
    if (c == NULL)
        return;
    c->issue = e->time_ns;
    c->batch = e->batch;
    c->issue_k = (size_t)(e - w->v->ev);
    c->have_issue = true;
    if (!c->have_submit)
        return;
    fprintf(w->f,
            "%s{\"ph\":\"e\",\"cat\":\"queued\",\"name\":\"%s\",\"id\":\"q%" PRIu64
            "\",\"pid\":%u,\"tid\":%u,\"ts\":%.3f}",
            sep(w), name, e->id, pid, tid, us(e->time_ns, w->t0));
    fprintf(w->f,
            ",\n{\"ph\":\"s\",\"cat\":\"flow\",\"name\":\"issued in batch\","
            "\"id\":%" PRIu64 ",\"pid\":%u,\"tid\":%u,\"ts\":%.3f}",
            e->id, pid, tid, us(c->submit, w->t0));
    fprintf(w->f,
            ",\n{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"flow\",\"name\":\"issued in "
            "batch\",\"id\":%" PRIu64 ",\"pid\":%u,\"tid\":0,\"ts\":%.3f}",
            e->id, w->sched_pid, us(e->time_ns, w->t0));
}

/* The start of fused operation `id` (UINT64_MAX: not in the view). Fused operations are
 * few and the newest are looked for: a search from the end. */
static uint64_t fused_t0(const jw *w, uint64_t id)
{
    for (size_t k = w->nfused; k-- > 0;)
        if (w->fused[k].id == id)
            return w->fused[k].t0;
    return UINT64_MAX;
}

/* A fused engine operation: a slice on the scheduler's "fused operations" track. */
static void emit_fused(jw *w, const ccq_event *e)
{
    const char *set = e->comm < w->v->ncomms ? w->v->comms[e->comm].devices : "?";
    bool known = e->kind < CCQ_KIND_COUNT_;
    if (w->nfused == w->capfused) {
        size_t ncap = w->capfused ? 2 * w->capfused : 64;
        void *nf = realloc(w->fused, ncap * sizeof *w->fused);
        if (nf != NULL) {
            w->fused = nf;
            w->capfused = ncap;
        }
    }
    if (w->nfused < w->capfused) {
        w->fused[w->nfused].id = e->id;
        w->fused[w->nfused++].t0 = e->time_ns;
    }
    fprintf(w->f,
            "%s{\"ph\":\"X\",\"cat\":\"fused\",\"name\":\"fused %s #%" PRIu64 "-%" PRIu64
            " (%" PRIu64 " ops)\",\"pid\":%u,\"tid\":2,\"ts\":%.3f,\"dur\":%.3f,\"args\":{"
            "\"fused\":%" PRIu64 ",\"comm\":\"%s\",\"comm_id\":%u,\"first_seq\":%" PRIu64
            ",\"ops\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"batch\":%" PRIu64
            ",\"kind\":\"%s\",\"dtype\":\"%s\",\"status\":\"%s\"}}",
            sep(w), known ? ccq_kind_name(e->kind) : "?", e->seq,
            e->seq + (e->count ? e->count - 1 : 0), e->count, w->sched_pid, us(e->time_ns, w->t0),
            (double)e->dur_ns / 1e3, e->id, set, e->comm, e->seq, e->count, e->bytes, e->batch,
            known ? ccq_kind_name(e->kind) : "?", ccq_dtype_name((ccq_dtype)e->dtype),
            ccq_status_name((ccq_status)e->status));
}

/* A completion or failure: the command's slice on the "in flight" track, issue -> end (and
 * a flow arrow to the fused operation it ran in). */
static void emit_end(jw *w, const ccq_event *e, const cmd_info *c)
{
    const char *name = op_name(w, e);
    uint32_t pid = e->device, tid = e->stream * 3 + 1;
    bool failed = e->type == CCQ_EV_FAILED;
    if (c != NULL && c->have_issue) {
        uint64_t f0 = e->fused != 0 ? fused_t0(w, e->fused) : UINT64_MAX;
        fprintf(w->f,
                "%s{\"ph\":\"X\",\"cat\":\"%s\",\"name\":\"%s\",\"pid\":%u,\"tid\":%u,"
                "\"ts\":%.3f,\"dur\":%.3f,\"args\":",
                sep(w), failed ? "op,failed" : "op", name, pid, tid, us(c->issue, w->t0),
                (double)(e->time_ns - c->issue) / 1e3);
        op_args(w, e, c);
        fputc('}', w->f);
        if (f0 != UINT64_MAX && f0 >= c->issue && f0 <= e->time_ns)
            fprintf(w->f,
                    ",\n{\"ph\":\"s\",\"cat\":\"fused\",\"name\":\"ran in fused op\","
                    "\"id\":\"fu%" PRIu64 "\",\"pid\":%u,\"tid\":%u,\"ts\":%.3f},\n"
                    "{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"fused\",\"name\":\"ran in fused "
                    "op\",\"id\":\"fu%" PRIu64 "\",\"pid\":%u,\"tid\":2,\"ts\":%.3f}",
                    e->id, pid, tid, us(f0, w->t0), e->id, w->sched_pid, us(f0, w->t0));
        return;
    }
    /* Never issued (mismatch, timeout, cancellation), or its issue fell out of the recorder:
     * end its queued slice and mark the end where it happened. */
    if (c != NULL && c->have_submit)
        fprintf(w->f,
                "%s{\"ph\":\"e\",\"cat\":\"queued\",\"name\":\"%s\",\"id\":\"q%" PRIu64
                "\",\"pid\":%u,\"tid\":%u,\"ts\":%.3f}",
                sep(w), name, e->id, pid, tid - 1, us(e->time_ns, w->t0));
    fprintf(w->f,
            "%s{\"ph\":\"i\",\"s\":\"t\",\"cat\":\"%s\",\"name\":\"%s %s\","
            "\"pid\":%u,\"tid\":%u,\"ts\":%.3f,\"args\":",
            sep(w), failed ? "op,failed" : "op", name, failed ? "failed" : "completed", pid, tid,
            us(e->time_ns, w->t0));
    op_args(w, e, c);
    fputc('}', w->f);
}

/* A batch: one slice on the scheduler's "batches" track (bytes holds its duration). */
static void emit_batch(jw *w, const ccq_event *e)
{
    fprintf(w->f,
            "%s{\"ph\":\"X\",\"cat\":\"batch\",\"name\":\"batch %" PRIu64 " (%" PRIu64
            " ops)\",\"pid\":%u,\"tid\":0,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"batch\":"
            "%" PRIu64 ",\"ops\":%" PRIu64 ",\"status\":\"%s\"}}",
            sep(w), e->id, e->count, w->sched_pid, us(e->time_ns - e->bytes, w->t0),
            (double)e->bytes / 1e3, e->id, e->count, ccq_status_name((ccq_status)e->status));
}

static void emit_match(jw *w, const ccq_event *e)
{
    fprintf(w->f,
            "%s{\"ph\":\"i\",\"s\":\"t\",\"cat\":\"match\",\"name\":\"matched #%" PRIu64
            "\",\"pid\":%u,\"tid\":1,\"ts\":%.3f,\"args\":{\"comm\":%u,\"seq\":%" PRIu64 "}}",
            sep(w), e->seq, w->sched_pid, us(e->time_ns, w->t0), e->comm, e->seq);
}

/* A fence: a slice on the stream's "fences" track, up to the next FENCE_END of the same
 * thread and stream (O(n) search; fences are few). */
static void emit_fence(jw *w, size_t k, const ccq_event *e)
{
    for (size_t j = k + 1; j < w->v->nev; j++) {
        const ccq_event *x = &w->v->ev[j];
        if (x->type == CCQ_EV_FENCE_END && x->thread == e->thread && x->device == e->device &&
            x->stream == e->stream) {
            fprintf(w->f,
                    "%s{\"ph\":\"X\",\"cat\":\"fence\",\"name\":\"fence\",\"pid\":%u,"
                    "\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"thread\":%u,"
                    "\"status\":\"%s\"}}",
                    sep(w), e->device, e->stream * 3 + 2, us(e->time_ns, w->t0),
                    (double)(x->time_ns - e->time_ns) / 1e3, e->thread,
                    ccq_status_name((ccq_status)x->status));
            return;
        }
    }
}

/* Watchdog timeouts and aborts: global instants. */
static void emit_error(jw *w, const ccq_event *e)
{
    bool wd = e->type == CCQ_EV_WATCHDOG;
    fprintf(w->f,
            "%s{\"ph\":\"i\",\"s\":\"g\",\"cat\":\"error\",\"name\":\"%s comm %u%s\","
            "\"pid\":%u,\"tid\":1,\"ts\":%.3f,\"args\":{\"comm\":%u,\"seq\":%" PRIu64
            ",\"status\":\"%s\"}}",
            sep(w), wd ? "watchdog timeout on" : "abort of", e->comm,
            wd ? " (an op missed its deadline)" : "", w->sched_pid, us(e->time_ns, w->t0), e->comm,
            e->seq, ccq_status_name((ccq_status)e->status));
}

/* A lost process (runtime/health/): a global instant naming it. */
static void emit_lost(jw *w, const ccq_event *e)
{
    fprintf(w->f,
            "%s{\"ph\":\"i\",\"s\":\"g\",\"cat\":\"error\",\"name\":\"process %u lost\","
            "\"pid\":%u,\"tid\":1,\"ts\":%.3f,\"args\":{\"process\":%u,\"device\":%u,"
            "\"status\":\"%s\"}}",
            sep(w), e->peer, w->sched_pid, us(e->time_ns, w->t0), e->peer, e->device,
            ccq_status_name((ccq_status)e->status));
}

static void emit_event(jw *w, size_t k)
{
    const ccq_event *e = &w->v->ev[k];
    cmd_info *c = w->ci && e->id >= w->idmin && e->id <= w->idmax ? &w->ci[e->id - w->idmin] : NULL;
    switch (e->type) {
    case CCQ_EV_SUBMITTED:
        emit_submit(w, k, e, c);
        break;
    case CCQ_EV_ISSUED:
        emit_issue(w, e, c);
        break;
    case CCQ_EV_COMPLETED:
    case CCQ_EV_FAILED:
        emit_end(w, e, c);
        break;
    case CCQ_EV_BATCH:
        emit_batch(w, e);
        break;
    case CCQ_EV_MATCHED:
        emit_match(w, e);
        break;
    case CCQ_EV_FENCE_BEGIN:
        emit_fence(w, k, e);
        break;
    case CCQ_EV_WATCHDOG:
    case CCQ_EV_ABORT:
        emit_error(w, e);
        break;
    case CCQ_EV_PROCESS_LOST:
        emit_lost(w, e);
        break;
    case CCQ_EV_FUSED:
        emit_fused(w, e);
        break;
    default: /* BATCH_DONE, FENCE_END: shown through the slices above */
        break;
    }
}

/* Notes: the text of recent errors, as global instants (they explain the red marks). */
static void emit_notes(jw *w)
{
    for (size_t k = 0; k < w->v->nnotes; k++) {
        const ccq_note *nt = &w->v->notes[k];
        fprintf(w->f,
                "%s{\"ph\":\"i\",\"s\":\"g\",\"cat\":\"error\",\"name\":\"%s\",\"pid\":%u,"
                "\"tid\":1,\"ts\":%.3f,\"args\":{\"detail\":",
                sep(w), ccq_event_type_name(nt->type), w->sched_pid, us(nt->time_ns, w->t0));
        json_str(w->f, nt->text);
        fprintf(w->f, "}}");
    }
}

/* Commands that had not ended when the copy was taken (a hang: what the dump is for): a queued
 * one's queued slice and an issued one's in-flight slice end at the dump, so viewers draw
 * them to the end instead of dropping them, and their args say "queued" or "issued". */
static void emit_unfinished(jw *w)
{
    const ccq_trace_view *v = w->v;
    uint64_t end = v->hdr.dump_ns;
    if (w->ci == NULL)
        return;
    if (v->nev > 0 && v->ev[v->nev - 1].time_ns > end)
        end = v->ev[v->nev - 1].time_ns;
    for (uint64_t id = w->idmin; id <= w->idmax; id++) {
        cmd_info *c = &w->ci[id - w->idmin];
        if (c->state == ST_ISSUED && c->have_issue) {
            const ccq_event *e = &v->ev[c->issue_k];
            fprintf(w->f,
                    "%s{\"ph\":\"X\",\"cat\":\"op,unfinished\",\"name\":\"%s (in flight at "
                    "dump)\",\"pid\":%u,\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f,\"args\":",
                    sep(w), op_name(w, e), e->device, e->stream * 3 + 1, us(c->issue, w->t0),
                    (double)(end - c->issue) / 1e3);
            op_args(w, e, c);
            fputc('}', w->f);
        } else if (c->state == ST_QUEUED && c->have_submit) {
            const ccq_event *e = &v->ev[c->submit_k];
            fprintf(w->f,
                    "%s{\"ph\":\"e\",\"cat\":\"queued\",\"name\":\"%s\",\"id\":\"q%" PRIu64
                    "\",\"pid\":%u,\"tid\":%u,\"ts\":%.3f,\"args\":{\"state\":\"queued\"}}",
                    sep(w), op_name(w, e), id, e->device, e->stream * 3, us(end, w->t0));
        }
    }
}

int ccq_trace_write_json(FILE *f, const ccq_trace_view *v)
{
    jw w = {.f = f,
            .v = v,
            .t0 = v->hdr.t0_ns,
            .sched_pid = v->hdr.dev_first + v->hdr.ndev,
            .first = true};
    int rc = -1;

    if (scan(&w) != 0)
        goto out;
    emit_header(&w);
    if (emit_names(&w) != 0)
        goto out;
    for (size_t k = 0; k < v->nev; k++) /* in time order */
        emit_event(&w, k);
    emit_unfinished(&w);
    emit_notes(&w);
    fprintf(f, "\n]}\n");
    rc = ferror(f) ? -1 : 0;
out:
    free(w.next_sub);
    free(w.ci);
    free(w.fused);
    return rc;
}
