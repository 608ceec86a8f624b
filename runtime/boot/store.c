/* The store bootstrap: the embedder's ccq_store callbacks (its own rendezvous: a TCP
 * store, a Redis or etcd client...). A record is the value under
 * "ccq/<job>/<gen>/<tag>/<rank>"; readers poll get, which never blocks. Keys are never
 * deleted (ccq_store has no delete): the generation keeps a later runtime of the same
 * process off an earlier one's keys. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/boot/boot_impl.h"

typedef struct store_boot {
    ccq_store store; /* the embedder's, copied */
} store_boot;

static void store_key(const ccq_boot *b, const char *tag, uint32_t rank, char *out, size_t len)
{
    snprintf(out, len, "ccq/%s/%u/%s/%u", b->job, b->gen, tag, rank);
}

static ccq_status store_publish(ccq_boot *b, ccq_boot_xchg *x, ccq_errbuf *err)
{
    store_boot *s = b->impl;
    char key[CCQ_BOOT_TAG_MAX + 320];
    ccq_status st;

    store_key(b, x->tag, b->rank, key, sizeof key);
    st = s->store.set(s->store.ctx, key, x->rec, x->rec_len);
    if (st == CCQ_OK)
        return CCQ_OK;
    ccq_boot_err(err, "the store's set of key \"%s\" failed: %s (%s)", key, ccq_status_name(st),
                 ccq_status_string(st));
    return st < 0 ? st : CCQ_ERR_BACKEND;
}

/* Get the value under key: first with room for `room` bytes, then (once) with room for its
 * whole size up to max. CCQ_IN_PROGRESS while the key is absent. */
static ccq_status get_value(store_boot *s, const char *key, size_t room, size_t max, void **rec,
                            size_t *len, ccq_errbuf *err)
{
    ccq_status st;

    for (int attempt = 0; attempt < 2; attempt++) {
        size_t got = room;
        unsigned char *buf = malloc(room);

        if (buf == NULL) {
            ccq_boot_err(err, "out of memory");
            return CCQ_ERR_NO_MEMORY;
        }
        st = s->store.get(s->store.ctx, key, buf, &got);
        if (st == CCQ_IN_PROGRESS) {
            free(buf);
            return CCQ_IN_PROGRESS;
        }
        if (st != CCQ_OK) {
            free(buf);
            ccq_boot_err(err, "the store's get of key \"%s\" failed: %s (%s)", key,
                         ccq_status_name(st), ccq_status_string(st));
            return st < 0 ? st : CCQ_ERR_BACKEND;
        }
        if (got <= room) {
            *rec = buf;
            *len = got;
            return CCQ_OK;
        }
        free(buf);
        if (got > max) {
            ccq_boot_err(err, "the store's value under key \"%s\" has %zu bytes: not a record", key,
                         got);
            return CCQ_ERR_BACKEND;
        }
        room = got; /* as ccq_store says: called again with room for all of it */
    }
    ccq_boot_err(err, "the store's value under key \"%s\" keeps growing", key);
    return CCQ_ERR_BACKEND;
}

static ccq_status store_fetch(ccq_boot *b, ccq_boot_xchg *x, uint32_t rank, void **rec, size_t *len,
                              ccq_errbuf *err)
{
    char key[CCQ_BOOT_TAG_MAX + 320];

    store_key(b, x->tag, rank, key, sizeof key);
    /* Room for the record every member writes (same header, tag and len as ours) and one
     * byte more, so that a longer value is seen as one (and refused by the checks). */
    return get_value(b->impl, key, x->rec_len + 1,
                     sizeof(ccq_boot_hdr) + CCQ_BOOT_TAG_MAX + CCQ_BOOT_VALUE_MAX, rec, len, err);
}

/* Heartbeats: the key "ccq/<job>/<gen>/~hb/<rank>", set again at every beat (ccq_store's
 * contract: last write wins for these keys). '~' never starts an exchange's tag. */
static ccq_status store_beat_publish(ccq_boot *b, const void *rec, size_t len, ccq_errbuf *err)
{
    store_boot *s = b->impl;
    char key[320];
    ccq_status st;

    store_key(b, "~hb", b->rank, key, sizeof key);
    st = s->store.set(s->store.ctx, key, rec, len);
    if (st == CCQ_OK)
        return CCQ_OK;
    ccq_boot_err(err, "the store's set of key \"%s\" failed: %s (%s)", key, ccq_status_name(st),
                 ccq_status_string(st));
    return st < 0 ? st : CCQ_ERR_BACKEND;
}

static ccq_status store_beat_fetch(ccq_boot *b, uint32_t rank, void **rec, size_t *len,
                                   ccq_errbuf *err)
{
    char key[320];

    store_key(b, "~hb", rank, key, sizeof key);
    return get_value(b->impl, key, 1024, CCQ_BOOT_BEAT_MAX, rec, len, err);
}

static void store_close(ccq_boot *b)
{
    free(b->impl);
}

static const ccq_boot_mech store_mech = {
    .name = "store",
    .poll_ns = 1000000,       /* a get may be a network round trip (Redis, a TCP store) */
    .poll_max_ns = 250000000, /* ...and a long wait, a few gets a second (poll_gap) */
    .publish = store_publish,
    .fetch = store_fetch,
    .close = store_close,
    .beat_publish = store_beat_publish,
    .beat_fetch = store_beat_fetch,
};

ccq_status ccq_boot_store_open(ccq_boot *b, const ccq_store *store, ccq_errbuf *err)
{
    store_boot *s;

    if (store == NULL) {
        ccq_boot_err(
            err,
            "bootstrap: a world of %u processes needs a way to meet: set "
            "bootstrap (\"mpi\", \"file:DIR\", \"tcp://HOST:PORT\"; env CCQ_BOOTSTRAP) or store",
            b->size);
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    if (store->set == NULL || store->get == NULL) {
        ccq_boot_err(err, "bootstrap store: its %s callback is NULL",
                     store->set == NULL ? "set" : "get");
        return CCQ_ERR_INVALID_ARGUMENT;
    }
    s = calloc(1, sizeof *s);
    if (s == NULL) {
        ccq_boot_err(err, "bootstrap: out of memory");
        return CCQ_ERR_NO_MEMORY;
    }
    s->store = *store;
    b->mech = &store_mech;
    b->impl = s;
    return CCQ_OK;
}
