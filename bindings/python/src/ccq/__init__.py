"""ccq: collective communication from any thread (Python bindings of the C library).

    import ccq, numpy as np
    with ccq.Runtime(backend="host", host_devices=4) as rt:
        devs = [0, 1, 2, 3]
        rt.comm_init(devs)
        bufs = [np.full(1024, d, np.float32) for d in devs]
        for d in devs:
            rt.all_reduce(d, bufs[d], devices=devs, op=ccq.SUM)   # in place
        for d in devs:
            rt.sync(d)

See docs/python.md in the ccq repository.
"""

from . import _ccq
from ._runtime import Runtime
from ._types import (ERRORS, DType, Error, EventType, Kind, ProcessState, ReduceOp, Status)

# ccq.Fence, ccq.Stats, ccq.Metrics, ccq.Event come from the extension.
Fence = _ccq.Fence
Stats = _ccq.Stats
Metrics = _ccq.Metrics
Event = _ccq.Event
Progress = _ccq.Progress

#: The package's version: the version of the ccq headers it was built against.
__version__ = _ccq.HEADER_VERSION
library_version = _ccq.library_version
library_path = _ccq.library_path
config_fields = _ccq.config_fields
config_defaults = _ccq.config_defaults
FLAG_NONBLOCKING_SUBMIT = _ccq.FLAG_NONBLOCKING_SUBMIT

# The ops and dtypes as module constants: ccq.SUM, ccq.FLOAT32, ...
globals().update({m.name: m for m in ReduceOp})
globals().update({m.name: m for m in DType})
# The error classes: ccq.TimeoutError, ccq.MismatchError, ...
globals().update({c.__name__: c for c in ERRORS.values()})

__all__ = (["Runtime", "Fence", "Stats", "Metrics", "Event", "Progress", "Error", "Status",
            "DType", "ReduceOp", "Kind", "EventType", "ProcessState", "library_version",
            "library_path",
            "config_fields", "config_defaults", "FLAG_NONBLOCKING_SUBMIT"]
           + [m.name for m in ReduceOp] + [m.name for m in DType]
           + [c.__name__ for c in ERRORS.values()])
