#!/usr/bin/env python3
"""Writes the seed inputs of tests/fuzz/corpus_tcp (the step format at the top of fuzz_tcp.c).

Usage: python3 tests/fuzz/make_tcp_seeds.py [corpus-dir]
"""
import os
import struct
import sys

OPEN, SEND, CLOSE, READ, WAIT, HELLO, PUT, GET = range(8)


def raw(c, b):
    return bytes([SEND, c]) + struct.pack("<H", len(b)) + b


VERSION = 1  # CCQ_TCP_VERSION (runtime/boot/tcp_proto.h)


def frame(typ, payload, version=VERSION, magic=0x54514343):
    return struct.pack("<IHHI", magic, version, typ, len(payload)) + payload


def world(n=3):
    """n connections, each HELLOed as rank k."""
    s = bytes([OPEN]) * n
    for k in range(n):
        s += bytes([HELLO, k, k])
    return s


SEEDS = {
    # A whole exchange among 3 (members byte: rank + 4 * (nmembers - 1)), then reads.
    "seed-exchange": world(3) + b"".join(bytes([PUT, k, k + 8, 1, 16]) for k in range(3)) +
                     b"".join(bytes([GET, k, 1]) for k in range(3)) +
                     b"".join(bytes([READ, k]) for k in range(3)),
    # Records nobody asks for, up to the memory bound.
    "seed-hoard": world(1) + b"".join(bytes([PUT, 0, 12, t, 255]) for t in range(8)),
    # A process leaves (close), the others hear it.
    "seed-leave": world(3) + bytes([CLOSE, 1, READ, 0, READ, 1]),
    # Garbage, another version, an oversized frame, a frame before HELLO.
    "seed-garbage": bytes([OPEN]) + raw(0, b"GET / HTTP/1.0\r\n\r\n") + bytes([READ, 0]),
    "seed-version": bytes([OPEN]) + raw(0, frame(1, b"", version=99)) + bytes([READ, 0]),
    "seed-oversized": bytes([OPEN]) + raw(0, struct.pack("<IHHI", 0x54514343, VERSION, 4, 0x7fffffff)),
    "seed-no-hello": bytes([OPEN]) + raw(0, frame(5, b"\x02\x00ab")) + bytes([READ, 0]),
    # Half a frame, then time passes (stall), and a connection that never speaks.
    "seed-stall": bytes([OPEN, OPEN]) + raw(0, b"CCQT" + struct.pack("<H", VERSION)) + bytes([WAIT, 30, READ, 0]),
    # A duplicate rank and another world size.
    "seed-duplicate": world(1) + bytes([OPEN, HELLO, 1, 0, READ, 1]) +
                      raw(0, frame(1, struct.pack("<IIIIQ", 1, 9, 0, 0, 1) + b"fuzz")),
    # Heartbeats: every process beats, twice, one reads and one never does (only the newest
    # of each is queued for it); an empty and an oversized BEAT.
    "seed-beats": world(3) + b"".join(raw(k, frame(10, bytes([k]) * 40)) for k in range(3)) +
                  bytes([READ, 0]) + b"".join(raw(k, frame(10, bytes([k + 1]) * 60)) for k in range(3)) +
                  bytes([READ, 0, READ, 2, CLOSE, 1, READ, 0]),
    "seed-beat-bad": world(1) + raw(0, frame(10, b"")) + bytes([READ, 0]) + bytes([OPEN, HELLO, 1, 1]) +
                     raw(1, struct.pack("<IHHI", 0x54514343, VERSION, 10, 65537)) + bytes([READ, 1]),
    # Heartbeats on: time passes with nothing to relay, each process is sent a PING; one reads
    # them, one never does (one PING per keepalive, bounded like any output), one leaves.
    "seed-keepalive": world(3) + bytes([WAIT, 3, READ, 0, WAIT, 3, READ, 0, WAIT, 40, READ, 0,
                                        CLOSE, 2, WAIT, 3, READ, 1]),
    # A server taking over is offered finished exchanges (HAD): rank 2 offers, rank 1 asks and
    # publishes, rank 3 goes (a member that never asks); then offers that lack the sender.
    "seed-had": world(4) + bytes([PUT, 2, 2 + 8, 1, 0xe4, PUT, 1, 1 + 8, 1, 16, GET, 1, 1,
                                  READ, 1, READ, 2, PUT, 2, 2 + 12, 2, 0xe8, CLOSE, 3,
                                  PUT, 0, 0 + 4, 3, 0xe2, PUT, 3, 3 + 4, 4, 0xe0, READ, 0]),
    # A PUT that lies about its record (rank, length).
    "seed-bad-put": world(1) + raw(0, frame(4, b"\x02\x00t1" + b"\x00" * 40)) + bytes([READ, 0]),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus_tcp")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(data)
    print(f"wrote {len(SEEDS)} seeds to {out}")


if __name__ == "__main__":
    main()
