/* The submit path's instruction count, as an application links ccq (libccq.so):
 * bench/callgrind-submit.sh runs this under callgrind counting only inside ccq_all_reduce,
 * for one build or several (before/after a change). n one-element all_reduce submissions on
 * device 0's stream 0 (a communicator of that device alone), a fence every 64 so the queue
 * never fills. usage: submit_loop host|nccl <n>  (nccl: linked with tests/fake's CUDA/NCCL) */
#include <stdio.h>
#include <stdlib.h>

#include "ccq.h"

int main(int argc, char **argv)
{
    const ccq_device_id dev = 0;
    ccq_runtime *rt = NULL;
    ccq_config cfg;
    float x = 1.0f, y = 0.0f;
    long n;

    if (argc != 3 || (n = strtol(argv[2], NULL, 10)) <= 0) {
        fprintf(stderr, "usage: %s host|nccl <submissions>\n", argv[0]);
        return 2;
    }
    ccq_config_init(&cfg);
    cfg.backend = argv[1];
    cfg.host_devices = 1;
    cfg.host_workers = 1;
    cfg.queue_depth = 256;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK || ccq_comm_init(rt, &dev, 1) != CCQ_OK) {
        fprintf(stderr, "%s\n", ccq_last_error_detail());
        return 1;
    }
    for (long i = 0; i < n; i++) {
        if (ccq_all_reduce(rt, dev, 0, &x, &y, 1, CCQ_FLOAT32, CCQ_SUM, &dev, 1) != CCQ_OK) {
            fprintf(stderr, "submit %ld: %s\n", i, ccq_last_error_detail());
            return 1;
        }
        if (i % 64 == 63 && ccq_sync_collective(rt, dev, 0) != CCQ_OK) {
            fprintf(stderr, "fence: %s\n", ccq_last_error_detail());
            return 1;
        }
    }
    if (ccq_sync_collective(rt, dev, 0) != CCQ_OK || ccq_runtime_destroy(rt) != CCQ_OK)
        return 1;
    printf("%ld submissions on backend %s\n", n, argv[1]);
    return 0;
}
