/* The parameters of a data-parallel step (bench/ddp_step.c for ccq, bench/mpi_ddp_step.c for
 * MPI): one gradient per parameter, float32, in the order a DDP runtime submits them.
 * Header-only, so the MPI program (built with mpicc alone) shares it. */
#ifndef CCQ_BENCH_DDP_PARAMS_H
#define CCQ_BENCH_DDP_PARAMS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DDP_MAX_PARAMS  100000
#define DDP_MAX_CLASSES 8

/* The default step (issue 27): 500 x 1 KiB, 90 x 64 KiB, 10 x 1 MiB, about 15.6 MiB. */
#define DDP_DEFAULT_SPEC "500x1K,90x64K,10x1M"

typedef struct ddp_params {
    size_t n;      /* parameters */
    size_t *count; /* [n]: float32 elements of each, in submission order */
    size_t total;  /* elements in all */
    size_t maxcount;
} ddp_params;

static inline size_t ddp_parse_size(const char *s, char **end)
{
    double v = strtod(s, end);
    if (**end == 'G' || **end == 'g')
        v *= 1024.0 * 1024.0 * 1024.0, (*end)++;
    else if (**end == 'M' || **end == 'm')
        v *= 1024.0 * 1024.0, (*end)++;
    else if (**end == 'K' || **end == 'k')
        v *= 1024.0, (*end)++;
    return (size_t)v;
}

/*
 * spec: "N1xB1,N2xB2,..." (N parameters of B bytes each, K/M/G suffixes). order:
 * "interleaved" (default): as layers, each holding its share of every class, biggest first,
 * the way a model's gradients arrive (a weight, then its smaller companions); "grouped": the
 * classes one after the other as listed. Returns 0, or -1 with a message on stderr.
 */
static inline int ddp_params_make(ddp_params *p, const char *spec, const char *order)
{
    size_t num[DDP_MAX_CLASSES], bytes[DDP_MAX_CLASSES], nc = 0, layers = 0;
    const char *s = spec;
    memset(p, 0, sizeof *p);
    while (*s != '\0') {
        char *end;
        if (nc == DDP_MAX_CLASSES)
            goto bad;
        num[nc] = strtoul(s, &end, 10);
        if (end == s || (*end != 'x' && *end != 'X'))
            goto bad;
        s = end + 1;
        bytes[nc] = ddp_parse_size(s, &end);
        if (end == s || bytes[nc] < 4 || num[nc] == 0)
            goto bad;
        p->n += num[nc];
        if (num[nc] > 0 && (layers == 0 || num[nc] < layers))
            layers = num[nc]; /* the rarest class sets the number of layers */
        nc++;
        s = end;
        if (*s == ',')
            s++;
        else if (*s != '\0')
            goto bad;
    }
    if (nc == 0 || p->n > DDP_MAX_PARAMS)
        goto bad;
    p->count = malloc(p->n * sizeof *p->count);
    if (p->count == NULL)
        return -1;
    if (order != NULL && strcmp(order, "grouped") == 0) {
        size_t k = 0;
        for (size_t c = 0; c < nc; c++)
            for (size_t i = 0; i < num[c]; i++)
                p->count[k++] = bytes[c] / 4;
    } else if (order == NULL || strcmp(order, "interleaved") == 0) {
        /* Layer l gets, of each class (biggest bytes first), its share num[c] / layers (the
         * remainder to the first layers). */
        size_t k = 0, order_c[DDP_MAX_CLASSES];
        for (size_t c = 0; c < nc; c++)
            order_c[c] = c;
        for (size_t a = 0; a < nc; a++)
            for (size_t b = a + 1; b < nc; b++)
                if (bytes[order_c[b]] > bytes[order_c[a]]) {
                    size_t t = order_c[a];
                    order_c[a] = order_c[b];
                    order_c[b] = t;
                }
        for (size_t l = 0; l < layers; l++)
            for (size_t a = 0; a < nc; a++) {
                size_t c = order_c[a];
                size_t share = num[c] / layers + (l < num[c] % layers);
                for (size_t i = 0; i < share; i++)
                    p->count[k++] = bytes[c] / 4;
            }
    } else {
        fprintf(stderr, "order \"%s\": expected interleaved or grouped\n", order);
        free(p->count);
        return -1;
    }
    for (size_t i = 0; i < p->n; i++) {
        p->total += p->count[i];
        if (p->count[i] > p->maxcount)
            p->maxcount = p->count[i];
    }
    return 0;
bad:
    fprintf(stderr, "parameters \"%s\": expected N1xBYTES1,N2xBYTES2,... (e.g. %s)\n", spec,
            DDP_DEFAULT_SPEC);
    return -1;
}

static inline void ddp_params_free(ddp_params *p)
{
    free(p->count);
    p->count = NULL;
}

#endif /* CCQ_BENCH_DDP_PARAMS_H */
