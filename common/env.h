/* Unsigned decimal environment variables, parsed one way for every CCQ_* and launcher
 * variable ccq reads. */
#ifndef CCQ_COMMON_ENV_H
#define CCQ_COMMON_ENV_H

#include <stdint.h>

/* getenv(name) as an integer in [min, max]: 1 with *out set; 0 when unset or empty; -1 when
 * set but not a plain decimal number (no sign, no spaces) or out of range. */
int ccq_env_u64(const char *name, uint64_t min, uint64_t max, uint64_t *out);

#endif /* CCQ_COMMON_ENV_H */
