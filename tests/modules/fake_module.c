/* Files named libccq-nccl.so.0 that the loader must refuse (test_modules): built from this
 * file with FAKE_ABI, FAKE_VERSION and FAKE_NAME for an entry that does not match this
 * libccq, FAKE_NO_ENTRY for a library without an entry, FAKE_DEP for one whose library is
 * missing. The backend's functions abort: the loader must refuse the module before anything
 * in it is called. */
#include <stdlib.h>

#include "backends/module.h"

/* What a good module would say (each fake overrides one). */
#ifndef FAKE_ABI
#define FAKE_ABI CCQ_MODULE_ABI
#endif
#ifndef FAKE_VERSION
#define FAKE_VERSION CCQ_VERSION_HEX
#endif
#ifndef FAKE_NAME
#define FAKE_NAME "nccl"
#endif

#ifdef FAKE_DEP
int ccq_test_dep(void); /* in libccq-test-dep.so.0, which is not where the loader looks */
#endif

#ifdef FAKE_NO_ENTRY
__attribute__((visibility("default"))) int ccq_fake_not_a_module(void);
__attribute__((visibility("default"))) int ccq_fake_not_a_module(void)
{
    return 1;
}
#else
static ccq_status never_create(const ccq_config *cfg, const ccq_be_hooks *hooks, ccq_backend **out,
                               ccq_errbuf *err)
{
    (void)cfg;
    (void)hooks;
    (void)out;
    (void)err;
#ifdef FAKE_DEP
    if (ccq_test_dep() != 0)
        abort();
#endif
    abort();
}

static const ccq_backend_ops never_ops = {.name = "nccl", .create = never_create};

extern const ccq_module ccq_module_nccl;
__attribute__((visibility("default"))) const ccq_module ccq_module_nccl = {
    .abi = FAKE_ABI,
    .version = FAKE_VERSION,
    .name = FAKE_NAME,
    .backend = &never_ops,
};
#endif
