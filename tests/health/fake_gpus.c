/* Linked into examples built against the fake NCCL (survive_fake): every process sees one
 * fake GPU, and the fake's own wait for a peer is longer than ccq's deadlines, before main. */
#include "fake/fake_cuda_nccl.h"

__attribute__((constructor)) static void fake_gpus(void)
{
    fake_set_devices(1, 9);
    fake_set_xproc_timeout_ms(600000);
}
