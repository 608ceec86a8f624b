/* The bootstrap's common part: opening a mechanism, exchanges (post, test, wait) and the
 * checks every received record goes through; the world from the environment. */
#define _GNU_SOURCE /* getrandom */
#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "backends/module.h"
#include "common/env.h"
#include "runtime/boot/boot_impl.h"

/* Boot handles this process opened so far per (job, world rank): see ccq_boot.gen. Keyed
 * by rank so that one process playing several ranks (tests, a store-based launcher of
 * threads) gives each its generation 0, as a process per rank would. */
typedef struct boot_gen {
    struct boot_gen *next;
    uint32_t rank, count;
    char job[256];
} boot_gen;
static pthread_mutex_t gen_lock = PTHREAD_MUTEX_INITIALIZER;
static boot_gen *gens;

/* The generation of the next open of (job, rank); taken (counted) when take is true. */
static uint32_t generation(const char *job, uint32_t rank, bool take)
{
    boot_gen *g;
    uint32_t n = 0;

    pthread_mutex_lock(&gen_lock);
    for (g = gens; g != NULL; g = g->next)
        if (g->rank == rank && strcmp(g->job, job) == 0)
            break;
    if (g != NULL)
        n = g->count;
    if (take) {
        if (g == NULL && (g = calloc(1, sizeof *g)) != NULL) {
            g->rank = rank;
            snprintf(g->job, sizeof g->job, "%s", job);
            g->next = gens;
            gens = g;
        }
        if (g != NULL)
            g->count++;
    }
    pthread_mutex_unlock(&gen_lock);
    return n;
}

uint64_t ccq_boot_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

size_t ccq_boot_format_ranks(char *buf, size_t len, const uint32_t *ranks, size_t n)
{
    size_t w = 0, shown = n > 16 ? 16 : n;
    int k;

    if (len == 0)
        return 0;
    buf[0] = '\0';
    for (size_t i = 0; i < shown && w < len; i++) {
        const char *sep = i == 0 ? "" : (i + 1 == shown && shown == n) ? " and " : ", ";
        k = snprintf(buf + w, len - w, "%s%u", sep, ranks[i]);
        if (k < 0)
            break;
        w += (size_t)k < len - w ? (size_t)k : len - w - 1;
    }
    if (shown < n && w < len) {
        k = snprintf(buf + w, len - w, " and %zu more", n - shown);
        if (k > 0)
            w += (size_t)k < len - w ? (size_t)k : len - w - 1;
    }
    return w;
}

/* ------------------------------------------------------------------------------------ */
/* The world and the job from the environment                                            */
/* ------------------------------------------------------------------------------------ */

/* A decimal integer in [0, 2^31]; false if absent; *bad when present but malformed. */
static bool env_u31(const char *name, uint32_t *out, bool *bad)
{
    uint64_t x;
    int r = ccq_env_u64(name, 0, 1ull << 31, &x);
    *bad = r < 0;
    if (r > 0)
        *out = (uint32_t)x;
    return r > 0;
}

ccq_status ccq_boot_world_from_env(uint32_t *rank, uint32_t *size, const char **err)
{
    /* One family at a time: mixing CCQ_WORLD_RANK with a launcher's size is a trap. */
    static const struct {
        const char *rank, *size;
        const char *bad_rank, *bad_size, *half, *range;
    } fam[] = {
        {"CCQ_WORLD_RANK", "CCQ_WORLD_SIZE",
         "CCQ_WORLD_RANK: expected a decimal integer below CCQ_WORLD_SIZE",
         "CCQ_WORLD_SIZE: expected a decimal integer in [1, 2^31]",
         "CCQ_WORLD_RANK and CCQ_WORLD_SIZE: set both or neither",
         "CCQ_WORLD_RANK: must be below CCQ_WORLD_SIZE"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
         "OMPI_COMM_WORLD_RANK: expected a decimal integer",
         "OMPI_COMM_WORLD_SIZE: expected a decimal integer in [1, 2^31]",
         "OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE: only one is set",
         "OMPI_COMM_WORLD_RANK: must be below OMPI_COMM_WORLD_SIZE"},
        {"PMI_RANK", "PMI_SIZE", "PMI_RANK: expected a decimal integer",
         "PMI_SIZE: expected a decimal integer in [1, 2^31]",
         "PMI_RANK and PMI_SIZE: only one is set", "PMI_RANK: must be below PMI_SIZE"},
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_PROCID: expected a decimal integer",
         "SLURM_NTASKS: expected a decimal integer in [1, 2^31]",
         "SLURM_PROCID and SLURM_NTASKS: only one is set",
         "SLURM_PROCID: must be below SLURM_NTASKS"},
        {"RANK", "WORLD_SIZE", "RANK (torchrun's): expected a decimal integer",
         "WORLD_SIZE (torchrun's): expected a decimal integer in [1, 2^31]",
         "RANK and WORLD_SIZE (torchrun's): only one is set", "RANK: must be below WORLD_SIZE"},
    };
    const char *msg = NULL;

    /* Most specific first: ccq's own, then the launcher that started this very process.
     * A child of torchrun (which sets TORCHELASTIC_RUN_ID) reads torchrun's before the MPI
     * launchers' and Slurm's: under srun, those describe the torchrun agent (one per node),
     * not its children. */
    const size_t nfam = sizeof fam / sizeof fam[0], torch = nfam - 1;
    const char *te = getenv("TORCHELASTIC_RUN_ID");
    bool torch_child = te != NULL && *te != '\0';

    for (size_t k = 0; k < nfam; k++) {
        size_t f = !torch_child ? k : k == 0 ? 0 : k == 1 ? torch : k - 1;
        uint32_t r = 0, s = 0;
        bool rbad, sbad;
        bool have_r = env_u31(fam[f].rank, &r, &rbad);
        bool have_s = env_u31(fam[f].size, &s, &sbad);

        if (!have_r && !have_s && !rbad && !sbad)
            continue;
        if (rbad)
            msg = fam[f].bad_rank;
        else if (sbad || (have_s && s == 0))
            msg = fam[f].bad_size;
        else if (have_r != have_s)
            msg = fam[f].half;
        else if (r >= s)
            msg = fam[f].range;
        if (msg != NULL) {
            if (err != NULL && *err == NULL)
                *err = msg;
            return CCQ_ERR_INVALID_ARGUMENT;
        }
        *rank = r;
        *size = s;
        return CCQ_OK;
    }
    return CCQ_OK;
}

/* The job id keys are namespaced with: CCQ_JOB_ID, else the launcher's (torchrun's run id,
 * a Slurm job and step, a PMIx namespace as Open MPI's mpirun sets, PBS, LSF), else
 * "default". Every process of a job sees the same launcher variables. torchrun's id comes
 * before Slurm's: torchrun started by srun runs one job per torchrun, inside one Slurm step. */
static void job_from_env(char *buf, size_t len)
{
    static const char *const vars[] = {"CCQ_JOB_ID",     "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
                                       "PMIX_NAMESPACE", "PBS_JOBID",           "LSB_JOBID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v == NULL || *v == '\0')
            continue;
        if (strcmp(vars[i], "SLURM_JOB_ID") == 0 && getenv("SLURM_STEP_ID") != NULL)
            snprintf(buf, len, "%s.%s", v, getenv("SLURM_STEP_ID"));
        else
            snprintf(buf, len, "%s", v);
        return;
    }
    snprintf(buf, len, "default");
}

const char *ccq_boot_spec_from_env(void)
{
    /* Interned: a ccq_config points at it for as long as the caller keeps the config. */
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static struct spec {
        struct spec *next;
        char s[300];
    } * specs;
    const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
    char want[300];
    struct spec *sp;

    /* Under torchrun its agent serves torch's store at MASTER_PORT for the processes it starts
     * (it says so: TORCHELASTIC_USE_AGENT_STORE=True): ccq cannot listen there, and meets
     * through that store instead. */
    const char *agent_store = getenv("TORCHELASTIC_USE_AGENT_STORE");
    const char *scheme =
        agent_store != NULL && strcmp(agent_store, "True") == 0 ? "torchstore" : "tcp";

    if (addr == NULL || *addr == '\0' || port == NULL || *port == '\0')
        return NULL;
    if (strchr(addr, ':') != NULL && addr[0] != '[')
        snprintf(want, sizeof want, "%s://[%.200s]:%.32s", scheme, addr, port);
    else
        snprintf(want, sizeof want, "%s://%.200s:%.32s", scheme, addr, port);
    pthread_mutex_lock(&lock);
    for (sp = specs; sp != NULL; sp = sp->next)
        if (strcmp(sp->s, want) == 0)
            break;
    if (sp == NULL && (sp = calloc(1, sizeof *sp)) != NULL) {
        snprintf(sp->s, sizeof sp->s, "%s", want);
        sp->next = specs;
        specs = sp;
    }
    pthread_mutex_unlock(&lock);
    return sp != NULL ? sp->s : NULL;
}

static uint64_t make_nonce(void)
{
    uint64_t n = 0;
    static _Atomic uint64_t counter;

    if (getrandom(&n, sizeof n, GRND_NONBLOCK) != (ssize_t)sizeof n)
        n = ccq_boot_now_ns() ^ ((uint64_t)getpid() << 32) ^ atomic_fetch_add(&counter, 1);
    return n ? n : 1;
}

/* ------------------------------------------------------------------------------------ */
/* Open, close                                                                           */
/* ------------------------------------------------------------------------------------ */

ccq_status ccq_boot_open(const char *spec, const ccq_store *store, int64_t mpi_comm,
                         uint32_t world_rank, uint32_t world_size, ccq_boot **out, ccq_errbuf *err)
{
    ccq_boot *b;
    ccq_status st;

    if (out == NULL)
        return CCQ_ERR_INVALID_ARGUMENT;
    *out = NULL;
    if (world_size == 0) {
        ccq_boot_err(err, "bootstrap: world_size is 0: a world has at least one process");
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    if (world_size > CCQ_BOOT_WORLD_MAX) {
        ccq_boot_err(err, "bootstrap: world_size %u is above the %u processes ccq supports",
                     world_size, CCQ_BOOT_WORLD_MAX);
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    if (world_rank >= world_size) {
        ccq_boot_err(err, "bootstrap: world_rank %u is not below world_size %u", world_rank,
                     world_size);
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    b = calloc(1, sizeof *b);
    if (b == NULL)
        goto no_memory;
    b->nonces = calloc(world_size, sizeof *b->nonces);
    if (b->nonces == NULL)
        goto free_boot;
    pthread_mutex_init(&b->lock, NULL);
    b->rank = world_rank;
    b->size = world_size;
    b->nonce = make_nonce();
    job_from_env(b->job, sizeof b->job);
    b->gen = generation(b->job, world_rank, false);

    if (spec != NULL && strcmp(spec, "mpi") == 0) {
        const ccq_module *m;
        snprintf(b->name, sizeof b->name, "mpi");
        /* The MPI mechanism lives in libccq-mpi.so, loaded now (backends/module.h). */
        st = ccq_module_get("mpi", "bootstrap \"mpi\"", &m, err);
        if (st == CCQ_OK && m->bootstrap == NULL) {
            ccq_boot_err(err, "bootstrap \"mpi\": ccq's mpi module has no bootstrap");
            st = CCQ_ERR_UNSUPPORTED;
        }
        if (st == CCQ_OK)
            st = m->bootstrap->open(b, mpi_comm, err);
    } else if (spec != NULL && strncmp(spec, "file:", 5) == 0) {
        snprintf(b->name, sizeof b->name, "%s", spec);
        st = ccq_boot_file_open(b, spec + 5, err);
    } else if (spec != NULL && strncmp(spec, "tcp://", 6) == 0) {
        snprintf(b->name, sizeof b->name, "%s", spec);
        st = ccq_boot_tcp_open(b, spec + 6, false, err);
    } else if (spec != NULL && strncmp(spec, "torchstore://", 13) == 0) {
        snprintf(b->name, sizeof b->name, "%s", spec);
        st = ccq_boot_tcp_open(b, spec + 13, true, err);
    } else if (spec == NULL || strcmp(spec, "store") == 0) {
        snprintf(b->name, sizeof b->name, "store");
        st = ccq_boot_store_open(b, store, err);
    } else {
        ccq_boot_err(err,
                     "bootstrap \"%s\": expected \"mpi\", \"file:DIR\", \"tcp://HOST:PORT\", "
                     "\"torchstore://HOST:PORT\" or none (the store)",
                     spec);
        st = CCQ_ERR_INVALID_ARGUMENT;
    }
    if (st != CCQ_OK)
        goto destroy_lock;
    if (b->mech->private_channel)
        b->gen = 0;
    else
        generation(b->job, world_rank, true);
    *out = b;
    return CCQ_OK;

destroy_lock:
    pthread_mutex_destroy(&b->lock);
    free(b->nonces);
    free(b);
    return st;
free_boot:
    free(b);
no_memory:
    ccq_boot_err(err, "bootstrap: out of memory");
    return CCQ_ERR_NO_MEMORY;
}

static void xchg_free_locked(ccq_boot_xchg *x);

void ccq_boot_close(ccq_boot *b)
{
    if (b == NULL)
        return;
    pthread_mutex_lock(&b->lock);
    while (b->xchgs != NULL)
        xchg_free_locked(b->xchgs);
    b->mech->close(b);
    pthread_mutex_unlock(&b->lock);
    for (size_t i = 0; i < b->ntags; i++)
        free(b->tags[i]);
    free(b->tags);
    free(b->nonces);
    pthread_mutex_destroy(&b->lock);
    free(b);
}

ccq_boot_peer ccq_boot_peer_state(ccq_boot *b, uint32_t rank)
{
    if (b == NULL || rank >= b->size || b->mech->peer_state == NULL)
        return CCQ_BOOT_PEER_UNKNOWN;
    return b->mech->peer_state(b, rank);
}

ccq_status ccq_boot_watch_peers(ccq_boot *b, void (*fn)(void *, uint32_t, ccq_boot_peer), void *arg)
{
    if (b == NULL)
        return CCQ_ERR_INVALID_ARGUMENT;
    if (b->mech->watch_peers == NULL)
        return CCQ_ERR_UNSUPPORTED;
    return b->mech->watch_peers(b, fn, arg);
}

const char *ccq_boot_name(const ccq_boot *b)
{
    return b->name;
}

const char *ccq_boot_job(const ccq_boot *b)
{
    return b->job;
}

uint32_t ccq_boot_generation(const ccq_boot *b)
{
    return b->gen;
}

uint32_t ccq_boot_world_rank(const ccq_boot *b)
{
    return b->rank;
}

uint32_t ccq_boot_world_size(const ccq_boot *b)
{
    return b->size;
}

uint64_t ccq_boot_poll_interval_ns(const ccq_boot *b)
{
    return b->mech->poll_ns;
}

/* ------------------------------------------------------------------------------------ */
/* Exchanges                                                                             */
/* ------------------------------------------------------------------------------------ */

static bool tag_used(const ccq_boot *b, const char *tag)
{
    for (size_t i = 0; i < b->ntags; i++)
        if (strcmp(b->tags[i], tag) == 0)
            return true;
    return false;
}

static ccq_status remember_tag(ccq_boot *b, const char *tag)
{
    if (b->ntags == b->tags_cap) {
        size_t cap = b->tags_cap ? 2 * b->tags_cap : 16;
        char **t = realloc(b->tags, cap * sizeof *t);
        if (t == NULL)
            return CCQ_ERR_NO_MEMORY;
        b->tags = t;
        b->tags_cap = cap;
    }
    b->tags[b->ntags] = strdup(tag);
    if (b->tags[b->ntags] == NULL)
        return CCQ_ERR_NO_MEMORY;
    b->ntags++;
    return CCQ_OK;
}

ccq_status ccq_boot_xchg_post(ccq_boot *b, const char *tag, const uint32_t *members, uint32_t n,
                              const void *mine, size_t len, ccq_boot_xchg **out, ccq_errbuf *err)
{
    ccq_boot_xchg *x = NULL;
    ccq_status st = CCQ_ERR_INVALID_ARGUMENT;
    size_t tag_len;
    uint32_t self = UINT32_MAX;
    ccq_boot_hdr h;

    if (out != NULL)
        *out = NULL;
    if (b == NULL || out == NULL || tag == NULL || members == NULL || (len > 0 && mine == NULL)) {
        ccq_boot_err(err, "bootstrap exchange: NULL argument");
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    tag_len = strlen(tag);
    if (tag_len == 0 || tag_len > CCQ_BOOT_TAG_MAX) {
        ccq_boot_err(err, "bootstrap exchange: a tag has 1 to %u bytes (got %zu)", CCQ_BOOT_TAG_MAX,
                     tag_len);
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    if (len > CCQ_BOOT_VALUE_MAX) {
        ccq_boot_err(err, "bootstrap exchange '%s': %zu bytes per process, at most %u", tag, len,
                     CCQ_BOOT_VALUE_MAX);
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    if (n == 0) {
        ccq_boot_err(err, "bootstrap exchange '%s': no members", tag);
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (members[i] >= b->size) {
            ccq_boot_err(err, "bootstrap exchange '%s': member %u is not below world_size %u", tag,
                         members[i], b->size);
            return CCQ_ERR_INVALID_ARGUMENT;
        }
        if (i > 0 && members[i] <= members[i - 1]) {
            ccq_boot_err(err,
                         "bootstrap exchange '%s': members must be sorted and distinct (%u "
                         "after %u)",
                         tag, members[i], members[i - 1]);
            return CCQ_ERR_INVALID_ARGUMENT;
        }
        if (members[i] == b->rank)
            self = i;
    }
    if (self == UINT32_MAX) {
        ccq_boot_err(err, "bootstrap exchange '%s': this process (%u) is not a member", tag,
                     b->rank);
        return CCQ_ERR_INVALID_ARGUMENT;
    }

    pthread_mutex_lock(&b->lock);
    if (tag_used(b, tag)) {
        ccq_boot_err(err,
                     "bootstrap exchange '%s': tag already used by an earlier exchange of this "
                     "process (a tag names one exchange)",
                     tag);
        goto unlock;
    }
    st = CCQ_ERR_NO_MEMORY;
    x = calloc(1, sizeof *x);
    if (x == NULL)
        goto no_memory;
    x->boot = b;
    x->n = n;
    x->self = self;
    x->len = len;
    x->status = CCQ_IN_PROGRESS;
    x->start_ns = ccq_boot_now_ns();
    x->tag = strdup(tag);
    x->members = malloc(n * sizeof *members);
    x->data = malloc(len * n + 1);
    x->got = calloc(n, sizeof *x->got);
    x->rec_len = sizeof h + tag_len + len;
    x->rec = malloc(x->rec_len);
    if (x->tag == NULL || x->members == NULL || x->data == NULL || x->got == NULL || x->rec == NULL)
        goto no_memory;
    memcpy(x->members, members, n * sizeof *members);
    x->members_hash = ccq_boot_fnv1a(members, n * sizeof *members, CCQ_FNV_OFFSET);
    if (len > 0)
        memcpy(x->data + (size_t)self * len, mine, len);
    x->got[self] = true;
    x->ngot = 1;

    memset(&h, 0, sizeof h);
    h.magic = CCQ_BOOT_MAGIC;
    h.version = CCQ_BOOT_VERSION;
    h.hdr_size = sizeof h;
    h.world_size = b->size;
    h.rank = b->rank;
    h.gen = b->gen;
    h.nmembers = n;
    h.nonce = b->nonce;
    h.members_hash = x->members_hash;
    h.tag_len = (uint32_t)tag_len;
    h.len = len;
    memcpy(x->rec, &h, sizeof h);
    memcpy(x->rec + sizeof h, tag, tag_len);
    if (len > 0)
        memcpy(x->rec + sizeof h + tag_len, mine, len);

    if (remember_tag(b, tag) != CCQ_OK)
        goto no_memory;
    /* Linked before publish so that a mechanism can find its sibling exchanges. */
    x->next = b->xchgs;
    if (b->xchgs != NULL)
        b->xchgs->prev = x;
    b->xchgs = x;
    if (n > 1) {
        st = b->mech->publish(b, x, err);
        if (st != CCQ_OK) {
            xchg_free_locked(x);
            goto unlock;
        }
    } else {
        x->status = CCQ_OK;
    }
    *out = x;
    pthread_mutex_unlock(&b->lock);
    return CCQ_OK;

no_memory:
    ccq_boot_err(err, "bootstrap exchange '%s': out of memory", tag);
    if (x != NULL) {
        free(x->tag);
        free(x->members);
        free(x->data);
        free(x->got);
        free(x->rec);
        free(x);
    }
unlock:
    pthread_mutex_unlock(&b->lock);
    return st;
}

static ccq_status xchg_fail(ccq_boot_xchg *x, ccq_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static ccq_status xchg_fail(ccq_boot_xchg *x, ccq_status st, const char *fmt, ...)
{
    va_list ap;
    int w = snprintf(x->detail.msg, sizeof x->detail.msg,
                     "bootstrap %.200s: exchange '%.100s': ", x->boot->name, x->tag);

    if (w < 0 || (size_t)w >= sizeof x->detail.msg)
        w = 0;
    va_start(ap, fmt);
    vsnprintf(x->detail.msg + w, sizeof x->detail.msg - (size_t)w, fmt, ap);
    va_end(ap);
    x->status = st;
    return st;
}

/* Check member i's record and take its payload. */
static ccq_status take_record(ccq_boot_xchg *x, uint32_t i, const unsigned char *rec, size_t len)
{
    ccq_boot *b = x->boot;
    uint32_t r = x->members[i];
    ccq_boot_hdr h;

    if (len < sizeof h)
        return xchg_fail(x, CCQ_ERR_BACKEND, "process %u's record is truncated (%zu bytes)", r,
                         len);
    memcpy(&h, rec, sizeof h);
    if (h.magic == __builtin_bswap32(CCQ_BOOT_MAGIC))
        return xchg_fail(x, CCQ_ERR_UNSUPPORTED,
                         "process %u has the other byte order: a world is one architecture", r);
    if (h.magic != CCQ_BOOT_MAGIC || h.hdr_size != sizeof h || h.version != CCQ_BOOT_VERSION)
        return xchg_fail(x, CCQ_ERR_BACKEND,
                         "process %u's record is not a ccq bootstrap record of this version "
                         "(magic 0x%08x, version %u)",
                         r, h.magic, h.version);
    if (h.rank != r)
        return xchg_fail(x, CCQ_ERR_BACKEND,
                         "the record expected from process %u was written by process %u (two "
                         "processes with one world_rank?)",
                         r, h.rank);
    if (h.world_size != b->size)
        return xchg_fail(x, CCQ_ERR_INVALID_ARGUMENT,
                         "process %u has world_size %u, this process (%u) has %u: every "
                         "process of a world must be given the same world_size",
                         r, h.world_size, b->rank, b->size);
    if (h.tag_len != strlen(x->tag) || len < sizeof h + h.tag_len ||
        memcmp(rec + sizeof h, x->tag, h.tag_len) != 0)
        return xchg_fail(x, CCQ_ERR_BACKEND,
                         "process %u's record under this exchange's key has another tag (a "
                         "hashed key collided)",
                         r);
    if (h.gen != b->gen)
        return xchg_fail(x, CCQ_ERR_MISMATCH,
                         "process %u is at its bootstrap generation %u, this process at %u", r,
                         h.gen, b->gen);
    if (h.nmembers != x->n || h.members_hash != x->members_hash)
        return xchg_fail(x, CCQ_ERR_MISMATCH,
                         "process %u posted it with another member set (%u members; this "
                         "process: %u)",
                         r, h.nmembers, x->n);
    if (h.len != x->len || len != sizeof h + h.tag_len + h.len)
        return xchg_fail(x, CCQ_ERR_MISMATCH, "process %u contributes %llu bytes, this process %zu",
                         r, (unsigned long long)h.len, x->len);
    if (b->nonces[r] == 0) {
        b->nonces[r] = h.nonce;
    } else if (b->nonces[r] != h.nonce) {
        return xchg_fail(x, CCQ_ERR_MISMATCH,
                         "process %u's record comes from another incarnation of it than its "
                         "earlier records: a stale record of an earlier job with the same job "
                         "id \"%s\"? (give each job a fresh directory or its own CCQ_JOB_ID)",
                         r, b->job);
    }
    if (x->len > 0)
        memcpy(x->data + (size_t)i * x->len, rec + sizeof h + h.tag_len, x->len);
    x->got[i] = true;
    x->ngot++;
    return CCQ_OK;
}

/* How long after a round that found members missing the next may come: the mechanism's
 * poll interval, and where every round asks a shared service (a file system, the embedder's
 * store) a sixteenth of how long the exchange has waited so far, up to poll_max_ns. A
 * process that waits for a slow launcher's last process then costs that service a few rounds
 * a second, not a thousand (each a file opened or a get per missing member: a thousand
 * processes waiting on one NFS directory or one store asked it a million times a second
 * each), and learns of the last arrival at most a sixteenth of its wait late. */
static uint64_t poll_gap(const ccq_boot_xchg *x, uint64_t now)
{
    const ccq_boot_mech *m = x->boot->mech;
    uint64_t gap = now > x->start_ns ? (now - x->start_ns) / 16 : 0;
    if (gap > m->poll_max_ns)
        gap = m->poll_max_ns;
    return gap > m->poll_ns ? gap : m->poll_ns;
}

static ccq_status xchg_test_locked(ccq_boot_xchg *x, void *out, ccq_errbuf *err)
{
    ccq_boot *b = x->boot;
    ccq_status st;

    ccq_errbuf e;
    uint64_t now = 0;

    /* At most one round of the mechanism per poll interval: a caller testing in a tight
     * loop (a scheduler with other work) never turns into a storm of file system or store
     * requests. */
    if (x->status == CCQ_IN_PROGRESS) {
        now = ccq_boot_now_ns();
        if (now < x->next_poll_ns)
            return CCQ_IN_PROGRESS;
    }
    e.msg[0] = '\0';
    if (x->status == CCQ_IN_PROGRESS && b->mech->progress != NULL) {
        st = b->mech->progress(b, x, &e);
        if (st < 0)
            xchg_fail(x, st, "%s", e.msg);
    }
    for (uint32_t i = 0; i < x->n && x->status == CCQ_IN_PROGRESS; i++) {
        void *rec = NULL;
        size_t len = 0;

        if (x->got[i])
            continue;
        st = b->mech->fetch(b, x, x->members[i], &rec, &len, &e);
        if (st == CCQ_IN_PROGRESS)
            continue;
        if (st != CCQ_OK) {
            xchg_fail(x, st, "%s", e.msg);
            break;
        }
        take_record(x, i, rec, len);
        free(rec);
    }
    if (x->status == CCQ_IN_PROGRESS && x->ngot == x->n)
        x->status = CCQ_OK;
    if (x->status == CCQ_IN_PROGRESS)
        x->next_poll_ns = now + poll_gap(x, now);
    if (x->status == CCQ_OK && out != NULL && x->len > 0)
        memcpy(out, x->data, x->len * x->n);
    if (x->status < 0 && err != NULL)
        memcpy(err, &x->detail, sizeof *err);
    return x->status;
}

ccq_status ccq_boot_xchg_test(ccq_boot_xchg *x, void *out, ccq_errbuf *err)
{
    ccq_status st;

    pthread_mutex_lock(&x->boot->lock);
    st = xchg_test_locked(x, out, err);
    pthread_mutex_unlock(&x->boot->lock);
    return st;
}

size_t ccq_boot_xchg_missing(ccq_boot_xchg *x, uint32_t *ranks, size_t cap)
{
    size_t k = 0;

    pthread_mutex_lock(&x->boot->lock);
    for (uint32_t i = 0; i < x->n; i++) {
        if (x->got[i])
            continue;
        if (k < cap)
            ranks[k] = x->members[i];
        k++;
    }
    pthread_mutex_unlock(&x->boot->lock);
    return k;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* The longest a waiter sleeps in a mechanism's wait before it tests again (a missed wake-up
 * costs at most this). */
#define WAIT_SLICE_NS (100u * 1000000u)

ccq_status ccq_boot_xchg_wait(ccq_boot_xchg *x, void *out, uint64_t deadline_ns, ccq_errbuf *err)
{
    const ccq_boot_mech *m = x->boot->mech;
    uint64_t pause = 20000;
    bool sleeps = m->arrivals != NULL && m->wait != NULL;

    for (;;) {
        ccq_status st;
        uint64_t now, seen = sleeps ? m->arrivals(x->boot) : 0;

        if (sleeps) { /* woken by an arrival: look now, whatever the poll interval says */
            pthread_mutex_lock(&x->boot->lock);
            x->next_poll_ns = 0;
            st = xchg_test_locked(x, out, err);
            pthread_mutex_unlock(&x->boot->lock);
        } else {
            st = ccq_boot_xchg_test(x, out, err);
        }
        if (st != CCQ_IN_PROGRESS)
            return st;
        now = ccq_boot_now_ns();
        if (deadline_ns != 0 && now >= deadline_ns)
            break;
        if (sleeps) {
            uint64_t until = now + WAIT_SLICE_NS;
            m->wait(x->boot, seen, deadline_ns != 0 && deadline_ns < until ? deadline_ns : until);
            continue;
        }
        if (deadline_ns != 0 && deadline_ns - now < pause)
            pause = deadline_ns - now;
        sleep_ns(pause);
        /* Up to the next round's gap: a sleep shorter than it only finds the test says wait. */
        uint64_t cap = poll_gap(x, now);
        pause = pause * 2 > cap ? cap : pause * 2;
    }

    /* Timed out: name the processes that never arrived. */
    {
        uint32_t miss[17] = {0}; /* (only the first min(nmiss, 17) are read) */
        size_t nmiss = ccq_boot_xchg_missing(x, miss, 17);
        char who[256], all[256];

        ccq_boot_format_ranks(who, sizeof who, miss, nmiss > 16 ? 16 : nmiss);
        if (nmiss > 16)
            snprintf(who + strlen(who), sizeof who - strlen(who), " and %zu more", nmiss - 16);
        ccq_boot_format_ranks(all, sizeof all, x->members, x->n);
        pthread_mutex_lock(&x->boot->lock);
        xchg_fail(x, CCQ_ERR_TIMEOUT,
                  "timed out among processes %s (world of %u): %s %s never arrived%s%s", all,
                  x->boot->size, nmiss == 1 ? "process" : "processes", who,
                  x->boot->note[0] ? "; " : "", x->boot->note);
        /* Not sticky: a caller may wait again (the exchange is still in progress). */
        x->status = CCQ_IN_PROGRESS;
        if (err != NULL)
            memcpy(err, &x->detail, sizeof *err);
        pthread_mutex_unlock(&x->boot->lock);
    }
    return CCQ_ERR_TIMEOUT;
}

static void xchg_free_locked(ccq_boot_xchg *x)
{
    ccq_boot *b = x->boot;

    if (b->mech->xchg_free != NULL)
        b->mech->xchg_free(b, x);
    if (x->prev != NULL)
        x->prev->next = x->next;
    else
        b->xchgs = x->next;
    if (x->next != NULL)
        x->next->prev = x->prev;
    free(x->tag);
    free(x->members);
    free(x->data);
    free(x->got);
    free(x->rec);
    free(x);
}

void ccq_boot_xchg_free(ccq_boot_xchg *x)
{
    ccq_boot *b;

    if (x == NULL)
        return;
    b = x->boot;
    pthread_mutex_lock(&b->lock);
    xchg_free_locked(x);
    pthread_mutex_unlock(&b->lock);
}

ccq_status ccq_boot_exchange(ccq_boot *b, const char *tag, const uint32_t *members, uint32_t n,
                             const void *mine, size_t len, void *out, uint64_t deadline_ns,
                             ccq_errbuf *err)
{
    ccq_boot_xchg *x;
    ccq_status st = ccq_boot_xchg_post(b, tag, members, n, mine, len, &x, err);

    if (st != CCQ_OK)
        return st;
    st = ccq_boot_xchg_wait(x, out, deadline_ns, err);
    ccq_boot_xchg_free(x);
    return st;
}

/* ------------------------------------------------------------------------------------ */
/* Heartbeats (runtime/health/)                                                          */
/* ------------------------------------------------------------------------------------ */

bool ccq_boot_has_heartbeats(const ccq_boot *b)
{
    return b->mech->beat_publish != NULL && b->mech->beat_fetch != NULL;
}

ccq_status ccq_boot_beat_publish(ccq_boot *b, const void *rec, size_t len, ccq_errbuf *err)
{
    ccq_status st;

    if (!ccq_boot_has_heartbeats(b)) {
        ccq_boot_err(err, "bootstrap %s carries no heartbeats", b->name);
        return CCQ_ERR_UNSUPPORTED;
    }
    if (len > CCQ_BOOT_BEAT_MAX) {
        ccq_boot_err(err, "heartbeat record of %zu bytes (at most %u)", len, CCQ_BOOT_BEAT_MAX);
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&b->lock);
    st = b->mech->beat_publish(b, rec, len, err);
    pthread_mutex_unlock(&b->lock);
    return st;
}

ccq_status ccq_boot_beat_fetch(ccq_boot *b, uint32_t rank, void **rec, size_t *len, ccq_errbuf *err)
{
    ccq_status st;

    *rec = NULL;
    *len = 0;
    if (!ccq_boot_has_heartbeats(b) || rank >= b->size) {
        ccq_boot_err(err, "no heartbeat of process %u here", rank);
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&b->lock);
    st = b->mech->beat_fetch(b, rank, rec, len, err);
    pthread_mutex_unlock(&b->lock);
    return st;
}

size_t ccq_boot_closed_peers(ccq_boot *b, uint32_t *ranks, size_t cap)
{
    size_t n = 0;

    if (b->mech->closed_peers == NULL)
        return 0;
    pthread_mutex_lock(&b->lock);
    n = b->mech->closed_peers(b, ranks, cap);
    pthread_mutex_unlock(&b->lock);
    return n;
}

void ccq_boot_beat_config(ccq_boot *b, uint64_t hb_ns, uint64_t timeout_ns)
{
    if (b->mech->beat_config == NULL)
        return;
    pthread_mutex_lock(&b->lock);
    b->mech->beat_config(b, hb_ns, timeout_ns);
    pthread_mutex_unlock(&b->lock);
}

size_t ccq_boot_silent_peers(ccq_boot *b, uint32_t *ranks, size_t cap)
{
    size_t n;

    if (b->mech->silent_peers == NULL)
        return 0;
    pthread_mutex_lock(&b->lock);
    n = b->mech->silent_peers(b, ranks, cap);
    pthread_mutex_unlock(&b->lock);
    return n;
}

bool ccq_boot_given_up(ccq_boot *b, uint32_t *by)
{
    bool up;

    if (b->mech->given_up == NULL)
        return false;
    pthread_mutex_lock(&b->lock);
    up = b->mech->given_up(b, by);
    pthread_mutex_unlock(&b->lock);
    return up;
}

void ccq_boot_fault_lag(ccq_boot *b, uint64_t lag_ns)
{
    if (b->mech->fault_lag == NULL)
        return;
    pthread_mutex_lock(&b->lock);
    b->mech->fault_lag(b, lag_ns);
    pthread_mutex_unlock(&b->lock);
}

void ccq_boot_relay_window(ccq_boot *b, uint64_t *since, uint64_t *until)
{
    *since = 0;
    *until = UINT64_MAX;
    if (b->mech->relay_window == NULL)
        return;
    pthread_mutex_lock(&b->lock);
    b->mech->relay_window(b, since, until);
    pthread_mutex_unlock(&b->lock);
}

uint64_t ccq_boot_nonce(const ccq_boot *b)
{
    return b->nonce;
}

uint64_t ccq_boot_peer_nonce(ccq_boot *b, uint32_t rank)
{
    uint64_t n;

    if (rank >= b->size)
        return 0;
    pthread_mutex_lock(&b->lock);
    n = rank == b->rank ? b->nonce : b->nonces[rank];
    pthread_mutex_unlock(&b->lock);
    return n;
}
