/* ccq's one process-wide MPI lock: every MPI call ccq makes (the "mpi" bootstrap, the host
 * backend's MPI engine) is made holding it, so ccq's own threads never call MPI at once and
 * MPI_THREAD_SERIALIZED suffices. Here, below runtime/ and backends/, because both use it. */
#ifndef CCQ_COMMON_MPI_LOCK_H
#define CCQ_COMMON_MPI_LOCK_H

void ccq_mpi_lock(void);
void ccq_mpi_unlock(void);

#endif /* CCQ_COMMON_MPI_LOCK_H */
