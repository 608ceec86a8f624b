/* Forming a communicator, without ever blocking the scheduler (as UCC's team_create_post and
 * team_create_test): a communicator spanning processes first meets its member processes
 * through the bootstrap (which also carries the bytes the backend needs from the lowest
 * member, NCCL's unique id), then the backend creates it, possibly in the background. The
 * scheduler calls these on its thread and keeps running other streams meanwhile. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/boot/bootstrap.h"
#include "runtime/internal.h"

/* What every member process contributes to the meeting: enough to check that they form the
 * same communicator, and the lowest member's blob for the backend. */
#define FORM_MAGIC 0x6d726f46u /* "Form" */
typedef struct form_hello {
    uint32_t magic;
    uint32_t n;
    uint64_t hash;
    uint32_t first_device, last_device;
    uint32_t blob_len;
    uint64_t fusion_bytes; /* its ccq_config.fusion_bytes: the communicator uses the smallest */
    uint8_t blob[CCQ_BE_ROOT_BLOB_MAX];
    ccq_be_member_blob member; /* the backend's comm_member_blob, from every member */
    /* The communicator this process would shrink to make this one (a communicator that lost
     * member processes, whose other devices are all theirs: see shrink_parent), 0 if none.
     * When every member names the same one, it is shrunk (NCCL: ncclCommShrink). */
    uint64_t parent_hash;
    uint32_t parent_n, parent_first, parent_last, reserved;
} form_hello;

static ccq_status form_fail(ccq_comm *c, ccq_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static ccq_status form_fail(ccq_comm *c, ccq_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->init_detail, sizeof c->init_detail, fmt, ap);
    va_end(ap);
    c->init_status = st;
    if (c->xchg != NULL) {
        ccq_boot_xchg_free(c->xchg);
        c->xchg = NULL;
    }
    c->form_step = CCQ_FORM_DONE;
    return st;
}

/* The rank of each member process's first device (ranks are contiguous per process, and
 * processes ascend with ranks): out[nprocs + 1]. */
static void proc_first_ranks(const ccq_runtime *rt, const ccq_comm *c, uint32_t *out)
{
    uint32_t p = 0;
    for (uint32_t r = 0; r < c->n && p < c->nprocs; r++)
        if (ccq_world_owner(&rt->world, c->devices[r]) == c->procs[p])
            out[p++] = r;
    while (p < c->nprocs) /* cannot happen: every member owns a device */
        out[p++] = c->n;
    out[c->nprocs] = c->n;
}

/* The communicator c can be shrunk from (runtime/health/): one that lost member processes,
 * that the backend revoked rather than aborted, whose devices are c's plus only devices of lost
 * processes (so every rank it keeps belongs to a member of c); the smallest such, the same
 * choice in every member. NULL: none (c is made by a fresh init). Scheduler thread. */
static ccq_comm *shrink_parent(ccq_runtime *rt, const ccq_comm *c)
{
    ccq_comm *best = NULL;

    if (rt->be_ops->comm_shrink == NULL || rt->be_ops->comm_shrinkable == NULL ||
        rt->health == NULL)
        return NULL;
    pthread_mutex_lock(&rt->comm_lock);
    uint32_t n = atomic_load_explicit(&rt->ncomms, memory_order_acquire);
    for (uint32_t k = 0; k < n; k++) {
        ccq_comm *p = rt->comms[k];
        uint32_t j = 0;
        bool ok = true;
        if (p == c || p->be == NULL || p->n <= c->n || p->nprocs < 2 ||
            !atomic_load_explicit(&p->lost, memory_order_relaxed) ||
            !rt->be_ops->comm_shrinkable(rt->be, p->be))
            continue;
        for (uint32_t r = 0; r < p->n && ok; r++) {
            if (j < c->n && c->devices[j] == p->devices[r])
                j++;
            else
                ok = ccq_health_state(rt, ccq_world_owner(&rt->world, p->devices[r])) ==
                     CCQ_PROCESS_LOST;
        }
        if (ok && j == c->n &&
            (best == NULL || p->n < best->n || (p->n == best->n && p->hash < best->hash)))
            best = p;
    }
    pthread_mutex_unlock(&rt->comm_lock);
    return best;
}

/* The backend's description of c (local devices into `local`, the member processes' first
 * ranks into pf[nprocs + 1]). */
static void comm_desc(ccq_runtime *rt, const ccq_comm *c, ccq_device_id *local, uint32_t *pf,
                      ccq_be_comm_desc *d)
{
    proc_first_ranks(rt, c, pf);
    for (uint32_t i = 0; i < c->nlocal; i++)
        local[i] = ccq_backend_device(rt, c->devices[c->first_local + i]);
    memset(d, 0, sizeof *d);
    d->nranks = c->n;
    d->first_rank = c->first_local;
    d->nlocal = c->nlocal;
    d->local_devices = local;
    d->nprocs = c->nprocs;
    d->procs = c->procs;
    d->proc_first = pf;
    d->world_rank = rt->world.rank;
}

/* Shrink parent p into c: its ranks whose devices are not c's are left out (members: what
 * each member process told the others when they met, as for a fresh init). */
static ccq_status form_shrink(ccq_runtime *rt, ccq_comm *c, ccq_comm *p,
                              const ccq_be_member_blob *members)
{
    ccq_device_id local[CCQ_MAX_DEVICES];
    uint32_t *exclude = malloc(p->n * sizeof *exclude), nexcl = 0, j = 0;
    uint32_t *pf = malloc((c->nprocs + 1) * sizeof *pf);
    ccq_be_comm_desc d;
    ccq_errbuf err = {{0}};
    ccq_status st;

    if (exclude == NULL || pf == NULL) {
        free(exclude);
        free(pf);
        return form_fail(c, CCQ_ERR_NO_MEMORY, "out of memory");
    }
    for (uint32_t r = 0; r < p->n; r++) {
        if (j < c->n && c->devices[j] == p->devices[r])
            j++;
        else
            exclude[nexcl++] = r;
    }
    comm_desc(rt, c, local, pf, &d);
    d.member_blobs = members;
    st = rt->be_ops->comm_shrink(rt->be, p->be, exclude, nexcl, &d, &c->be, &err);
    free(exclude);
    free(pf);
    if (st == CCQ_IN_PROGRESS) {
        c->form_step = CCQ_FORM_BACKEND;
        return st;
    }
    if (st != CCQ_OK) {
        c->be = NULL;
        return form_fail(c, st, "shrinking the communicator it survives: %s", err.msg);
    }
    c->form_step = CCQ_FORM_DONE;
    return CCQ_OK;
}

/* Ask the backend; CCQ_IN_PROGRESS leaves it to ccq_comm_form_test. */
static ccq_status form_backend(ccq_runtime *rt, ccq_comm *c, const void *blob, size_t blob_len,
                               const ccq_be_member_blob *members)
{
    ccq_device_id local[CCQ_MAX_DEVICES];
    ccq_be_comm_desc d;
    ccq_errbuf err = {{0}};
    ccq_status st;
    uint32_t *pf = malloc((c->nprocs + 1) * sizeof *pf);

    if (pf == NULL)
        return form_fail(c, CCQ_ERR_NO_MEMORY, "out of memory forming a communicator");
    comm_desc(rt, c, local, pf, &d);
    d.root_blob = blob;
    d.root_blob_len = blob_len;
    d.fusion_bytes = c->fusion_bytes;
    d.member_blobs = members;
    st = rt->be_ops->comm_create(rt->be, &d, &c->be, &err);
    free(pf);
    if (st == CCQ_IN_PROGRESS) {
        c->form_step = CCQ_FORM_BACKEND;
        return st;
    }
    if (st != CCQ_OK) {
        c->be = NULL;
        return form_fail(c, st, "%s", err.msg);
    }
    c->form_step = CCQ_FORM_DONE;
    return CCQ_OK;
}

void ccq_comm_tag(const ccq_comm *c, char *tag, size_t len)
{
    /* Every member computes the same tag from the set; the devices at both ends and the
     * size make a collision of the hash harmless in practice. */
    snprintf(tag, len, "comm/%016" PRIx64 "/%" PRIu32 "/%" PRIu32 "-%" PRIu32, c->hash, c->n,
             c->devices[0], c->devices[c->n - 1]);
}

ccq_status ccq_comm_form_start(ccq_runtime *rt, ccq_comm *c, uint64_t now)
{
    form_hello mine;
    char tag[96], why[CCQ_DETAIL_LEN];
    ccq_status st;

    c->form_deadline = ccq_add_sat(now, rt->timeout_ns);
    c->fusion_bytes = rt->cfg.fusion_bytes;
    if (c->nprocs <= 1)
        return form_backend(rt, c, NULL, 0, NULL);
    if (ccq_health_comm_lost(rt, c, why, sizeof why)) /* a member is gone: never meets */
        return form_fail(c, CCQ_ERR_PROCESS_LOST, "%s", why);
    if (rt->span_status != CCQ_OK) /* the backend said so at world_ready: no meeting */
        return form_fail(c, rt->span_status, "%s", rt->span_detail);
    if (rt->be_ops->comm_root_blob == NULL)
        return form_fail(c, CCQ_ERR_UNSUPPORTED,
                         "backend \"%s\" cannot span processes (this communicator spans %" PRIu32
                         ")",
                         rt->be_ops->name, c->nprocs);
    memset(&mine, 0, sizeof mine);
    mine.magic = FORM_MAGIC;
    mine.n = c->n;
    mine.hash = c->hash;
    mine.first_device = c->devices[0];
    mine.last_device = c->devices[c->n - 1];
    mine.fusion_bytes = rt->cfg.fusion_bytes;
    ccq_device_id local[CCQ_MAX_DEVICES];
    ccq_be_comm_desc d;
    uint32_t *pf = malloc((c->nprocs + 1) * sizeof *pf);
    if (pf == NULL)
        return form_fail(c, CCQ_ERR_NO_MEMORY, "out of memory forming a communicator");
    comm_desc(rt, c, local, pf, &d);
    if (rt->world.rank == c->procs[0]) {
        ccq_errbuf err = {{0}};
        size_t len = sizeof mine.blob;
        st = rt->be_ops->comm_root_blob(rt->be, &d, mine.blob, &len, &err);
        if (st != CCQ_OK) {
            free(pf);
            return form_fail(c, st, "%s", err.msg);
        }
        mine.blob_len = (uint32_t)len;
    }
    if (rt->be_ops->comm_member_blob != NULL) {
        ccq_errbuf err = {{0}};
        st = rt->be_ops->comm_member_blob(rt->be, &d, &mine.member, &err);
        if (st == CCQ_OK && mine.member.len > CCQ_BE_MEMBER_BLOB_MAX) {
            st = CCQ_ERR_BACKEND;
            snprintf(err.msg, sizeof err.msg, "the backend's member blob is too long");
        }
        if (st != CCQ_OK) {
            free(pf);
            return form_fail(c, st, "%s", err.msg);
        }
    }
    free(pf);
    c->shrink_from = shrink_parent(rt, c);
    if (c->shrink_from != NULL) {
        mine.parent_hash = c->shrink_from->hash;
        mine.parent_n = c->shrink_from->n;
        mine.parent_first = c->shrink_from->devices[0];
        mine.parent_last = c->shrink_from->devices[c->shrink_from->n - 1];
    }
    ccq_comm_tag(c, tag, sizeof tag);
    ccq_errbuf err = {{0}};
    st = ccq_boot_xchg_post(rt->world.boot, tag, c->procs, c->nprocs, &mine, sizeof mine, &c->xchg,
                            &err);
    if (st != CCQ_OK)
        return form_fail(c, st, "%s", err.msg);
    c->form_step = CCQ_FORM_MEET;
    return CCQ_IN_PROGRESS;
}

/* The member processes that have not joined yet, as "processes 1,3-5". */
static void form_missing(ccq_comm *c, char *buf, size_t len)
{
    uint32_t miss[256];
    size_t n = ccq_boot_xchg_missing(c->xchg, miss, sizeof miss / sizeof miss[0]);
    size_t w = ccq_format(buf, len, "%s ", n == 1 ? "process" : "processes");
    ccq_boot_format_ranks(buf + w, len - w, miss, n);
}

static ccq_status form_meet_test(ccq_runtime *rt, ccq_comm *c, uint64_t now)
{
    form_hello *all = malloc(c->nprocs * sizeof *all);
    ccq_status st;
    char who[256], set[128];

    if (all == NULL)
        return CCQ_IN_PROGRESS; /* try again next pass */
    ccq_errbuf err = {{0}};
    st = ccq_boot_xchg_test(c->xchg, all, &err);
    if (st == CCQ_IN_PROGRESS) {
        free(all);
        if (now < c->form_deadline)
            return CCQ_IN_PROGRESS;
        form_missing(c, who, sizeof who);
        ccq_describe_comm(set, sizeof set, c);
        /* How the members are doing, from their heartbeats (runtime/health/): alive and
         * elsewhere, or gone. */
        char health[CCQ_DETAIL_LEN / 2];
        health[0] = '\0';
        ccq_health_describe_members(rt, c, 0, health, sizeof health);
        return form_fail(c, CCQ_ERR_TIMEOUT,
                         "communicator %s spanning processes of world ranks %" PRIu32 "..%" PRIu32
                         ": %s never joined it within timeout_ms (did they call ccq_comm_init, or "
                         "send/recv with this process?)%s",
                         set, c->procs[0], c->procs[c->nprocs - 1], who, health);
    }
    if (st != CCQ_OK) {
        free(all);
        return form_fail(c, st, "%s", err.msg);
    }
    for (uint32_t p = 0; p < c->nprocs; p++) {
        const form_hello *h = &all[p];
        if (h->magic != FORM_MAGIC || h->n != c->n || h->hash != c->hash ||
            h->first_device != c->devices[0] || h->last_device != c->devices[c->n - 1]) {
            free(all);
            return form_fail(c, CCQ_ERR_MISMATCH,
                             "process %" PRIu32 " formed another communicator under the same tag",
                             c->procs[p]);
        }
        /* Fusion must cut the same way in every member (backends/fuse.h): they all take the
         * smallest threshold, so a process with fusion off turns it off for the others. */
        if (h->fusion_bytes < c->fusion_bytes)
            c->fusion_bytes = h->fusion_bytes;
    }
    ccq_boot_xchg_free(c->xchg);
    c->xchg = NULL;
    ccq_be_member_blob *members = malloc(c->nprocs * sizeof *members);
    if (members == NULL) {
        free(all);
        return form_fail(c, CCQ_ERR_NO_MEMORY, "out of memory");
    }
    for (uint32_t p = 0; p < c->nprocs; p++) {
        members[p] = all[p].member;
        if (members[p].len > CCQ_BE_MEMBER_BLOB_MAX) {
            free(members);
            free(all);
            return form_fail(c, CCQ_ERR_BACKEND, "bad member blob from process %" PRIu32,
                             c->procs[p]);
        }
    }
    /* Every member names the same parent: shrink it (the same decision in every member, made
     * from the same records); otherwise a fresh init with the lowest member's blob. */
    bool shrink = c->shrink_from != NULL;
    for (uint32_t p = 0; p < c->nprocs && shrink; p++)
        shrink = all[p].parent_hash == all[0].parent_hash && all[p].parent_n == all[0].parent_n &&
                 all[p].parent_first == all[0].parent_first &&
                 all[p].parent_last == all[0].parent_last && all[p].parent_hash != 0;
    if (shrink) {
        free(all);
        st = form_shrink(rt, c, c->shrink_from, members);
        free(members);
        return st;
    }
    if (all[0].blob_len > CCQ_BE_ROOT_BLOB_MAX) {
        free(members);
        free(all);
        return form_fail(c, CCQ_ERR_BACKEND, "bad blob from process %" PRIu32, c->procs[0]);
    }
    st = form_backend(rt, c, all[0].blob, all[0].blob_len, members);
    free(members);
    free(all);
    return st;
}

ccq_status ccq_comm_form_test(ccq_runtime *rt, ccq_comm *c, uint64_t now)
{
    ccq_errbuf err = {{0}};
    ccq_status st;

    /* A member process lost while it forms: it never will (runtime/health/). */
    if ((c->form_step == CCQ_FORM_MEET || c->form_step == CCQ_FORM_BACKEND) &&
        ccq_health_comm_lost(rt, c, err.msg, sizeof err.msg)) {
        if (c->form_step == CCQ_FORM_BACKEND && c->be != NULL) {
            rt->be_ops->comm_destroy(rt->be, c->be);
            c->be = NULL;
        }
        return form_fail(c, CCQ_ERR_PROCESS_LOST, "%s", err.msg);
    }
    switch (c->form_step) {
    case CCQ_FORM_MEET:
        return form_meet_test(rt, c, now);
    case CCQ_FORM_BACKEND:
        st = rt->be_ops->comm_test(rt->be, c->be, &err);
        if (st == CCQ_OK)
            c->form_step = CCQ_FORM_DONE;
        if (st == CCQ_IN_PROGRESS && now >= c->form_deadline) {
            st = CCQ_ERR_TIMEOUT;
            snprintf(err.msg, sizeof err.msg,
                     "the backend did not create it within timeout_ms (a member process may "
                     "be stuck)");
        }
        if (st != CCQ_OK && st != CCQ_IN_PROGRESS) {
            rt->be_ops->comm_destroy(rt->be, c->be);
            c->be = NULL;
            return form_fail(c, st, "%s", err.msg);
        }
        return st;
    default:
        return c->init_status;
    }
}

void ccq_comm_form_cancel(ccq_runtime *rt, ccq_comm *c, const char *why)
{
    if (c->form_step == CCQ_FORM_BACKEND && c->be != NULL) {
        rt->be_ops->comm_destroy(rt->be, c->be);
        c->be = NULL;
    }
    form_fail(c, CCQ_ERR_SHUTDOWN, "%s", why);
}
