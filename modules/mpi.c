/* libccq-mpi.so: everything of ccq that calls MPI, in one module so that one MPI lock
 * (common/mpi_lock.c) serialises it all: bootstrap "mpi" (runtime/boot/mpi.c) and the host
 * backend's mpi engine (backends/host/mpi/). */
#include "backends/host/engine.h"
#include "backends/module.h"
#include "runtime/boot/boot_impl.h"

static const ccq_boot_module mpi_boot = {.open = ccq_boot_mpi_open};

CCQ_MODULE_DEFINE(mpi, .host_engine = &ccq_host_engine_mpi_ops, .bootstrap = &mpi_boot);
