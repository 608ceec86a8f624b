/* Names for ccq's threads, so that the tools an engineer reaches for when a job hangs or burns a
 * core (`top -H`, `ps -L`, gdb's `info threads`, perf, py-spy) tell them from the embedder's:
 * "ccq-" and what the thread does (docs/tracing.md, "ccq's threads"). */
#ifndef CCQ_COMMON_THREAD_NAME_H
#define CCQ_COMMON_THREAD_NAME_H

/* Name the calling thread (Linux keeps 15 bytes of it; every name ccq gives fits). Called first
 * thing in each thread ccq starts: a name set from inside needs no handle and no _GNU_SOURCE,
 * and a failure (none is known) only leaves the thread its inherited name. */
void ccq_thread_name(const char *name);

#endif /* CCQ_COMMON_THREAD_NAME_H */
