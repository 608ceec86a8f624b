#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <stdatomic.h>
static atomic_int stop;
static unsigned long long now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000ull + t.tv_nsec;
}
static void pin(int c)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(c, &s);
    sched_setaffinity(0, sizeof s, &s);
}
typedef struct {
    int cpu, mode;
    unsigned long long maxgap, n;
} arg;
static void *run(void *p)
{
    arg *a = p;
    if (a->cpu >= 0)
        pin(a->cpu);
    unsigned long long last = now();
    while (!atomic_load(&stop)) {
        if (a->mode == 1)
            sched_yield();
        else if (a->mode == 2) {
            for (volatile int i = 0; i < 200; i++)
                ;
        } else {
            for (volatile int i = 0; i < 200; i++)
                ;
            if ((a->n & 7) == 0)
                sched_yield();
        }
        unsigned long long t = now();
        if (t - last > a->maxgap)
            a->maxgap = t - last;
        last = t;
        a->n++;
    }
    return NULL;
}
int main(int argc, char **argv)
{
    int mode_other = atoi(argv[1]);
    int pinned = atoi(argv[2]);
    pthread_t th[6];
    arg a[6];
    /* thread 0,1: yielders (like Open MPI progress); 2..5: others of mode_other */
    for (int i = 0; i < 6; i++) {
        a[i].cpu = pinned ? i % 2 : -1;
        a[i].mode = i < 2 ? 1 : mode_other;
        a[i].maxgap = 0;
        a[i].n = 0;
        pthread_create(&th[i], 0, run, &a[i]);
    }
    struct timespec ts = {8, 0};
    nanosleep(&ts, 0);
    atomic_store(&stop, 1);
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], 0);
        printf("thread %d cpu %d mode %d: max gap %.1f ms, %llu iterations\n", i, a[i].cpu,
               a[i].mode, a[i].maxgap / 1e6, a[i].n);
    }
}
