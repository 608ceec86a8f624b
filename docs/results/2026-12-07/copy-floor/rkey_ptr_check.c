/* Can a UCX engine read a peer's scratch in place (the mapped schedule of shm_allreduce.c)?
 * Two processes (fork; worker addresses and packed rkeys passed through pipes), each with a
 * UCP context (AM + RMA) and a worker, an endpoint to the other under
 * UCP_ERR_HANDLING_MODE_PEER (the engine's: UCX_MM_ERROR_HANDLING=y), 8 MiB from
 * ucp_mem_map(ALLOCATE) filled with its letter; each unpacks the other's rkey and asks
 * ucp_rkey_ptr for a local address of it. Then process 0 exits and process 1 reads the
 * mapping again, and unpacks the rkey anew.
 * Build: cc -O2 -o rkey_ptr_check rkey_ptr_check.c -lucp -lucs
 * Run: ./rkey_ptr_check; UCX_TLS=sysv,self ./rkey_ptr_check; UCX_TLS=tcp,self ./rkey_ptr_check
 * UCX 1.13.1 (Debian 12), 2026-12-07: posix (default) and sysv: rkey_ptr Success, the peer's
 * bytes readable, and still readable (and the rkey unpackable, rkey_ptr Success) after the
 * peer exited; tcp only: rkey_ptr "Destination is unreachable" (a schedule needs another way
 * there). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define MAP_BYTES (8u << 20)
#define CHECK(x)                                                                                   \
    do {                                                                                           \
        ucs_status_t s_ = (x);                                                                     \
        if (s_ != UCS_OK) {                                                                        \
            fprintf(stderr, "process %d: %s: %s\n", getpid(), #x, ucs_status_string(s_));          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void put(int fd, const void *b, size_t n)
{
    for (size_t o = 0; o < n;) {
        ssize_t k = write(fd, (const char *)b + o, n - o);
        if (k <= 0)
            exit(2);
        o += (size_t)k;
    }
}

static void get(int fd, void *b, size_t n)
{
    for (size_t o = 0; o < n;) {
        ssize_t k = read(fd, (char *)b + o, n - o);
        if (k <= 0)
            exit(3);
        o += (size_t)k;
    }
}

/* Send len and the bytes; receive the same into a new buffer. */
static void *swap(int in, int out, const void *mine, size_t len, size_t *theirs)
{
    put(out, &len, sizeof len);
    put(out, mine, len);
    get(in, theirs, sizeof *theirs);
    void *b = malloc(*theirs);
    get(in, b, *theirs);
    return b;
}

static void run(int me, int in, int out)
{
    ucp_config_t *cfg;
    CHECK(ucp_config_read(NULL, NULL, &cfg));
    ucp_config_modify(cfg, "MM_ERROR_HANDLING", "y");
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_AM | UCP_FEATURE_RMA};
    ucp_context_h ctx;
    CHECK(ucp_init(&p, cfg, &ctx));
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_worker_h w;
    CHECK(ucp_worker_create(ctx, &wp, &w));
    ucp_address_t *addr;
    size_t alen, plen, rlen;
    CHECK(ucp_worker_get_address(w, &addr, &alen));
    void *peer_addr = swap(in, out, addr, alen, &plen);
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                          .address = peer_addr,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER};
    ucp_ep_h e;
    CHECK(ucp_ep_create(w, &ep, &e));
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                             UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                                             UCP_MEM_MAP_PARAM_FIELD_FLAGS,
                               .address = NULL,
                               .length = MAP_BYTES,
                               .flags = UCP_MEM_MAP_ALLOCATE};
    ucp_mem_h mh;
    CHECK(ucp_mem_map(ctx, &mp, &mh));
    ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
    CHECK(ucp_mem_query(mh, &ma));
    memset(ma.address, 'A' + me, MAP_BYTES);
    void *rk;
    size_t rklen;
    CHECK(ucp_rkey_pack(ctx, mh, &rk, &rklen));
    uint64_t base = (uint64_t)(uintptr_t)ma.address, peer_base;
    put(out, &base, sizeof base);
    get(in, &peer_base, sizeof peer_base);
    void *peer_rk = swap(in, out, rk, rklen, &rlen);
    for (int i = 0; i < 100; i++)
        ucp_worker_progress(w);
    ucp_rkey_h rkey;
    CHECK(ucp_ep_rkey_unpack(e, peer_rk, &rkey));
    char *at = NULL;
    ucs_status_t s = ucp_rkey_ptr(rkey, peer_base + 4096, (void **)&at);
    printf("process %d: rkey %zu bytes, rkey_ptr: %s, the peer's byte: %c\n", me, rklen,
           ucs_status_string(s), s == UCS_OK ? *at : '?');
    fflush(stdout);
    char c = 0;
    put(out, &c, 1);
    get(in, &c, 1);
    if (me == 0 || s != UCS_OK)
        exit(0); /* process 0 exits; process 1 goes on reading its mapping */
    sleep(1);
    long sum = 0, want = (long)(MAP_BYTES / 4096 - 1) * 'A';
    for (size_t i = 0; i < MAP_BYTES - 4096; i += 4096)
        sum += at[i];
    printf("process 1: the exited peer's mapping read again: %s\n",
           sum == want ? "its bytes" : "CHANGED");
    ucp_rkey_h again;
    s = ucp_ep_rkey_unpack(e, peer_rk, &again);
    if (s == UCS_OK)
        s = ucp_rkey_ptr(again, peer_base, (void **)&at);
    printf("process 1: after the peer exited, unpack + rkey_ptr: %s\n", ucs_status_string(s));
}

int main(void)
{
    int a[2], b[2];
    if (pipe(a) || pipe(b))
        return 1;
    if (fork() == 0) {
        run(0, b[0], a[1]);
        return 0;
    }
    run(1, a[0], b[1]);
    wait(NULL);
    return 0;
}
