/* Lock-free multi-producer single-consumer queue: an intrusive concurrencykit stack that
 * the one consumer detaches whole and reverses into FIFO order. */
#ifndef CCQ_QUEUE_MPSC_H
#define CCQ_QUEUE_MPSC_H

#include <stdbool.h>
#include <stddef.h>

#include <ck_pr.h>
#include <ck_stack.h>

#include "queue/tsan.h"

/*
 * Why a stack: a push is one CAS on the head, and the consumer takes everything with one
 * atomic swap, so there is no ABA problem (the consumer never pops a single node while
 * producers push) and no memory reclamation scheme is needed. Measured in DESIGN.md at
 * 5-17 ns per item contended, against 50-88 for ck_ring mpsc.
 *
 * Ordering: items of one producer come out in the order it pushed them; items of
 * different producers come out in the order their CASes succeeded.
 */
typedef struct ccq_mpsc {
    ck_stack_t stack;
} ccq_mpsc;

typedef ck_stack_entry_t ccq_mpsc_node;

static inline void ccq_mpsc_init(ccq_mpsc *q)
{
    ck_stack_init(&q->stack);
}

/* Producer side, any number of threads. Returns true if the queue looked empty just
 * before this push (the push made it non-empty). This is ck_stack_push_upmc's CAS loop
 * written out, so that it can report the old head and tell ThreadSanitizer (which does not
 * model ck's fences) about the release; the store fence before the CAS makes the node's
 * contents visible to the consumer that detaches it. */
static inline bool ccq_mpsc_push_mpsc(ccq_mpsc *q, ccq_mpsc_node *n)
{
    ccq_mpsc_node *head = ck_pr_load_ptr(&q->stack.head);

    for (;;) {
        n->next = head;
        /* Orders the node's contents (and next) before the CAS that publishes it. */
        ck_pr_fence_store();
        ccq_tsan_release(q);
        if (ck_pr_cas_ptr_value(&q->stack.head, head, n, &head))
            return head == NULL;
    }
}

/* Consumer side, one thread only: cheap emptiness test (a plain atomic load). */
static inline bool ccq_mpsc_empty(ccq_mpsc *q)
{
    return ck_pr_load_ptr(&q->stack.head) == NULL;
}

/* Consumer side, one thread only: detach everything and return it oldest first
 * (NULL if empty). O(n) for the reversal, done by the consumer, never by producers. */
static inline ccq_mpsc_node *ccq_mpsc_pop_all_spsc(ccq_mpsc *q)
{
    ccq_mpsc_node *lifo, *fifo = NULL;

    if (ck_pr_load_ptr(&q->stack.head) == NULL)
        return NULL;
    lifo = ck_stack_batch_pop_upmc(&q->stack);
    ccq_tsan_acquire(q);
    while (lifo != NULL) {
        ccq_mpsc_node *next = lifo->next;
        lifo->next = fifo;
        fifo = lifo;
        lifo = next;
    }
    return fifo;
}

#endif /* CCQ_QUEUE_MPSC_H */
