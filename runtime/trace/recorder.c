/* The flight recorder (event rings, snapshots, callback, automatic dumps) and the live
 * metrics. Recording costs the submit path nothing but a cached thread id: submission
 * events are written by the scheduler when it drains a command, from what the command
 * already carries (its submit time and thread). */
#define _GNU_SOURCE
#include "runtime/trace/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "runtime/internal.h"

uint32_t ccq_thread_id(void)
{
    static _Thread_local uint32_t tid;
    if (tid == 0)
        tid = (uint32_t)syscall(SYS_gettid);
    return tid;
}

/* ---- histograms ---- */

static unsigned hist_bucket(uint64_t v)
{
    if (v < 4)
        return (unsigned)v;
    unsigned b = 63u - (unsigned)__builtin_clzll(v);
    return b * 4 + (unsigned)((v >> (b - 2)) & 3);
}

static double hist_lower(unsigned i)
{
    if (i < 4)
        return i;
    unsigned b = i / 4, sub = i % 4;
    return (double)(1ull << b) * (1.0 + sub / 4.0);
}

void ccq_hist_add(ccq_hist *h, uint64_t ns)
{
    _Atomic uint64_t *c = &h->b[hist_bucket(ns)];
    /* One writer: a relaxed load + store is enough (readers only need no tearing). */
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

double ccq_hist_percentile_us(const ccq_hist *h, double p)
{
    uint64_t counts[CCQ_HIST_BUCKETS], total = 0, want, acc = 0;
    for (unsigned i = 0; i < CCQ_HIST_BUCKETS; i++) {
        counts[i] = atomic_load_explicit(&h->b[i], memory_order_relaxed);
        total += counts[i];
    }
    if (total == 0)
        return 0;
    want = (uint64_t)(p / 100.0 * (double)total + 0.5);
    if (want == 0)
        want = 1;
    for (unsigned i = 0; i < CCQ_HIST_BUCKETS; i++) {
        acc += counts[i];
        if (acc >= want) /* the bucket's midpoint */
            return (hist_lower(i) + hist_lower(i + 1 < CCQ_HIST_BUCKETS ? i + 1 : i)) / 2 / 1e3;
    }
    return hist_lower(CCQ_HIST_BUCKETS - 1) / 1e3;
}

/* ---- rings ---- */

int ccq_trace_init(ccq_trace *t, uint32_t capacity, const char *file)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->fence_lock, NULL);
    pthread_mutex_init(&t->req_lock, NULL);
    pthread_mutex_init(&t->cb_lock, NULL);
    pthread_mutex_init(&t->note_lock, NULL);
    ccq_signal_init(&t->req_sig);
    ccq_signal_init(&t->dump_sig);
    atomic_init(&t->dump_asked, 0);
    atomic_init(&t->dump_done, 0);
    atomic_init(&t->req_state, 0);
    atomic_init(&t->head_pub, 0);
    atomic_init(&t->cb, NULL);
    atomic_init(&t->rate_bits, 0);
    for (unsigned i = 0; i < CCQ_HIST_BUCKETS; i++) {
        atomic_init(&t->queue_ns.b[i], 0);
        atomic_init(&t->run_ns.b[i], 0);
    }
    t->start_ns = ccq_now_ns();
    atomic_init(&t->rate_t0, t->start_ns);
    atomic_init(&t->rate_n0, 0);
    if (file != NULL && *file != '\0' && (t->file = strdup(file)) == NULL)
        return -1;
    if (capacity == 0)
        return 0;
    t->cap = 1;
    while (t->cap < capacity)
        t->cap <<= 1;
    /* Fences are fewer than commands: a quarter of the space, at least 256. */
    t->fcap = t->cap / 4 > 256 ? t->cap / 4 : 256;
    t->ring = calloc(t->cap, sizeof *t->ring);
    t->fring = calloc(t->fcap, sizeof *t->fring);
    return t->ring != NULL && t->fring != NULL ? 0 : -1;
}

void ccq_trace_fini(ccq_trace *t)
{
    ccq_trace_detach(t); /* no SIGUSR1 dump of it from now on (waits for one in progress) */
    ccq_trace_cb *cb = atomic_load_explicit(&t->cb, memory_order_relaxed);
    while (cb != NULL) {
        ccq_trace_cb *prev = cb->prev;
        free(cb);
        cb = prev;
    }
    free(t->ring);
    free(t->fring);
    free(t->file);
    pthread_mutex_destroy(&t->fence_lock);
    pthread_mutex_destroy(&t->req_lock);
    pthread_mutex_destroy(&t->cb_lock);
    pthread_mutex_destroy(&t->note_lock);
}

void ccq_trace_note(ccq_trace *t, uint32_t type, const char *text)
{
    if (t->cap == 0)
        return;
    pthread_mutex_lock(&t->note_lock);
    ccq_note *n = &t->notes[t->nhead++ % CCQ_TRACE_NOTES];
    n->time_ns = ccq_now_ns();
    n->type = type;
    if ((size_t)snprintf(n->text, sizeof n->text, "%s", text) >= sizeof n->text)
        ccq_mark_truncated(n->text, sizeof n->text); /* a long desync report: show the cut */
    pthread_mutex_unlock(&t->note_lock);
}

_Thread_local uint32_t ccq_tls_inside;

ccq_status ccq_refuse_inside(const char *fn)
{
    if (ccq_tls_inside == 0)
        return CCQ_OK;
    return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                    "%s: called from inside a ccq event callback%s; the callback contract forbids "
                    "it there (it waits for ccq's scheduler or fences, which would hang): call "
                    "it from another thread",
                    fn,
                    (ccq_tls_inside & CCQ_INSIDE_CALLBACK) ? "" : " (on ccq's scheduler thread)");
}

static void deliver(ccq_trace *t, const ccq_event *ev)
{
    ccq_trace_cb *cb = atomic_load_explicit(&t->cb, memory_order_acquire);
    if (cb == NULL)
        return;
    uint32_t saved = ccq_tls_inside;
    ccq_tls_inside = saved | CCQ_INSIDE_CALLBACK;
    if (cb->fn != NULL) {
        cb->fn(ev, cb->user);
    } else if (cb->fn_v0_1 != NULL) {
        ccq_event_v0_1 old;
        ccq_event_to_v0_1(&old, ev);
        cb->fn_v0_1(&old, cb->user);
    }
    ccq_tls_inside = saved;
}

void ccq_trace_fence_writes(void)
{
    /* Ring writes are plain stores; the scheduler's exit publishes them (release). */
}

void ccq_trace_rec(ccq_trace *t, const ccq_event *ev)
{
    ccq_event tmp, *slot = ccq_trace_slot(t, &tmp);
    *slot = *ev;
    ccq_trace_commit(t, slot);
}

void ccq_trace_commit(ccq_trace *t, ccq_event *ev)
{
    ev->struct_size = sizeof *ev;
    if (t->cap != 0) {
        t->head++;
        atomic_store_explicit(&t->head_pub, t->head, memory_order_relaxed);
    }
    deliver(t, ev);
}

void ccq_trace_rec_fence(ccq_trace *t, const ccq_event *ev)
{
    ccq_event e = *ev;
    e.struct_size = sizeof e;
    if (t->cap != 0) {
        pthread_mutex_lock(&t->fence_lock);
        t->fring[t->fhead & (t->fcap - 1)] = e;
        t->fhead++;
        pthread_mutex_unlock(&t->fence_lock);
    }
    deliver(t, &e);
}

/* The newest min(cap, kept) events of the scheduler's ring, oldest first. Only the
 * scheduler, or anyone once it has exited, may call this. */
static size_t copy_sched_ring(const ccq_trace *t, ccq_event *out, size_t cap)
{
    uint64_t kept = t->head < t->cap ? t->head : t->cap, n = kept < cap ? kept : cap;
    for (uint64_t k = 0; k < n; k++)
        out[k] = t->ring[(t->head - n + k) & (t->cap - 1)];
    return (size_t)n;
}

bool ccq_trace_serve(ccq_trace *t)
{
    if (!ccq_trace_requested(t))
        return false;
    t->req_n = t->cap ? copy_sched_ring(t, t->req_buf, t->req_cap) : 0;
    atomic_store_explicit(&t->req_state, 2, memory_order_release);
    ccq_signal_notify(&t->req_sig);
    return true;
}

static int ev_order(const void *pa, const void *pb)
{
    const ccq_event *a = pa, *b = pb;
    if (a->time_ns != b->time_ns)
        return a->time_ns < b->time_ns ? -1 : 1;
    if (a->type != b->type) /* at equal times: submitted before issued before completed */
        return a->type < b->type ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Append the fence ring (under its lock), sort everything by time. */
static size_t finish_copy(ccq_trace *t, ccq_event *out, size_t n, size_t cap, uint64_t *dropped)
{
    pthread_mutex_lock(&t->fence_lock);
    uint64_t fkept = t->fhead < t->fcap ? t->fhead : t->fcap;
    uint64_t room = cap - n, fn = fkept < room ? fkept : room;
    for (uint64_t k = 0; k < fn; k++)
        out[n + k] = t->fring[(t->fhead - fn + k) & (t->fcap - 1)];
    if (dropped != NULL)
        *dropped = (t->fhead > t->fcap ? t->fhead - t->fcap : 0) +
                   (atomic_load_explicit(&t->head_pub, memory_order_relaxed) > t->cap
                        ? atomic_load_explicit(&t->head_pub, memory_order_relaxed) - t->cap
                        : 0);
    pthread_mutex_unlock(&t->fence_lock);
    n += (size_t)fn;
    if (n > 1) /* qsort's array must not be NULL, even for 0 elements */
        qsort(out, n, sizeof *out, ev_order);
    return n;
}

size_t ccq_trace_copy(ccq_trace *t, ccq_event *out, size_t cap, uint64_t *dropped)
{
    size_t n = t->cap ? copy_sched_ring(t, out, cap) : 0;
    return finish_copy(t, out, n, cap, dropped);
}

uint64_t ccq_trace_next_tick(ccq_trace *t, uint64_t ended)
{
    uint64_t bits = atomic_load_explicit(&t->rate_bits, memory_order_relaxed);
    /* A tick is due while the last window had completions, or until the published rate is
     * 0 again: an idle runtime reports 0 within two seconds, then sleeps without ticking. */
    if (ended == atomic_load_explicit(&t->rate_n0, memory_order_relaxed) && bits == 0)
        return UINT64_MAX;
    return atomic_load_explicit(&t->rate_t0, memory_order_relaxed) + 1000000000ull;
}

void ccq_trace_tick(ccq_trace *t, uint64_t now, uint64_t ended)
{
    uint64_t t0 = atomic_load_explicit(&t->rate_t0, memory_order_relaxed);
    if (now - t0 < 1000000000ull)
        return;
    double rate = (double)(ended - atomic_load_explicit(&t->rate_n0, memory_order_relaxed)) * 1e9 /
                  (double)(now - t0);
    uint64_t bits;
    memcpy(&bits, &rate, sizeof bits);
    atomic_store_explicit(&t->rate_bits, bits, memory_order_relaxed);
    atomic_store_explicit(&t->rate_n0, ended, memory_order_relaxed);
    atomic_store_explicit(&t->rate_t0, now, memory_order_release);
}

/* ---- public API ---- */

static const char *const ev_names[CCQ_EV_TYPE_COUNT_] = {
    "submitted",   "matched",   "issued",   "completed", "failed",       "batch", "batch_done",
    "fence_begin", "fence_end", "watchdog", "abort",     "process_lost", "fused",
};

CCQ_API const char *ccq_event_type_name(uint32_t type)
{
    return type < CCQ_EV_TYPE_COUNT_ ? ev_names[type] : "?";
}

ccq_status ccq_trace_set_callback(ccq_trace *t, ccq_event_fn fn, ccq_event_fn_v0_1 fn_v0_1,
                                  void *user)
{
    ccq_trace_cb *cb;

    pthread_mutex_lock(&t->cb_lock);
    /* Callbacks are never freed while the runtime lives: the scheduler may be inside the
     * previous one. They are kept on a list and freed at destroy. */
    cb = malloc(sizeof *cb);
    if (cb == NULL) {
        pthread_mutex_unlock(&t->cb_lock);
        return ccq_fail(CCQ_ERR_NO_MEMORY, "ccq_set_event_callback: out of memory");
    }
    cb->fn = fn;
    cb->fn_v0_1 = fn_v0_1;
    cb->user = user;
    cb->prev = atomic_load_explicit(&t->cb, memory_order_relaxed);
    atomic_store_explicit(&t->cb, cb, memory_order_release);
    pthread_mutex_unlock(&t->cb_lock);
    return CCQ_OK;
}

CCQ_API ccq_status ccq_set_event_callback(ccq_runtime *rt, ccq_event_fn fn, void *user)
{
    ccq_clear_detail();
    if (rt == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_set_event_callback: rt is NULL");
    return ccq_trace_set_callback(&rt->trace, fn, NULL, user);
}

static bool snapshot_answered(void *arg)
{
    ccq_runtime *rt = arg;
    return atomic_load_explicit(&rt->trace.req_state, memory_order_acquire) == 2 ||
           atomic_load_explicit(&rt->sched_exited, memory_order_acquire);
}

/* Copy the recorder from any thread: ask the scheduler while it runs, else read directly. */
static size_t snapshot(ccq_runtime *rt, ccq_event *out, size_t cap, uint64_t *dropped)
{
    ccq_trace *t = &rt->trace;
    size_t n;

    if (ccq_in_scheduler(rt))
        return ccq_trace_copy(t, out, cap, dropped);
    pthread_mutex_lock(&t->req_lock);
    if (atomic_load_explicit(&rt->sched_exited, memory_order_acquire)) {
        n = ccq_trace_copy(t, out, cap, dropped);
    } else {
        t->req_buf = out;
        t->req_cap = cap;
        atomic_store_explicit(&t->req_state, 1, memory_order_seq_cst);
        ccq_wake_signal_fenced(&rt->wake);
        ccq_signal_wait(&t->req_sig, snapshot_answered, rt, UINT64_MAX);
        if (atomic_load_explicit(&t->req_state, memory_order_acquire) == 2)
            n = finish_copy(t, out, t->req_n, cap, dropped);
        else /* the scheduler exited before answering: nothing writes the ring now */
            n = ccq_trace_copy(t, out, cap, dropped);
        atomic_store_explicit(&t->req_state, 0, memory_order_relaxed);
    }
    pthread_mutex_unlock(&t->req_lock);
    return n;
}

/* 0.2.0's layout is ABI: a field may only be appended after `peer`. */
_Static_assert(sizeof(ccq_event) >= CCQ_EVENT_SIZE_0_2 &&
                   offsetof(ccq_event, peer) + sizeof(uint32_t) <= CCQ_EVENT_SIZE_0_2 &&
                   offsetof(ccq_event, time_ns) == 8 && offsetof(ccq_event, peer) == 80,
               "ccq_event: fields may only be appended");

void ccq_events_copy_out(void *out, size_t elem_size, const ccq_event *ev, size_t n)
{
    uint32_t size = (uint32_t)elem_size;
    for (size_t k = 0; k < n; k++) {
        unsigned char *el = (unsigned char *)out + k * elem_size;
        memcpy(el, &ev[k], elem_size);
        memcpy(el + offsetof(ccq_event, struct_size), &size, sizeof size);
    }
}

CCQ_API ccq_status ccq_trace_snapshot(ccq_runtime *rt, ccq_event *out, size_t cap, size_t *n,
                                      uint64_t *dropped)
{
    uint32_t elem_size = sizeof(ccq_event);
    ccq_event *tmp;

    ccq_clear_detail();
    if (rt == NULL || n == NULL || (out == NULL && cap > 0))
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_trace_snapshot: %s is NULL",
                        rt == NULL  ? "rt"
                        : n == NULL ? "n"
                                    : "out");
    /* The caller's element size is in out[0] (read before anything is written). A program
     * built against an older ccq.h has a smaller ccq_event: its array is strided by that. */
    if (cap > 0) {
        elem_size = out[0].struct_size;
        if (elem_size != CCQ_EVENT_SIZE_0_2 && elem_size != sizeof(ccq_event))
            return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                            "ccq_trace_snapshot: out[0].struct_size is %" PRIu32
                            "; set it to sizeof(ccq_event) (%zu in this library; %u in 0.2.0)",
                            elem_size, sizeof(ccq_event), CCQ_EVENT_SIZE_0_2);
    }
    if (elem_size == sizeof(ccq_event)) {
        *n = snapshot(rt, out, cap, dropped);
        return CCQ_OK;
    }
    tmp = malloc(cap * sizeof *tmp);
    if (tmp == NULL)
        return ccq_fail(CCQ_ERR_NO_MEMORY, "ccq_trace_snapshot: out of memory (%zu events)", cap);
    *n = snapshot(rt, tmp, cap, dropped);
    ccq_events_copy_out(out, elem_size, tmp, *n);
    free(tmp);
    return CCQ_OK;
}

/* This process's place in the world, for dump headers and file names: world rank, world
 * size, and the global id of its first device. */
static void world_of(const ccq_runtime *rt, uint32_t *rank, uint32_t *size, uint32_t *first)
{
    *rank = rt->world.rank, *size = rt->world.size, *first = rt->dev_first;
}

/* CLOCK_REALTIME - CLOCK_MONOTONIC now: the monotonic read nearest to a realtime read, over
 * a few tries (the tightest pair wins), so dumps of several processes can be put on one
 * wall clock. Accurate to the clocks' own agreement between hosts (NTP: about a millisecond
 * across machines; exact within one). */
static int64_t realtime_offset_ns(void)
{
    int64_t best_gap = INT64_MAX, off = 0;
    for (int i = 0; i < 5; i++) {
        struct timespec m0, r, m1;
        clock_gettime(CLOCK_MONOTONIC, &m0);
        clock_gettime(CLOCK_REALTIME, &r);
        clock_gettime(CLOCK_MONOTONIC, &m1);
        int64_t a = (int64_t)m0.tv_sec * 1000000000 + m0.tv_nsec;
        int64_t b = (int64_t)m1.tv_sec * 1000000000 + m1.tv_nsec;
        if (b - a < best_gap) {
            best_gap = b - a;
            off = (int64_t)r.tv_sec * 1000000000 + r.tv_nsec - (a + (b - a) / 2);
        }
    }
    return off;
}

/* Copy what a dump shows out of the runtime: the events (through the scheduler), then the
 * communicators and notes under their locks. The writer then works on the copy alone.
 * `host` (64 bytes) holds the host name the header points to. */
static int take_view(ccq_runtime *rt, ccq_trace_view *v, char *host, const char *reason)
{
    ccq_trace *t = &rt->trace;
    size_t cap = (size_t)t->cap + t->fcap, nids = 0;

    memset(v, 0, sizeof *v);
    v->hdr.backend = rt->be_ops->name;
    v->hdr.ndev = rt->ndev;
    v->hdr.max_streams = rt->max_streams;
    world_of(rt, &v->hdr.world_rank, &v->hdr.world_size, &v->hdr.dev_first);
    v->hdr.crowded = rt->world.crowded;
    v->hdr.pid = (int64_t)getpid();
    if (gethostname(host, 64) != 0)
        host[0] = '\0';
    host[63] = '\0';
    v->hdr.host = host;
    v->hdr.reason = reason;
    v->ev = malloc((cap ? cap : 1) * sizeof *v->ev);
    v->notes = malloc(CCQ_TRACE_NOTES * sizeof *v->notes);
    if (v->ev == NULL || v->notes == NULL)
        return -1;
    v->nev = snapshot(rt, v->ev, cap, &v->hdr.dropped);
    v->hdr.t0_ns = v->nev ? v->ev[0].time_ns : 0;
    v->hdr.dump_ns = ccq_now_ns();
    v->hdr.realtime_offset_ns = realtime_offset_ns();

    pthread_mutex_lock(&rt->comm_lock); /* comms can be created meanwhile */
    v->ncomms = atomic_load_explicit(&rt->ncomms, memory_order_acquire);
    for (uint32_t k = 0; k < v->ncomms; k++)
        nids += rt->comms[k]->n;
    v->comms = calloc(v->ncomms ? v->ncomms : 1, sizeof *v->comms);
    /* The full device sets, in one array (the first comm's pointer owns it). */
    ccq_device_id *ids = malloc((nids ? nids : 1) * sizeof *ids);
    for (uint32_t k = 0; v->comms != NULL && ids != NULL && k < v->ncomms; k++) {
        const ccq_comm *c = rt->comms[k];
        ccq_describe_comm(v->comms[k].devices, sizeof v->comms[k].devices, c);
        memcpy(ids, c->devices, c->n * sizeof *ids);
        v->comms[k].ids = ids;
        v->comms[k].n = c->n;
        ids += c->n;
    }
    if (v->comms != NULL && v->ncomms == 0)
        v->comms[0].ids = ids; /* owned there all the same, freed with the view */
    else if (v->comms == NULL)
        free(ids);
    pthread_mutex_unlock(&rt->comm_lock);
    if (ids == NULL)
        return -1;

    pthread_mutex_lock(&t->note_lock); /* the newest CCQ_TRACE_NOTES, oldest first */
    uint64_t first = t->nhead > CCQ_TRACE_NOTES ? t->nhead - CCQ_TRACE_NOTES : 0;
    for (uint64_t k = first; k < t->nhead; k++)
        v->notes[v->nnotes++] = t->notes[k % CCQ_TRACE_NOTES];
    pthread_mutex_unlock(&t->note_lock);
    return v->comms != NULL ? 0 : -1;
}

static void free_view(ccq_trace_view *v)
{
    free(v->ev);
    free(v->notes);
    if (v->comms != NULL)
        free((void *)v->comms[0].ids);
    free(v->comms);
}

/* Write the recorder to `path` through a temporary file renamed over it, so a reader (and
 * ccq-trace) never sees half a dump, and two dumps at once (the scheduler's on an error, a
 * SIGUSR1 one) leave one whole file. */
static ccq_status write_file(ccq_runtime *rt, const char *path, const char *reason)
{
    ccq_trace_view v;
    ccq_status st = CCQ_OK;
    char host[64], tmp[4096];
    FILE *f;
    int rc;

    if (take_view(rt, &v, host, reason) != 0) {
        st = ccq_fail(CCQ_ERR_NO_MEMORY, "ccq_trace_dump: out of memory");
        goto out;
    }
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), ccq_thread_id()) >=
        sizeof tmp) {
        st = ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_trace_dump: path \"%.64s...\" too long", path);
        goto out;
    }
    f = fopen(tmp, "w");
    if (f == NULL) {
        st = ccq_fail(CCQ_ERR_BACKEND, "ccq_trace_dump: cannot open \"%s\": %s", tmp,
                      strerror(errno));
        goto out;
    }
    rc = ccq_trace_write_json(f, &v);
    if ((rc | fclose(f)) != 0) {
        st = ccq_fail(CCQ_ERR_BACKEND, "ccq_trace_dump: writing \"%s\" failed", tmp);
        unlink(tmp);
    } else if (rename(tmp, path) != 0) {
        st = ccq_fail(CCQ_ERR_BACKEND, "ccq_trace_dump: cannot rename \"%s\" to \"%s\": %s", tmp,
                      path, strerror(errno));
        unlink(tmp);
    }
out:
    free_view(&v);
    return st;
}

ccq_status ccq_trace_write_file(ccq_runtime *rt, const char *path)
{
    return write_file(rt, path, "api");
}

size_t ccq_trace_expand_path(char *out, size_t len, const char *tmpl, uint32_t rank, uint32_t size,
                             long pid)
{
    size_t w = 0;
    bool has_rank = false;
    char num[24];
#define PUT(ch) (w + 1 < len ? (void)(out[w] = (ch)) : (void)0, w++)
    for (const char *p = tmpl; *p != '\0'; p++) {
        if (p[0] != '%' || (p[1] != 'r' && p[1] != 'p' && p[1] != '%')) {
            PUT(*p);
            continue;
        }
        p++;
        if (*p == '%') {
            PUT('%');
            continue;
        }
        has_rank |= *p == 'r';
        snprintf(num, sizeof num, "%ld", *p == 'r' ? (long)rank : pid);
        for (const char *q = num; *q != '\0'; q++)
            PUT(*q);
    }
    if (!has_rank && size > 1) {
        /* Before the extension of the file name (".json"), if it has one. */
        size_t end = w < len ? w : len - 1, base = 0, dot = SIZE_MAX;
        for (size_t i = 0; i < end; i++)
            if (out[i] == '/')
                base = i + 1, dot = SIZE_MAX;
            else if (out[i] == '.' && i > base)
                dot = i;
        size_t at = dot != SIZE_MAX ? dot : end,
               n = (size_t)snprintf(num, sizeof num, ".rank%u", rank);
        if (end + n + 1 <= len) {
            memmove(out + at + n, out + at, end - at);
            memcpy(out + at, num, n);
        }
        w += n;
    }
#undef PUT
    if (len > 0)
        out[w < len ? w : len - 1] = '\0';
    return w;
}

/* trace_file with %r, %p (and the rank appended) replaced, for this process now. */
static ccq_status dump_path(ccq_runtime *rt, char *out, size_t len)
{
    uint32_t rank, size, first;
    world_of(rt, &rank, &size, &first);
    if (ccq_trace_expand_path(out, len, rt->trace.file, rank, size, (long)getpid()) >= len)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "trace_file \"%.64s...\" is too long",
                        rt->trace.file);
    return CCQ_OK;
}

void ccq_trace_dump_to_file(ccq_runtime *rt, const char *reason)
{
    char path[4096];
    if (dump_path(rt, path, sizeof path) != CCQ_OK || write_file(rt, path, reason) != CCQ_OK)
        fprintf(stderr, "ccq: %s\n", ccq_last_error_detail());
}

CCQ_API ccq_status ccq_trace_dump(ccq_runtime *rt, const char *path)
{
    ccq_clear_detail();
    if (rt == NULL || path == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_trace_dump: %s is NULL",
                        rt == NULL ? "rt" : "path");
    if (rt->trace.cap == 0)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_trace_dump: the flight recorder is disabled (trace_capacity = 0)");
    return ccq_trace_write_file(rt, path);
}

/* Scheduler side (or destroy): write trace_file if one is configured. Failures are reported
 * on stderr: there is no caller to return them to. */
void ccq_trace_autodump(ccq_runtime *rt, const char *reason)
{
    ccq_trace *t = &rt->trace;
    if (t->file == NULL || t->cap == 0)
        return;
    ccq_trace_dump_to_file(rt, reason);
}

bool ccq_trace_serve_dump(ccq_runtime *rt)
{
    ccq_trace *t = &rt->trace;
    uint64_t asked = atomic_load_explicit(&t->dump_asked, memory_order_acquire);
    if (asked == atomic_load_explicit(&t->dump_done, memory_order_relaxed))
        return false;
    ccq_trace_autodump(rt, "fence timeout");
    atomic_store_explicit(&t->dump_done, asked, memory_order_release);
    ccq_signal_notify(&t->dump_sig);
    return true;
}

typedef struct dump_wait {
    ccq_runtime *rt;
    uint64_t ticket;
} dump_wait;

static bool dump_written(void *arg)
{
    dump_wait *w = arg;
    return atomic_load_explicit(&w->rt->trace.dump_done, memory_order_acquire) >= w->ticket ||
           atomic_load_explicit(&w->rt->sched_exited, memory_order_acquire);
}

void ccq_trace_request_dump(ccq_runtime *rt, uint64_t deadline_ns)
{
    ccq_trace *t = &rt->trace;
    dump_wait w = {rt, 0};
    if (t->file == NULL || t->cap == 0)
        return;
    w.ticket = atomic_fetch_add_explicit(&t->dump_asked, 1, memory_order_seq_cst) + 1;
    ccq_wake_signal_fenced(&rt->wake);
    ccq_signal_wait(&t->dump_sig, dump_written, &w, deadline_ns);
}

CCQ_API ccq_status ccq_get_metrics(ccq_runtime *rt, ccq_metrics *out)
{
    ccq_metrics m;
    ccq_trace *t;
    uint32_t nstreams;
    uint64_t bits;

    ccq_clear_detail();
    if (rt == NULL || out == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_get_metrics: %s is NULL",
                        rt == NULL ? "rt" : "out");
    if (out->struct_size < offsetof(ccq_metrics, trace_events) || out->struct_size > sizeof *out)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_get_metrics: out->struct_size is %u; set it to sizeof(ccq_metrics)",
                        out->struct_size);
    t = &rt->trace;
    memset(&m, 0, sizeof m);
    m.struct_size = out->struct_size;
    m.uptime_ns = ccq_now_ns() - t->start_ns;
    m.commands_ended = atomic_load_explicit(&rt->stats.completed, memory_order_relaxed) +
                       atomic_load_explicit(&rt->stats.failed, memory_order_relaxed) +
                       atomic_load_explicit(&rt->stats.cancelled, memory_order_relaxed);
    bits = atomic_load_explicit(&t->rate_bits, memory_order_relaxed);
    memcpy(&m.commands_per_s, &bits, sizeof bits);
    {
        /* An idle scheduler sleeps and stops ticking: then the rate is over the time since
         * its last tick, which tends to 0 instead of repeating the last busy second. */
        uint64_t now = ccq_now_ns(), t0, n0;
        /* (t0, n0) from the same tick: ccq_trace_tick stores n0, then t0 (release). */
        do {
            t0 = atomic_load_explicit(&t->rate_t0, memory_order_acquire);
            n0 = atomic_load_explicit(&t->rate_n0, memory_order_acquire);
        } while (t0 != atomic_load_explicit(&t->rate_t0, memory_order_acquire));
        /* A tick after commands_ended or now were read is recent: keep its published rate. */
        if (now > t0 && now - t0 > 1500000000ull && m.commands_ended >= n0)
            m.commands_per_s = (double)(m.commands_ended - n0) * 1e9 / (double)(now - t0);
    }
    m.commands_per_s_total = m.uptime_ns ? (double)m.commands_ended * 1e9 / (double)m.uptime_ns : 0;
    m.queue_p50_us = ccq_hist_percentile_us(&t->queue_ns, 50);
    m.queue_p99_us = ccq_hist_percentile_us(&t->queue_ns, 99);
    m.run_p50_us = ccq_hist_percentile_us(&t->run_ns, 50);
    m.run_p99_us = ccq_hist_percentile_us(&t->run_ns, 99);
    for (int i = 0; i < 8; i++)
        m.batch_size_hist[i] = atomic_load_explicit(&rt->stats.hist[i], memory_order_relaxed);
    nstreams = rt->ndev * rt->max_streams;
    for (uint32_t i = 0; i < nstreams; i++) {
        ccq_stream *s = &rt->streams[i];
        uint64_t d = ccq_stream_outstanding(s);
        m.queued_now += d;
        if (d > m.deepest_depth) {
            m.deepest_depth = d;
            m.deepest_device = s->device;
            m.deepest_stream = s->id;
        }
    }
    {
        uint64_t sched = atomic_load_explicit(&t->head_pub, memory_order_relaxed), fences;
        pthread_mutex_lock(&t->fence_lock);
        fences = t->fhead;
        pthread_mutex_unlock(&t->fence_lock);
        m.trace_events = sched + fences;
        m.trace_dropped =
            (sched > t->cap ? sched - t->cap : 0) + (fences > t->fcap ? fences - t->fcap : 0);
    }
    memcpy(out, &m, out->struct_size);
    return CCQ_OK;
}

CCQ_API ccq_status ccq_stream_queue_depth(ccq_runtime *rt, ccq_device_id device,
                                          ccq_stream_id stream, uint64_t *depth)
{
    ccq_stream *s;
    ccq_clear_detail();
    if (rt == NULL || depth == NULL)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "ccq_stream_queue_depth: %s is NULL",
                        rt == NULL ? "rt" : "depth");
    if (!ccq_is_local(rt, device) || stream >= rt->max_streams)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_stream_queue_depth: no stream %u on device %u (%u devices, "
                        "max_streams = %u)",
                        stream, device, rt->ndev, rt->max_streams);
    s = ccq_stream_at(rt, device, stream);
    *depth = ccq_stream_outstanding(s);
    return CCQ_OK;
}
