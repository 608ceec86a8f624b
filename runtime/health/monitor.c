/* The health monitor: one thread per runtime in a world of several processes. Every
 * heartbeat_ms it publishes this process's record (its progress, and the processes it knows to
 * be lost) through the bootstrap; about twice per heartbeat it reads the others'. A process is
 * declared lost when the OS says it is gone (its pidfd on this host, a closed rendezvous
 * connection, an engine's peer error) or when its beat has not advanced for
 * heartbeat_timeout_ms. The declaration goes out in this process's next record at once, and
 * every survivor that reads it takes it over (relaying it in its own record, so it outlives
 * the process that saw it): every survivor agrees. A process that finds itself declared lost
 * while it runs (it was stopped, or cut off) is fenced off: it reads its own state as lost and
 * its spanning communicators fail naming itself. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/thread_name.h"
#include "runtime/boot/bootstrap.h"
#include "runtime/health/health_impl.h"
#include "runtime/internal.h"

uint64_t ccq_health_realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------------------------ */
/* Declarations                                                                          */
/* ------------------------------------------------------------------------------------ */

void ccq_health_kick(ccq_health *h)
{
    uint64_t one = 1;
    if (h->wake_fd >= 0 && write(h->wake_fd, &one, sizeof one) < 0) {
        /* EAGAIN: the counter is full, the monitor will wake anyway */
    }
}

/* Leave ALIVE for `state` (lock held): false if it had left already. */
static bool leave_alive(ccq_health *h, uint32_t p, uint32_t state)
{
    uint32_t alive = CCQ_PROCESS_ALIVE;
    if (!atomic_compare_exchange_strong_explicit(&h->peers[p].state, &alive, state,
                                                 memory_order_acq_rel, memory_order_acquire))
        return false;
    atomic_fetch_add_explicit(&h->epoch, 1, memory_order_release);
    return true;
}

bool ccq_health_declare(ccq_health *h, uint32_t process, uint32_t by, uint32_t how,
                        uint64_t hb_age_ns, uint64_t when_realtime)
{
    hpeer *p = &h->peers[process];
    bool changed;

    if (when_realtime == 0)
        when_realtime = ccq_health_realtime_ns();
    pthread_mutex_lock(&h->lock);
    /* The details first: whoever sees the state LOST (acquire) reads them under the lock. */
    if (atomic_load_explicit(&p->state, memory_order_relaxed) == CCQ_PROCESS_ALIVE) {
        p->by = by;
        p->how = how;
        p->hb_age_ns = hb_age_ns;
        p->realtime_ns = when_realtime;
        p->lost_ns = ccq_now_ns();
    }
    changed = leave_alive(h, process, CCQ_PROCESS_LOST);
    if (changed && h->nlost < h->size) {
        ccq_hb_lost *e = &h->lost[h->nlost++];
        memset(e, 0, sizeof *e);
        e->rank = process;
        e->by = by;
        e->how = how;
        e->hb_age_ns = hb_age_ns;
        e->realtime_ns = when_realtime;
    }
    pthread_mutex_unlock(&h->lock);
    if (changed) {
        atomic_store_explicit(&h->publish, 1, memory_order_release);
        ccq_health_kick(h);
        ccq_wake_signal(&h->rt->wake); /* the scheduler applies it */
    }
    return changed;
}

/* A process that destroyed its runtime cleanly. */
static void mark_left(ccq_health *h, uint32_t process)
{
    pthread_mutex_lock(&h->lock);
    bool changed = leave_alive(h, process, CCQ_PROCESS_LEFT);
    pthread_mutex_unlock(&h->lock);
    if (changed)
        ccq_wake_signal(&h->rt->wake);
}

void ccq_health_peer_failed(ccq_runtime *rt, uint32_t process)
{
    ccq_health *h = rt->health;
    uint64_t now = ccq_now_ns();

    if (h == NULL || process >= h->size || process == h->rank)
        return;
    /* Fenced off (the others gave it up, or it cut itself off): its view counts for nothing,
     * as in check_ages. Its engine reports the peers it can no longer reach, the ones that
     * gave it up among them: with the data network cut and the bootstrap still reaching every
     * process, the others would take its word and declare the very processes that go on. */
    if (ccq_health_state_of(h, h->rank) != CCQ_PROCESS_ALIVE)
        return;
    pthread_mutex_lock(&h->lock);
    uint64_t age = now - h->peers[process].change_ns;
    bool judged = h->judged, new = judged && !h->suspects[process];
    if (judged)
        h->suspects[process] = 1;
    pthread_mutex_unlock(&h->lock);
    /* A suspicion for the judge (judge.c), which this process's next record carries at once;
     * with nobody to judge (no records, or heartbeats off), the word is the verdict. */
    if (new) {
        atomic_store_explicit(&h->publish, 1, memory_order_release);
        ccq_health_kick(h);
    }
    if (!judged)
        ccq_health_declare(h, process, h->rank, CCQ_HOW_ENGINE, age, ccq_health_realtime_ns());
}

/* ------------------------------------------------------------------------------------ */
/* This process's record                                                                 */
/* ------------------------------------------------------------------------------------ */

static bool prog_answered(void *arg)
{
    ccq_health *h = arg;
    return atomic_load_explicit(&h->prog_req, memory_order_acquire) == 0 ||
           atomic_load_explicit(&h->rt->sched_exited, memory_order_acquire) != 0;
}

/* Ask the scheduler for this process's progress and wait for it a little (a scheduler stuck in
 * a backend call must not stop the heartbeat: then the record carries the last answer). */
static void refresh_progress(ccq_health *h, uint64_t wait_ns)
{
    if (atomic_load_explicit(&h->rt->sched_exited, memory_order_acquire))
        return;
    atomic_store_explicit(&h->prog_req, 1, memory_order_release);
    ccq_wake_signal(&h->rt->wake);
    ccq_signal_wait(&h->prog_sig, prog_answered, h, ccq_deadline_in(wait_ns));
}

/* Encode and publish this process's record saying `state`; with_progress false leaves the
 * communicators out (the last record of a process that left). */
static void publish(ccq_health *h, uint32_t state, bool with_progress)
{
    ccq_hb_head head;
    unsigned char *buf;
    size_t len;
    ccq_errbuf err = {{0}};

    if (with_progress)
        refresh_progress(h, 20000000u);
    memset(&head, 0, sizeof head);
    head.magic = CCQ_HB_MAGIC;
    head.version = CCQ_HB_VERSION;
    head.head_size = sizeof head;
    head.world_size = h->size;
    head.rank = h->rank;
    head.nonce = ccq_boot_nonce(h->boot);
    head.beat = ++h->beat;
    head.realtime_ns = ccq_health_realtime_ns();
    head.state = state;
    head.pid = h->pid;
    head.host_id = h->host_id;
    head.start_time = h->start_time;
    head.heartbeat_ms = (uint32_t)(h->hb_ns / 1000000u);
    head.heartbeat_timeout_ms = (uint32_t)(h->timeout_ns / 1000000u);
    head.first_device = h->first_device;
    head.ndevices = h->ndevices;
    snprintf(head.hostname, sizeof head.hostname, "%s", h->hostname);

    pthread_mutex_lock(&h->lock);
    /* After the losses, this process's suspicions of processes still alive (judge.c): at most
     * size entries in all, since a process is either lost or alive. */
    uint32_t nsus = 0;
    for (uint32_t q = 0; q < h->size; q++)
        nsus += h->suspects[q] && ccq_health_state_of(h, q) == CCQ_PROCESS_ALIVE;
    if (h->nlost + nsus > h->size)
        nsus = h->size - h->nlost;
    head.nlost = h->nlost + nsus;
    head.ncomms = with_progress ? h->mine_n : 0;
    len = sizeof head + head.nlost * sizeof(ccq_hb_lost) + (with_progress ? h->mine_len : 0);
    buf = malloc(len);
    if (buf != NULL) {
        ccq_hb_lost *e = (ccq_hb_lost *)(buf + sizeof head);
        memcpy(buf, &head, sizeof head);
        memcpy(e, h->lost, h->nlost * sizeof(ccq_hb_lost));
        e += h->nlost;
        for (uint32_t q = 0, k = 0; q < h->size && k < nsus; q++)
            if (h->suspects[q] && ccq_health_state_of(h, q) == CCQ_PROCESS_ALIVE)
                e[k++] = (ccq_hb_lost){.rank = q,
                                       .by = h->rank,
                                       .how = CCQ_HOW_SUSPECT,
                                       .realtime_ns = head.realtime_ns};
        if (with_progress && h->mine_len > 0)
            memcpy(buf + sizeof head + head.nlost * sizeof(ccq_hb_lost), h->mine, h->mine_len);
    }
    pthread_mutex_unlock(&h->lock);
    if (buf == NULL)
        return; /* the next beat tries again */
    /* A failure (full disk, a store error) only delays this beat: the others see it late and
     * may declare this process lost, which is what a process that cannot publish is. */
    ccq_boot_beat_publish(h->boot, buf, len, &err);
    free(buf);
}

/* ------------------------------------------------------------------------------------ */
/* The others' records                                                                   */
/* ------------------------------------------------------------------------------------ */

/* Take over the losses a record lists (also a last record: a process that left still tells
 * what it knew). */
static void relay_losses(ccq_health *h, const ccq_hb_view *v)
{
    for (uint32_t k = 0; k < v->head->nlost; k++) {
        ccq_hb_lost e = v->lost[k];
        /* (A suspicion is no loss: only the judge weighs it, judge.c.) */
        if (e.rank < h->size && e.by < h->size && e.how < CCQ_HOW_COUNT_ &&
            e.how != CCQ_HOW_SUSPECT)
            ccq_health_declare(h, e.rank, e.by, e.how, e.hb_age_ns, e.realtime_ns);
    }
}

/* Read process q's latest record: note its beat advancing, take over the losses it lists,
 * watch its process if it runs on this host. */
static void read_one(ccq_health *h, uint32_t q, uint64_t now)
{
    hpeer *p = &h->peers[q];
    void *rec = NULL;
    size_t len = 0;
    ccq_errbuf err = {{0}};
    ccq_hb_view v;
    const char *why;
    bool gone = false;

    if (ccq_boot_beat_fetch(h->boot, q, &rec, &len, &err) != CCQ_OK) {
        free(rec);
        return; /* none yet, or unreadable now: its age keeps growing */
    }
    if (ccq_hb_decode(rec, len, &v, &why) != 0 || v.head->rank != q ||
        v.head->world_size != h->size ||
        v.head->nonce != ccq_boot_peer_nonce(h->boot, q)) { /* an earlier job's */
        free(rec);
        return;
    }
    pthread_mutex_lock(&h->lock);
    if (v.head->beat != p->beat) {
        p->beat = v.head->beat;
        p->change_ns = now;
        free(p->rec);
        p->rec = rec;
        p->rec_len = len;
        rec = NULL;
        if (v.head->state == CCQ_HB_ALIVE &&
            !ccq_os_watch(h, p, v.head->pid, v.head->host_id, v.head->start_time))
            gone = true;
    }
    pthread_mutex_unlock(&h->lock);
    if (rec != NULL) { /* the same beat as before: nothing new in it */
        free(rec);
        return;
    }
    if (v.head->state == CCQ_HB_LEFT)
        mark_left(h, q);
    else if (gone)
        ccq_health_declare(h, q, h->rank, CCQ_HOW_EXITED, 0, ccq_health_realtime_ns());
    relay_losses(h, &v); /* (v points into p->rec, which only this thread replaces) */
}

/* Whether process q is gone for certain in this process's view: it left cleanly, or the OS
 * said it exited (a pidfd, or its closed rendezvous connection). A process lost to silence
 * (its heartbeat, a silent server, an engine's timeout) may be alive beyond a cut network.
 * Lock held. */
static bool gone_for_certain(const ccq_health *h, uint32_t q)
{
    uint32_t st = ccq_health_state_of(h, q);
    return st == CCQ_PROCESS_LEFT ||
           (st == CCQ_PROCESS_LOST &&
            (h->peers[q].how == CCQ_HOW_EXITED || h->peers[q].how == CCQ_HOW_CLOSED));
}

/* A cut network must not leave two worlds going on apart (each side declaring the other lost,
 * forming communicators of its own: a split brain). Only a quorum goes on: more than half of
 * the processes not gone for certain, or exactly half holding the lowest of them; two sides of
 * any cut cannot both hold one. Whether this process hears one: itself, and the processes
 * alive in its view whose beat is at most fresh_ns old at `at` (counted from `since`, the
 * relay window's start, as check_ages counts). */
static bool hears_quorum(ccq_health *h, uint64_t at, uint64_t since, uint64_t fresh_ns)
{
    uint32_t members = 0, heard = 0;
    bool lowest_heard = false;

    pthread_mutex_lock(&h->lock);
    for (uint32_t q = 0; q < h->size; q++) {
        uint64_t from = h->peers[q].change_ns > since ? h->peers[q].change_ns : since;
        bool hears = q == h->rank || (ccq_health_state_of(h, q) == CCQ_PROCESS_ALIVE &&
                                      (at <= from || at - from <= fresh_ns));
        if (gone_for_certain(h, q))
            continue;
        if (members++ == 0)
            lowest_heard = hears;
        heard += hears;
    }
    pthread_mutex_unlock(&h->lock);
    return 2 * heard > members || (2 * heard == members && lowest_heard);
}

/* How old a beat may be and still count as heard (check_ages, the judge): half of
 * heartbeat_timeout_ms, two heartbeats at least, the timeout at most. */
static uint64_t fresh_ns(const ccq_health *h)
{
    uint64_t fresh = h->timeout_ns / 2 > 2 * h->hb_ns ? h->timeout_ns / 2 : 2 * h->hb_ns;
    return fresh < h->timeout_ns ? fresh : h->timeout_ns;
}

/* Processes whose beat stopped within the relay window [since, until] of the last read are
 * declared lost, but only by a process that hears a quorum of fresh beats (at most half
 * heartbeat_timeout_ms old, two heartbeats at least): one cut off from the others sees their
 * beats stop one after another (their last ones a heartbeat or so apart), and judging each
 * against the ones not yet timed out, it would declare them all and go on alone. It declares
 * nobody instead, and cuts itself off (check_quorum). */
static void check_ages(ccq_health *h, uint64_t now, uint64_t since, uint64_t until)
{
    uint64_t at = now < until ? now : until;

    if (ccq_health_state_of(h, h->rank) != CCQ_PROCESS_ALIVE)
        return; /* fenced off: its view counts for nothing */
    if (!hears_quorum(h, at, since, fresh_ns(h)))
        return;
    for (uint32_t q = 0; q < h->size; q++) {
        uint64_t from = h->peers[q].change_ns > since ? h->peers[q].change_ns : since;
        uint64_t age = at > from ? at - from : 0;
        if (q == h->rank || ccq_health_state_of(h, q) != CCQ_PROCESS_ALIVE || age <= h->timeout_ns)
            continue;
        ccq_health_declare(h, q, h->rank, CCQ_HOW_HEARTBEAT, age, ccq_health_realtime_ns());
    }
}

/* A process that has heard no quorum for 2 x heartbeat_timeout_ms (one to find a silent
 * rendezvous server lost, one for its successor to take over and the records to travel again)
 * declares itself lost: it is fenced off as one the others gave up is. */
static void check_quorum(ccq_health *h, uint64_t now)
{
    if (ccq_health_state_of(h, h->rank) != CCQ_PROCESS_ALIVE)
        return;
    if (hears_quorum(h, now, 0, h->timeout_ns))
        h->quorum_ns = now;
    else if (now - h->quorum_ns > 2 * h->timeout_ns)
        ccq_health_declare(h, h->rank, h->rank, CCQ_HOW_CUT_OFF, now - h->quorum_ns, 0);
}

void ccq_health_exited(ccq_health *h, uint32_t q)
{
    void *rec = NULL;
    size_t len = 0;
    ccq_errbuf err = {{0}};
    ccq_hb_view v;
    const char *why;
    bool left;

    if (ccq_health_state_of(h, q) != CCQ_PROCESS_ALIVE)
        return;
    /* A clean exit published "left" before it exited; its last record may also list losses
     * that no read saw yet (it may have lived only a moment after learning them). */
    left = h->records && ccq_boot_beat_fetch(h->boot, q, &rec, &len, &err) == CCQ_OK &&
           ccq_hb_decode(rec, len, &v, &why) == 0 && v.head->rank == q &&
           v.head->nonce == ccq_boot_peer_nonce(h->boot, q) && v.head->state == CCQ_HB_LEFT;
    if (left) {
        mark_left(h, q);
        relay_losses(h, &v);
        free(rec);
        return;
    }
    free(rec);
    pthread_mutex_lock(&h->lock);
    uint64_t age = ccq_now_ns() - h->peers[q].change_ns;
    pthread_mutex_unlock(&h->lock);
    ccq_health_declare(h, q, h->rank, CCQ_HOW_EXITED, age, ccq_health_realtime_ns());
}

/* ------------------------------------------------------------------------------------ */
/* The thread                                                                            */
/* ------------------------------------------------------------------------------------ */

static void *monitor_main(void *arg)
{
    ccq_health *h = arg;
    /* Reading about twice per heartbeat: a declaration reaches every reader within half a
     * heartbeat, and an age is measured to that resolution. */
    uint64_t read_ns = h->hb_ns / 2;
    uint64_t now = ccq_now_ns(), next_beat = now, next_read = now, last = now;
    uint64_t win_since = 0, win_until = UINT64_MAX; /* the relay window of the last read */
    /* A pass that comes this late means the process was stopped (SIGSTOP, a debugger) or
     * starved: the others' silence meanwhile says nothing about them. */
    uint64_t gap_ns;
    struct pollfd *pfd = calloc(h->size + 1, sizeof *pfd);
    uint32_t *who = calloc(h->size + 1, sizeof *who);

    ccq_thread_name("ccq-health");
    if (read_ns < 1000000u)
        read_ns = 1000000u;
    if (read_ns > 500000000u)
        read_ns = 500000000u;
    gap_ns = h->timeout_ns / 2 > 3 * read_ns ? h->timeout_ns / 2 : 3 * read_ns;
    if (pfd == NULL || who == NULL) {
        /* Without memory the monitor cannot run: heartbeats stop, which the others see. */
        free(pfd);
        free(who);
        return NULL;
    }
    for (;;) {
        uint32_t n = 0;
        uint32_t closed[64];
        size_t nclosed;

        if (atomic_load_explicit(&h->stop, memory_order_acquire))
            break;
        now = ccq_now_ns();
        if (now - last > gap_ns) {
            pthread_mutex_lock(&h->lock);
            for (uint32_t q = 0; q < h->size; q++)
                h->peers[q].change_ns = now;
            pthread_mutex_unlock(&h->lock);
            h->quorum_ns = now;
            next_read = now; /* and learn at once whether it was declared lost meanwhile */
        }
        if (!h->records) {
            /* No heartbeat records on this bootstrap (MPI): only the OS's word on the
             * processes of this host. */
            next_read = next_beat = now + 3600000000000ull;
        } else if (now >= next_read) {
            /* Records could reach this process only within this window (tcp: through the
             * server, since this process connected to it and while it sends): an age counts
             * within it only, so a silent server makes nobody else look silent. Read before
             * the records, never after: a window that counts frames the records at hand do not
             * hold yet would age them (this thread read them, the I/O thread then took fresh
             * ones in). */
            ccq_boot_relay_window(h->boot, &win_since, &win_until);
            for (uint32_t q = 0; q < h->size; q++)
                if (q != h->rank && ccq_health_state_of(h, q) == CCQ_PROCESS_ALIVE)
                    read_one(h, q, now);
            next_read = now + read_ns;
        }
        if (!h->records) {
            atomic_store_explicit(&h->publish, 0, memory_order_relaxed);
        } else if (atomic_exchange_explicit(&h->publish, 0, memory_order_acq_rel) ||
                   now >= next_beat) {
            publish(h,
                    ccq_health_state_of(h, h->rank) == CCQ_PROCESS_ALIVE ? CCQ_HB_ALIVE
                                                                         : CCQ_HB_LOST,
                    true);
            next_beat = now + h->hb_ns;
        }
        /* This process served the tcp rendezvous, was stopped, and the others gave it up:
         * fenced off, as one that reads itself in another's list of losses (the records its
         * successor sent usually said so first, naming who declared it and how). */
        uint32_t by;
        if (ccq_health_state_of(h, h->rank) == CCQ_PROCESS_ALIVE &&
            ccq_boot_given_up(h->boot, &by) && by < h->size)
            ccq_health_declare(h, h->rank, by, CCQ_HOW_SILENT, h->timeout_ns, 0);
        while ((nclosed = ccq_boot_silent_peers(h->boot, closed, 64)) > 0)
            for (size_t k = 0; k < nclosed; k++)
                if (closed[k] < h->size && closed[k] != h->rank)
                    ccq_health_declare(h, closed[k], h->rank, CCQ_HOW_SILENT,
                                       now - h->peers[closed[k]].change_ns,
                                       ccq_health_realtime_ns());
        while ((nclosed = ccq_boot_closed_peers(h->boot, closed, 64)) > 0)
            for (size_t k = 0; k < nclosed; k++)
                if (closed[k] < h->size && closed[k] != h->rank)
                    ccq_health_declare(h, closed[k], h->rank, CCQ_HOW_CLOSED,
                                       now - h->peers[closed[k]].change_ns,
                                       ccq_health_realtime_ns());
        if (h->records) {
            check_ages(h, now, win_since, win_until);
            check_quorum(h, now);
            uint64_t fresh = fresh_ns(h);
            ccq_health_judge(h, now, fresh, hears_quorum(h, now, win_since, fresh));
        }

        /* Sleep until the next beat or read, a watched process exiting, or a kick. */
        pfd[n].fd = h->wake_fd;
        pfd[n].events = POLLIN;
        who[n++] = UINT32_MAX;
        pthread_mutex_lock(&h->lock);
        for (uint32_t q = 0; q < h->size; q++) {
            hpeer *p = &h->peers[q];
            if (p->pidfd >= 0 && ccq_health_state_of(h, q) != CCQ_PROCESS_ALIVE)
                ccq_os_unwatch(p); /* only this thread closes them */
            if (p->pidfd >= 0) {
                pfd[n].fd = p->pidfd;
                pfd[n].events = POLLIN;
                who[n++] = q;
            }
        }
        pthread_mutex_unlock(&h->lock);
        /* A stop that lands within this pass (its reads and checks) shows only here: the pass
         * then counts as ending at its start, so the next one sees the gap (a process 0 stopped
         * while it read once declared a live process silent on SIGCONT: drill_health_tcp_stop0
         * under TSan beside a busy core). */
        uint64_t ran = ccq_now_ns();
        last = ran - now > gap_ns ? now : ran;
        uint64_t until = next_beat < next_read ? next_beat : next_read;
        int ms = until > ran ? (int)((until - ran + 999999u) / 1000000u) : 0;
        int r = poll(pfd, n, ms);
        now = ccq_now_ns();
        if (r > 0) {
            if (pfd[0].revents & POLLIN) {
                uint64_t v;
                if (read(h->wake_fd, &v, sizeof v) < 0) {
                    /* EAGAIN: drained already */
                }
            }
            for (uint32_t k = 1; k < n; k++)
                if (pfd[k].revents != 0)
                    ccq_health_exited(h, who[k]);
        }
        /* A stop between the poll's return and here is a gap like any other. */
    }
    free(pfd);
    free(who);
    return NULL;
}

/* ------------------------------------------------------------------------------------ */
/* Lifetime                                                                              */
/* ------------------------------------------------------------------------------------ */

ccq_status ccq_health_create(ccq_runtime *rt)
{
    ccq_health *h;
    uint64_t hb_ms = rt->cfg.heartbeat_ms, to_ms = ccq_heartbeat_timeout_ms(&rt->cfg);

    rt->health = NULL;
    if (rt->world.size <= 1)
        return CCQ_OK;
    h = calloc(1, sizeof *h);
    if (h == NULL)
        return ccq_fail(CCQ_ERR_NO_MEMORY, "out of memory for the process table");
    h->peers = calloc(rt->world.size, sizeof *h->peers);
    h->lost = calloc(rt->world.size, sizeof *h->lost);
    h->suspects = calloc(rt->world.size, 1);
    if (h->peers == NULL || h->lost == NULL || h->suspects == NULL) {
        free(h->peers);
        free(h->lost);
        free(h->suspects);
        free(h);
        return ccq_fail(CCQ_ERR_NO_MEMORY, "out of memory for the process table");
    }
    h->rt = rt;
    h->boot = rt->world.boot;
    h->rank = rt->world.rank;
    h->size = rt->world.size;
    h->first_device = rt->dev_first;
    h->ndevices = rt->ndev;
    h->hb_ns = hb_ms * 1000000u;
    h->timeout_ns = to_ms * 1000000u;
    h->judged = h->hb_ns != 0 && h->boot != NULL && ccq_boot_has_heartbeats(h->boot);
    h->wake_fd = -1;
    pthread_mutex_init(&h->lock, NULL);
    ccq_signal_init(&h->prog_sig);
    atomic_init(&h->epoch, 0);
    atomic_init(&h->prog_req, 0);
    atomic_init(&h->stop, 0);
    atomic_init(&h->publish, 0);
    for (uint32_t q = 0; q < h->size; q++) {
        atomic_init(&h->peers[q].state, CCQ_PROCESS_ALIVE);
        h->peers[q].pidfd = -1;
    }
    ccq_os_identity(&h->pid, &h->host_id, &h->start_time, h->hostname, sizeof h->hostname, NULL);
    h->final_state = CCQ_HB_LEFT;
    rt->health = h;
    return CCQ_OK;
}

ccq_status ccq_health_start(ccq_runtime *rt)
{
    ccq_health *h = rt->health;
    uint64_t now;

    if (h == NULL || h->hb_ns == 0 || h->boot == NULL)
        return CCQ_OK;
    /* Without heartbeat records (the MPI bootstrap) the monitor still watches the processes
     * of this host through the OS. */
    h->records = ccq_boot_has_heartbeats(h->boot);
    h->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (h->wake_fd < 0)
        return ccq_fail(CCQ_ERR_NO_MEMORY, "job health: eventfd: %s", strerror(errno));
    /* Every process is alive as of now: it just met the others. Those of this host are
     * watched from here on (their identity came with the world exchange). */
    now = ccq_now_ns();
    h->quorum_ns = now;
    for (uint32_t q = 0; q < h->size; q++) {
        const ccq_world_proc *w = &rt->world.procs[q];
        h->peers[q].change_ns = now;
        /* Gone already: a peer that met, did its work and destroyed its runtime while this
         * one was still creating its own left cleanly (its record says so), not lost. */
        if (q != h->rank && !ccq_os_watch(h, &h->peers[q], w->pid, w->host_id, w->start_time))
            ccq_health_exited(h, q);
    }
    /* The rendezvous's keepalives and its silence bound follow the heartbeats (tcp). */
    if (h->records)
        ccq_boot_beat_config(h->boot, h->hb_ns, h->timeout_ns);
    if (pthread_create(&h->thread, NULL, monitor_main, h) != 0)
        return ccq_fail(CCQ_ERR_NO_MEMORY, "job health: cannot start the monitor thread");
    h->started = true;
    h->beats = h->records;
    return CCQ_OK;
}

void ccq_health_destroy(ccq_runtime *rt)
{
    ccq_health *h = rt->health;

    if (h == NULL)
        return;
    if (h->started) {
        atomic_store_explicit(&h->stop, 1, memory_order_release);
        ccq_health_kick(h);
        pthread_join(h->thread, NULL);
    }
    if (h->started && h->records) {
        /* Last word: this process left cleanly (unless it had been declared lost: then the
         * others know it as lost, and it says so). */
        publish(h,
                ccq_health_state_of(h, h->rank) == CCQ_PROCESS_ALIVE ? h->final_state : CCQ_HB_LOST,
                false);
    }
    for (uint32_t q = 0; q < h->size; q++) {
        ccq_os_unwatch(&h->peers[q]);
        free(h->peers[q].rec);
    }
    if (h->wake_fd >= 0)
        close(h->wake_fd);
    pthread_mutex_destroy(&h->lock);
    free(h->peers);
    free(h->lost);
    free(h->suspects);
    free(h->sus);
    free(h->mine);
    free(h->mine_ids);
    free(h);
    rt->health = NULL;
}
