"""torch.compile under remat: each call of a graph inductor compiled is one op to remat.

Inductor's generated kernels read and write tensors through raw pointers, and the ATen kernels a compiled graph
calls see buffers those kernels wrote: remat can neither see inside a call nor replay one part of it. So a call of
a compiled graph (``CompiledFxGraph.__call__``: a forward or a backward graph) is recorded as one op,
``remat::compiled_graph`` (integration/opaque_call.h):

  - before it runs, every tensor it reads (its inputs and the graph's constants) is brought back (paged in,
    rematerialized) and locked for the length of the call; the inputs inductor says it mutates (batch norm's running
    statistics, for instance) are treated as writes to constants;
  - inside it nothing is recorded, allocations come from remat's arena and make room by evicting or paging what the
    call does not use, and the call frees its inputs early as it would without remat;
  - its outputs (a forward's result and the tensors AOTAutograd saves for backward, a backward's gradients) count
    against the budget. With paging on (``offload``) they are paged out between the forward and the backward and
    brought back when the next op or call reads them. Drop-only, a forward graph that draws no random numbers and
    writes no input, or only small ones (batch norm's running statistics: copied before the call, and a replay
    starts from fresh copies of those copies), is replayable: its outputs are dropped and the graph is called
    again (its kernel below, ``_replay``) when one is needed; other graphs' outputs are kept. The eager ops around compiled graphs are
    recorded and evicted as usual.

Nothing inside one call can be evicted, so a graph's own peak is a floor: compile per block (``block.compile()``
for each block, as PyTorch's regional compilation does) for remat to have room to work.

Tracing (Dynamo, FakeTensor, AOTAutograd, functionalization) passes through remat untouched (dispatch_hook.h).

torch._inductor is imported lazily by torch itself (about a second), so the wrapper is installed when its module
``torch._inductor.output_code`` is imported, or at once if it already was.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys

import torch

_MODULE = "torch._inductor.output_code"
_active = False  # remat is enabled (set by remat.enable / disable)


def set_active(active: bool) -> None:
    global _active
    _active = active


def _tensors(values):
    return [v for v in values if isinstance(v, torch.Tensor)]


def _outputs(result):
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (list, tuple)):
        return _tensors(result)
    return []


# Replays. A replayable call (a forward graph on the CPU that writes no input or only small ones, such as batch
# norm's running statistics; integration/opaque_call.h) is recorded with a key into _replays: the graph and how to
# rebuild its argument list from the recorded tensors (read tensors by position in `read`, written ones from fresh
# copies of their snapshot, other inputs as they were). One entry per graph and argument layout, so a training loop
# adds none after its first step. Entries hold their graph: a record may replay it for as long as remat keeps it.
_replays: list = []
_replay_keys: dict = {}
_READ = object()     # layout slots
_WRITTEN = object()
# Written inputs are copied before the call (the snapshot a replay starts from) when they add up to no more than
# this: batch norm's running statistics are a few KiB per layer; a compiled optimizer step's (every parameter and
# its state) are not copied, and such a graph is not replayed.
SNAPSHOT_MAX_BYTES = 256 << 10


def _replay_key(graph, inputs, mutated) -> int:
    layout = tuple(_WRITTEN if i in mutated else _READ if isinstance(x, torch.Tensor) else x
                   for i, x in enumerate(inputs))
    try:
        key = (id(graph), layout)
        index = _replay_keys.get(key)
    except TypeError:  # an unhashable input: not replayable
        return -1
    if index is None:
        index = len(_replays)
        _replays.append((graph, layout))
        _replay_keys[key] = index
    return index


def _replay(written, read, graph_index, snapshot):
    """remat::compiled_graph's kernel: runs the recorded graph again on the recorded inputs, written ones replaced by
    fresh copies of their snapshot (the hook is off here: the engine replays below it), and returns its tensor
    outputs in the order the first run gave them. `written` (the live tensors) is not touched."""
    graph, layout = _replays[graph_index]
    reads, snapshots = iter(read), iter(snapshot)
    inputs = [next(reads) if slot is _READ else next(snapshots).clone() if slot is _WRITTEN else slot
              for slot in layout]
    return _outputs(_original_call(graph, inputs))


def _wrap_call(call):
    @functools.wraps(call)
    def call_under_remat(self, inputs):
        if not _active:
            return call(self, inputs)
        mutated = frozenset(getattr(self, "mutated_input_idxs", ()) or ())
        written = [x for i, x in enumerate(inputs) if i in mutated and isinstance(x, torch.Tensor)]
        read = [x for i, x in enumerate(inputs) if i not in mutated and isinstance(x, torch.Tensor)]
        constants = getattr(self, "constants", None) or {}
        read += _tensors(constants.values())
        graph, snapshot = -1, []
        if sum(t.nbytes for t in written) <= SNAPSHOT_MAX_BYTES:
            graph = _replay_key(self, inputs, mutated)
            with torch.no_grad():
                snapshot = [t.detach().clone() for t in written]
        torch.ops.remat.opaque_call_begin(written, read, graph, snapshot)
        # The call may free its inputs early (inductor clears `inputs`): hold no reference.
        del written, read, snapshot
        try:
            result = call(self, inputs)
        except BaseException:
            torch.ops.remat.opaque_call_failed()
            raise
        torch.ops.remat.opaque_call_end(_outputs(result))
        return result

    call_under_remat.__remat_original__ = call
    return call_under_remat


_original_call = None
_library = None


def _patch(module) -> None:
    global _original_call, _library
    graph = module.CompiledFxGraph
    if getattr(graph.__call__, "__remat_original__", None) is None:
        _original_call = graph.__call__
        graph.__call__ = _wrap_call(graph.__call__)
        _library = torch.library.Library("remat", "IMPL")
        for device in ("CPU", "CUDA"):
            _library.impl("compiled_graph", _replay, device)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches torch._inductor.output_code as soon as it is executed, wherever the import comes from."""

    def find_spec(self, name, path=None, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)  # one module, once; and let the other finders locate it
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_then_patch
        return spec


def _install() -> None:
    if _MODULE in sys.modules:
        _patch(sys.modules[_MODULE])
    elif not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


_install()
