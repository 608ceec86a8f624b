/* libccq-nccl.so: the CUDA + NCCL backend (backends/nccl/). */
#include "backends/module.h"

CCQ_MODULE_DEFINE(nccl, .backend = &ccq_nccl_backend_ops);
