/* ccq across processes with the embedder's own store (ccq_config.store): the way a runtime
 * that already has a rendezvous (a TCP store, a Redis or etcd client, torch's Store) lets
 * its processes meet. Here the "store" is a table in shared memory and the processes are
 * forked from this one; a real embedder's set/get would talk to its server instead.
 *
 *   ./ccq_world_store [processes]     (default 3)
 *
 * Each process builds a runtime of a world of that many processes, prints its place and
 * checks an all_reduce over its own devices. */
#define _DEFAULT_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ccq.h"

enum { KEYS = 256, KEY_LEN = 160, VAL_LEN = 1024 };

typedef struct shm_store {
    atomic_flag lock; /* process-shared: the table lives in MAP_SHARED memory */
    uint32_t n;
    struct {
        char key[KEY_LEN];
        size_t len;
        unsigned char val[VAL_LEN];
    } e[KEYS];
} shm_store;

static void lock(shm_store *s)
{
    while (atomic_flag_test_and_set_explicit(&s->lock, memory_order_acquire))
        usleep(10);
}

static void unlock(shm_store *s)
{
    atomic_flag_clear_explicit(&s->lock, memory_order_release);
}

static ccq_status store_set(void *ctx, const char *key, const void *value, size_t len)
{
    shm_store *s = ctx;
    ccq_status st = CCQ_OK;
    if (strlen(key) >= KEY_LEN || len > VAL_LEN)
        return CCQ_ERR_INVALID_ARGUMENT;
    lock(s);
    /* A key set again replaces its value (ccq sets its heartbeat key at every beat). */
    uint32_t i = 0;
    while (i < s->n && strcmp(s->e[i].key, key) != 0)
        i++;
    if (i == KEYS) {
        st = CCQ_ERR_NO_MEMORY;
    } else {
        snprintf(s->e[i].key, KEY_LEN, "%s", key);
        memcpy(s->e[i].val, value, len);
        s->e[i].len = len;
        s->n += i == s->n;
    }
    unlock(s);
    return st;
}

/* Never blocks: CCQ_IN_PROGRESS while nobody has set the key yet (ccq polls). */
static ccq_status store_get(void *ctx, const char *key, void *value, size_t *len)
{
    shm_store *s = ctx;
    ccq_status st = CCQ_IN_PROGRESS;
    lock(s);
    for (uint32_t i = 0; i < s->n; i++) {
        if (strcmp(s->e[i].key, key) != 0)
            continue;
        size_t n = s->e[i].len < *len ? s->e[i].len : *len;
        memcpy(value, s->e[i].val, n);
        *len = s->e[i].len;
        st = CCQ_OK;
        break;
    }
    unlock(s);
    return st;
}

static int one_process(shm_store *shm, uint32_t rank, uint32_t size)
{
    ccq_store store = {shm, store_set, store_get};
    ccq_config cfg;
    ccq_runtime *rt;
    ccq_device_id first, devs[8];
    uint32_t count;
    float in[8][256], out[8][256];

    ccq_config_init(&cfg);
    cfg.world_rank = rank;
    cfg.world_size = size;
    cfg.bootstrap = NULL; /* meet through the store */
    cfg.store = &store;
    cfg.host_devices = 1 + rank % 2; /* uneven on purpose */
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "process %u: %s\n", rank, ccq_last_error_detail());
        return 1;
    }
    ccq_local_devices(rt, &first, &count);
    for (uint32_t i = 0; i < count; i++) {
        devs[i] = first + i;
        for (int k = 0; k < 256; k++)
            in[i][k] = (float)(devs[i] + k);
    }
    int bad = ccq_comm_init(rt, devs, count) != CCQ_OK;
    for (uint32_t i = 0; i < count && !bad; i++)
        bad |= ccq_all_reduce(rt, devs[i], 0, in[i], out[i], 256, CCQ_FLOAT32, CCQ_SUM, devs,
                              count) != CCQ_OK;
    for (uint32_t i = 0; i < count && !bad; i++)
        bad |= ccq_sync_collective(rt, devs[i], 0) != CCQ_OK;
    for (uint32_t i = 0; i < count && !bad; i++)
        for (int k = 0; k < 256; k++) {
            float want = 0;
            for (uint32_t j = 0; j < count; j++)
                want += in[j][k];
            bad |= out[i][k] != want;
        }
    printf("process %u of %u: devices %u..%u of %u, all_reduce over them %s\n", rank, size, first,
           first + count - 1, ccq_device_count(rt), bad ? "WRONG" : "OK");
    ccq_runtime_destroy(rt);
    return bad;
}

int main(int argc, char **argv)
{
    uint32_t size = argc > 1 ? (uint32_t)atoi(argv[1]) : 3;
    shm_store *shm =
        mmap(NULL, sizeof *shm, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int bad = 0;

    if (size < 1 || size > 16 || shm == MAP_FAILED)
        return 2;
    atomic_flag_clear(&shm->lock);
    fflush(stdout);
    for (uint32_t r = 0; r < size; r++)
        if (fork() == 0) {
            int rc = one_process(shm, r, size);
            /* _exit skips stdio's flush at exit: a pipe's buffered lines would be lost. */
            fflush(stdout);
            _exit(rc);
        }
    for (uint32_t r = 0; r < size; r++) {
        int st;
        if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad = 1;
    }
    printf("%s\n", bad ? "FAILED" : "OK: every process checked its results");
    return bad;
}
