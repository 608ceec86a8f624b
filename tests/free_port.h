/* A TCP port free on 127.0.0.1 now, below the kernel's ephemeral range
 * (ip_local_port_range), for a test's tcp:// rendezvous. A port the kernel picks (bind to 0)
 * is one it also hands to outgoing connections as their own, so between its choice and process
 * 0's listen (or between two runtimes of a test) some other socket could take it and process 0
 * could no longer bind it (seen: "Address already in use" for a second runtime under launch,
 * and in test_boot_tcp, whose ports came from the kernel until 2026-12-03). Random, so tests
 * running at once rarely try the same one; checked free. */
#ifndef CCQ_TESTS_FREE_PORT_H
#define CCQ_TESTS_FREE_PORT_H

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Whether port is free on 127.0.0.1 now (nothing bound to it). */
static inline int ccq_test_port_free(int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                             .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0), ok;
    if (fd < 0)
        return 0;
    ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return ok;
}

static inline int ccq_test_free_port(void)
{
    int lo = 32768;
    struct timespec t;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f != NULL) {
        if (fscanf(f, "%d", &lo) != 1)
            lo = 32768;
        fclose(f);
    }
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (lo > 12000) {
        unsigned seed = (unsigned)getpid() ^ (unsigned)t.tv_nsec;
        for (int k = 0; k < 200; k++) {
            int port = 10000 + (int)(rand_r(&seed) % (unsigned)(lo - 10000));
            if (ccq_test_port_free(port))
                return port;
        }
    }
    {
        /* the kernel's pick */
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t sl = sizeof sa;
        int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
        if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
            getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
            port = ntohs(sa.sin_port);
        if (fd >= 0)
            close(fd);
        if (port < 0) {
            perror("choosing a free port");
            exit(1);
        }
        return port;
    }
}

#endif
