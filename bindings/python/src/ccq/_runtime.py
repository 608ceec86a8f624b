"""ccq.Runtime: the extension's runtime with a context manager, and every runtime closed at
interpreter exit (before finalization, while ccq's threads can still take the GIL)."""

import atexit
import threading
import weakref

from . import _ccq
from ._types import ProcessState

_live = weakref.WeakSet()
_live_lock = threading.Lock()


class Runtime(_ccq.Runtime):
    """A ccq runtime: ``Runtime(**config)`` takes every ``ccq_config`` field as a keyword
    (``ccq.config_fields()``); fields not given keep ccq's defaults with the ``CCQ_*``
    environment variables applied, as ``ccq_config_init`` does in C.

    Use it as a context manager (``with ccq.Runtime(host_devices=4) as rt:``) or call
    :meth:`close`. Every method may be called from any thread; submitting and fencing release
    the GIL."""

    def __init__(self, **config):
        super().__init__(**config)
        with _live_lock:
            _live.add(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def process_state(self, process):
        """What this process knows of world rank ``process`` (job health): a
        :class:`ccq.ProcessState` (ALIVE; LOST: it died or was silent past
        ``heartbeat_timeout_ms``, and every survivor agrees; LEFT: it closed its runtime).
        ``rt.progress()`` gives every process's progress per communicator, from the
        heartbeats."""
        return ProcessState(super().process_state(process))

    def __repr__(self):
        if self.closed:
            return "<ccq.Runtime closed>"
        return "<ccq.Runtime backend=%s devices=%s of %d, process %d of %d>" % (
            self.backend, "%d..%d" % (self.local_devices[0], self.local_devices[-1]),
            self.device_count, self.world_rank, self.world_size)


@atexit.register
def _close_all():
    with _live_lock:
        live = list(_live)
    for rt in live:
        rt.close()
