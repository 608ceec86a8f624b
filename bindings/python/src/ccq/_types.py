"""ccq's enums and errors, made from the tables of ccq.h that the extension exports, so a
status, dtype or op added to the C library appears here without a change."""

import builtins
import enum

from . import _ccq


def _strip(name, *prefixes):
    for p in prefixes:
        if name.startswith(p):
            name = name[len(p):]
    return name


#: ccq_status: OK, IN_PROGRESS, INVALID_ARGUMENT, ... (values as in C).
Status = enum.IntEnum("Status", [(_strip(n, "CCQ_", "ERR_"), v) for v, n, _ in _ccq.STATUSES],
                      module="ccq")
Status.__doc__ = "ccq_status (CCQ_OK, CCQ_ERR_TIMEOUT, ...) without its prefix."

#: ccq_dtype: INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16,
#: FLOAT8E4M3, FLOAT8E5M2.
DType = enum.IntEnum("DType", [(n.upper(), v) for v, n in _ccq.DTYPES], module="ccq")
DType.__doc__ = "ccq_dtype; str(d) is ccq's name (\"bfloat16\")."
DType.__str__ = lambda self: self.name.lower()

#: ccq_reduce_op: SUM, PROD, MAX, MIN, AVG.
ReduceOp = enum.IntEnum("ReduceOp", [(n.upper(), v) for v, n in _ccq.REDUCE_OPS], module="ccq")
ReduceOp.__doc__ = "ccq_reduce_op (AVG on integers truncates, as NCCL)."

#: ccq_kind of events: ALL_REDUCE, SEND, RECV, BROADCAST, ...
Kind = enum.IntEnum("Kind", [(n.upper(), v) for v, n in _ccq.KINDS], module="ccq")

#: ccq_process_state: ALIVE, LOST (died, or silent past heartbeat_timeout_ms), LEFT.
ProcessState = enum.IntEnum("ProcessState", [("ALIVE", 0), ("LOST", 1), ("LEFT", 2)],
                            module="ccq")
ProcessState.__doc__ = "ccq_process_state: what this process knows of another (job health)."

#: ccq_event_type: SUBMITTED, MATCHED, ISSUED, COMPLETED, FAILED, ...
EventType = enum.IntEnum("EventType", [(n.upper(), v) for v, n in _ccq.EVENT_TYPES],
                         module="ccq")


class Error(Exception):
    """A ccq call failed. ``status`` is a :class:`Status`, ``detail`` ccq's readable detail
    (which argument, op, ranks, fields); ``str(e)`` is ``"TIMEOUT: <detail>"``. Each status
    has a subclass (``ccq.TimeoutError``, ``ccq.MismatchError``, ...)."""

    def __init__(self, status, detail=""):
        super().__init__(int(status), detail)
        self.status = Status(status)
        self.detail = detail

    def __str__(self):
        return "%s: %s" % (self.status.name, self.detail) if self.detail else self.status.name


Error.__module__ = "ccq"


# Subclasses that are also the builtin exception a Python caller would catch.
_ALSO = {
    "INVALID_ARGUMENT": (builtins.ValueError,),
    "NO_MEMORY": (builtins.MemoryError,),
    "TIMEOUT": (builtins.TimeoutError,),
}


def _class_name(status):
    return "".join(w.capitalize() for w in status.name.split("_")) + "Error"


#: {Status: subclass of Error}
ERRORS = {}
for _s in Status:
    if _s.value < 0:
        ERRORS[_s] = type(_class_name(_s), (Error,) + _ALSO.get(_s.name, ()),
                          {"__module__": "ccq", "__doc__": "ccq.Error with status %s: %s." % (
                              _s.name, dict((v, t) for v, _, t in _ccq.STATUSES)[_s.value])})
_ccq._set_errors(Error, {int(s): c for s, c in ERRORS.items()})
