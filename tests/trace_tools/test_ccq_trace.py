#!/usr/bin/env python3
"""ccq-trace on one scenario: analyze's verdict, exit status and wording, and that the merge
of the same dumps passes check_trace_json.py's validity and nesting checks.

Usage: test_ccq_trace.py SCENARIO WRITE_VIEW CCQ_TRACE    (synthetic dumps, gen_dumps.py)
       test_ccq_trace.py real CCQ_DEMO CCQ_TRACE           (a real dump of the demo)
Exit status 0 if everything holds, 1 with the reasons otherwise.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import check_trace_json  # noqa: E402
import gen_dumps  # noqa: E402

# scenario -> (analyze's exit status, lines its output must contain, lines it must not)
EXPECT = {
    "clean": (0, ["ccq-trace: 3 dumps of a world of 3 processes", "comm {0,1,2}:",
                  "ok: #0-#7 submitted by every rank, completed, in agreement",
                  "comm {0,1} send/recv 0 -> 1:", "ok: #0-#3 submitted by every rank",
                  "no problems found"], ["PROBLEM"]),
    "skip": (1, ["PROBLEM: not all ranks joined all_reduce #5: missing rank 1 (device 1, "
                 "process 1)",
                 "#5 where it was submitted: process 0 device 0 failed (CCQ_ERR_TIMEOUT); "
                 "process 2 device 2 failed (CCQ_ERR_TIMEOUT)",
                 "last sequence per process: process 0: submitted #7, completed #4; process 1: "
                 "submitted #4, completed #4; process 2: submitted #7, completed #4",
                 "process 0's last error: ", "1 problem"], []),
    "count": (1, ["PROBLEM: all_reduce #3: ranks disagree on count: 1024 on ranks 0-1 "
                  "(devices 0-1, processes 0-1); 2048 on rank 2 (device 2, process 2)",
                  "PROBLEM: broadcast #6: ranks disagree on root: 0 on ranks 0-1",
                  "2 problems"], ["not all ranks joined"]),
    "wrapped": (1, ["note: process 0's ring wrapped", "note: process 2's ring wrapped",
                    "PROBLEM: not all ranks joined all_reduce #40: missing rank 1 (device 1, "
                    "process 1)",
                    "process 1: submitted #39, completed #39",
                    "note: rings of processes 0,2 wrapped",
                    "not covered by every dump, not judged for completion and agreement"],
                ["process 1's ring wrapped"]),
    "wrapped_clean": (0, ["note: process 0's ring wrapped", "not covered by every dump",
                          "submitted by every rank, completed, in agreement",
                          "no problems found"], ["PROBLEM"]),
    "missing": (1, ["ccq-trace: 2 dumps of a world of 3 processes", "PROBLEM: no dump from process 2",
                    "not completed by ranks 0-1 (devices 0-1, processes 0-1)",
                    "device 2: unknown (process 2, no dump)",
                    "suspect: process 2, a member without a dump, while processes 0-1 wait"], []),
    "multidev": (1, ["PROBLEM: not all ranks joined all_reduce #2: missing rank 3 (device 3, "
                     "process 1)",
                     "process 1: device 2 submitted #2, completed #1, device 3 submitted #1"],
                 []),
    # One process owning every rank: the missing one is named by its rank in the
    # communicator (1 of {2,3}) and its device, the process is 0 throughout.
    "single": (1, ["ccq-trace: 1 dump of a world of 1 process (ccq ",
                   "): process 0",
                   "comm {2,3}:",
                   "PROBLEM: not all ranks joined all_reduce #2: missing rank 1 (device 3, "
                   "process 0)",
                   "#2 where it was submitted: process 0 device 2 failed (CCQ_ERR_TIMEOUT)",
                   "last sequence per process: process 0: device 2 submitted #2, completed #1, "
                   "device 3 submitted #1, completed #1"],
               ["ranks {", "rank 0 device", "missing ranks {0}"]),
    "version": (2, ["dump format 2", "this ccq-trace reads format 1 only"], []),
    "version_mix": (2, ["dumps of different ccq versions, refused", "0.0.9: "], []),
}
# No output may call a process a rank: every scenario's analysis is also checked for these.
NEVER = ["rank 0:", "rank 1:", "rank 2:", "last sequence per rank", "rank 0's", "rank 1's",
         "rank 2's", "missing ranks {", "from rank "]


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=60)
    return p.returncode, p.stdout


def check_merge(tool, dumps, tmp, problems, want_rc=0):
    out = os.path.join(tmp, "job.json")
    rc, text = run([sys.executable, tool, "merge"] + dumps + ["-o", out])
    if rc != want_rc:
        problems.append("merge: exit %d, expected %d:\n%s" % (rc, want_rc, text))
        return
    if rc != 0:
        return
    with open(out) as f:
        trace = json.load(f)
    found = []
    check_trace_json.check(trace, found, from_file=True)
    check_trace_json.check_nesting(trace, found)
    problems.extend("merge: " + p for p in found[:20])
    procs = trace["otherData"]["processes"]
    names = {e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    for r in procs:
        if "process %d ccq scheduler" % r not in names:
            problems.append("merge: no scheduler track group for process %d (%s)"
                            % (r, sorted(names)))


def analyze(tool, dumps, want_rc, must, must_not, problems):
    rc, text = run([sys.executable, tool, "analyze"] + dumps)
    print(text)
    if rc != want_rc:
        problems.append("analyze: exit %d, expected %d" % (rc, want_rc))
    for m in must:
        if m not in text:
            problems.append("analyze: output lacks %r" % m)
    for m in list(must_not) + NEVER:
        if m in text:
            problems.append("analyze: output has %r" % m)


def bad_input(write_view, tool, tmp, problems):
    """Input ccq-trace must refuse with exit status 2, naming the trouble."""
    good = gen_dumps.scenario_clean(write_view, tmp, n=2)
    cases = []
    junk = os.path.join(tmp, "junk.json")
    with open(junk, "w") as f:
        f.write('{"traceEvents": [')  # cut short
    cases.append(([junk], "not valid JSON"))
    old = os.path.join(tmp, "old.json")
    with open(good[0]) as f:
        t = json.load(f)
    del t["ccq"]  # a dump of a ccq before format 1
    with open(old, "w") as f:
        json.dump(t, f)
    cases.append(([old, good[1]], 'no "ccq" header'))
    cases.append(([good[0], good[0]], "two dumps of process 0"))
    other = os.path.join(tmp, "other.json")
    with open(good[1]) as f:
        text = f.read()
    with open(other, "w") as f:
        f.write(text.replace('"world_size":3', '"world_size":4', 1))
    cases.append(([good[0], other], "disagree on the world size"))
    cases.append(([os.path.join(tmp, "nothing.json")], "cannot read"))
    for files, want in cases:
        for sub in ("analyze", "merge"):
            extra = ["-o", os.path.join(tmp, "m.json")] if sub == "merge" else []
            rc, out = run([sys.executable, tool, sub] + files + extra)
            if rc != 2 or want not in out:
                problems.append("%s %s: exit %d, expected 2 with %r:\n%s"
                                % (sub, [os.path.basename(x) for x in files], rc, want, out))


def real(demo, tool, tmp, problems):
    """A real single-process dump (the demo, 4 devices): analyze finds nothing wrong, the
    merge is valid."""
    path = os.path.join(tmp, "demo.%r.json")
    env = dict(os.environ, CCQ_TRACE_FILE=path)
    env.pop("CCQ_TRACE_CAPACITY", None)
    env.pop("CCQ_FAULT", None)
    p = subprocess.run([demo, "10", "64"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=100)
    if p.returncode != 0:
        problems.append("demo failed (%d): %s" % (p.returncode, p.stdout))
        return
    dump = os.path.join(tmp, "demo.0.json")  # %r: world rank 0
    if not os.path.exists(dump):
        problems.append("no dump at %s: %s" % (dump, os.listdir(tmp)))
        return
    analyze(tool, [dump], 0, ["ccq-trace: 1 dump of a world of 1", "comm {0,1,2,3}:",
                              "submitted by every rank, completed, in agreement",
                              "no problems found"], ["PROBLEM"], problems)
    check_merge(tool, [dump], tmp, problems)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    scenario, exe, tool = sys.argv[1:]
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        if scenario == "real":
            real(exe, tool, tmp, problems)
        elif scenario == "bad_input":
            bad_input(exe, tool, tmp, problems)
        else:
            rc, must, must_not = EXPECT[scenario]
            dumps = gen_dumps.SCENARIOS[scenario](exe, tmp)
            analyze(tool, dumps, rc, must, must_not, problems)
            check_merge(tool, dumps, tmp, problems, want_rc=2 if rc == 2 else 0)
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
