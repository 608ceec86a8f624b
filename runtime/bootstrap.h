/* TEMPORARY stand-in for the bootstrap interface (replaced by the real module). */
#ifndef CCQ_RUNTIME_BOOTSTRAP_H
#define CCQ_RUNTIME_BOOTSTRAP_H
#include <stddef.h>
#include <stdint.h>
#include "ccq.h"
typedef struct ccq_boot ccq_boot;
typedef struct ccq_boot_xchg ccq_boot_xchg;
ccq_status ccq_boot_open(const char *spec, const ccq_store *store, int64_t mpi_comm, uint32_t world_rank, uint32_t world_size, ccq_boot **out, char *err, size_t errlen);
void ccq_boot_close(ccq_boot *b);
ccq_status ccq_boot_xchg_post(ccq_boot *b, const char *tag, const uint32_t *members, uint32_t n, const void *mine, size_t len, ccq_boot_xchg **out);
ccq_status ccq_boot_xchg_test(ccq_boot_xchg *x, void *out);
ccq_status ccq_boot_xchg_wait(ccq_boot_xchg *x, void *out, uint64_t deadline_ns);
size_t ccq_boot_xchg_missing(ccq_boot_xchg *x, uint32_t *ranks, size_t cap);
void ccq_boot_xchg_free(ccq_boot_xchg *x);
/* ccq's process-wide MPI lock (as on branch i13boot). */
void ccq_boot_mpi_lock(void);
void ccq_boot_mpi_unlock(void);
#endif
