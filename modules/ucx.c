/* libccq-ucx.so: the host backend's ucx engine (backends/host/ucx/), the only code of ccq that
 * calls UCX. The tcp:// rendezvous that usually brings its processes together needs no UCX
 * and stays in libccq.so (runtime/boot/tcp.c). */
#include "backends/host/engine.h"
#include "backends/module.h"

CCQ_MODULE_DEFINE(ucx, .host_engine = &ccq_host_engine_ucx_ops);
