/* Scratch buffers kept for reuse by the host backend's engines: first-touching megabytes
 * (page faults, zeroing, the memory cgroup's charge) costs as much as moving them, and freeing
 * them gives the pages back to the system for the next operation to fault in again.
 *
 * Capacities are powers of two (at least a page), one stack of kept buffers per power (held
 * apart from the buffers), so a get is a pop and a put a push. What is kept: every buffer while the
 * pool holds at most CCQ_POOL_BYTES in all (many operations in flight at once, each with its own
 * scratch: 90 all_gathers of 64 KiB per rank on 2 x 2 spent a third of their time in page faults
 * with the earlier pool of 16 buffers), and beyond that up to CCQ_POOL_PER_CLASS buffers of each
 * size, so that large operations repeated keep theirs whatever the budget. Memory goes back to the
 * system only when the owner frees the pool.
 *
 * Buffers from 2 MiB on are transparent huge pages where the system grants them on request
 * (madvise mode, Debian's default): the peer's single-copy reads (CMA) pin the sender's pages
 * one by one, which took 8% of a 2 x 1 all_reduce of 4 MiB (follow_page_pte, get_user_pages;
 * under 0.5% with huge pages), and the copies and sums take fewer TLB misses. */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#include "backends/host/scratch_pool.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define POISON     0xa5
#define HUGE_BYTES ((size_t)2 << 20)

/* A new buffer of cap bytes (a multiple of 4 KiB). From 2 MiB on it is aligned to 2 MiB and
 * asks for transparent huge pages (where the system leaves them to madvise, as Debian does). */
static void *alloc_cap(size_t cap)
{
    size_t whole = (cap + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1); /* what aligned_alloc needs */
    void *p;
    if (cap < HUGE_BYTES)
        return aligned_alloc(4096, cap);
    if ((p = aligned_alloc(HUGE_BYTES, whole)) != NULL)
        (void)madvise(p, whole, MADV_HUGEPAGE);
    return p;
}

static bool poisoned(ccq_scratch_pool *pool)
{
    if (pool->poison == 0) {
        const char *v = getenv("CCQ_SCRATCH_POISON");
        pool->poison = v != NULL && v[0] != '\0' && strcmp(v, "0") != 0 ? 2 : 1;
    }
    return pool->poison == 2;
}

/* A kept buffer is about to be handed out: it must still hold the pattern put wrote. */
static void poison_check(const void *p, size_t cap)
{
    const unsigned char *b = p;
    size_t first = 0, last;
    while (first < cap && b[first] == POISON)
        first++;
    if (first == cap)
        return;
    last = cap;
    while (last > first && b[last - 1] == POISON)
        last--;
    fprintf(stderr,
            "ccq: scratch pool (CCQ_SCRATCH_POISON): a buffer of %zu bytes at %p was written at "
            "bytes %zu..%zu after it was given back\n",
            cap, p, first, last - 1);
    abort();
}

static unsigned class_of(size_t cap)
{
    unsigned c = 12; /* 4 KiB */
    while (((size_t)1 << c) < cap && c + 1 < CCQ_POOL_CLASSES)
        c++;
    return c;
}

void *ccq_pool_get(ccq_scratch_pool *pool, size_t bytes, size_t *cap)
{
    unsigned c = class_of(bytes);
    *cap = (size_t)1 << c;
    if (*cap < bytes) { /* beyond the largest class: never pooled */
        *cap = (bytes + 4095) & ~(size_t)4095;
        return alloc_cap(*cap);
    }
    if (pool->count[c] > 0) {
        void *p = pool->free[c][--pool->count[c]];
        pool->bytes -= *cap;
        if (poisoned(pool))
            poison_check(p, *cap);
        return p;
    }
    return alloc_cap(*cap);
}

void ccq_pool_put(ccq_scratch_pool *pool, void *p, size_t cap)
{
    unsigned c = class_of(cap);
    if (p == NULL)
        return;
    if (((size_t)1 << c) != cap ||
        (pool->bytes + cap > CCQ_POOL_BYTES && pool->count[c] >= CCQ_POOL_PER_CLASS)) {
        free(p);
        return;
    }
    if (pool->count[c] == pool->room[c]) {
        uint32_t room = pool->room[c] ? 2 * pool->room[c] : 16;
        void **grown = realloc(pool->free[c], room * sizeof *grown);
        if (grown == NULL) {
            free(p);
            return;
        }
        pool->free[c] = grown;
        pool->room[c] = room;
    }
    if (poisoned(pool))
        memset(p, POISON, cap);
    pool->free[c][pool->count[c]++] = p;
    pool->bytes += cap;
}

void ccq_pool_free(ccq_scratch_pool *pool)
{
    for (unsigned c = 0; c < CCQ_POOL_CLASSES; c++) {
        while (pool->count[c] > 0)
            free(pool->free[c][--pool->count[c]]);
        free(pool->free[c]);
        pool->free[c] = NULL;
        pool->room[c] = 0;
    }
    pool->bytes = 0;
}
