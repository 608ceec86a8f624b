/* The "mpi" bootstrap: records travel as point-to-point messages on a duplicate of the
 * embedder's communicator (MPI_COMM_WORLD by default), so an exchange among any subset of
 * processes needs nothing from the others (MPI_Comm_create_group would block each member
 * until all arrive, and no collective over the subset exists before it is made).
 *
 * post: MPI_Isend of the record (header, tag, payload) to every other member. test:
 * MPI_Improbe / MPI_Mrecv of whatever arrived into a mailbox keyed by (tag, source), since
 * a peer may be several exchanges ahead, then take the members' records from it. MPI
 * progresses only inside MPI calls (Open MPI has no progress thread): records move while
 * someone tests.
 *
 * Who initialises MPI: ccq, only when nobody has (MPI_Initialized), with
 * MPI_THREAD_SERIALIZED; MPI cannot be initialised again after MPI_Finalize, so ccq keeps it
 * up for later runtimes and finalizes it at process exit (atexit), only if ccq initialised
 * it and nobody finalized it since (Horovod's rule: finalize only what you initialised).
 * Every MPI call of ccq is made under one process-wide lock, so ccq's own threads never
 * call MPI at once: SERIALIZED suffices unless the application calls MPI concurrently
 * itself (then it must initialise MPI with MPI_THREAD_MULTIPLE first). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "common/mpi_lock.h"
#include "runtime/boot/boot_impl.h"

#define CCQ_MPI_TAG 0x6363 /* below the 32767 every MPI allows */

static bool ccq_initialised_mpi; /* under mpi_lock */

/* A record that arrived before its exchange asked for it (or before it was posted here). */
typedef struct mpi_msg {
    struct mpi_msg *next;
    int source;
    unsigned char *buf; /* header, tag, payload */
    size_t len;
    const char *tag; /* into buf; tag_len bytes, no NUL */
    uint32_t tag_len;
} mpi_msg;

/* Sends of an exchange (or of a freed one, still in flight: buf is their buffer). */
typedef struct mpi_sends {
    struct mpi_sends *next;
    MPI_Request *reqs;
    int n;
    unsigned char *buf; /* owned when orphaned */
    bool posted;
} mpi_sends;

typedef struct mpi_boot {
    MPI_Comm comm; /* the embedder's */
    MPI_Comm dup;
    MPI_Request dup_req;
    bool dup_done;
    int comm_size;
    mpi_msg *mailbox, **mailbox_tail;
    mpi_sends *orphans;
} mpi_boot;

static ccq_status mpi_fail(ccq_errbuf *err, int rc, const char *what, int peer)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;

    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", rc);
    if (peer >= 0)
        ccq_boot_err(err, "%s (process %d) failed: %s", what, peer, s);
    else
        ccq_boot_err(err, "%s failed: %s", what, s);
    return CCQ_ERR_BACKEND;
}

static void finalize_at_exit(void)
{
    int fin = 0;

    ccq_mpi_lock();
    if (ccq_initialised_mpi && MPI_Finalized(&fin) == MPI_SUCCESS && !fin)
        MPI_Finalize();
    ccq_mpi_unlock();
}

/* Test a set of sends; true when all completed (their requests are then null). */
static bool sends_done(mpi_sends *s)
{
    int flag = 1;

    if (s->posted && s->n > 0)
        MPI_Testall(s->n, s->reqs, &flag, MPI_STATUSES_IGNORE);
    return flag != 0;
}

/* Receive whatever arrived on our communicator into the mailbox. */
static ccq_status drain(mpi_boot *m, ccq_errbuf *err)
{
    for (;;) {
        MPI_Message msg;
        MPI_Status status;
        mpi_msg *e;
        int flag = 0, count = 0, rc;

        rc = MPI_Improbe(MPI_ANY_SOURCE, CCQ_MPI_TAG, m->dup, &flag, &msg, &status);
        if (rc != MPI_SUCCESS)
            return mpi_fail(err, rc, "MPI_Improbe", -1);
        if (!flag)
            return CCQ_OK;
        MPI_Get_count(&status, MPI_BYTE, &count);
        e = calloc(1, sizeof *e);
        if (e != NULL)
            e->buf = malloc(count > 0 ? (size_t)count : 1);
        if (e == NULL || e->buf == NULL) {
            free(e);
            ccq_boot_err(err, "out of memory");
            return CCQ_ERR_NO_MEMORY;
        }
        rc = MPI_Mrecv(e->buf, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            free(e->buf);
            free(e);
            return mpi_fail(err, rc, "MPI_Mrecv", status.MPI_SOURCE);
        }
        e->source = status.MPI_SOURCE;
        e->len = (size_t)count;
        if (e->len >= sizeof(ccq_boot_hdr)) {
            ccq_boot_hdr h;
            memcpy(&h, e->buf, sizeof h);
            if (h.tag_len <= e->len - sizeof h) {
                e->tag = (const char *)e->buf + sizeof h;
                e->tag_len = h.tag_len;
            }
        }
        /* A message without a readable tag is kept but never matches: the exchange waiting
         * for that process times out naming it. */
        *m->mailbox_tail = e;
        m->mailbox_tail = &e->next;
    }
}

static void progress_orphans(mpi_boot *m)
{
    for (mpi_sends **p = &m->orphans; *p != NULL;) {
        mpi_sends *s = *p;
        if (!sends_done(s)) {
            p = &s->next;
            continue;
        }
        *p = s->next;
        free(s->reqs);
        free(s->buf);
        free(s);
    }
}

static ccq_status mpi_publish(ccq_boot *b, ccq_boot_xchg *x, ccq_errbuf *err)
{
    mpi_sends *s = calloc(1, sizeof *s);

    (void)b;
    if (s == NULL || (s->reqs = calloc(x->n, sizeof *s->reqs)) == NULL) {
        free(s);
        ccq_boot_err(err, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    /* The sends start in progress(): the duplicate communicator may not exist yet. */
    x->mech_priv = s;
    return CCQ_OK;
}

static ccq_status post_sends(mpi_boot *m, ccq_boot_xchg *x, ccq_errbuf *err)
{
    mpi_sends *s = x->mech_priv;

    for (uint32_t i = 0; i < x->n; i++) {
        int rc;
        if (i == x->self)
            continue;
        rc = MPI_Isend(x->rec, (int)x->rec_len, MPI_BYTE, (int)x->members[i], CCQ_MPI_TAG, m->dup,
                       &s->reqs[s->n]);
        if (rc != MPI_SUCCESS) {
            s->posted = true; /* the ones before it are in flight */
            return mpi_fail(err, rc, "MPI_Isend", (int)x->members[i]);
        }
        s->n++;
    }
    s->posted = true;
    return CCQ_OK;
}

static ccq_status mpi_progress(ccq_boot *b, ccq_boot_xchg *x, ccq_errbuf *err)
{
    mpi_boot *m = b->impl;
    mpi_sends *s = x->mech_priv;
    ccq_status st = CCQ_OK;
    int rc;

    ccq_mpi_lock();
    if (!m->dup_done) {
        int flag = 0;
        rc = MPI_Test(&m->dup_req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            st = mpi_fail(err, rc, "MPI_Comm_idup", -1);
            goto unlock;
        }
        if (!flag) {
            snprintf(b->note, sizeof b->note,
                     "MPI_Comm_idup over the %d processes of the MPI communicator has not "
                     "completed (each of them must open the bootstrap)",
                     m->comm_size);
            st = CCQ_IN_PROGRESS;
            goto unlock;
        }
        m->dup_done = true;
        b->note[0] = '\0';
        /* Errors on our own communicator come back as codes, with their text in the detail,
         * instead of aborting the job. */
        MPI_Comm_set_errhandler(m->dup, MPI_ERRORS_RETURN);
    }
    /* Start the sends of every exchange posted so far, not only x's: a caller may be
     * testing one exchange while peers wait for another. */
    for (ccq_boot_xchg *y = b->xchgs; y != NULL; y = y->next) {
        mpi_sends *ys = y->mech_priv;
        if (ys != NULL && !ys->posted) {
            st = post_sends(m, y, err);
            if (st != CCQ_OK)
                goto unlock;
        }
    }
    if (s != NULL)
        sends_done(s);
    st = drain(m, err);
    progress_orphans(m);
unlock:
    ccq_mpi_unlock();
    return st;
}

static ccq_status mpi_fetch(ccq_boot *b, ccq_boot_xchg *x, uint32_t rank, void **rec, size_t *len,
                            ccq_errbuf *err)
{
    mpi_boot *m = b->impl;
    size_t tag_len = strlen(x->tag);

    (void)err;
    for (mpi_msg **p = &m->mailbox; *p != NULL; p = &(*p)->next) {
        mpi_msg *e = *p;
        if (e->source != (int)rank || e->tag == NULL || e->tag_len != tag_len ||
            memcmp(e->tag, x->tag, tag_len) != 0)
            continue;
        *p = e->next;
        if (m->mailbox_tail == &e->next)
            m->mailbox_tail = p;
        *rec = e->buf;
        *len = e->len;
        free(e);
        return CCQ_OK;
    }
    return CCQ_IN_PROGRESS;
}

static void mpi_xchg_free(ccq_boot *b, ccq_boot_xchg *x)
{
    mpi_boot *m = b->impl;
    mpi_sends *s = x->mech_priv;

    if (s == NULL)
        return;
    ccq_mpi_lock();
    if (sends_done(s)) {
        free(s->reqs);
        free(s);
    } else {
        /* Still in flight: the sends keep the record's buffer until they complete. */
        s->buf = x->rec;
        x->rec = NULL;
        s->next = m->orphans;
        m->orphans = s;
    }
    ccq_mpi_unlock();
    x->mech_priv = NULL;
}

static void mpi_close(ccq_boot *b)
{
    mpi_boot *m = b->impl;

    ccq_mpi_lock();
    progress_orphans(m);
    /* Sends nobody received (a peer that left): MPI_Request_free lets MPI finish or drop
     * them on its own; their small buffers are leaked on purpose, since MPI may still read
     * them. */
    for (mpi_sends *s = m->orphans, *next; s != NULL; s = next) {
        next = s->next;
        for (int i = 0; i < s->n; i++)
            if (s->reqs[i] != MPI_REQUEST_NULL)
                MPI_Request_free(&s->reqs[i]);
        free(s->reqs);
        free(s);
    }
    for (mpi_msg *e = m->mailbox, *next; e != NULL; e = next) {
        next = e->next;
        free(e->buf);
        free(e);
    }
    /* A duplication that never completed cannot be freed or cancelled (erroneous for a
     * non-blocking collective): it stays pending, as the process that never came. */
    if (m->dup_done)
        MPI_Comm_free(&m->dup);
    ccq_mpi_unlock();
    free(m);
}

static const ccq_boot_mech mpi_mech = {
    .name = "mpi",
    .poll_ns = 100000,       /* a test is a few MPI calls in this process: cheap */
    .private_channel = true, /* each handle has its own duplicate communicator */
    .publish = mpi_publish,
    .progress = mpi_progress,
    .fetch = mpi_fetch,
    .xchg_free = mpi_xchg_free,
    .close = mpi_close,
};

static const char *level_name(int level)
{
    switch (level) {
    case MPI_THREAD_SINGLE:
        return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
        return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
        return "MPI_THREAD_SERIALIZED";
    default:
        return "MPI_THREAD_MULTIPLE";
    }
}

ccq_status ccq_boot_mpi_open(ccq_boot *b, int64_t mpi_comm, ccq_errbuf *err)
{
    mpi_boot *m = NULL;
    ccq_status st = CCQ_ERR_UNSUPPORTED;
    int init = 0, fin = 0, provided = MPI_THREAD_SINGLE, rank = -1, size = 0, rc;
    MPI_Comm comm;

    if (mpi_comm != -1 && (mpi_comm < INT_MIN || mpi_comm > INT_MAX)) {
        ccq_boot_err(err, "bootstrap mpi: mpi_comm %lld is not an MPI_Fint (MPI_Comm_c2f)",
                     (long long)mpi_comm);
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    ccq_mpi_lock();
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (fin) {
        ccq_boot_err(err, "bootstrap mpi: MPI was already finalized (it cannot be initialised "
                          "again in this process)");
        goto unlock;
    }
    if (!init) {
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS) {
            st = mpi_fail(err, rc, "bootstrap mpi: MPI_Init_thread", -1);
            goto unlock;
        }
        ccq_initialised_mpi = true;
        atexit(finalize_at_exit);
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        ccq_boot_err(err,
                     "bootstrap mpi: MPI runs at %s; ccq calls MPI from its scheduler thread "
                     "too, so it needs MPI_THREAD_SERIALIZED (MPI_THREAD_MULTIPLE if the "
                     "application calls MPI while ccq runs): initialise MPI with "
                     "MPI_Init_thread at that level, or let ccq initialise it",
                     level_name(provided));
        goto unlock;
    }
    comm = mpi_comm == -1 ? MPI_COMM_WORLD : MPI_Comm_f2c((MPI_Fint)mpi_comm);
    if (comm == MPI_COMM_NULL) {
        ccq_boot_err(err, "bootstrap mpi: mpi_comm %lld is MPI_COMM_NULL", (long long)mpi_comm);
        st = CCQ_ERR_INVALID_ARGUMENT;
        goto unlock;
    }
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    if (rank != (int)b->rank || size != (int)b->size) {
        ccq_boot_err(err,
                     "bootstrap mpi: this process is rank %d of %d in the MPI communicator, "
                     "but world_rank %u of world_size %u: they must be the same",
                     rank, size, b->rank, b->size);
        st = CCQ_ERR_INVALID_ARGUMENT;
        goto unlock;
    }
    m = calloc(1, sizeof *m);
    if (m == NULL) {
        ccq_boot_err(err, "bootstrap: out of memory");
        st = CCQ_ERR_NO_MEMORY;
        goto unlock;
    }
    m->comm = comm;
    m->comm_size = size;
    m->mailbox_tail = &m->mailbox;
    /* Our own communicator, so no message of the application is ever taken for ours (nor
     * the reverse). Non-blocking: it completes inside the first exchanges, and a process
     * that never comes makes them time out instead of hanging here. */
    rc = MPI_Comm_idup(comm, &m->dup, &m->dup_req);
    if (rc != MPI_SUCCESS) {
        st = mpi_fail(err, rc, "bootstrap mpi: MPI_Comm_idup", -1);
        free(m);
        goto unlock;
    }
    b->mech = &mpi_mech;
    b->impl = m;
    st = CCQ_OK;
unlock:
    ccq_mpi_unlock();
    return st;
}
