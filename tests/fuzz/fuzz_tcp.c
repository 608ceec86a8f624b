/* libFuzzer target for the tcp:// rendezvous server's logic (runtime/boot/tcp_server.c), no
 * sockets: the input is a script of connections opening, sending bytes, reading what the
 * server queued for them, closing, and time passing. After every step the server's memory
 * must stay within what its limits allow; ASan, UBSan and LSan check the rest (no bad
 * access, no leak at the end).
 *
 * Input: a sequence of steps, each an opcode byte then its arguments:
 *   0 open                       a new connection (at most 8 at once)
 *   1 c n_lo n_hi bytes[n]       connection c % live sends n bytes (clipped to the input)
 *   2 c                          connection c closes
 *   3 c                          connection c reads everything queued for it
 *   4 t                          t * 50 ms pass (timeouts: HELLO, stalled frames, output;
 *                                keepalives: a PING to each process sent nothing for 100 ms)
 *   5 c r                        connection c sends a valid HELLO as world rank r % 4
 *   6 c r t n_lo                 connection c PUTs a valid record of rank r % 4 under tag
 *                                "t<t % 8>" with n_lo bytes of payload (members 1..4 by r);
 *                                n_lo >= 0xf0: a BEAT instead; 0xe0-0xef: a HAD (the
 *                                members are ranks 0..nmembers-1, so may lack the sender)
 *   7 c t                        connection c GETs tag "t<t % 8>"
 * (5-7 build well-formed frames so that the fuzzer reaches the deep states quickly; 1 sends
 * anything at all.) tests/fuzz/make_tcp_seeds.py writes the seeds of tests/fuzz/corpus_tcp. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/boot/boot_impl.h"
#include "runtime/boot/tcp_proto.h"

#define WORLD 4
#define MAXC  8

static void send_buf(ccq_tcp_server *s, int id, ccq_tcp_buf *b, uint64_t now)
{
    ccq_tcp_server_input(s, id, b->p, b->len, now);
    ccq_tcp_buf_free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ccq_tcp_limits lim;
    ccq_tcp_server *s;
    int ids[MAXC], n = 0;
    uint64_t now = 1000;
    size_t i = 0, bound;

    ccq_tcp_default_limits(&lim, WORLD);
    lim.mem_max = 64 * 1024;
    lim.out_max = 32 * 1024;
    lim.conns_max = MAXC;
    lim.tags_max = 16;
    lim.hello_ns = lim.stall_ns = 1000000000ull;
    /* Records, plus per connection an input buffer (one frame at most: its capacity may
     * double past it) and its output queue. */
    bound = lim.mem_max + MAXC * (2 * lim.frame_max + 2 * lim.out_max + 8192);
    s = ccq_tcp_server_new("fuzz", WORLD, 0, &lim);
    if (s == NULL)
        return 0;
    ccq_tcp_server_keepalive(s, 100000000ull); /* heartbeats on, every 100 ms */
    while (i < size) {
        uint8_t op = data[i++] % 8;
        int c = n > 0 && i < size ? (int)(data[i] % (unsigned)n) : -1;
        switch (op) {
        case 0:
            if (n < MAXC) {
                int id = ccq_tcp_server_open(s, now);
                if (id >= 0)
                    ids[n++] = id;
            }
            break;
        case 1: {
            size_t len;
            if (c < 0 || i + 3 > size)
                goto done;
            len = (size_t)data[i + 1] | (size_t)data[i + 2] << 8;
            i += 3;
            if (len > size - i)
                len = size - i;
            ccq_tcp_server_input(s, ids[c], data + i, len, now);
            i += len;
            break;
        }
        case 2:
            if (c < 0)
                goto done;
            i++;
            ccq_tcp_server_closed(s, ids[c], now);
            ids[c] = ids[--n];
            break;
        case 3: {
            const uint8_t *p;
            size_t len;
            if (c < 0)
                goto done;
            i++;
            ccq_tcp_server_output(s, ids[c], &p, &len);
            ccq_tcp_server_sent(s, ids[c], len, now);
            break;
        }
        case 4: {
            int gone[MAXC];
            uint64_t next;
            size_t k;
            if (i >= size)
                goto done;
            now += (uint64_t)data[i++] * 50000000ull;
            k = ccq_tcp_server_tick(s, now, gone, MAXC, &next);
            for (size_t j = 0; j < k; j++)
                for (int m = 0; m < n; m++)
                    if (ids[m] == gone[j]) {
                        ccq_tcp_server_closed(s, ids[m], now);
                        ids[m] = ids[--n];
                        break;
                    }
            break;
        }
        case 5: {
            ccq_tcp_buf b = {0};
            uint32_t v[4];
            uint64_t nonce = 1;
            if (c < 0 || i + 2 > size)
                goto done;
            v[0] = data[i + 1] % WORLD;
            v[1] = WORLD;
            v[2] = v[3] = 0;
            i += 2;
            if (data[i - 1] >= 0xf0) /* an observer (ccq-trace status): this job, any, another */
                ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_LOOK, "fuzz", data[i - 1] % 3 * 2u, NULL, 0,
                                  NULL, 0);
            else
                ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_HELLO, v, 16, &nonce, 8, "fuzz", 4);
            send_buf(s, ids[c], &b, now);
            break;
        }
        case 6: {
            ccq_tcp_buf b = {0};
            ccq_boot_hdr h;
            char tag[4];
            uint8_t rec[sizeof h + 4 + 255];
            uint16_t tl;
            if (c < 0 || i + 4 > size)
                goto done;
            snprintf(tag, sizeof tag, "t%u", data[i + 2] % 8u);
            tl = (uint16_t)strlen(tag);
            memset(&h, 0, sizeof h);
            h.magic = CCQ_BOOT_MAGIC;
            h.version = CCQ_BOOT_VERSION;
            h.hdr_size = sizeof h;
            h.world_size = WORLD;
            h.rank = data[i + 1] % WORLD;
            h.nmembers = 1 + data[i + 1] / WORLD % WORLD;
            h.tag_len = tl;
            h.len = data[i + 3];
            memcpy(rec, &h, sizeof h);
            memcpy(rec + sizeof h, tag, tl);
            memset(rec + sizeof h + tl, 0xab, h.len);
            i += 4;
            if (data[i - 1] >= 0xf0) { /* a heartbeat record instead (LOOK sends them back) */
                ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_BEAT, rec, sizeof h + (size_t)h.len, NULL,
                                  0, NULL, 0);
            } else if (data[i - 1] >= 0xe0) { /* a finished exchange offered (HAD) */
                uint8_t head[2 + 3 + 4 + 4 * WORLD];
                uint32_t mem[WORLD];
                for (uint32_t m = 0; m < h.nmembers; m++)
                    mem[m] = m;
                h.members_hash = ccq_boot_fnv1a(mem, 4u * h.nmembers, CCQ_FNV_OFFSET);
                memcpy(rec, &h, sizeof h);
                memcpy(head, &tl, 2);
                memcpy(head + 2, tag, tl);
                memcpy(head + 2 + tl, &h.nmembers, 4);
                memcpy(head + 6 + tl, mem, 4u * h.nmembers);
                ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_HAD, head, 6u + tl + 4u * h.nmembers, rec,
                                  sizeof h + tl + (size_t)h.len, NULL, 0);
            } else
                ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_PUT, &tl, 2, tag, tl, rec,
                                  sizeof h + tl + (size_t)h.len);
            send_buf(s, ids[c], &b, now);
            break;
        }
        default: {
            ccq_tcp_buf b = {0};
            char tag[4];
            uint16_t tl;
            if (c < 0 || i + 2 > size)
                goto done;
            snprintf(tag, sizeof tag, "t%u", data[i + 1] % 8u);
            tl = (uint16_t)strlen(tag);
            i += 2;
            ccq_tcp_put_frame(&b, SIZE_MAX, CCQ_TCP_GET, &tl, 2, tag, tl, NULL, 0);
            send_buf(s, ids[c], &b, now);
            break;
        }
        }
        if (ccq_tcp_server_memory(s) > bound) {
            fprintf(stderr, "fuzz_tcp: the server holds %zu bytes, beyond its bound %zu\n",
                    ccq_tcp_server_memory(s), bound);
            abort();
        }
    }
done:
    ccq_tcp_server_free(s);
    return 0;
}
