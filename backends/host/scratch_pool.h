/* Scratch buffers kept for reuse by the host backend's engines (backends/host/scratch_pool.c):
 * the UCX engine keeps one per engine, the MPI engine one for the process (under its lock).
 * Not thread-safe: its owner serializes the calls. */
#ifndef CCQ_BACKENDS_HOST_SCRATCH_POOL_H
#define CCQ_BACKENDS_HOST_SCRATCH_POOL_H

#include <stddef.h>
#include <stdint.h>

#define CCQ_POOL_CLASSES   48                 /* one free list per power of two up to 2^47 */
#define CCQ_POOL_BYTES     ((size_t)64 << 20) /* kept in all, whatever the sizes... */
#define CCQ_POOL_PER_CLASS 4                  /* ...and beyond that, this many of each size */
/* Capacities 2^CCQ_POOL_CARVE_MIN .. 2^CCQ_POOL_CARVE_MAX bytes are cut from 2 MiB slabs of
 * huge pages (scratch_pool.c says why). */
#define CCQ_POOL_CARVE_MIN 16 /* 64 KiB */
#define CCQ_POOL_CARVE_MAX 20 /* 1 MiB */

/* A 2 MiB slab cut into buffers of one capacity (1 << cls): how many of them are out. */
typedef struct ccq_pool_slab {
    char *base;
    unsigned cls;
    uint32_t out;
} ccq_pool_slab;

typedef struct ccq_scratch_pool {
    /* Per power of two, the kept buffers (a stack). Kept apart from the buffers themselves:
     * a late write into a buffer given back (an engine's transfer the owner gave up) must
     * never corrupt the pool. */
    void **free[CCQ_POOL_CLASSES];
    uint32_t count[CCQ_POOL_CLASSES], room[CCQ_POOL_CLASSES];
    size_t bytes; /* kept in all */
    int poison;   /* CCQ_SCRATCH_POISON: 0 not read yet, 1 off, 2 on */
    /* The slabs, in address order (a buffer finds its own by a binary search). */
    ccq_pool_slab *slab;
    uint32_t nslab, slab_room;
} ccq_scratch_pool; /* zero-initialized: empty */

/* A page-aligned buffer of at least `bytes` (its capacity in *cap), or NULL.
 *
 * CCQ_SCRATCH_POISON=1 (a debugging aid; the kill drills set it): every buffer kept is filled
 * with a pattern that get checks, so a write into a buffer after it was given back (a transfer
 * that outlived its operation) aborts the process, naming the bytes written. */
void *ccq_pool_get(ccq_scratch_pool *pool, size_t bytes, size_t *cap);
/* A buffer back, with the capacity get gave it (p NULL: nothing): kept or freed. */
void ccq_pool_put(ccq_scratch_pool *pool, void *p, size_t cap);
/* Every kept buffer freed, and every slab (buffers of 64 KiB to 1 MiB still out go with theirs:
 * owners put their buffers back first). */
void ccq_pool_free(ccq_scratch_pool *pool);

#endif /* CCQ_BACKENDS_HOST_SCRATCH_POOL_H */
