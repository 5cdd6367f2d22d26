"""Pictures of a run: what remat did to memory, in the two formats PyTorch users already open.

- ``remat.record_memory_history()`` then ``remat.dump_snapshot(path)``: the pickle ``torch.cuda.memory._snapshot()``
  writes (segments, blocks with their state, the event history), for the CPU arena, or for the CUDA arenas when
  remat's CUDA allocator is installed (which answers ``torch.cuda.memory._snapshot()`` with the same history). Open it at
  https://pytorch.org/memory_viz or with ``torch.cuda._memory_viz`` (``trace_plot``, ``segment_plot``). Besides
  ``alloc`` / ``free_requested`` / ``free_completed`` / ``oom``, the history holds remat's own events as actions
  ``remat_evict`` (the program still refers to the storage), ``remat_release`` (it let go of it: freed, still
  recomputable), ``remat_rematerialize``, ``remat_page_out``, ``remat_page_in``; a block moved by compaction or
  relocation is a free at the old address and an alloc at the new one. Frames are remat's context, innermost first:
  the op that was running, the replays nested under it, and what remat was doing (``remat: evict``, ``remat: page
  in``, ...). Python frames are not recorded.
- ``with remat.trace("run.json"):``: Chrome trace events (open in https://ui.perfetto.dev or chrome://tracing):
  every op remat records and every replay, nested under the op that needed it, as spans on their thread; evictions,
  releases, rematerializations and page transfers as instant events; counter tracks of the arena's allocated bytes,
  the bytes paged out, and the bytes evicted, released and rematerialized so far. ``python -m remat.plot run.json
  out.png`` draws it.

Recording is off by default; when on, each event costs a mutex and a few stores (README, "Results").
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
from typing import Dict, Iterator, List

import torch

from .plot import CUMULATIVE as CUMULATIVE_COUNTER, MEMORY as MEMORY_COUNTER  # the counter tracks remat.plot reads

# integration/memory_events.h, MemoryEventKind
KINDS = ("alloc", "free", "move", "op_begin", "op_end", "evict", "release", "rematerialize", "page_out", "page_in",
         "drop_paged", "oom")
_FIELDS = 9  # time_ns, kind, address, size, extra, context, label, thread, device (memory_history_ops.cc)
CPU = -1  # the device number of the CPU arena's events
DEFAULT_MAX_ENTRIES = 1_000_000


def record_memory_history(enabled: bool = True, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
    """Starts (clearing what was recorded) or stops recording remat's memory events; like
    ``torch.cuda.memory._record_memory_history``, the oldest events go once ``max_entries`` are kept."""
    if enabled:
        if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries <= 0:
            raise ValueError(f"remat: max_entries must be a positive int, got {max_entries!r}")
        torch.ops.remat.memory_history_start(max_entries)
    else:
        torch.ops.remat.memory_history_stop()


def memory_events() -> Dict[str, object]:
    """What was recorded, decoded: {"events": [dict per event, oldest first], "dropped": int, "enabled": bool}.
    Each event has time_ns, kind (one of KINDS), address, size, extra, thread, device (CPU, or a CUDA device
    index) and context (labels, outermost first); op_begin / op_end also have "op" and "replay"."""
    flat, labels, contexts_flat, dropped, enabled = torch.ops.remat.memory_history()
    contexts: List[List[str]] = []
    i = 0
    while i < len(contexts_flat):
        n = contexts_flat[i]
        contexts.append([labels[k] for k in contexts_flat[i + 1:i + 1 + n]])
        i += 1 + n
    events = []
    for j in range(0, len(flat), _FIELDS):
        time_ns, kind, address, size, extra, context, label, thread, device = flat[j:j + _FIELDS]
        event = {"time_ns": time_ns, "kind": KINDS[kind], "address": address, "size": size, "extra": extra,
                 "thread": thread, "device": device, "context": contexts[context]}
        if KINDS[kind] in ("op_begin", "op_end"):
            event["op"] = labels[label]
            event["replay"] = bool(extra)
        events.append(event)
    return {"events": events, "dropped": dropped, "enabled": enabled}


def _frames(context: List[str]) -> List[Dict[str, object]]:
    # memory_viz frames are innermost first
    return [{"filename": "remat", "line": 0, "name": label} for label in reversed(context)]


def memory_snapshot() -> Dict[str, object]:
    """The CPU arena now and its recorded history, as ``torch.cuda.memory._snapshot()`` lays them out. (With remat's
    CUDA allocator, ``torch.cuda.memory._snapshot()`` itself returns the CUDA arenas' history.)"""
    recorded = memory_events()
    trace = []
    alloc_frames: Dict[int, List[Dict[str, object]]] = {}  # address -> frames of the latest alloc there
    for e in recorded["events"]:
        if e["device"] != CPU:
            continue
        kind, frames = e["kind"], _frames(e["context"])
        common = {"stream": 0, "time_us": e["time_ns"] // 1000, "frames": frames}
        if kind == "alloc":
            trace.append({"action": "alloc", "addr": e["address"], "size": e["size"], **common})
            alloc_frames[e["address"]] = frames
        elif kind == "free":
            trace.append({"action": "free_requested", "addr": e["address"], "size": e["size"], **common})
            trace.append({"action": "free_completed", "addr": e["address"], "size": e["size"], **common})
            alloc_frames.pop(e["address"], None)
        elif kind == "move":
            trace.append({"action": "free_requested", "addr": e["address"], "size": e["size"], **common})
            trace.append({"action": "free_completed", "addr": e["address"], "size": e["size"], **common})
            trace.append({"action": "alloc", "addr": e["extra"], "size": e["size"], **common})
            alloc_frames[e["extra"]] = frames
            alloc_frames.pop(e["address"], None)
        elif kind in ("evict", "release", "rematerialize", "page_out", "page_in"):
            trace.append({"action": f"remat_{kind}", "addr": e["address"], "size": e["size"], "storage": e["extra"],
                          **common})
        elif kind == "oom":
            trace.append({"action": "oom", "addr": 0, "size": e["size"], "device_free": e["extra"], **common})
    blocks_flat = torch.ops.remat.memory_blocks()
    segments = []
    if blocks_flat:
        blocks = []
        for j in range(0, len(blocks_flat), 3):
            address, size, allocated = blocks_flat[j:j + 3]
            blocks.append({"address": address, "size": size, "requested_size": size,
                           "state": "active_allocated" if allocated else "inactive",
                           "frames": alloc_frames.get(address, []) if allocated else []})
        allocated_size = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        segments.append({"device": 0, "address": blocks[0]["address"], "total_size": sum(b["size"] for b in blocks),
                         "allocated_size": allocated_size, "active_size": allocated_size,
                         "requested_size": allocated_size, "stream": 0, "segment_type": "large",
                         "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks})
    return {"segments": segments, "device_traces": [trace],
            "remat": {"device": "cpu", "dropped_events": recorded["dropped"]}}


def dump_snapshot(path: "str | os.PathLike[str]", device: "str | None" = None) -> None:
    """Writes a snapshot as a pickle, the file torch.cuda.memory._dump_snapshot writes: of the CPU arena
    (memory_snapshot(), device="cpu"), or of the CUDA arenas (torch.cuda.memory._snapshot(), which remat's CUDA
    allocator answers with the same history, device="cuda"). By default the CUDA arenas when remat's CUDA allocator
    is installed and CUDA has started, else the CPU arena."""
    from .cuda import installed_cuda_allocator
    cuda_live = installed_cuda_allocator() is not None and torch.cuda.is_initialized()
    if device is None:
        device = "cuda" if cuda_live else "cpu"
    if device == "cuda":
        if not cuda_live:
            raise RuntimeError("remat: no CUDA snapshot: remat's CUDA allocator is not installed, or CUDA has not "
                               "started (remat.install_cuda_allocator(), then allocate on the GPU)")
        snapshot = torch.cuda.memory._snapshot()
    elif device == "cpu":
        snapshot = memory_snapshot()
    else:
        raise ValueError(f"remat: dump_snapshot's device must be 'cpu' or 'cuda', got {device!r}")
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)


def chrome_trace(recorded: Dict[str, object], allocated_at_start: int = 0) -> Dict[str, object]:
    """Chrome trace events for recorded history (memory_events()): spans for ops and replays, instants for remat's
    memory events, counters for memory (one memory track per device: MEMORY_COUNTER for the CPU arena, "cuda:N "
    + MEMORY_COUNTER for a CUDA device). `allocated_at_start`: the CPU arena's allocated bytes when recording
    began."""
    pid = os.getpid()
    out: List[Dict[str, object]] = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": "remat"}}]
    threads = set()
    open_spans: Dict[int, List[Dict[str, object]]] = {}
    allocated: Dict[int, int] = {CPU: allocated_at_start}  # by device
    paged: Dict[int, int] = {CPU: 0}
    evicted, released, rematerialized = 0, 0, 0

    def counters(ts: float, device: int) -> None:
        name = MEMORY_COUNTER if device == CPU else f"cuda:{device} {MEMORY_COUNTER}"
        out.append({"ph": "C", "pid": pid, "tid": 0, "ts": ts, "name": name,
                    "args": {"allocated": allocated.get(device, 0), "paged out": paged.get(device, 0)}})
        out.append({"ph": "C", "pid": pid, "tid": 0, "ts": ts, "name": CUMULATIVE_COUNTER,
                    "args": {"evicted": evicted, "released, recomputable": released,
                             "rematerialized": rematerialized}})

    counters(0.0, CPU)
    for e in recorded["events"]:
        ts, kind, tid = e["time_ns"] / 1000.0, e["kind"], e["thread"]
        threads.add(tid)
        if kind == "op_begin":
            open_spans.setdefault(tid, []).append(e)
        elif kind == "op_end":
            stack = open_spans.get(tid, [])
            if stack and stack[-1]["op"] == e["op"]:  # else its begin left the ring
                begin = stack.pop()
                out.append({"ph": "X", "pid": pid, "tid": tid, "ts": begin["time_ns"] / 1000.0,
                            "dur": (e["time_ns"] - begin["time_ns"]) / 1000.0, "name": e["op"],
                            "cat": "replay" if e["replay"] else "op", "args": {"depth": len(stack)}})
        elif kind in ("alloc", "free", "drop_paged", "evict", "release", "rematerialize", "page_out", "page_in", "oom"):
            device = e["device"]
            if kind == "alloc":
                allocated[device] = allocated.get(device, 0) + e["size"]
            elif kind == "free":
                allocated[device] = allocated.get(device, 0) - e["size"]
            elif kind == "page_out":
                paged[device] = paged.get(device, 0) + e["size"]
            elif kind in ("page_in", "drop_paged"):
                paged[device] = paged.get(device, 0) - e["size"]
            elif kind == "evict":
                evicted += e["size"]
            elif kind == "release":
                released += e["size"]
            elif kind == "rematerialize":
                rematerialized += e["size"]
            if kind not in ("alloc", "free", "drop_paged", "release"):
                out.append({"ph": "i", "s": "t", "pid": pid, "tid": tid, "ts": ts, "name": kind, "cat": "remat",
                            "args": {"storage": e["extra"], "bytes": e["size"], "address": hex(e["address"]),
                                     "device": "cpu" if device == CPU else f"cuda:{device}",
                                     "context": " > ".join(e["context"])}})
            counters(ts, device)
    for tid in sorted(threads):
        out.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": f"remat thread {tid}"}})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"producer": "remat", "dropped_events": recorded["dropped"]}}


@contextlib.contextmanager
def trace(path: "str | os.PathLike[str]", max_entries: int = DEFAULT_MAX_ENTRIES) -> Iterator[None]:
    """Records remat's memory events while the block runs and writes them to `path` as Chrome trace JSON. Starts
    a fresh history (what record_memory_history kept is cleared) and stops it at the end."""
    stats = torch.ops.remat.stats()
    record_memory_history(True, max_entries)
    allocated_at_start = int(stats.get("allocated_bytes", 0))
    try:
        yield
    finally:
        recorded = memory_events()
        record_memory_history(False)
        with open(path, "w") as f:
            json.dump(chrome_trace(recorded, allocated_at_start), f)

