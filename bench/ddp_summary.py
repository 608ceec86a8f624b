"""The table of bench/ddp-step.sh: a data-parallel step through ccq against MPI, side by side,
from the JSON it keeps (ddp-ccq-p{P}g{G}-r{R}.json, ddp-mpi-np{N}-r{R}.json and the sweeps).
Each figure is the median over rounds of a run's median step time (the slowest process's).
Usage: python3 bench/ddp_summary.py RESULTS_DIR"""
import glob
import json
import os
import statistics
import sys


def ccq_records(path):
    return json.load(open(path))["records"]


def mpi_records(path):
    return [json.loads(l) for l in open(path) if l.strip()]


def median_of(values):
    return statistics.median(values) if values else float("nan")


def main(res):
    runs = {}  # (label) -> [median_ms per round]
    mins = {}  # (label) -> [min_ms per round]
    engine_ops = {}
    for path in sorted(glob.glob(os.path.join(res, "ddp-ccq-p*g*-r*.json"))):
        for r in ccq_records(path):
            key = ("ccq", r["procs"], r["devices"], "on" if r["fusion_bytes"] else "off")
            runs.setdefault(key, []).append(r["median_ms"])
            mins.setdefault(key, []).append(r["min_ms"])
            engine_ops[key] = r["engine_ops"]
            if r["fusion_bytes"]:
                default_bytes = r["fusion_bytes"]
    for path in sorted(glob.glob(os.path.join(res, "ddp-mpi-np*-r*.json"))):
        for r in mpi_records(path):
            runs.setdefault((r["mode"], r["procs"]), []).append(r["median_ms"])
            mins.setdefault((r["mode"], r["procs"]), []).append(r["min_ms"])
    m = {k: median_of(v) for k, v in runs.items()}
    b = {k: min(v) for k, v in mins.items()}
    rounds = max(len(v) for v in runs.values())
    print(f"# DDP step: {r['params']} float32 params ({r['bytes'] / 1048576:.1f} MiB, "
          f"{r['order']}), Mean all_reduce per parameter then a fence; median step time (ms) "
          f"over {rounds} rounds; fusion_bytes {default_bytes}")
    print("| configuration | step (ms), median | fastest step (ms) | engine ops | other / ccq (median; fastest) |")
    print("|---|---|---|---|---|")
    for p, g, n in ((2, 1, 2), (2, 2, 4)):
        on, off = m.get(("ccq", p, g, "on")), m.get(("ccq", p, g, "off"))
        bon, boff = b.get(("ccq", p, g, "on")), b.get(("ccq", p, g, "off"))
        print(f"| ccq {p} x {g}, fusion on | {on:.2f} | {bon:.2f} | "
              f"{engine_ops.get(('ccq', p, g, 'on'))} | |")
        print(f"| ccq {p} x {g}, fusion off | {off:.2f} | {boff:.2f} | "
              f"{engine_ops.get(('ccq', p, g, 'off'))} | on/off: {off / on:.2f}x; {boff / bon:.2f}x |")
        for mode in ("mpi-per-param", "mpi-fused"):
            t, bt = m.get((mode, n), float("nan")), b.get((mode, n), float("nan"))
            print(f"| MPI {n} processes, {mode[4:]} | {t:.2f} | {bt:.2f} | "
                  f"{600 if mode == 'mpi-per-param' else 1} | {t / on:.2f}x; {bt / bon:.2f}x |")
    on, off = m.get(("ccq", 1, 4, "on")), m.get(("ccq", 1, 4, "off"))
    if on:
        bon, boff = b.get(("ccq", 1, 4, "on")), b.get(("ccq", 1, 4, "off"))
        print(f"| ccq 1 x 4, fusion on | {on:.2f} | {bon:.2f} | "
              f"{engine_ops.get(('ccq', 1, 4, 'on'))} | |")
        print(f"| ccq 1 x 4, fusion off | {off:.2f} | {boff:.2f} | 600 | on/off: {off / on:.2f}x; "
              f"{boff / bon:.2f}x |")
    print()
    print("# targets (issue 27)")
    t21 = min(m.get(("mpi-per-param", 2), 0), m.get(("mpi-fused", 2), 0))
    on21 = m.get(("ccq", 2, 1, "on"))
    print(f"ccq 2 x 1 vs MPI per parameter (2 proc): {m.get(('mpi-per-param', 2)) / on21:.2f}x "
          f"(target >= 1.3x); vs MPI fused: {m.get(('mpi-fused', 2)) / on21:.2f}x (target >= 1.3x)")
    t4 = min(m.get(("mpi-per-param", 4)), m.get(("mpi-fused", 4)))
    on22 = m.get(("ccq", 2, 2, "on"))
    print(f"ccq 2 x 2 vs the faster MPI with 4 processes: {t4 / on22:.2f}x (target >= 1.5x)")
    print(f"(fastest steps: ccq 2 x 1 vs MPI per parameter {b[('mpi-per-param', 2)] / b[('ccq', 2, 1, 'on')]:.2f}x, "
          f"vs MPI fused {b[('mpi-fused', 2)] / b[('ccq', 2, 1, 'on')]:.2f}x; ccq 2 x 2 vs the faster MPI "
          f"{min(b[('mpi-per-param', 4)], b[('mpi-fused', 4)]) / b[('ccq', 2, 2, 'on')]:.2f}x)")
    del t21
    for pg in ("p2g1", "p2g2"):
        path = os.path.join(res, f"ddp-sweep-{pg}.json")
        if not os.path.exists(path):
            continue
        recs = ccq_records(path)
        print()
        print(f"# fusion_bytes sweep, {recs[0]['procs']} processes x {recs[0]['devices']} devices "
              f"(one run, values interleaved)")
        print("| fusion_bytes | step (ms) | min (ms) | engine ops |")
        print("|---|---|---|---|")
        for r in recs:
            print(f"| {r['fusion_bytes']} | {r['median_ms']:.2f} | {r['min_ms']:.2f} | "
                  f"{r['engine_ops']} |")


if __name__ == "__main__":
    main(sys.argv[1])
