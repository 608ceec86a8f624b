/* A program built against an installed ccq (tests/install/run.sh links it three ways): a
 * two-device host-backend all_reduce, and the library's version against the header's. */
#include <stdio.h>
#include <string.h>

#include <ccq.h>

static int fail(const char *what, ccq_status st)
{
    fprintf(stderr, "%s: %s: %s\n", what, ccq_status_name(st), ccq_last_error_detail());
    return 1;
}

int main(int argc, char **argv)
{
    const ccq_device_id devs[2] = {0, 1};
    float src[2][8], dst[2][8];
    ccq_runtime *rt;
    ccq_config cfg;
    ccq_status st;

    if (strcmp(ccq_version(), CCQ_VERSION_STRING) != 0 || ccq_version_number() != CCQ_VERSION_HEX) {
        fprintf(stderr, "library %s (0x%06x), header %s\n", ccq_version(), ccq_version_number(),
                CCQ_VERSION_STRING);
        return 1;
    }
    ccq_config_init(&cfg);
    cfg.backend = "host";
    cfg.host_devices = 2;
    cfg.host_workers = 1;
    if ((st = ccq_runtime_create(&cfg, &rt)) != CCQ_OK)
        return fail("ccq_runtime_create", st);
    if ((st = ccq_comm_init(rt, devs, 2)) != CCQ_OK)
        return fail("ccq_comm_init", st);
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 8; i++)
            src[d][i] = (float)(d + 1) * (float)i;
    for (ccq_device_id d = 0; d < 2; d++)
        if ((st = ccq_all_reduce(rt, d, 0, src[d], dst[d], 8, CCQ_FLOAT32, CCQ_SUM, devs, 2)) !=
            CCQ_OK)
            return fail("ccq_all_reduce", st);
    for (ccq_device_id d = 0; d < 2; d++)
        if ((st = ccq_sync_collective(rt, d, 0)) != CCQ_OK)
            return fail("ccq_sync_collective", st);
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < 8; i++)
            if (dst[d][i] != 3.0f * (float)i) {
                fprintf(stderr, "device %d element %d: %g, want %g\n", d, i, dst[d][i], 3.0 * i);
                return 1;
            }
    if ((st = ccq_runtime_destroy(rt)) != CCQ_OK)
        return fail("ccq_runtime_destroy", st);
    printf("OK %s (ccq %s)\n", argc > 1 ? argv[1] : "", ccq_version());
    return 0;
}
