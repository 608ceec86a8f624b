/* Environment parsing (see env.h). */
#include "common/env.h"

#include <errno.h>
#include <stdlib.h>

int ccq_env_u64(const char *name, uint64_t min, uint64_t max, uint64_t *out)
{
    const char *v = getenv(name);
    char *end;
    unsigned long long x;

    if (v == NULL || *v == '\0')
        return 0;
    if (v[0] < '0' || v[0] > '9') /* strtoull would take a sign or leading spaces */
        return -1;
    errno = 0;
    x = strtoull(v, &end, 10);
    if (errno != 0 || *end != '\0' || x < min || x > max)
        return -1;
    *out = x;
    return 1;
}
