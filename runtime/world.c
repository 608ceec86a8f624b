/* World setup: processes meet through the bootstrap, exchange their local device counts and
 * agree on the world (see world.h). Runs on the thread calling ccq_runtime_create. */
#include "runtime/world.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/cores.h"
#include "runtime/boot/bootstrap.h"
#include "runtime/health/health.h" /* ccq_heartbeat_timeout_ms */
#include "runtime/internal.h"

/* What each process tells the others when the world forms. Fixed-size and versioned, so a
 * process of another ccq build is refused clearly rather than misread. */
#define WORLD_MAGIC 0x32637157u /* "Wqc2": ccq_world_proc with the heartbeat settings */
typedef struct world_hello {
    uint32_t magic, version;
    uint32_t world_size;
    uint32_t local_devices;
    char backend[16];
    uint32_t blob_len; /* this process's backend blob (the second exchange carries it) */
    uint32_t reserved;
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

/* ---- The host's cores: who may run where ------------------------------------------------ */

#define HOST_CPUS (CCQ_CPU_SET_BYTES * 8u)

static bool has_cpu(const ccq_world_proc *p, uint32_t c)
{
    return p->cpus[c / 8] >> (c % 8) & 1u;
}

/* Core c of p's set, an empty set (unknown) being core 0 alone. */
static bool may_run(const ccq_world_proc *p, uint32_t c, bool empty)
{
    return empty ? c == 0 : has_cpu(p, c);
}

static uint32_t set_count(const ccq_world_proc *p)
{
    uint32_t n = 0;
    for (uint32_t b = 0; b < CCQ_CPU_SET_BYTES; b++)
        n += (uint32_t)__builtin_popcount(p->cpus[b]);
    return n;
}

/* The processes of process me's machine (kernel_id; all when unknown): their indices into
 * local (n of them at most), how many. */
static uint32_t host_procs(const ccq_world_proc *procs, uint32_t n, uint32_t me, uint32_t *local)
{
    uint64_t machine = procs[me].kernel_id;
    uint32_t nlocal = 0;
    for (uint32_t p = 0; p < n; p++)
        if (machine == 0 || procs[p].kernel_id == machine)
            local[nlocal++] = p;
    return nlocal;
}

/* Kuhn's augmenting path for process i (an index into local): a free core of its set, or one
 * whose process can move to another. owner[c]: the local index holding core c, or -1. */
typedef struct matching {
    const ccq_world_proc *procs;
    const uint32_t *local;
    const bool *empty;
    int32_t owner[HOST_CPUS];
    uint8_t seen[CCQ_CPU_SET_BYTES];
} matching;

static bool augment(matching *m, uint32_t i)
{
    const ccq_world_proc *p = &m->procs[m->local[i]];
    for (uint32_t c = 0; c < HOST_CPUS; c++) {
        if (!may_run(p, c, m->empty[i]) || (m->seen[c / 8] >> (c % 8) & 1u))
            continue;
        m->seen[c / 8] |= (uint8_t)(1u << c % 8);
        if (m->owner[c] < 0 || augment(m, (uint32_t)m->owner[c])) {
            m->owner[c] = (int32_t)i;
            return true;
        }
    }
    return false;
}

void ccq_world_heartbeat(const ccq_world_proc *procs, uint32_t n, uint32_t *heartbeat_ms,
                         uint32_t *heartbeat_timeout_ms)
{
    uint32_t hb = 0, to = 0;
    for (uint32_t p = 0; p < n; p++) {
        if (procs[p].heartbeat_ms == 0) {
            *heartbeat_ms = *heartbeat_timeout_ms = 0;
            return;
        }
        hb = procs[p].heartbeat_ms > hb ? procs[p].heartbeat_ms : hb;
        to = procs[p].heartbeat_timeout_ms > to ? procs[p].heartbeat_timeout_ms : to;
    }
    *heartbeat_ms = hb;
    *heartbeat_timeout_ms = to;
}

bool ccq_world_crowded(const ccq_world_proc *procs, uint32_t n, uint32_t me, uint32_t host_cpus)
{
    uint32_t *local = malloc((size_t)n * sizeof *local), nlocal, together = 0;
    bool *empty = malloc((size_t)n * sizeof *empty), crowded = false;
    uint8_t any[CCQ_CPU_SET_BYTES] = {0};
    matching *m = malloc(sizeof *m);

    if (local == NULL || empty == NULL || m == NULL) { /* as a process alone would judge it */
        crowded = n > (procs[me].cores ? procs[me].cores : 1u);
        goto out;
    }
    nlocal = host_procs(procs, n, me, local);
    for (uint32_t i = 0; i < nlocal; i++) {
        empty[i] = set_count(&procs[local[i]]) == 0;
        any[0] |= empty[i] ? 1u : 0u;
        for (uint32_t b = 0; b < CCQ_CPU_SET_BYTES; b++)
            any[b] |= procs[local[i]].cpus[b];
    }
    for (uint32_t c = 0; c < HOST_CPUS; c++)
        together += any[c / 8] >> (c % 8) & 1u;
    if (host_cpus > 0 && together > host_cpus)
        together = host_cpus;
    /* Fewer cores than processes: crowded without looking further (many processes, few
     * cores: the matching's cost is then never paid). */
    crowded = nlocal > together;
    if (!crowded) {
        m->procs = procs;
        m->local = local;
        m->empty = empty;
        for (uint32_t c = 0; c < HOST_CPUS; c++)
            m->owner[c] = -1;
        for (uint32_t i = 0; i < nlocal && !crowded; i++) {
            memset(m->seen, 0, sizeof m->seen);
            crowded = !augment(m, i);
        }
    }
out:
    free(local);
    free(empty);
    free(m);
    return crowded;
}

/* A process of the host in the order ccq_world_home_core serves them: the most confined first
 * (fewer cores in its set), then the lower world rank. */
typedef struct confined {
    uint32_t cores, p;
} confined;

static int confined_first(const void *a, const void *b)
{
    const confined *x = a, *y = b;
    if (x->cores != y->cores)
        return x->cores < y->cores ? -1 : 1;
    return x->p < y->p ? -1 : x->p > y->p; /* total: qsort need not be stable */
}

int ccq_world_home_core(const ccq_world_proc *procs, uint32_t n, uint32_t me)
{
    uint32_t *local = malloc((size_t)n * sizeof *local), *taken = calloc(HOST_CPUS, sizeof *taken);
    confined *order = malloc((size_t)n * sizeof *order);
    uint32_t nlocal;
    int home = -1;

    if (local == NULL || taken == NULL || order == NULL) { /* its first core */
        for (uint32_t c = 0; c < HOST_CPUS && home < 0; c++)
            home = has_cpu(&procs[me], c) ? (int)c : -1;
        goto out;
    }
    nlocal = host_procs(procs, n, me, local);
    for (uint32_t i = 0; i < nlocal; i++)
        order[i] = (confined){set_count(&procs[local[i]]), local[i]};
    qsort(order, nlocal, sizeof *order, confined_first);
    for (uint32_t i = 0; i < nlocal; i++) {
        const ccq_world_proc *p = &procs[order[i].p];
        int best = -1;
        for (uint32_t c = 0; c < HOST_CPUS; c++)
            if (has_cpu(p, c) && (best < 0 || taken[c] < taken[best]))
                best = (int)c;
        if (best >= 0)
            taken[best]++;
        if (order[i].p == me) {
            home = best;
            break;
        }
    }
out:
    free(local);
    free(taken);
    free(order);
    return home;
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

/* Wait for exchange x (posted by the caller). On a timeout the bootstrap's own detail names
 * the processes that never arrived and adds what its mechanism knows (MPI: the duplication
 * of the communicator still pending; tcp: not connected to the rendezvous). */
static ccq_status world_wait(ccq_world *w, ccq_boot_xchg *x, void *all, uint64_t deadline,
                             const char *what)
{
    ccq_errbuf err = {{0}};
    ccq_status st = ccq_boot_xchg_wait(x, all, deadline, &err);

    if (st == CCQ_ERR_TIMEOUT)
        return ccq_fail(CCQ_ERR_TIMEOUT,
                        "process %" PRIu32 " of a world of %" PRIu32
                        " waited timeout_ms for the others: %s",
                        w->rank, w->size, err.msg);
    if (st != CCQ_OK)
        return ccq_fail(st, "%s failed: %s", what, err.msg);
    return CCQ_OK;
}

/* The second exchange: every process's backend blob, padded to the longest (every process
 * knows every length from the first). */
static ccq_status world_blobs(ccq_world *w, const world_hello *all, const void *blob,
                              size_t blob_len, uint32_t *members, uint64_t deadline)
{
    size_t max = 0;
    unsigned char *mine;
    ccq_boot_xchg *x = NULL;
    ccq_errbuf err = {{0}};
    ccq_status st;

    for (uint32_t p = 0; p < w->size; p++)
        max = all[p].blob_len > max ? all[p].blob_len : max;
    if (max == 0)
        return CCQ_OK;
    mine = calloc(1, max);
    w->blob = calloc(w->size, sizeof *w->blob);
    w->blob_len = calloc(w->size, sizeof *w->blob_len);
    w->blob_data = malloc(max * w->size);
    if (mine == NULL || w->blob == NULL || w->blob_len == NULL || w->blob_data == NULL) {
        free(mine);
        return ccq_fail(CCQ_ERR_NO_MEMORY, "out of memory for the world's backend blobs");
    }
    if (blob_len > 0)
        memcpy(mine, blob, blob_len);
    for (uint32_t p = 0; p < w->size; p++)
        members[p] = p;
    st = ccq_boot_xchg_post(w->boot, "world/backend", members, w->size, mine, max, &x, &err);
    free(mine);
    if (st != CCQ_OK)
        return ccq_fail(st, "the world's backend exchange could not start: %s", err.msg);
    st = world_wait(w, x, w->blob_data, deadline, "the world's backend exchange");
    ccq_boot_xchg_free(x);
    if (st != CCQ_OK)
        return st;
    for (uint32_t p = 0; p < w->size; p++) {
        w->blob[p] = all[p].blob_len > 0 ? w->blob_data + (size_t)p * max : NULL;
        w->blob_len[p] = all[p].blob_len;
    }
    return CCQ_OK;
}

void ccq_world_drop_blobs(ccq_world *w)
{
    free(w->blob);
    free(w->blob_len);
    free(w->blob_data);
    w->blob = NULL;
    w->blob_len = NULL;
    w->blob_data = NULL;
}

ccq_status ccq_world_setup(ccq_world *w, const ccq_config *cfg, const char *backend,
                           uint32_t local_devices, const void *blob, size_t blob_len,
                           uint64_t timeout_ns)
{
    world_hello mine, *all = NULL;
    uint32_t *members = NULL;
    ccq_boot_xchg *x = NULL;
    ccq_errbuf err = {{0}};
    ccq_status st;
    uint64_t total = 0;
    uint64_t deadline = timeout_ns == UINT64_MAX ? 0 : ccq_deadline_in(timeout_ns);

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
    mine.blob_len = (uint32_t)blob_len;
    ccq_health_identity(&mine.proc);
    mine.proc.cores = ccq_usable_cpu_set(mine.proc.cpus);
    mine.proc.heartbeat_ms = cfg->heartbeat_ms;
    mine.proc.heartbeat_timeout_ms = ccq_heartbeat_timeout_ms(cfg);
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
    st = world_wait(w, x, all, deadline, "the world exchange");
    if (st != CCQ_OK)
        goto fail;
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
        if (h->blob_len > CCQ_BE_WORLD_BLOB_MAX) {
            st = ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                          "process %" PRIu32 " announces a backend blob of %" PRIu32
                          " bytes (at most %u)",
                          p, h->blob_len, CCQ_BE_WORLD_BLOB_MAX);
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
    {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        w->crowded =
            ccq_world_crowded(w->procs, w->size, w->rank, online > 0 ? (uint32_t)online : 0);
    }
    ccq_boot_xchg_free(x);
    x = NULL;
    st = world_blobs(w, all, blob, blob_len, members, deadline);
    if (st != CCQ_OK)
        goto fail;
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
    ccq_world_drop_blobs(w);
    if (w->boot != NULL)
        ccq_boot_close(w->boot);
    free(w->first);
    free(w->procs);
    memset(w, 0, sizeof *w);
}
