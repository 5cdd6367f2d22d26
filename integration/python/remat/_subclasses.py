"""Python tensor subclasses that hold real tensors (DTensor, quantized or scaled weights, logging wrappers): their
inner tensors, and the callback the dispatch hook calls before an op on one runs (integration/subclass_arguments.h).

Such an op passes through remat's hook, and the subclass's ``__torch_dispatch__`` runs the work on its inner tensors
where remat cannot see it. So before it runs, the hook calls ``_callback`` once with the op's subclass arguments: the
inner tensors of those it reads are named to the hook (``torch.ops.remat.hold_inner_reads``), which brings them back
and holds them resident and in place while it runs, and those of the arguments it writes (an optimizer's ``add_`` on a
DTensor parameter) are announced as about to change (``torch.ops.remat.inner_tensors_will_change``): what recorded ops
computed from their bytes is pinned first, as for any write to a parameter, so no replay reads the new bytes. What the
subclass computes inside is made where remat cannot see it either: it is memory remat cannot evict.

The inner tensors are those ``__tensor_flatten__`` names (a traceable wrapper subclass), else the tensors among the
object's attributes (directly, or in a list, tuple or dict), recursively through nested subclasses."""
from __future__ import annotations

import ctypes
from typing import Iterator, List

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _attribute_tensors(t: torch.Tensor) -> List[torch.Tensor]:
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()  # may name opaque objects too (DTensor's device_mesh)
        return [inner for inner in (getattr(t, name) for name in names) if isinstance(inner, torch.Tensor)]
    found = []
    for value in vars(t).values():
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        found.extend(item for item in items if isinstance(item, torch.Tensor))
    return found


def inner_tensors(t: torch.Tensor, depth: int = 8) -> Iterator[torch.Tensor]:
    """The tensors of plain type a subclass tensor holds, through nested subclasses. Which of them hold real memory
    (not meta, functional or functorch wrappers) remat decides (subclass_arguments.h: RealInnerTensor)."""
    for inner in _attribute_tensors(t):
        if type(inner) in _PLAIN_TYPES:
            yield inner
        elif depth > 1 and inner is not t:
            yield from inner_tensors(inner, depth - 1)


def _before_op(tensors: List[torch.Tensor], written: List[bool]) -> None:
    reads, writes = [], []
    for tensor, writes_it in zip(tensors, written):
        (writes if writes_it else reads).extend(inner_tensors(tensor))
    if writes:
        torch.ops.remat.inner_tensors_will_change(writes)
    if reads:
        torch.ops.remat.hold_inner_reads(reads)  # held resident and in place while the op runs


_CALLBACK_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int),
                                  ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t)


def _callback(objects, written, count, message, size) -> int:
    tensors = []
    try:
        tensors = [ctypes.cast(objects[i], ctypes.py_object).value for i in range(count)]
        _before_op(tensors, [bool(written[i]) for i in range(count)])
        return 0
    except BaseException as error:  # noqa: B036 (nothing may leave a ctypes callback: the hook raises it instead)
        names = sorted({type(t).__name__ for t in tensors})
        text = (f"remat: before an op on a tensor subclass ({', '.join(names)}) ran on its inner tensors: "
                f"{type(error).__name__}: {error}").encode("utf-8", "replace")[:size]
        ctypes.memmove(message, text, len(text))
        return 2 if isinstance(error, torch.OutOfMemoryError) else 1


_registered = _CALLBACK_TYPE(_callback)  # kept alive for as long as the library may call it


def _install() -> None:
    torch.ops.remat.set_subclass_callback(ctypes.cast(_registered, ctypes.c_void_p).value)


_install()
