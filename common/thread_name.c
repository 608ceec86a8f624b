#include "common/thread_name.h"

#include <sys/prctl.h>

void ccq_thread_name(const char *name)
{
    (void)prctl(PR_SET_NAME, name, 0, 0, 0);
}
