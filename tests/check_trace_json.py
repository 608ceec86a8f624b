#!/usr/bin/env python3
"""Check the Chrome/Perfetto JSON that ccq writes (CCQ_TRACE_FILE) for a run of the demo.

Usage: check_trace_json.py [--nesting] DEMO [DEMO ARGS...]
       check_trace_json.py [--nesting] --file TRACE.json

With --file, an existing trace is checked instead (a dump, or a merge by tools/ccq-trace:
there every rank's devices and scheduler have their process names, named as its otherData
lists them, and command ids are per rank); its failure marks need only carry a failure status,
and a trace whose rings dropped events may have in-flight slices without their submission.

Runs DEMO with CCQ_TRACE_FILE set to a temporary file, then checks the file: it parses;
traceEvents is a list; every event has ph, pid and ts (metadata "M" events need no ts);
every async begin (b) has one end (e) and every flow start (s) one finish (f), not earlier;
every complete slice (X) has dur >= 0; per command id, the submission slice comes no later
than the in-flight slice; every device and the scheduler have a process name; the scheduler
has batch slices; failure marks carry a failure status (the demo has none).
With --nesting, only the rule Perfetto imposes on X slices is checked instead: on one track
(pid, tid) they nest perfectly, never overlapping partly.
Exit status 0 if all hold, 1 with one line per problem otherwise.
"""
import collections
import json
import os
import subprocess
import sys
import tempfile


def run_demo(cmd):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        env = dict(os.environ, CCQ_TRACE_FILE=path)
        env.pop("CCQ_TRACE_CAPACITY", None)
        env.pop("CCQ_FAULT", None)
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=120)
        if proc.returncode != 0:
            sys.exit("demo failed (%d):\n%s" % (proc.returncode, proc.stdout))
        with open(path) as f:
            return json.load(f)  # raises on invalid JSON


def check(trace, problems, from_file=False):
    events = trace.get("traceEvents")
    if not isinstance(events, list) or not events:
        problems.append("traceEvents is not a non-empty list")
        return
    other = trace["otherData"]
    ndev = other["devices"]
    if "device_pids" in other:  # a merge: names and pids as ccq-trace lists them
        want_names = {p: n for n, p in other["device_pids"].items()}
        want_names.update({p: "%s ccq scheduler" % r for r, p in other["scheduler_pids"].items()})
        sched_pids = set(other["scheduler_pids"].values())
    else:
        first = trace.get("ccq", {}).get("local_devices", [0, ndev])[0]
        want_names = {first + d: "device %d" % (first + d) for d in range(ndev)}
        want_names[first + ndev] = "ccq scheduler"
        sched_pids = {first + ndev}
    begins, ends = collections.Counter(), {}
    flow_s, flow_f = {}, {}
    submit_ts, flight_ts = {}, {}
    process_names = {}
    batches = 0
    for e in events:
        ph = e.get("ph")
        if ph is None or "pid" not in e or (ph != "M" and "ts" not in e):
            problems.append("event without ph/pid/ts: %r" % e)
            continue
        cat = e.get("cat", "")
        if ph == "M" and e["name"] == "process_name":
            process_names[e["pid"]] = e["args"]["name"]
        elif ph == "X":
            if e["dur"] < 0:
                problems.append("X slice with negative dur: %r" % e)
            cid = (e.get("args", {}).get("rank"), e.get("args", {}).get("id"))
            if cat == "submit":
                submit_ts[cid] = e["ts"]
            elif cat.startswith("op"):
                flight_ts[cid] = e["ts"]
            elif cat == "batch" and e["pid"] in sched_pids:
                batches += 1
        elif ph == "b":
            begins[(cat, e["id"])] += 1
            ends.setdefault((cat, e["id"]), []).append(("b", e["ts"]))
        elif ph == "e":
            ends.setdefault((cat, e["id"]), []).append(("e", e["ts"]))
        elif ph == "s":
            flow_s.setdefault(e["id"], []).append(e["ts"])
        elif ph == "f":
            flow_f.setdefault(e["id"], []).append(e["ts"])
        if "failed" in cat and e.get("args", {}).get("status") in (None, "CCQ_OK"):
            problems.append("failure mark without a failure status: %r" % e)
        elif "failed" in cat and not from_file:
            problems.append("the demo failed nothing, yet: %r" % e)

    for key, marks in ends.items():
        kinds = sorted(m[0] for m in marks)
        if kinds != ["b", "e"]:
            problems.append("async %s: %s instead of one b and one e" % (key, kinds))
        elif dict(marks)["e"] < dict(marks)["b"]:
            problems.append("async %s ends before it begins" % (key,))
    for fid in set(flow_s) | set(flow_f):
        s, f = flow_s.get(fid, []), flow_f.get(fid, [])
        if len(s) != 1 or len(f) != 1:
            problems.append("flow %s: %d starts, %d finishes" % (fid, len(s), len(f)))
        elif f[0] < s[0]:
            problems.append("flow %s finishes before it starts" % fid)
    lossy = other.get("dropped_events", 0) > 0
    for cid, ts in flight_ts.items():
        if cid not in submit_ts:
            if not lossy:
                problems.append("command %s in flight without a submission slice" % (cid,))
        elif submit_ts[cid] > ts:
            problems.append("command %s: submitted at %s, in flight at %s"
                            % (cid, submit_ts[cid], ts))
    for pid, name in sorted(want_names.items()):
        if process_names.get(pid) != name:
            problems.append("pid %d: process name %r, expected %r"
                            % (pid, process_names.get(pid), name))
    if batches == 0:
        problems.append("the scheduler has no batch slices")
    if not submit_ts or not flight_ts:
        problems.append("no submission or in-flight slices")


def check_nesting(trace, problems):
    tracks = collections.defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for track, slices in sorted(tracks.items()):
        slices.sort(key=lambda s: (s[0], -s[1]))
        stack, bad = [], []
        for s in slices:
            while stack and stack[-1][1] <= s[0]:
                stack.pop()
            if stack and s[1] > stack[-1][1]:
                bad.append((stack[-1], s))
            stack.append(s)
        if bad:
            (a0, a1, an), (b0, b1, bn) = bad[0]
            problems.append("track pid %d tid %d: %d slices overlap partly, e.g. %r [%.3f, %.3f]"
                            " and %r [%.3f, %.3f] us"
                            % (track[0], track[1], len(bad), an, a0, a1, bn, b0, b1))


def main():
    args = sys.argv[1:]
    nesting = bool(args) and args[0] == "--nesting"
    if nesting:
        args = args[1:]
    if not args:
        sys.exit(__doc__)
    from_file = args[0] == "--file"
    if from_file:
        with open(args[1]) as f:
            trace = json.load(f)  # raises on invalid JSON
    else:
        trace = run_demo(args)
    problems = []
    if nesting:
        check_nesting(trace, problems)
    else:
        check(trace, problems, from_file)
    for p in problems[:20]:
        print(p)
    if problems:
        print("%d problems in %d events" % (len(problems), len(trace["traceEvents"])))
        return 1
    print("ok: %d events, %s recorded, %s dropped"
          % (len(trace["traceEvents"]), trace["otherData"]["events"],
             trace["otherData"]["dropped_events"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
