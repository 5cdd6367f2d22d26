"""Exports: the ways Python code reaches a tensor's bytes outside torch's ops, made safe under remat.

Under remat a storage's memory may be evicted (and recomputed later), paged out, or moved within the arena, so a
raw pointer or a zero-copy view taken from a tensor would go stale, and reading an evicted storage's bytes directly
would fail. Every such access below first asks remat to bring the storage back and fix it in place
(``torch.ops.remat.make_resident``: never evicted, moved or paged out again for as long as the storage lives;
EngineBridge::MakeResident):

  writable exports, whose holder may write the bytes behind remat's back, so ops that read the storage afterwards
  are not replayed from it: ``Tensor.numpy()`` (and ``__array__``, ``np.asarray``), ``Tensor.__dlpack__``,
  ``torch.utils.dlpack.to_dlpack`` / ``torch.to_dlpack`` (unless read-only);
  read-only accesses: ``Tensor.data_ptr()``, ``Tensor.untyped_storage()`` (and through it ``storage()``, pickling,
  ``torch.save``, ``copy.deepcopy``, ``share_memory_()``), ``Tensor.tolist()``.

``share_memory_()`` moves the bytes into shared memory outside the arena; remat is told afterwards.
``UntypedStorage.resize_`` frees or replaces the bytes (FSDP2 frees and re-gathers parameters so): remat is told
first (``torch.ops.remat.storage_will_change``) and pins what was computed from them. ``pin_memory()`` is an op
and needs nothing here. C++ code calls remat::integration::MakeResident (engine_session.h) itself.

Installed once at import; each wrapper costs one Python call and a flag test while remat is off, and a writable
export then also remembers its tensor (weakly): its holder may write the bytes once remat is on, so enable() exports
the ones still alive again.
"""

from __future__ import annotations

import functools
import weakref

import torch

_active = False  # remat is enabled (set by remat.enable / disable): a fast path for the wrappers


# Tensors exported writable while remat was off (numpy(), DLPack) and still alive: an array keeps its tensor alive,
# so its holder may still write the bytes when remat is enabled; enable() exports them again (see set_active).
_exported_while_off: "weakref.WeakSet[torch.Tensor]" = weakref.WeakSet()


def set_active(active: bool) -> None:
    """Called by enable() once the engine runs (True) and by disable() (False). On enable, the storages exported
    writable before are exported again, so that the ops that read them under remat are not replayed."""
    global _active
    _active = active
    if active:
        exported = list(_exported_while_off)
        _exported_while_off.clear()
        for tensor in exported:
            make_resident(tensor, True)


def _remember_export(tensor) -> None:
    if isinstance(tensor, torch.Tensor):
        try:
            _exported_while_off.add(tensor)
        except TypeError:
            pass  # a tensor type without weak references: nothing to remember it by


def make_resident(tensor: torch.Tensor, writable: bool = True) -> None:
    """Brings `tensor`'s storage back if remat evicted or paged it and keeps it resident and in place for as long as
    it lives. For code that reads (or, with `writable`, writes) a tensor's bytes outside torch's ops. Nothing to do
    when remat is off or the tensor has no storage remat tracks."""
    if not _active or not isinstance(tensor, torch.Tensor):
        return
    if _dispatch_mode_active() or _traced(torch._C._dispatch_keys(tensor)):
        return  # a fake, functional or subclass tensor, or a tracing mode: no real bytes of remat's here
    if tensor.layout == torch.strided and tensor.device.type != "meta":
        torch.ops.remat.make_resident(tensor, writable)


_TRACING_KEYS = [torch._C.DispatchKey.Python, torch._C.DispatchKey.Functionalize]


def storage_identity(tensor: torch.Tensor) -> torch.UntypedStorage:
    """`tensor`'s storage object without exporting it: for remat's own bookkeeping (remat.bound), which reads its
    address as an identity and its size, never its bytes. (An export would fix the storage for as long as it lives,
    and from inside an op it waits for the op's end.)"""
    return getattr(torch.Tensor.untyped_storage, "__remat_original__", torch.Tensor.untyped_storage)(tensor)


def _traced(keys) -> bool:
    return any(keys.has(key) for key in _TRACING_KEYS)


def _dispatch_mode_active() -> bool:
    return torch._C._len_torch_dispatch_stack() > 0


def _wrap_method(owner, name: str, writable: bool):
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        if _active:
            make_resident(self, writable)
        elif writable:
            _remember_export(self)
        return original(self, *args, **kwargs)

    wrapper.__remat_original__ = original
    setattr(owner, name, wrapper)


def _wrap_function(module, name: str, writable_of):
    original = getattr(module, name, None)
    if original is None:
        return None

    @functools.wraps(original)
    def wrapper(tensor, *args, **kwargs):
        if _active:
            make_resident(tensor, writable_of(kwargs))
        elif writable_of(kwargs):
            _remember_export(tensor)
        return original(tensor, *args, **kwargs)

    wrapper.__remat_original__ = original
    setattr(module, name, wrapper)
    return wrapper


def _share_memory_then_tell_remat(owner):
    """Tensor.share_memory_ moves the storage's bytes to shared memory: remat must forget their arena address."""
    original = owner.share_memory_

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        result = original(self, *args, **kwargs)  # untyped_storage() inside made it resident and fixed
        if _active:
            make_resident(self, False)  # records where the bytes live now
        return result

    wrapper.__remat_original__ = original
    owner.share_memory_ = wrapper


def _resize_then_tell_remat(owner):
    """UntypedStorage.resize_ frees or replaces the bytes outside torch's ops (FSDP2 frees an unsharded parameter
    after use and gathers it again): remat pins what was computed from them first, so no replay reads them after."""
    original = owner.resize_

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        if _active and self.device.type != "meta" and not _dispatch_mode_active():
            torch.ops.remat.storage_will_change(self)
        return original(self, *args, **kwargs)

    wrapper.__remat_original__ = original
    owner.resize_ = wrapper


def _install() -> None:
    if getattr(torch.Tensor.numpy, "__remat_original__", None) is not None:
        return  # installed already (the package was reloaded)
    tensor = torch.Tensor
    _wrap_method(tensor, "numpy", writable=True)          # __array__ calls self.numpy()
    _wrap_method(tensor, "data_ptr", writable=False)
    _wrap_method(tensor, "untyped_storage", writable=False)  # storage(), pickling, torch.save, deepcopy
    _wrap_method(tensor, "tolist", writable=False)
    _share_memory_then_tell_remat(tensor)
    _resize_then_tell_remat(torch.UntypedStorage)
    # DLPack: Tensor.__dlpack__ calls torch._C._to_dlpack or _to_dlpack_versioned (read_only=...).
    read_only = lambda kwargs: not kwargs.get("read_only", False)  # noqa: E731
    for name in ("_to_dlpack", "_to_dlpack_versioned"):
        wrapped = _wrap_function(torch._C, name, read_only)
        # torch.to_dlpack and torch.utils.dlpack.to_dlpack are the same function object, bound at import.
        for module in (torch, torch.utils.dlpack):
            if wrapped is not None and getattr(module, "to_dlpack", None) is wrapped.__remat_original__:
                module.to_dlpack = wrapped


_install()
