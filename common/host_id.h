/* Which machine this process runs on, as one number two processes can compare: a hash of the
 * kernel's boot id and the host name. Job health's same-host watch (runtime/health/oswatch.c)
 * adds the pid namespace (a pid names the same process only there); the UCX engine asks which
 * peers share this host's memory (backends/host/ucx/warm.c). Stateless: the modules link a
 * copy (CMakeLists.txt, CCQ_PIECES_SOURCES). */
#ifndef CCQ_COMMON_HOST_ID_H
#define CCQ_COMMON_HOST_ID_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The id, with the pid namespace's inode folded in when pid_ns; 0 when the boot id cannot be
 * read (hosts cannot be told apart). hostname (len bytes, may be NULL) receives the host name,
 * "?" when it cannot be read. */
uint64_t ccq_host_id(bool pid_ns, char *hostname, size_t len);

#endif /* CCQ_COMMON_HOST_ID_H */
