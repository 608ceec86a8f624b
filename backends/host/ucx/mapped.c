/* Mapped scratch: engine scratch that the other processes of this machine read in place
 * (UCX's ucp_mem_map + ucp_rkey_ptr over its shared-memory transports), for the mapped
 * all_reduce (ucx/allreduce_mapped.c). Both sides of it are here: a process's regions (made,
 * lent to one operation at a time, kept for the next or let go), and its view of the peers'
 * regions (their packed keys unpacked once and the local address cached, referenced by the
 * operations reading them: a mapping in use is never let go).
 *
 * Only engine scratch is ever mapped: a peer reads what this process copied there for it,
 * never a user buffer. A region goes back to the free list only after an operation that
 * succeeded, which means every member said it finished reading it (the schedule's last
 * message); after a failure it is let go (ucp_mem_unmap): a peer that had attached it keeps
 * its own mapping of the same memory until it lets go too (the kernel frees shared memory
 * once its last mapping goes), so a late reader reads that operation's bytes, never a later
 * operation's. A peer's region that died with its process stays readable here the same way
 * (docs/results/2026-12-07/copy-floor/rkey_ptr_check.c). */
#define _POSIX_C_SOURCE 200809L /* open_memstream, strtok_r */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <ucs/sys/uid.h>

#include "backends/host/ucx/ucx.h"

/* Regions kept for reuse beyond the ones lent out: one operation at a time is the common case
 * (a batch's large all_reduces run one after another on a communicator's ring of segments). */
#define REGIONS_KEPT 2u

static uint64_t ns_inode(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static uint32_t shm_kind(const char *name)
{
    return strcmp(name, "sysv") == 0    ? UCX_SHM_SYSV
           : strcmp(name, "posix") == 0 ? UCX_SHM_POSIX
                                        : 0;
}

/* The kinds: UCX says neither through its API, but prints both, as `ucx_info -p -u mr` and
 * `ucx_info -m SIZE -u mr` do: the memory domains its context has ("md N : component M sysv"), and
 * what ucp_mem_map(ALLOCATE) made a region of that size with ("allocated ... with sysv, ..."),
 * which follows its ALLOC_PRIO (SysV first where its transport is selected, then POSIX). What
 * cannot be read from them counts as no kind: that process then does not map, never fails. */
void ucx_shm_scope_here(ucp_context_h ctx, size_t region_bytes, ucx_shm_scope *s)
{
    char *text = NULL, *save = NULL, size[32];
    size_t len = 0;
    FILE *f;

    *s = (ucx_shm_scope){.system_id = ucs_get_system_id(),
                         .ipc_ns = ns_inode("/proc/self/ns/ipc"),
                         .pid_ns = ns_inode("/proc/self/ns/pid")};
    if (region_bytes == 0 || (f = open_memstream(&text, &len)) == NULL)
        return; /* no kind asked for (this process does not map), or no way to read it */
    snprintf(size, sizeof size, "%zu", region_bytes);
    ucp_context_print_info(ctx, f);
    ucp_mem_print_info(size, ctx, f);
    if (fclose(f) != 0 || text == NULL) {
        free(text);
        return;
    }
    for (char *line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        unsigned md, component;
        char name[32];
        const char *with = strstr(line, " with ");
        if (sscanf(line, "# md %u : component %u %31s", &md, &component, name) == 3)
            s->read_kinds |= shm_kind(name);
        else if (strstr(line, "allocated ") != NULL && with != NULL &&
                 sscanf(with, " with %31[^, ]", name) == 1)
            s->alloc_kind = shm_kind(name);
    }
    free(text);
}

static void region_free(ucx_engine *e, ucx_region *r)
{
    if (r->rkey != NULL)
        ucp_rkey_buffer_release(r->rkey);
    if (r->mh != NULL)
        ucp_mem_unmap(e->ctx, r->mh);
    free(r);
}

ucx_region *ucx_region_get(ucx_engine *e, size_t len, ccq_errbuf *err)
{
    ucp_mem_map_params_t mp;
    ucp_mem_attr_t ma;
    ucs_status_t us;
    ucx_region *r;

    for (ucx_region **pp = &e->regions; *pp != NULL; pp = &(*pp)->next)
        if ((*pp)->len >= len) {
            r = *pp;
            *pp = r->next;
            e->nregions--;
            r->next = NULL;
            return r;
        }
    r = calloc(1, sizeof *r);
    if (r == NULL) {
        snprintf(err->msg, sizeof err->msg, "out of memory");
        return NULL;
    }
    memset(&mp, 0, sizeof mp);
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.address = NULL;
    mp.length = len;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    us = ucp_mem_map(e->ctx, &mp, &r->mh);
    if (us == UCS_OK) {
        ma.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
        us = ucp_mem_query(r->mh, &ma);
    }
    if (us == UCS_OK)
        us = ucp_rkey_pack(e->ctx, r->mh, &r->rkey, &r->rkey_len);
    if (us == UCS_OK && r->rkey_len > UCX_MAP_RKEY_MAX)
        us = UCS_ERR_EXCEEDS_LIMIT;
    if (us != UCS_OK) {
        snprintf(err->msg, sizeof err->msg,
                 "UCX cannot map %zu bytes of scratch for the other processes of this machine "
                 "(%s%s); CCQ_UCX_MAPPED_BYTES=0 turns the mapped all_reduce off",
                 len, ucs_status_string(us),
                 us == UCS_ERR_EXCEEDS_LIMIT ? ": its key is too long" : "");
        region_free(e, r);
        return NULL;
    }
    r->base = ma.address;
    r->len = ma.length;
    r->id = ++e->region_ids;
    return r;
}

void ucx_region_put(ucx_engine *e, ucx_region *r, bool reuse)
{
    if (r == NULL)
        return;
    if (!reuse || e->nregions >= REGIONS_KEPT) {
        region_free(e, r);
        return;
    }
    r->next = e->regions;
    e->regions = r;
    e->nregions++;
}

void ucx_region_say(const ucx_region *r, size_t slot, size_t bytes, ucx_map_msg *m)
{
    memset(m, 0, sizeof *m);
    m->id = r->id;
    m->rkey_len = (uint32_t)r->rkey_len;
    m->base = (uint64_t)(uintptr_t)r->base;
    m->len = r->len;
    m->slot = slot;
    m->bytes = bytes;
    memcpy(m->rkey, r->rkey, r->rkey_len);
}

/* Unreferenced peer regions kept attached (each a mapping of a peer's region): beyond them the
 * least recently used goes (its mapping let go). */
#define PEER_MAPS_KEPT 16u

int32_t ucx_region_attach(ucx_engine *e, uint32_t wrank, const ucx_map_msg *m, ccq_errbuf *err)
{
    ucx_peer *p = &e->peers[wrank];
    uint32_t at, lru = UINT32_MAX;
    ucp_rkey_h rkey;
    ucs_status_t us;
    void *local;

    if (m->rkey_len == 0 || m->rkey_len > UCX_MAP_RKEY_MAX) {
        snprintf(err->msg, sizeof err->msg,
                 "process %u's mapped scratch comes with a key of %" PRIu32 " bytes (1 to %u): "
                 "the processes run different ccq versions?",
                 wrank, m->rkey_len, UCX_MAP_RKEY_MAX);
        return -1;
    }
    for (uint32_t i = 0; i < e->nmaps; i++) {
        ucx_peer_map *q = &e->maps[i];
        if (q->wrank == wrank && q->id == m->id) {
            q->refs++;
            q->used = ++e->map_clock;
            return (int32_t)i;
        }
        if (q->refs == 0 && (lru == UINT32_MAX || q->used < e->maps[lru].used))
            lru = i;
    }
    if (p->ep == NULL) {
        snprintf(err->msg, sizeof err->msg, "internal: no endpoint to process %u", wrank);
        return -1;
    }
    us = ucp_ep_rkey_unpack(p->ep, m->rkey, &rkey);
    if (us == UCS_OK) {
        us = ucp_rkey_ptr(rkey, m->base, &local);
        if (us != UCS_OK)
            ucp_rkey_destroy(rkey);
    }
    if (us != UCS_OK) {
        snprintf(err->msg, sizeof err->msg,
                 "process %u's mapped scratch cannot be read from here (UCX: %s): the mapped "
                 "all_reduce needs UCX's shared memory between the processes of a machine "
                 "(UCX_TLS), or CCQ_UCX_MAPPED_BYTES=0 in every process",
                 wrank, ucs_status_string(us));
        return -1;
    }
    if (e->nmaps >= PEER_MAPS_KEPT && lru != UINT32_MAX) {
        at = lru; /* no operation uses it: its peer let that region go, or it is the oldest */
        ucp_rkey_destroy(e->maps[at].rkey);
    } else {
        if (e->nmaps == e->maps_cap) {
            uint32_t cap = e->maps_cap ? 2 * e->maps_cap : PEER_MAPS_KEPT;
            ucx_peer_map *grown = realloc(e->maps, cap * sizeof *grown);
            if (grown == NULL) {
                ucp_rkey_destroy(rkey);
                snprintf(err->msg, sizeof err->msg, "out of memory");
                return -1;
            }
            e->maps = grown;
            e->maps_cap = cap;
        }
        at = e->nmaps++;
    }
    e->maps[at] = (ucx_peer_map){.wrank = wrank,
                                 .id = m->id,
                                 .refs = 1,
                                 .rkey = rkey,
                                 .local = local,
                                 .used = ++e->map_clock};
    return (int32_t)at;
}

void ucx_region_detach(ucx_engine *e, int32_t at)
{
    if (at >= 0 && (uint32_t)at < e->nmaps && e->maps[at].refs > 0)
        e->maps[at].refs--;
}

void ucx_maps_release(ucx_engine *e)
{
    for (uint32_t i = 0; i < e->nmaps; i++)
        ucp_rkey_destroy(e->maps[i].rkey);
    free(e->maps);
    e->maps = NULL;
    e->nmaps = e->maps_cap = 0;
}

void ucx_regions_release(ucx_engine *e)
{
    while (e->regions != NULL) {
        ucx_region *r = e->regions;
        e->regions = r->next;
        region_free(e, r);
    }
    e->nregions = 0;
}
