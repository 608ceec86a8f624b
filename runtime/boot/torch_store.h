/* A minimal client of torch's TCPStore, the store torchrun's agent serves at MASTER_ADDR:
 * MASTER_PORT for the processes it starts (TORCHELASTIC_USE_AGENT_STORE=True): under torchrun
 * that port is taken, so ccq's rendezvous cannot listen there; process 0 serves it on a port
 * of its own and says which in this store ("torchstore://HOST:PORT", runtime/boot/tcp.c).
 *
 * Only what that needs: VALIDATE (torch's handshake), SET, CHECK and GET, as torch's
 * client sends them (read from a torch 2.5.1 client's traffic, docs/multiprocess.md): a byte
 * of query type, then each string or value as a u64 length (little-endian, as torch writes
 * it on x86 and Arm) and its bytes. Every call is blocking with a deadline (CLOCK_MONOTONIC,
 * ns), and says why it failed in why. */
#ifndef CCQ_RUNTIME_BOOT_TORCH_STORE_H
#define CCQ_RUNTIME_BOOT_TORCH_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A connection to the store at host:port, validated; -1 with why. */
int ccq_torch_store_connect(const char *host, const char *port, uint64_t deadline_ns, char *why,
                            size_t why_len);

/* Set key to the len bytes at value. */
bool ccq_torch_store_set(int fd, const char *key, const void *value, size_t len,
                         uint64_t deadline_ns, char *why, size_t why_len);

/* 1 with key's value in value (at most cap bytes; a longer one fails), *len its length; 0 when
 * the key is not set yet; -1 with why. */
int ccq_torch_store_get_if_set(int fd, const char *key, void *value, size_t cap, size_t *len,
                               uint64_t deadline_ns, char *why, size_t why_len);

#endif
