/* What a schedule over mapped (shared) memory could save, measured without ccq: P processes
 * (fork) each all_reduce a float32 sum of `bytes` through one shared mapping, out of place.
 *   direct: each process copies its input into its own slot of the mapping (the engine's
 *           rule: peers read engine scratch only), then reduces its 1/P block straight from
 *           every slot into its own, then copies all P reduced blocks from their owners' slots
 *           to its output (streaming stores). Three barriers per operation. This is the
 *           schedule a UCX engine could run over `ucp_mem_map` + `ucp_rkey_ptr` scratch.
 *   ideal:  the same with the inputs themselves in the mapping (peers read them in place, as
 *           XPMEM lets MPI do): no copy-in. The engine's rule forbids it; it bounds what any
 *           exchange through memory could do.
 * Prints each process's mean time per operation (20 after 5 warm-ups by default); the
 * slowest is the operation's. Build: cc -O3 -march=native -o shm_allreduce shm_allreduce.c
 * Run: ./shm_allreduce direct 4 8388608 [iters] */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    _Atomic unsigned long v;
    char pad[56];
} flag;

static flag *flags; /* [P][3]: the last operation each process finished each stage of */
static int P;

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* Everyone reached `stage` of operation gen (yielding: more processes than cores). */
static void barrier(int me, unsigned long gen, int stage)
{
    atomic_store(&flags[me * 3 + stage].v, gen);
    for (int q = 0; q < P; q++)
        while (atomic_load(&flags[q * 3 + stage].v) < gen)
            sched_yield();
}

static void stream_copy(float *d, const float *s, size_t n)
{
    size_t i = 0;
#ifdef __AVX512F__
    for (; i < n && ((uintptr_t)(d + i) & 63) != 0; i++)
        d[i] = s[i];
    for (; i + 16 <= n; i += 16)
        _mm512_stream_ps(d + i, _mm512_loadu_ps(s + i));
#endif
    for (; i < n; i++)
        d[i] = s[i];
}

int main(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    int ideal = !strcmp(argv[1], "ideal");
    P = atoi(argv[2]);
    size_t bytes = strtoull(argv[3], NULL, 0), n = bytes / 4, b = n / (size_t)P;
    int iters = argc > 4 ? atoi(argv[4]) : 20;
    flags = mmap(NULL, sizeof(flag) * 3 * (size_t)P, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    /* slots [0, P): each process's scratch; [P, 2P): the inputs (ideal) */
    float *shm = mmap(NULL, 2 * bytes * (size_t)P, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (flags == MAP_FAILED || shm == MAP_FAILED || n % (size_t)P)
        return 1;
    for (int me = 0; me < P; me++) {
        if (me < P - 1 && fork() != 0)
            continue;
        float *in = ideal ? shm + (size_t)(P + me) * n : malloc(bytes);
        float *out = aligned_alloc(64, bytes), *mine = shm + (size_t)me * n;
        for (size_t i = 0; i < n; i++)
            in[i] = (float)(me + 1);
        memset(out, 0, bytes);
        double t0 = 0;
        for (int it = 0; it < iters + 5; it++) {
            unsigned long gen = (unsigned long)it + 1;
            const float *srcs = ideal ? shm + (size_t)P * n : shm; /* where the inputs are */
            if (it == 5)
                t0 = now_us();
            if (!ideal)
                memcpy(mine, in, bytes);
            barrier(me, gen, 0);
            float *acc = mine + (size_t)me * b;
            const float *s0 = srcs + (size_t)me * n + (size_t)me * b;
            const float *s1 = srcs + (size_t)((me + 1) % P) * n + (size_t)me * b;
            for (size_t i = 0; i < b; i++)
                acc[i] = s0[i] + s1[i];
            for (int k = 2; k < P; k++) {
                const float *s = srcs + (size_t)((me + k) % P) * n + (size_t)me * b;
                for (size_t i = 0; i < b; i++)
                    acc[i] += s[i];
            }
            barrier(me, gen, 1);
            for (int q = 0; q < P; q++)
                stream_copy(out + (size_t)q * b, shm + (size_t)q * n + (size_t)q * b, b);
            _mm_sfence();
            barrier(me, gen, 2);
        }
        double t = (now_us() - t0) / iters;
        int bad = 0;
        for (size_t i = 0; i < n; i += 1024)
            bad += out[i] != (float)(P * (P + 1) / 2);
        printf("%s P=%d %zu B: process %d %.1f us per op, wrong %d\n", argv[1], P, bytes, me, t,
               bad);
        exit(0);
    }
    while (wait(NULL) > 0)
        ;
    return 0;
}
