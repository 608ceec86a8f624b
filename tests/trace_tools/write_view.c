/* Turn a textual trace view (made by gen_dumps.py) into a dump with ccq's own JSON writer
 * (runtime/trace/json.c), so the synthetic dumps the ccq-trace tests read have exactly the
 * format the library writes.
 *
 * usage: write_view IN.txt OUT.json. One item per line, fields as key=value:
 *   header backend=S ndev=N max_streams=N rank=N size=N first=N pid=N host=S dump=NS
 *          offset=NS dropped=N reason=S      (t0 is the first event's time)
 *   comm D,D,...                             (communicator ids in order: 0, 1, ...)
 *   note t=NS type=EVTYPE TEXT...            (the rest of the line)
 *   ev type=EVTYPE t=NS id=N batch=N seq=N count=N bytes=N thread=N dev=N stream=N comm=N
 *      kind=KIND dtype=DTYPE op=OP peer=N status=STATUS   (names as ccq prints them; peer
 *      given = peer_valid; bytes defaults to count x the dtype's size)
 * Events are sorted by (time, type, id) as a snapshot has them. Exit status 0, or 1 with a
 * message. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/trace/view.h"

#define MAXLINE 4096

static void die(const char *what, const char *line)
{
    fprintf(stderr, "write_view: %s: %s\n", what, line);
    exit(1);
}

static uint32_t by_name(const char *(*name)(uint32_t), uint32_t n, const char *want,
                        const char *line)
{
    for (uint32_t k = 0; k < n; k++)
        if (strcmp(name(k), want) == 0)
            return k;
    die("unknown name", want);
    (void)line;
    return 0;
}

static const char *kind_n(uint32_t k)
{
    return ccq_kind_name(k);
}
static const char *dtype_n(uint32_t k)
{
    return ccq_dtype_name((ccq_dtype)k);
}
static const char *op_n(uint32_t k)
{
    return ccq_reduce_op_name((ccq_reduce_op)k);
}
static const char *ev_n(uint32_t k)
{
    return ccq_event_type_name(k);
}

static int32_t status_of(const char *s, const char *line)
{
    for (int32_t v = 1; v >= -10; v--)
        if (strcmp(ccq_status_name((ccq_status)v), s) == 0)
            return v;
    die("unknown status", line);
    return 0;
}

static int ev_order(const void *pa, const void *pb)
{
    const ccq_event *a = pa, *b = pb;
    if (a->time_ns != b->time_ns)
        return a->time_ns < b->time_ns ? -1 : 1;
    if (a->type != b->type)
        return a->type < b->type ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static char *strdup_or_die(const char *s)
{
    char *d = strdup(s);
    if (d == NULL)
        die("out of memory", s);
    return d;
}

int main(int argc, char **argv)
{
    char line[MAXLINE];
    ccq_trace_view v;
    char *owned[3] = {NULL, NULL, NULL}; /* backend, host, reason: freed at the end */
    size_t evcap = 0, notecap = 0;
    FILE *in, *out;

    if (argc != 3) {
        fprintf(stderr, "usage: write_view IN.txt OUT.json\n");
        return 1;
    }
    in = fopen(argv[1], "r");
    if (in == NULL)
        die("cannot open", argv[1]);
    memset(&v, 0, sizeof v);
    v.hdr.backend = "host";
    v.hdr.ndev = 1;
    v.hdr.max_streams = 1;
    v.hdr.world_size = 1;
    while (fgets(line, sizeof line, in) != NULL) {
        char copy[MAXLINE], *save = NULL, *tok;
        line[strcspn(line, "\n")] = '\0';
        memcpy(copy, line, sizeof copy);
        tok = strtok_r(copy, " ", &save);
        if (tok == NULL || tok[0] == '#')
            continue;
        if (strcmp(tok, "comm") == 0) {
            char *list = strtok_r(NULL, " ", &save);
            ccq_device_id *ids = calloc(1024, sizeof *ids);
            uint32_t n = 0;
            v.comms = realloc(v.comms, (v.ncomms + 1) * sizeof *v.comms);
            if (list == NULL || ids == NULL || v.comms == NULL)
                die("bad comm", line);
            for (char *s2 = NULL, *d = strtok_r(list, ",", &s2); d != NULL && n < 1024;
                 d = strtok_r(NULL, ",", &s2))
                ids[n++] = (ccq_device_id)strtoul(d, NULL, 10);
            ccq_trace_comm *c = &v.comms[v.ncomms++];
            memset(c, 0, sizeof *c);
            c->ids = ids;
            c->n = n;
            size_t w = (size_t)snprintf(c->devices, sizeof c->devices, "{");
            for (uint32_t i = 0; i < n && w < sizeof c->devices; i++)
                w += (size_t)snprintf(c->devices + w, sizeof c->devices - w, i ? ",%u" : "%u",
                                      ids[i]);
            if (w < sizeof c->devices)
                snprintf(c->devices + w, sizeof c->devices - w, "}");
            continue;
        }
        if (strcmp(tok, "note") == 0) {
            if (v.nnotes == notecap) {
                notecap = notecap ? 2 * notecap : 8;
                v.notes = realloc(v.notes, notecap * sizeof *v.notes);
                if (v.notes == NULL)
                    die("out of memory", line);
            }
            ccq_note *nt = &v.notes[v.nnotes++];
            memset(nt, 0, sizeof *nt);
            for (int k = 0; k < 2; k++) {
                char *kv = strtok_r(NULL, " ", &save);
                if (kv == NULL)
                    die("bad note", line);
                if (strncmp(kv, "t=", 2) == 0)
                    nt->time_ns = strtoull(kv + 2, NULL, 10);
                else if (strncmp(kv, "type=", 5) == 0)
                    nt->type = by_name(ev_n, CCQ_EV_TYPE_COUNT_, kv + 5, line);
            }
            snprintf(nt->text, sizeof nt->text, "%s", save != NULL ? save : "");
            continue;
        }
        bool is_ev = strcmp(tok, "ev") == 0, given_bytes = false;
        if (!is_ev && strcmp(tok, "header") != 0)
            die("unknown line", line);
        ccq_event e;
        memset(&e, 0, sizeof e);
        e.device = e.stream = UINT32_MAX;
        while ((tok = strtok_r(NULL, " ", &save)) != NULL) {
            char *eq = strchr(tok, '=');
            if (eq == NULL)
                die("expected key=value", line);
            *eq = '\0';
            const char *k = tok, *val = eq + 1;
            uint64_t u = strtoull(val, NULL, 10);
            if (!is_ev) {
                if (strcmp(k, "backend") == 0)
                    free(owned[0]), v.hdr.backend = owned[0] = strdup_or_die(val);
                else if (strcmp(k, "ndev") == 0)
                    v.hdr.ndev = (uint32_t)u;
                else if (strcmp(k, "max_streams") == 0)
                    v.hdr.max_streams = (uint32_t)u;
                else if (strcmp(k, "rank") == 0)
                    v.hdr.world_rank = (uint32_t)u;
                else if (strcmp(k, "size") == 0)
                    v.hdr.world_size = (uint32_t)u;
                else if (strcmp(k, "first") == 0)
                    v.hdr.dev_first = (uint32_t)u;
                else if (strcmp(k, "pid") == 0)
                    v.hdr.pid = (int64_t)u;
                else if (strcmp(k, "host") == 0)
                    free(owned[1]), v.hdr.host = owned[1] = strdup_or_die(val);
                else if (strcmp(k, "dump") == 0)
                    v.hdr.dump_ns = u;
                else if (strcmp(k, "offset") == 0)
                    v.hdr.realtime_offset_ns = strtoll(val, NULL, 10);
                else if (strcmp(k, "dropped") == 0)
                    v.hdr.dropped = u;
                else if (strcmp(k, "reason") == 0)
                    free(owned[2]), v.hdr.reason = owned[2] = strdup_or_die(val);
                else
                    die("unknown header key", k);
                continue;
            }
            if (strcmp(k, "type") == 0)
                e.type = by_name(ev_n, CCQ_EV_TYPE_COUNT_, val, line);
            else if (strcmp(k, "t") == 0)
                e.time_ns = u;
            else if (strcmp(k, "id") == 0)
                e.id = u;
            else if (strcmp(k, "batch") == 0)
                e.batch = u;
            else if (strcmp(k, "seq") == 0)
                e.seq = u;
            else if (strcmp(k, "count") == 0)
                e.count = u;
            else if (strcmp(k, "bytes") == 0)
                e.bytes = u, given_bytes = true;
            else if (strcmp(k, "thread") == 0)
                e.thread = (uint32_t)u;
            else if (strcmp(k, "dev") == 0)
                e.device = (uint32_t)u;
            else if (strcmp(k, "stream") == 0)
                e.stream = (uint32_t)u;
            else if (strcmp(k, "comm") == 0)
                e.comm = (uint32_t)u;
            else if (strcmp(k, "kind") == 0)
                e.kind = (uint8_t)by_name(kind_n, CCQ_KIND_COUNT_, val, line);
            else if (strcmp(k, "dtype") == 0)
                e.dtype = (uint8_t)by_name(dtype_n, CCQ_DTYPE_COUNT_, val, line);
            else if (strcmp(k, "op") == 0)
                e.op = (uint8_t)by_name(op_n, CCQ_REDUCE_OP_COUNT_, val, line);
            else if (strcmp(k, "peer") == 0)
                e.peer = (uint32_t)u, e.peer_valid = 1;
            else if (strcmp(k, "status") == 0)
                e.status = status_of(val, line);
            else
                die("unknown event key", k);
        }
        if (!is_ev)
            continue;
        if (!given_bytes && e.type <= CCQ_EV_FAILED)
            e.bytes = e.count * ccq_dtype_size((ccq_dtype)e.dtype);
        e.struct_size = sizeof e;
        if (v.nev == evcap) {
            evcap = evcap ? 2 * evcap : 256;
            v.ev = realloc(v.ev, evcap * sizeof *v.ev);
            if (v.ev == NULL)
                die("out of memory", line);
        }
        v.ev[v.nev++] = e;
    }
    fclose(in);
    if (v.nev > 1)
        qsort(v.ev, v.nev, sizeof *v.ev, ev_order);
    v.hdr.t0_ns = v.nev ? v.ev[0].time_ns : 0;
    out = fopen(argv[2], "w");
    if (out == NULL)
        die("cannot create", argv[2]);
    if (ccq_trace_write_json(out, &v) != 0 || fclose(out) != 0)
        die("writing failed", argv[2]);
    for (uint32_t k = 0; k < v.ncomms; k++)
        free((void *)v.comms[k].ids);
    free(v.comms);
    free(v.notes);
    free(v.ev);
    for (int k = 0; k < 3; k++)
        free(owned[k]);
    return 0;
}
