/* The OS's word on a process of this host: a pidfd (Linux 5.3+) becomes readable the moment
 * the process exits, so a peer killed with SIGKILL on the same host is known at once instead
 * of after heartbeat_timeout_ms. "Same host" is the same boot id and pid namespace (a pid
 * means the same process only there), and the process start time (from /proc) tells a
 * reused pid from the process itself. Without pidfd_open (older kernels, seccomp) the watch
 * falls back to kill(pid, 0) plus the start time at every read of the records. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "runtime/boot/boot_impl.h" /* ccq_boot_fnv1a */
#include "runtime/health/health_impl.h"
#include "runtime/world.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

/* Field 22 of /proc/<pid>/stat: the start time in clock ticks since boot; 0 if unreadable
 * or if the process is a zombie (it exited; only its exit status waits for its parent). */
static uint64_t start_time_of(long pid)
{
    char path[64], buf[1024];
    FILE *f;
    size_t n;
    uint64_t t = 0;

    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    f = fopen(path, "re");
    if (f == NULL)
        return 0;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name (field 2) may hold spaces and ')': fields count from the last ')'. */
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return 0;
    p++;
    if (p[0] == ' ' && (p[1] == 'Z' || p[1] == 'X'))
        return 0;
    for (int field = 3; field < 22 && p != NULL; field++)
        p = strchr(p + 1, ' ');
    if (p != NULL)
        t = strtoull(p + 1, NULL, 10);
    return t;
}

void ccq_os_identity(uint32_t *pid, uint64_t *host_id, uint64_t *start_time, char *hostname,
                     size_t len, uint64_t *kernel_id)
{
    /* The kernel's boot id: one per machine (or VM) and boot, the same in every container. */
    char boot_id[64] = "";
    struct stat ns;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    uint64_t h = CCQ_FNV_OFFSET;

    if (f != NULL) {
        if (fgets(boot_id, sizeof boot_id, f) == NULL)
            boot_id[0] = '\0';
        fclose(f);
    }
    if (gethostname(hostname, len) != 0)
        snprintf(hostname, len, "?");
    hostname[len - 1] = '\0';
    h = ccq_boot_fnv1a(boot_id, strlen(boot_id), h);
    if (kernel_id != NULL)
        *kernel_id = boot_id[0] != '\0' ? h : 0;
    h = ccq_boot_fnv1a(hostname, strlen(hostname), h);
    if (stat("/proc/self/ns/pid", &ns) == 0)
        h = ccq_boot_fnv1a(&ns.st_ino, sizeof ns.st_ino, h);
    *pid = (uint32_t)getpid();
    *host_id = boot_id[0] != '\0' ? h : 0; /* 0: cannot tell hosts apart, never watched */
    *start_time = start_time_of((long)getpid());
}

void ccq_health_identity(ccq_world_proc *out)
{
    char host[64];
    ccq_os_identity(&out->pid, &out->host_id, &out->start_time, host, sizeof host, &out->kernel_id);
}

bool ccq_os_watch(ccq_health *h, hpeer *p, uint32_t pid, uint64_t host_id, uint64_t start_time)
{
    int fd;

    if (p->watched)
        return true;
    p->watched = true;
    if (host_id == 0 || host_id != h->host_id || pid == 0 || start_time == 0)
        return true; /* another host: only heartbeats tell */
    p->pid = pid;
    p->start_time = start_time;
    fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (fd < 0 && errno == ESRCH)
        return false;
    /* The pid is someone's now; is it still that process? (Checked after the pidfd is
     * open: a pidfd refers to one process, so a later reuse cannot fool it.) */
    if (start_time_of((long)pid) != start_time) {
        if (fd >= 0)
            close(fd);
        return false;
    }
    if (fd >= 0) {
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        p->pidfd = fd;
    } else {
        p->by_poll = true; /* no pidfd_open here */
    }
    return true;
}

bool ccq_os_exited(hpeer *p)
{
    if (p->pidfd >= 0) {
        struct pollfd pfd = {p->pidfd, POLLIN, 0};
        return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    }
    if (p->by_poll)
        return start_time_of((long)p->pid) != p->start_time;
    return false;
}

void ccq_os_unwatch(hpeer *p)
{
    if (p->pidfd >= 0)
        close(p->pidfd);
    p->pidfd = -1;
    p->by_poll = false;
}
