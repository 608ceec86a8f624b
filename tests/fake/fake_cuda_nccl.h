/* A test-only fake of the CUDA runtime and NCCL calls backends/nccl/nccl.c makes: it records
 * every call, lets a test script results, and runs the collectives on host memory, within a
 * process or across processes (fake_xproc.c). */
#ifndef CCQ_TESTS_FAKE_CUDA_NCCL_H
#define CCQ_TESTS_FAKE_CUDA_NCCL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

/* The real headers, so the fake's definitions are checked against the real signatures. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

/*
 * nccl.h declares ncclGroupStart() and ncclGroupEnd() without a prototype (C++ style);
 * repeating them with one lets the fake define them under -Wmissing-prototypes.
 */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

/*
 * What the fake emulates, in short:
 * - Devices: fake_set_devices(n, cc_major); the current device is per thread (cudaSetDevice).
 * - Communicators: ncclCommInitRankConfig joins the clique of its unique id and takes the
 *   calling thread's current device. Non-blocking: ncclCommGetAsyncError reports
 *   ncclInProgress `pending` times (fake_set_pending), then success or a scripted error.
 * - Groups (per thread, as in NCCL): ncclGroupEnd matches the group's calls and runs them
 *   on host memory: the k-th collective (ncclAllReduce, ncclBroadcast, ncclReduce,
 *   ncclAllGather, ncclReduceScatter, ncclAlltoAll, ncclGather, ncclScatter: one sequence
 *   per communicator, as in NCCL) of every rank of a clique together, with NCCL's semantics
 *   (reductions with the host backend's kernel, copies with memmove; NCCL's in-place forms
 *   work; a buffer a rank does not use may be NULL and is not touched); each ncclSend with
 *   the first unmatched ncclRecv of its (clique, src rank, dst rank) as a memcpy. A group
 *   with a part missing, or whose k-th collectives differ across ranks (kind, count, dtype,
 *   op of reductions, root of rooted ones), returns ncclInvalidUsage, runs nothing and
 *   counts as a fake error (real NCCL launches it and the GPU hangs). As in NCCL, only a
 *   failed NCCL call sets the group's error (then ncclGroupEnd returns it and runs
 *   nothing); a CUDA error between two calls does not. A one-rank communicator's
 *   collective runs at the call, inside a group too. A group that touches a device on which
 *   another communicator's group is still launching (its ncclGroupEnd returned
 *   ncclInProgress and ncclCommGetAsyncError has not yet reported the end) is a fake error:
 *   NCCL launches each non-blocking group on its own thread, in any order per GPU.
 * - Collective arguments: a root out of range, an fp8 reduction on a device of compute
 *   capability < 9, fp8 ncclAvg on a one-rank communicator, a NULL buffer the rank uses
 *   (count > 0) or that NCCL_CHECK_POINTERS=1 checks (sendbuff except a broadcast's
 *   non-roots, recvbuff except a reduce's non-roots), a buffer inside a cudaMalloc
 *   allocation that does not hold what the call uses, or sendbuff and recvbuff overlapping
 *   other than at the kind's in-place position return ncclInvalidArgument at the call and
 *   count as fake errors. ncclAlltoAll, ncclGather and ncclScatter called while the emulated
 *   version (fake_set_nccl_version) is below 2.28, which lacks them, are fake errors too
 *   (ncclInvalidUsage).
 * - Memory: cudaMalloc returns host memory (so the collectives run on it), remembered with
 *   its device; cudaMemcpy is a memmove whose device side must lie in a live allocation.
 * - Contexts: each thread has a current context, none at first (cuCtxGetCurrent and
 *   cuCtxSetCurrent through cudaGetDriverEntryPointByVersion); cudaSetDevice makes the
 *   device's primary context current, and creating a stream, event or allocation on a
 *   thread without one makes device 0's current (CUDA's lazy initialisation).
 *   cudaStreamIsCapturing says what fake_set_capturing set; cudaStreamCreateWithPriority
 *   clamps to [-5, 0], cudaDeviceGetStreamPriorityRange's range (an H100's).
 * - Events: recorded events complete at once, or, in manual mode, when the test calls
 *   fake_complete_events(); an event recorded on a device whose communicator clique has a
 *   rank in asynchronous error completes only when that device's rank is aborted (the
 *   failed collective's kernels hang until ncclCommAbort makes them exit). An event recorded
 *   on a stream with unfinished queued work (below) is recorded when that work ran; a
 *   cudaStreamWaitEvent on an event not complete yet holds its stream (and hardware queue)
 *   back until it is (so a group on a stream waiting for a bound stream's event runs once
 *   that event completed).
 * - Streams queue work in order (see "stream memory operations" below): a group whose
 *   in-process streams have unfinished work queued (a wait, a queued event, a user kernel)
 *   runs once it reached the head of every one of them; otherwise at ncclGroupEnd, as
 *   before. A one-rank collective behind unfinished work runs with its group's work.
 *   Streams share hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, default 8; creation order
 *   mod that number): a wait that is not satisfied holds back its whole queue.
 * - A non-blocking group whose ncclGroupEnd returned ncclInProgress is still being enqueued
 *   by NCCL's launch thread: an event recorded on one of its streams before the launch
 *   ended (ncclCommGetAsyncError left ncclInProgress) or its communicator was aborted is a
 *   fake error (it would complete ahead of the group's kernels).
 * - Misuse the real libraries would punish (a destroyed or aborted handle used again, an
 *   event recorded on another device's stream, a collective on a stream of another device
 *   than its communicator's, a call on a one-rank communicator while another device is
 *   current: NCCL runs those at the call; a data call on a communicator still ncclInProgress)
 *   is logged as a fake error; see fake_errors(). So is ncclCommDestroy of a rank whose
 *   clique has a rank aborted, in error or still ncclInProgress (the destroy would wait for
 *   work that never finishes).
 * - ncclCommAbort can be made to block (fake_hold_abort), as NCCL's reclaim of a
 *   multi-rank communicator can.
 * - Across processes (fake_xproc.c): a clique that does not have all its ranks in this
 *   process when the group (or ungrouped call) creating its communicators here ends meets
 *   its other processes in POSIX shared memory, any split of ranks across processes, any
 *   number of cliques at once. ncclGetUniqueId's ids are unique across processes (counter,
 *   pid, random bytes). The segment is /dev/shm/ccqfake-<hash of the id>-<uid>, created by
 *   the first process (O_CREAT|O_EXCL; the others wait until it is initialised), with a
 *   robust process-shared mutex and a futex word for waits; each published input is a
 *   file beside it (<segment>-c<seq>-<rank>, <segment>-p<from>-<to>-<seq>), unlinked once
 *   read. Init: ncclInProgress (non-blocking) until every rank of the clique registered
 *   (a data call before is a fake error); a blocking init waits in ncclGroupEnd.
 *   At ncclGroupEnd each local rank's call on such a clique takes the next number of its
 *   communicator's sequence (send/recv: of its ordered pair) and publishes a copy of its
 *   input (then, or once the call's slot is free: as with NCCL, the input must not change
 *   until the call completes); ncclGroupEnd returns without waiting for the peers, as
 *   NCCL's launch does. The output is written once every rank's input is there, by the
 *   progress that ncclCommGetAsyncError, cudaEventQuery and later launches make; an event
 *   recorded after the call on its stream completes only then. Each rank computes its own
 *   output from all inputs with the same kernels and semantics as in-process.
 *   The same sequence number with another kind, count, dtype, op (reductions) or root
 *   (rooted kinds) in another rank, or a recv whose count or dtype differs from its send,
 *   is a fake error, and the call's rank gets ncclInvalidUsage as its asynchronous error.
 *   Each collective also carries its rank's group signature on that clique (the first
 *   sequence number of the rank's collectives in the group, their number, their bytes per
 *   function/op/type): ranks that grouped a clique's collectives differently (NCCL plans a
 *   group per communicator, so that is a hang or wrong data on a GPU) get a fake error and
 *   ncclInternalError. Send/recv are not part of it. A rank's compute capability is
 *   registered when it joins: fp8 reductions are refused by the lowest of every process.
 *   A peer whose process is gone gives ncclRemoteError at once; a peer that has not
 *   joined, or done its part, within the fake's timeout (fake_set_xproc_timeout_ms) gives
 *   ncclSystemError; neither is a fake error (nobody here misused anything). As NCCL's
 *   kernels of a failed collective, the failed call never finishes: the events recorded
 *   after it on its stream stay incomplete until its rank is aborted or destroyed (later
 *   launches on the stream do not wait for it). A launch on a stream with unfinished
 *   cross-process work waits for it first (stream order: its input may be that output).
 *   The last process whose communicators are destroyed or aborted unlinks the segment and
 *   its files; a process that dies leaves them to fake_xproc_cleanup(). A clique has 256
 *   slots for collectives and 32 per ordered pair for sends: later calls wait, unpublished
 *   (a launch never blocks on them), for older ones to finish. The waits (blocking init,
 *   stream order) hold the fake's lock. cudaStreamWaitEvent carries no cross-process
 *   dependency; ncclSend/ncclRecv log peer_device -1 for a peer in another process.
 *   Fork the processes before any of them creates a communicator (a child must not
 *   inherit an attached clique).
 * Every function here is thread-safe (one mutex).
 */

/* ---- One recorded call ---- */
typedef struct fake_call {
    const char *fn;   /* the function's name, e.g. "ncclAllReduce" (a string literal) */
    pthread_t thread; /* the calling thread */
    int result;       /* what it returned (cudaError_t or ncclResult_t; 0 for strings) */
    int device;       /* cudaSetDevice/cudaDeviceGetAttribute: the argument; communicator
                         calls: the communicator's device; creations: the new object's;
                         otherwise the calling thread's current device */
    cudaStream_t stream;
    cudaEvent_t event;
    ncclComm_t comm;
    int rank, nranks;      /* the communicator's */
    int peer, peer_device; /* ncclSend/ncclRecv: the peer rank and its device */
    int root;              /* ncclBroadcast/Reduce/Gather/Scatter: the root rank as passed;
                              -1 for every other call */
    size_t count;          /* collectives: the count as passed, in NCCL's convention */
    int dtype, op; /* ncclDataType_t, ncclRedOp_t as passed (op: -1 for calls without one) */
    const void *src;
    void *dst;
    int value; /* ncclCommGetAsyncError: the state reported; ncclCommInitRankConfig:
                  config->blocking; cudaDeviceGetAttribute: the attribute; creations:
                  the flags; cudaEventQuery: 1 if the event had been recorded;
                  cudaMemcpy: the cudaMemcpyKind (cudaMalloc: count = size, dst = ptr) */
} fake_call;

/* ---- Configuration and scripting ---- */

/* Forget everything (log, scripts, handles, errors) and restore the defaults: 4 devices of
 * compute capability 9, NCCL_VERSION_CODE, no pending, automatic events, no hold. Handles
 * from before become invalid: call it only with no runtime alive. */
void fake_reset(void);
/* n devices (0..16), each of compute capability major cc_major. */
void fake_set_devices(int n, int cc_major);
void fake_set_nccl_version(int version);
/* New communicators, and the communicators of a group whose ncclGroupEnd was scripted to
 * return ncclInProgress, report ncclInProgress this many times. */
void fake_set_pending(int n);
/* NCCL_RUNTIME_CONNECT (on by default): a rank of a clique with ranks in other processes
 * connects in its first launch, which stays ncclInProgress (ncclGroupEnd returns it, and
 * ncclCommGetAsyncError reports it) until every rank of the clique, in every process, has
 * launched one; a data call on it meanwhile is a fake error. Off: first launches complete
 * as any other. */
void fake_set_runtime_connect(bool on);
/* While on, every group with data calls returns ncclInProgress from ncclGroupEnd (as NCCL
 * does for non-blocking communicators), its communicators reporting it fake_set_pending
 * times and for `us` microseconds (its launch thread's time); as if each were scripted so. */
void fake_set_launch_in_progress(bool on, long us);
/* While held, ncclCommGetAsyncError reports ncclInProgress for every communicator. */
void fake_hold_async(bool hold);
/* Manual events stay cudaErrorNotReady once recorded, until fake_complete_events(). */
void fake_set_manual_events(bool manual);
void fake_complete_events(void);
/* At the next outermost ncclGroupEnd (any thread), before its work: fake_complete_events()
 * (the GPU finished earlier work while the host launches the next group). */
void fake_complete_events_at_next_group(void);
/* ncclCommAbort completes the recorded events of its device (the aborted kernels exit and
 * the streams drain); with keep, they stay as they are. */
void fake_set_abort_keeps_events(bool keep);
/* While held, ncclCommAbort blocks (other calls go on) until released. */
void fake_hold_abort(bool hold);
/* ncclCommAbort calls blocked by fake_hold_abort now (0 when not held). */
int fake_aborts_blocked(void);
/* Compute capability major of one device (after fake_set_devices). */
void fake_set_device_cc(int device, int cc_major);
/* What ncclGetLastError returns (default ""). */
void fake_set_last_error(const char *msg);
/* Queue the result of the next call of fn not yet scripted (FIFO per function); a call
 * with no script succeeds. A call scripted to fail has no other effect. */
void fake_script(const char *fn, int result);
/* The next communicator of this rank to be created or to take part in a group (also one
 * that fails) gets a sticky asynchronous error (after its pending count). */
void fake_script_async_error(int rank, ncclResult_t err);

/* A test hook (not NCCL behaviour): while held, ncclCommInitRankConfig of a clique's last
 * rank blocks its caller (ccq's scheduler, forming a communicator) after creating it, until
 * released; fake_inits_blocked() counts the calls waiting. Lets a test queue work while the
 * scheduler is held in one place. */
void fake_hold_init(bool hold);
int fake_inits_blocked(void);
/* ---- Across processes (fake_xproc.c) ---- */

/* How long a cross-process clique waits for a peer (to join, or to do its part of a call)
 * before failing with ncclSystemError; ms < 0: CCQ_FAKE_XPROC_TIMEOUT_MS, else 30000. Per
 * process; fake_reset() restores the default. */
void fake_set_xproc_timeout_ms(long ms);
/* Unlink this user's segments (and their data files) that no live process is in: every
 * process registered in them exited (crashed, or killed by a test). Returns the number of
 * files removed. A test that forks calls it after reaping its children. */
int fake_xproc_cleanup(void);
/* Files in /dev/shm of the clique of id: 0 once its last process left. */
size_t fake_xproc_files(const ncclUniqueId *id);

/* ---- Inspection ---- */

/* Contexts (docs: the driver's current context per thread). The calling thread's current
 * context (NULL: none; cudaSetDevice makes the device's primary context current, and a
 * runtime call that needs a context on a thread without one makes device 0's current);
 * a non-primary context of `device` for a test (as cuCtxCreate, not made current); make one
 * current for the calling thread without logging a call (NULL: none); whether a device's
 * primary context was ever made current since fake_reset(). */
CUcontext fake_current_context(void);
CUcontext fake_context_create(int device);
void fake_context_set(CUcontext ctx);
bool fake_primary_used(int device);
/* cudaStreamIsCapturing reports cudaStreamCaptureStatusActive for `stream` (NULL: every
 * stream) while set. */
void fake_set_capturing(cudaStream_t stream, bool capturing);
/* The priority a stream was created with (cudaStreamCreateWithPriority, clamped to the
 * fake's range [-5, 0]; 0 otherwise). */
int fake_stream_priority(cudaStream_t stream);

/* A CUDA stream of `device` for the test itself (not logged, not counted as live). */
cudaStream_t fake_user_stream(int device);
/* The calling thread's current device, without logging a call. */
int fake_current_device(void);
/* Live objects the code under test created: "stream", "event", "mem" (cudaMalloc'd, not
 * freed) or "comm" (created and neither destroyed nor aborted). */
int fake_live(const char *kind);
/* Number of misuses and incomplete groups seen; the last message goes to buf. */
int fake_errors(char *buf, size_t len);

/* The log: entries in call order (the order the fake's mutex took them). */
size_t fake_log_size(void);
bool fake_log_get(size_t i, fake_call *out);
/* Index of the first call of fn at or after `from`, or -1. */
long fake_log_find(const char *fn, size_t from);
size_t fake_log_count(const char *fn);
void fake_log_reset(void);
/* Print the log to stderr (for debugging a failing test). */
void fake_log_dump(void);

/* ---- Driver entry points and stream memory operations (GPU-side waits) ----
 * cudaGetDriverEntryPointByVersion gives fake cuDeviceGet, cuDeviceGetAttribute (only
 * CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is nonzero), cuStreamWaitValue64 (GEQ)
 * and cuStreamWriteValue64, each logged under its name (stream, dst = the address, count =
 * the value, value = the flags). cudaHostAlloc (mapped; filled with garbage, as CUDA does
 * not zero it), cudaHostGetDevicePointer and cudaFreeHost manage host memory the stream
 * operations may address. Work queued on a stream runs in order: a wait holds back what was
 * queued after it on its stream until the word reaches the value (a plain host store counts
 * once something pumps the queues: every stream memory operation, fake_user_launch,
 * fake_complete_events, an abort, fake_pump, fake_stream_pending). */
enum { FAKE_MEMOPS_OK, FAKE_MEMOPS_NO_ATTRIBUTE, FAKE_MEMOPS_NO_SYMBOL };
void fake_set_memops(int mode);
/* Hardware queues per device for streams created from now on (1..32; fake_reset() reads
 * CUDA_DEVICE_MAX_CONNECTIONS, default 8): a stream's queue is its creation order on its
 * device mod n, and a wait that is not satisfied holds back everything queued after it in
 * its queue, on every stream there. */
void fake_set_connections(int n);
/* A "kernel" on a user stream: fn(arg) runs, under the fake's lock (it must not call the
 * fake), once everything queued before it on that stream ran. */
void fake_user_launch(cudaStream_t stream, void (*fn)(void *), void *arg);
void fake_pump(void);
/* Items queued on the stream that have not run, after pumping. */
size_t fake_stream_pending(cudaStream_t stream);

#endif /* CCQ_TESTS_FAKE_CUDA_NCCL_H */
