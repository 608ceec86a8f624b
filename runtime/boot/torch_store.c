/* A minimal client of torch's TCPStore (torch_store.h). The wire format, as a torch 2.5.1
 * client sends it (strace of TCPStore.set/check/get against torch's own server):
 *   VALIDATE  u8 0, u32 0x3C85F7CE                     (no answer)
 *   SET       u8 1, key, value                         (no answer)
 *   GET       u8 3, key                         -> value
 *   CHECK     u8 5, u64 n, n keys               -> u8 0 ready, 1 not ready
 * where a key or a value is a u64 length and its bytes, every integer little-endian. */
#define _GNU_SOURCE
#include "runtime/boot/torch_store.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/boot/boot_impl.h"
#include "runtime/boot/bootstrap.h"

enum { Q_VALIDATE = 0, Q_SET = 1, Q_GET = 3, Q_CHECK = 5 };
enum { CHECK_READY = 0, CHECK_NOT_READY = 1 };
#define VALIDATION_MAGIC 0x3C85F7CEu
/* The longest key this client sends (a query is built in one buffer). */
#define KEY_MAX 256u

static bool send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t k = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            len -= (size_t)k;
        } else if (k == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
            return false;
        } else if (errno != EINTR && ccq_boot_wait_fd(fd, POLLOUT, deadline_ns) <= 0) {
            return false;
        }
    }
    return true;
}

static bool recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t k = recv(fd, p, len, MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            len -= (size_t)k;
        } else if (k == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
            return false;
        } else if (errno != EINTR && ccq_boot_wait_fd(fd, POLLIN, deadline_ns) <= 0) {
            return false;
        }
    }
    return true;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Append a u64 length and its bytes at q: the bytes written. */
static size_t put_bytes(uint8_t *q, const void *b, size_t len)
{
    put_u64(q, len);
    memcpy(q + 8, b, len);
    return 8 + len;
}

int ccq_torch_store_connect(const char *host, const char *port, uint64_t deadline_ns, char *why,
                            size_t why_len)
{
    struct addrinfo hints, *res = NULL, *ai;
    uint8_t hello[5] = {Q_VALIDATE};
    int rc, fd = -1, e = 0, one = 1;

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        snprintf(why, why_len, "cannot resolve %s: %s", host, gai_strerror(rc));
        return -1;
    }
    for (ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
        socklen_t el = sizeof e;
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        e = fd < 0 ? errno : 0;
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            if (errno != EINPROGRESS)
                e = errno;
            else if (ccq_boot_wait_fd(fd, POLLOUT, deadline_ns) == 0)
                e = ETIMEDOUT;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0)
                e = errno;
        }
        if (e != 0 && fd >= 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(why, why_len, "connecting to torch's store at %s:%s: %s", host, port, strerror(e));
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (int i = 0; i < 4; i++)
        hello[1 + i] = (uint8_t)(VALIDATION_MAGIC >> (8 * i));
    if (!send_all(fd, hello, sizeof hello, deadline_ns)) {
        snprintf(why, why_len, "torch's store at %s:%s closed the connection", host, port);
        close(fd);
        return -1;
    }
    return fd;
}

bool ccq_torch_store_set(int fd, const char *key, const void *value, size_t len,
                         uint64_t deadline_ns, char *why, size_t why_len)
{
    uint8_t q[1 + 8 + KEY_MAX + 8 + 64];
    size_t kl = strlen(key), n = 0;

    if (kl > KEY_MAX || len > 64) {
        snprintf(why, why_len, "torch's store: a key or value too long");
        return false;
    }
    q[n++] = Q_SET;
    n += put_bytes(q + n, key, kl);
    n += put_bytes(q + n, value, len);
    if (!send_all(fd, q, n, deadline_ns)) {
        snprintf(why, why_len, "torch's store closed the connection (setting %s)", key);
        return false;
    }
    return true;
}

int ccq_torch_store_get_if_set(int fd, const char *key, void *value, size_t cap, size_t *len,
                               uint64_t deadline_ns, char *why, size_t why_len)
{
    uint8_t q[1 + 8 + 8 + KEY_MAX], answer = 0, lenb[8];
    size_t kl = strlen(key), n = 0;
    uint64_t vl;

    if (kl > KEY_MAX) {
        snprintf(why, why_len, "torch's store: a key too long");
        return -1;
    }
    q[n++] = Q_CHECK;
    put_u64(q + n, 1);
    n += 8;
    n += put_bytes(q + n, key, kl);
    if (!send_all(fd, q, n, deadline_ns) || !recv_all(fd, &answer, 1, deadline_ns))
        goto broken;
    if (answer == CHECK_NOT_READY)
        return 0;
    if (answer != CHECK_READY) {
        snprintf(why, why_len, "torch's store answered CHECK with %u (not torch's TCPStore?)",
                 (unsigned)answer);
        return -1;
    }
    n = 0;
    q[n++] = Q_GET;
    n += put_bytes(q + n, key, kl);
    if (!send_all(fd, q, n, deadline_ns) || !recv_all(fd, lenb, 8, deadline_ns))
        goto broken;
    vl = get_u64(lenb);
    if (vl > cap) {
        snprintf(why, why_len, "torch's store: %s holds %llu bytes (at most %zu expected)", key,
                 (unsigned long long)vl, cap);
        return -1;
    }
    if (!recv_all(fd, value, (size_t)vl, deadline_ns))
        goto broken;
    *len = (size_t)vl;
    return 1;
broken:
    snprintf(why, why_len,
             "torch's store did not answer (looking for %s): closed, or not torch's TCPStore", key);
    return -1;
}
