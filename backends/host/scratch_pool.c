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
 * under 0.5% with huge pages), and the copies and sums take fewer TLB misses. Buffers of
 * 64 KiB to 1 MiB (the scratch of a DDP step's parameters and fused groups, whose payloads are
 * read single-copy from 64 or 256 KiB on: ucx/select.c) are cut from 2 MiB slabs of huge pages,
 * all of a slab's buffers of one capacity: a huge page each would hold 2-32x their size. A
 * slab's buffers stay in its class's stack while any of them is out; when the pool is over its
 * budget and every buffer of a slab is back (and the class keeps CCQ_POOL_PER_CLASS beside
 * them), the slab goes back to the system whole. */
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

static bool carved(unsigned c)
{
    return c >= CCQ_POOL_CARVE_MIN && c <= CCQ_POOL_CARVE_MAX;
}

/* Push p on class c's stack (cap bytes); false when the stack cannot grow. */
static bool keep(ccq_scratch_pool *pool, unsigned c, void *p, size_t cap)
{
    if (pool->count[c] == pool->room[c]) {
        uint32_t room = pool->room[c] ? 2 * pool->room[c] : 16;
        void **grown = realloc(pool->free[c], room * sizeof *grown);
        if (grown == NULL)
            return false;
        pool->free[c] = grown;
        pool->room[c] = room;
    }
    if (poisoned(pool))
        memset(p, POISON, cap);
    pool->free[c][pool->count[c]++] = p;
    pool->bytes += cap;
    return true;
}

/* ---- slabs ------------------------------------------------------------------------------- */

/* The index of the slab holding p, or of the first slab above it (where a new one goes). */
static uint32_t slab_at(const ccq_scratch_pool *pool, const void *p)
{
    uint32_t lo = 0, hi = pool->nslab;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        const char *b = pool->slab[mid].base;
        if ((const char *)p < b)
            hi = mid;
        else if ((const char *)p >= b + HUGE_BYTES)
            lo = mid + 1;
        else
            return mid;
    }
    return lo;
}

/* A new slab of class c: one buffer of it handed out, the others kept; NULL when out of
 * memory. */
static void *slab_new(ccq_scratch_pool *pool, unsigned c)
{
    size_t cap = (size_t)1 << c, n = HUGE_BYTES / cap;
    char *base;
    uint32_t at;
    if (pool->nslab == pool->slab_room) {
        uint32_t room = pool->slab_room ? 2 * pool->slab_room : 8;
        ccq_pool_slab *grown = realloc(pool->slab, room * sizeof *grown);
        if (grown == NULL)
            return NULL;
        pool->slab = grown;
        pool->slab_room = room;
    }
    if ((base = alloc_cap(HUGE_BYTES)) == NULL)
        return NULL;
    at = slab_at(pool, base);
    memmove(pool->slab + at + 1, pool->slab + at, (pool->nslab - at) * sizeof *pool->slab);
    pool->slab[at] = (ccq_pool_slab){.base = base, .cls = c, .out = (uint32_t)n};
    pool->nslab++;
    /* The others onto the stack, last first, so they are handed out in address order. */
    for (size_t k = n - 1; k >= 1; k--) {
        if (!keep(pool, c, base + k * cap, cap))
            break; /* stays out of reach (counted out) until the pool is freed */
        pool->slab[at].out--;
    }
    return base;
}

/* Slab s's buffers are all back: when the pool is over its budget and its class keeps enough
 * beside them, take them off the stack and give the slab back to the system. */
static void slab_maybe_release(ccq_scratch_pool *pool, uint32_t s)
{
    ccq_pool_slab *sl = &pool->slab[s];
    unsigned c = sl->cls;
    size_t cap = (size_t)1 << c, n = HUGE_BYTES / cap;
    uint32_t w = 0;
    if (sl->out != 0 || pool->bytes <= CCQ_POOL_BYTES || pool->count[c] < n + CCQ_POOL_PER_CLASS)
        return;
    for (uint32_t i = 0; i < pool->count[c]; i++) {
        char *p = pool->free[c][i];
        if (p < sl->base || p >= sl->base + HUGE_BYTES)
            pool->free[c][w++] = p;
    }
    pool->bytes -= (pool->count[c] - w) * cap;
    pool->count[c] = w;
    free(sl->base);
    memmove(pool->slab + s, pool->slab + s + 1, (pool->nslab - s - 1) * sizeof *pool->slab);
    pool->nslab--;
}

/* ---- get and put --------------------------------------------------------------------------- */

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
        if (carved(c))
            pool->slab[slab_at(pool, p)].out++;
        return p;
    }
    return carved(c) ? slab_new(pool, c) : alloc_cap(*cap);
}

void ccq_pool_put(ccq_scratch_pool *pool, void *p, size_t cap)
{
    unsigned c = class_of(cap);
    if (p == NULL)
        return;
    if (((size_t)1 << c) == cap && carved(c)) {
        uint32_t s = slab_at(pool, p);
        if (s == pool->nslab || (char *)p < pool->slab[s].base)
            return; /* its slab went with ccq_pool_free (defensive: owners put theirs first) */
        if (keep(pool, c, p, cap)) { /* else out of reach until the pool is freed */
            pool->slab[s].out--;
            slab_maybe_release(pool, s);
        }
        return;
    }
    if (((size_t)1 << c) != cap ||
        (pool->bytes + cap > CCQ_POOL_BYTES && pool->count[c] >= CCQ_POOL_PER_CLASS) ||
        !keep(pool, c, p, cap))
        free(p);
}

void ccq_pool_free(ccq_scratch_pool *pool)
{
    for (unsigned c = 0; c < CCQ_POOL_CLASSES; c++) {
        while (pool->count[c] > 0) {
            void *p = pool->free[c][--pool->count[c]];
            if (!carved(c))
                free(p);
        }
        free(pool->free[c]);
        pool->free[c] = NULL;
        pool->room[c] = 0;
    }
    for (uint32_t s = 0; s < pool->nslab; s++)
        free(pool->slab[s].base);
    free(pool->slab);
    pool->slab = NULL;
    pool->nslab = pool->slab_room = 0;
    pool->bytes = 0;
}
