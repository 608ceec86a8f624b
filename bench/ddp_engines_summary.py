"""The table of bench/ddp-step-engines.sh: the DDP step through ccq on its UCX engine (tcp://)
and its MPI engine (mpirun), fusion on and off, against MPI alone, side by side, from the JSON
it keeps (ddp-ucx-p2g{G}-r{R}.json, ddp-mpieng-p2g{G}-r{R}.json, ddp-mpi-np{N}-r{R}.json).
Each figure is the median over rounds of a run's median step time (the slowest process's).
Usage: python3 bench/ddp_engines_summary.py RESULTS_DIR"""
import glob
import json
import os
import statistics
import sys


def main(res):
    runs, mins, ops = {}, {}, {}
    last = None
    for eng in ("ucx", "mpieng"):
        for path in sorted(glob.glob(os.path.join(res, f"ddp-{eng}-p*g*-r*.json"))):
            for r in json.load(open(path))["records"]:
                key = (eng, r["devices"], "on" if r["fusion_bytes"] else "off")
                runs.setdefault(key, []).append(r["median_ms"])
                mins.setdefault(key, []).append(r["min_ms"])
                ops.setdefault(key, []).append(r["engine_ops"])
                last = r
    for path in sorted(glob.glob(os.path.join(res, "ddp-mpi-np*-r*.json"))):
        for line in open(path):
            if line.strip():
                r = json.loads(line)
                key = (r["mode"], r["procs"])
                runs.setdefault(key, []).append(r["median_ms"])
                mins.setdefault(key, []).append(r["min_ms"])
    med = {k: statistics.median(v) for k, v in runs.items()}
    best = {k: min(v) for k, v in mins.items()}
    rounds = max(len(v) for v in runs.values())
    print(f"# DDP step: {last['params']} float32 params ({last['bytes'] / 1048576:.1f} MiB, "
          f"{last['order']}), Mean all_reduce per parameter then a fence; median over {rounds} "
          f"rounds of each run's median step (ms); fastest step; engine operations per step")
    print("| configuration | UCX engine (tcp://) | MPI engine (mpirun) | MPI alone |")
    print("|---|---|---|---|")
    for g in (1, 2):
        n = 2 * g
        cells = []
        for eng in ("ucx", "mpieng"):
            on, off = (eng, g, "on"), (eng, g, "off")
            if on not in med:
                cells.append("")
                continue
            cells.append(f"on {med[on]:.1f} ({best[on]:.1f}; {statistics.median(ops[on]):.0f} ops), "
                         f"off {med[off]:.1f} ({best[off]:.1f}; {statistics.median(ops[off]):.0f}); "
                         f"**on/off {med[off] / med[on]:.2f}x**")
        pp, fu = ("mpi-per-param", n), ("mpi-fused", n)
        mpi = ""
        if pp in med:
            mpi = (f"{n} processes: per parameter {med[pp]:.1f} ({best[pp]:.1f}), "
                   f"fused {med[fu]:.1f} ({best[fu]:.1f})")
        print(f"| ccq 2 x {g} | {cells[0]} | {cells[1]} | {mpi} |")
    print()
    for g in (1, 2):
        n = 2 * g
        on = ("ucx", g, "on")
        if on not in med or ("mpi-per-param", n) not in med:
            continue
        faster = min(med[("mpi-per-param", n)], med[("mpi-fused", n)])
        line = (f"ccq 2 x {g} UCX fused vs MPI alone ({n} processes): per parameter "
                f"{med[('mpi-per-param', n)] / med[on]:.2f}x, fused {med[('mpi-fused', n)] / med[on]:.2f}x, "
                f"the faster {faster / med[on]:.2f}x")
        if ("mpieng", g, "on") in med:
            line += f"; vs ccq on the MPI engine, fused: {med[('mpieng', g, 'on')] / med[on]:.2f}x"
        print(line)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build-bench/results-engines")
