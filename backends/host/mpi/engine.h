/* The host backend across processes: one MPI operation per ccq operation among the member
 * processes of a communicator (one MPI rank per process), the local parts combined before
 * with the fused local kernels and the result written to every local output after. Only
 * built with MPI (CCQ_HAVE_MPI); mpi.h stays inside engine.c. docs/multiprocess-host.md
 * describes the data path, the progress rule and what a pending operation means on failure.
 *
 * Threads: every call is made by one thread at a time per engine object (the host backend
 * calls them from the scheduler thread); each takes ccq's process-wide MPI lock around its
 * MPI calls, so several runtimes in one process share MPI at MPI_THREAD_SERIALIZED. */
#ifndef CCQ_HOST_MPI_H
#define CCQ_HOST_MPI_H

#include <stdbool.h>
#include <stdint.h>

#include "backends/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator's MPI side: an MPI communicator over its member processes only. */
typedef struct ccq_hmpi_comm ccq_hmpi_comm;
/* One operation in flight (or abandoned: see ccq_hmpi_abandon). */
typedef struct ccq_hmpi_op ccq_hmpi_op;

/* The world's MPI communicator for send/recv between processes: an MPI_Comm_idup of the
 * world communicator (mpi_comm: an MPI_Fint, -1 = MPI_COMM_WORLD), posted by every process
 * at the same point (the backend's world_ready) and completed by later tests. A pair of
 * devices in two processes needs no communicator of its own: its halves are tagged with
 * the pair's identity on this one, so forming a pair never blocks (MPI_Comm_create_group
 * would: two processes forming pairs in different orders would wait for each other). */
typedef struct ccq_hmpi_world ccq_hmpi_world;
ccq_status ccq_hmpi_world_post(int64_t mpi_comm, ccq_hmpi_world **out, ccq_errbuf *err);
/* CCQ_OK once the duplicate exists, CCQ_IN_PROGRESS, or an error. */
ccq_status ccq_hmpi_world_test(ccq_hmpi_world *w, ccq_errbuf *err);
/* Free it (a duplicate still being made is left to MPI_Finalize). */
void ccq_hmpi_world_free(ccq_hmpi_world *w);

/* CCQ_OK when MPI is initialised (by ccq's "mpi" bootstrap or by the embedder), not
 * finalized, and at MPI_THREAD_SERIALIZED or above; else CCQ_ERR_UNSUPPORTED with err saying
 * what to do. */
ccq_status ccq_hmpi_ready(ccq_errbuf *err);

/* The bytes the lowest member process hands every member (comm_root_blob): a tag that
 * tells this communicator's MPI_Comm_create_group apart from concurrent ones. */
#define CCQ_HMPI_BLOB_LEN 8u
void ccq_hmpi_root_blob(uint32_t world_rank, void *blob);

/*
 * Create the MPI side of a communicator spanning d->nprocs > 1 processes: MPI_Comm_create_group
 * over the member processes of the world's duplicate w (ready: ccq_hmpi_world_test returned
 * CCQ_OK), then an MPI_Allgather of every member's local rank count (for the `v` collectives).
 * Collective over the members only; blocks until every member calls it (the runtime calls it
 * when the communicator forms, right after the members met through the bootstrap: the wait
 * is short). blob: CCQ_HMPI_BLOB_LEN bytes of the lowest member's ccq_hmpi_root_blob.
 */
ccq_status ccq_hmpi_comm_create(const ccq_be_comm_desc *d, ccq_hmpi_world *w, const void *blob,
                                size_t blob_len, ccq_hmpi_comm **out, ccq_errbuf *err);
/* A pair of devices in two processes (d->nranks == 2, d->nprocs == 2): no MPI communicator
 * of its own; its send/recv halves and its collectives are point-to-point messages on the
 * world's duplicate w (pair.c). Never blocks. */
ccq_status ccq_hmpi_pair_create(const ccq_be_comm_desc *d, ccq_hmpi_world *w, const void *blob,
                                size_t blob_len, ccq_hmpi_comm **out, ccq_errbuf *err);
/* Free it. Operations still pending on it (abandoned) keep it alive until they end. */
void ccq_hmpi_comm_destroy(ccq_hmpi_comm *c);

/*
 * Start an operation: the local combine (on this thread), then one non-blocking MPI
 * operation. op must stay valid until ccq_hmpi_test returns other than CCQ_IN_PROGRESS or
 * ccq_hmpi_abandon is called. Errors: CCQ_ERR_UNSUPPORTED (a count above what MPI's int
 * counts hold), CCQ_ERR_NO_MEMORY, CCQ_ERR_BACKEND (MPI refused; err has its message).
 */
ccq_status ccq_hmpi_start(ccq_hmpi_comm *c, const ccq_be_op *op, uint64_t now_ns, ccq_hmpi_op **out,
                          ccq_errbuf *err);

/* Fusion (docs/fusion.md): start ops[0..n-1], a run of one communicator's collectives
 * (consecutive sequence numbers, from one batch), each as ccq_hmpi_start would; their
 * signature records tell the members how many follow each one, and the operations every
 * member agreed on that fuse by the rule of backends/fuse.h (within the communicator's
 * fusion_bytes) run as one MPI collective. Sets ops[i]->fused, fused_t0 and fused_t1 on the
 * first op of each fused group. *nstarted: how many started (n unless an error). */
ccq_status ccq_hmpi_start_run(ccq_hmpi_comm *c, ccq_be_op *const *ops, uint32_t n, uint64_t now_ns,
                              ccq_hmpi_op **out, uint32_t *nstarted, ccq_errbuf *err);

/* Test it (MPI progresses only inside MPI calls: this is where it moves). CCQ_OK: done,
 * every local output written, h freed; CCQ_IN_PROGRESS; or an error (h freed, err set). */
ccq_status ccq_hmpi_test(ccq_hmpi_op *h, ccq_errbuf *err);

/* Write what h waits for into err: "MPI_Iallreduce (all_reduce, 1024 x float32, sequence
 * 7) among processes 0 and 1 (4 ranks), pending for 1000 ms". */
void ccq_hmpi_describe(const ccq_hmpi_op *h, uint64_t now_ns, ccq_errbuf *err);

/* Give up on h: MPI cannot cancel a collective, so its request stays pending; the engine
 * keeps the scratch it owns alive and frees it when MPI completes the request (tested by
 * later ccq_hmpi_reap calls) or never. The user's buffers may still be written by MPI. */
void ccq_hmpi_abandon(ccq_hmpi_op *h);

/* A send whose data the engine copied (every send does): report it complete now and let
 * MPI finish it in the background (tested by ccq_hmpi_reap), as a buffered send. */
void ccq_hmpi_detach(ccq_hmpi_op *h);
/* Detached sends MPI has not completed yet (they need polling to progress). */
uint32_t ccq_hmpi_detached(void);

/* When an operation last took a step other than its end (CLOCK_MONOTONIC ns): posted once
 * every member's signature agreed. Its MPI operation starts then, so the scheduler should
 * poll back to back for a while, as after a completion (mpi/ops.c: poll_interval). */
uint64_t ccq_hmpi_last_step(void);

/* Test abandoned operations and free those MPI completed; returns how many are left. */
uint32_t ccq_hmpi_reap(uint64_t timeout_ns);

#ifdef __cplusplus
}
#endif

#endif /* CCQ_HOST_MPI_H */
