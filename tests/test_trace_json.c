/* The JSON trace writer on hand-built views, without a runtime: a synthetic story (a batch of
 * two all_reduce parts, one completing and one failing after issue, fused with another all_reduce
 * into one fused operation, a send that fails
 * unmatched, a fence, a watchdog instant and a note) gives exactly tests/trace_json_golden.json
 * (checked for JSON validity and slice nesting by the ctest trace_json_golden_valid), with
 * the parts that tell the story checked one by one; an empty view, and a failing write.
 * With a path argument, the program only writes the synthetic trace there (to regenerate the
 * golden file after a deliberate change of the output: review its diff). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/trace/view.h"

#define T0 1000000u /* the first event's time: ts 0 */

static ccq_event ev_of(uint32_t type, uint64_t dt, uint64_t id, uint32_t dev, uint32_t stream)
{
    ccq_event e;
    memset(&e, 0, sizeof e);
    e.time_ns = T0 + dt;
    e.type = type;
    e.id = id;
    e.device = dev;
    e.stream = stream;
    return e;
}

/* An all_reduce part (sum of 4 float32) of comm 0, submitted by thread 100 + device. */
static ccq_event part(uint32_t type, uint64_t dt, uint64_t id, uint32_t dev)
{
    ccq_event e = ev_of(type, dt, id, dev, 0);
    e.kind = CCQ_KIND_ALL_REDUCE;
    e.dtype = CCQ_FLOAT32;
    e.op = CCQ_SUM;
    e.count = 4;
    e.bytes = 16;
    e.thread = 100 + dev;
    e.batch = type == CCQ_EV_SUBMITTED ? 0 : 7;
    return e;
}

/* Device 0 stream 1: send #0 to device 1, failed as unmatched before it was ever issued. */
static ccq_event send0(uint32_t type, uint64_t dt)
{
    ccq_event e = ev_of(type, dt, 3, 0, 1);
    e.kind = CCQ_KIND_SEND;
    e.dtype = CCQ_INT32;
    e.count = 2;
    e.bytes = 8;
    e.thread = 100;
    e.peer = 1;
    e.peer_valid = 1;
    return e;
}

typedef struct story {
    ccq_event ev[24];
    ccq_note notes[1];
    ccq_trace_comm comms[1];
    ccq_device_id ids[2];
    ccq_trace_view v;
} story;

static void build_story(story *s)
{
    size_t n = 0;
    memset(s, 0, sizeof *s);
    s->ev[n++] = part(CCQ_EV_SUBMITTED, 0, 1, 0);
    s->ev[n++] = part(CCQ_EV_SUBMITTED, 100, 2, 1);
    s->ev[n] = ev_of(CCQ_EV_MATCHED, 300, 0, 0, 0);
    s->ev[n++].comm = 0;
    s->ev[n++] = part(CCQ_EV_ISSUED, 500, 1, 0);
    s->ev[n++] = part(CCQ_EV_ISSUED, 500, 2, 1);
    /* The all_reduce ran fused with #1 (not in the story) as fused operation 1. */
    s->ev[n] = ev_of(CCQ_EV_FUSED, 600, 1, UINT32_MAX, UINT32_MAX);
    s->ev[n].batch = 7;
    s->ev[n].count = 2;
    s->ev[n].bytes = 32;
    s->ev[n].dtype = CCQ_FLOAT32;
    s->ev[n].dur_ns = 1800;
    s->ev[n++].status = CCQ_ERR_BACKEND;
    s->ev[n] = ev_of(CCQ_EV_FENCE_BEGIN, 1000, 0, 1, 0);
    s->ev[n++].thread = 201;
    s->ev[n] = part(CCQ_EV_COMPLETED, 2500, 1, 0);
    s->ev[n++].fused = 1;
    s->ev[n] = ev_of(CCQ_EV_BATCH, 2500, 7, 0, 0); /* count: ops; bytes: its duration */
    s->ev[n].count = 2;
    s->ev[n].bytes = 2000;
    s->ev[n++].status = CCQ_ERR_BACKEND;
    s->ev[n] = part(CCQ_EV_FAILED, 2600, 2, 1);
    s->ev[n].fused = 1;
    s->ev[n++].status = CCQ_ERR_BACKEND;
    s->ev[n++] = send0(CCQ_EV_SUBMITTED, 3000);
    s->ev[n] = ev_of(CCQ_EV_FENCE_END, 3200, 0, 1, 0);
    s->ev[n].thread = 201;
    s->ev[n++].status = CCQ_ERR_BACKEND;
    s->ev[n] = ev_of(CCQ_EV_WATCHDOG, 4000, 0, 0, 0);
    s->ev[n].seq = 1;
    s->ev[n++].status = CCQ_ERR_TIMEOUT;
    s->ev[n] = send0(CCQ_EV_FAILED, 5000);
    s->ev[n++].status = CCQ_ERR_MISMATCH;
    /* Unfinished at the dump (T0 + 6000): a broadcast from device 0, issued on device 1
     * stream 1 and never completed; an all_reduce still queued on device 0. */
    ccq_event bc = part(CCQ_EV_SUBMITTED, 5200, 4, 1);
    bc.stream = 1;
    bc.kind = CCQ_KIND_BROADCAST;
    bc.seq = 1;
    bc.peer_valid = 1;
    bc.peer = 0;
    s->ev[n++] = bc;
    bc.type = CCQ_EV_ISSUED;
    bc.time_ns += 200;
    bc.batch = 8;
    s->ev[n++] = bc;
    s->ev[n] = ev_of(CCQ_EV_BATCH, 5400, 8, 0, 0);
    s->ev[n].count = 1;
    s->ev[n++].bytes = 100;
    s->ev[n] = part(CCQ_EV_SUBMITTED, 5500, 5, 0);
    s->ev[n++].seq = 2;
    s->notes[0].time_ns = T0 + 5000;
    s->notes[0].type = CCQ_EV_FAILED;
    snprintf(s->notes[0].text, sizeof s->notes[0].text, "send #0 to 1: \"unmatched\"\n\tno recv");
    snprintf(s->comms[0].devices, sizeof s->comms[0].devices, "{0,1}");
    s->ids[0] = 0;
    s->ids[1] = 1;
    s->comms[0].ids = s->ids;
    s->comms[0].n = 2;
    s->v = (ccq_trace_view){
        .hdr = {.backend = "host",
                .ndev = 2,
                .max_streams = 2,
                .t0_ns = T0,
                .dropped = 3,
                .world_size = 1,
                .pid = 4242,
                .host = "node7",
                .dump_ns = T0 + 6000,
                .realtime_offset_ns = 1764547200000000000,
                .reason = "error"},
        .ev = s->ev,
        .nev = n,
        .notes = s->notes,
        .nnotes = 1,
        .comms = s->comms,
        .ncomms = 1,
    };
}

/* The writer's output for a view, NUL-terminated (caller frees). */
static char *write_view(const ccq_trace_view *v)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(ccq_trace_write_json(f, v), 0);
    assert_int_equal(fclose(f), 0);
    return buf;
}

/* text with its first `from` replaced by `to` (frees text). */
static char *replace1(char *text, const char *from, const char *to)
{
    char *at = strstr(text, from), *out = malloc(strlen(text) + strlen(to) + 1);
    assert_non_null(at);
    assert_non_null(out);
    sprintf(out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    free(text);
    return out;
}

/* The same with the library version replaced by @VERSION@, as the golden file has it. */
static char *unversioned(const ccq_trace_view *v)
{
    char *text = write_view(v);
    text = replace1(text, "\"producer\":\"ccq " CCQ_VERSION_STRING "\"",
                    "\"producer\":\"ccq @VERSION@\"");
    return replace1(text, "\"version\":\"" CCQ_VERSION_STRING "\"", "\"version\":\"@VERSION@\"");
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long len;
    if (f == NULL)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = calloc((size_t)len + 1, 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    return buf;
}

static void has(const char *text, const char *want)
{
    if (strstr(text, want) == NULL)
        fail_msg("the trace lacks %s", want);
}

static void synthetic_story(void **state)
{
    (void)state;
    story s;
    build_story(&s);
    char *got = unversioned(&s.v), *want = slurp(CCQ_TRACE_GOLDEN);
    size_t line = 1, i = 0;
    for (; got[i] != '\0' && got[i] == want[i]; i++)
        line += got[i] == '\n';
    if (got[i] != want[i])
        fail_msg("differs from %s at line %zu:\n got: %.120s\nwant: %.120s", CCQ_TRACE_GOLDEN, line,
                 got + i, want + i);
    /* The story, piece by piece (the golden file could be regenerated wrong). */
    has(got, "\"backend\":\"host\",\"devices\":2,\"events\":18,\"dropped_events\":3");
    has(got, "\"ccq\":{\"format\":1,\"version\":\"@VERSION@\",\"world_rank\":0,\"world_size\":1,"
             "\"local_devices\":[0,2],\"crowded\":false,\"max_streams\":2,\"pid\":4242,"
             "\"hostname\":\"node7\","
             "\"backend\":\"host\",\"reason\":\"error\",\"events\":18,\"dropped_events\":3,"
             "\"clock\":{\"domain\":\"CLOCK_MONOTONIC\",\"t0_ns\":1000000,\"dump_ns\":1006000,"
             "\"realtime_offset_ns\":1764547200000000000},\"comms\":[{\"id\":0,\"set\":\"{0,1}\","
             "\"devices\":[0,1]}]},\n\"traceEvents\":[");
    /* What ccq-trace reads per command, and the unfinished ones drawn up to the dump. */
    has(got, "\"args\":{\"id\":2,\"comm\":\"{0,1}\",\"comm_id\":0,\"rank\":0,\"seq\":0,"
             "\"kind\":\"all_reduce\",\"state\":\"failed\",\"dtype\":\"float32\",\"count\":4");
    has(got, "{\"ph\":\"X\",\"cat\":\"op,unfinished\",\"name\":\"broadcast #1 (in flight at "
             "dump)\",\"pid\":1,\"tid\":4,\"ts\":5.400,\"dur\":0.600,\"args\":{\"id\":4,");
    has(got, "\"kind\":\"broadcast\",\"state\":\"issued\"");
    has(got, "\"root\":0,\"batch\":8,\"queued_us\":0.200}");
    has(got, "{\"ph\":\"e\",\"cat\":\"queued\",\"name\":\"all_reduce #2\",\"id\":\"q5\","
             "\"pid\":0,\"tid\":0,\"ts\":6.000,\"args\":{\"state\":\"queued\"}}");
    has(got, "\"name\":\"send #0 to 1\",\"pid\":0,\"tid\":3,\"ts\":3.000,\"dur\":0.200,"
             "\"args\":{\"id\":3,\"comm\":\"{0,1}\",\"comm_id\":0,\"rank\":0,\"seq\":0,"
             "\"kind\":\"send\",\"state\":\"failed\"");
    has(got, "\"name\":\"batch 7 (2 ops)\",\"pid\":2,\"tid\":0,\"ts\":0.500,\"dur\":2.000,"
             "\"args\":{\"batch\":7,\"ops\":2,\"status\":\"CCQ_ERR_BACKEND\"}");
    has(got, "{\"ph\":\"X\",\"cat\":\"op,failed\",\"name\":\"all_reduce #0\",\"pid\":1,\"tid\":1,"
             "\"ts\":0.500,\"dur\":2.100,\"args\":{\"id\":2,\"comm\":\"{0,1}\"");
    has(got, "\"op\":\"sum\",\"batch\":7,\"queued_us\":0.400,\"status\":\"CCQ_ERR_BACKEND\",");
    has(got, "{\"ph\":\"e\",\"cat\":\"queued\",\"name\":\"send #0 to 1\",\"id\":\"q3\",\"pid\":0,"
             "\"tid\":3,\"ts\":5.000}");
    has(got, "\"cat\":\"op,failed\",\"name\":\"send #0 to 1 failed\",\"pid\":0,\"tid\":4");
    has(got, "{\"ph\":\"X\",\"cat\":\"fence\",\"name\":\"fence\",\"pid\":1,\"tid\":2,\"ts\":1.000,"
             "\"dur\":2.200,\"args\":{\"thread\":201,\"status\":\"CCQ_ERR_BACKEND\"}}");
    has(got, "{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"flow\",\"name\":\"issued in batch\",\"id\":2,"
             "\"pid\":2,\"tid\":0,\"ts\":0.500}");
    has(got, "\"name\":\"failed\",\"pid\":2,\"tid\":1,\"ts\":5.000,\"args\":{\"detail\":"
             "\"send #0 to 1: \\\"unmatched\\\"\\u000a\\u0009no recv\"}}");
    has(got, "\"name\":\"watchdog timeout on comm 0 (an op missed its deadline)\"");
    /* The fused operation: its slice, its parts naming it, a flow from each part. */
    has(got, "{\"ph\":\"X\",\"cat\":\"fused\",\"name\":\"fused all_reduce #0-1 (2 ops)\","
             "\"pid\":2,\"tid\":2,\"ts\":0.600,\"dur\":1.800,\"args\":{\"fused\":1,\"comm\":"
             "\"{0,1}\",\"comm_id\":0,\"first_seq\":0,\"ops\":2,\"bytes\":32,\"batch\":7,"
             "\"kind\":\"all_reduce\",\"dtype\":\"float32\",\"status\":\"CCQ_ERR_BACKEND\"}}");
    has(got, "\"status\":\"CCQ_ERR_BACKEND\",\"fused\":1}");
    has(got, "{\"ph\":\"s\",\"cat\":\"fused\",\"name\":\"ran in fused op\",\"id\":\"fu2\","
             "\"pid\":1,\"tid\":1,\"ts\":0.600}");
    has(got, "{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"fused\",\"name\":\"ran in fused op\","
             "\"id\":\"fu1\",\"pid\":2,\"tid\":2,\"ts\":0.600}");
    free(got);
    free(want);
}

static void empty_view(void **state)
{
    (void)state;
    ccq_trace_view v = {.hdr = {.backend = "host", .ndev = 1, .max_streams = 1}};
    char *got = write_view(&v);
    has(got, "\"devices\":1,\"events\":0,\"dropped_events\":0,\"clock\":\"CLOCK_MONOTONIC\","
             "\"t0_ns\":0},\n\"ccq\":{\"format\":1,");
    has(got, "\"hostname\":\"\",\"backend\":\"host\",\"reason\":\"\",");
    has(got,
        "\"comms\":[]},\n\"traceEvents\":[\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":0");
    has(got, "{\"name\":\"fused operations\"}}\n]}\n");
    free(got);
}

/* Rank 2 of a world of 3 owning global devices 4 and 5: process names, pids and the
 * scheduler's pid follow the global ids, the header has the rank and the range. */
static void global_ids(void **state)
{
    (void)state;
    ccq_event ev[2];
    ccq_device_id ids[] = {1, 3, 5};
    ccq_trace_comm comm = {.devices = "{1,3,5}", .ids = ids, .n = 3};
    ev[0] = part(CCQ_EV_SUBMITTED, 0, 1, 5);
    ev[1] = part(CCQ_EV_COMPLETED, 100, 1, 5);
    ccq_trace_view v = {
        .hdr = {.backend = "nccl",
                .ndev = 2,
                .max_streams = 1,
                .t0_ns = T0,
                .world_rank = 2,
                .world_size = 3,
                .dev_first = 4,
                .crowded = true,
                .dump_ns = T0 + 200},
        .ev = ev,
        .nev = 2,
        .comms = &comm,
        .ncomms = 1,
    };
    char *got = write_view(&v);
    has(got, "\"world_rank\":2,\"world_size\":3,\"local_devices\":[4,2],\"crowded\":true");
    has(got, "\"comms\":[{\"id\":0,\"set\":\"{1,3,5}\",\"devices\":[1,3,5]}]");
    has(got, "\"pid\":4,\"args\":{\"name\":\"device 4\"}");
    has(got, "\"pid\":5,\"args\":{\"name\":\"device 5\"}");
    has(got, "\"pid\":6,\"args\":{\"name\":\"ccq scheduler\"}");
    has(got, "\"name\":\"thread_name\",\"pid\":5,\"tid\":0,\"args\":{\"name\":\"stream 0: "
             "submitted\"}");
    has(got, "\"cat\":\"submit\",\"name\":\"all_reduce #0\",\"pid\":5,\"tid\":0");
    has(got, "\"rank\":2,\"seq\":0,\"kind\":\"all_reduce\",\"state\":\"completed\"");
    free(got);
}

/* A full disk: the writer says so instead of leaving a silently truncated file. */
static void write_error(void **state)
{
    (void)state;
    story s;
    FILE *f = fopen("/dev/full", "w");
    if (f == NULL)
        skip();
    setvbuf(f, NULL, _IONBF, 0);
    build_story(&s);
    assert_int_equal(ccq_trace_write_json(f, &s.v), -1);
    fclose(f);
}

int main(int argc, char **argv)
{
    if (argc > 1) { /* regenerate: test_trace_json tests/trace_json_golden.json */
        story s;
        FILE *f = fopen(argv[1], "w");
        build_story(&s);
        char *text = unversioned(&s.v);
        int bad = f == NULL || fputs(text, f) < 0 || fclose(f) != 0;
        free(text);
        return bad;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(synthetic_story),
        cmocka_unit_test(empty_view),
        cmocka_unit_test(global_ids),
        cmocka_unit_test(write_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
