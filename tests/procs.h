/* Multi-process tests without MPI: run one function in each of n forked processes (the
 * ranks of a world) and collect their exit statuses, killing any that overrun. Fork before
 * the parent creates any thread (a CMocka test that has not started a runtime). */
#ifndef CCQ_TESTS_PROCS_H
#define CCQ_TESTS_PROCS_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* What a child returns: 0 on success, else a small code its test names. */
typedef int (*procs_fn)(unsigned rank, unsigned nprocs, void *arg);

/* A fresh directory for the file bootstrap ("file:DIR"), removed by procs_rmdir. */
static inline void procs_tmpdir(char *dir, size_t len)
{
    snprintf(dir, len, "/tmp/ccq-world-XXXXXX");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        abort();
    }
}

static inline void procs_rmdir(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

/* Run fn in n processes (rank = 0 .. n-1); status[r] = its exit code, or 128 + signal, or
 * 255 when it had to be killed after timeout_s. Returns how many did not exit 0. */
static inline int procs_run(unsigned n, procs_fn fn, void *arg, unsigned timeout_s, int *status)
{
    pid_t pid[64];
    int bad = 0;
    struct timespec t0, t;

    fflush(NULL);
    for (unsigned r = 0; r < n; r++) {
        pid[r] = fork();
        if (pid[r] < 0) {
            perror("fork");
            abort();
        }
        if (pid[r] == 0)
            _exit(fn(r, n, arg));
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned left = n; left > 0;) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (unsigned r = 0; r < n; r++)
                if (pid[r] == p) {
                    status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                    bad += status[r] != 0;
                    pid[r] = 0;
                }
            left--;
            continue;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > (time_t)timeout_s) {
            for (unsigned r = 0; r < n; r++)
                if (pid[r] > 0) {
                    kill(pid[r], SIGKILL);
                    waitpid(pid[r], NULL, 0);
                    status[r] = 255;
                    bad++;
                    pid[r] = 0;
                    left--;
                }
            break;
        }
        usleep(2000);
    }
    return bad;
}

#endif /* CCQ_TESTS_PROCS_H */
