"""Which threads remat tracks (integration/README.md, "Threads").

remat records the ops of threads whose dispatch-key state includes its hook: the thread that called ``enable()``,
autograd's threads for the backward passes it starts, and, while remat is on, every thread started with Python's
``threading`` module (a thread-start profile function switches the hook on, then removes itself). A tracked
thread's tensors can be evicted and its reads of evicted tensors bring them back. Threads that were already
running when remat was enabled (a thread pool made earlier) and threads started from C++ are not tracked: they may
allocate (the arena serves them and makes room for them) but must not use tensors made under remat unless they
call ``remat.track_this_thread()`` first.
"""

from __future__ import annotations

import sys
import threading

import torch

_previous_profile = None
_tracking = False


def track_this_thread(enabled: bool = True) -> None:
    """Records this thread's ops under remat from now on (or stops, with False). For threads that were running
    before remat.enable() and use tensors made under remat."""
    torch.ops.remat.track_this_thread(bool(enabled))


def _on_thread_start(frame, event, arg):
    sys.setprofile(_previous_profile)  # once per thread: hand the thread to whatever profiler was there
    if _tracking:
        torch.ops.remat.track_this_thread(True)
    if _previous_profile is not None:
        return _previous_profile(frame, event, arg)
    return None


def track_new_threads(enabled: bool) -> None:
    """Called by remat.enable() / disable()."""
    global _previous_profile, _tracking
    if enabled and not _tracking:
        _previous_profile = threading.getprofile()
        threading.setprofile(_on_thread_start)
    elif not enabled and _tracking:
        threading.setprofile(_previous_profile)
    _tracking = enabled
