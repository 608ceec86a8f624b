#!/usr/bin/env python3
"""Writes the seed inputs of tests/fuzz/corpus (see the format at the top of fuzz_api.c).

Usage: python3 tests/fuzz/make_seeds.py [corpus-dir]
"""
import os
import sys

# Opcodes (fuzz_api.c, FZ_OP_*).
COMM_INIT, ALL_REDUCE, SEND, RECV, SYNC, STATS, LAST_ERROR, MEM_ALLOC, MEM_FREE, MEM_COPY, \
    SHUTDOWN, ALL_REDUCE_ALL, SENDRECV, SYNC_ALL, MISC, RT2 = range(16)
# Opcode bytes 0xE0 and up: one part of a collective, every rank's part (low bits: variant),
# an event-log call (low bits: which).
COLL, COLL_ALL, TRACE = 0xE0, 0xF0, 0xF8
ALL_NULL_UNUSED, ALL_DIFF_COUNT, ALL_DIFF_ROOT, ALL_DIFF_KIND = 1, 2, 4, 6
BROADCAST, REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, GATHER, SCATTER = range(7)
SNAPSHOT, DUMP, METRICS, QUEUE_DEPTH, CALLBACK, NAMES, NULL_RT, CENSUS = range(8)
INPLACE, INPLACE_OFF = 0xfe, 0xfd
INT8, UINT8, INT32, UINT32, INT64, UINT64, F16, F32, F64, BF16, E4M3, E5M2 = range(12)
SUM, PROD, MAX, MIN, AVG = range(5)
TIMEOUT = {20: 0, 30: 2, 40: 3, 50: 4, 80: 5, 120: 6, 200: 7}


def header(ndev=4, streams=1, nonblocking=False, workers=1, depth=8, batch=8, timeout=20,
           seed=1, fault=0, fault_arg=0, bad=0, trace=0):
    """trace: index into fz_trace_caps (0: 256 events, 1: recorder off, 13: 1024)."""
    h0 = (ndev - 1) | ((streams - 1) << 3) | (0x20 if nonblocking else 0) | ((workers - 1) << 6)
    h1 = (depth - 1) | ((batch - 1) << 4)
    return bytes([h0, h1, TIMEOUT[timeout] | (trace << 3), seed, fault, fault_arg, bad])


def set_all(rot=0):
    return bytes([0x40 | rot])


def set_pair(a, b):
    return bytes([0x60, a, b])


def set_list(*devs):
    return bytes([0xa0 | (len(devs) - 1)] + list(devs))


def buf(idx, off16):
    return (off16 << 2) | idx


def all_reduce(dev, stream, src, dst, count, dtype, op, devset):
    return bytes([ALL_REDUCE, dev, stream, src, dst, count, dtype, op]) + devset


def all_reduce_all(devset, stream, src, dst, count, dtype, op):
    return bytes([ALL_REDUCE_ALL]) + devset + bytes([stream, src, dst, count, dtype, op])


def sendrecv(a, b, sa, sb, src, dst, count, dtype, recv_first=0):
    return bytes([SENDRECV, a, b, sa, sb, src, dst, count, dtype, recv_first])


def send(dev, stream, b, count, dtype, peer):
    return bytes([SEND, dev, stream, b, count, dtype, peer])


def recv(dev, stream, b, count, dtype, peer):
    return bytes([RECV, dev, stream, b, count, dtype, peer])


def sync(dev, stream):
    return bytes([SYNC, dev, stream])


def coll(kind, dev, stream, src, dst, count, dtype, op, root, devset):
    """One rank's part; root picks the (root % n)-th device of the set (>= 0xf0: any)."""
    return bytes([COLL, kind, dev, stream, src, dst, count, dtype, op, root]) + devset


def coll_all(kind, devset, stream, src, dst, count, dtype, op=SUM, root=0, variant=0):
    return bytes([COLL_ALL | variant, kind]) + devset + bytes([stream, src, dst, count, dtype, op,
                                                               root])


def trace(call, *operands):
    return bytes([TRACE | call] + list(operands))


def every_collective(**kw):
    """Each of the seven over every device: rooted ones at device 1, NULL where unused."""
    return b"".join(coll_all(k, set_all(), 0, buf(0, 0), buf(1, 0), 5, F32, SUM, 1,
                             ALL_NULL_UNUSED, **kw) for k in range(7))


SEEDS = {
    "seed-allreduce": header(ndev=4, streams=2)
    + bytes([COMM_INIT]) + set_all()
    + all_reduce_all(set_all(), 0, buf(0, 0), 0xfe, 16, F32, SUM)
    + all_reduce_all(set_all(1), 0x81, buf(0, 4), buf(1, 8), 7, BF16, AVG)
    + bytes([SYNC_ALL, STATS, 0]),
    "seed-allreduce-int": header(ndev=3, batch=2)
    + bytes([COMM_INIT]) + set_list(2, 0, 1)
    + all_reduce_all(set_list(0, 1, 2), 0, buf(2, 1), buf(3, 20), 63, INT32, PROD)
    + all_reduce_all(set_list(0, 1, 2), 0, buf(2, 1), 0xfe, 9, E4M3, MAX)
    + all_reduce_all(set_list(0, 1, 2), 0, buf(1, 0), 0xfe, 9, INT8, AVG)
    + bytes([SYNC_ALL]),
    "seed-sendrecv": header(ndev=2, streams=2)
    + sendrecv(0, 1, 0, 1, buf(0, 0), buf(0, 0), 32, F64)
    + sendrecv(1, 1, 0, 0, buf(1, 2), buf(1, 2), 5, UINT8, 1)
    + send(0, 0, buf(2, 0), 3, INT64, 0) + recv(0, 0, buf(3, 0), 3, INT64, 0)
    + bytes([SYNC_ALL, STATS, 0]),
    "seed-mismatch": header(ndev=2)
    + bytes([COMM_INIT]) + set_pair(0, 1)
    + all_reduce(0, 0, buf(0, 0), 0xfe, 4, F32, SUM, set_pair(0, 1))
    + all_reduce(1, 0, buf(1, 0), 0xfe, 5, F32, SUM, set_pair(1, 0))
    + sync(0, 0) + sync(1, 0) + bytes([LAST_ERROR, 0, 0, 4]),
    "seed-timeout": header(ndev=2)
    + bytes([COMM_INIT]) + set_pair(0, 1)
    + all_reduce(0, 0, buf(0, 0), buf(0, 8), 4, F16, MIN, set_pair(0, 1))
    + sync(0, 0) + bytes([LAST_ERROR, 0, 0, 3]),
    "seed-badargs": header(ndev=2, streams=2)
    + bytes([COMM_INIT]) + set_pair(0, 1)
    + all_reduce(0xf8, 0, buf(0, 0), 0xfe, 4, F32, SUM, set_pair(0, 1))
    + all_reduce(0, 0xf0, buf(0, 0), 0xfe, 4, F32, SUM, set_pair(0, 1))
    + all_reduce(0, 0, buf(0, 0), 0xfe, 4, 0xf0, SUM, set_pair(0, 1))
    + all_reduce(0, 0, buf(0, 0), 0xfe, 4, F32, 0xf3, set_pair(0, 1))
    + all_reduce(0, 0, buf(0, 0), 0xfe, 0xfb, F64, SUM, set_pair(0, 1))
    + all_reduce(0, 0, 0xff, 0xfe, 4, F32, SUM, set_pair(0, 1))
    + all_reduce(0, 0, buf(0, 0), buf(0, 1), 8, F32, SUM, set_pair(0, 1))
    + all_reduce(0, 0, buf(0, 0), 0xfe, 4, F32, SUM, set_pair(0, 0))
    + all_reduce(0, 0, buf(0, 0), 0xfe, 4, F32, SUM, bytes([0x03]))
    + all_reduce(0, 0, buf(0, 0), 0xfe, 4, F32, SUM, bytes([0x21]))
    + all_reduce(0, 0, buf(0, 0), 0xfe, 4, F32, SUM, set_list(0))
    + send(0, 0, buf(0, 0), 0xf8, INT8, 1) + recv(0, 0, 0xff, 4, INT8, 1)
    + send(0, 0, buf(0, 0), 4, INT8, 0xff)
    + bytes([COMM_INIT, 0x07, COMM_INIT, 0x20, COMM_INIT, 0x21])
    + bytes([COMM_INIT]) + set_list(0, 0)
    + sync(0xf9, 0) + sync(0, 0xf3),
    "seed-shutdown": header(ndev=3, streams=2, timeout=50)
    + bytes([COMM_INIT]) + set_all()
    + all_reduce(0, 1, buf(0, 0), 0xfe, 8, UINT32, SUM, set_all())
    + send(1, 0, buf(1, 0), 4, INT8, 2)
    + bytes([SHUTDOWN, 0])
    + all_reduce(1, 1, buf(1, 0), 0xfe, 8, UINT32, SUM, set_all())
    + send(1, 0, buf(1, 0), 4, INT8, 2)
    + bytes([COMM_INIT]) + set_all()
    + sync(0, 1) + sync(1, 0) + bytes([STATS, 1, SHUTDOWN, 0, SHUTDOWN, 1]),
    "seed-mem": header(ndev=2)
    + bytes([MEM_ALLOC, 0, 40, MEM_ALLOC, 1, 0, MEM_ALLOC, 0xf8, 10, MEM_ALLOC, 0, 0xef])
    + bytes([MEM_COPY, 0, 0, 100, MEM_COPY, 0, 1, 120, MEM_COPY, 0, 2, 5, MEM_COPY, 0, 0x40, 9])
    + bytes([MEM_COPY, 0, 0x80, 9, MEM_COPY, 5, 0, 0, MEM_COPY, 5, 1, 3])
    + bytes([MEM_FREE, 0x80, MEM_FREE, 0xc0, MEM_FREE, 0, MEM_FREE, 1, MEM_FREE, 6]),
    "seed-misc": header(ndev=1)
    + bytes([MISC, 0, 0, MISC, 0, 0xf6, MISC, 0, 0x7f, MISC, 1, 7, MISC, 1, 0x8c, MISC, 1, 0xc3])
    + bytes([MISC, 2, 0, MISC, 3, 0])
    + bytes([STATS, 0, STATS, 1, STATS, 2, STATS, 3, STATS, 4, STATS, 5])
    + bytes([LAST_ERROR, 0, 0, 0, LAST_ERROR, 0, 0, 1, LAST_ERROR, 0, 0, 5, LAST_ERROR, 0xfa, 0, 3]),
    "seed-rt2": header(ndev=2) + bytes([RT2, 0, RT2, 1, RT2, 6, RT2, 7]),
    "seed-queue-full": header(ndev=2, depth=2, nonblocking=True)
    + bytes([COMM_INIT]) + set_pair(0, 1)
    + all_reduce(0, 0, buf(0, 0), 0xfe, 2, INT8, SUM, set_pair(0, 1)) * 4
    + sync(0, 0),
    "seed-queue-block": header(ndev=2, depth=1)
    + send(0, 0, buf(0, 0), 1, UINT8, 1) + send(0, 0, buf(0, 1), 1, UINT8, 1)
    + recv(1, 0, buf(1, 0), 1, UINT8, 0) + recv(1, 0, buf(1, 1), 1, UINT8, 0)
    + bytes([SYNC_ALL]),
    "seed-fault-fail": header(ndev=2, fault=0xa0, fault_arg=1)
    + bytes([COMM_INIT]) + set_all()
    + all_reduce_all(set_all(), 0, buf(0, 0), 0xfe, 4, F32, SUM, ) * 3
    + bytes([SYNC_ALL]),
    "seed-fault-delay": header(ndev=2, timeout=30, fault=0xc0, fault_arg=0x07)
    + bytes([COMM_INIT]) + set_all()
    + all_reduce_all(set_all(), 0, buf(0, 0), 0xfe, 4, F32, SUM) * 2
    + bytes([SYNC_ALL]),
    "seed-fault-drop": header(ndev=2, fault=0x60, fault_arg=0x01)
    + bytes([COMM_INIT]) + set_all()
    + all_reduce_all(set_all(), 0, buf(0, 0), 0xfe, 4, F32, SUM) * 2
    + bytes([SYNC_ALL]),
    "seed-fault-raw": header(ndev=2, fault=0xe0, fault_arg=len(b"fail:op=0;delay:us=900"))
    + b"fail:op=0;delay:us=900"
    + bytes([COMM_INIT]) + set_all()
    + all_reduce_all(set_all(), 0, buf(0, 0), 0xfe, 4, F32, SUM) + bytes([SYNC_ALL]),
    "seed-fault-raw-bad": header(ndev=2, fault=0xe0, fault_arg=len(b"fail:nope=1"))
    + b"fail:nope=1",
    "seed-coll-broadcast": header(ndev=4, streams=2)
    + bytes([COMM_INIT]) + set_all()
    + coll_all(BROADCAST, set_all(), 0, buf(0, 0), buf(1, 0), 9, F32, root=2,
               variant=ALL_NULL_UNUSED)
    + coll_all(BROADCAST, set_all(1), 0x81, buf(2, 3), buf(3, 1), 4, INT64, root=0)
    + bytes([SYNC_ALL, STATS, 0]),
    "seed-coll-reduce": header(ndev=3)
    + bytes([COMM_INIT]) + set_list(2, 0, 1)
    + coll_all(REDUCE, set_list(0, 1, 2), 0, buf(0, 0), buf(1, 0), 7, INT32, PROD, root=1,
               variant=ALL_NULL_UNUSED)
    + coll_all(REDUCE, set_list(1, 2, 0), 0, buf(0, 2), buf(1, 2), 16, BF16, AVG, root=0)
    + bytes([SYNC_ALL]),
    "seed-coll-all-gather": header(ndev=4)
    + bytes([COMM_INIT]) + set_all()
    + coll_all(ALL_GATHER, set_all(), 0, buf(0, 0), buf(1, 0), 6, F64)
    + coll_all(ALL_GATHER, set_all(2), 0, buf(2, 1), buf(3, 0), 0, UINT8)
    + bytes([SYNC_ALL, STATS, 0]),
    "seed-coll-reduce-scatter": header(ndev=4, batch=2)
    + bytes([COMM_INIT]) + set_all()
    + coll_all(REDUCE_SCATTER, set_all(), 0, buf(0, 0), buf(1, 0), 8, F16, MAX)
    + coll_all(REDUCE_SCATTER, set_all(), 0, buf(2, 0), buf(3, 5), 3, UINT64, MIN)
    + bytes([SYNC_ALL]),
    "seed-coll-all-to-all": header(ndev=3, streams=2)
    + bytes([COMM_INIT]) + set_all()
    + coll_all(ALL_TO_ALL, set_all(), 0x80, buf(0, 0), buf(1, 0), 11, INT8)
    + coll_all(ALL_TO_ALL, set_all(), 0, buf(2, 0), buf(3, 0), 2, E5M2)
    + bytes([SYNC_ALL]),
    "seed-coll-gather": header(ndev=4)
    + bytes([COMM_INIT]) + set_list(3, 1, 2)
    + coll_all(GATHER, set_list(3, 1, 2), 0, buf(0, 0), buf(1, 0), 4, INT32, root=0,
               variant=ALL_NULL_UNUSED)
    + bytes([SYNC_ALL]),
    "seed-coll-scatter": header(ndev=4)
    + bytes([COMM_INIT]) + set_all()
    + coll_all(SCATTER, set_all(), 0, buf(0, 0), buf(1, 0), 4, F32, root=3,
               variant=ALL_NULL_UNUSED)
    + bytes([SYNC_ALL]),
    # Every kind in NCCL's in-place layout (all_to_all has none: refused), then one element off.
    "seed-coll-inplace": header(ndev=4, streams=2)
    + bytes([COMM_INIT]) + set_all()
    + b"".join(coll_all(k, set_all(), 0, buf(0, 0), INPLACE, 5, INT32, SUM, 2) for k in range(7))
    + bytes([SYNC_ALL])
    + b"".join(coll_all(k, set_all(), 1, buf(1, 1), INPLACE_OFF, 3, F64, SUM, 1) for k in range(7))
    + bytes([SYNC_ALL, STATS, 0]),
    "seed-coll-badargs": header(ndev=4, streams=2)
    + bytes([COMM_INIT]) + set_pair(0, 1)
    + coll(BROADCAST, 0, 0, buf(0, 0), buf(1, 0), 4, F32, SUM, 0xf2, set_pair(0, 1))  # root 2
    + coll(GATHER, 0, 0, buf(0, 0), buf(1, 0), 4, F32, SUM, 0xf9, set_pair(0, 1))  # no device
    + coll(REDUCE, 0, 0, buf(0, 0), buf(1, 0), 4, F32, 0xf1, 0, set_pair(0, 1))  # bad op
    + coll(SCATTER, 0, 0, 0xff, buf(1, 0), 4, F32, SUM, 0, set_pair(0, 1))  # root's src NULL
    + coll(ALL_GATHER, 0, 0, buf(0, 0), 0xff, 4, F32, SUM, 0, set_pair(0, 1))  # dst NULL
    + coll(ALL_TO_ALL, 0, 0, buf(0, 0), INPLACE, 4, F32, SUM, 0, set_pair(0, 1))
    + coll(REDUCE_SCATTER, 1, 0, buf(0, 0), INPLACE_OFF, 4, F32, SUM, 0, set_pair(0, 1))
    + coll(ALL_GATHER, 0, 0, buf(0, 0), buf(0, 1), 4, F32, SUM, 0, set_pair(0, 1))  # overlap
    + coll(ALL_GATHER, 0, 0, buf(0, 0), buf(1, 0), 0xf0, F32, SUM, 0, set_pair(0, 1))  # count*n
    + coll(BROADCAST, 0, 0, buf(0, 0), buf(1, 0), 0xfa, F64, SUM, 0, set_pair(0, 1))
    + coll(SCATTER, 2, 0, buf(0, 0), buf(1, 0), 4, F32, SUM, 0, set_pair(0, 1))  # not in set
    + coll(GATHER, 0, 0xf1, buf(0, 0), buf(1, 0), 4, F32, SUM, 0, set_pair(0, 1))
    + coll(ALL_TO_ALL, 0, 0, buf(0, 0), buf(1, 0), 4, 0xf2, SUM, 0, set_pair(0, 1))
    + coll(REDUCE, 2, 0, buf(0, 0), buf(1, 0), 4, F32, SUM, 0, set_pair(2, 3))  # no comm
    + coll(REDUCE, 1, 0, buf(0, 0), 0xff, 4, F32, SUM, 0, set_pair(0, 1))  # non-root: dst NULL
    + coll(REDUCE, 0, 0, buf(0, 0), 0xff, 4, F32, SUM, 0, set_pair(0, 1))
    + bytes([SYNC_ALL, SHUTDOWN, 0]) + coll_all(GATHER, set_all(), 0, buf(0, 0), buf(1, 0), 4, F32),
    "seed-coll-mismatch": header(ndev=3)
    + bytes([COMM_INIT]) + set_pair(0, 1) + bytes([COMM_INIT]) + set_all()
    + coll(BROADCAST, 0, 0, buf(0, 0), buf(1, 0), 4, F32, SUM, 0, set_pair(0, 1))
    + coll(BROADCAST, 1, 0, buf(0, 0), buf(1, 0), 4, F32, SUM, 1, set_pair(0, 1))  # root differs
    + sync(0, 0) + sync(1, 0) + bytes([LAST_ERROR, 1, 0, 4])
    + coll_all(ALL_GATHER, set_all(), 0, buf(0, 0), buf(1, 0), 4, INT8, variant=ALL_DIFF_COUNT)
    + coll_all(SCATTER, set_all(), 0, buf(0, 0), buf(1, 0), 2, F16, root=0, variant=ALL_DIFF_ROOT)
    + coll_all(REDUCE, set_all(), 0, buf(0, 0), buf(1, 0), 2, F16, root=1, variant=ALL_DIFF_KIND)
    + bytes([SYNC_ALL]) + every_collective(),
    "seed-trace": header(ndev=3, streams=2, trace=13)
    + trace(CALLBACK, 0) + bytes([COMM_INIT]) + set_all()
    + coll_all(ALL_GATHER, set_all(), 0x80, buf(0, 0), buf(1, 0), 3, F32)
    + trace(QUEUE_DEPTH, 0, 1, 0) + trace(METRICS, 0) + trace(SNAPSHOT, 6)
    + bytes([SYNC_ALL]) + trace(CENSUS)
    + coll_all(REDUCE, set_all(), 0, buf(0, 0), buf(1, 0), 3, F32, SUM, 0, ALL_NULL_UNUSED)
    + trace(SNAPSHOT, 2) + trace(SNAPSHOT, 0) + trace(SNAPSHOT, 8) + trace(SNAPSHOT, 0x0b)
    + trace(SNAPSHOT, 0x14) + trace(SNAPSHOT, 0x25)
    + trace(DUMP, 0) + trace(DUMP, 1) + trace(DUMP, 2) + trace(DUMP, 3) + trace(DUMP, 4)
    + b"".join(trace(METRICS, v) for v in range(1, 8))
    + trace(QUEUE_DEPTH, 0xf8, 0, 0) + trace(QUEUE_DEPTH, 0, 0xf0, 0) + trace(QUEUE_DEPTH, 1, 1, 1)
    + trace(NAMES, 7) + trace(NAMES, 12) + trace(NAMES, 0x85) + trace(NAMES, 0xc2)
    + trace(CALLBACK, 1) + trace(CALLBACK, 2) + trace(CALLBACK, 0) + trace(NULL_RT)
    + bytes([SYNC_ALL, SHUTDOWN, 0]) + trace(CENSUS) + trace(METRICS, 0)
    + trace(QUEUE_DEPTH, 2, 1, 0),
    "seed-trace-off": header(ndev=2, trace=1)
    + trace(CALLBACK, 0) + bytes([COMM_INIT]) + set_all() + every_collective()
    + trace(SNAPSHOT, 6) + trace(DUMP, 0) + trace(DUMP, 1) + trace(METRICS, 0)
    + bytes([SYNC_ALL]) + trace(CENSUS),
    "seed-badconfig-queue": header(bad=0xf4),
    "seed-badconfig-struct": header(bad=0xf9),
    "seed-badconfig-seed-era": header(bad=0xff),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(data)
    print(f"{len(SEEDS)} seeds written to {out}")


if __name__ == "__main__":
    main()
