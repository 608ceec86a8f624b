/* The process-wide MPI lock (see mpi_lock.h). */
#include "common/mpi_lock.h"

#include <pthread.h>

static pthread_mutex_t mpi_lock = PTHREAD_MUTEX_INITIALIZER;

void ccq_mpi_lock(void)
{
    pthread_mutex_lock(&mpi_lock);
}

void ccq_mpi_unlock(void)
{
    pthread_mutex_unlock(&mpi_lock);
}
