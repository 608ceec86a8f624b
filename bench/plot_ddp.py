"""Draw docs/img/ddp-fusion.png: the data-parallel step's time against fusion_bytes for ccq
(2 processes x 1 and x 2 devices), with MPI's per-parameter and fused steps as lines, from the
JSON bench/ddp-step.sh keeps.
Usage: python3 bench/plot_ddp.py RESULTS_DIR OUT.png (needs matplotlib)."""
import glob
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(res, out):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, (p, g, n) in zip(axes, ((2, 1, 2), (2, 2, 4))):
        recs = json.load(open(os.path.join(res, f"ddp-sweep-p{p}g{g}.json")))["records"]
        xs = [max(r["fusion_bytes"], 1) for r in recs]
        ax.plot(xs[1:], [r["median_ms"] for r in recs[1:]], "o-", label="ccq, fusion on (median)")
        ax.plot(xs[1:], [r["min_ms"] for r in recs[1:]], "v:", color="C0", alpha=0.6,
                label="ccq, fusion on (fastest step)")
        ax.axhline(recs[0]["median_ms"], color="C0", ls=":", label="ccq, fusion off (0)")
        for mode, style in (("mpi-per-param", "--"), ("mpi-fused", "-.")):
            vals = []
            for path in glob.glob(os.path.join(res, f"ddp-mpi-np{n}-r*.json")):
                vals += [json.loads(l)["median_ms"] for l in open(path)
                         if l.strip() and json.loads(l)["mode"] == mode]
            if vals:
                ax.axhline(statistics.median(vals), color="C3" if "per" in mode else "C2",
                           ls=style, label=f"MPI {n} proc, {mode[4:]}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("fusion_bytes")
        ax.set_ylabel("step time (ms)")
        ax.set_title(f"DDP step (600 float32 params, 16 MiB), ccq {p} proc x {g} dev")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
