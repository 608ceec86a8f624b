"""Draw docs/img/busbw.png: all_reduce bus bandwidth vs size for ccq (host backend), Open MPI's
MPI_Allreduce and the memory-bandwidth floor, from the JSON that bench/run-all.sh keeps.
Usage: python3 bench/plot.py RESULTS_DIR OUT_DIR (needs Debian's python3-matplotlib)."""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def busbw_factor(n):
    return 2.0 * (n - 1) / n


def main(res, outdir):
    os.makedirs(outdir, exist_ok=True)
    bw = json.load(open(os.path.join(res, "bandwidth.json")))["records"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, n in zip(axes, (2, 4)):
        ccq = json.load(open(os.path.join(res, f"ccq-np{n}.json")))
        mpi = [json.loads(l) for l in open(os.path.join(res, f"mpi-np{n}.json")) if l.strip()]
        floor = [r for r in bw if r["ndev"] == n]
        ax.plot([r["size"] for r in ccq], [r["out_of_place"]["busbw"] for r in ccq], "o-",
                label="ccq (host backend)")
        ax.plot([r["size"] for r in mpi], [r["busbw"] for r in mpi], "s-",
                label="Open MPI MPI_Allreduce")
        # The floor: 2*N*S bytes at the measured copy rate, expressed as bus bandwidth.
        ax.plot([r["size"] for r in floor],
                [r["size"] / (r["floor_us"] * 1e3) * busbw_factor(n) for r in floor], "k--",
                label="memory-bandwidth floor")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("size per rank (bytes)")
        ax.set_title(f"all_reduce float32 sum, {n} ranks")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("bus bandwidth (GB/s, nccl-tests definition)")
    axes[0].legend(loc="upper left")
    fig.tight_layout()
    path = os.path.join(outdir, "busbw.png")
    fig.savefig(path, dpi=110)
    print("wrote", path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
