"""torch.compile under remat: each call of a graph inductor compiled is one op to remat.

Inductor's generated kernels read and write tensors through raw pointers, and the ATen kernels a compiled graph
calls see buffers those kernels wrote: remat can neither see inside a call nor replay one part of it. So a call of
a compiled graph (``CompiledFxGraph.__call__``: a forward or a backward graph) is recorded as one op,
``remat::compiled_graph`` (integration/dispatch_hook.h, "Opaque calls"):

  - before it runs, every tensor it reads (its inputs and the graph's constants) is brought back (paged in,
    rematerialized) and locked for the length of the call; the inputs inductor says it mutates (batch norm's running
    statistics, for instance) are treated as writes to constants;
  - inside it nothing is recorded, allocations come from remat's arena and make room by evicting or paging what the
    call does not use, and the call frees its inputs early as it would without remat;
  - its outputs (a forward's result and the tensors AOTAutograd saves for backward, a backward's gradients) count
    against the budget. With paging on (``offload``) they are paged out between the forward and the backward and
    brought back when the next op or call reads them. Drop-only, a forward graph that writes no input and draws no
    random numbers is replayable: its outputs are dropped and the graph is called again (its kernel below,
    ``_replay``) when one is needed; other graphs' outputs are kept. The eager ops around compiled graphs are
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


# Replays. A replayable call (a forward graph that writes no input and draws no random numbers) is recorded with a
# key into _replays: the graph and how to rebuild its argument list from the recorded tensors (tensor slots by index
# into `read`, other inputs as they were). One entry per graph and argument layout, so a training loop adds none
# after its first step. Entries hold their graph: a record may replay it for as long as remat keeps the record.
_replays: list = []
_replay_keys: dict = {}
_TENSOR = object()  # a tensor slot in a layout


def _replay_key(graph, inputs, written_any: bool) -> int:
    if written_any:
        return -1  # never replayed: a replay would write the input again
    layout = tuple(_TENSOR if isinstance(x, torch.Tensor) else x for x in inputs)
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


def _replay(written, read, graph_index):
    """remat::compiled_graph's kernel: runs the recorded graph again on the recorded inputs (the hook is off here:
    the engine replays below it) and returns its tensor outputs, in the order the first run gave them."""
    graph, layout = _replays[graph_index]
    tensors = iter(read)
    inputs = [next(tensors) if slot is _TENSOR else slot for slot in layout]
    return _outputs(_original_call(graph, inputs))


def _wrap_call(call):
    @functools.wraps(call)
    def call_under_remat(self, inputs):
        if not _active:
            return call(self, inputs)
        mutated = getattr(self, "mutated_input_idxs", ()) or ()
        written = [inputs[i] for i in mutated if isinstance(inputs[i], torch.Tensor)]
        read = [x for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and i not in mutated]
        constants = getattr(self, "constants", None) or {}
        read += _tensors(constants.values())
        graph = _replay_key(self, inputs, bool(mutated))
        torch.ops.remat.opaque_call_begin(written, read, graph)
        del written, read  # the call may free its inputs early (inductor clears `inputs`): hold no reference
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
