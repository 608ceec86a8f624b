/* The tcp:// rendezvous server's logic, socket-free (tcp_proto.h): frames in, frames out,
 * every input checked, every byte it holds bounded by its limits. runtime/boot/tcp.c runs it
 * on world rank 0's I/O thread; tests/fuzz/fuzz_tcp.c feeds it arbitrary bytes.
 *
 * What it keeps: per connection an input buffer (at most one frame) and an output queue (at
 * most out_max); per exchange (tag) the records received and who asked for them. A record is
 * sent to every process that asked (GET) as soon as both are there; the exchange is
 * forgotten once its nmembers records each reached nmembers - 1 askers. Per process the latest
 * heartbeat record, and per connection which processes' records it has not been sent yet
 * (queued when its output is empty: a slow reader holds at most one frame of each). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "runtime/boot/boot_impl.h"
#include "runtime/boot/tcp_proto.h"

/* ---- frames ------------------------------------------------------------------------------ */

static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint16_t rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

int ccq_tcp_parse(const uint8_t *buf, size_t len, size_t frame_max, ccq_tcp_frame *f, size_t *used,
                  ccq_errbuf *err)
{
    uint32_t magic, n;
    uint16_t version;

    if (len < 4)
        return 0;
    magic = rd32(buf);
    if (magic != CCQ_TCP_MAGIC) {
        ccq_boot_err(err, "not the ccq rendezvous protocol (magic 0x%08x%s)", magic,
                     magic == __builtin_bswap32(CCQ_TCP_MAGIC) ? ": the other byte order" : "");
        return -1;
    }
    if (len < 6)
        return 0;
    version = rd16(buf + 4);
    if (version != CCQ_TCP_VERSION) {
        ccq_boot_err(err, "rendezvous protocol version %u; this ccq speaks version %u", version,
                     CCQ_TCP_VERSION);
        return -1;
    }
    if (len < CCQ_TCP_HDR)
        return 0;
    n = rd32(buf + 8);
    if (n > frame_max - CCQ_TCP_HDR) {
        ccq_boot_err(err, "a frame of %u bytes (at most %zu)", n, frame_max - CCQ_TCP_HDR);
        return -1;
    }
    if (len < CCQ_TCP_HDR + (size_t)n)
        return 0;
    f->type = rd16(buf + 6);
    f->len = n;
    f->payload = buf + CCQ_TCP_HDR;
    *used = CCQ_TCP_HDR + (size_t)n;
    return 1;
}

bool ccq_tcp_buf_reserve(ccq_tcp_buf *b, size_t more)
{
    if (b->off > 0 && b->off == b->len)
        b->off = b->len = 0;
    if (b->len + more <= b->cap)
        return true;
    if (b->off > 0) { /* slide what is pending to the front */
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
        if (b->len + more <= b->cap)
            return true;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more)
        cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (p == NULL)
        return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool ccq_tcp_put_frame(ccq_tcp_buf *b, size_t max, uint16_t type, const void *a, size_t alen,
                       const void *b2, size_t blen, const void *c, size_t clen)
{
    size_t n = alen + blen + clen;
    uint32_t magic = CCQ_TCP_MAGIC, len32 = (uint32_t)n;
    uint16_t version = CCQ_TCP_VERSION;

    if (n > UINT32_MAX || (b->len - b->off) + CCQ_TCP_HDR + n > max)
        return false;
    if (!ccq_tcp_buf_reserve(b, CCQ_TCP_HDR + n))
        return false;
    memcpy(b->p + b->len, &magic, 4);
    memcpy(b->p + b->len + 4, &version, 2);
    memcpy(b->p + b->len + 6, &type, 2);
    memcpy(b->p + b->len + 8, &len32, 4);
    b->len += CCQ_TCP_HDR;
    if (alen)
        memcpy(b->p + b->len, a, alen);
    b->len += alen;
    if (blen)
        memcpy(b->p + b->len, b2, blen);
    b->len += blen;
    if (clen)
        memcpy(b->p + b->len, c, clen);
    b->len += clen;
    return true;
}

void ccq_tcp_buf_consume(ccq_tcp_buf *b, size_t n)
{
    b->off += n;
    if (b->off >= b->len)
        b->off = b->len = 0;
}

void ccq_tcp_buf_free(ccq_tcp_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

void ccq_tcp_default_limits(ccq_tcp_limits *lim, uint32_t world_size)
{
    uint64_t ms;
    lim->frame_max = CCQ_TCP_HDR + 8 + 2 + CCQ_BOOT_TAG_MAX + sizeof(ccq_boot_hdr) +
                     CCQ_BOOT_TAG_MAX + CCQ_BOOT_VALUE_MAX + 4 + 4 * (size_t)world_size; /* HAD */
    if (lim->frame_max < CCQ_TCP_HDR + 4 + CCQ_BOOT_BEAT_MAX)
        lim->frame_max = CCQ_TCP_HDR + 4 + CCQ_BOOT_BEAT_MAX;
    lim->mem_max = 256u << 20;
    lim->out_max = 16u << 20;
    lim->conns_max = world_size + 64;
    lim->tags_max = 65536;
    lim->hello_ns = 10000000000ull;
    lim->stall_ns = 10000000000ull;
    if (ccq_env_u64("CCQ_TCP_STALL_MS", 1, 3600000, &ms) > 0)
        lim->hello_ns = lim->stall_ns = ms * 1000000ull;
}

/* ---- the server's state ----------------------------------------------------------------- */

typedef struct rec {
    uint32_t rank;
    uint32_t delivered; /* askers it reached */
    size_t len;
    uint8_t *bytes;
} rec;

typedef struct tag_entry {
    struct tag_entry *next;
    char *tag;
    size_t tag_len;
    uint32_t nmembers; /* from the first record (0 until one came) */
    rec *recs;
    uint32_t nrecs, recs_cap;
    uint32_t *askers; /* world ranks that sent GET or HAD */
    uint8_t *had;     /* [askers_cap]: that asker holds every record already (HAD): sent none */
    uint32_t naskers, askers_cap;
    uint32_t *members; /* [nmembers] from a HAD (NULL until one came): lets a member that went
                        * count as served (maybe_forget) */
} tag_entry;

typedef struct conn {
    bool used, hello, closing, bye;
    bool pinged; /* sent a PING since keepalives began: its client may judge silence (tcp.c) */
    uint32_t rank;
    uint64_t opened_ns, partial_since, out_since;
    uint64_t queued_ns; /* when a frame was last queued for it (keepalive) */
    ccq_tcp_buf in, out;
    uint8_t *beat_due; /* [world_size]: that process's latest heartbeat not sent here yet */
    uint32_t nbeat_due;
} conn;

typedef struct beat {
    uint8_t *bytes; /* NULL: none yet */
    size_t len;
} beat;

typedef struct addr {
    uint16_t port; /* 0: not told */
    uint8_t len;
    char text[CCQ_TCP_ADDR_MAX];
} addr;

struct ccq_tcp_server {
    ccq_tcp_limits lim;
    char job[256];
    uint32_t world_size, gen;
    conn *conns;
    int nconns;     /* slots in use or free below this */
    int *by_rank;   /* [world_size]: connection of each process, -1 */
    uint8_t *state; /* [world_size]: CCQ_BOOT_PEER_* */
    tag_entry *tags;
    uint32_t ntags;
    beat *beats;           /* [world_size] */
    addr *addrs;           /* [world_size]: where each would serve (ADDR) */
    size_t held;           /* bytes of records and heartbeats held */
    uint64_t keepalive_ns; /* 0: no PING */
};

ccq_tcp_server *ccq_tcp_server_new(const char *job, uint32_t world_size, uint32_t gen,
                                   const ccq_tcp_limits *lim)
{
    ccq_tcp_server *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->lim = *lim;
    snprintf(s->job, sizeof s->job, "%s", job);
    s->world_size = world_size;
    s->gen = gen;
    s->conns = calloc(lim->conns_max, sizeof *s->conns);
    s->by_rank = malloc(world_size * sizeof *s->by_rank);
    s->state = calloc(world_size, 1);
    s->beats = calloc(world_size, sizeof *s->beats);
    s->addrs = calloc(world_size, sizeof *s->addrs);
    if (s->conns == NULL || s->by_rank == NULL || s->state == NULL || s->beats == NULL ||
        s->addrs == NULL) {
        ccq_tcp_server_free(s);
        return NULL;
    }
    for (uint32_t r = 0; r < world_size; r++)
        s->by_rank[r] = -1;
    return s;
}

static void tag_free(ccq_tcp_server *s, tag_entry *t)
{
    for (uint32_t k = 0; k < t->nrecs; k++) {
        s->held -= t->recs[k].len;
        free(t->recs[k].bytes);
    }
    free(t->recs);
    free(t->askers);
    free(t->had);
    if (t->members != NULL)
        s->held -= t->nmembers * sizeof *t->members;
    free(t->members);
    free(t->tag);
    free(t);
    s->ntags--;
}

void ccq_tcp_server_free(ccq_tcp_server *s)
{
    if (s == NULL)
        return;
    while (s->tags != NULL) {
        tag_entry *t = s->tags;
        s->tags = t->next;
        tag_free(s, t);
    }
    for (int i = 0; s->conns != NULL && i < s->nconns; i++) {
        ccq_tcp_buf_free(&s->conns[i].in);
        ccq_tcp_buf_free(&s->conns[i].out);
        free(s->conns[i].beat_due);
    }
    for (uint32_t r = 0; s->beats != NULL && r < s->world_size; r++)
        free(s->beats[r].bytes);
    free(s->beats);
    free(s->addrs);
    free(s->conns);
    free(s->by_rank);
    free(s->state);
    free(s);
}

int ccq_tcp_server_conn_bound(const ccq_tcp_server *s)
{
    return s->nconns;
}

int ccq_tcp_server_open(ccq_tcp_server *s, uint64_t now_ns)
{
    int id = 0;
    while (id < s->nconns && s->conns[id].used)
        id++;
    if (id == (int)s->lim.conns_max)
        return -1;
    if (id == s->nconns)
        s->nconns++;
    memset(&s->conns[id], 0, sizeof s->conns[id]);
    s->conns[id].used = true;
    s->conns[id].opened_ns = now_ns;
    return id;
}

static conn *get_conn(ccq_tcp_server *s, int id)
{
    return id >= 0 && id < s->nconns && s->conns[id].used ? &s->conns[id] : NULL;
}

/* Queue a frame for c; a client that lets its queue exceed out_max is dropped. */
static void send_frame(ccq_tcp_server *s, conn *c, uint16_t type, const void *a, size_t alen,
                       const void *b, size_t blen, const void *d, size_t dlen, uint64_t now)
{
    if (c->closing)
        return;
    if (c->out.len == c->out.off)
        c->out_since = now;
    c->queued_ns = now;
    if (!ccq_tcp_put_frame(&c->out, s->lim.out_max, type, a, alen, b, blen, d, dlen))
        c->closing = true; /* it does not read, or we are out of memory: let it go */
}

/* A PING. A client judges this server's silence only once it had one (tcp.c, judge_silence):
 * the first goes at once, when keepalives begin here or when the client's HELLO is taken with
 * them on, so that it precedes anything an exchange sends it. Before that, the client cannot
 * tell a stopped server from one whose process has not turned keepalives on yet (it met the
 * others later than this client did, or never turns them on). */
static void ping_now(ccq_tcp_server *s, conn *c, uint64_t now)
{
    send_frame(s, c, CCQ_TCP_PING, NULL, 0, NULL, 0, NULL, 0, now);
    c->pinged = true;
}

static void refuse(ccq_tcp_server *s, conn *c, uint32_t code, const char *why, uint64_t now)
{
    send_frame(s, c, CCQ_TCP_REFUSE, &code, 4, why, strlen(why), NULL, 0, now);
    c->closing = true;
}

static void tag_err(ccq_tcp_server *s, conn *c, const uint8_t *tag, uint16_t tl, const char *why,
                    uint64_t now)
{
    send_frame(s, c, CCQ_TCP_ERR, &tl, 2, tag, tl, why, strlen(why), now);
}

static void broadcast_peer(ccq_tcp_server *s, uint32_t rank, uint32_t state, uint64_t now)
{
    uint32_t v[2] = {rank, state};
    for (int i = 0; i < s->nconns; i++)
        if (s->conns[i].used && s->conns[i].hello && s->conns[i].rank != rank)
            send_frame(s, &s->conns[i], CCQ_TCP_PEER, v, sizeof v, NULL, 0, NULL, 0, now);
}

static tag_entry *find_tag(ccq_tcp_server *s, const uint8_t *tag, size_t tl, bool make)
{
    tag_entry *t;
    for (t = s->tags; t != NULL; t = t->next)
        if (t->tag_len == tl && memcmp(t->tag, tag, tl) == 0)
            return t;
    if (!make || s->ntags >= s->lim.tags_max || (t = calloc(1, sizeof *t)) == NULL)
        return NULL;
    if ((t->tag = malloc(tl + 1)) == NULL) {
        free(t);
        return NULL;
    }
    memcpy(t->tag, tag, tl);
    t->tag[tl] = '\0';
    t->tag_len = tl;
    t->next = s->tags;
    s->tags = t;
    s->ntags++;
    return t;
}

/* Record r to the k-th asker of t (one that sent HAD holds it already: counted, not sent). */
static void send_rec(ccq_tcp_server *s, tag_entry *t, rec *r, uint32_t k, uint64_t now)
{
    uint32_t to = t->askers[k];
    int id = to < s->world_size && !t->had[k] ? s->by_rank[to] : -1;
    uint16_t tl = (uint16_t)t->tag_len;
    uint8_t head[6];
    conn *c = get_conn(s, id);
    memcpy(head, &r->rank, 4);
    memcpy(head + 4, &tl, 2);
    if (c != NULL)
        send_frame(s, c, CCQ_TCP_REC, head, 6, t->tag, t->tag_len, r->bytes, r->len, now);
    r->delivered++;
}

static bool asked(const tag_entry *t, uint32_t rank)
{
    for (uint32_t k = 0; k < t->naskers; k++)
        if (t->askers[k] == rank)
            return true;
    return false;
}

static bool has_rec(const tag_entry *t, uint32_t rank)
{
    for (uint32_t k = 0; k < t->nrecs; k++)
        if (t->recs[k].rank == rank)
            return true;
    return false;
}

/* Forget an exchange every member has finished with: each published and asked (so was sent
 * every record; HAD says both). With its members known (a HAD came), a member that left or
 * was lost counts as finished: it will never ask (the records offered to a server taking over
 * from a lost one would otherwise stay for good). */
static void maybe_forget(ccq_tcp_server *s, tag_entry *t)
{
    if (t->members != NULL) {
        for (uint32_t i = 0; i < t->nmembers; i++) {
            uint32_t m = t->members[i];
            if (s->state[m] < 2 && (!asked(t, m) || !has_rec(t, m)))
                return;
        }
    } else {
        if (t->nmembers == 0 || t->nrecs < t->nmembers || t->naskers < t->nmembers)
            return;
        for (uint32_t k = 0; k < t->nrecs; k++)
            if (t->recs[k].delivered + 1 < t->nmembers)
                return;
    }
    for (tag_entry **pp = &s->tags; *pp != NULL; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            break;
        }
    tag_free(s, t);
}

/* Keep c's record r (rl bytes) of exchange tag (the bootstrap's, checked against the
 * connection): the record kept, or NULL when refused (c is told why). */
static rec *take_record(ccq_tcp_server *s, conn *c, tag_entry **tp, const uint8_t *tag, uint16_t tl,
                        const uint8_t *r, size_t rl, uint64_t now)
{
    ccq_boot_hdr h;
    tag_entry *t;
    rec *nr;

    if (rl < sizeof h) {
        tag_err(s, c, tag, tl, "a record shorter than its header", now);
        return NULL;
    }
    memcpy(&h, r, sizeof h);
    if (h.magic != CCQ_BOOT_MAGIC || h.version != CCQ_BOOT_VERSION || h.hdr_size != sizeof h ||
        h.rank != c->rank || h.world_size != s->world_size || h.gen != s->gen || h.tag_len != tl ||
        memcmp(r + sizeof h, tag, tl) != 0 || h.nmembers == 0 || h.nmembers > s->world_size ||
        h.len != rl - sizeof h - tl) {
        tag_err(s, c, tag, tl,
                "a record that does not match its connection (rank, world size, generation, "
                "tag or length)",
                now);
        return NULL;
    }
    if (s->held + rl > s->lim.mem_max) {
        tag_err(s, c, tag, tl, "the rendezvous server holds too many records (memory bound)", now);
        return NULL;
    }
    t = find_tag(s, tag, tl, true);
    if (t == NULL) {
        tag_err(s, c, tag, tl, "the rendezvous server holds too many exchanges", now);
        return NULL;
    }
    if (has_rec(t, c->rank)) {
        tag_err(s, c, tag, tl, "this process published this exchange twice", now);
        return NULL;
    }
    if (t->nmembers == 0)
        t->nmembers = h.nmembers;
    if (t->nrecs == t->recs_cap) {
        uint32_t cap = t->recs_cap ? 2 * t->recs_cap : 4;
        rec *m = cap <= s->world_size + 4u ? realloc(t->recs, cap * sizeof *m) : NULL;
        if (m == NULL) {
            tag_err(s, c, tag, tl, "out of memory", now);
            return NULL;
        }
        t->recs = m;
        t->recs_cap = cap;
    }
    nr = &t->recs[t->nrecs];
    nr->bytes = malloc(rl);
    if (nr->bytes == NULL) {
        tag_err(s, c, tag, tl, "out of memory", now);
        return NULL;
    }
    memcpy(nr->bytes, r, rl);
    nr->len = rl;
    nr->rank = c->rank;
    nr->delivered = 0;
    t->nrecs++;
    s->held += rl;
    *tp = t;
    return nr;
}

/* Pass a record just kept to those that asked (a HAD's sender is only counted). */
static void pass_on(ccq_tcp_server *s, tag_entry *t, rec *nr, uint64_t now)
{
    for (uint32_t k = 0; k < t->naskers; k++)
        if (t->askers[k] != nr->rank)
            send_rec(s, t, nr, k, now);
}

/* PUT: u16 tag length, tag, record. */
static void on_put(ccq_tcp_server *s, conn *c, const uint8_t *p, uint32_t n, uint64_t now)
{
    uint16_t tl;
    tag_entry *t = NULL;
    rec *nr;

    if (n < 2 || (tl = rd16(p)) == 0 || tl > CCQ_BOOT_TAG_MAX || n < 2u + tl) {
        refuse(s, c, CCQ_TCP_REFUSE_FINAL, "malformed PUT", now);
        return;
    }
    nr = take_record(s, c, &t, p + 2, tl, p + 2 + tl, n - 2u - tl, now);
    if (nr == NULL)
        return;
    pass_on(s, t, nr, now);
    maybe_forget(s, t);
}

/* c's rank asks for t's records (GET), or says it holds them all (HAD): its asker index, or
 * -1 when it asked already or was refused (told why). */
static int64_t add_asker(ccq_tcp_server *s, conn *c, tag_entry *t, bool had, uint64_t now)
{
    if (asked(t, c->rank))
        return -1;
    if (t->naskers == t->askers_cap) {
        uint32_t cap = t->askers_cap ? 2 * t->askers_cap : 4;
        uint32_t *m = cap <= s->world_size + 4u ? realloc(t->askers, cap * sizeof *m) : NULL;
        uint8_t *h = m != NULL ? realloc(t->had, cap) : NULL;
        if (m != NULL)
            t->askers = m;
        if (h == NULL) {
            tag_err(s, c, (const uint8_t *)t->tag, (uint16_t)t->tag_len,
                    "too many processes ask for this exchange", now);
            return -1;
        }
        t->had = h;
        t->askers_cap = cap;
    }
    t->had[t->naskers] = had;
    t->askers[t->naskers] = c->rank;
    return t->naskers++;
}

/* GET: u16 tag length, tag. */
static void on_get(ccq_tcp_server *s, conn *c, const uint8_t *p, uint32_t n, uint64_t now)
{
    uint16_t tl;
    tag_entry *t;
    int64_t k;

    if (n < 2 || (tl = rd16(p)) == 0 || tl > CCQ_BOOT_TAG_MAX || n != 2u + tl) {
        refuse(s, c, CCQ_TCP_REFUSE_FINAL, "malformed GET", now);
        return;
    }
    t = find_tag(s, p + 2, tl, true);
    if (t == NULL) {
        tag_err(s, c, p + 2, tl, "the rendezvous server holds too many exchanges", now);
        return;
    }
    if ((k = add_asker(s, c, t, false, now)) < 0)
        return;
    for (uint32_t j = 0; j < t->nrecs; j++)
        if (t->recs[j].rank != c->rank)
            send_rec(s, t, &t->recs[j], (uint32_t)k, now);
    maybe_forget(s, t);
}

/* HAD: u16 tag length, tag, u32 n, n member ranks (ascending), record: an exchange this
 * process finished before the server it used was lost, offered to the one taking over for the
 * members that had not (their records may have gone with the lost server). The members must
 * be those the record was made for (its hash) and include the sender. */
static void on_had(ccq_tcp_server *s, conn *c, const uint8_t *p, uint32_t n, uint64_t now)
{
    uint16_t tl;
    uint32_t nm;
    const uint8_t *mem;
    ccq_boot_hdr h;
    bool self = false;
    tag_entry *t = NULL;
    rec *nr;
    int64_t k;

    if (n < 2 || (tl = rd16(p)) == 0 || tl > CCQ_BOOT_TAG_MAX || n < 2u + tl + 4u ||
        (nm = rd32(p + 2 + tl)) == 0 || nm > s->world_size ||
        n < 2u + tl + 4u + 4u * nm + sizeof h) {
        refuse(s, c, CCQ_TCP_REFUSE_FINAL, "malformed HAD", now);
        return;
    }
    mem = p + 2 + tl + 4;
    memcpy(&h, mem + 4u * nm, sizeof h);
    for (uint32_t i = 0; i < nm; i++) {
        uint32_t m = rd32(mem + 4u * i);
        if (m >= s->world_size || (i > 0 && m <= rd32(mem + 4u * (i - 1)))) {
            refuse(s, c, CCQ_TCP_REFUSE_FINAL, "malformed HAD (its members)", now);
            return;
        }
        self |= m == c->rank;
    }
    if (!self || h.nmembers != nm ||
        h.members_hash != ccq_boot_fnv1a(mem, 4u * nm, CCQ_FNV_OFFSET)) {
        tag_err(s, c, p + 2, tl, "a finished exchange offered with members not its own", now);
        return;
    }
    if (s->held + n > s->lim.mem_max) { /* the record and the members, and a little more */
        tag_err(s, c, p + 2, tl, "the rendezvous server holds too many records (memory bound)",
                now);
        return;
    }
    nr = take_record(s, c, &t, p + 2, tl, mem + 4u * nm, n - (2u + tl + 4u + 4u * nm), now);
    if (nr == NULL)
        return;
    if (t->members == NULL && t->nmembers == nm && (t->members = malloc(4u * nm)) != NULL) {
        memcpy(t->members, mem, 4u * nm);
        s->held += 4u * nm;
    }
    if ((k = add_asker(s, c, t, true, now)) >= 0)
        for (uint32_t j = 0; j < t->nrecs; j++)
            if (t->recs[j].rank != c->rank)
                send_rec(s, t, &t->recs[j], (uint32_t)k, now); /* counted only */
    pass_on(s, t, nr, now);
    maybe_forget(s, t);
}

/* Queue the heartbeats c has not been sent, while its output is empty (a reader that falls
 * behind is sent only the newest of each process, when it caught up). */
static void send_beats(ccq_tcp_server *s, conn *c, uint64_t now)
{
    if (c->beat_due == NULL || c->nbeat_due == 0 || c->closing || c->out.len != c->out.off)
        return;
    for (uint32_t r = 0; r < s->world_size && c->nbeat_due > 0; r++) {
        if (!c->beat_due[r])
            continue;
        c->beat_due[r] = 0;
        c->nbeat_due--;
        if (s->beats[r].bytes != NULL)
            send_frame(s, c, CCQ_TCP_BEATS, &r, 4, s->beats[r].bytes, s->beats[r].len, NULL, 0,
                       now);
    }
}

static void beat_due(ccq_tcp_server *s, conn *c, uint32_t rank, uint64_t now)
{
    if (c->beat_due == NULL || c->rank == rank)
        return;
    if (!c->beat_due[rank]) {
        c->beat_due[rank] = 1;
        c->nbeat_due++;
    }
    send_beats(s, c, now);
}

/* BEAT: this process's heartbeat record, replacing its previous one. */
static void on_beat(ccq_tcp_server *s, conn *c, const uint8_t *p, uint32_t n, uint64_t now)
{
    beat *b = &s->beats[c->rank];
    uint8_t *m;

    if (n == 0 || n > CCQ_BOOT_BEAT_MAX) {
        refuse(s, c, CCQ_TCP_REFUSE_FINAL, "malformed BEAT", now);
        return;
    }
    /* Over the memory bound the beat is dropped: the others see this process's beat late,
     * as they would any process that cannot publish. */
    if (s->held - b->len + n > s->lim.mem_max)
        return;
    if (n != b->len) {
        if ((m = realloc(b->bytes, n)) == NULL)
            return;
        s->held = s->held - b->len + n;
        b->bytes = m;
        b->len = n;
    }
    memcpy(b->bytes, p, n);
    for (int i = 0; i < s->nconns; i++)
        if (s->conns[i].used && s->conns[i].hello)
            beat_due(s, &s->conns[i], c->rank, now);
}

static void send_addr(ccq_tcp_server *s, conn *c, uint32_t r, uint64_t now);

/* HELLO: u32 rank, u32 size, u32 gen, u32 0, u64 nonce, job. */
static void on_hello(ccq_tcp_server *s, conn *c, int id, const uint8_t *p, uint32_t n, uint64_t now)
{
    uint32_t rank, size, gen;
    char why[400], job[256];
    size_t jl;

    if (n < 24 || n - 24 >= sizeof job) {
        refuse(s, c, CCQ_TCP_REFUSE_FINAL, "malformed HELLO", now);
        return;
    }
    rank = rd32(p);
    size = rd32(p + 4);
    gen = rd32(p + 8);
    jl = n - 24;
    memcpy(job, p + 24, jl);
    job[jl] = '\0';
    if (strlen(job) != jl || strcmp(job, s->job) != 0) {
        snprintf(why, sizeof why,
                 "another job: this rendezvous serves job \"%.100s\", the process is of job "
                 "\"%.100s\" (CCQ_JOB_ID, or the launcher's job id)",
                 s->job, job);
        refuse(s, c, CCQ_TCP_REFUSE_FINAL, why, now);
        return;
    }
    if (size != s->world_size || rank >= s->world_size) {
        snprintf(why, sizeof why,
                 "world_size %u (world rank %u) where this rendezvous serves a world of %u", size,
                 rank, s->world_size);
        refuse(s, c, CCQ_TCP_REFUSE_FINAL, why, now);
        return;
    }
    if (gen != s->gen) {
        snprintf(why, sizeof why,
                 "bootstrap generation %u where this rendezvous serves generation %u (another "
                 "runtime of process 0)",
                 gen, s->gen);
        refuse(s, c, CCQ_TCP_REFUSE_RETRY, why, now);
        return;
    }
    if (s->state[rank] >= 2) { /* CCQ_BOOT_PEER_LEFT, CCQ_BOOT_PEER_LOST */
        snprintf(why, sizeof why,
                 "world rank %u was here and %s: a process cannot rejoin a job as a rank that "
                 "went (start a new job: another CCQ_JOB_ID)",
                 rank, s->state[rank] == 2 ? "left" : "was lost");
        refuse(s, c, CCQ_TCP_REFUSE_FINAL, why, now);
        return;
    }
    if (s->by_rank[rank] >= 0) {
        snprintf(why, sizeof why,
                 "world rank %u is connected already (two processes with one "
                 "world rank?)",
                 rank);
        refuse(s, c, CCQ_TCP_REFUSE_FINAL, why, now);
        return;
    }
    c->beat_due = calloc(s->world_size, 1);
    if (c->beat_due == NULL) {
        refuse(s, c, CCQ_TCP_REFUSE_RETRY, "the rendezvous server is out of memory", now);
        return;
    }
    c->hello = true;
    c->rank = rank;
    c->queued_ns = now;
    s->by_rank[rank] = id;
    s->state[rank] = 1; /* CCQ_BOOT_PEER_ALIVE */
    send_frame(s, c, CCQ_TCP_WELCOME, &s->world_size, 4, NULL, 0, NULL, 0, now);
    /* Keepalives on: say so at once, before anything an exchange answers (ping_now). */
    if (s->keepalive_ns != 0)
        ping_now(s, c, now);
    /* Tell it of those that already went. */
    for (uint32_t r = 0; r < s->world_size; r++)
        if (s->state[r] >= 2) {
            uint32_t v[2] = {r, s->state[r]};
            send_frame(s, c, CCQ_TCP_PEER, v, sizeof v, NULL, 0, NULL, 0, now);
        }
    /* Where the others would serve. */
    for (uint32_t r = 0; r < s->world_size; r++)
        if (s->addrs[r].port != 0 && r != rank)
            send_addr(s, c, r, now);
    /* And of the heartbeats so far (once this output drained). */
    for (uint32_t r = 0; r < s->world_size; r++)
        if (s->beats[r].bytes != NULL)
            beat_due(s, c, r, now);
}

static void send_addr(ccq_tcp_server *s, conn *c, uint32_t r, uint64_t now)
{
    send_frame(s, c, CCQ_TCP_ADDRS, &r, 4, &s->addrs[r].port, 2, s->addrs[r].text, s->addrs[r].len,
               now);
}

/* ADDR: where this process would serve if the server is lost; everyone else is told. */
static void on_addr(ccq_tcp_server *s, conn *c, const uint8_t *p, uint32_t n, uint64_t now)
{
    addr *a = &s->addrs[c->rank];
    if (n < 3 || n - 2 > CCQ_TCP_ADDR_MAX) {
        refuse(s, c, CCQ_TCP_REFUSE_FINAL, "malformed ADDR", now);
        return;
    }
    memcpy(&a->port, p, 2);
    a->len = (uint8_t)(n - 2);
    memcpy(a->text, p + 2, a->len);
    for (int i = 0; i < s->nconns; i++)
        if (s->conns[i].used && s->conns[i].hello && &s->conns[i] != c)
            send_addr(s, &s->conns[i], c->rank, now);
}

/* LOOK: an observer asks for the world's states and heartbeat records, once. An empty job
 * means "the job served here" (the observer learns its id from LOOKED). */
static void on_look(ccq_tcp_server *s, conn *c, const uint8_t *p, uint32_t n, uint64_t now)
{
    char why[400];
    uint32_t head[2] = {s->world_size, s->gen};

    if (n > 0 && (n != strlen(s->job) || memcmp(p, s->job, n) != 0)) {
        snprintf(why, sizeof why, "another job: this rendezvous serves job \"%.100s\"", s->job);
        refuse(s, c, CCQ_TCP_REFUSE_FINAL, why, now);
        return;
    }
    send_frame(s, c, CCQ_TCP_LOOKED, head, sizeof head, s->state, s->world_size, s->job,
               strlen(s->job), now);
    for (uint32_t r = 0; r < s->world_size; r++)
        if (s->beats[r].bytes != NULL)
            send_frame(s, c, CCQ_TCP_BEATS, &r, 4, s->beats[r].bytes, s->beats[r].len, NULL, 0,
                       now);
    c->closing = true; /* once its output is written (or out_max refused it: closed anyway) */
}

bool ccq_tcp_server_input(ccq_tcp_server *s, int id, const void *data, size_t len, uint64_t now_ns)
{
    conn *c = get_conn(s, id);
    const uint8_t *d = data;

    if (c == NULL)
        return false;
    if (c->closing)
        return false;
    while (len > 0 && !c->closing) {
        size_t pending = c->in.len - c->in.off, take, used = 0;
        ccq_tcp_frame f;
        ccq_errbuf err;
        int r;
        /* At most one frame buffered: take what completes it (or the header). */
        if (pending < CCQ_TCP_HDR)
            take = CCQ_TCP_HDR - pending;
        else {
            size_t flen = CCQ_TCP_HDR + (size_t)rd32(c->in.p + c->in.off + 8);
            take = flen > pending ? flen - pending : 0;
        }
        if (take > len)
            take = len;
        if (take > 0) {
            if (!ccq_tcp_buf_reserve(&c->in, take)) {
                c->closing = true;
                return false;
            }
            memcpy(c->in.p + c->in.len, d, take);
            c->in.len += take;
            d += take;
            len -= take;
        }
        r = ccq_tcp_parse(c->in.p + c->in.off, c->in.len - c->in.off, s->lim.frame_max, &f, &used,
                          &err);
        if (r < 0) {
            refuse(s, c, CCQ_TCP_REFUSE_FINAL, err.msg, now_ns);
            return false;
        }
        if (r == 0) {
            if (c->partial_since == 0)
                c->partial_since = now_ns ? now_ns : 1;
            continue;
        }
        c->partial_since = 0;
        if (!c->hello && f.type == CCQ_TCP_LOOK) {
            on_look(s, c, f.payload, f.len, now_ns);
            return false;
        }
        if (!c->hello && f.type != CCQ_TCP_HELLO) {
            refuse(s, c, CCQ_TCP_REFUSE_FINAL, "HELLO first", now_ns);
            return false;
        }
        switch (f.type) {
        case CCQ_TCP_HELLO:
            if (c->hello)
                refuse(s, c, CCQ_TCP_REFUSE_FINAL, "a second HELLO", now_ns);
            else
                on_hello(s, c, id, f.payload, f.len, now_ns);
            break;
        case CCQ_TCP_PUT:
            on_put(s, c, f.payload, f.len, now_ns);
            break;
        case CCQ_TCP_GET:
            on_get(s, c, f.payload, f.len, now_ns);
            break;
        case CCQ_TCP_HAD:
            on_had(s, c, f.payload, f.len, now_ns);
            break;
        case CCQ_TCP_BEAT:
            on_beat(s, c, f.payload, f.len, now_ns);
            break;
        case CCQ_TCP_ADDR:
            on_addr(s, c, f.payload, f.len, now_ns);
            break;
        case CCQ_TCP_BYE:
            c->bye = true;
            break;
        default:
            refuse(s, c, CCQ_TCP_REFUSE_FINAL, "a frame a client does not send", now_ns);
            break;
        }
        ccq_tcp_buf_consume(&c->in, used);
    }
    return !c->closing;
}

void ccq_tcp_server_output(ccq_tcp_server *s, int id, const uint8_t **p, size_t *len)
{
    conn *c = get_conn(s, id);
    *p = NULL;
    *len = 0;
    if (c == NULL || c->out.len == c->out.off)
        return;
    *p = c->out.p + c->out.off;
    *len = c->out.len - c->out.off;
}

void ccq_tcp_server_sent(ccq_tcp_server *s, int id, size_t n, uint64_t now_ns)
{
    conn *c = get_conn(s, id);
    if (c == NULL || n == 0)
        return;
    ccq_tcp_buf_consume(&c->out, n);
    c->out_since = now_ns;
    send_beats(s, c, now_ns);
}

bool ccq_tcp_server_closing(const ccq_tcp_server *s, int id)
{
    return id < 0 || id >= s->nconns || !s->conns[id].used || s->conns[id].closing;
}

void ccq_tcp_server_closed(ccq_tcp_server *s, int id, uint64_t now_ns)
{
    conn *c = get_conn(s, id);
    if (c == NULL)
        return;
    if (c->hello) {
        uint32_t r = c->rank;
        s->by_rank[r] = -1;
        s->state[r] = c->bye ? 2 : 3; /* CCQ_BOOT_PEER_LEFT : CCQ_BOOT_PEER_LOST */
        /* Its subscriptions go: nobody is there to receive them. */
        for (tag_entry *t = s->tags; t != NULL; t = t->next)
            for (uint32_t k = 0; k < t->naskers; k++)
                if (t->askers[k] == r)
                    t->askers[k] = UINT32_MAX; /* keeps counting as asked: it did */
        c->used = false;                       /* before the broadcast: not told of itself */
        broadcast_peer(s, r, s->state[r], now_ns);
        /* Exchanges that waited only for it (their members known) are finished. */
        for (tag_entry *t = s->tags, *next; t != NULL; t = next) {
            next = t->next;
            if (t->members != NULL)
                maybe_forget(s, t);
        }
    }
    ccq_tcp_buf_free(&c->in);
    ccq_tcp_buf_free(&c->out);
    free(c->beat_due);
    memset(c, 0, sizeof *c);
    while (s->nconns > 0 && !s->conns[s->nconns - 1].used)
        s->nconns--;
}

size_t ccq_tcp_server_tick(ccq_tcp_server *s, uint64_t now, int *ids, size_t cap, uint64_t *next_ns)
{
    size_t n = 0;
    uint64_t next = UINT64_MAX;

    for (int i = 0; i < s->nconns; i++) {
        conn *c = &s->conns[i];
        uint64_t due = UINT64_MAX;
        if (!c->used)
            continue;
        if (!c->hello)
            due = c->opened_ns + s->lim.hello_ns;
        if (c->partial_since != 0 && c->partial_since + s->lim.stall_ns < due)
            due = c->partial_since + s->lim.stall_ns;
        if (c->out.len != c->out.off && c->out_since + s->lim.stall_ns < due)
            due = c->out_since + s->lim.stall_ns;
        if (due <= now) {
            c->closing = true;
            if (n < cap)
                ids[n++] = i;
            continue;
        }
        if (due < next)
            next = due;
        if (s->keepalive_ns != 0 && c->hello && !c->closing) {
            /* Something at least every keepalive_ns: its silence then means this server
             * stopped (tcp.c). The first PING at once (ping_now). */
            if (!c->pinged || now - c->queued_ns >= s->keepalive_ns)
                ping_now(s, c, now);
            if (c->queued_ns + s->keepalive_ns < next)
                next = c->queued_ns + s->keepalive_ns;
        }
    }
    *next_ns = next;
    return n;
}

void ccq_tcp_server_keepalive(ccq_tcp_server *s, uint64_t interval_ns)
{
    s->keepalive_ns = interval_ns;
}

bool ccq_tcp_server_conn_member(const ccq_tcp_server *s, int id, uint32_t *rank)
{
    if (id < 0 || id >= s->nconns || !s->conns[id].used || !s->conns[id].hello || s->conns[id].bye)
        return false;
    *rank = s->conns[id].rank;
    return true;
}

void ccq_tcp_server_mark(ccq_tcp_server *s, uint32_t rank, uint32_t state)
{
    if (rank < s->world_size && state >= 2 && state <= 3 && s->by_rank[rank] < 0)
        s->state[rank] = (uint8_t)state;
}

void ccq_tcp_server_leaving(ccq_tcp_server *s, uint32_t rank, uint64_t now_ns)
{
    if (rank >= s->world_size || s->state[rank] >= 2)
        return;
    s->state[rank] = 2; /* CCQ_BOOT_PEER_LEFT */
    broadcast_peer(s, rank, 2, now_ns);
}

size_t ccq_tcp_server_memory(const ccq_tcp_server *s)
{
    size_t m = s->held + s->world_size * sizeof *s->addrs;
    for (int i = 0; i < s->nconns; i++)
        m += s->conns[i].in.cap + s->conns[i].out.cap + (s->conns[i].beat_due ? s->world_size : 0);
    return m;
}
