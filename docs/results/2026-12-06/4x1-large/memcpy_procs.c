/* P processes at once, each copying an N MiB buffer into another ITERS times: the time per
 * copy each saw. Build: cc -O2 -o memcpy_procs memcpy_procs.c; run: ./memcpy_procs 8 4 200. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    size_t n = (size_t)atol(argv[1]) << 20;
    int procs = atoi(argv[2]), iters = atoi(argv[3]);
    for (int p = 0; p < procs; p++)
        if (fork() == 0) {
            char *a = malloc(n), *b = malloc(n);
            if (a == NULL || b == NULL)
                _exit(1);
            memset(a, 1, n);
            memset(b, 2, n);
            double t0 = now();
            for (int i = 0; i < iters; i++) {
                memcpy(b, a, n);
                __asm__ volatile("" ::"r"(a), "r"(b) : "memory"); /* the copy is used */
            }
            double t = now() - t0;
            printf("process %d: %.1f us per copy of %zu MiB\n", p, t / iters * 1e6, n >> 20);
            fflush(stdout);
            _exit(0);
        }
    while (wait(NULL) > 0)
        ;
    return 0;
}
