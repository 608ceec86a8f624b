/* The mapped all_reduce's memory traffic against a single copy (process_vm_readv), outside ccq:
 * P forked processes, float32 sums of MIB MiB, A (slots) and B (CMA) alternating; prints each
 * one's median and fastest time per operation (README.md beside it says what each does).
 *   gcc -O2 -mavx2 -o slots_vs_cma slots_vs_cma.c
 *   ./slots_vs_cma P MIB REPS [NT_IN (1: streaming stores into the slots)] [CHUNK_KIB] */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXP 8
typedef struct {
    _Atomic unsigned long bar;
    pid_t pid[MAXP];
    float *in[MAXP];
    double t[2][64];
} shared_t;
static shared_t *sh;
static int P, me;
static char *slots; /* P slots of N floats */
static unsigned long bar_gen;

static void barrier(void)
{
    bar_gen++;
    atomic_fetch_add(&sh->bar, 1);
    while (atomic_load(&sh->bar) < bar_gen * P)
        sched_yield();
}
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static void copy_nt(float *d, const float *s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_stream_ps(d + i, _mm256_loadu_ps(s + i));
    for (; i < n; i++)
        d[i] = s[i];
    _mm_sfence();
}
static void red(float *d, const float *const *src, int k, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float a = src[0][i];
        for (int j = 1; j < k; j++)
            a += src[j][i];
        d[i] = a;
    }
}
int main(int argc, char **argv)
{
    P = atoi(argv[1]);
    size_t N = (size_t)atol(argv[2]) << 20 >> 2; /* floats */
    int reps = atoi(argv[3]);
    int nt_in = argc > 4 ? atoi(argv[4]) : 1;
    size_t chunk = argc > 5 ? (size_t)atol(argv[5]) << 10 >> 2 : 65536;
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    slots = mmap(NULL, P * N * 4, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    memset(slots, 0, P * N * 4);
    me = 0;
    for (int i = 1; i < P; i++)
        if (fork() == 0) {
            me = i;
            break;
        }
    float *in = aligned_alloc(64, N * 4), *out = aligned_alloc(64, N * 4), *tmp = aligned_alloc(64, MAXP * chunk * 4);
    for (size_t i = 0; i < N; i++)
        in[i] = (float)(me + 1), out[i] = 0;
    memset(tmp, 0, MAXP * chunk * 4);
    sh->pid[me] = getpid();
    sh->in[me] = in;
    barrier();
    float *mine = (float *)(slots + me * N * 4);
    size_t b = N / P, bo = me * b;
    for (int r = 0; r < 2 * reps; r++) {
        int alg = r & 1;
        barrier();
        double t0 = now();
        if (alg == 0) { /* copy-in, reduce own block from slots, copy-out */
            if (nt_in)
                copy_nt(mine, in, N);
            else
                memcpy(mine, in, N * 4);
            barrier();
            const float *src[MAXP];
            for (int p = 0; p < P; p++)
                src[p] = (float *)(slots + p * N * 4) + bo;
            red(mine + bo, src, P, b);
        } else { /* CMA: read peers' input blocks in chunks, reduce with own input into own slot */
            barrier();
            for (size_t c = 0; c < b; c += chunk) {
                size_t n = b - c < chunk ? b - c : chunk;
                const float *src[MAXP];
                int k = 0;
                for (int p = 0; p < P; p++) {
                    if (p == me) {
                        src[k++] = in + bo + c;
                        continue;
                    }
                    struct iovec l = {tmp + k * chunk, n * 4}, rm = {sh->in[p] + bo + c, n * 4};
                    if (process_vm_readv(sh->pid[p], &l, 1, &rm, 1, 0) != (ssize_t)(n * 4)) {
                        perror("process_vm_readv");
                        exit(1);
                    }
                    src[k] = tmp + k * chunk;
                    k++;
                }
                red(mine + bo + c, src, P, n);
            }
        }
        barrier();
        for (int p = 0; p < P; p++)
            copy_nt(out + p * b, (float *)(slots + p * N * 4) + p * b, b);
        barrier();
        double t1 = now();
        if (out[0] != P * (P + 1) / 2.0f || out[N - 1] != P * (P + 1) / 2.0f) {
            fprintf(stderr, "wrong %f\n", out[0]);
            exit(1);
        }
        if (me == 0)
            sh->t[alg][r / 2] = t1 - t0;
    }
    if (me == 0) {
        for (int i = 1; i < P; i++)
            wait(NULL);
        for (int a = 0; a < 2; a++) {
            double *t = sh->t[a];
            for (int i = 0; i < reps; i++)
                for (int j = i + 1; j < reps; j++)
                    if (t[j] < t[i]) {
                        double x = t[i]; t[i] = t[j]; t[j] = x;
                    }
            printf("%s median %.2f ms min %.2f\n", a ? "cma " : "slot", t[reps / 2] * 1e3, t[0] * 1e3);
        }
    }
    return 0;
}
