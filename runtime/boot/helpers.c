/* The bootstrap's stateless helpers (boot_impl.h). A file of their own because the MPI
 * mechanism, which lives in libccq-mpi.so, links a private copy of them: nothing here may
 * hold state, so the copy in the module and the one in libccq.so cannot disagree. */
#include <stdarg.h>
#include <stdio.h>

#include "runtime/boot/boot_impl.h"

void ccq_boot_err(ccq_errbuf *err, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

uint64_t ccq_boot_fnv1a(const void *p, size_t n, uint64_t h)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
