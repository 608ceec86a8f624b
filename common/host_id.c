/* (host_id.h) */
#define _GNU_SOURCE
#include "common/host_id.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/hash.h"

uint64_t ccq_host_id(bool pid_ns, char *hostname, size_t len)
{
    char boot_id[64] = "", host[256];
    struct stat ns;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    uint64_t h = CCQ_FNV_OFFSET;

    if (f != NULL) {
        if (fgets(boot_id, sizeof boot_id, f) == NULL)
            boot_id[0] = '\0';
        fclose(f);
    }
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    if (hostname != NULL && len > 0)
        snprintf(hostname, len, "%s", host);
    h = ccq_fnv1a(boot_id, strlen(boot_id), h);
    h = ccq_fnv1a(host, strlen(host), h);
    if (pid_ns && stat("/proc/self/ns/pid", &ns) == 0)
        h = ccq_fnv1a(&ns.st_ino, sizeof ns.st_ino, h);
    return boot_id[0] != '\0' ? h : 0;
}
