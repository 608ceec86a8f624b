/* Shared helpers of the bench/ programs: clock, statistics, JSON output. Header-only. */
#ifndef CCQ_BENCH_COMMON_H
#define CCQ_BENCH_COMMON_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static inline uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CPU seconds the whole process (every thread) has used so far. */
static inline double bench_cpu_s(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_stime.tv_sec +
           ((double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_usec) / 1e6;
}

/* Sleep s seconds (resumed after a signal). */
static inline void bench_sleep_s(double s)
{
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&t, &t) != 0)
        ;
}

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The p-th percentile (0..100) of n values; sorts them in place. */
static inline double bench_percentile(double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, bench_cmp_double);
    size_t k = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
    return v[k < n ? k : n - 1];
}

static inline double bench_median(double *v, size_t n)
{
    return bench_percentile(v, n, 50);
}

/* Optional JSON output: bench programs take `--json FILE` and append records there. */
typedef struct bench_json {
    FILE *f;
    int n;
} bench_json;

static inline void bench_json_open(bench_json *j, int argc, char **argv, const char *name)
{
    j->f = NULL;
    j->n = 0;
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--json") == 0) {
            j->f = fopen(argv[i + 1], "w");
            if (j->f == NULL)
                perror(argv[i + 1]);
            else
                fprintf(j->f, "{\"bench\": \"%s\", \"records\": [\n", name);
        }
}

/* One record: pass a printf format producing the inside of a JSON object. */
__attribute__((format(printf, 2, 3))) static inline void bench_json_record(bench_json *j,
                                                                           const char *fmt, ...)
{
    va_list ap;
    if (j->f == NULL)
        return;
    fprintf(j->f, "%s  {", j->n++ ? ",\n" : "");
    va_start(ap, fmt);
    vfprintf(j->f, fmt, ap);
    va_end(ap);
    fprintf(j->f, "}");
}

static inline void bench_json_close(bench_json *j)
{
    if (j->f == NULL)
        return;
    fprintf(j->f, "\n]}\n");
    fclose(j->f);
}

/* An integer option `--name N` (or the default). */
static inline long bench_opt(int argc, char **argv, const char *name, long def)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return atol(argv[i + 1]);
    return def;
}

#endif /* CCQ_BENCH_COMMON_H */
