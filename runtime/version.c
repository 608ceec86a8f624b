/* The running library's version: the header's macros, as this build of libccq saw them. */
#include "ccq.h"

CCQ_API const char *ccq_version(void)
{
    return CCQ_VERSION_STRING;
}

CCQ_API unsigned ccq_version_number(void)
{
    return CCQ_VERSION_HEX;
}
