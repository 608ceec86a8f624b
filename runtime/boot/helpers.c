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
