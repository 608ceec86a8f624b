/* The opt-in cross-process signature check (ccq_config.check_signatures): before an
 * operation whose communicator spans processes runs, its member processes compare what each
 * submitted for that sequence number, through the bootstrap. Matching is local, so without it
 * a process that submitted another count or dtype would hang the engine or corrupt data; with
 * it, every part on every process fails with CCQ_ERR_MISMATCH naming the processes and the
 * fields. Scheduler thread only. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "runtime/boot/bootstrap.h"
#include "runtime/internal.h"

#define SIG_MAGIC 0x53696753u /* "SigS" */

/* What one process says about an operation: the fields its parts agreed on locally. */
typedef struct sig_record {
    uint32_t magic;
    uint8_t kind, dtype, redop, pad;
    uint32_t root; /* rooted kinds: the root's global device id; else 0 */
    uint64_t count;
    uint32_t first_rank, nranks; /* which ranks of the communicator this process holds */
} sig_record;

static void sig_of(const ccq_inst *i, sig_record *r)
{
    const ccq_cmd *c = i->cmds[0];
    const ccq_kind_info *k = &ccq_kinds[c->kind];
    memset(r, 0, sizeof *r);
    r->magic = SIG_MAGIC;
    /* A send/recv pair across processes: one half here, the other there; they must agree
     * on count and dtype only (their kinds differ by construction). */
    r->kind = k->collective ? c->kind : CCQ_KIND_SEND;
    r->dtype = c->dtype;
    r->redop = k->reduces ? c->redop : 0;
    r->root = k->rooted ? c->comm->devices[c->root] : 0;
    r->count = c->count;
    r->first_rank = c->comm->first_local;
    r->nranks = c->comm->nlocal;
}

ccq_status ccq_sig_post(ccq_runtime *rt, ccq_inst *i, char *why, size_t len)
{
    ccq_comm *comm = i->chan->comm;
    sig_record mine;
    ccq_errbuf err = {{0}};
    char tag[160];
    size_t w;

    sig_of(i, &mine);
    w = ccq_format(tag, sizeof tag, "sig/");
    ccq_comm_tag(comm, tag + w, sizeof tag - w);
    w = strlen(tag);
    ccq_format(tag + w, sizeof tag - w, "/%u/%" PRIu64, i->chan->id, i->seq);
    ccq_status st = ccq_boot_xchg_post(rt->world.boot, tag, comm->procs, comm->nprocs, &mine,
                                       sizeof mine, &i->sig_xchg, &err);
    if (st != CCQ_OK) {
        i->sig_xchg = NULL;
        ccq_format(why, len, "the cross-process signature check could not start: %s", err.msg);
    }
    return st;
}

static size_t field_text(char *buf, size_t len, const sig_record *r, int f)
{
    switch (f) {
    case 0:
        return ccq_format(buf, len, "%s", ccq_kind_name(r->kind));
    case 1:
        return ccq_format(buf, len, "%" PRIu64, r->count);
    case 2:
        return ccq_format(buf, len, "%s", ccq_dtype_name((ccq_dtype)r->dtype));
    case 3:
        return ccq_format(buf, len, "%s", ccq_reduce_op_name((ccq_reduce_op)r->redop));
    default:
        return ccq_format(buf, len, "device %u", r->root);
    }
}

static bool field_differs(const sig_record *a, const sig_record *b, int f)
{
    switch (f) {
    case 0:
        return a->kind != b->kind;
    case 1:
        return a->count != b->count;
    case 2:
        return a->dtype != b->dtype;
    case 3:
        return a->kind == b->kind && ccq_kinds[a->kind].reduces && a->redop != b->redop;
    default:
        return a->kind == b->kind && ccq_kinds[a->kind].rooted && a->root != b->root;
    }
}

static size_t ranks_text(char *buf, size_t len, const sig_record *r)
{
    if (r->nranks == 1)
        return ccq_format(buf, len, "rank %u", r->first_rank);
    return ccq_format(buf, len, "ranks %u-%u", r->first_rank, r->first_rank + r->nranks - 1);
}

ccq_status ccq_sig_test(ccq_runtime *rt, ccq_inst *i, char *why, size_t len)
{
    static const char *const fields[] = {"kind", "count", "dtype", "op", "root"};
    ccq_comm *comm = i->chan->comm;
    sig_record all[CCQ_MAX_DEVICES];
    ccq_errbuf err = {{0}};
    ccq_status st;
    size_t w = 0;
    bool bad = false;
    (void)rt;

    if (comm->nprocs > CCQ_MAX_DEVICES) /* cannot happen: each process owns a device */
        return CCQ_ERR_BACKEND;
    st = ccq_boot_xchg_test(i->sig_xchg, all, &err);
    if (st == CCQ_IN_PROGRESS)
        return st;
    ccq_boot_xchg_free(i->sig_xchg);
    i->sig_xchg = NULL;
    if (st != CCQ_OK) {
        ccq_format(why, len, "the cross-process signature check failed: %s", err.msg);
        return st;
    }
    /* Compare every process with the lowest, field by field, naming processes and ranks. */
    for (int f = 0; f < 5; f++) {
        for (uint32_t p = 1; p < comm->nprocs; p++) {
            if (all[p].magic != SIG_MAGIC) {
                ccq_format(why, len, "process %u sent a malformed signature record",
                           comm->procs[p]);
                return CCQ_ERR_MISMATCH;
            }
            if (!field_differs(&all[0], &all[p], f))
                continue;
            if (!bad)
                w += ccq_format(why + w, len - w, "parts do not match across processes:");
            bad = true;
            w += ccq_format(why + w, len - w, " %s: process %u (", fields[f], comm->procs[0]);
            w += ranks_text(why + w, len - w, &all[0]);
            w += ccq_format(why + w, len - w, ") ");
            w += field_text(why + w, len - w, &all[0], f);
            w += ccq_format(why + w, len - w, ", process %u (", comm->procs[p]);
            w += ranks_text(why + w, len - w, &all[p]);
            w += ccq_format(why + w, len - w, ") ");
            w += field_text(why + w, len - w, &all[p], f);
            w += ccq_format(why + w, len - w, ";");
        }
    }
    if (bad && w > 0 && why[w - 1] == ';')
        why[w - 1] = '\0';
    return bad ? CCQ_ERR_MISMATCH : CCQ_OK;
}

void ccq_sig_cancel(ccq_inst *i)
{
    if (i->sig_xchg != NULL)
        ccq_boot_xchg_free(i->sig_xchg);
    i->sig_xchg = NULL;
}

void ccq_sig_missing(ccq_inst *i, char *buf, size_t len)
{
    uint32_t miss[256];
    size_t n = i->sig_xchg ? ccq_boot_xchg_missing(i->sig_xchg, miss, 256) : 0;
    size_t w = ccq_format(buf, len, "%s ", n == 1 ? "process" : "processes");
    ccq_boot_format_ranks(buf + w, len - w, miss, n < 256 ? n : 256);
}
