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
 * batch that issued it. Watchdog timeouts and aborts are global instants. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"

#define SUBMIT_SLICE_US                                                                            \
    0.2 /* widest submission marker slice (narrower if the next one is                             \
           closer: slices of one track must nest, never partly overlap) */

typedef struct cmd_info {
    uint64_t submit, issue, batch;
    bool have_submit, have_issue;
} cmd_info;

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

static void op_name(char *buf, size_t len, const ccq_event *e)
{
    switch (e->kind) {
    case CCQ_KIND_SEND:
        snprintf(buf, len, "send #%" PRIu64 " to %u", e->seq, e->peer);
        break;
    case CCQ_KIND_RECV:
        snprintf(buf, len, "recv #%" PRIu64 " from %u", e->seq, e->peer);
        break;
    default:
        snprintf(buf, len, "%s #%" PRIu64, ccq_kind_name(e->kind), e->seq);
        break;
    }
}

/* Communicator names, copied under the registry lock (comms can be created meanwhile). */
typedef struct comm_names {
    uint32_t n;
    char (*name)[64];
} comm_names;

static void op_args(FILE *f, const comm_names *cn, const ccq_event *e, const cmd_info *ci)
{
    const char *set = e->comm < cn->n ? cn->name[e->comm] : "?";
    fprintf(f,
            "{\"id\":%" PRIu64 ",\"comm\":\"%s\",\"seq\":%" PRIu64 ",\"dtype\":\"%s\","
            "\"count\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"thread\":%u",
            e->id, set, e->seq, ccq_dtype_name((ccq_dtype)e->dtype), e->count, e->bytes, e->thread);
    if (e->kind < CCQ_KIND_COUNT_ && ccq_kinds[e->kind].reduces)
        fprintf(f, ",\"op\":\"%s\"", ccq_reduce_op_name((ccq_reduce_op)e->op));
    if (e->peer_valid && e->kind < CCQ_KIND_COUNT_ && ccq_kinds[e->kind].rooted)
        fprintf(f, ",\"root\":%u", e->peer);
    if (ci != NULL && ci->have_issue) {
        fprintf(f, ",\"batch\":%" PRIu64, ci->batch);
        if (ci->have_submit)
            fprintf(f, ",\"queued_us\":%.3f", (double)(ci->issue - ci->submit) / 1e3);
    }
    if (e->type == CCQ_EV_COMPLETED || e->type == CCQ_EV_FAILED)
        fprintf(f, ",\"status\":\"%s\"", ccq_status_name((ccq_status)e->status));
    fputc('}', f);
}

int ccq_trace_write_json(FILE *f, ccq_runtime *rt, const ccq_event *ev, size_t n, uint64_t dropped)
{
    comm_names cn = {0, NULL};
    uint64_t t0 = n ? ev[0].time_ns : 0, idmin = UINT64_MAX, idmax = 0;
    uint32_t sched_pid = rt->ndev;
    bool *stream_seen = calloc((size_t)rt->ndev * rt->max_streams, sizeof *stream_seen);
    cmd_info *ci = NULL;
    char name[96];
    bool first = true;

    if (stream_seen == NULL)
        return -1;
    pthread_mutex_lock(&rt->comm_lock);
    cn.n = atomic_load_explicit(&rt->ncomms, memory_order_acquire);
    cn.name = calloc(cn.n ? cn.n : 1, sizeof *cn.name);
    for (uint32_t k = 0; cn.name != NULL && k < cn.n; k++)
        ccq_describe_comm(cn.name[k], sizeof cn.name[k], rt->comms[k]);
    pthread_mutex_unlock(&rt->comm_lock);
    if (cn.name == NULL) {
        free(stream_seen);
        return -1;
    }
    for (size_t k = 0; k < n; k++) {
        const ccq_event *e = &ev[k];
        if (e->type <= CCQ_EV_FAILED && e->type != CCQ_EV_MATCHED) {
            idmin = e->id < idmin ? e->id : idmin;
            idmax = e->id > idmax ? e->id : idmax;
        }
    }
    if (idmin <= idmax && (ci = calloc(idmax - idmin + 1, sizeof *ci)) == NULL) {
        free(stream_seen);
        free(cn.name);
        return -1;
    }
#define SEP() (first ? (first = false, "") : ",\n")
    fprintf(f,
            "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"producer\":\"ccq %s\","
            "\"backend\":\"%s\",\"devices\":%u,\"events\":%zu,\"dropped_events\":%" PRIu64
            ",\"clock\":\"CLOCK_MONOTONIC\",\"t0_ns\":%" PRIu64 "},\n\"traceEvents\":[\n",
            CCQ_VERSION_STRING, rt->be_ops->name, rt->ndev, n, dropped, t0);

    /* For each submission, when the next one on the same stream happens (backward pass). */
    uint64_t *next_sub = malloc((n ? n : 1) * sizeof *next_sub);
    uint64_t *last = malloc(((size_t)rt->ndev * rt->max_streams + 1) * sizeof *last);
    if (next_sub == NULL || last == NULL) {
        free(next_sub);
        free(last);
        free(ci);
        free(stream_seen);
        free(cn.name);
        return -1;
    }
    for (size_t k = 0; k < (size_t)rt->ndev * rt->max_streams; k++)
        last[k] = UINT64_MAX;
    for (size_t k = n; k-- > 0;) {
        const ccq_event *e = &ev[k];
        next_sub[k] = UINT64_MAX;
        if (e->type != CCQ_EV_SUBMITTED || e->device >= rt->ndev || e->stream >= rt->max_streams)
            continue;
        size_t tr = (size_t)e->device * rt->max_streams + e->stream;
        next_sub[k] = last[tr];
        last[tr] = e->time_ns;
    }
    free(last);

    /* Process and thread names. */
    for (uint32_t d = 0; d < rt->ndev; d++)
        fprintf(f,
                "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%u,\"args\":{\"name\":"
                "\"device %u\"}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%u,"
                "\"args\":{\"sort_index\":%u}}",
                SEP(), d, d, d, d);
    fprintf(f,
            "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%u,\"args\":{\"name\":\"ccq "
            "scheduler\"}},\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%u,\"tid\":0,"
            "\"args\":{\"name\":\"batches\"}},\n{\"ph\":\"M\",\"name\":\"thread_name\","
            "\"pid\":%u,\"tid\":1,\"args\":{\"name\":\"matching\"}}",
            SEP(), sched_pid, sched_pid, sched_pid);
    for (size_t k = 0; k < n; k++) {
        const ccq_event *e = &ev[k];
        if (e->device >= rt->ndev || e->stream >= rt->max_streams)
            continue;
        bool *seen = &stream_seen[(size_t)e->device * rt->max_streams + e->stream];
        if (*seen)
            continue;
        *seen = true;
        static const char *const track[3] = {"submitted", "in flight", "fences"};
        for (uint32_t t = 0; t < 3; t++)
            fprintf(f,
                    "%s{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%u,\"tid\":%u,"
                    "\"args\":{\"name\":\"stream %u: %s\"}},\n{\"ph\":\"M\",\"name\":"
                    "\"thread_sort_index\",\"pid\":%u,\"tid\":%u,\"args\":{\"sort_index\":%u}}",
                    SEP(), e->device, e->stream * 3 + t, e->stream, track[t], e->device,
                    e->stream * 3 + t, e->stream * 3 + t);
    }

    /* Events, in time order. */
    for (size_t k = 0; k < n; k++) {
        const ccq_event *e = &ev[k];
        cmd_info *c = ci && e->id >= idmin && e->id <= idmax ? &ci[e->id - idmin] : NULL;
        uint32_t pid = e->device, tid = e->stream * 3;
        switch (e->type) {
        case CCQ_EV_SUBMITTED:
            if (c != NULL) {
                c->submit = e->time_ns;
                c->have_submit = true;
            }
            op_name(name, sizeof name, e);
            double dur = SUBMIT_SLICE_US;
            if (next_sub[k] != UINT64_MAX && (double)(next_sub[k] - e->time_ns) / 2e3 < dur)
                dur = (double)((next_sub[k] - e->time_ns) / 2) / 1e3; /* whole ns: no overlap */
            fprintf(f,
                    "%s{\"ph\":\"X\",\"cat\":\"submit\",\"name\":\"%s\",\"pid\":%u,\"tid\":%u,"
                    "\"ts\":%.3f,\"dur\":%.3f,\"args\":",
                    SEP(), name, pid, tid, us(e->time_ns, t0), dur);
            op_args(f, &cn, e, NULL);
            fprintf(f,
                    "},\n{\"ph\":\"b\",\"cat\":\"queued\",\"name\":\"%s\",\"id\":\"q%" PRIu64
                    "\",\"pid\":%u,\"tid\":%u,\"ts\":%.3f}",
                    name, e->id, pid, tid, us(e->time_ns, t0));
            break;
        case CCQ_EV_ISSUED:
            op_name(name, sizeof name, e);
            if (c != NULL) {
                c->issue = e->time_ns;
                c->batch = e->batch;
                c->have_issue = true;
            }
            if (c != NULL && c->have_submit) {
                fprintf(f,
                        "%s{\"ph\":\"e\",\"cat\":\"queued\",\"name\":\"%s\",\"id\":\"q%" PRIu64
                        "\",\"pid\":%u,\"tid\":%u,\"ts\":%.3f}",
                        SEP(), name, e->id, pid, tid, us(e->time_ns, t0));
                /* Arrow: from the submission slice to the batch that issued it. */
                fprintf(f,
                        ",\n{\"ph\":\"s\",\"cat\":\"flow\",\"name\":\"issued in batch\","
                        "\"id\":%" PRIu64 ",\"pid\":%u,\"tid\":%u,\"ts\":%.3f}",
                        e->id, pid, tid, us(c->submit, t0));
                fprintf(f,
                        ",\n{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"flow\",\"name\":\"issued in "
                        "batch\",\"id\":%" PRIu64 ",\"pid\":%u,\"tid\":0,\"ts\":%.3f}",
                        e->id, sched_pid, us(e->time_ns, t0));
            }
            break;
        case CCQ_EV_COMPLETED:
        case CCQ_EV_FAILED:
            op_name(name, sizeof name, e);
            if (c != NULL && c->have_issue) {
                fprintf(f,
                        "%s{\"ph\":\"X\",\"cat\":\"%s\",\"name\":\"%s\",\"pid\":%u,\"tid\":%u,"
                        "\"ts\":%.3f,\"dur\":%.3f,\"args\":",
                        SEP(), e->type == CCQ_EV_COMPLETED ? "op" : "op,failed", name, pid, tid + 1,
                        us(c->issue, t0), (double)(e->time_ns - c->issue) / 1e3);
                op_args(f, &cn, e, c);
                fputc('}', f);
            } else {
                /* Never issued (mismatch, timeout, cancellation), or its issue fell out of
                 * the recorder: end its queued slice and mark the end where it happened. */
                bool failed = e->type == CCQ_EV_FAILED;
                if (c != NULL && c->have_submit)
                    fprintf(f,
                            "%s{\"ph\":\"e\",\"cat\":\"queued\",\"name\":\"%s\",\"id\":\"q%" PRIu64
                            "\",\"pid\":%u,\"tid\":%u,\"ts\":%.3f}",
                            SEP(), name, e->id, pid, tid, us(e->time_ns, t0));
                fprintf(f,
                        "%s{\"ph\":\"i\",\"s\":\"t\",\"cat\":\"%s\",\"name\":\"%s %s\","
                        "\"pid\":%u,\"tid\":%u,\"ts\":%.3f,\"args\":",
                        SEP(), failed ? "op,failed" : "op", name, failed ? "failed" : "completed",
                        pid, tid + 1, us(e->time_ns, t0));
                op_args(f, &cn, e, c);
                fputc('}', f);
            }
            break;
        case CCQ_EV_BATCH:
            fprintf(f,
                    "%s{\"ph\":\"X\",\"cat\":\"batch\",\"name\":\"batch %" PRIu64 " (%" PRIu64
                    " ops)\",\"pid\":%u,\"tid\":0,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"batch\":"
                    "%" PRIu64 ",\"ops\":%" PRIu64 ",\"status\":\"%s\"}}",
                    SEP(), e->id, e->count, sched_pid, us(e->time_ns - e->bytes, t0),
                    (double)e->bytes / 1e3, e->id, e->count,
                    ccq_status_name((ccq_status)e->status));
            break;
        case CCQ_EV_MATCHED:
            fprintf(f,
                    "%s{\"ph\":\"i\",\"s\":\"t\",\"cat\":\"match\",\"name\":\"matched #%" PRIu64
                    "\",\"pid\":%u,\"tid\":1,\"ts\":%.3f,\"args\":{\"comm\":%u,\"seq\":%" PRIu64
                    "}}",
                    SEP(), e->seq, sched_pid, us(e->time_ns, t0), e->comm, e->seq);
            break;
        case CCQ_EV_FENCE_BEGIN:
            /* Paired with the next FENCE_END of the same thread and stream. */
            for (size_t j = k + 1; j < n; j++) {
                const ccq_event *x = &ev[j];
                if (x->type == CCQ_EV_FENCE_END && x->thread == e->thread &&
                    x->device == e->device && x->stream == e->stream) {
                    fprintf(f,
                            "%s{\"ph\":\"X\",\"cat\":\"fence\",\"name\":\"fence\",\"pid\":%u,"
                            "\"tid\":%u,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"thread\":%u,"
                            "\"status\":\"%s\"}}",
                            SEP(), pid, tid + 2, us(e->time_ns, t0),
                            (double)(x->time_ns - e->time_ns) / 1e3, e->thread,
                            ccq_status_name((ccq_status)x->status));
                    break;
                }
            }
            break;
        case CCQ_EV_WATCHDOG:
        case CCQ_EV_ABORT:
            fprintf(f,
                    "%s{\"ph\":\"i\",\"s\":\"g\",\"cat\":\"error\",\"name\":\"%s comm %u%s\","
                    "\"pid\":%u,\"tid\":1,\"ts\":%.3f,\"args\":{\"comm\":%u,\"seq\":%" PRIu64
                    ",\"status\":\"%s\"}}",
                    SEP(), e->type == CCQ_EV_WATCHDOG ? "watchdog timeout on" : "abort of", e->comm,
                    e->type == CCQ_EV_WATCHDOG ? " (an op missed its deadline)" : "", sched_pid,
                    us(e->time_ns, t0), e->comm, e->seq, ccq_status_name((ccq_status)e->status));
            break;
        default: /* BATCH_DONE, FENCE_END: shown through the slices above */
            break;
        }
    }
    /* Notes: the text of recent errors, as global instants (they explain the red marks). */
    pthread_mutex_lock(&rt->trace.note_lock);
    uint64_t nh = rt->trace.nhead, nfirst = nh > CCQ_TRACE_NOTES ? nh - CCQ_TRACE_NOTES : 0;
    for (uint64_t k = nfirst; k < nh; k++) {
        const struct ccq_trace_note_s *nt = &rt->trace.notes[k % CCQ_TRACE_NOTES];
        fprintf(f,
                "%s{\"ph\":\"i\",\"s\":\"g\",\"cat\":\"error\",\"name\":\"%s\",\"pid\":%u,"
                "\"tid\":1,\"ts\":%.3f,\"args\":{\"detail\":",
                SEP(), ccq_event_type_name(nt->type), sched_pid, us(nt->time_ns, t0));
        json_str(f, nt->text);
        fprintf(f, "}}");
    }
    pthread_mutex_unlock(&rt->trace.note_lock);
#undef SEP
    fprintf(f, "\n]}\n");
    free(next_sub);
    free(ci);
    free(stream_seen);
    free(cn.name);
    return ferror(f) ? -1 : 0;
}
