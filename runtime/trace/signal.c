/* Trace dumps on SIGUSR1 (ccq_config.trace_signal): `kill -USR1 <pid>` makes every runtime of
 * the process that has a trace_file write it, without stopping anything, so a job that looks
 * stuck can be looked at before it is killed.
 *
 * A signal handler may only do async-signal-safe things, and a dump takes locks, allocates
 * and asks the scheduler for a copy. So the handler only writes a byte to a pipe (write(2) is
 * async-signal-safe) and chains to the handler that was there before; a "dumper" thread of
 * ccq's, blocked in poll(2) on the pipe, does the dumps, as any other thread calling
 * ccq_trace_dump would. The handler, once installed, stays for the life of the process (an
 * embedder may have installed its own after it, which restoring the old one would undo);
 * the dumper thread runs while at least one runtime that asked for the handler lives. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/thread_name.h"
#include "runtime/internal.h"

typedef struct reg_entry {
    ccq_runtime *rt;
    bool wants_signal;
    struct reg_entry *next;
} reg_entry;

/* life_lock serialises attach and detach, and so the dumper's start and join; reg_lock
 * guards the list, and the dumper holds it while it dumps (so a runtime is never freed in
 * the middle of its dump: detach waits). The dumper never takes life_lock. */
static pthread_mutex_t life_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static reg_entry *reg;
static unsigned nsignal; /* attached runtimes that asked for the handler */
static pthread_t dumper;
static bool dumper_running;
static atomic_bool stop_dumper;
static atomic_ulong dumps_done; /* signal dumps written (ccq_trace_signal_dumps) */

/* Set once, before the handler is installed, then only read (by the handler too). */
static int pipe_fd[2] = {-1, -1};
static struct sigaction prev_action;
static bool installed;

static void on_sigusr1(int sig, siginfo_t *info, void *uctx)
{
    int saved = errno;
    char b = 1;
    /* Non-blocking: a full pipe already holds a pending request. */
    if (write(pipe_fd[1], &b, 1) < 0) {
    }
    errno = saved;
    /* Chain to what was there before (the default action of SIGUSR1 is to terminate the
     * process, which is exactly what an embedder asking for this handler does not want). */
    if (prev_action.sa_flags & SA_SIGINFO) {
        if (prev_action.sa_sigaction != NULL)
            prev_action.sa_sigaction(sig, info, uctx);
    } else if (prev_action.sa_handler != SIG_DFL && prev_action.sa_handler != SIG_IGN) {
        prev_action.sa_handler(sig);
    }
}

/* Read what is in the pipe; true if anything was. */
static bool drain(void)
{
    char buf[64];
    bool any = false;
    ssize_t n;
    while ((n = read(pipe_fd[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
        any |= n > 0;
    return any;
}

static void *dumper_main(void *arg)
{
    (void)arg;
    ccq_thread_name("ccq-trace-dump");
    for (;;) {
        struct pollfd p = {.fd = pipe_fd[0], .events = POLLIN};
        if (poll(&p, 1, -1) < 0 && errno != EINTR)
            break;
        bool asked = drain();
        if (atomic_load(&stop_dumper))
            break;
        if (!asked)
            continue;
        pthread_mutex_lock(&reg_lock);
        for (reg_entry *e = reg; e != NULL; e = e->next)
            if (e->rt->trace.file != NULL && e->rt->trace.cap != 0)
                ccq_trace_dump_to_file(e->rt, "signal");
        atomic_fetch_add(&dumps_done, 1);
        pthread_mutex_unlock(&reg_lock);
    }
    return NULL;
}

/* The pipe and the handler, once per process. Under life_lock. */
static ccq_status install(void)
{
    struct sigaction act;
    if (installed)
        return CCQ_OK;
    if (pipe2(pipe_fd, O_CLOEXEC | O_NONBLOCK) != 0)
        return ccq_fail(CCQ_ERR_NO_MEMORY, "trace_signal: cannot create a pipe: %s",
                        strerror(errno));
    /* Read the old action before installing ours: a signal arriving right after the switch
     * finds prev_action complete. */
    sigaction(SIGUSR1, NULL, &prev_action);
    memset(&act, 0, sizeof act);
    act.sa_sigaction = on_sigusr1;
    act.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&act.sa_mask);
    if (sigaction(SIGUSR1, &act, NULL) != 0) {
        close(pipe_fd[0]);
        close(pipe_fd[1]);
        pipe_fd[0] = pipe_fd[1] = -1;
        return ccq_fail(CCQ_ERR_INVALID_ARGUMENT,
                        "trace_signal: cannot install a SIGUSR1 handler: %s", strerror(errno));
    }
    installed = true;
    return CCQ_OK;
}

/* Start the dumper, with every signal blocked in it (it must not run the handler itself, nor
 * take the embedder's signals). Under life_lock. */
static ccq_status start_dumper(void)
{
    sigset_t all, old;
    int rc;
    drain(); /* requests from before anyone listened are stale */
    atomic_store(&stop_dumper, false);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&dumper, NULL, dumper_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return ccq_fail(CCQ_ERR_NO_MEMORY, "trace_signal: cannot start the dump thread: %s",
                        strerror(rc));
    dumper_running = true;
    return CCQ_OK;
}

static void stop_dumper_thread(void)
{
    char b = 0;
    atomic_store(&stop_dumper, true);
    if (write(pipe_fd[1], &b, 1) < 0) { /* full: it wakes up anyway */
    }
    pthread_join(dumper, NULL);
    dumper_running = false;
}

ccq_status ccq_trace_attach(ccq_runtime *rt, bool wants_signal)
{
    ccq_status st = CCQ_OK;
    reg_entry *e;

    if (!wants_signal && (rt->trace.file == NULL || rt->trace.cap == 0))
        return CCQ_OK; /* nothing to dump, no handler wanted */
    e = malloc(sizeof *e);
    if (e == NULL)
        return ccq_fail(CCQ_ERR_NO_MEMORY, "trace_signal: out of memory");
    e->rt = rt;
    e->wants_signal = wants_signal;
    pthread_mutex_lock(&life_lock);
    if (wants_signal && nsignal == 0) {
        st = install();
        if (st == CCQ_OK)
            st = start_dumper();
    }
    if (st == CCQ_OK) {
        nsignal += wants_signal;
        pthread_mutex_lock(&reg_lock);
        e->next = reg;
        reg = e;
        pthread_mutex_unlock(&reg_lock);
    } else {
        free(e);
    }
    pthread_mutex_unlock(&life_lock);
    return st;
}

void ccq_trace_detach(ccq_trace *t)
{
    reg_entry *found = NULL;
    pthread_mutex_lock(&life_lock);
    pthread_mutex_lock(&reg_lock); /* waits for a dump of this runtime in progress */
    for (reg_entry **p = &reg; *p != NULL; p = &(*p)->next)
        if (&(*p)->rt->trace == t) {
            found = *p;
            *p = found->next;
            break;
        }
    pthread_mutex_unlock(&reg_lock);
    if (found != NULL && found->wants_signal && --nsignal == 0 && dumper_running)
        stop_dumper_thread();
    pthread_mutex_unlock(&life_lock);
    free(found);
}

unsigned long ccq_trace_signal_dumps(void)
{
    return atomic_load(&dumps_done);
}
