#!/usr/bin/python3
"""Render a ccq trace (the Chrome/Perfetto JSON of CCQ_TRACE_FILE or ccq_trace_dump) as a PNG
timeline: one row per (device, stream) with its commands in flight (colored by kind), the time
they spent queued (lighter, above), submissions (ticks) and fences (grey, below); one row for
the scheduler's batches; a few flow arrows from submissions to the batch that issued them;
error marks as red lines.

Usage: plot_trace.py TRACE.json OUT.png [--start US] [--span US] [--flows N]
  --start  window start, microseconds from the trace's start (default: the window with the
           most batches)
  --span   window length in microseconds (default 1500)
  --flows  how many submission -> batch arrows to draw (default 12)
Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import bisect
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

KIND_COLOR = {"all_reduce": "#1f77b4", "send": "#ff7f0e", "recv": "#2ca02c",
              "broadcast": "#8c564b", "reduce": "#e377c2", "all_gather": "#17becf",
              "reduce_scatter": "#bcbd22", "all_to_all": "#d62728", "gather": "#7f7f7f",
              "scatter": "#393b79"}
BATCH_COLOR = "#9467bd"
FENCE_COLOR = "#7f7f7f"


def kind_of(name):
    return name.split(" ", 1)[0]


def load(path):
    with open(path) as f:
        trace = json.load(f)
    ndev = trace["otherData"]["devices"]
    t = {"ndev": ndev, "flight": [], "queued": [], "fence": [], "submit": [], "batch": [],
         "flow_s": {}, "flow_f": {}, "errors": []}
    qbegin = {}
    for e in trace["traceEvents"]:
        ph, cat = e.get("ph"), e.get("cat", "")
        if ph == "X" and e["pid"] < ndev:
            row = (e["pid"], e["tid"] // 3)
            span = (e["ts"], e["ts"] + e["dur"])
            if cat == "submit":
                t["submit"].append((row, e["ts"]))
            elif cat.startswith("op"):
                t["flight"].append((row, span, kind_of(e["name"]), "failed" in cat))
            elif cat == "fence":
                t["fence"].append((row, span))
        elif ph == "X" and cat == "batch":
            t["batch"].append(((e["ts"], e["ts"] + e["dur"]), e["args"]["ops"]))
        elif ph == "b" and cat == "queued":
            qbegin[e["id"]] = (e["pid"], e["tid"] // 3, e["ts"], kind_of(e["name"]))
        elif ph == "e" and cat == "queued" and e["id"] in qbegin:
            pid, stream, ts, kind = qbegin.pop(e["id"])
            t["queued"].append(((pid, stream), (ts, e["ts"]), kind))
        elif ph == "s":
            t["flow_s"][e["id"]] = ((e["pid"], e["tid"] // 3), e["ts"])
        elif ph == "f":
            t["flow_f"][e["id"]] = e["ts"]
        elif ph == "i" and cat == "error":
            t["errors"].append((e["ts"], e["name"]))
    return t


def plot(t, out, start, span, nflows):
    rows = sorted({r for r, *_ in t["flight"]} | {r for r, _ in t["fence"]}
                  | {r for r, *_ in t["queued"]})
    y = {r: k for k, r in enumerate(rows)}
    ysched = len(rows)
    if start is None:  # the window with the most batches: the steady state, not a stall
        bs = sorted(a for (a, _), _ in t["batch"]) or [0.0]
        counts = [(bisect.bisect_right(bs, a + span) - k, a) for k, a in enumerate(bs)
                  if a + span <= bs[-1] or k == 0]  # windows inside the trace
        start = max(0.0, max(counts)[1] - span * 0.02)
    end = start + span

    def visible(a, b):
        return b >= start and a <= end

    fig, ax = plt.subplots(figsize=(15, 1.0 + 0.55 * (len(rows) + 1)), dpi=120)
    # Queued (upper band, light: overlapping waits look darker), in flight (middle), fences.
    for row, (a, b), kind in t["queued"]:
        if visible(a, b):
            ax.broken_barh([(a - start, b - a)], (y[row] - 0.42, 0.22),
                           color=KIND_COLOR.get(kind, "k"), alpha=0.25, lw=0)
    for row, (a, b), kind, failed in t["flight"]:
        if not visible(a, b):
            continue
        base, h = y[row] - 0.18, 0.36
        if kind == "send":  # send and recv of one stream share a batch: split the band
            h /= 2
        elif kind == "recv":
            base, h = base + h / 2, h / 2
        ax.broken_barh([(a - start, max(b - a, 0.3))], (base, h),
                       color=KIND_COLOR.get(kind, "k"), edgecolor="red" if failed else "none",
                       lw=1.5 if failed else 0)
    for row, (a, b) in t["fence"]:
        if visible(a, b):
            ax.broken_barh([(a - start, b - a)], (y[row] + 0.22, 0.14), color=FENCE_COLOR,
                           alpha=0.55, lw=0)
    sub_x = [ts - start for row, ts in t["submit"] if start <= ts <= end]
    sub_y = [y[row] - 0.46 for row, ts in t["submit"] if start <= ts <= end]
    ax.plot(sub_x, sub_y, "|", color="k", ms=6, mew=1)
    nvis = sum(1 for (a, b), _ in t["batch"] if visible(a, b))
    for (a, b), ops in t["batch"]:
        if visible(a, b):
            ax.broken_barh([(a - start, max(b - a, 0.3))], (ysched - 0.3, 0.6),
                           color=BATCH_COLOR, edgecolor="k", lw=0.3)
            if nvis <= 40:  # label each batch with its number of operations
                ax.text((a + b) / 2 - start, ysched + 0.32, str(ops), ha="center", va="top",
                        fontsize=7)
    # A few flows, spread over the window: submission -> the batch that issued it.
    flows = sorted((s_ts, fid) for fid, (row, s_ts) in t["flow_s"].items()
                   if fid in t["flow_f"] and start <= s_ts and t["flow_f"][fid] <= end)
    step = max(1, len(flows) // max(nflows, 1))
    for s_ts, fid in flows[::step][:nflows]:
        row = t["flow_s"][fid][0]
        ax.annotate("", xy=(t["flow_f"][fid] - start, ysched - 0.3),
                    xytext=(s_ts - start, y[row] - 0.46),
                    arrowprops=dict(arrowstyle="->", color="0.25", lw=0.7, alpha=0.8))
    for ts, name in t["errors"]:
        if start <= ts <= end:
            ax.axvline(ts - start, color="red", ls="--", lw=1)
            ax.text(ts - start, -0.7, name, color="red", fontsize=7, ha="left")

    for k in range(1, len(rows) + 1):  # a line between devices, and above the scheduler
        if k == len(rows) or rows[k][0] != rows[k - 1][0]:
            ax.axhline(k - 0.5, color="0.6", lw=0.6)
    ax.set_yticks(list(range(len(rows))) + [ysched])
    ax.set_yticklabels(["device %d  stream %d" % r for r in rows] + ["scheduler: batches"])
    ax.set_ylim(ysched + 0.7, -0.8)
    ax.set_xlim(0, span)
    ax.set_xlabel("time (µs) from %.0f µs into the trace" % start)
    ax.grid(axis="x", color="0.9", lw=0.5)
    ax.set_axisbelow(True)
    legend = [Patch(color=KIND_COLOR["all_reduce"], label="all_reduce in flight"),
              Patch(color=KIND_COLOR["send"], label="send in flight"),
              Patch(color=KIND_COLOR["recv"], label="recv in flight"),
              Patch(color=KIND_COLOR["all_reduce"], alpha=0.25, label="queued (stacked)"),
              Patch(color=FENCE_COLOR, alpha=0.55, label="fence (caller waiting)"),
              Patch(color=BATCH_COLOR, label="batch (number of ops)"),
              Line2D([], [], marker="|", color="k", ls="none", label="submission"),
              Line2D([], [], color="0.25", lw=0.7, label="submission -> its batch")]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=4,
              fontsize=8, frameon=False)
    ax.set_title("ccq trace: %.0f µs window" % span, fontsize=10)
    fig.tight_layout()
    fig.savefig(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("--start", type=float, default=None)
    p.add_argument("--span", type=float, default=1500.0)
    p.add_argument("--flows", type=int, default=12)
    a = p.parse_args()
    plot(load(a.trace), a.out, a.start, a.span, a.flows)


if __name__ == "__main__":
    main()
