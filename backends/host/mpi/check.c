/* The MPI engine's check of every operation across processes, always on: before any data of an
 * operation moves, its member processes compare what each submitted for that sequence number
 * (kind, count, dtype, op, root). Matching is local to each process, so without it a process
 * that passed another count made MPI abort the whole job (Open MPI reports libnbc's truncation
 * on MPI_COMM_WORLD, whose handler is fatal by default) or reduce garbage.
 *
 * A communicator over member processes: each process sends its records to every other member,
 * those of one batch together in one message (the host backend starts a batch's operations,
 * then tests them: the first test sends what the starts recorded), on the communicator itself
 * (point-to-point traffic, apart from its collectives). An operation waits until the record of
 * every member for its sequence number came; if all agree, its MPI collective is posted (in
 * sequence order); if not, it fails with CCQ_ERR_MISMATCH on every member, each having the same
 * records, and nothing is posted. A member whose next record is past the sequence number
 * skipped it (its own parts failed there: a mismatch among its devices, a timeout): the others
 * fail it too, at once. Pairs of devices in two processes check a header before the data
 * instead (pair.c). Cost: docs/multiprocess-host.md. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/host/mpi/impl.h"

/* Point-to-point tag of records on a communicator's own MPI communicator (its collectives
 * use another context). */
#define SIG_TAG 0x5167

static ccq_hmpi_comm *dirty; /* communicators with records to send (under the MPI lock) */

void hmpi_sig_of(const ccq_hmpi_comm *c, const ccq_be_op *op, hmpi_sig *s)
{
    const ccq_kind_info *k = &ccq_kinds[op->kind < CCQ_KIND_COUNT_ ? op->kind : 0];
    memset(s, 0, sizeof *s);
    s->seq = op->seq;
    s->count = op->count;
    s->kind = k->collective ? op->kind : CCQ_KIND_SEND;
    s->dtype = op->dtype;
    s->redop = k->reduces ? op->redop : 0;
    s->root = k->rooted ? op->root : 0;
    s->first_rank = c->first_rank;
    s->nranks = c->nlocal;
    s->comm[0] = c->blob[0];
    s->comm[1] = c->blob[1];
    s->magic = HMPI_SIG_MAGIC;
}

static bool field_differs(const hmpi_sig *a, const hmpi_sig *b, int f)
{
    switch (f) {
    case 0:
        return a->seq != b->seq;
    case 1:
        return a->kind != b->kind;
    case 2:
        return a->count != b->count;
    case 3:
        return a->dtype != b->dtype;
    case 4:
        return a->kind == b->kind && ccq_kinds[a->kind].reduces && a->redop != b->redop;
    default:
        return a->kind == b->kind && ccq_kinds[a->kind].rooted && a->root != b->root;
    }
}

static size_t field_text(char *buf, size_t len, const hmpi_sig *r, int f)
{
    static const char *const ops[] = {"sum", "prod", "max", "min", "avg"};
    switch (f) {
    case 0:
        return (size_t)snprintf(buf, len, "%" PRIu64, r->seq);
    case 1:
        return (size_t)snprintf(buf, len, "%s", hmpi_kind_name(r->kind));
    case 2:
        return (size_t)snprintf(buf, len, "%" PRIu64, r->count);
    case 3:
        return (size_t)snprintf(buf, len, "%s", hmpi_dtype_name(r->dtype));
    case 4:
        return (size_t)snprintf(buf, len, "%s", r->redop < 5 ? ops[r->redop] : "?");
    default:
        return (size_t)snprintf(buf, len, "rank %u", r->root);
    }
}

static size_t ranks_text(char *buf, size_t len, const hmpi_sig *r)
{
    if (r->nranks == 1)
        return (size_t)snprintf(buf, len, "rank %u", r->first_rank);
    return (size_t)snprintf(buf, len, "ranks %u-%u", r->first_rank, r->first_rank + r->nranks - 1);
}

/* Append to buf[len] at *w, never past its end. */
#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (*w < len)                                                                              \
            *w += (size_t)snprintf(buf + *w, len - *w, __VA_ARGS__);                               \
    } while (0)

static void put_one(char *buf, size_t len, size_t *w, const hmpi_sig *r, uint32_t proc, int f)
{
    PUT("process %u (", proc);
    if (*w < len)
        *w += ranks_text(buf + *w, len - *w, r);
    PUT(") ");
    if (*w < len)
        *w += field_text(buf + *w, len - *w, r, f);
}

bool hmpi_sig_differ(const hmpi_sig *rec, const uint32_t *procs, int n, char *why, size_t len)
{
    static const char *const fields[] = {"sequence", "kind", "count", "dtype", "op", "root"};
    char *buf = why;
    size_t w0 = 0, *w = &w0;
    bool bad = false;

    for (int f = 0; f < 6; f++) {
        bool first = true;
        for (int p = 1; p < n; p++) {
            if (!field_differs(&rec[0], &rec[p], f))
                continue;
            if (first) { /* "count: process 0 (rank 0) 1024, process 2 (rank 2) 2048, ..." */
                PUT("%s%s: ", bad ? "; " : "", fields[f]);
                put_one(buf, len, w, &rec[0], procs[0], f);
                first = false;
            }
            PUT(", ");
            put_one(buf, len, w, &rec[p], procs[p], f);
            bad = true;
        }
        if (bad && f <= 1) /* another sequence or kind: the rest means nothing */
            break;
    }
    if (*w >= len && len > 4)
        memcpy(why + len - 4, "...", 4);
    return bad;
}

static void *grow(void *p, uint32_t *cap, uint32_t need, size_t elem)
{
    uint32_t ncap = *cap ? *cap : 8;
    void *np;
    if (need <= *cap)
        return p;
    while (ncap < need)
        ncap *= 2;
    np = realloc(p, (size_t)ncap * elem);
    if (np != NULL)
        *cap = ncap;
    return np;
}

ccq_status hmpi_check_start(ccq_hmpi_op *h, const ccq_be_op *op)
{
    ccq_hmpi_comm *c = h->c;
    hmpi_sig *out = grow(c->out, &c->capout, c->nout + 1, sizeof *c->out);

    if (out == NULL)
        return CCQ_ERR_NO_MEMORY;
    c->out = out;
    hmpi_sig_of(c, op, &h->mine);
    c->out[c->nout++] = h->mine;
    if (!c->dirty) {
        c->dirty = true;
        c->dirty_next = dirty;
        dirty = c;
        c->refs++; /* until its records are sent */
    }
    hmpi_wq_push(c, HMPI_WQ_COLL, h);
    return CCQ_OK;
}

/* MPI is done with the sets' buffers once their sends complete. */
static void sets_progress(ccq_hmpi_comm *c)
{
    while (c->sets != NULL) {
        hmpi_sendset *s = c->sets;
        int flag = 0;
        if (MPI_Testall(s->n, s->reqs, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            flag = 1; /* a send that failed is gone too (the peer's check times out) */
        if (!flag)
            return;
        c->sets = s->next;
        if (c->sets == NULL)
            c->sets_tail = &c->sets;
        free(s->reqs);
        free(s->buf);
        free(s);
    }
}

static void flush_one(ccq_hmpi_comm *c)
{
    hmpi_sendset *s = calloc(1, sizeof *s);
    int bytes = (int)(c->nout * sizeof *c->out);

    if (s != NULL)
        s->reqs = malloc((size_t)c->nprocs * sizeof *s->reqs);
    if (s == NULL || s->reqs == NULL) {
        /* Out of memory: the records stay unsent and the members' checks time out. */
        if (s != NULL)
            free(s);
        c->nout = 0;
        return;
    }
    s->buf = c->out; /* the set owns the records now */
    s->first_seq = c->out[0].seq;
    c->out = NULL;
    c->nout = c->capout = 0;
    for (int p = 0; p < c->nprocs; p++) {
        if (p == c->me)
            continue;
        if (MPI_Isend(s->buf, bytes, MPI_BYTE, p, SIG_TAG, c->mc, &s->reqs[s->n]) == MPI_SUCCESS)
            s->n++;
    }
    *c->sets_tail = s;
    c->sets_tail = &s->next;
}

void hmpi_check_flush(void)
{
    while (dirty != NULL) {
        ccq_hmpi_comm *c = dirty;
        dirty = c->dirty_next;
        c->dirty = false;
        if (c->nout > 0)
            flush_one(c);
        sets_progress(c);
        hmpi_comm_unref(c); /* taken in hmpi_check_start */
    }
}

/* Take every record that arrived for c. */
static void drain(ccq_hmpi_comm *c)
{
    for (;;) {
        MPI_Message msg;
        MPI_Status status;
        int flag = 0, bytes = 0;
        hmpi_sigq *q;
        uint32_t n;

        if (MPI_Improbe(MPI_ANY_SOURCE, SIG_TAG, c->mc, &flag, &msg, &status) != MPI_SUCCESS ||
            !flag)
            return;
        MPI_Get_count(&status, MPI_BYTE, &bytes);
        n = bytes > 0 ? (uint32_t)bytes / sizeof(hmpi_sig) : 0;
        q = &c->in[status.MPI_SOURCE];
        if (q->head > 0 && q->head == q->n) /* all used: start over */
            q->head = q->n = 0;
        /* room for every byte (a malformed length never writes past it; its tail is unused) */
        hmpi_sig *v = grow(q->v, &q->cap, q->n + n + 1, sizeof *q->v);
        if (v == NULL) { /* out of memory: drop the message (the checks time out) */
            char sink[1];
            MPI_Mrecv(sink, 0, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
            continue;
        }
        q->v = v;
        MPI_Mrecv(q->v + q->n, bytes, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
        /* Keep only this communicator's: MPI reuses the context id of a freed communicator,
         * and a record sent to one a member had freed already (a runtime destroyed while a
         * peer still sent) is delivered to the next communicator that gets its id. */
        for (uint32_t k = 0, base = q->n; k < n; k++) {
            const hmpi_sig *r = &q->v[base + k];
            if (r->magic == HMPI_SIG_MAGIC && r->comm[0] == c->blob[0] && r->comm[1] == c->blob[1])
                q->v[q->n++] = *r;
        }
    }
}

/* The verdict on the first waiting operation: 1 decided (posted or failed), 0 not yet. */
static int decide(ccq_hmpi_comm *c, ccq_hmpi_op *h)
{
    hmpi_sig rec[64], *all = c->nprocs <= 64 ? rec : malloc((size_t)c->nprocs * sizeof *all);
    char why[CCQ_DETAIL_LEN];
    int skipped = -1, rc;

    if (all == NULL)
        return 0;
    for (int p = 0; p < c->nprocs; p++) {
        hmpi_sigq *q = &c->in[p];
        if (p == c->me) {
            all[p] = h->mine;
            continue;
        }
        /* Records for sequence numbers this process never ran (failed here before they
         * reached the engine) were decided by the others already. */
        while (q->head < q->n && q->v[q->head].seq < h->seq)
            q->head++;
        if (q->head == q->n) {
            if (all != rec)
                free(all);
            return 0;
        }
        all[p] = q->v[q->head];
        if (all[p].seq > h->seq && skipped < 0)
            skipped = p;
    }
    for (int p = 0; p < c->nprocs; p++) /* this sequence number's records are used */
        if (p != c->me && c->in[p].v[c->in[p].head].seq == h->seq)
            c->in[p].head++;
    if (skipped >= 0) {
        snprintf(why, sizeof why,
                 "process %u did not run sequence %" PRIu64
                 " of this communicator (its own parts failed there before reaching MPI: a "
                 "mismatch among its devices, a timeout or an abort), so no process runs it",
                 c->procs[skipped], h->seq);
        hmpi_fail(h, CCQ_ERR_MISMATCH, why);
    } else if (hmpi_sig_differ(all, c->procs, c->nprocs, why, sizeof why)) {
        char d[CCQ_DETAIL_LEN];
        snprintf(d, sizeof d, "checked across processes before any data moved: %.440s", why);
        hmpi_fail(h, CCQ_ERR_MISMATCH, d);
    } else if ((rc = hmpi_post_collective(h, h->op)) != MPI_SUCCESS) {
        ccq_errbuf e;
        if (rc == -1)
            snprintf(e.msg, sizeof e.msg, "out of memory for MPI scratch");
        else
            hmpi_mpi_err(&e, rc, h->what);
        hmpi_fail(h, rc == -1 ? CCQ_ERR_NO_MEMORY : CCQ_ERR_BACKEND, e.msg);
    } else {
        h->phase = PH_RUN;
    }
    hmpi_stepped();
    if (all != rec)
        free(all);
    return 1;
}

void hmpi_check_progress(ccq_hmpi_comm *c)
{
    if (c->wq[HMPI_WQ_COLL] == NULL)
        return;
    drain(c);
    while (c->wq[HMPI_WQ_COLL] != NULL) {
        ccq_hmpi_op *h = c->wq[HMPI_WQ_COLL];
        if (!decide(c, h))
            return;
        hmpi_wq_remove(c, h);
    }
}

bool hmpi_check_sent(ccq_hmpi_comm *c, uint64_t seq)
{
    if (c->dirty)
        return false;
    if (c->sets != NULL && c->sets->first_seq <= seq) /* MPI calls only while needed */
        sets_progress(c);
    return c->sets == NULL || c->sets->first_seq > seq;
}

/* Whether process index p's record for sequence seq (or a later one) came. */
static bool heard(const ccq_hmpi_comm *c, int p, uint64_t seq)
{
    const hmpi_sigq *q = &c->in[p];
    for (uint32_t k = q->head; k < q->n; k++)
        if (q->v[k].seq >= seq)
            return true;
    return false;
}

void hmpi_check_missing(const ccq_hmpi_op *h, char *buf, size_t len)
{
    const ccq_hmpi_comm *c = h->c;
    size_t w0 = 0, *w = &w0;
    int n = 0, shown = 0;

    for (int p = 0; p < c->nprocs; p++)
        n += p != c->me && !heard(c, p, h->seq);
    PUT("%s ", n == 1 ? "process" : "processes");
    for (int p = 0; p < c->nprocs && shown < 16; p++)
        if (p != c->me && !heard(c, p, h->seq))
            PUT("%s%u", shown++ ? ", " : "", c->procs[p]);
    if (n > shown)
        PUT(" and %d more", n - shown);
}

void hmpi_check_free(ccq_hmpi_comm *c)
{
    /* Sends MPI still holds (a peer that left): let MPI finish or drop them; their small
     * buffers are leaked on purpose, since MPI may still read them. */
    for (hmpi_sendset *s = c->sets, *next; s != NULL; s = next) {
        bool held = false;
        next = s->next;
        for (int k = 0; k < s->n; k++)
            if (s->reqs[k] != MPI_REQUEST_NULL) {
                MPI_Request_free(&s->reqs[k]);
                held = true;
            }
        if (!held)
            free(s->buf);
        free(s->reqs);
        free(s);
    }
    c->sets = NULL;
    for (int p = 0; c->in != NULL && p < c->nprocs; p++)
        free(c->in[p].v);
    free(c->in);
    free(c->out);
}
