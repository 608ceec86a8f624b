/* Status and type names, the thread-local error detail, and op descriptions. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/internal.h"

CCQ_API const char *ccq_status_string(ccq_status s)
{
    switch (s) {
#define CCQ_STATUS_STR_(name, value, text)                                                         \
    case name:                                                                                     \
        return text;
        CCQ_STATUS_MAP(CCQ_STATUS_STR_)
#undef CCQ_STATUS_STR_
    }
    return "unknown status";
}

CCQ_API const char *ccq_status_name(ccq_status s)
{
    switch (s) {
#define CCQ_STATUS_NAME_(name, value, text)                                                        \
    case name:                                                                                     \
        return #name;
        CCQ_STATUS_MAP(CCQ_STATUS_NAME_)
#undef CCQ_STATUS_NAME_
    }
    return "CCQ_ERR_UNKNOWN";
}

static const struct {
    const char *name;
    size_t size;
} dtype_info[CCQ_DTYPE_COUNT_] = {
    [CCQ_INT8] = {"int8", 1},
    [CCQ_UINT8] = {"uint8", 1},
    [CCQ_INT32] = {"int32", 4},
    [CCQ_UINT32] = {"uint32", 4},
    [CCQ_INT64] = {"int64", 8},
    [CCQ_UINT64] = {"uint64", 8},
    [CCQ_FLOAT16] = {"float16", 2},
    [CCQ_FLOAT32] = {"float32", 4},
    [CCQ_FLOAT64] = {"float64", 8},
    [CCQ_BFLOAT16] = {"bfloat16", 2},
    [CCQ_FLOAT8E4M3] = {"float8e4m3", 1},
    [CCQ_FLOAT8E5M2] = {"float8e5m2", 1},
};

CCQ_API size_t ccq_dtype_size(ccq_dtype dtype)
{
    return (unsigned)dtype < CCQ_DTYPE_COUNT_ ? dtype_info[dtype].size : 0;
}

CCQ_API const char *ccq_dtype_name(ccq_dtype dtype)
{
    return (unsigned)dtype < CCQ_DTYPE_COUNT_ ? dtype_info[dtype].name : "?";
}

CCQ_API const char *ccq_reduce_op_name(ccq_reduce_op op)
{
    static const char *const names[CCQ_REDUCE_OP_COUNT_] = {"sum", "prod", "max", "min", "avg"};
    return (unsigned)op < CCQ_REDUCE_OP_COUNT_ ? names[op] : "?";
}

void *ccq_alloc_lines(size_t size)
{
    size_t rounded = (size + CCQ_CACHELINE - 1) / CCQ_CACHELINE * CCQ_CACHELINE;
    return aligned_alloc(CCQ_CACHELINE, rounded ? rounded : CCQ_CACHELINE);
}

/* The calling thread's detail of the last error a ccq call returned (like dlerror). */
static _Thread_local char tls_detail[CCQ_DETAIL_LEN];

CCQ_API const char *ccq_last_error_detail(void)
{
    return tls_detail;
}

void ccq_clear_detail(void)
{
    tls_detail[0] = '\0';
}

void ccq_mark_truncated(char *buf, size_t len)
{
    static const char mark[] = CCQ_TRUNCATED;
    if (len >= 2 * sizeof mark)
        memcpy(buf + len - sizeof mark, mark, sizeof mark);
}

void ccq_set_detail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tls_detail, sizeof tls_detail, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof tls_detail) /* the whole text: ccq_stream_last_error */
        ccq_mark_truncated(tls_detail, sizeof tls_detail);
}

ccq_status ccq_fail(ccq_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tls_detail, sizeof tls_detail, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof tls_detail)
        ccq_mark_truncated(tls_detail, sizeof tls_detail);
    return st;
}

/* snprintf that returns what it wrote (never more than len - 1), for appending. */
size_t ccq_format(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (len == 0)
        return 0;
    va_start(ap, fmt);
    n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    if (n < 0)
        return 0;
    return (size_t)n < len ? (size_t)n : len - 1;
}

CCQ_API const char *ccq_kind_name(uint32_t kind)
{
    return kind < CCQ_KIND_COUNT_ ? ccq_kinds[kind].name : "?";
}

size_t ccq_describe_comm(char *buf, size_t len, const ccq_comm *comm)
{
    size_t w = ccq_format(buf, len, "{");
    for (uint32_t i = 0; i < comm->n && w < len; i++) {
        if (i == 8 && comm->n > 10) {
            w += ccq_format(buf + w, len - w, ",...,%u", comm->devices[comm->n - 1]);
            break;
        }
        w += ccq_format(buf + w, len - w, i ? ",%u" : "%u", comm->devices[i]);
    }
    w += ccq_format(buf + w, len - w, "}");
    return w;
}

/* "all_reduce #5 (float32 x 1024, sum) on comm {0,1,2,3} from device 2 stream 1". */
size_t ccq_describe_cmd(char *buf, size_t len, const ccq_cmd *c)
{
    size_t w = 0;

    const ccq_kind_info *k = &ccq_kinds[c->kind];
    if (k->collective) {
        w += ccq_format(buf + w, len - w, "%s #%llu (%s x %zu", k->name, (unsigned long long)c->seq,
                        ccq_dtype_name(c->dtype), c->count);
        if (k->reduces)
            w += ccq_format(buf + w, len - w, ", %s", ccq_reduce_op_name(c->redop));
        if (k->rooted)
            w += ccq_format(buf + w, len - w, ", root device %u", c->comm->devices[c->root]);
        w += ccq_format(buf + w, len - w, ") on comm ");
        w += ccq_describe_comm(buf + w, len - w, c->comm);
    } else {
        w += ccq_format(buf + w, len - w, "%s #%llu (%s x %zu) %s device %u", k->name,
                        (unsigned long long)c->seq, ccq_dtype_name(c->dtype), c->count,
                        c->kind == CCQ_KIND_SEND ? "to" : "from", c->peer);
    }
    w += ccq_format(buf + w, len - w, " on device %u stream %u", c->device, c->stream->id);
    return w;
}
