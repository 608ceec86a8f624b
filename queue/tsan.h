/* ThreadSanitizer annotations for synchronisation done in inline assembly (ck_pr). */
#ifndef CCQ_QUEUE_TSAN_H
#define CCQ_QUEUE_TSAN_H

/*
 * concurrencykit's atomics are inline assembly, which ThreadSanitizer does not see. A
 * push (release) and the pop that detaches it (acquire) are therefore annotated on the
 * queue's address, so TSan knows the pushed node's contents happen-before their use by
 * the consumer. In other builds these are no-ops.
 */
#if defined(__SANITIZE_THREAD__)
#define CCQ_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CCQ_TSAN 1
#endif
#endif

#ifdef CCQ_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define ccq_tsan_acquire(p) __tsan_acquire((void *)(p))
#define ccq_tsan_release(p) __tsan_release((void *)(p))
#else
#define ccq_tsan_acquire(p) ((void)(p))
#define ccq_tsan_release(p) ((void)(p))
#endif

#endif /* CCQ_QUEUE_TSAN_H */
