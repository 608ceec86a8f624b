/* Parsing and evaluation of fault injection plans (see fault.h for the grammar). */
#include "runtime/fault.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void plan_clear(ccq_fault_plan *p)
{
    p->fail_op = -1;
    p->fail_count = 1;
    p->fail_every = 0;
    p->delay_us = 0;
    p->delay_op = -1;
    p->delay_count = -1;
    p->drop_rank = -1;
    p->drop_after = 0;
    p->drop_count = -1;
    p->lag_us = 0;
    p->stall_us = 0;
    p->stall_op = 0;
}

/* Parse "key=value" with a non-negative integer value. */
static int parse_kv(const char *s, size_t len, char *key, size_t keylen, int64_t *val)
{
    const char *eq = memchr(s, '=', len);
    char num[32], *end;
    size_t kl, vl;
    long long v;

    if (eq == NULL)
        return -1;
    kl = (size_t)(eq - s);
    vl = len - kl - 1;
    if (kl == 0 || kl >= keylen || vl == 0 || vl >= sizeof num)
        return -1;
    memcpy(key, s, kl);
    key[kl] = '\0';
    memcpy(num, eq + 1, vl);
    num[vl] = '\0';
    errno = 0;
    v = strtoll(num, &end, 10);
    if (errno != 0 || *end != '\0' || v < 0)
        return -1;
    *val = v;
    return 0;
}

int ccq_fault_parse(const char *spec, ccq_fault_plan *out, char *err, size_t errlen)
{
    const char *c = spec;

    plan_clear(out);
    if (spec == NULL)
        return 0;
    while (*c != '\0') {
        const char *end = strchr(c, ';'), *colon;
        size_t len = end ? (size_t)(end - c) : strlen(c);
        char kind[16];
        size_t kl;

        if (len == 0) { /* empty clause: ";;" or a trailing ';' */
            c += end ? 1 : 0;
            if (end == NULL)
                break;
            continue;
        }
        colon = memchr(c, ':', len);
        kl = colon ? (size_t)(colon - c) : len;
        if (colon == NULL || kl >= sizeof kind) {
            snprintf(err, errlen, "fault spec \"%.*s\": expected kind:key=value", (int)len, c);
            return -1;
        }
        memcpy(kind, c, kl);
        kind[kl] = '\0';
        if (strcmp(kind, "fail") && strcmp(kind, "delay") && strcmp(kind, "drop") &&
            strcmp(kind, "lag") && strcmp(kind, "stall")) {
            snprintf(err, errlen,
                     "fault spec: unknown kind \"%s\" (fail, delay, drop, lag or stall)", kind);
            return -1;
        }
        for (const char *a = colon + 1; a < c + len;) {
            const char *comma = memchr(a, ',', (size_t)(c + len - a));
            size_t al = comma ? (size_t)(comma - a) : (size_t)(c + len - a);
            char key[16];
            int64_t v;
            int ok = 1;
            if (parse_kv(a, al, key, sizeof key, &v) != 0) {
                snprintf(err, errlen, "fault spec \"%s\": \"%.*s\" is not key=N", kind, (int)al, a);
                return -1;
            }
            if (!strcmp(kind, "fail")) {
                if (!strcmp(key, "op"))
                    out->fail_op = v;
                else if (!strcmp(key, "count"))
                    out->fail_count = v;
                else if (!strcmp(key, "every") && v > 0)
                    out->fail_every = v;
                else
                    ok = 0;
            } else if (!strcmp(kind, "delay")) {
                if (!strcmp(key, "us"))
                    out->delay_us = v;
                else if (!strcmp(key, "op"))
                    out->delay_op = v;
                else if (!strcmp(key, "count"))
                    out->delay_count = v;
                else
                    ok = 0;
            } else if (!strcmp(kind, "lag")) {
                if (!strcmp(key, "us") && v > 0)
                    out->lag_us = v;
                else
                    ok = 0;
            } else if (!strcmp(kind, "stall")) {
                if (!strcmp(key, "us"))
                    out->stall_us = v;
                else if (!strcmp(key, "op"))
                    out->stall_op = v;
                else
                    ok = 0;
            } else {
                if (!strcmp(key, "rank"))
                    out->drop_rank = v;
                else if (!strcmp(key, "after"))
                    out->drop_after = v;
                else if (!strcmp(key, "count"))
                    out->drop_count = v;
                else
                    ok = 0;
            }
            if (!ok) {
                snprintf(err, errlen, "fault spec \"%s\": unknown or invalid key \"%s\"", kind,
                         key);
                return -1;
            }
            a += al + (comma ? 1 : 0);
        }
        if (!strcmp(kind, "fail") && out->fail_op < 0 && out->fail_every == 0) {
            snprintf(err, errlen, "fault spec \"fail\": needs op=N or every=K");
            return -1;
        }
        if (!strcmp(kind, "delay") && out->delay_us == 0) {
            snprintf(err, errlen, "fault spec \"delay\": needs us=U > 0");
            return -1;
        }
        if (!strcmp(kind, "stall") && out->stall_us == 0) {
            snprintf(err, errlen, "fault spec \"stall\": needs us=U > 0");
            return -1;
        }
        if (!strcmp(kind, "lag") && out->lag_us == 0) {
            snprintf(err, errlen, "fault spec \"lag\": needs us=U > 0");
            return -1;
        }
        if (!strcmp(kind, "drop") && out->drop_rank < 0) {
            snprintf(err, errlen, "fault spec \"drop\": needs rank=R");
            return -1;
        }
        c += len + (end ? 1 : 0);
    }
    return 0;
}

int ccq_fault_fails(const ccq_fault_plan *p, uint64_t op)
{
    if (p->fail_every > 0 && (op + 1) % (uint64_t)p->fail_every == 0)
        return 1;
    return p->fail_op >= 0 && op >= (uint64_t)p->fail_op &&
           op - (uint64_t)p->fail_op < (uint64_t)p->fail_count;
}

uint64_t ccq_fault_delay_us(const ccq_fault_plan *p, uint64_t op)
{
    if (p->delay_us <= 0)
        return 0;
    if (p->delay_op >= 0 && op < (uint64_t)p->delay_op)
        return 0;
    if (p->delay_count >= 0 &&
        op - (uint64_t)(p->delay_op >= 0 ? p->delay_op : 0) >= (uint64_t)p->delay_count)
        return 0;
    return (uint64_t)p->delay_us;
}
