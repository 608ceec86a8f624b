/* GPU-side waits and batching (ccq_nccl_stream_wait on bound streams): which commands may
 * not share a batch with the commands a wait covers. Runtime only (runtime/gpu_wait.c).
 *
 * A wait W queued on a CUDA stream U for the commands of ccq stream X submitted before it
 * (tickets < t) completes only after the batch holding the last of them is done on the GPU.
 * A command c submitted afterwards on a ccq stream Y bound to U records its submission event
 * on U after W, and its batch makes the communication streams wait for that event. If c were
 * in the same batch as one of those covered commands (or an earlier one), the batch would
 * wait for an event that waits for the batch: a cycle CUDA cannot see (cuda.h: the ordering
 * of stream memory operations "is not visible to CUDA"), a permanent hang with timeout_ms 0.
 * So W leaves a barrier (X, t) on every ccq stream bound to U, each command records how many
 * barriers its stream had when its event was recorded, and the scheduler issues it only once
 * each of those covered commands was issued in an earlier batch (or ended). */
#ifndef CCQ_RUNTIME_GPU_WAIT_H
#define CCQ_RUNTIME_GPU_WAIT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "ccq.h"

struct ccq_runtime;
struct ccq_stream;

/* One barrier: the commands of stream `stream` (its index) with tickets below `target`. */
typedef struct ccq_gw_entry {
    _Atomic uint32_t stream;
    _Atomic uint64_t target;
} ccq_gw_entry;

/* A bound stream's barriers, in the order their waits were queued: entries below `tail` are
 * satisfied (for good: commands once issued stay issued); producers (waiting threads) append
 * under `lock`; the scheduler and producers advance `tail`. */
typedef struct ccq_gw_log {
    pthread_mutex_t lock;
    _Atomic uint64_t head, tail;
    uint32_t cap; /* a power of two */
    ccq_gw_entry *e;
} ccq_gw_log;

/* The CUDA stream bound to s changed (ccq_nccl_bind_stream; NULL: unbound). A stream bound
 * once gets a barrier log and joins the runtime's list of bound streams. */
ccq_status ccq_gw_bind(struct ccq_runtime *rt, struct ccq_stream *s, void *native);
/* Before a wait for the commands of x below ticket `target` is queued on `native`: a
 * barrier on every stream bound to it (none when those commands were all issued).
 * CCQ_ERR_QUEUE_FULL (with a detail) when a stream holds as many unsatisfied barriers as
 * its log has room for. */
ccq_status ccq_gw_before_wait(struct ccq_runtime *rt, struct ccq_stream *x, void *native,
                              uint64_t target, const char *fn);
/* Submission, after the command's event was recorded: the barriers it must respect. */
uint64_t ccq_gw_mark(struct ccq_stream *s);
/* Scheduler: may a command of s with barrier mark `mark` go into the batch being built
 * (every barrier below mark satisfied by batches already issued)? */
bool ccq_gw_clear(struct ccq_runtime *rt, struct ccq_stream *s, uint64_t mark);
/* Scheduler: the first barrier below mark that holds a command of s back (for a watchdog
 * detail): its stream's index and ticket count. False when none does. */
bool ccq_gw_blocker(struct ccq_runtime *rt, struct ccq_stream *s, uint64_t mark, uint32_t *stream,
                    uint64_t *target);
/* Scheduler: the stream's commands up to `passed` (tickets) are issued or ended. */
void ccq_gw_passed(struct ccq_stream *s, uint64_t passed);
void ccq_gw_free(struct ccq_stream *s);

#endif /* CCQ_RUNTIME_GPU_WAIT_H */
