/* The event log (flight recorder, snapshot, callback, JSON dump, live metrics): exact event
 * counts and per-command lifecycles after a known workload, overflow accounting, a disabled
 * recorder, callback delivery and ordering, failure events with the desync report, trace_file
 * dumps, metrics against the counters, and concurrent producers, readers and callback
 * toggling (run under ThreadSanitizer too). CCQ_TEST_ITERS scales the concurrency test;
 * CCQ_TEST_VERBOSE=1 prints the desync report. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ccq.h"
#include "runtime/trace/trace.h" /* ccq_events_copy_out, CCQ_EVENT_SIZE_0_2 */
#include "runtime/trace/compat.h"

#define NDEV         4
#define COUNT        8     /* elements per command of the known workloads */
#define ROUNDS       5     /* rounds of the known workload */
#define DETAIL_LEN   1024  /* at least the library's detail length */
#define LONG_TIMEOUT 20000 /* timeout_ms where the watchdog must not fire */
#define WD_TIMEOUT   400   /* timeout_ms where it must */
#define SNAP_MAX     (1u << 18)

static const ccq_device_id all4[NDEV] = {0, 1, 2, 3};
static const ccq_device_id pair01[2] = {0, 1};
static const ccq_device_id pair23[2] = {2, 3};

/* ------------------------------------------------------------------------------------ */
/* Helpers                                                                               */
/* ------------------------------------------------------------------------------------ */

static bool verbose(void)
{
    const char *v = getenv("CCQ_TEST_VERBOSE");
    return v != NULL && *v != '\0' && strcmp(v, "0") != 0;
}

static uint32_t my_tid(void)
{
    return (uint32_t)syscall(SYS_gettid);
}

static bool is_fence(uint32_t type)
{
    return type == CCQ_EV_FENCE_BEGIN || type == CCQ_EV_FENCE_END;
}

static bool is_cmd(uint32_t type)
{
    return type == CCQ_EV_SUBMITTED || type == CCQ_EV_ISSUED || type == CCQ_EV_COMPLETED ||
           type == CCQ_EV_FAILED;
}

static ccq_metrics metrics_of(ccq_runtime *rt)
{
    ccq_metrics m;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    assert_int_equal(ccq_get_metrics(rt, &m), CCQ_OK);
    return m;
}

/* A host runtime; fault and trace_file set explicitly so the caller's CCQ_* environment
 * cannot change what a test records. */
static ccq_runtime *make_rt(uint32_t capacity, uint64_t timeout_ms, const char *fault,
                            const char *file)
{
    ccq_config cfg;
    ccq_runtime *rt = NULL;
    ccq_status st;

    ccq_config_init(&cfg);
    cfg.host_devices = NDEV;
    cfg.timeout_ms = timeout_ms;
    cfg.trace_capacity = capacity;
    cfg.fault = fault;
    cfg.trace_file = file;
    st = ccq_runtime_create(&cfg, &rt);
    if (st != CCQ_OK)
        fail_msg("ccq_runtime_create: %s: %s", ccq_status_name(st), ccq_last_error_detail());
    return rt;
}

static void comm_init(ccq_runtime *rt, const ccq_device_id *devs, size_t n)
{
    ccq_status st = ccq_comm_init(rt, devs, n);
    if (st != CCQ_OK)
        fail_msg("ccq_comm_init: %s: %s", ccq_status_name(st), ccq_last_error_detail());
}

static void ok(ccq_status st, const char *what)
{
    if (st != CCQ_OK)
        fail_msg("%s: %s: %s", what, ccq_status_name(st), ccq_last_error_detail());
}

/* Every fence call of a test thread, to compare with its FENCE_BEGIN/END events. */
typedef struct fence_call {
    ccq_device_id device;
    ccq_stream_id stream;
    ccq_status status;
} fence_call;

typedef struct fence_log {
    fence_call c[1024];
    size_t n;
    uint32_t tid;
} fence_log;

static ccq_status fence(ccq_runtime *rt, fence_log *fl, ccq_device_id d, ccq_stream_id s)
{
    ccq_status st = ccq_sync_collective(rt, d, s);
    assert_true(fl->n < sizeof fl->c / sizeof fl->c[0]);
    fl->c[fl->n++] = (fence_call){d, s, st};
    return st;
}

/* A fence that must end with `want` (and detail containing `want_detail`). The fence's own
 * deadline is timeout_ms plus a short grace; on a loaded machine it can pass before the
 * watchdog's verdict, returning a bare "still pending" timeout: fence again, boundedly. */
static void fence_expect(ccq_runtime *rt, fence_log *fl, ccq_device_id d, ccq_stream_id s,
                         ccq_status want, const char *want_detail, char *out, size_t outlen)
{
    char detail[DETAIL_LEN];
    uint64_t give_up = now_ns() + 10000000000ull;
    ccq_status st;

    for (;;) {
        st = fence(rt, fl, d, s);
        snprintf(detail, sizeof detail, "%s", ccq_last_error_detail());
        if (want == CCQ_OK || st != CCQ_ERR_TIMEOUT ||
            strstr(detail, "still pending after timeout_ms") == NULL || now_ns() > give_up)
            break;
    }
    if (st != want)
        fail_msg("fence device %u stream %u: got %s, want %s (%s)", d, s, ccq_status_name(st),
                 ccq_status_name(want), detail);
    if (want_detail != NULL && strstr(detail, want_detail) == NULL)
        fail_msg("fence device %u stream %u: detail lacks \"%s\": %s", d, s, want_detail, detail);
    if (out != NULL)
        snprintf(out, outlen, "%s", detail);
}

/* Events delivered to a callback, with the thread that delivered each. */
typedef struct evlog {
    pthread_mutex_t mu;
    ccq_event *ev;
    uint32_t *tid;
    size_t n, cap;
} evlog;

static void evlog_init(evlog *l)
{
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
}

static void evlog_free(evlog *l)
{
    free(l->ev);
    free(l->tid);
    pthread_mutex_destroy(&l->mu);
}

static void evlog_cb(const ccq_event *ev, void *user)
{
    evlog *l = user;
    pthread_mutex_lock(&l->mu);
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 1024;
        ccq_event *e = realloc(l->ev, cap * sizeof *e);
        uint32_t *t = realloc(l->tid, cap * sizeof *t);
        if (e == NULL || t == NULL)
            abort();
        l->ev = e;
        l->tid = t;
        l->cap = cap;
    }
    l->ev[l->n] = *ev;
    l->tid[l->n] = my_tid();
    l->n++;
    pthread_mutex_unlock(&l->mu);
}

static size_t evlog_count(evlog *l)
{
    pthread_mutex_lock(&l->mu);
    size_t n = l->n;
    pthread_mutex_unlock(&l->mu);
    return n;
}

/* A snapshot with room for everything the recorder can hold. */
static ccq_event *snap(ccq_runtime *rt, size_t *n, uint64_t *dropped)
{
    ccq_event *ev = calloc(SNAP_MAX, sizeof *ev);
    assert_non_null(ev);
    ev[0].struct_size = sizeof *ev;
    ok(ccq_trace_snapshot(rt, ev, SNAP_MAX, n, dropped), "ccq_trace_snapshot");
    assert_true(*n < SNAP_MAX);
    for (size_t k = 1; k < *n; k++)
        if (ev[k].time_ns < ev[k - 1].time_ns)
            fail_msg("snapshot not in time order at %zu", k);
    return ev;
}

static void count_types(const ccq_event *ev, size_t n, uint64_t cnt[CCQ_EV_TYPE_COUNT_])
{
    memset(cnt, 0, CCQ_EV_TYPE_COUNT_ * sizeof cnt[0]);
    for (size_t k = 0; k < n; k++) {
        if (ev[k].type >= CCQ_EV_TYPE_COUNT_)
            fail_msg("event %zu has type %u", k, ev[k].type);
        cnt[ev[k].type]++;
    }
}

static void expect_counts(const ccq_event *ev, size_t n, const uint64_t want[CCQ_EV_TYPE_COUNT_])
{
    uint64_t got[CCQ_EV_TYPE_COUNT_];
    count_types(ev, n, got);
    for (uint32_t t = 0; t < CCQ_EV_TYPE_COUNT_; t++)
        if (got[t] != want[t])
            fail_msg("%s events: got %llu, want %llu", ccq_event_type_name(t),
                     (unsigned long long)got[t], (unsigned long long)want[t]);
}

/* A total order on events, to compare two sets of them. */
static int ev_cmp(const void *pa, const void *pb)
{
    const ccq_event *a = pa, *b = pb;
    if (a->time_ns != b->time_ns)
        return a->time_ns < b->time_ns ? -1 : 1;
    if (a->type != b->type)
        return a->type < b->type ? -1 : 1;
    if (a->id != b->id)
        return a->id < b->id ? -1 : 1;
    return memcmp(a, b, sizeof *a);
}

/* The events of `a` for which keep() holds, sorted. */
static ccq_event *filtered(const ccq_event *a, size_t n, bool (*keep)(uint32_t), size_t *out_n)
{
    ccq_event *r = calloc(n ? n : 1, sizeof *r);
    size_t m = 0;
    assert_non_null(r);
    for (size_t k = 0; k < n; k++)
        if (keep == NULL || keep(a[k].type))
            r[m++] = a[k];
    qsort(r, m, sizeof *r, ev_cmp);
    *out_n = m;
    return r;
}

static bool not_fence(uint32_t type)
{
    return !is_fence(type);
}

/* `a` and `b` hold the same events (as multisets). */
static void same_events(const char *what, const ccq_event *a, size_t na, const ccq_event *b,
                        size_t nb)
{
    size_t ma, mb;
    ccq_event *x = filtered(a, na, NULL, &ma), *y = filtered(b, nb, NULL, &mb);
    if (ma != mb)
        fail_msg("%s: %zu events vs %zu", what, ma, mb);
    for (size_t k = 0; k < ma; k++)
        if (memcmp(&x[k], &y[k], sizeof x[k]) != 0)
            fail_msg("%s: event %zu differs: %s id %llu t %llu vs %s id %llu t %llu", what, k,
                     ccq_event_type_name(x[k].type), (unsigned long long)x[k].id,
                     (unsigned long long)x[k].time_ns, ccq_event_type_name(y[k].type),
                     (unsigned long long)y[k].id, (unsigned long long)y[k].time_ns);
    free(x);
    free(y);
}

/* ------------------------------------------------------------------------------------ */
/* Checks of a complete event set                                                        */
/* ------------------------------------------------------------------------------------ */

/* The operation a command belongs to: (communicator, direction, sequence number). */
typedef struct op_key {
    uint64_t batch;
    uint32_t comm, sender;
    uint64_t seq;
} op_key;

static op_key key_of(const ccq_event *e)
{
    op_key k = {e->batch, e->comm, UINT32_MAX, e->seq};
    if (e->kind == CCQ_KIND_SEND)
        k.sender = e->device;
    else if (e->kind == CCQ_KIND_RECV)
        k.sender = e->peer;
    return k;
}

static int key_cmp(const void *pa, const void *pb)
{
    const op_key *a = pa, *b = pb;
    if (a->batch != b->batch)
        return a->batch < b->batch ? -1 : 1;
    if (a->comm != b->comm)
        return a->comm < b->comm ? -1 : 1;
    if (a->sender != b->sender)
        return a->sender < b->sender ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static bool same_cmd(const ccq_event *a, const ccq_event *b)
{
    return a->device == b->device && a->stream == b->stream && a->seq == b->seq &&
           a->count == b->count && a->bytes == b->bytes && a->dtype == b->dtype &&
           a->kind == b->kind && a->op == b->op && a->comm == b->comm &&
           a->peer_valid == b->peer_valid && a->peer == b->peer && a->thread == b->thread;
}

typedef struct cmd_view {
    const ccq_event *sub, *iss, *end;
} cmd_view;

/*
 * Every command id 1..max: exactly one SUBMITTED, at most one ISSUED, exactly one COMPLETED
 * or FAILED, submitted <= issued <= ended in time, the same command fields in all; a
 * COMPLETED one was issued; every MATCHED names a submitted command of its operation; every
 * ISSUED command's operation was matched first. Returns the views (indexed by id) and the
 * number of commands.
 */
static cmd_view *check_commands(const ccq_event *ev, size_t n, uint64_t *ncmds)
{
    uint64_t max = 0;
    cmd_view *v;

    for (size_t k = 0; k < n; k++)
        if (is_cmd(ev[k].type) && ev[k].id > max)
            max = ev[k].id;
    v = calloc(max + 1, sizeof *v);
    assert_non_null(v);
    for (size_t k = 0; k < n; k++) {
        const ccq_event *e = &ev[k];
        const ccq_event **slot;
        if (!is_cmd(e->type))
            continue;
        if (e->id == 0)
            fail_msg("%s event with command id 0", ccq_event_type_name(e->type));
        slot = e->type == CCQ_EV_SUBMITTED ? &v[e->id].sub
               : e->type == CCQ_EV_ISSUED  ? &v[e->id].iss
                                           : &v[e->id].end;
        if (*slot != NULL)
            fail_msg("command %llu: two events of kind %s (%s, %s)", (unsigned long long)e->id,
                     e->type == CCQ_EV_SUBMITTED ? "submitted"
                     : e->type == CCQ_EV_ISSUED  ? "issued"
                                                 : "completed/failed",
                     ccq_event_type_name((*slot)->type), ccq_event_type_name(e->type));
        *slot = e;
    }
    for (uint64_t id = 1; id <= max; id++) {
        cmd_view *c = &v[id];
        if (c->sub == NULL || c->end == NULL)
            fail_msg("command %llu: submitted %s, ended %s", (unsigned long long)id,
                     c->sub ? "yes" : "MISSING", c->end ? "yes" : "MISSING");
        if (!same_cmd(c->sub, c->end) || (c->iss != NULL && !same_cmd(c->sub, c->iss)))
            fail_msg("command %llu: fields differ across its events", (unsigned long long)id);
        if (c->sub->batch != 0 || c->sub->status != CCQ_OK)
            fail_msg("command %llu: SUBMITTED has batch %llu status %d", (unsigned long long)id,
                     (unsigned long long)c->sub->batch, c->sub->status);
        if (c->end->type == CCQ_EV_COMPLETED ? c->end->status != CCQ_OK : c->end->status == CCQ_OK)
            fail_msg("command %llu: %s with status %s", (unsigned long long)id,
                     ccq_event_type_name(c->end->type), ccq_status_name(c->end->status));
        if (c->end->type == CCQ_EV_COMPLETED && c->iss == NULL)
            fail_msg("command %llu completed but was never issued", (unsigned long long)id);
        if (c->iss != NULL) {
            if (c->iss->batch == 0 || c->iss->batch != c->end->batch || c->iss->status != CCQ_OK)
                fail_msg("command %llu: issued in batch %llu, ended with batch %llu",
                         (unsigned long long)id, (unsigned long long)c->iss->batch,
                         (unsigned long long)c->end->batch);
            if (c->sub->time_ns > c->iss->time_ns || c->iss->time_ns > c->end->time_ns)
                fail_msg("command %llu: times submitted %llu issued %llu ended %llu",
                         (unsigned long long)id, (unsigned long long)c->sub->time_ns,
                         (unsigned long long)c->iss->time_ns, (unsigned long long)c->end->time_ns);
        } else {
            if (c->end->batch != 0 || c->sub->time_ns > c->end->time_ns)
                fail_msg("command %llu: never issued, ended with batch %llu at %llu (submitted "
                         "%llu)",
                         (unsigned long long)id, (unsigned long long)c->end->batch,
                         (unsigned long long)c->end->time_ns, (unsigned long long)c->sub->time_ns);
        }
        if (c->sub->bytes != c->sub->count * ccq_dtype_size((ccq_dtype)c->sub->dtype))
            fail_msg("command %llu: bytes %llu for %llu x %s", (unsigned long long)id,
                     (unsigned long long)c->sub->bytes, (unsigned long long)c->sub->count,
                     ccq_dtype_name((ccq_dtype)c->sub->dtype));
        if (c->sub->kind == CCQ_KIND_ALL_REDUCE
                ? c->sub->peer_valid != 0
                : (c->sub->kind == CCQ_KIND_SEND || c->sub->kind == CCQ_KIND_RECV) &&
                      c->sub->peer_valid != 1)
            fail_msg("command %llu: kind %u with peer_valid %u", (unsigned long long)id,
                     c->sub->kind, c->sub->peer_valid);
    }
    /* MATCHED: one per operation, naming one of its commands; before any part is issued. */
    for (size_t k = 0; k < n; k++) {
        const ccq_event *m = &ev[k];
        if (m->type != CCQ_EV_MATCHED)
            continue;
        if (m->id == 0 || m->id > max)
            fail_msg("MATCHED names command %llu", (unsigned long long)m->id);
        const ccq_event *s = v[m->id].sub;
        if (s->comm != m->comm || s->seq != m->seq || s->count != m->count)
            fail_msg("MATCHED #%llu: comm %u seq %llu, its command has comm %u seq %llu",
                     (unsigned long long)m->id, m->comm, (unsigned long long)m->seq, s->comm,
                     (unsigned long long)s->seq);
    }
    for (uint64_t id = 1; id <= max; id++) {
        const ccq_event *iss = v[id].iss;
        bool found = false;
        if (iss == NULL)
            continue;
        op_key want = key_of(iss);
        for (size_t k = 0; k < n && !found; k++) {
            const ccq_event *m = &ev[k];
            if (m->type != CCQ_EV_MATCHED)
                continue;
            op_key got = key_of(v[m->id].sub);
            got.batch = want.batch;
            if (key_cmp(&got, &want) == 0) {
                found = true;
                if (m->time_ns > iss->time_ns)
                    fail_msg("command %llu issued before its operation matched",
                             (unsigned long long)id);
            }
        }
        if (!found)
            fail_msg("command %llu issued, its operation never MATCHED", (unsigned long long)id);
    }
    *ncmds = max;
    return v;
}

/*
 * Batches: unique ids, one BATCH_DONE each (not before it), every ISSUED names a BATCH that
 * started (time - bytes) no earlier than it, all ISSUED of a batch share one time, and every
 * BATCH's count is the number of distinct operations issued in it. Returns the sum of the counts.
 */
static uint64_t check_batches(const ccq_event *ev, size_t n)
{
    op_key *keys = calloc(n ? n : 1, sizeof *keys);
    uint64_t *issue_time = calloc(n ? n : 1, sizeof *issue_time); /* per BATCH event */
    size_t nk = 0;
    uint64_t total = 0;

    assert_non_null(keys);
    assert_non_null(issue_time);
    for (size_t k = 0; k < n; k++) {
        const ccq_event *b = &ev[k];
        const ccq_event *done = NULL;
        if (b->type != CCQ_EV_BATCH)
            continue;
        for (size_t j = 0; j < n; j++) {
            if (j != k && ev[j].type == CCQ_EV_BATCH && ev[j].id == b->id)
                fail_msg("two BATCH events with id %llu", (unsigned long long)b->id);
            if (ev[j].type == CCQ_EV_BATCH_DONE && ev[j].id == b->id) {
                if (done != NULL)
                    fail_msg("batch %llu: two BATCH_DONE", (unsigned long long)b->id);
                done = &ev[j];
            }
        }
        if (done == NULL || done->time_ns < b->time_ns || done->count != b->count)
            fail_msg("batch %llu: BATCH_DONE %s", (unsigned long long)b->id,
                     done ? "before BATCH or with another count" : "missing");
        total += b->count;
    }
    for (size_t k = 0; k < n; k++) {
        const ccq_event *e = &ev[k];
        bool found = false;
        if (e->type != CCQ_EV_ISSUED)
            continue;
        for (size_t j = 0; j < n && !found; j++) {
            const ccq_event *b = &ev[j];
            if (b->type == CCQ_EV_BATCH && b->id == e->batch) {
                found = true;
                /* The BATCH event's time and its duration (bytes) come from two clock reads,
                 * the duration's first: time - bytes is at or just after the issue time. */
                if (e->time_ns > b->time_ns - b->bytes)
                    fail_msg("command %llu: issued at %llu, its batch %llu started at %llu",
                             (unsigned long long)e->id, (unsigned long long)e->time_ns,
                             (unsigned long long)b->id,
                             (unsigned long long)(b->time_ns - b->bytes));
                if (issue_time[j] == 0)
                    issue_time[j] = e->time_ns;
                if (issue_time[j] != e->time_ns)
                    fail_msg("batch %llu: its commands have different issue times",
                             (unsigned long long)b->id);
            }
        }
        if (!found)
            fail_msg("command %llu: ISSUED in batch %llu, which has no BATCH event",
                     (unsigned long long)e->id, (unsigned long long)e->batch);
        keys[nk++] = key_of(e);
    }
    qsort(keys, nk, sizeof *keys, key_cmp);
    for (size_t k = 0; k < n; k++) {
        const ccq_event *b = &ev[k];
        uint64_t ops = 0;
        if (b->type != CCQ_EV_BATCH)
            continue;
        for (size_t j = 0; j < nk; j++)
            if (keys[j].batch == b->id && (j == 0 || key_cmp(&keys[j], &keys[j - 1]) != 0))
                ops++;
        if (ops != b->count)
            fail_msg("batch %llu: count %llu, %llu distinct operations issued in it",
                     (unsigned long long)b->id, (unsigned long long)b->count,
                     (unsigned long long)ops);
    }
    free(keys);
    free(issue_time);
    return total;
}

/* The fence events of one thread: a BEGIN/END pair per call, in call order, with the
 * call's device, stream and result. */
static void check_fences(const ccq_event *ev, size_t n, const fence_log *fl)
{
    size_t call = 0, half = 0;
    for (size_t k = 0; k < n; k++) {
        const ccq_event *e = &ev[k];
        if (!is_fence(e->type) || e->thread != fl->tid)
            continue;
        if (call >= fl->n)
            fail_msg("thread %u: more fence events than its %zu fence calls", fl->tid, fl->n);
        const fence_call *c = &fl->c[call];
        uint32_t want_type = half == 0 ? CCQ_EV_FENCE_BEGIN : CCQ_EV_FENCE_END;
        int want_st = half == 0 ? CCQ_OK : c->status;
        if (e->type != want_type || e->device != c->device || e->stream != c->stream ||
            e->status != want_st)
            fail_msg("fence call %zu (device %u stream %u -> %s): event %s device %u stream %u "
                     "status %s",
                     call, c->device, c->stream, ccq_status_name(c->status),
                     ccq_event_type_name(e->type), e->device, e->stream,
                     ccq_status_name(e->status));
        if (++half == 2) {
            half = 0;
            call++;
        }
    }
    if (call != fl->n || half != 0)
        fail_msg("thread %u: %zu fence calls, events for %zu (+%zu)", fl->tid, fl->n, call, half);
}

/* ------------------------------------------------------------------------------------ */
/* A minimal strict JSON syntax check (RFC 8259), for the dumps                          */
/* ------------------------------------------------------------------------------------ */

typedef struct jp {
    const char *s;
    int depth;
} jp;

static void jws(jp *p)
{
    while (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')
        p->s++;
}

static bool jvalue(jp *p);

static bool jstring(jp *p)
{
    if (*p->s != '"')
        return false;
    for (p->s++; *p->s != '"'; p->s++) {
        unsigned char ch = (unsigned char)*p->s;
        if (ch < 0x20)
            return false;
        if (ch == '\\') {
            p->s++;
            if (*p->s == 'u') {
                for (int k = 1; k <= 4; k++)
                    if (!strchr("0123456789abcdefABCDEF", p->s[k]) || p->s[k] == '\0')
                        return false;
                p->s += 4;
            } else if (*p->s == '\0' || !strchr("\"\\/bfnrt", *p->s)) {
                return false;
            }
        }
    }
    p->s++;
    return true;
}

static bool jdigits(jp *p)
{
    if (*p->s < '0' || *p->s > '9')
        return false;
    while (*p->s >= '0' && *p->s <= '9')
        p->s++;
    return true;
}

static bool jnumber(jp *p)
{
    if (*p->s == '-')
        p->s++;
    if (*p->s == '0')
        p->s++;
    else if (!jdigits(p))
        return false;
    if (*p->s == '.') {
        p->s++;
        if (!jdigits(p))
            return false;
    }
    if (*p->s == 'e' || *p->s == 'E') {
        p->s++;
        if (*p->s == '+' || *p->s == '-')
            p->s++;
        if (!jdigits(p))
            return false;
    }
    return true;
}

static bool jlist(jp *p, char close, bool members)
{
    p->s++;
    if (++p->depth > 64)
        return false;
    jws(p);
    if (*p->s == close) {
        p->s++;
        p->depth--;
        return true;
    }
    for (;;) {
        jws(p);
        if (members) {
            if (!jstring(p))
                return false;
            jws(p);
            if (*p->s++ != ':')
                return false;
        }
        if (!jvalue(p))
            return false;
        jws(p);
        if (*p->s == ',') {
            p->s++;
            continue;
        }
        if (*p->s++ != close)
            return false;
        p->depth--;
        return true;
    }
}

static bool jvalue(jp *p)
{
    jws(p);
    switch (*p->s) {
    case '{':
        return jlist(p, '}', true);
    case '[':
        return jlist(p, ']', false);
    case '"':
        return jstring(p);
    case 't':
        return strncmp(p->s, "true", 4) == 0 ? (p->s += 4, true) : false;
    case 'f':
        return strncmp(p->s, "false", 5) == 0 ? (p->s += 5, true) : false;
    case 'n':
        return strncmp(p->s, "null", 4) == 0 ? (p->s += 4, true) : false;
    default:
        return jnumber(p);
    }
}

/* The whole text is one JSON value; on error, *where is the offset it stopped at. */
static bool json_valid(const char *text, size_t *where)
{
    jp p = {text, 0};
    bool good = jvalue(&p);
    jws(&p);
    good = good && *p.s == '\0';
    *where = (size_t)(p.s - text);
    return good;
}

/* Read a file into a NUL-terminated string (NULL if it does not exist). */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long len;
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)len + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    buf[len] = '\0';
    fclose(f);
    return buf;
}

/* The file is a valid JSON trace; returns its text (caller frees). */
static char *read_trace(const char *path)
{
    char *text = slurp(path);
    size_t where;
    if (text == NULL)
        fail_msg("trace file %s was not written", path);
    if (!json_valid(text, &where))
        fail_msg("%s is not valid JSON at offset %zu: ...%.60s", path, where,
                 text + (where > 30 ? where - 30 : 0));
    if (strstr(text, "\"traceEvents\":[") == NULL)
        fail_msg("%s has no traceEvents", path);
    return text;
}

static void temp_path(char *buf, size_t len, const char *tag)
{
    const char *dir = getenv("TMPDIR");
    snprintf(buf, len, "%s/ccq_test_trace_%d_%s.json", dir && *dir ? dir : "/tmp", (int)getpid(),
             tag);
    remove(buf);
}

/* ------------------------------------------------------------------------------------ */
/* The known workload                                                                    */
/* ------------------------------------------------------------------------------------ */

/*
 * ROUNDS rounds of: a float32 sum all_reduce over all 4 devices (stream 0), a send from
 * device 0 to device 1 (stream 1 of each), then a fence on each of those 6 streams; then one
 * fence on an idle stream, and one on a stream that does not exist (no events). Commands:
 * 6 per round; operations: 2 per round; fences: 6 per round + 1.
 */
#define WL_CMDS   (6u * ROUNDS)
#define WL_OPS    (2u * ROUNDS)
#define WL_FENCES (6u * ROUNDS + 1)

static void workload(ccq_runtime *rt, fence_log *fl)
{
    static float src[NDEV][COUNT], dst[NDEV][COUNT], sbuf[COUNT], rbuf[COUNT];

    comm_init(rt, all4, NDEV);
    for (int r = 0; r < ROUNDS; r++) {
        for (ccq_device_id d = 0; d < NDEV; d++) {
            for (int i = 0; i < COUNT; i++)
                src[d][i] = (float)(d + 1 + r);
            ok(ccq_all_reduce(rt, d, 0, src[d], dst[d], COUNT, CCQ_FLOAT32, CCQ_SUM, all4, NDEV),
               "ccq_all_reduce");
        }
        for (int i = 0; i < COUNT; i++)
            sbuf[i] = (float)(100 * r + i);
        ok(ccq_send(rt, 0, 1, sbuf, COUNT, CCQ_FLOAT32, 1), "ccq_send");
        ok(ccq_recv(rt, 1, 1, rbuf, COUNT, CCQ_FLOAT32, 0), "ccq_recv");
        for (ccq_device_id d = 0; d < NDEV; d++)
            ok(fence(rt, fl, d, 0), "fence");
        ok(fence(rt, fl, 0, 1), "fence");
        ok(fence(rt, fl, 1, 1), "fence");
        for (ccq_device_id d = 0; d < NDEV; d++)
            for (int i = 0; i < COUNT; i++)
                assert_true(dst[d][i] == (float)(10 + 4 * r));
        assert_memory_equal(sbuf, rbuf, sizeof sbuf);
    }
    ok(fence(rt, fl, 2, 5), "fence on an idle stream");
    /* A bad stream: an error, and no events (it is not a stream). */
    assert_int_equal(ccq_sync_collective(rt, 9, 0), CCQ_ERR_INVALID_ARGUMENT);
}

/* The exact event counts of the workload (batches depend on timing: from the counters). */
static void workload_counts(ccq_runtime *rt, uint64_t want[CCQ_EV_TYPE_COUNT_])
{
    ccq_stats st = stats_of(rt);
    memset(want, 0, CCQ_EV_TYPE_COUNT_ * sizeof want[0]);
    want[CCQ_EV_SUBMITTED] = WL_CMDS;
    want[CCQ_EV_MATCHED] = WL_OPS;
    want[CCQ_EV_ISSUED] = WL_CMDS;
    want[CCQ_EV_COMPLETED] = WL_CMDS;
    want[CCQ_EV_BATCH] = st.batches;
    want[CCQ_EV_BATCH_DONE] = st.batches;
    want[CCQ_EV_FENCE_BEGIN] = WL_FENCES;
    want[CCQ_EV_FENCE_END] = WL_FENCES;
    assert_int_equal(st.submitted, WL_CMDS);
    assert_int_equal(st.completed, WL_CMDS);
    assert_int_equal(st.batched_ops, WL_OPS);
}

/* ------------------------------------------------------------------------------------ */
/* (a) A known workload: exact counts, lifecycles, batches, fences                       */
/* ------------------------------------------------------------------------------------ */

static void test_known_workload(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(65536, LONG_TIMEOUT, NULL, NULL);
    fence_log fl = {.n = 0, .tid = my_tid()};
    uint64_t want[CCQ_EV_TYPE_COUNT_], dropped = 1, ncmds;
    size_t n;
    ccq_event *ev;
    cmd_view *v;

    workload(rt, &fl);
    ev = snap(rt, &n, &dropped);
    workload_counts(rt, want);
    expect_counts(ev, n, want);
    assert_int_equal(dropped, 0);
    v = check_commands(ev, n, &ncmds);
    assert_int_equal(ncmds, WL_CMDS);
    assert_int_equal(check_batches(ev, n), WL_OPS);
    check_fences(ev, n, &fl);

    /* What each command says about itself. */
    for (uint64_t id = 1; id <= ncmds; id++) {
        const ccq_event *s = v[id].sub;
        assert_int_equal(s->thread, fl.tid);
        assert_int_equal(s->dtype, CCQ_FLOAT32);
        assert_int_equal(s->count, COUNT);
        if (s->kind == CCQ_KIND_ALL_REDUCE) {
            assert_int_equal(s->stream, 0);
            assert_int_equal(s->comm, 0); /* the first communicator */
            assert_int_equal(s->op, CCQ_SUM);
            assert_true(s->seq < ROUNDS);
        } else {
            assert_int_equal(s->stream, 1);
            assert_int_equal(s->comm, 1); /* {0,1}, created by the first send */
            assert_int_equal(s->device, s->kind == CCQ_KIND_SEND ? 0 : 1);
            assert_int_equal(s->peer, s->kind == CCQ_KIND_SEND ? 1 : 0);
            assert_true(s->seq < ROUNDS);
        }
    }
    /* Scheduler events with no command: no device or stream. */
    for (size_t k = 0; k < n; k++)
        if (!is_cmd(ev[k].type) && !is_fence(ev[k].type))
            assert_true(ev[k].device == UINT32_MAX && ev[k].stream == UINT32_MAX);

    /* A snapshot into a small buffer gets the newest events that fit, and says nothing is
     * dropped (the recorder lost nothing). */
    {
        ccq_event small[8];
        size_t m;
        uint64_t d2;
        small[0].struct_size = sizeof small[0];
        ok(ccq_trace_snapshot(rt, small, 8, &m, &d2), "small snapshot");
        assert_int_equal(m, 8);
        assert_int_equal(d2, 0);
        ok(ccq_trace_snapshot(rt, NULL, 0, &m, NULL), "empty snapshot");
        assert_int_equal(m, 0);
        assert_int_equal(ccq_trace_snapshot(rt, NULL, 4, &m, NULL), CCQ_ERR_INVALID_ARGUMENT);
        assert_int_equal(ccq_trace_snapshot(NULL, small, 8, &m, NULL), CCQ_ERR_INVALID_ARGUMENT);
    }
    assert_string_equal(ccq_event_type_name(CCQ_EV_SUBMITTED), "submitted");
    assert_string_equal(ccq_event_type_name(CCQ_EV_TYPE_COUNT_), "?");
    free(v);
    free(ev);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* ------------------------------------------------------------------------------------ */
/* (b) Overflow: the newest events stay, the rest are counted                           */
/* ------------------------------------------------------------------------------------ */

#define OVF_CAP    64
#define OVF_FCAP   256 /* the fence ring of a 64-event recorder (at least 256) */
#define OVF_CMDS   3000
#define OVF_FENCES 30

static void test_overflow(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(OVF_CAP, LONG_TIMEOUT, NULL, NULL);
    ccq_device_id d0 = 0;
    evlog log;
    static float buf[OVF_CMDS];
    size_t n, ns, nlog_s, nf, nlog_f;
    uint64_t dropped;
    ccq_event *ev, *sched_ev, *fence_ev, *log_s, *log_f;
    ccq_metrics m;

    evlog_init(&log);
    ok(ccq_set_event_callback(rt, evlog_cb, &log), "set callback");
    comm_init(rt, &d0, 1);
    for (int k = 0; k < OVF_CMDS; k++) {
        ok(ccq_all_reduce(rt, 0, 0, &buf[k], &buf[k], 1, CCQ_FLOAT32, CCQ_SUM, &d0, 1),
           "ccq_all_reduce");
        if ((k + 1) % (OVF_CMDS / OVF_FENCES) == 0)
            ok(ccq_sync_collective(rt, 0, 0), "fence");
    }
    /* After shutdown nothing records any more: the callback's log is complete. */
    ok(ccq_runtime_shutdown(rt), "shutdown");
    ev = snap(rt, &n, &dropped);
    sched_ev = filtered(ev, n, not_fence, &ns);
    fence_ev = filtered(ev, n, is_fence, &nf);
    assert_int_equal(ns, OVF_CAP);
    assert_int_equal(nf, 2 * OVF_FENCES);
    assert_int_equal(n, OVF_CAP + 2 * OVF_FENCES);

    /* The callback saw every event in recording order: the newest 64 scheduler events are
     * its last 64, and they are exactly what the ring kept. */
    {
        ccq_event *order_s = calloc(log.n, sizeof *order_s);
        nlog_s = 0;
        assert_non_null(order_s);
        for (size_t k = 0; k < log.n; k++)
            if (!is_fence(log.ev[k].type))
                order_s[nlog_s++] = log.ev[k];
        assert_true(nlog_s > OVF_CAP);
        same_events("kept = newest scheduler events", sched_ev, ns, order_s + nlog_s - OVF_CAP,
                    OVF_CAP);
        free(order_s);
    }
    log_f = filtered(log.ev, log.n, is_fence, &nlog_f);
    same_events("fence events", fence_ev, nf, log_f, nlog_f);
    log_s = filtered(log.ev, log.n, not_fence, &nlog_s);
    if (dropped != nlog_s - OVF_CAP)
        fail_msg("dropped %llu, recorded %zu scheduler events, kept %d",
                 (unsigned long long)dropped, nlog_s, OVF_CAP);
    m = metrics_of(rt);
    /* trace_events counts every event recorded, fences included (all of them kept here). */
    if (m.trace_events != nlog_s + nlog_f || m.trace_dropped != dropped)
        fail_msg("metrics: trace_events %llu trace_dropped %llu; recorded %zu, dropped %llu",
                 (unsigned long long)m.trace_events, (unsigned long long)m.trace_dropped, nlog_s,
                 (unsigned long long)dropped);
    assert_int_equal(stats_of(rt).completed, OVF_CMDS);
    free(ev);
    free(sched_ev);
    free(fence_ev);
    free(log_s);
    free(log_f);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    evlog_free(&log);
}

/* The fence ring overflows too (more than 256 fence calls): it keeps its newest events and
 * its losses count in the snapshot's `dropped` and in the metrics alike. */
static void test_overflow_fences(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(OVF_CAP, LONG_TIMEOUT, NULL, NULL);
    evlog log;
    size_t n, nf, nlog_f = 0;
    uint64_t dropped, sched_recorded;
    ccq_event *ev, *fence_ev, *order_f;
    ccq_metrics m;
    const unsigned calls = 300; /* 600 fence events into a ring of 256 */

    evlog_init(&log);
    ok(ccq_set_event_callback(rt, evlog_cb, &log), "set callback");
    for (unsigned k = 0; k < calls; k++)
        ok(ccq_sync_collective(rt, 1, 2), "fence on an idle stream");
    ok(ccq_runtime_shutdown(rt), "shutdown");
    ev = snap(rt, &n, &dropped);
    fence_ev = filtered(ev, n, is_fence, &nf);
    assert_int_equal(nf, OVF_FCAP);
    order_f = calloc(log.n, sizeof *order_f);
    assert_non_null(order_f);
    for (size_t k = 0; k < log.n; k++)
        if (is_fence(log.ev[k].type))
            order_f[nlog_f++] = log.ev[k];
    assert_int_equal(nlog_f, 2 * calls);
    same_events("kept = newest fence events", fence_ev, nf, order_f + nlog_f - OVF_FCAP, OVF_FCAP);
    sched_recorded = log.n - nlog_f;
    assert_int_equal(sched_recorded, 0);
    if (dropped != 2 * calls - OVF_FCAP)
        fail_msg("snapshot dropped %llu, want %u (600 fence events, 256 kept)",
                 (unsigned long long)dropped, 2 * calls - OVF_FCAP);
    m = metrics_of(rt);
    free(ev);
    free(fence_ev);
    free(order_f);
    /* Destroyed before the verdict, so a failure here leaks nothing into sanitizer runs. */
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    evlog_free(&log);
    if (m.trace_dropped != dropped || m.trace_events != 2 * calls)
        fail_msg("metrics disagree with the snapshot: trace_events %llu (recorded %u), "
                 "trace_dropped %llu (snapshot dropped %llu)",
                 (unsigned long long)m.trace_events, 2 * calls, (unsigned long long)m.trace_dropped,
                 (unsigned long long)dropped);
}

/*
 * The dump of an overflowed recorder: one command at a time (fenced), so the scheduler ring
 * holds a fixed cycle of 6 events per command (submitted, matched, issued, batch, completed,
 * batch_done). 128 = 21 x 6 + 2 keeps only the last two events of the oldest command: its
 * COMPLETED without its ISSUED. Nothing failed, so the dump must show no failure.
 */
static void test_overflow_dump(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(128, LONG_TIMEOUT, NULL, NULL);
    ccq_device_id d0 = 0;
    static float buf[100];
    char path[256];
    size_t n;
    uint64_t dropped;
    ccq_event *ev;
    char *text;

    temp_path(path, sizeof path, "overflow");
    comm_init(rt, &d0, 1);
    for (int k = 0; k < 100; k++) {
        ok(ccq_all_reduce(rt, 0, 0, &buf[k], &buf[k], 1, CCQ_FLOAT32, CCQ_SUM, &d0, 1), "ar");
        ok(ccq_sync_collective(rt, 0, 0), "fence");
    }
    ok(ccq_runtime_shutdown(rt), "shutdown");
    ev = snap(rt, &n, &dropped);
    assert_int_equal(dropped, 6 * 100 - 128); /* 200 fence events fit their ring */
    assert_int_equal(n, 128 + 2 * 100);
    /* The two oldest kept: COMPLETED and BATCH_DONE of command 79 (600 - 128 = 78 x 6 + 4). */
    {
        bool issued = false, completed = false;
        for (size_t k = 0; k < n; k++) {
            issued |= ev[k].type == CCQ_EV_ISSUED && ev[k].id == 79;
            completed |= ev[k].type == CCQ_EV_COMPLETED && ev[k].id == 79;
        }
        assert_true(completed && !issued);
    }
    ok(ccq_trace_dump(rt, path), "ccq_trace_dump");
    text = read_trace(path);
    free(ev);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    remove(path);
    if (strstr(text, "failed") != NULL) {
        const char *at = strstr(text, "failed");
        const char *from = at - 200 > text ? at - 200 : text;
        char excerpt[400];
        snprintf(excerpt, sizeof excerpt, "%.*s", (int)(at - from + 120), from);
        free(text);
        fail_msg("nothing failed, but the dump shows a failure: ...%s...", excerpt);
    }
    free(text);
}

/* ------------------------------------------------------------------------------------ */
/* (c) trace_capacity = 0: no recorder, the callback still works                        */
/* ------------------------------------------------------------------------------------ */

static void test_disabled(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(0, LONG_TIMEOUT, NULL, NULL);
    fence_log fl = {.n = 0, .tid = my_tid()};
    char path[256];
    evlog log;
    ccq_event buf[16];
    size_t n = 99;
    uint64_t dropped = 99, want[CCQ_EV_TYPE_COUNT_], ncmds;
    ccq_metrics m;
    cmd_view *v;

    temp_path(path, sizeof path, "disabled");
    evlog_init(&log);
    ok(ccq_set_event_callback(rt, evlog_cb, &log), "set callback");
    workload(rt, &fl);
    ok(ccq_runtime_shutdown(rt), "shutdown");
    assert_int_equal(ccq_trace_dump(rt, path), CCQ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(ccq_last_error_detail(), "trace_capacity = 0"));
    assert_null(slurp(path));
    buf[0].struct_size = sizeof buf[0];
    ok(ccq_trace_snapshot(rt, buf, 16, &n, &dropped), "snapshot");
    assert_int_equal(n, 0);
    assert_int_equal(dropped, 0);
    m = metrics_of(rt);
    assert_int_equal(m.trace_events, 0);
    assert_int_equal(m.trace_dropped, 0);
    /* The callback got the whole workload, as a recorder would have. */
    workload_counts(rt, want);
    expect_counts(log.ev, log.n, want);
    v = check_commands(log.ev, log.n, &ncmds);
    assert_int_equal(ncmds, WL_CMDS);
    assert_int_equal(check_batches(log.ev, log.n), WL_OPS);
    {
        ccq_event *sorted = filtered(log.ev, log.n, NULL, &n);
        check_fences(sorted, n, &fl);
        free(sorted);
    }
    free(v);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    evlog_free(&log);
}

/* ------------------------------------------------------------------------------------ */
/* (d) The callback: once each, in recording order, on the right threads                */
/* ------------------------------------------------------------------------------------ */

typedef struct fencer {
    ccq_runtime *rt;
    fence_log fl;
    pthread_barrier_t *bar;
} fencer;

static void *fencer_main(void *p)
{
    fencer *f = p;
    f->fl.tid = my_tid();
    pthread_barrier_wait(f->bar);
    for (int k = 0; k < 20; k++)
        ok(fence(f->rt, &f->fl, 3, 7), "fence on an idle stream");
    return NULL;
}

/* Recording order, as the scheduler's delivery order shows it: command ids are assigned in
 * arrival order and SUBMITTED is recorded then, so SUBMITTED ids count up from `first_id`
 * without a gap; BATCH ids likewise; a command's SUBMITTED, ISSUED and end come in that
 * order, and a batch's BATCH before its BATCH_DONE. */
static void check_recording_order(const ccq_event *ev, size_t n, uint64_t first_id)
{
    uint64_t next_id = first_id, next_batch = 0, max = 0;
    size_t *pos;

    for (size_t k = 0; k < n; k++)
        if (is_cmd(ev[k].type) && ev[k].id > max)
            max = ev[k].id;
    pos = calloc(max + 1, sizeof *pos);
    assert_non_null(pos);
    for (size_t k = 0; k < n; k++) {
        const ccq_event *e = &ev[k];
        switch (e->type) {
        case CCQ_EV_SUBMITTED:
            if (e->id != next_id)
                fail_msg("delivery %zu: SUBMITTED id %llu, want %llu", k, (unsigned long long)e->id,
                         (unsigned long long)next_id);
            next_id++;
            pos[e->id] = k + 1;
            break;
        case CCQ_EV_ISSUED:
        case CCQ_EV_COMPLETED:
        case CCQ_EV_FAILED:
            if (pos[e->id] == 0)
                fail_msg("delivery %zu: %s of command %llu before its predecessor event", k,
                         ccq_event_type_name(e->type), (unsigned long long)e->id);
            pos[e->id] = e->type == CCQ_EV_ISSUED ? k + 1 : 0;
            break;
        case CCQ_EV_BATCH:
            if (next_batch != 0 && e->id != next_batch)
                fail_msg("delivery %zu: BATCH %llu after %llu", k, (unsigned long long)e->id,
                         (unsigned long long)next_batch - 1);
            next_batch = e->id + 1;
            for (size_t j = 0; j < k; j++)
                if (ev[j].type == CCQ_EV_BATCH_DONE && ev[j].id == e->id)
                    fail_msg("BATCH_DONE %llu delivered before its BATCH",
                             (unsigned long long)e->id);
            break;
        default:
            break;
        }
    }
    free(pos);
}

static void test_callback(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(65536, LONG_TIMEOUT, NULL, NULL);
    fence_log fl = {.n = 0, .tid = my_tid()};
    evlog a, b;
    fencer fz;
    pthread_t th;
    pthread_barrier_t bar;
    size_t n, na, nb;
    uint64_t dropped, ids_before;
    ccq_event *ev, *both;
    uint32_t sched_tid = 0;
    static float x[NDEV][64];

    evlog_init(&a);
    evlog_init(&b);
    ok(ccq_set_event_callback(rt, evlog_cb, &a), "set callback a");
    pthread_barrier_init(&bar, NULL, 2);
    memset(&fz, 0, sizeof fz);
    fz.rt = rt;
    fz.bar = &bar;
    pthread_create(&th, NULL, fencer_main, &fz);
    pthread_barrier_wait(&bar);
    workload(rt, &fl); /* while the other thread fences */

    /* Switch callbacks while commands are in flight: every event goes to exactly one. */
    for (int k = 0; k < 64; k++) {
        for (ccq_device_id d = 0; d < NDEV; d++)
            ok(ccq_all_reduce(rt, d, 0, &x[d][k], &x[d][k], 1, CCQ_FLOAT32, CCQ_SUM, all4, NDEV),
               "ccq_all_reduce");
        if (k == 32)
            ok(ccq_set_event_callback(rt, evlog_cb, &b), "set callback b");
    }
    for (ccq_device_id d = 0; d < NDEV; d++)
        ok(fence(rt, &fl, d, 0), "fence");
    pthread_join(th, NULL);
    pthread_barrier_destroy(&bar);
    /* A snapshot is answered between scheduler passes: everything about the commands above
     * has been recorded, and delivered, when it returns. */
    ev = snap(rt, &n, &dropped);
    assert_int_equal(dropped, 0);
    na = evlog_count(&a);
    nb = evlog_count(&b);
    assert_true(na > 0 && nb > 0);
    both = calloc(na + nb, sizeof *both);
    assert_non_null(both);
    memcpy(both, a.ev, na * sizeof *both);
    memcpy(both + na, b.ev, nb * sizeof *both);
    same_events("callback a + b = recorder", both, na + nb, ev, n);

    /* Threads: scheduler events on one thread, not a caller's; fence events on the thread
     * that fenced (the event names it). */
    for (int l = 0; l < 2; l++) {
        evlog *g = l ? &b : &a;
        for (size_t k = 0; k < g->n; k++) {
            const ccq_event *e = &g->ev[k];
            if (is_fence(e->type)) {
                if (g->tid[k] != e->thread || (e->thread != fl.tid && e->thread != fz.fl.tid))
                    fail_msg("fence event delivered on thread %u, fenced on %u", g->tid[k],
                             e->thread);
            } else {
                if (sched_tid == 0)
                    sched_tid = g->tid[k];
                if (g->tid[k] != sched_tid || sched_tid == fl.tid || sched_tid == fz.fl.tid)
                    fail_msg("scheduler event %s delivered on thread %u (first on %u)",
                             ccq_event_type_name(e->type), g->tid[k], sched_tid);
            }
        }
    }
    /* Recording order over the switch: a's events, then b's. */
    {
        ccq_event *order = calloc(na + nb, sizeof *order);
        size_t m = 0;
        assert_non_null(order);
        for (size_t k = 0; k < na + nb; k++)
            if (!is_fence(both[k].type))
                order[m++] = both[k];
        check_recording_order(order, m, 1);
        free(order);
    }
    {
        uint64_t ncmds;
        cmd_view *v = check_commands(ev, n, &ncmds);
        assert_int_equal(ncmds, WL_CMDS + 64 * NDEV);
        check_batches(ev, n);
        check_fences(ev, n, &fl);
        check_fences(ev, n, &fz.fl);
        free(v);
    }
    ids_before = WL_CMDS + 64 * NDEV;

    /* Cleared: nothing recorded after that reaches either callback. */
    ok(ccq_set_event_callback(rt, NULL, NULL), "clear callback");
    for (ccq_device_id d = 0; d < NDEV; d++)
        ok(ccq_all_reduce(rt, d, 0, x[d], x[d], 64, CCQ_FLOAT32, CCQ_SUM, all4, NDEV),
           "ccq_all_reduce");
    for (ccq_device_id d = 0; d < NDEV; d++)
        ok(ccq_sync_collective(rt, d, 0), "fence");
    free(ev);
    ev = snap(rt, &n, &dropped);
    assert_int_equal(evlog_count(&a), na);
    assert_int_equal(evlog_count(&b), nb);
    {
        uint64_t ncmds;
        cmd_view *v = check_commands(ev, n, &ncmds);
        assert_int_equal(ncmds, ids_before + NDEV);
        free(v);
    }
    assert_int_equal(ccq_set_event_callback(NULL, evlog_cb, &a), CCQ_ERR_INVALID_ARGUMENT);
    free(both);
    free(ev);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    evlog_free(&a);
    evlog_free(&b);
}

/* ------------------------------------------------------------------------------------ */
/* (e) Failure events: backend failure, mismatch, watchdog, abort                       */
/* ------------------------------------------------------------------------------------ */

/* The first event of `type` on (device, stream) (UINT32_MAX = any). */
static const ccq_event *find_ev(const ccq_event *ev, size_t n, uint32_t type, uint32_t device,
                                uint32_t stream)
{
    for (size_t k = 0; k < n; k++)
        if (ev[k].type == type && (device == UINT32_MAX || ev[k].device == device) &&
            (stream == UINT32_MAX || ev[k].stream == stream))
            return &ev[k];
    return NULL;
}

static void test_failures(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(65536, WD_TIMEOUT, "fail:op=0", NULL);
    fence_log fl = {.n = 0, .tid = my_tid()};
    static float a[NDEV][COUNT], big[2][2 * COUNT];
    char path[256], detail[DETAIL_LEN];
    uint64_t want[CCQ_EV_TYPE_COUNT_] = {0}, dropped, ncmds;
    size_t n;
    ccq_event *ev;
    cmd_view *v;
    char *text;

    temp_path(path, sizeof path, "failures");
    comm_init(rt, all4, NDEV); /* comm 0 */
    comm_init(rt, pair01, 2);  /* comm 1 */
    comm_init(rt, pair23, 2);  /* comm 2 */

    /* 1. The backend fails operation 0: all_reduce #0 of comm 0, stream 0. */
    for (ccq_device_id d = 0; d < NDEV; d++)
        ok(ccq_all_reduce(rt, d, 0, a[d], a[d], COUNT, CCQ_FLOAT32, CCQ_SUM, all4, NDEV),
           "ccq_all_reduce");
    for (ccq_device_id d = 0; d < NDEV; d++)
        fence_expect(rt, &fl, d, 0, CCQ_ERR_BACKEND, "fault injection", NULL, 0);

    /* 2. A mismatch on comm 1, stream 1: 8 elements on rank 0, 16 on rank 1. */
    ok(ccq_all_reduce(rt, 0, 1, big[0], big[0], COUNT, CCQ_FLOAT32, CCQ_SUM, pair01, 2), "ar");
    ok(ccq_all_reduce(rt, 1, 1, big[1], big[1], 2 * COUNT, CCQ_FLOAT32, CCQ_SUM, pair01, 2), "ar");
    fence_expect(rt, &fl, 0, 1, CCQ_ERR_MISMATCH, "count", NULL, 0);
    fence_expect(rt, &fl, 1, 1, CCQ_ERR_MISMATCH, "count", NULL, 0);

    /* 3. A missing rank on comm 2, stream 2: device 3 never submits #0. */
    ok(ccq_all_reduce(rt, 2, 2, a[2], a[2], COUNT, CCQ_FLOAT32, CCQ_SUM, pair23, 2), "ar");
    fence_expect(rt, &fl, 2, 2, CCQ_ERR_TIMEOUT, "missing rank 1 (device 3)", detail,
                 sizeof detail);
    if (verbose())
        printf("    desync report: %s\n", detail);
    assert_non_null(strstr(detail, "which has not submitted all_reduce #0"));

    ev = snap(rt, &n, &dropped);
    want[CCQ_EV_SUBMITTED] = 7;
    want[CCQ_EV_MATCHED] = 1; /* only the backend-failed op matched */
    want[CCQ_EV_ISSUED] = 4;
    want[CCQ_EV_FAILED] = 7;
    want[CCQ_EV_BATCH] = 1;
    want[CCQ_EV_BATCH_DONE] = 1;
    want[CCQ_EV_FENCE_BEGIN] = want[CCQ_EV_FENCE_END] = fl.n;
    want[CCQ_EV_WATCHDOG] = 1;
    expect_counts(ev, n, want);
    v = check_commands(ev, n, &ncmds);
    assert_int_equal(ncmds, 7);
    check_batches(ev, n);
    check_fences(ev, n, &fl);
    for (uint64_t id = 1; id <= ncmds; id++) {
        const ccq_event *s = v[id].sub, *e = v[id].end;
        int want_st = s->comm == 0   ? CCQ_ERR_BACKEND
                      : s->comm == 1 ? CCQ_ERR_MISMATCH
                                     : CCQ_ERR_TIMEOUT;
        if (e->type != CCQ_EV_FAILED || e->status != want_st)
            fail_msg("command %llu (comm %u): %s %s, want failed %s", (unsigned long long)id,
                     s->comm, ccq_event_type_name(e->type), ccq_status_name(e->status),
                     ccq_status_name(want_st));
        assert_true((v[id].iss != NULL) == (s->comm == 0));
    }
    {
        const ccq_event *w = find_ev(ev, n, CCQ_EV_WATCHDOG, UINT32_MAX, UINT32_MAX);
        const ccq_event *s = find_ev(ev, n, CCQ_EV_SUBMITTED, 2, 2);
        assert_non_null(w);
        assert_non_null(s);
        assert_int_equal(w->comm, 2);
        assert_int_equal(w->seq, 0);
        assert_int_equal(w->id, s->id);
        assert_int_equal(w->count, COUNT);
        assert_int_equal(w->status, CCQ_ERR_TIMEOUT);
        assert_true(w->time_ns >= s->time_ns + (uint64_t)WD_TIMEOUT * 1000000u);
        assert_true(w->time_ns <= v[s->id].end->time_ns);
    }

    /* The dump: valid JSON; its error notes carry the reports. */
    ok(ccq_trace_dump(rt, path), "ccq_trace_dump");
    text = read_trace(path);
    assert_non_null(strstr(text, "\"name\":\"watchdog\""));
    assert_non_null(strstr(text, "missing rank 1 (device 3)"));
    assert_non_null(strstr(text, "which has not submitted all_reduce #0 (float32 x 8, sum)"));
    assert_non_null(strstr(text, "collectives submitted/completed per rank: 0:1/0 1:0/0"));
    assert_non_null(strstr(text, "mismatch in #0 on comm"));
    assert_non_null(strstr(text, "fault injection"));
    assert_non_null(strstr(text, "\"cat\":\"op,failed\""));
    free(text);
    remove(path);
    free(v);
    free(ev);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* A slow batch past timeout_ms: the watchdog aborts its communicator (ABORT event). */
static void test_abort_event(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(65536, WD_TIMEOUT, "delay:us=5000000,op=0", NULL);
    fence_log fl = {.n = 0, .tid = my_tid()};
    static float a[2][COUNT];
    uint64_t dropped, ncmds;
    size_t n;
    ccq_event *ev;
    cmd_view *v;
    const ccq_event *ab;

    comm_init(rt, pair01, 2);
    for (ccq_device_id d = 0; d < 2; d++)
        ok(ccq_all_reduce(rt, d, 0, a[d], a[d], COUNT, CCQ_FLOAT32, CCQ_SUM, pair01, 2), "ar");
    for (ccq_device_id d = 0; d < 2; d++)
        fence_expect(rt, &fl, d, 0, CCQ_ERR_ABORTED, "did not complete within timeout_ms", NULL, 0);
    ev = snap(rt, &n, &dropped);
    v = check_commands(ev, n, &ncmds);
    assert_int_equal(ncmds, 2);
    for (uint64_t id = 1; id <= 2; id++) {
        assert_int_equal(v[id].end->type, CCQ_EV_FAILED);
        assert_int_equal(v[id].end->status, CCQ_ERR_ABORTED);
        assert_non_null(v[id].iss);
    }
    ab = find_ev(ev, n, CCQ_EV_ABORT, UINT32_MAX, UINT32_MAX);
    assert_non_null(ab);
    assert_int_equal(ab->comm, 0);
    assert_int_equal(ab->status, CCQ_ERR_ABORTED);
    check_batches(ev, n);
    check_fences(ev, n, &fl);
    free(v);
    free(ev);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* ------------------------------------------------------------------------------------ */
/* (f) trace_file: at destroy, and after a watchdog timeout while still running         */
/* ------------------------------------------------------------------------------------ */

static void test_trace_file(void **state)
{
    (void)state;
    char p_env[256], p_cfg[256];
    ccq_config cfg;
    ccq_runtime *rt;
    fence_log fl = {.n = 0, .tid = my_tid()};
    static float a[2][COUNT];
    char *text;

    /* From the environment, written at destroy. */
    temp_path(p_env, sizeof p_env, "env");
    setenv("CCQ_TRACE_FILE", p_env, 1);
    ccq_config_init(&cfg);
    assert_string_equal(cfg.trace_file, p_env);
    cfg.host_devices = NDEV;
    cfg.fault = NULL;
    cfg.trace_capacity = 65536;
    ok(ccq_runtime_create(&cfg, &rt), "create"); /* copies the name */
    unsetenv("CCQ_TRACE_FILE");
    workload(rt, &fl);
    assert_null(slurp(p_env)); /* nothing went wrong: nothing written yet */
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    text = read_trace(p_env);
    assert_non_null(strstr(text, "\"process_name\""));
    assert_non_null(strstr(text, "\"name\":\"all_reduce #0\""));
    assert_non_null(strstr(text, "\"name\":\"send #0 to 1\""));
    assert_non_null(strstr(text, "\"dropped_events\":0"));
    free(text);
    remove(p_env);

    /* From the config; the watchdog writes it while the runtime runs. */
    temp_path(p_cfg, sizeof p_cfg, "cfg");
    rt = make_rt(65536, WD_TIMEOUT, NULL, p_cfg);
    comm_init(rt, pair01, 2);
    ok(ccq_all_reduce(rt, 0, 0, a[0], a[0], COUNT, CCQ_FLOAT32, CCQ_SUM, pair01, 2), "ar");
    /* The dump is written in the scheduler pass that fires the watchdog, before the command
     * ends, so it is complete when the fence returns. */
    fence_expect(rt, &fl, 0, 0, CCQ_ERR_TIMEOUT, "missing rank", NULL, 0);
    text = read_trace(p_cfg);
    assert_non_null(strstr(text, "missing rank 1 (device 1)"));
    assert_non_null(strstr(text, "watchdog timeout on comm 0"));
    free(text);
    remove(p_cfg);
    /* And again at destroy, with the end of the story. */
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    text = read_trace(p_cfg);
    assert_non_null(strstr(text, "missing rank 1 (device 1)"));
    assert_non_null(strstr(text, "\"status\":\"CCQ_ERR_TIMEOUT\""));
    free(text);
    remove(p_cfg);
}

/* A fence that times out on its own (its commands still pending: here the scheduler is held
 * inside an event callback) asks for a dump and waits for it, bounded: when it reports the
 * timeout, trace_file is on disk. */
static _Atomic int stall_once;

static void stall_cb(const ccq_event *ev, void *user)
{
    (void)user;
    if (ev->type == CCQ_EV_ISSUED && atomic_exchange(&stall_once, 0)) {
        struct timespec ts = {0, 900000000}; /* past the fence's deadline (~0.5 s) */
        nanosleep(&ts, NULL);
    }
}

static void test_trace_file_fence_timeout(void **state)
{
    (void)state;
    char path[256];
    static float a[2][COUNT];
    ccq_runtime *rt;
    char *text;
    ccq_status st;

    temp_path(path, sizeof path, "fence");
    rt = make_rt(65536, 300, NULL, path);
    comm_init(rt, pair01, 2);
    atomic_store(&stall_once, 1);
    ok(ccq_set_event_callback(rt, stall_cb, NULL), "set callback");
    ok(ccq_all_reduce(rt, 0, 0, a[0], a[0], COUNT, CCQ_FLOAT32, CCQ_SUM, pair01, 2), "ar 0");
    ok(ccq_all_reduce(rt, 1, 0, a[1], a[1], COUNT, CCQ_FLOAT32, CCQ_SUM, pair01, 2), "ar 1");
    st = ccq_sync_collective(rt, 0, 0);
    /* The fence's own deadline passes while the scheduler sleeps in the callback: it asks
     * for a dump and waits. When the scheduler is back, it writes it (and, its watchdog
     * having passed too, aborts the batch): the fence reports its bare timeout, or the abort
     * if it was published first (then after a dump of its own). Either way the file is
     * there when the fence returns. */
    assert_true(st == CCQ_ERR_TIMEOUT || st == CCQ_ERR_ABORTED);
    text = read_trace(path);
    assert_true(strstr(text, "\"reason\":\"fence timeout\"") != NULL ||
                strstr(text, "\"reason\":\"error\"") != NULL);
    free(text);
    ok(ccq_set_event_callback(rt, NULL, NULL), "clear callback");
    /* The stall outlasted timeout_ms: the watchdog may have aborted the batch meanwhile. */
    for (ccq_device_id d = 0; d < 2; d++) {
        st = ccq_sync_collective(rt, d, 0);
        assert_true(st == CCQ_OK || st == CCQ_ERR_ABORTED || st == CCQ_ERR_TIMEOUT);
    }
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    remove(path);
}

/* ------------------------------------------------------------------------------------ */
/* (g) Live metrics                                                                     */
/* ------------------------------------------------------------------------------------ */

static void test_metrics(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(65536, LONG_TIMEOUT, NULL, NULL);
    fence_log fl = {.n = 0, .tid = my_tid()};
    static float w[2][5][COUNT];
    ccq_metrics m;
    ccq_stats st;
    uint64_t depth;
    const int K = 5;

    workload(rt, &fl);
    m = metrics_of(rt);
    st = stats_of(rt);
    assert_int_equal(m.commands_ended, st.completed + st.failed + st.cancelled);
    assert_int_equal(m.commands_ended, WL_CMDS);
    assert_true(m.uptime_ns > 0);
    assert_true(m.commands_per_s_total > 0);
    assert_true(m.commands_per_s >= 0);
    if (!(m.queue_p50_us > 0 && m.queue_p50_us <= m.queue_p99_us && m.run_p50_us > 0 &&
          m.run_p50_us <= m.run_p99_us))
        fail_msg("percentiles: queue p50 %.3f p99 %.3f us, run p50 %.3f p99 %.3f us",
                 m.queue_p50_us, m.queue_p99_us, m.run_p50_us, m.run_p99_us);
    assert_memory_equal(m.batch_size_hist, st.batch_size_hist, sizeof m.batch_size_hist);
    assert_int_equal(m.queued_now, 0);
    assert_int_equal(m.deepest_depth, 0);
    assert_true(m.trace_events > 0);
    assert_int_equal(m.trace_dropped, 0);

    /* Device 0 queues K all_reduces on stream 3 that wait for device 1. */
    comm_init(rt, pair01, 2);
    for (int k = 0; k < K; k++)
        ok(ccq_all_reduce(rt, 0, 3, w[0][k], w[0][k], COUNT, CCQ_FLOAT32, CCQ_SUM, pair01, 2),
           "ar");
    ok(ccq_stream_queue_depth(rt, 0, 3, &depth), "depth");
    assert_int_equal(depth, K);
    ok(ccq_stream_queue_depth(rt, 1, 3, &depth), "depth");
    assert_int_equal(depth, 0);
    m = metrics_of(rt);
    assert_int_equal(m.queued_now, K);
    assert_int_equal(m.deepest_device, 0);
    assert_int_equal(m.deepest_stream, 3);
    assert_int_equal(m.deepest_depth, K);
    /* Device 1 comes: all complete. */
    for (int k = 0; k < K; k++)
        ok(ccq_all_reduce(rt, 1, 3, w[1][k], w[1][k], COUNT, CCQ_FLOAT32, CCQ_SUM, pair01, 2),
           "ar");
    ok(ccq_sync_collective(rt, 0, 3), "fence");
    ok(ccq_sync_collective(rt, 1, 3), "fence");
    ok(ccq_stream_queue_depth(rt, 0, 3, &depth), "depth");
    assert_int_equal(depth, 0);
    m = metrics_of(rt);
    assert_int_equal(m.queued_now, 0);
    assert_int_equal(m.commands_ended, WL_CMDS + 2 * K);

    /* Arguments. */
    assert_int_equal(ccq_stream_queue_depth(rt, 4, 0, &depth), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_stream_queue_depth(rt, 0, 0, NULL), CCQ_ERR_INVALID_ARGUMENT);
    m.struct_size = 0;
    assert_int_equal(ccq_get_metrics(rt, &m), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_get_metrics(NULL, &m), CCQ_ERR_INVALID_ARGUMENT);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

/* The metrics are the runtime's, not the recorder's: with trace_capacity = 0 (and no
 * callback) the queue and run percentiles are still measured. */
static void test_metrics_recorder_off(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(0, LONG_TIMEOUT, NULL, NULL);
    fence_log fl = {.n = 0, .tid = my_tid()};
    ccq_metrics m;

    workload(rt, &fl);
    m = metrics_of(rt);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    assert_int_equal(m.commands_ended, WL_CMDS);
    if (!(m.queue_p50_us > 0 && m.run_p50_us > 0))
        fail_msg("recorder off: queue p50 %.3f us, run p50 %.3f us after %u commands",
                 m.queue_p50_us, m.run_p50_us, WL_CMDS);
}

/* commands_per_s is "over the last full second": busy, it is positive; after more than a
 * second with nothing ending, it is 0. */
static void test_metrics_rate(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(0, LONG_TIMEOUT, NULL, NULL);
    ccq_device_id d0 = 0;
    static float buf[64];
    uint64_t t0 = now_ns(), ended;
    ccq_metrics busy, idle;
    struct timespec two_s = {2, 200000000};

    comm_init(rt, &d0, 1);
    while (now_ns() - t0 < 1500000000ull) {
        for (int k = 0; k < 64; k++)
            ok(ccq_all_reduce(rt, 0, 0, &buf[k], &buf[k], 1, CCQ_FLOAT32, CCQ_SUM, &d0, 1), "ar");
        ok(ccq_sync_collective(rt, 0, 0), "fence");
    }
    busy = metrics_of(rt);
    ended = busy.commands_ended;
    nanosleep(&two_s, NULL);
    idle = metrics_of(rt);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    assert_true(busy.commands_per_s > 0);
    assert_int_equal(idle.commands_ended, ended);
    if (idle.commands_per_s != 0)
        fail_msg("after 2.2 s with no command ending, commands_per_s is %.0f (busy: %.0f)",
                 idle.commands_per_s, busy.commands_per_s);
}

/* ------------------------------------------------------------------------------------ */
/* (h) Concurrency: producers and fences vs snapshots, dumps, metrics, callback toggling */
/* ------------------------------------------------------------------------------------ */

#define CC_WORKERS 8
#define CC_FEVERY  8

typedef struct cc_shared {
    ccq_runtime *rt;
    unsigned iters;
    pthread_barrier_t bar;
    _Atomic int stop;
    _Atomic uint64_t delivered[CCQ_EV_TYPE_COUNT_];
    _Atomic uint64_t snapshots, dumps, toggles;
    char path[256];
    int reader_errors, toggler_errors;
} cc_shared;

typedef struct cc_worker {
    cc_shared *sh;
    int id;
    int errors;
} cc_worker;

static void count_cb(const ccq_event *ev, void *user)
{
    cc_shared *sh = user;
    if (ev->type < CCQ_EV_TYPE_COUNT_)
        atomic_fetch_add_explicit(&sh->delivered[ev->type], 1, memory_order_relaxed);
}

/* Workers 0-3: 4-rank all_reduces on stream 0 of device id; workers 4-7: a send/recv ring
 * on stream 1 of device id - 4. Each fences every CC_FEVERY iterations and at the end. */
static void *cc_worker_main(void *p)
{
    cc_worker *w = p;
    cc_shared *sh = w->sh;
    ccq_device_id d = (ccq_device_id)(w->id % NDEV);
    float src[4] = {1, 2, 3, 4}, dst[4];
    bool ring = w->id >= NDEV;

    pthread_barrier_wait(&sh->bar);
    for (unsigned it = 0; it < sh->iters; it++) {
        if (!ring) {
            w->errors += ccq_all_reduce(sh->rt, d, 0, src, dst, 4, CCQ_FLOAT32, CCQ_SUM, all4,
                                        NDEV) != CCQ_OK;
        } else {
            w->errors += ccq_send(sh->rt, d, 1, src, 4, CCQ_FLOAT32, (d + 1) % NDEV) != CCQ_OK;
            w->errors +=
                ccq_recv(sh->rt, d, 1, dst, 4, CCQ_FLOAT32, (d + NDEV - 1) % NDEV) != CCQ_OK;
        }
        if ((it + 1) % CC_FEVERY == 0 || it + 1 == sh->iters)
            w->errors += ccq_sync_collective(sh->rt, d, ring ? 1 : 0) != CCQ_OK;
    }
    return NULL;
}

static void *cc_reader_main(void *p)
{
    cc_shared *sh = p;
    size_t cap = 4096 + 256, n;
    ccq_event *buf = calloc(cap, sizeof *buf);
    uint64_t dropped;

    buf[0].struct_size = sizeof *buf; /* each snapshot writes it back */
    pthread_barrier_wait(&sh->bar);
    while (!atomic_load(&sh->stop) || atomic_load(&sh->dumps) == 0) {
        ccq_metrics m;
        ccq_stats st;
        uint64_t depth;
        memset(&m, 0, sizeof m);
        m.struct_size = sizeof m;
        st.struct_size = sizeof st;
        if (ccq_trace_snapshot(sh->rt, buf, cap, &n, &dropped) != CCQ_OK || n > cap)
            sh->reader_errors++;
        for (size_t k = 1; k < n; k++)
            sh->reader_errors +=
                buf[k].time_ns < buf[k - 1].time_ns || buf[k].type >= CCQ_EV_TYPE_COUNT_;
        atomic_fetch_add(&sh->snapshots, 1);
        if (ccq_get_metrics(sh->rt, &m) != CCQ_OK || ccq_get_stats(sh->rt, &st) != CCQ_OK)
            sh->reader_errors++;
        /* The rate is over a window of at least a second, so it cannot exceed what has ended
         * by now (read after it); a torn (t0, n0) read once gave ~1e19. */
        if (!(m.commands_per_s >= 0 &&
              m.commands_per_s <= (double)(st.completed + st.failed + st.cancelled) + 1))
            sh->reader_errors++;
        for (ccq_device_id d = 0; d < NDEV; d++)
            for (ccq_stream_id s = 0; s < 2; s++)
                sh->reader_errors += ccq_stream_queue_depth(sh->rt, d, s, &depth) != CCQ_OK;
        if (atomic_load(&sh->snapshots) % 4 == 1) {
            sh->reader_errors += ccq_trace_dump(sh->rt, sh->path) != CCQ_OK;
            atomic_fetch_add(&sh->dumps, 1);
        }
    }
    free(buf);
    return NULL;
}

static void *cc_toggler_main(void *p)
{
    cc_shared *sh = p;
    pthread_barrier_wait(&sh->bar);
    while (!atomic_load(&sh->stop)) {
        /* Each set keeps a small record until destroy: toggle at a bounded rate. */
        struct timespec ts = {0, 200000};
        sh->toggler_errors += ccq_set_event_callback(sh->rt, count_cb, sh) != CCQ_OK;
        nanosleep(&ts, NULL);
        sh->toggler_errors += ccq_set_event_callback(sh->rt, NULL, NULL) != CCQ_OK;
        nanosleep(&ts, NULL);
        atomic_fetch_add(&sh->toggles, 1);
    }
    return NULL;
}

static void test_concurrency(void **state)
{
    (void)state;
    cc_shared *sh = calloc(1, sizeof *sh);
    cc_worker w[CC_WORKERS];
    pthread_t th[CC_WORKERS], reader, toggler;
    ccq_stats st;
    uint64_t want_cmds;
    char *text;

    assert_non_null(sh);
    sh->rt = make_rt(4096, LONG_TIMEOUT, NULL, NULL);
    sh->iters = env_iters(2000);
    temp_path(sh->path, sizeof sh->path, "concurrent");
    comm_init(sh->rt, all4, NDEV);
    pthread_barrier_init(&sh->bar, NULL, CC_WORKERS + 2);
    for (int k = 0; k < CC_WORKERS; k++) {
        w[k] = (cc_worker){sh, k, 0};
        pthread_create(&th[k], NULL, cc_worker_main, &w[k]);
    }
    pthread_create(&reader, NULL, cc_reader_main, sh);
    pthread_create(&toggler, NULL, cc_toggler_main, sh);
    for (int k = 0; k < CC_WORKERS; k++) {
        pthread_join(th[k], NULL);
        if (w[k].errors)
            fail_msg("worker %d: %d errors", k, w[k].errors);
    }
    atomic_store(&sh->stop, 1);
    pthread_join(reader, NULL);
    pthread_join(toggler, NULL);
    assert_int_equal(sh->reader_errors, 0);
    assert_int_equal(sh->toggler_errors, 0);
    assert_true(atomic_load(&sh->snapshots) > 0 && atomic_load(&sh->dumps) > 0);

    want_cmds = (uint64_t)NDEV * sh->iters + 2ull * NDEV * sh->iters;
    st = stats_of(sh->rt);
    assert_int_equal(st.submitted, want_cmds);
    assert_int_equal(st.completed, want_cmds);
    assert_int_equal(st.failed + st.cancelled + st.pending, 0);
    /* The callback saw at most every event, never more. */
    assert_true(atomic_load(&sh->delivered[CCQ_EV_SUBMITTED]) <= want_cmds);
    assert_true(atomic_load(&sh->delivered[CCQ_EV_COMPLETED]) <= want_cmds);
    assert_true(atomic_load(&sh->delivered[CCQ_EV_FAILED]) == 0);
    if (verbose())
        printf("    %llu snapshots, %llu dumps, %llu toggles, %llu events delivered as submitted\n",
               (unsigned long long)atomic_load(&sh->snapshots),
               (unsigned long long)atomic_load(&sh->dumps),
               (unsigned long long)atomic_load(&sh->toggles),
               (unsigned long long)atomic_load(&sh->delivered[CCQ_EV_SUBMITTED]));
    text = read_trace(sh->path);
    free(text);
    remove(sh->path);
    assert_int_equal(ccq_runtime_destroy(sh->rt), CCQ_OK);
    pthread_barrier_destroy(&sh->bar);
    free(sh);
}

/* Every event the library hands out says its size (callbacks with the recorder on and off,
 * scheduler and fence events, snapshot elements); a snapshot refuses an element size that is
 * no ccq_event layout, before it writes anything; and an older, smaller layout's array is
 * strided by its size. */
static void test_event_struct_size(void **state)
{
    (void)state;
    static const uint32_t bad[] = {0, 1, 8, 80, 84, 87, 89, 96, 1u << 20, UINT32_MAX};
    unsigned char guard[sizeof(ccq_event)];

    memset(guard, 0xab, sizeof guard);
    for (int on = 0; on < 2; on++) {
        ccq_runtime *rt = make_rt(on ? 65536 : 0, LONG_TIMEOUT, NULL, NULL);
        fence_log fl = {.n = 0, .tid = my_tid()};
        ccq_event buf[4];
        size_t n = 0;
        evlog log;

        evlog_init(&log);
        ok(ccq_set_event_callback(rt, evlog_cb, &log), "set callback");
        workload(rt, &fl);
        if (on) { /* also the elements of a snapshot */
            ccq_event *ev = snap(rt, &n, NULL);
            assert_true(n > 0);
            for (size_t k = 0; k < n; k++)
                if (ev[k].struct_size != sizeof(ccq_event))
                    fail_msg("snapshot event %zu (%s): struct_size %u", k,
                             ccq_event_type_name(ev[k].type), ev[k].struct_size);
            free(ev);
        }
        ok(ccq_runtime_shutdown(rt), "shutdown");
        assert_true(log.n > 0);
        for (size_t k = 0; k < log.n; k++)
            if (log.ev[k].struct_size != sizeof(ccq_event))
                fail_msg("recorder %s: callback event %zu (%s): struct_size %u", on ? "on" : "off",
                         k, ccq_event_type_name(log.ev[k].type), log.ev[k].struct_size);
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            memset(buf, 0xab, sizeof buf);
            buf[0].struct_size = bad[b];
            n = 99;
            assert_int_equal(ccq_trace_snapshot(rt, buf, 4, &n, NULL), CCQ_ERR_INVALID_ARGUMENT);
            assert_non_null(strstr(ccq_last_error_detail(), "out[0].struct_size"));
            assert_int_equal(n, 99);
            assert_memory_equal((unsigned char *)&buf[0] + sizeof(uint32_t),
                                guard + sizeof(uint32_t), sizeof buf[0] - sizeof(uint32_t));
            assert_memory_equal(&buf[1], guard, sizeof buf[1]);
        }
        /* cap 0 reads no element. */
        buf[0].struct_size = 0;
        ok(ccq_trace_snapshot(rt, buf, 0, &n, NULL), "snapshot of 0 events");
        assert_int_equal(n, 0);
        evlog_free(&log);
        assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
    }
    assert_true(sizeof(ccq_event) >= CCQ_EVENT_SIZE_0_2);

    /* The stride copy, with a pretend older layout of 64 bytes: each element gets its first
     * 64 bytes and struct_size 64, and nothing past the last element is written. */
    {
        enum { N = 3, ES = 64 };
        ccq_event src[N];
        unsigned char out[N * ES + 16];
        memset(src, 0, sizeof src);
        for (int k = 0; k < N; k++) {
            src[k].struct_size = sizeof(ccq_event);
            src[k].type = CCQ_EV_COMPLETED;
            src[k].time_ns = 1000 + (uint64_t)k;
            src[k].id = 7 + (uint64_t)k;
            src[k].bytes = 4096u * (uint64_t)(k + 1);
        }
        memset(out, 0xcd, sizeof out);
        ccq_events_copy_out(out, ES, src, N);
        for (int k = 0; k < N; k++) {
            ccq_event e;
            memcpy(&e, out + k * ES, ES);
            assert_int_equal(e.struct_size, ES);
            assert_int_equal(e.type, CCQ_EV_COMPLETED);
            assert_int_equal(e.time_ns, 1000 + (uint64_t)k);
            assert_int_equal(e.id, 7 + (uint64_t)k);
            assert_int_equal(e.bytes, 4096u * (uint64_t)(k + 1));
        }
        for (size_t k = N * ES; k < sizeof out; k++)
            assert_int_equal(out[k], 0xcd);
    }
}

/* A 0.1.0 callback's events, in 0.1.0's layout. */
typedef struct v01_log {
    pthread_mutex_t mu;
    ccq_event_v0_1 ev[4096];
    size_t n;
} v01_log;

static void v01_cb(const ccq_event_v0_1 *ev, void *user)
{
    v01_log *l = user;
    pthread_mutex_lock(&l->mu);
    if (l->n < sizeof l->ev / sizeof l->ev[0])
        l->ev[l->n++] = *ev;
    pthread_mutex_unlock(&l->mu);
}

static void same_v01(const char *what, size_t k, const ccq_event_v0_1 *o, const ccq_event *e)
{
    if (o->time_ns != e->time_ns || o->id != e->id || o->batch != e->batch || o->seq != e->seq ||
        o->count != e->count || o->bytes != e->bytes || o->type != e->type ||
        o->thread != e->thread || o->device != e->device || o->stream != e->stream ||
        o->comm != e->comm || o->kind != e->kind || o->dtype != e->dtype || o->op != e->op ||
        o->peer_valid != e->peer_valid || o->status != e->status || o->peer != e->peer)
        fail_msg("%s %zu: the 0.1.0 event (%s, id %llu, %llu ns) differs from the event (%s, id "
                 "%llu, %llu ns)",
                 what, k, ccq_event_type_name(o->type), (unsigned long long)o->id,
                 (unsigned long long)o->time_ns, ccq_event_type_name(e->type),
                 (unsigned long long)e->id, (unsigned long long)e->time_ns);
}

/* 0.1.0's entry points (ready to be ccq_trace_snapshot@CCQ_0.1 and
 * ccq_set_event_callback@CCQ_0.1): the same events as the current ones, field by field, in
 * 0.1.0's 80-byte layout, and nothing written past the caller's array. */
static void test_v0_1_compat(void **state)
{
    (void)state;
    ccq_runtime *rt = make_rt(65536, LONG_TIMEOUT, NULL, NULL);
    fence_log fl = {.n = 0, .tid = my_tid()};
    static v01_log old;
    ccq_event_v0_1 *ov;
    ccq_event *ev;
    evlog log;
    size_t n, on = 0;

    assert_int_equal(sizeof(ccq_event_v0_1), 80);
    memset(&old, 0, sizeof old);
    pthread_mutex_init(&old.mu, NULL);
    evlog_init(&log);
    ok(ccq_set_event_callback_v0_1(rt, v01_cb, &old), "0.1.0 callback");
    workload(rt, &fl);
    ok(ccq_set_event_callback(rt, evlog_cb, &log), "callback");
    workload(rt, &fl);
    ok(ccq_set_event_callback_v0_1(rt, NULL, NULL), "clear");
    assert_int_equal(ccq_set_event_callback_v0_1(NULL, v01_cb, &old), CCQ_ERR_INVALID_ARGUMENT);
    ok(ccq_runtime_shutdown(rt), "shutdown");

    /* The first workload went to the 0.1.0 callback, the second to the current one: as many
     * events of each type in both (batches depend on timing), and in 0.1.0's layout the
     * fields are where 0.1.0 had them (command events name a stream of a device). */
    assert_true(old.n > 0 && old.n < sizeof old.ev / sizeof old.ev[0]);
    {
        uint64_t co[CCQ_EV_TYPE_COUNT_] = {0}, cn[CCQ_EV_TYPE_COUNT_] = {0};
        for (size_t k = 0; k < old.n; k++) {
            assert_true(old.ev[k].type < CCQ_EV_TYPE_COUNT_);
            co[old.ev[k].type]++;
            if (is_cmd(old.ev[k].type))
                assert_true(old.ev[k].device < NDEV && old.ev[k].stream < 6 &&
                            old.ev[k].count == COUNT && old.ev[k].time_ns != 0);
        }
        count_types(log.ev, log.n, cn);
        for (uint32_t t = 0; t < CCQ_EV_TYPE_COUNT_; t++)
            if (t != CCQ_EV_BATCH && t != CCQ_EV_BATCH_DONE && co[t] != cn[t])
                fail_msg("%s: %llu events through the 0.1.0 callback, %llu through the current",
                         ccq_event_type_name(t), (unsigned long long)co[t],
                         (unsigned long long)cn[t]);
    }

    ev = snap(rt, &n, NULL);
    ov = malloc((n + 1) * sizeof *ov);
    assert_non_null(ov);
    memset(&ov[n], 0xab, sizeof ov[n]);
    ok(ccq_trace_snapshot_v0_1(rt, ov, n, &on, NULL), "0.1.0 snapshot");
    assert_int_equal(on, n);
    for (size_t k = 0; k < n; k++)
        same_v01("snapshot event", k, &ov[k], &ev[k]);
    for (size_t b = 0; b < sizeof ov[n]; b++)
        assert_int_equal(((unsigned char *)&ov[n])[b], 0xab);
    ok(ccq_trace_snapshot_v0_1(rt, NULL, 0, &on, NULL), "0.1.0 snapshot of 0 events");
    assert_int_equal(on, 0);
    assert_int_equal(ccq_trace_snapshot_v0_1(rt, NULL, 4, &on, NULL), CCQ_ERR_INVALID_ARGUMENT);
    /* The converter on its own: every field. */
    {
        ccq_event e = {.struct_size = sizeof e,
                       .type = CCQ_EV_FAILED,
                       .time_ns = 11,
                       .id = 12,
                       .batch = 13,
                       .seq = 14,
                       .count = 15,
                       .bytes = 16,
                       .thread = 17,
                       .device = 18,
                       .stream = 19,
                       .comm = 20,
                       .kind = 21,
                       .dtype = 22,
                       .op = 23,
                       .peer_valid = 1,
                       .status = CCQ_ERR_TIMEOUT,
                       .peer = 24};
        ccq_event_v0_1 o;
        ccq_event_to_v0_1(&o, &e);
        same_v01("converted event", 0, &o, &e);
    }
    free(ov);
    free(ev);
    evlog_free(&log);
    pthread_mutex_destroy(&old.mu);
    assert_int_equal(ccq_runtime_destroy(rt), CCQ_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_workload),    cmocka_unit_test(test_overflow),
        cmocka_unit_test(test_overflow_fences),   cmocka_unit_test(test_overflow_dump),
        cmocka_unit_test(test_disabled),          cmocka_unit_test(test_callback),
        cmocka_unit_test(test_failures),          cmocka_unit_test(test_abort_event),
        cmocka_unit_test(test_trace_file),        cmocka_unit_test(test_trace_file_fence_timeout),
        cmocka_unit_test(test_metrics),           cmocka_unit_test(test_metrics_recorder_off),
        cmocka_unit_test(test_metrics_rate),      cmocka_unit_test(test_concurrency),
        cmocka_unit_test(test_event_struct_size), cmocka_unit_test(test_v0_1_compat),
    };
    return cmocka_run_group_tests_name("trace", tests, NULL, NULL);
}
