/* Fault injection plans (tests and drills only; off unless CCQ_FAULT or ccq_config.fault). */
#ifndef CCQ_RUNTIME_FAULT_H
#define CCQ_RUNTIME_FAULT_H

#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"

/*
 * Spec: clauses separated by ';', each "kind:key=value[,key=value...]".
 *   fail:op=N[,count=C]         the N-th operation issued to the backend (0-based, in
 *                               issue order) and the C-1 after it (default C = 1) fail with
 *                               CCQ_ERR_BACKEND without running
 *   fail:every=K                every K-th operation fails
 *   delay:us=U[,op=N][,count=C] operations N.. (default all) start U microseconds late (their
 *                               batch is held before the backend gets it), so the watchdog
 *                               can abort them before they touch a buffer
 *   drop:rank=R[,after=N][,count=C]  device R's commands after its first N are dropped on
 *                               arrival, as if that rank never submitted them (default C
 *                               unlimited); each dropped command fails on its own stream
 *   lag:us=U                    tcp:// rendezvous: what this process reads from the server
 *                               takes effect U microseconds after its bytes arrive (its I/O
 *                               thread preempted between the two, as on a loaded machine),
 *                               once per wake-up of that thread
 *   stall:us=U[,op=N]           the scheduler thread stands still for U microseconds in its
 *                               first poll of the backend after handing it the group holding
 *                               operation N (default 0), once: as a process stopped or
 *                               preempted on a loaded machine, what it started has sent its
 *                               first messages, and the deadlines of what is in flight pass
 *                               while nobody looks
 * Example: CCQ_FAULT="fail:op=17;delay:us=200000,op=3;drop:rank=2,after=5,count=1"
 */
typedef struct ccq_fault_plan {
    int64_t fail_op;     /* -1: none */
    int64_t fail_count;  /* operations failed from fail_op on */
    int64_t fail_every;  /* 0: none */
    int64_t delay_us;    /* 0: none */
    int64_t delay_op;    /* -1: every operation */
    int64_t delay_count; /* operations delayed from delay_op on (-1: unlimited) */
    int64_t drop_rank;   /* -1: none */
    int64_t drop_after;  /* commands of that device let through first */
    int64_t drop_count;  /* -1: unlimited */
    int64_t lag_us;      /* 0: none (the bootstrap's, ccq_boot_fault_lag) */
    int64_t stall_us;    /* 0: none */
    int64_t stall_op;    /* the operation whose issue the stall follows */
} ccq_fault_plan;

/* Parse a spec (NULL or "" = no faults). Returns 0, or -1 with a message in err. */
int ccq_fault_parse(const char *spec, ccq_fault_plan *out, char *err, size_t errlen);

/* Whether operation number `op` (0-based, in the order the backend runs them) fails, and
 * how long it is delayed (microseconds, 0 if not). */
int ccq_fault_fails(const ccq_fault_plan *p, uint64_t op);
uint64_t ccq_fault_delay_us(const ccq_fault_plan *p, uint64_t op);

/* Put the plan's fail, delay and stall clauses around a backend (runtime/fault_backend.c): on
 * CCQ_OK *ops and *be are the wrapper's, which owns the inner backend from then on (its
 * destroy destroys both). A plan without fail, delay or stall leaves them unchanged. drop is the
 * scheduler's (it acts on commands, not operations). */
ccq_status ccq_fault_wrap(const ccq_fault_plan *plan, const ccq_backend_ops **ops,
                          ccq_backend **be);

#endif /* CCQ_RUNTIME_FAULT_H */
