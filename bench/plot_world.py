"""Draw docs/img/busbw-world.png: all_reduce bus bandwidth vs size across processes for ccq's
host backend over MPI (P processes x G devices), Open MPI's MPI_Allreduce and Gloo (P*G
processes), from the JSON bench/compare-world.sh keeps.
Usage: python3 bench/plot_world.py RESULTS_DIR OUT_DIR (needs Debian's python3-matplotlib)."""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def lines(path):
    return [json.loads(l) for l in open(path) if l.strip()]


def main(res, outdir):
    os.makedirs(outdir, exist_ok=True)
    panels = [(2, 1), (2, 2), (4, 1)]
    fig, axes = plt.subplots(1, len(panels), figsize=(16, 4.5), sharey=True)
    for ax, (p, g) in zip(axes, panels):
        n = p * g
        ccq = json.load(open(os.path.join(res, f"world-ccq-p{p}g{g}.json")))
        mpi = lines(os.path.join(res, f"world-mpi-np{n}.json"))
        gloo = lines(os.path.join(res, f"world-gloo-np{n}.json"))
        ax.plot([r["size"] for r in ccq], [r["out_of_place"]["busbw"] for r in ccq], "o-",
                label=f"ccq host over MPI ({p} proc x {g} dev)")
        ax.plot([r["size"] for r in mpi], [r["busbw"] for r in mpi], "s-",
                label=f"Open MPI MPI_Allreduce ({n} proc)")
        ax.plot([r["size"] for r in gloo], [r["busbw"] for r in gloo], "^-",
                label=f"Gloo TCP loopback ({n} proc)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("size per rank (bytes)")
        ax.set_title(f"all_reduce float32 sum, {n} ranks in {p} processes")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    axes[0].set_ylabel("bus bandwidth (GB/s, nccl-tests definition)")
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, "busbw-world.png"), dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
