/* Modules: what needs a vendor library (CUDA + NCCL, MPI, UCX) is a shared object of its own,
 * libccq-<name>.so.<major>, that libccq.so loads on first need, so a program that uses only
 * the host backend needs nothing but libc. Modelled on NCCL's plugins (src/plugin/) and Open
 * MPI's component repository: one exported, versioned entry symbol per module, checked before
 * anything in it is used. libccq.a links every module it was built with in: no dlopen.
 *
 * What a module shares with the core (the kind table, the clock, the reduction kernels, the
 * bootstrap's helpers) it links as private hidden copies (CMake's ccq_private archive), so
 * libccq.so exports nothing for modules and a module needs no symbol of it; only stateless
 * code is copied, and what holds process-wide state lives in one binary (the MPI lock only
 * in the mpi module, which holds every MPI call of ccq). A table handed over at load would
 * do the same with more code on both sides and an ABI for the core's functions too.
 *
 * Adding a module (e.g. the host backend's "ucx" engine): one CCQ_MODULE_DEFINE line in a
 * file of modules/ naming its tables, and one ccq_module() call in CMakeLists.txt (its
 * sources and libraries); the code that picks it calls ccq_module_get("ucx", ...).
 * docs/layout.md has the rules. */
#ifndef CCQ_BACKENDS_MODULE_H
#define CCQ_BACKENDS_MODULE_H

#include <stdint.h>

#include "backends/backend.h"
#include "ccq/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The module ABI: bump it whenever anything that crosses the boundary between libccq and a
 * module changes layout or meaning: ccq_module below, ccq_backend_ops and every type it passes
 * (backends/backend.h), ccq_host_engine_ops (backends/host/engine.h), ccq_boot_module and the
 * bootstrap handle a mechanism fills (runtime/boot/boot_impl.h), and ccq_config (ccq.h). The
 * loader also refuses a module of another ccq version, so a forgotten bump only matters
 * between builds of one version.
 */
/* 2: fusion (ccq_be_op.fused, ccq_be_comm_desc.fusion_bytes, the engines' start_run,
 * ccq_config.fusion_bytes); 3: the UCX engine (the backends' world_blob and world_ready with
 * every process's blob, peer_failed, ccq_config.host_engine); 5: ccq_host_engine_ops.reap reads
 * the clock itself; 6: world_ready (backend and host engine) is told whether this host's
 * processes outnumber their cores; 7: ccq_backend_ops.check_deadlines; 8:
 * ccq_backend_ops.calls_mpi. */
#define CCQ_MODULE_ABI 8u

struct ccq_host_engine_ops; /* backends/host/engine.h */
struct ccq_boot_module;     /* runtime/boot/boot_impl.h (opaque here: backends know no runtime) */

/* A module's entry: a constant object (nothing in the module runs before it is checked). */
typedef struct ccq_module {
    /* These two come first in every ABI version: the loader reads only them until both
     * match its own. */
    uint32_t abi;     /* CCQ_MODULE_ABI it was built for */
    uint32_t version; /* CCQ_VERSION_HEX of the ccq it was built with */
    const char *name; /* "nccl", "mpi": the <name> of its file and entry symbol */
    /* What it provides (NULL: not this). */
    const ccq_backend_ops *backend;                /* ccq_config.backend = name */
    const struct ccq_host_engine_ops *host_engine; /* the host backend's engine `name` */
    const struct ccq_boot_module *bootstrap;       /* ccq_config.bootstrap = name */
} ccq_module;

/* The entry symbol of module `name`: ccq_module_<name>, the only symbol the module exports. */
#define CCQ_MODULE_SYMBOL_PREFIX "ccq_module_"
#define CCQ_MODULE_DEFINE(mod, ...)                                                                \
    extern const ccq_module ccq_module_##mod;                                                      \
    __attribute__((visibility("default"))) const ccq_module ccq_module_##mod = {                   \
        .abi = CCQ_MODULE_ABI, .version = CCQ_VERSION_HEX, .name = #mod, __VA_ARGS__}

/*
 * Module `name` ("nccl", "mpi", ...), loaded once per process and kept (never unloaded).
 * libccq.so: dlopen of libccq-<name>.so.<major> from the directory libccq.so itself was loaded
 * from (dladdr), then from each directory of CCQ_MODULE_PATH (':'-separated), the first that
 * loads wins; then its entry symbol, whose abi and version must be libccq's. libccq.a: the
 * module linked in, if it was built. Thread-safe.
 *
 * needed_by says who needs it, for the detail ("the nccl backend"). Errors:
 * CCQ_ERR_UNSUPPORTED with err naming the module file, every path tried and why each failed
 * (dlerror()), or the ABI or version it was built for; CCQ_ERR_NO_MEMORY.
 */
ccq_status ccq_module_get(const char *name, const char *needed_by, const ccq_module **out,
                          ccq_errbuf *err);

#ifdef __cplusplus
}
#endif

#endif /* CCQ_BACKENDS_MODULE_H */
