/* FNV-1a, 64 bits: the one hash of ccq's own ids and checks (a world's member list in the
 * bootstrap's exchange, a directory name of the file bootstrap, a host's id). Stateless: the
 * modules link a copy (CMakeLists.txt, CCQ_PIECES_SOURCES). */
#ifndef CCQ_COMMON_HASH_H
#define CCQ_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>

#define CCQ_FNV_OFFSET 0xcbf29ce484222325ull

/* h folded with n bytes at p; start from CCQ_FNV_OFFSET. */
uint64_t ccq_fnv1a(const void *p, size_t n, uint64_t h);

#endif /* CCQ_COMMON_HASH_H */
