/* The MPI engine behind the host backend's engine interface (engine.h): the world's MPI
 * duplicate for pairs, communicators formed once it exists, and the engine's operations
 * (mpi/engine.c) as ccq_heng_op. */
#define _GNU_SOURCE /* nanosleep */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/fuse.h"
#include "backends/host/engine.h"
#include "backends/host/mpi/engine.h"
#include "common/clock.h"

/* How often the scheduler polls while MPI requests are in flight: MPI progresses only
 * inside MPI calls (docs/multiprocess-host.md has the measurements behind the default). */
#define MPI_ENGINE_POLL_NS 20000u

typedef struct mpi_engine {
    ccq_host_engine base;
    int64_t mpi_comm;      /* cfg->mpi_comm: the world's MPI communicator (-1: MPI_COMM_WORLD) */
    uint64_t timeout_ns;   /* cfg->timeout_ms (UINT64_MAX: none) */
    uint64_t poll_ns;      /* poll interval while MPI requests are in flight */
    uint64_t spin_ns;      /* cfg->spin_us: poll back to back that long after a step */
    ccq_hmpi_world *world; /* the world's MPI duplicate for pairs (world_ready) */
    ccq_errbuf world_err;  /* why there is none */
    uint32_t background;   /* abandoned or detached requests MPI has not completed */
} mpi_engine;

/* A communicator's MPI side, made once the world's duplicate exists (comm_test): none is
 * made while that MPI_Comm_idup of the world may still be pending here, so no
 * MPI_Comm_create_group on the world overlaps it. */
struct ccq_heng_comm {
    ccq_hmpi_comm *mpi;
    bool pending;
    ccq_be_comm_desc desc;
    uint32_t *procs; /* [desc.nprocs], the desc's copy */
    uint8_t blob[CCQ_HMPI_BLOB_LEN];
};

static mpi_engine *to_mpi(ccq_host_engine *e)
{
    return ccq_container_of(e, mpi_engine, base);
}

static ccq_status mpi_create(const ccq_config *cfg, ccq_host_engine **out, ccq_errbuf *err)
{
    mpi_engine *m = calloc(1, sizeof *m);
    const char *e = getenv("CCQ_HOST_MPI_POLL_US");

    *out = NULL;
    if (m == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    m->base.ops = &ccq_host_engine_mpi_ops;
    m->mpi_comm = cfg->mpi_comm;
    m->timeout_ns = cfg->timeout_ms ? cfg->timeout_ms * 1000000ull : UINT64_MAX;
    m->poll_ns = MPI_ENGINE_POLL_NS;
    m->spin_ns = (uint64_t)cfg->spin_us * 1000u;
    if (e != NULL && *e != '\0')
        m->poll_ns = strtoull(e, NULL, 10) * 1000u;
    *out = &m->base;
    return CCQ_OK;
}

static void mpi_destroy(ccq_host_engine *e)
{
    mpi_engine *m = to_mpi(e);
    ccq_hmpi_world_free(m->world);
    free(m);
}

/* Every process of the world calls this at the same point, inside ccq_runtime_create right
 * after they all met: make the world's duplicate, and wait here until it exists. MPI_Comm_idup
 * is collective over the whole world and moves only while every process calls MPI; here they
 * all do, while later a process that makes no ccq call (no MPI call) would hold it back for
 * everyone, and a communicator of other processes would wait for it (issue 22). */
static ccq_status mpi_world_ready(ccq_host_engine *e, uint32_t world_rank, uint32_t world_size,
                                  bool crowded, const void *const *blobs, const size_t *blob_len,
                                  ccq_errbuf *err)
{
    mpi_engine *m = to_mpi(e);
    (void)world_rank;
    (void)world_size;
    (void)crowded;
    (void)blobs;
    (void)blob_len;
    if (ccq_hmpi_world_post(m->mpi_comm, &m->world, &m->world_err) == CCQ_OK) {
        uint64_t deadline = ccq_add_sat(ccq_now_ns(), m->timeout_ns);
        ccq_status st;
        while ((st = ccq_hmpi_world_test(m->world, err)) == CCQ_IN_PROGRESS) {
            struct timespec ts = {0, 20000}; /* the others are here too: short */
            if (ccq_now_ns() >= deadline) {
                snprintf(err->msg, sizeof err->msg,
                         "the host backend cannot span processes: MPI_Comm_idup of the world's "
                         "MPI communicator (every process takes part, inside "
                         "ccq_runtime_create) did not complete within timeout_ms");
                st = CCQ_ERR_TIMEOUT;
                break;
            }
            nanosleep(&ts, NULL);
        }
        if (st == CCQ_OK)
            return CCQ_OK;
        /* A duplicate still being made is left to MPI (it cannot be cancelled). */
        snprintf(m->world_err.msg, sizeof m->world_err.msg, "%s", err->msg);
        ccq_hmpi_world_free(m->world);
        m->world = NULL;
        return st == CCQ_ERR_TIMEOUT ? CCQ_ERR_UNSUPPORTED : st;
    }
    m->world = NULL;
    /* world_err already says why and what to do ("... launch under mpirun ..."). */
    snprintf(err->msg, sizeof err->msg, "%s",
             m->world_err.msg[0] ? m->world_err.msg
                                 : "the host backend cannot span processes here: MPI is not "
                                   "initialised in this process");
    return CCQ_ERR_UNSUPPORTED;
}

static ccq_status mpi_root_blob(ccq_host_engine *e, const ccq_be_comm_desc *d, void *blob,
                                size_t *len, ccq_errbuf *err)
{
    (void)e;
    if (*len < CCQ_HMPI_BLOB_LEN) {
        snprintf(err->msg, sizeof err->msg, "internal: %zu bytes for the MPI engine's blob", *len);
        return CCQ_ERR_BACKEND;
    }
    ccq_hmpi_root_blob(d->world_rank, blob);
    *len = CCQ_HMPI_BLOB_LEN;
    return CCQ_OK;
}

/* A pair across processes forms once the world's MPI duplicate exists (every process posted
 * it in world_ready, so this never waits for a particular peer). */
static ccq_status mpi_comm_test(ccq_host_engine *e, ccq_heng_comm *c, ccq_errbuf *err)
{
    mpi_engine *m = to_mpi(e);
    ccq_status st;

    if (!c->pending)
        return CCQ_OK;
    st = ccq_hmpi_world_test(m->world, err);
    if (st != CCQ_OK)
        return st;
    if (c->desc.nprocs == 2 && c->desc.nranks == 2) /* a pair: on the world's duplicate */
        st = ccq_hmpi_pair_create(&c->desc, m->world, c->blob, sizeof c->blob, &c->mpi, err);
    else
        st = ccq_hmpi_comm_create(&c->desc, m->world, c->blob, sizeof c->blob, &c->mpi, err);
    if (st == CCQ_OK) {
        c->pending = false;
        free(c->procs);
        c->procs = NULL;
    }
    return st;
}

static void mpi_comm_destroy(ccq_host_engine *e, ccq_heng_comm *c)
{
    (void)e;
    if (c == NULL)
        return;
    ccq_hmpi_comm_destroy(c->mpi);
    free(c->procs);
    free(c);
}

static ccq_status mpi_comm_create(ccq_host_engine *e, const ccq_be_comm_desc *d,
                                  ccq_heng_comm **out, ccq_errbuf *err)
{
    mpi_engine *m = to_mpi(e);
    ccq_heng_comm *c;
    ccq_status st;

    *out = NULL;
    if (m->world == NULL) {
        snprintf(err->msg, sizeof err->msg, "%s",
                 m->world_err.msg[0] ? m->world_err.msg : "MPI is not set up");
        return CCQ_ERR_UNSUPPORTED;
    }
    c = calloc(1, sizeof *c);
    if (c != NULL)
        c->procs = malloc(d->nprocs * sizeof *c->procs);
    if (c == NULL || c->procs == NULL) {
        free(c);
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    c->desc = *d;
    memcpy(c->procs, d->procs, d->nprocs * sizeof *c->procs);
    c->desc.procs = c->procs;
    c->desc.local_devices = NULL;
    c->desc.root_blob = NULL;
    if (d->root_blob_len == CCQ_HMPI_BLOB_LEN)
        memcpy(c->blob, d->root_blob, CCQ_HMPI_BLOB_LEN);
    c->pending = true;
    st = mpi_comm_test(e, c, err);
    if (st != CCQ_OK && st != CCQ_IN_PROGRESS) {
        mpi_comm_destroy(e, c);
        return st;
    }
    *out = c;
    return st;
}

static ccq_status mpi_start(ccq_host_engine *e, ccq_heng_comm *c, const ccq_be_op *op,
                            uint64_t now_ns, ccq_heng_op **out, ccq_errbuf *err)
{
    (void)e;
    return ccq_hmpi_start(c->mpi, op, now_ns, (ccq_hmpi_op **)out, err);
}

static ccq_status mpi_start_run(ccq_host_engine *e, ccq_heng_comm *c, ccq_be_op *const *ops,
                                uint32_t n, uint64_t now_ns, ccq_heng_op **out, uint32_t *nstarted,
                                ccq_errbuf *err)
{
    (void)e;
    return ccq_hmpi_start_run(c->mpi, ops, n, now_ns, (ccq_hmpi_op **)out, nstarted, err);
}

static ccq_status mpi_test(ccq_host_engine *e, ccq_heng_op *h, ccq_errbuf *err)
{
    ccq_status st = ccq_hmpi_test((ccq_hmpi_op *)h, err);
    if (st != CCQ_OK && st != CCQ_IN_PROGRESS)
        to_mpi(e)->background++; /* the engine keeps a failed request (see ccq_hmpi_test) */
    return st;
}

static void mpi_describe(ccq_host_engine *e, const ccq_heng_op *h, uint64_t now_ns, ccq_errbuf *err)
{
    (void)e;
    ccq_hmpi_describe((const ccq_hmpi_op *)h, now_ns, err);
}

static void mpi_abandon(ccq_host_engine *e, ccq_heng_op *h)
{
    ccq_hmpi_abandon((ccq_hmpi_op *)h);
    to_mpi(e)->background++;
}

static bool mpi_detach(ccq_host_engine *e, ccq_heng_op *h)
{
    ccq_hmpi_detach((ccq_hmpi_op *)h);
    to_mpi(e)->background++;
    return true;
}

static uint32_t mpi_reap(ccq_host_engine *e)
{
    mpi_engine *m = to_mpi(e);
    if (m->background > 0)
        m->background = ccq_hmpi_reap(m->timeout_ns);
    return m->background;
}

static uint64_t mpi_poll_interval(ccq_host_engine *e, bool busy)
{
    mpi_engine *m = to_mpi(e);
    /* An operation that just passed its check started its MPI operation: poll back to back
     * for spin_us, as the scheduler does after a completion (1 ns: the scheduler does not
     * sleep). Without it, an operation whose check and transfer together outlast the
     * scheduler's spin window slept a poll interval (plus the kernel's timer slack, ~50 us):
     * 64 KiB all_reduces over 2 x 2 devices took 120-200 us instead of ~55. */
    if (busy && ccq_now_ns() - ccq_hmpi_last_step() < m->spin_ns)
        return 1;
    /* Detached sends need MPI calls to finish; requests given up on (a dead peer) do not
     * keep the scheduler polling. */
    return busy || (m->background > 0 && ccq_hmpi_detached() > 0) ? m->poll_ns : 0;
}

const ccq_host_engine_ops ccq_host_engine_mpi_ops = {
    .name = "mpi",
    .create = mpi_create,
    .destroy = mpi_destroy,
    .world_ready = mpi_world_ready,
    .root_blob = mpi_root_blob,
    .comm_create = mpi_comm_create,
    .comm_test = mpi_comm_test,
    .comm_destroy = mpi_comm_destroy,
    .start = mpi_start,
    .test = mpi_test,
    .describe = mpi_describe,
    .abandon = mpi_abandon,
    .detach = mpi_detach,
    .reap = mpi_reap,
    .poll_interval = mpi_poll_interval,
    .start_run = mpi_start_run,
};
