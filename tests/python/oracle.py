"""The byte oracle: what "identical" means in remat's tests (DESIGN.md, "Soundness": the oracle).

Two runs of a training program are identical when everything a program can observe has the same bytes: losses,
gradients, parameters, buffers (BatchNorm running statistics, num_batches_tracked), optimizer state, and the model's
outputs in eval mode after training. Tensors are compared as bytes (their dtype, shape and every byte of their
values, as memcmp would: -0.0 differs from 0.0, NaN payloads are compared as bytes), never as values.

    before = oracle.capture(model, optimizer, losses, eval_inputs=x)    # after a run without remat
    after = oracle.capture(model2, optimizer2, losses2, eval_inputs=x)  # after the same run under remat
    oracle.assert_identical(before, after, "gpt/sgd at 0.5")

capture() copies what it compares, so take it once remat is disabled (the copies then do not count in any budget)
or with a budget that can hold them. It switches the model to eval mode for the eval outputs and back afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import torch


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's values as a flat uint8 tensor (a contiguous copy, so views and strides do not matter)."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)  # bool's bytes are 0 or 1 already
    return flat.view(torch.uint8)


def same_bytes(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
    """memcmp equality of two tensors, with dtype and shape; None equals only None."""
    if a is None or b is None:
        return a is None and b is None
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    return torch.equal(as_bytes(a), as_bytes(b))


@dataclass
class Snapshot:
    """What a training run leaves that a program can observe, copied."""
    losses: List[torch.Tensor] = field(default_factory=list)
    gradients: Dict[str, Optional[torch.Tensor]] = field(default_factory=dict)
    parameters: Dict[str, torch.Tensor] = field(default_factory=dict)
    buffers: Dict[str, torch.Tensor] = field(default_factory=dict)
    optimizer_state: Dict[str, Any] = field(default_factory=dict)  # "param_index/key" -> tensor or plain value
    eval_outputs: List[torch.Tensor] = field(default_factory=list)


def _copy(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach().clone()


def _copy_value(value: Any) -> Any:
    """A copy of an optimizer-state value: a tensor, a list, tuple or dict of them (LBFGS keeps lists), or a plain
    value."""
    if torch.is_tensor(value):
        return _copy(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_value(v) for v in value)
    if isinstance(value, dict):
        return {k: _copy_value(v) for k, v in value.items()}
    return value


def same_value(a: Any, b: Any) -> bool:
    """same_bytes for tensors, element by element for lists, tuples and dicts, == for plain values."""
    if torch.is_tensor(a) or torch.is_tensor(b) or a is None or b is None:
        return same_bytes(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return a == b


def _tensors_in(value: Any) -> List[torch.Tensor]:
    """The tensors of a model output: a tensor, a tuple/list/dict of them, or an object with tensor attributes (a
    Hugging Face ModelOutput is a dict; torchvision's InceptionOutputs a named tuple)."""
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors_in(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    return []


def capture(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
            losses: Sequence[torch.Tensor] = (), eval_inputs: Any = None) -> Snapshot:
    """Copies losses, gradients, parameters, buffers and optimizer state, then (if `eval_inputs` is given) runs the
    model once in eval mode without gradients and copies its outputs. `eval_inputs` is a tensor, a tuple of
    positional arguments, or a dict of keyword arguments."""
    snap = Snapshot()
    snap.losses = [_copy(torch.as_tensor(l)) for l in losses]
    for name, p in model.named_parameters():
        snap.parameters[name] = _copy(p)
        snap.gradients[name] = _copy(p.grad)
    for name, b in model.named_buffers():
        snap.buffers[name] = _copy(b)
    if optimizer is not None:
        for index, state in optimizer.state_dict()["state"].items():
            for key, value in state.items():
                snap.optimizer_state[f"{index}/{key}"] = _copy_value(value)
    if eval_inputs is not None:
        was_training = model.training
        model.eval()
        with torch.no_grad():
            if isinstance(eval_inputs, dict):
                out = model(**eval_inputs)
            elif isinstance(eval_inputs, tuple):
                out = model(*eval_inputs)
            else:
                out = model(eval_inputs)
        snap.eval_outputs = [_copy(t) for t in _tensors_in(out)]
        model.train(was_training)
    return snap


def differences(reference: Snapshot, got: Snapshot) -> List[str]:
    """One line per observable that differs (empty: identical)."""
    diffs: List[str] = []

    def compare_lists(kind, ref, res):
        if len(ref) != len(res):
            diffs.append(f"{kind}: {len(ref)} in the reference, {len(res)} here")
            return
        for i, (r, g) in enumerate(zip(ref, res)):
            if not same_bytes(r, g):
                diffs.append(f"{kind}[{i}] differs")

    def compare_dicts(kind, ref, res):
        if ref.keys() != res.keys():
            diffs.append(f"{kind}: keys differ ({sorted(set(ref) ^ set(res))[:5]})")
            return
        for key in ref:
            r, g = ref[key], res[key]
            if not same_value(r, g):
                diffs.append(f"{kind} {key} differs")

    compare_lists("loss", reference.losses, got.losses)
    compare_dicts("gradient", reference.gradients, got.gradients)
    compare_dicts("parameter", reference.parameters, got.parameters)
    compare_dicts("buffer", reference.buffers, got.buffers)
    compare_dicts("optimizer state", reference.optimizer_state, got.optimizer_state)
    compare_lists("eval output", reference.eval_outputs, got.eval_outputs)
    return diffs


def assert_identical(reference: Snapshot, got: Snapshot, label: str) -> None:
    diffs = differences(reference, got)
    assert not diffs, f"{label}: {len(diffs)} observables differ from the run without remat: " + "; ".join(diffs[:8])
