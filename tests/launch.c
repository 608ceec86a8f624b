/* A launcher for the multi-process tests without MPI: runs N copies of a program as the
 * processes of a world, each told its place the way a launcher would, and waits for all of
 * them, bounded in time.
 *
 *   launch -n N [-t SECONDS] [--torchrun PORT] [--expect-killed R] [--env K=V]... -- PROG ARGS
 *
 * Default: CCQ_WORLD_RANK / CCQ_WORLD_SIZE. --torchrun PORT: torchrun's RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=PORT and
 * TORCHELASTIC_RUN_ID (no CCQ_* variable). --expect-killed R: process R is meant to die
 * (killed by a signal); its status is not a failure, and the test fails if it exits.
 * "@PORT@" in an --env value, and --torchrun @PORT@, stand for a TCP port free on 127.0.0.1
 * (one per launch, below the kernel's ephemeral range, chosen at random and checked free):
 * tests that run at the same time practically never share one.
 * Exit status: 0 when every process exited 0; else the first failure's status (128 +
 * signal), 124 when the time ran out (every process is then killed). */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "free_port.h"

#define MAXP 64

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* s with "@PORT@" replaced by port (a new string), or s itself. */
static char *with_port(char *s, int port)
{
    char *at = strstr(s, "@PORT@"), *out;
    if (at == NULL)
        return s;
    if (asprintf(&out, "%.*s%d%s", (int)(at - s), s, port, at + 6) < 0) {
        perror("launch");
        exit(1);
    }
    return out;
}

static void usage(void)
{
    fprintf(stderr, "usage: launch -n N [-t SECONDS] [--torchrun PORT] [--expect-killed R] "
                    "[--env K=V]... -- PROG [ARGS...]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int n = 0, expect_killed = -1, a;
    double timeout = 120;
    /* static: what with_port allocates stays reachable until exit (LeakSanitizer) */
    static const char *torch_port = NULL;
    static char *envs[32];
    int nenv = 0;
    pid_t pid[MAXP];
    int status[MAXP], left, rc = 0;
    double t0;

    for (a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--") == 0) {
            a++;
            break;
        }
        if (a + 1 >= argc)
            usage();
        if (strcmp(argv[a], "-n") == 0)
            n = atoi(argv[++a]);
        else if (strcmp(argv[a], "-t") == 0)
            timeout = atof(argv[++a]);
        else if (strcmp(argv[a], "--torchrun") == 0)
            torch_port = argv[++a];
        else if (strcmp(argv[a], "--expect-killed") == 0)
            expect_killed = atoi(argv[++a]);
        else if (strcmp(argv[a], "--env") == 0 && nenv < 32)
            envs[nenv++] = argv[++a];
        else
            usage();
    }
    if (n < 1 || n > MAXP || a >= argc)
        usage();
    {
        int port = ccq_test_free_port();
        char *tp = torch_port != NULL ? with_port((char *)torch_port, port) : NULL;
        torch_port = tp;
        for (int k = 0; k < nenv; k++)
            envs[k] = with_port(envs[k], port);
    }
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        pid[r] = fork();
        if (pid[r] < 0) {
            perror("fork");
            return 1;
        }
        if (pid[r] == 0) {
            char v[32];
            setpgid(0, 0);
            for (int k = 0; k < nenv; k++)
                putenv(envs[k]);
            snprintf(v, sizeof v, "%d", r);
            if (torch_port != NULL) {
                setenv("RANK", v, 1);
                setenv("LOCAL_RANK", v, 1);
                snprintf(v, sizeof v, "%d", n);
                setenv("WORLD_SIZE", v, 1);
                setenv("LOCAL_WORLD_SIZE", v, 1);
                setenv("MASTER_ADDR", "127.0.0.1", 1);
                setenv("MASTER_PORT", torch_port, 1);
                snprintf(v, sizeof v, "launch-%ld", (long)getppid());
                setenv("TORCHELASTIC_RUN_ID", v, 1);
            } else {
                setenv("CCQ_WORLD_RANK", v, 1);
                snprintf(v, sizeof v, "%d", n);
                setenv("CCQ_WORLD_SIZE", v, 1);
            }
            execvp(argv[a], argv + a);
            fprintf(stderr, "launch: cannot run %s: %s\n", argv[a], strerror(errno));
            _exit(127);
        }
        status[r] = -1;
    }
    t0 = now_s();
    for (left = n; left > 0;) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < n; r++) {
                if (pid[r] != p)
                    continue;
                status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                pid[r] = 0;
                left--;
                if (r == expect_killed) {
                    if (WIFEXITED(st)) {
                        fprintf(stderr,
                                "launch: process %d was meant to be killed but exited "
                                "with %d\n",
                                r, WEXITSTATUS(st));
                        if (rc == 0)
                            rc = 1;
                    }
                } else if (status[r] != 0) {
                    fprintf(stderr, "launch: process %d ended with status %d\n", r, status[r]);
                    if (rc == 0)
                        rc = status[r];
                }
            }
            continue;
        }
        if (now_s() - t0 > timeout) {
            fprintf(stderr, "launch: %d process(es) still running after %.0f s: killing them\n",
                    left, timeout);
            for (int r = 0; r < n; r++)
                if (pid[r] > 0) {
                    kill(-pid[r], SIGKILL);
                    kill(pid[r], SIGKILL);
                    waitpid(pid[r], NULL, 0);
                    fprintf(stderr, "launch: process %d killed\n", r);
                }
            return 124;
        }
        usleep(5000);
    }
    return rc;
}
