/* The examples of docs/collectives.md, compiled and run: one function per collective, each
 * checking its own result, and a check that the doc still shows exactly this code. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ccq.h"

/* [helpers] */
/* Stop the example at the first failed call, with ccq's detail. */
#define CHECK(call)                                                                                \
    do {                                                                                           \
        ccq_status st_ = (call);                                                                   \
        if (st_ != CCQ_OK) {                                                                       \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,                     \
                    ccq_status_name(st_), ccq_last_error_detail());                                \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* Stop the example if a result is not what the collective promises. */
#define EXPECT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);                    \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* Wait for everything queued on stream 0 of each device in the set. */
static int fence(ccq_runtime *rt, const ccq_device_id *devs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        CHECK(ccq_sync_collective(rt, devs[i], 0));
    return 0;
}
/* [end helpers] */

/* [broadcast] */
/* Device 1's four floats to devices 0, 1 and 2. Only the root reads src. */
static int example_broadcast(ccq_runtime *rt)
{
    const ccq_device_id devs[] = {0, 1, 2};
    float src[4] = {1, 2, 3, 4};
    float dst[3][4];

    CHECK(ccq_comm_init(rt, devs, 3));
    for (ccq_device_id d = 0; d < 3; d++)
        CHECK(ccq_broadcast(rt, d, 0, d == 1 ? src : NULL, dst[d], 4, CCQ_FLOAT32, /*root*/ 1, devs,
                            3));
    if (fence(rt, devs, 3))
        return 1;
    for (int d = 0; d < 3; d++)
        EXPECT(memcmp(dst[d], src, sizeof src) == 0);

    /* In place, as ncclBcast: one buffer per rank, src == dst; it holds the data on the
     * root and receives it elsewhere. */
    int32_t buf[3][2] = {{0, 0}, {0, 0}, {7, 8}};
    for (ccq_device_id d = 0; d < 3; d++)
        CHECK(ccq_broadcast(rt, d, 0, buf[d], buf[d], 2, CCQ_INT32, /*root*/ 2, devs, 3));
    if (fence(rt, devs, 3))
        return 1;
    EXPECT(buf[0][0] == 7 && buf[0][1] == 8 && buf[1][0] == 7 && buf[1][1] == 8);
    return 0;
}
/* [end broadcast] */

/* [reduce] */
/* The sum of every rank's three ints, on device 2 only. Other ranks pass dst = NULL. */
static int example_reduce(ccq_runtime *rt)
{
    const ccq_device_id devs[] = {0, 1, 2};
    int32_t src[3][3] = {{1, 2, 3}, {10, 20, 30}, {100, 200, 300}};
    int32_t sum[3];

    CHECK(ccq_comm_init(rt, devs, 3));
    for (ccq_device_id d = 0; d < 3; d++)
        CHECK(ccq_reduce(rt, d, 0, src[d], d == 2 ? sum : NULL, 3, CCQ_INT32, CCQ_SUM,
                         /*root*/ 2, devs, 3));
    if (fence(rt, devs, 3))
        return 1;
    EXPECT(sum[0] == 111 && sum[1] == 222 && sum[2] == 333);

    /* In place on the root: src == dst there; the others' src is only read. */
    for (ccq_device_id d = 0; d < 3; d++)
        CHECK(ccq_reduce(rt, d, 0, src[d], d == 0 ? src[d] : NULL, 3, CCQ_INT32, CCQ_MAX,
                         /*root*/ 0, devs, 3));
    if (fence(rt, devs, 3))
        return 1;
    EXPECT(src[0][0] == 100 && src[0][2] == 300 && src[1][0] == 10);
    return 0;
}
/* [end reduce] */

/* [all_gather] */
/* Every rank's two floats, concatenated in rank order on every rank. */
static int example_all_gather(ccq_runtime *rt)
{
    const ccq_device_id devs[] = {0, 1, 2};
    float src[3][2] = {{0, 1}, {10, 11}, {20, 21}};
    float dst[3][6];

    CHECK(ccq_comm_init(rt, devs, 3));
    for (ccq_device_id d = 0; d < 3; d++)
        CHECK(ccq_all_gather(rt, d, 0, src[d], dst[d], 2, CCQ_FLOAT32, devs, 3));
    if (fence(rt, devs, 3))
        return 1;
    for (int d = 0; d < 3; d++)
        EXPECT(dst[d][0] == 0 && dst[d][3] == 11 && dst[d][5] == 21);

    /* In place: each rank's input already sits in its own block of dst
     * (src = dst + rank * count). */
    float buf[3][6] = {{5, 6}, {0, 0, 7, 8}, {0, 0, 0, 0, 9, 10}};
    for (ccq_device_id d = 0; d < 3; d++)
        CHECK(ccq_all_gather(rt, d, 0, buf[d] + d * 2, buf[d], 2, CCQ_FLOAT32, devs, 3));
    if (fence(rt, devs, 3))
        return 1;
    for (int d = 0; d < 3; d++)
        EXPECT(buf[d][0] == 5 && buf[d][2] == 7 && buf[d][5] == 10);
    return 0;
}
/* [end all_gather] */

/* [reduce_scatter] */
/* Rank r receives the sum over all ranks of block r (two elements) of their src. */
static int example_reduce_scatter(ccq_runtime *rt)
{
    const ccq_device_id devs[] = {0, 1, 2};
    int64_t src[3][6] = {
        {1, 1, 2, 2, 3, 3}, {10, 10, 20, 20, 30, 30}, {100, 100, 200, 200, 300, 300}};
    int64_t dst[3][2];

    CHECK(ccq_comm_init(rt, devs, 3));
    for (ccq_device_id d = 0; d < 3; d++)
        CHECK(ccq_reduce_scatter(rt, d, 0, src[d], dst[d], 2, CCQ_INT64, CCQ_SUM, devs, 3));
    if (fence(rt, devs, 3))
        return 1;
    EXPECT(dst[0][0] == 111 && dst[1][1] == 222 && dst[2][0] == 333);

    /* In place: the result lands in the rank's own block of src (dst = src + rank * count);
     * the other blocks of src are left as they were. */
    for (ccq_device_id d = 0; d < 3; d++)
        CHECK(ccq_reduce_scatter(rt, d, 0, src[d], src[d] + d * 2, 2, CCQ_INT64, CCQ_SUM, devs, 3));
    if (fence(rt, devs, 3))
        return 1;
    EXPECT(src[0][0] == 111 && src[1][2] == 222 && src[2][4] == 333 && src[2][0] == 100);
    return 0;
}
/* [end reduce_scatter] */

/* [all_to_all] */
/* Block j of rank i goes to block i of rank j: a transpose of 3 x 3 blocks of one byte. */
static int example_all_to_all(ccq_runtime *rt)
{
    const ccq_device_id devs[] = {0, 1, 2};
    uint8_t src[3][3] = {{0x00, 0x01, 0x02}, {0x10, 0x11, 0x12}, {0x20, 0x21, 0x22}};
    uint8_t dst[3][3];

    CHECK(ccq_comm_init(rt, devs, 3));
    for (ccq_device_id d = 0; d < 3; d++)
        CHECK(ccq_all_to_all(rt, d, 0, src[d], dst[d], 1, CCQ_UINT8, devs, 3));
    if (fence(rt, devs, 3))
        return 1;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            EXPECT(dst[j][i] == src[i][j]);
    /* There is no in-place form: src and dst must not overlap. */
    EXPECT(ccq_all_to_all(rt, 0, 0, src[0], src[0], 1, CCQ_UINT8, devs, 3) ==
           CCQ_ERR_INVALID_ARGUMENT);
    return 0;
}
/* [end all_to_all] */

/* [gather] */
/* Every rank's two ints into device 3's dst, in rank order. Ranks are positions in the
 * sorted set, whatever order it is given in: devices 1, 2, 3 are ranks 0, 1, 2. */
static int example_gather(ccq_runtime *rt)
{
    const ccq_device_id devs[] = {3, 1, 2};
    int32_t src[4][2] = {{0, 0}, {1, 1}, {2, 2}, {3, 3}}; /* indexed by device */
    int32_t all[6];

    CHECK(ccq_comm_init(rt, devs, 3));
    for (size_t i = 0; i < 3; i++) {
        ccq_device_id d = devs[i];
        CHECK(ccq_gather(rt, d, 0, src[d], d == 3 ? all : NULL, 2, CCQ_INT32, /*root*/ 3, devs, 3));
    }
    if (fence(rt, devs, 3))
        return 1;
    EXPECT(all[0] == 1 && all[2] == 2 && all[4] == 3 && all[5] == 3);
    return 0;
}
/* [end gather] */

/* [scatter] */
/* Block r (two floats) of the root's src to rank r. Only the root reads src. */
static int example_scatter(ccq_runtime *rt)
{
    const ccq_device_id devs[] = {0, 1, 2};
    float src[6] = {0, 1, 10, 11, 20, 21};
    float dst[3][2];

    CHECK(ccq_comm_init(rt, devs, 3));
    for (ccq_device_id d = 0; d < 3; d++)
        CHECK(ccq_scatter(rt, d, 0, d == 0 ? src : NULL, dst[d], 2, CCQ_FLOAT32, /*root*/ 0, devs,
                          3));
    if (fence(rt, devs, 3))
        return 1;
    EXPECT(dst[0][1] == 1 && dst[1][0] == 10 && dst[2][1] == 21);

    /* In place on the root: its dst is its own block of src (dst = src + root_rank * count),
     * which keeps its values. */
    for (ccq_device_id d = 0; d < 3; d++)
        CHECK(ccq_scatter(rt, d, 0, d == 0 ? src : NULL, d == 0 ? src : dst[d], 2, CCQ_FLOAT32,
                          /*root*/ 0, devs, 3));
    if (fence(rt, devs, 3))
        return 1;
    EXPECT(src[0] == 0 && dst[2][0] == 20);
    return 0;
}
/* [end scatter] */

/*
 * Every block between a "[name]" and an "[end name]" marker above must appear verbatim in
 * docs/collectives.md, so the doc shows code that is known to compile and work. The files are
 * found from __FILE__ (an absolute path in the CMake build); the check is skipped only where
 * this source file cannot be read (a build moved away from its source tree).
 */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long len;

    if (f == NULL)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)len + 1)) != NULL) {
        size_t got = fread(buf, 1, (size_t)len, f);
        buf[got] = '\0';
    }
    fclose(f);
    return buf;
}

static int check_doc(void)
{
    static const char *const names[] = {"helpers",        "broadcast",  "reduce", "all_gather",
                                        "reduce_scatter", "all_to_all", "gather", "scatter"};
    char doc_path[4096];
    const char *slash = strrchr(__FILE__, '/');
    char *src, *doc;
    int rc = 0;

    if (slash == NULL || __FILE__[0] != '/') {
        printf("doc check skipped: %s is not an absolute path\n", __FILE__);
        return 0;
    }
    snprintf(doc_path, sizeof doc_path, "%.*s/../docs/collectives.md", (int)(slash - __FILE__),
             __FILE__);
    src = slurp(__FILE__);
    if (src == NULL) {
        printf("doc check skipped: cannot read %s\n", __FILE__);
        return 0;
    }
    doc = slurp(doc_path);
    if (doc == NULL) {
        fprintf(stderr, "cannot read %s\n", doc_path);
        free(src);
        return 1;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char begin[64], end[64];
        snprintf(begin, sizeof begin, "/* [%s] */\n", names[i]);
        snprintf(end, sizeof end, "/* [end %s] */", names[i]);
        char *b = strstr(src, begin), *e = b ? strstr(b, end) : NULL;
        if (b == NULL || e == NULL) {
            fprintf(stderr, "example %s: markers not found in %s\n", names[i], __FILE__);
            rc = 1;
            continue;
        }
        b += strlen(begin);
        char saved = *e;
        *e = '\0';
        if (strstr(doc, b) == NULL) {
            fprintf(stderr, "example %s: docs/collectives.md does not show this code verbatim\n",
                    names[i]);
            rc = 1;
        }
        *e = saved;
    }
    free(src);
    free(doc);
    return rc;
}

int main(void)
{
    static const struct {
        const char *name;
        int (*fn)(ccq_runtime *);
    } examples[] = {
        {"broadcast", example_broadcast},   {"reduce", example_reduce},
        {"all_gather", example_all_gather}, {"reduce_scatter", example_reduce_scatter},
        {"all_to_all", example_all_to_all}, {"gather", example_gather},
        {"scatter", example_scatter},
    };
    ccq_config cfg;
    ccq_runtime *rt;
    int failed = 0;

    ccq_config_init(&cfg);
    cfg.backend = "host";
    cfg.host_devices = 4;
    if (ccq_runtime_create(&cfg, &rt) != CCQ_OK) {
        fprintf(stderr, "ccq_runtime_create: %s\n", ccq_last_error_detail());
        return 1;
    }
    for (size_t i = 0; i < sizeof examples / sizeof examples[0]; i++) {
        int rc = examples[i].fn(rt);
        printf("%-15s %s\n", examples[i].name, rc ? "FAILED" : "ok");
        failed |= rc;
    }
    ccq_runtime_destroy(rt);
    failed |= check_doc();
    return failed ? 1 : 0;
}
