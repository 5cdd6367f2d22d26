"""remat: train PyTorch models inside a memory budget.

This package loads ``libremat_torch.so`` (the C++ integration) with ``torch.ops.load_library`` and wraps the
``torch.ops.remat`` ops it registers.

    import remat
    with remat.enable(budget="512MiB"):   # or remat.enable(...) ... remat.disable()
        loss = model(x).sum(); loss.backward(); opt.step()
    print(remat.stats())

While enabled, every CPU tensor is allocated from one arena of ``budget`` bytes, a hard limit: an allocation
that does not fit first makes room by evicting storages the engine can recompute (``policy``, one of
``remat.policies()``), and raises ``torch.OutOfMemoryError`` naming the request only when nothing can be evicted.
The dispatch hook records the ops run on the enabling thread (and the backward passes it starts); evicted storages
are rematerialized when an op reads them, bitwise identical.

Finding the library, in order: the ``REMAT_LIBRARY`` environment variable (a path to the .so); a
``libremat_torch.so`` next to this file; ``$REMAT_BUILD_DIR/integration/``; ``<repo>/build/integration/``.
The library only works with the torch minor version it was compiled against; importing it with another one
raises ImportError.

Environment: ``REMAT_POLICY`` (a registered policy name; the default is ``dtr-eq``), ``REMAT_BUDGET`` (bytes, a size such as ``6GiB``, or a fraction of physical memory such as
``0.5``; parsed by the same C++ code as everywhere in remat) enables remat on the importing thread when the
package is imported; ``REMAT_TRACE=path`` then also records the op stream there (closed at exit).
``REMAT_OFFLOAD`` (off, auto, always) and ``REMAT_HOST_BUDGET`` (a size) are what ``enable()`` uses when its
``offload`` and ``host_budget`` are not given.
"""

from __future__ import annotations

import atexit
import os
import re
import resource
from pathlib import Path
from typing import Dict, Optional, Union

import torch

__all__ = ["enable", "disable", "mark_step", "plan_status", "planned_trace", "is_enabled", "stats", "reset_peak", "record",
           "stop_recording", "parse_size", "library_path", "policies", "install_cuda_allocator", "make_resident",
           "track_this_thread", "record_memory_history", "memory_snapshot", "dump_snapshot", "trace"]

_LIBRARY_NAME = "libremat_torch.so"


def _candidate_paths() -> list:
    here = Path(__file__).resolve().parent
    candidates = [here / _LIBRARY_NAME]
    build_dir = os.environ.get("REMAT_BUILD_DIR")
    if build_dir:
        candidates.append(Path(build_dir) / "integration" / _LIBRARY_NAME)
    # integration/python/remat/__init__.py -> the repository root is three levels up.
    candidates.append(here.parents[2] / "build" / "integration" / _LIBRARY_NAME)
    return candidates


def _find_library() -> Path:
    from ._library_search import find_library
    return find_library("REMAT_LIBRARY", _candidate_paths(), ImportError,
                        f"remat: cannot find {_LIBRARY_NAME}. Build it (make build) or set REMAT_LIBRARY to its path.")


def _torch_minor(version: str) -> str:
    match = re.match(r"^(\d+)\.(\d+)", version)
    if not match:
        raise ImportError(f"remat: cannot parse the torch version {version!r}")
    return f"{match.group(1)}.{match.group(2)}"


def _check_torch_version(compiled: str, running: str) -> None:
    """Raises ImportError unless the library's torch (major.minor) is the running one."""
    if _torch_minor(compiled) != _torch_minor(running):
        raise ImportError(
            f"remat: {_LIBRARY_NAME} was built against torch {compiled}, but torch {running} is running. "
            "The library is tied to the torch minor version it was compiled against: rebuild remat with this torch."
        )


def _load() -> Path:
    path = _find_library()
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as error:
        raise ImportError(
            f"remat: cannot load {path}: {error}\n"
            f"If it was built against another torch version (this is torch {torch.__version__}), rebuild remat."
        ) from error
    _check_torch_version(torch.ops.remat.torch_version(), torch.__version__)
    # A slice of an UntypedStorage (what torch.load(mmap=True) and safetensors give each tensor) shows remat the
    # deleter such slices carry: their bytes are their parent's, not borrowed memory (cpu_allocator.h).
    slice_of_a_storage = torch.UntypedStorage(8, device="cpu")[0:4]
    torch.ops.remat.learn_storage_slice(torch.empty(0, dtype=torch.uint8, device="cpu").set_(slice_of_a_storage))
    return path


_library_path = _load()

from . import _engine  # noqa: E402  (needs the library loaded)
from . import _exports  # noqa: E402  (numpy(), data_ptr(), DLPack, torch.save: exports bring evicted bytes back)
from ._exports import make_resident  # noqa: E402
from . import _subclasses  # noqa: E402  (ops on tensor subclasses run where the hook cannot see)
from . import _compile  # noqa: E402  (a call of a torch.compile'd graph is one op to remat)
from . import _higher_order_ops  # noqa: E402  (torch.cond and the like fall through remat's key)
from . import _threads  # noqa: E402  (threads started while remat is on are tracked)
from ._threads import track_this_thread  # noqa: E402
from ._history import dump_snapshot, memory_snapshot, record_memory_history, trace  # noqa: E402  (pictures of a run)
from .cuda import install_cuda_allocator  # noqa: E402  (REMAT_DEVICE=cuda installs it here, before CUDA starts)


def library_path() -> Path:
    """The libremat_torch.so this package loaded."""
    return _library_path


def parse_size(size: Union[int, str]) -> int:
    """Bytes from an int, or from a string in the form remat's C++ side and REMAT_BUDGET accept: bytes with an
    optional unit ("4096", "512MiB", "1.5GB", "2G") or a fraction of the machine's memory with a decimal point
    ("0.5"). Raises ValueError otherwise."""
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise ValueError(f"remat: a budget is an int (bytes) or a string such as '512MiB' or '0.5', got {size!r}")
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"remat: a budget must be > 0 bytes, got {size}")
        return size
    try:
        return int(torch.ops.remat.parse_budget(size))
    except RuntimeError as error:
        raise ValueError(f"remat: {error}") from None


class _Enabled:
    """What enable() returns: remat is already on; as a context manager, leaving the block disables it."""

    def __init__(self, budget: int, policy: str, offload: str = "off", host_budget: Optional[int] = None,
                 host_tier: str = "memory"):
        self.budget = budget
        self.policy = policy
        self.offload = offload
        self.host_budget = host_budget  # None: unlimited
        self.host_tier = host_tier

    def __enter__(self) -> "_Enabled":
        return self

    def __exit__(self, *exc_info) -> bool:
        if is_enabled():
            disable()
        return False

    def __repr__(self) -> str:
        paging = ""
        if self.offload != "off":
            paging = f", offload={self.offload!r}, host_budget={self.host_budget}, host_tier={self.host_tier!r}"
        return f"remat.enable(budget={self.budget}, policy={self.policy!r}{paging})"


def enable(budget: Union[int, str], policy: Optional[str] = None, costs: str = "measured",
           offload: Optional[str] = None, host_budget: Union[int, str, None] = None, host_tier: str = "memory",
           page_constants: bool = True, arena: Optional[str] = None) -> _Enabled:
    """Switches remat on: CPU tensors come from an arena of `budget` bytes (a hard limit), and the ops of this
    thread are tracked; under pressure the engine evicts storages it can recompute, chosen by `policy` (default
    $REMAT_POLICY, else "dtr-eq"; see policies()), and rematerializes them when they are read. An allocation that
    no eviction can make room for raises torch.OutOfMemoryError. Usable as a context manager. Raises ValueError for
    an unknown policy and RuntimeError if remat is already enabled. `costs`: how the engine weighs an op,
    "measured" (its wall time, the default) or "estimated" (from its shapes: the same eviction choices in every
    run, for tests and reproducible experiments).

    Paging to a second tier (issue 7): `offload` is "off", "auto" or "always" (default $REMAT_OFFLOAD, else "off").
    With "always" a victim's bytes are copied to the host tier instead of being dropped while the tier's budget
    lasts; with "auto" only when the copy is cheaper than recomputing it (a memcpy link model, 8 GB/s and 1 us per
    copy). Paged storages come back, byte-identical, when an op reads them. `host_budget` bounds the tier (bytes or
    a size such as "8GiB"; default $REMAT_HOST_BUDGET, else unlimited). `host_tier` is "memory" (host memory
    outside the arena) or "file" (a temporary file, unlinked at once, written with pwrite and read with pread).
    With `page_constants` (default) gradients, optimizer state and other storages remat cannot recompute may be
    paged too when nothing else can leave the arena. ValueError names the option or variable of a bad value.

    `arena` (default $REMAT_ARENA, else "contiguous"): "contiguous" is one block of `budget` bytes, where a request
    needs a hole; "stitch" maps memory in 64 KiB granules (larger above 1 GiB budgets: at most 16,384 granules) into
    address space eight times the budget, and the budget
    counts granules in use, so free memory scattered in small pieces still serves a large request (issue 18; blocks
    then never move, and remat.stats() shows granule, physical_bytes and peak_physical_bytes)."""
    nbytes = parse_size(budget)
    name = _engine.enable(nbytes, policy, costs, offload, host_budget, host_tier, page_constants, arena)
    _higher_order_ops.let_through()
    _exports.set_active(True)
    _compile.set_active(True)
    _threads.track_new_threads(True)
    mode, host_bytes = _engine.resolve_paging(offload, host_budget)
    return _Enabled(nbytes, name, mode, None if host_bytes < 0 else host_bytes, host_tier)


def disable() -> None:
    """Switches remat off and gives torch back its CPU allocator. Tensors allocated while enabled keep working.
    Raises RuntimeError if remat is not enabled."""
    _exports.set_active(False)
    _compile.set_active(False)
    _threads.track_new_threads(False)
    if _engine.is_enabled():
        _engine.disable()
    else:
        torch.ops.remat.disable()


def is_enabled() -> bool:
    return bool(torch.ops.remat.is_enabled())


def stats() -> Dict[str, Union[int, float]]:
    """Numbers of the current arena (or of the last one, after disable()), of the op tracking and of the engine:
    enabled, budget, allocated_bytes, peak_allocated_bytes, reserved_bytes, free_bytes, largest_free_block,
    allocations, frees, pressure_allocations, failed_allocations, search_ns (arena), ops_recorded,
    random_ops_recorded, op_time_ns (hook); evictions, rematerializations, replayed_time_ns (first-run time of the
    replayed ops), replay_wall_ns, search_ns (the engine's victim search, replacing the arena's), fragmentation (mean
    free/budget at allocations that needed eviction), relocations, relocated_bytes, compactions, compacted_bytes
    (memory moved to make holes), retried_ops, retried_composites and retried_replays (kernels, composite ops and
    replays run again after running out of memory; failed_allocations counts those failures too), deferred_outputs
    (outputs of backward-pass ops, kept out of the eviction pool), deferred_releases (victims chosen among them
    because the pool ran dry), late_gathers (replays that ran out of memory and then fit gathering each op's evicted
    inputs before locking its resident ones), pinned_state (optimizer state pinned after a step), adopted_copies and
    constant_copies (the copies autograd saves of values in-place ops overwrite, taken over as those old values,
    evictable, or as constants when a copy does not hold a whole storage), unknown_arena_bytes (arena blocks of no
    storage remat knows, now: between ops, memory made where remat cannot see it, such as by a thread it does not
    record, which it can neither evict nor move until a recorded op reads it) and the bridge's other counts
    (engine_stats() in _engine.py);
    paging: page_outs, page_ins, prefetches, paged_out_bytes, paged_in_bytes, host_used_bytes, host_peak_bytes,
    resident_and_host_peak_bytes (the peak of the engine's resident storages and the host tier together: what paging
    really kept on the device and off it at once), stall_ns (the link model's wait for page-ins, in the engine's clock), page_out_wall_ns and page_in_wall_ns
    (measured copy time), host_tier_file_bytes (the file tier's size); process_peak_rss_bytes (the process's peak
    resident memory so far, getrusage: on a CPU the arena and a memory host tier are both in it, so it shows what
    paging did not save); engine_op_slots, engine_tensor_slots, engine_storage_slots, engine_union_find_nodes,
    engine_op_io_entries (the engine's table sizes, slots live or free for reuse: bounded over a long run).
    With the engine on several CUDA devices (install_cuda_allocator(devices=...)) the engine's numbers are their sums
    (fragmentation their mean weighted by pressure_samples), with devices (how many) and device<d>_evictions,
    device<d>_rematerializations, device<d>_page_outs, device<d>_engine_peak_bytes, device<d>_tracked_ops per device.
    The arena's and engine's keys are absent before the first enable()."""
    out: Dict[str, Union[int, float]] = dict(torch.ops.remat.stats())
    out["process_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    engine = _engine.engine_stats()
    if engine:
        out["arena_search_ns"] = out.get("search_ns", 0)
        out.update(engine)
    return out


def mark_step() -> None:
    """Ends a training iteration. With ``policy="plan"`` (plan mode) remat records each iteration, plans the next
    ones from it on a background thread (the cheapest of several schedules replayed on the recording) and follows
    the plan from the iteration after it is ready, back to the online policy the moment the op stream departs from
    it. Every ``optimizer.step()`` of a ``torch.optim`` optimizer calls it; call it yourself at the end of each
    iteration of a loop without one (or with several optimizers, once per iteration). Nothing to do otherwise."""
    if _engine.is_enabled():
        torch.ops.remat.mark_step()


def plan_status() -> str:
    """Plan mode in words: following which schedule, planning, or online, and why the last plan left force."""
    return str(torch.ops.remat.plan_status())


def planned_trace() -> str:
    """Plan mode: the recorded iteration the last plan was made from, as a trace that ``remat-sim`` replays (write it
    to a file: ``remat-sim FILE --budgets BYTES --policies plan,dtr-eq --mode arena``); empty when none."""
    return str(torch.ops.remat.planned_trace())


def policies() -> list:
    """The eviction policies enable(policy=...) and REMAT_POLICY accept (the engine's registry), sorted."""
    return _engine.policies()


def reset_peak() -> None:
    """Restarts peak_allocated_bytes at the current allocation. Raises RuntimeError if remat is not enabled."""
    torch.ops.remat.reset_peak()


class _Recording:
    """What record() returns: the trace is being written; as a context manager, leaving the block closes it."""

    def __init__(self, path: str):
        self.path = path
        self.ops: Optional[int] = None  # ops written, once closed

    def __enter__(self) -> "_Recording":
        return self

    def __exit__(self, *exc_info) -> bool:
        if self.ops is None:
            try:
                self.ops = stop_recording()
            except RuntimeError:
                pass  # already closed by stop_recording() or disable()
        return False


def record(path: Union[str, os.PathLike], costs: Optional[str] = None) -> _Recording:
    """Writes the ops remat sees from now on (this thread's, and its backward passes') to `path` as a trace in
    the DTR prototype's format, which `remat-sim` replays, with what the engine pinned and where backward passes
    begin and end (remat's extensions of the format), so that remat-sim makes the choices the engine made; memory
    the budget does not count (a model built before enable(), outside the arena) is 0 bytes in it, so remat-sim
    replays it at the run's budget. Remat must be enabled; disable() also closes the trace. Usable as a context
    manager. `costs`: each op's TIME,
    "measured" (its wall time) or "estimated" (the engine's estimate from its shapes); default: what enable() was
    given."""
    if costs is None:
        costs = _engine.enabled_costs
    if costs not in _engine.COSTS:
        raise ValueError(f"remat: unknown costs {costs!r}; expected one of {', '.join(_engine.COSTS)}")
    torch.ops.remat.record_start(os.fspath(path), costs == "estimated")
    return _Recording(os.fspath(path))


def stop_recording() -> int:
    """Closes the trace record() opened; returns the number of ops written."""
    return int(torch.ops.remat.record_stop())


def _close_trace_at_exit() -> None:
    # The recorder lives in the C++ library, which is never unloaded: close an open trace so it is complete, and say
    # so on stderr if it could not be written (REMAT_TRACE on a full disk): a lost trace is never silent.
    try:
        stop_recording()
    except RuntimeError as error:
        message = str(error).splitlines()[0] if str(error) else ""
        if "no trace is being recorded" not in message:
            import sys
            print(message, file=sys.stderr)


atexit.register(_close_trace_at_exit)


def _enable_from_environment() -> Optional[_Enabled]:
    from . import cuda
    if cuda.device_from_environment() == "cuda":
        return None  # REMAT_BUDGET is the CUDA allocator's (installed by remat.cuda at import), not the CPU's
    if os.environ.get("REMAT_POLICY"):
        try:
            _engine.resolve_policy(None)
        except ValueError as error:
            raise ImportError(str(error)) from error
    budget = os.environ.get("REMAT_BUDGET")
    trace = os.environ.get("REMAT_TRACE")
    if not budget:
        if trace:
            raise ImportError("remat: REMAT_TRACE is set without REMAT_BUDGET; recording needs remat enabled")
        return None
    try:
        nbytes = parse_size(budget)
    except ValueError as error:
        raise ImportError(f"remat: REMAT_BUDGET={budget!r}: {error}") from error
    try:
        enabled = enable(nbytes)
    except ValueError as error:  # REMAT_OFFLOAD, REMAT_HOST_BUDGET
        raise ImportError(str(error)) from error
    if trace:
        record(trace)
    return enabled


_enable_from_environment()
