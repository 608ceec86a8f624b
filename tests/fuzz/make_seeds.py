#!/usr/bin/env python3
"""Writes the seed inputs of tests/fuzz/corpus (see the format at the top of fuzz_api.c).

Usage: python3 tests/fuzz/make_seeds.py [corpus-dir]
"""
import os
import sys

# Opcodes (fuzz_api.c, FZ_OP_*).
COMM_INIT, ALL_REDUCE, SEND, RECV, SYNC, STATS, LAST_ERROR, MEM_ALLOC, MEM_FREE, MEM_COPY, \
    SHUTDOWN, ALL_REDUCE_ALL, SENDRECV, SYNC_ALL, MISC, RT2 = range(16)
INT8, UINT8, INT32, UINT32, INT64, UINT64, F16, F32, F64, BF16, E4M3, E5M2 = range(12)
SUM, PROD, MAX, MIN, AVG = range(5)
TIMEOUT = {20: 0, 30: 2, 40: 3, 50: 4, 80: 5, 120: 6, 200: 7}


def header(ndev=4, streams=1, nonblocking=False, workers=1, depth=8, batch=8, timeout=20,
           seed=1, fault=0, fault_arg=0, bad=0):
    h0 = (ndev - 1) | ((streams - 1) << 3) | (0x20 if nonblocking else 0) | ((workers - 1) << 6)
    h1 = (depth - 1) | ((batch - 1) << 4)
    return bytes([h0, h1, TIMEOUT[timeout], seed, fault, fault_arg, bad])


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
