/* World setup: processes meet through the bootstrap, exchange their local device counts and
 * agree on the world (see world.h). Runs on the thread calling ccq_runtime_create. */
#include "runtime/world.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "runtime/boot/bootstrap.h"
#include "runtime/internal.h"

/* What each process tells the others when the world forms. Fixed-size and versioned, so a
 * process of another ccq build is refused clearly rather than misread. */
#define WORLD_MAGIC 0x63637157u /* "Wqcc" */
typedef struct world_hello {
    uint32_t magic, version;
    uint32_t world_size;
    uint32_t local_devices;
    char backend[16];
    ccq_world_proc proc; /* who it is (job health) */
} world_hello;

uint32_t ccq_world_owner(const ccq_world *w, ccq_device_id d)
{
    uint32_t lo = 0, hi = w->size; /* first[lo] <= d < first[hi] */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (w->first[mid] <= d)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static ccq_status world_of_one(ccq_world *w, uint32_t local_devices)
{
    w->rank = 0;
    w->size = 1;
    w->boot = NULL;
    w->first = malloc(2 * sizeof *w->first);
    if (w->first == NULL)
        return ccq_fail(CCQ_ERR_NO_MEMORY, "out of memory for the world");
    w->first[0] = 0;
    w->first[1] = local_devices;
    return CCQ_OK;
}

ccq_status ccq_world_setup(ccq_world *w, const ccq_config *cfg, const char *backend,
                           uint32_t local_devices, uint64_t timeout_ns)
{
    world_hello mine, *all = NULL;
    uint32_t *members = NULL;
    ccq_boot_xchg *x = NULL;
    ccq_errbuf err = {{0}};
    ccq_status st;
    uint64_t total = 0;

    memset(w, 0, sizeof *w);
    if (cfg->world_size == 1 && cfg->world_rank == 0)
        return world_of_one(w, local_devices);
    if (cfg->world_size == 0 || cfg->world_rank >= cfg->world_size)
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "ccq_config.world_rank is %" PRIu32 " but world_size is %" PRIu32
                        " (CCQ_WORLD_RANK / CCQ_WORLD_SIZE)",
                        cfg->world_rank, cfg->world_size);
    w->rank = cfg->world_rank;
    w->size = cfg->world_size;
    st = ccq_boot_open(cfg->bootstrap, cfg->store, cfg->mpi_comm, w->rank, w->size, &w->boot, &err);
    if (st != CCQ_OK)
        return ccq_fail(st, "%s", err.msg);

    memset(&mine, 0, sizeof mine);
    mine.magic = WORLD_MAGIC;
    mine.version = CCQ_VERSION_MAJOR * 10000u + CCQ_VERSION_MINOR * 100u;
    mine.world_size = w->size;
    mine.local_devices = local_devices;
    snprintf(mine.backend, sizeof mine.backend, "%s", backend);
    ccq_health_identity(&mine.proc);
    all = calloc(w->size, sizeof *all);
    members = malloc(w->size * sizeof *members);
    w->first = malloc((w->size + 1) * sizeof *w->first);
    w->procs = calloc(w->size, sizeof *w->procs);
    if (all == NULL || members == NULL || w->first == NULL || w->procs == NULL) {
        st = ccq_fail(CCQ_ERR_NO_MEMORY, "out of memory for a world of %" PRIu32 " processes",
                      w->size);
        goto fail;
    }
    for (uint32_t p = 0; p < w->size; p++)
        members[p] = p;
    st = ccq_boot_xchg_post(w->boot, "world", members, w->size, &mine, sizeof mine, &x, &err);
    if (st != CCQ_OK) {
        st = ccq_fail(st, "the world exchange could not start: %s", err.msg);
        goto fail;
    }
    st = ccq_boot_xchg_wait(x, all, timeout_ns == UINT64_MAX ? 0 : ccq_deadline_in(timeout_ns),
                            &err);
    if (st == CCQ_ERR_TIMEOUT) {
        /* The bootstrap's own detail names the processes that never arrived and adds what
         * its mechanism knows (MPI: the duplication of the communicator still pending). */
        st = ccq_fail(CCQ_ERR_TIMEOUT,
                      "process %" PRIu32 " of a world of %" PRIu32
                      " waited timeout_ms for the others: %s",
                      w->rank, w->size, err.msg);
        goto fail;
    }
    if (st != CCQ_OK) {
        st = ccq_fail(st, "the world exchange failed: %s", err.msg);
        goto fail;
    }
    for (uint32_t p = 0; p < w->size; p++) {
        const world_hello *h = &all[p];
        if (h->magic != WORLD_MAGIC || h->version != mine.version) {
            st = ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                          "process %" PRIu32 " runs another ccq version (or is not ccq)", p);
            goto fail;
        }
        if (h->world_size != w->size) {
            st = ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                          "processes disagree on world_size: process %" PRIu32 " has %" PRIu32
                          ", process %" PRIu32 " (this one) has %" PRIu32,
                          p, h->world_size, w->rank, w->size);
            goto fail;
        }
        if (strncmp(h->backend, mine.backend, sizeof h->backend) != 0) {
            st = ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                          "processes disagree on the backend: process %" PRIu32
                          " runs \"%.16s\", this one \"%s\"",
                          p, h->backend, backend);
            goto fail;
        }
        w->first[p] = (uint32_t)total;
        total += h->local_devices;
        w->procs[p] = h->proc;
    }
    if (total > CCQ_MAX_DEVICES * (uint64_t)64) {
        st = ccq_fail(CCQ_ERR_INVALID_ARGUMENT, "the world has %" PRIu64 " devices; too many",
                      total);
        goto fail;
    }
    w->first[w->size] = (uint32_t)total;
    ccq_boot_xchg_free(x);
    free(all);
    free(members);
    return CCQ_OK;

fail:
    if (x != NULL)
        ccq_boot_xchg_free(x);
    free(all);
    free(members);
    ccq_world_fini(w);
    return st;
}

void ccq_world_fini(ccq_world *w)
{
    if (w->boot != NULL)
        ccq_boot_close(w->boot);
    free(w->first);
    free(w->procs);
    memset(w, 0, sizeof *w);
}
