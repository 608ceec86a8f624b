#!/usr/bin/env python3
"""A TCP port free on 127.0.0.1 now, below the kernel's ephemeral range, for a test's tcp://
rendezvous: the Python twin of tests/free_port.h (see there why not the kernel's pick: a port it
picks is one it also hands to outgoing connections, so process 0 could find it taken before it
listens). Run as a script it prints the port; the Python tests import free_port()."""

import os
import random
import socket


def port_free(port):
    """Whether nothing is bound to port on 127.0.0.1 now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port():
    lo = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    if lo > 12000:
        rng = random.Random(os.getpid() ^ int.from_bytes(os.urandom(4), "little"))
        for _ in range(200):
            port = rng.randrange(10000, lo)
            if port_free(port):
                return port
    with socket.socket() as s:  # the kernel's pick, as a last resort
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    print(free_port())
