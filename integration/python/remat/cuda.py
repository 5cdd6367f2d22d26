"""remat as PyTorch's CUDA allocator (C++: integration/cuda/, allocator/cuda/).

NOT YET RUN ON A GPU BY US: our machines have no GPU. The allocator's logic is tested in CI against a test double
of the CUDA runtime (tests/cuda/); on a machine without a GPU, installing it fails with a RuntimeError saying so.

    import torch, remat
    remat.install_cuda_allocator(budget="6GiB")   # before anything initializes CUDA
    model = model.cuda()                          # every CUDA allocation now comes from remat's arena

Every CUDA allocation then comes from one arena per device, the size of the budget, a hard limit:
``torch.cuda.memory_reserved()`` equals the budget and an allocation that does not fit raises
``torch.OutOfMemoryError`` naming the request, the budget, what is allocated and the largest free block.
``memory_allocated``, ``max_memory_allocated``, ``reset_peak_memory_stats``, ``memory_stats``, ``empty_cache``,
``Tensor.record_stream`` and cuDNN's ``cacheInfo`` work as usual.

With the engine on (the default), the ops of the thread that installed it, and the backward passes it starts, are
tracked, and an allocation that does not fit evicts storages the engine can recompute (``policy``), rematerialized
bitwise when read, exactly as on the CPU; ``remat.stats()`` reports its evictions and ``remat.disable()`` switches
it off (every tensor still held is brought back, under the budget). ``offload`` ("auto", "always") pages victims to
host memory (``host_budget``) instead of dropping them: pinned host pages copied on a copy stream, ordered by
events (the consuming kernel's stream waits for its page, not the host), with prefetch ahead of use. The engine
runs on the current device, or on the ``devices`` given (one engine per device, each under its own budget; ops go
to the engine of their tensors' device). Random ops (dropout, attention dropout) are replayed with the CUDA
generator's Philox seed and offset they first drew, so their outputs are evicted like any others. Its logic runs in CI on the CUDA runtime's test double
(tests/cuda/cuda_engine_test.cc, cuda_engine_devices_test.cc), never yet on a GPU.

The library, ``libremat_cuda.so``, is built when nvcc is found (``make build``). Finding it, in order: the
``REMAT_CUDA_LIBRARY`` environment variable (a path to the .so); ``libremat_cuda.so`` next to this file;
``cuda/`` next to the ``libremat_torch.so`` that ``import remat`` loaded; ``$REMAT_BUILD_DIR/integration/cuda/``;
``<repo>/build/integration/cuda/``. Like libremat_torch.so it only works with the torch minor version it was
compiled against.

Environment, read by ``import remat``: ``REMAT_DEVICE`` (``cpu``, the default, or ``cuda``). With
``REMAT_DEVICE=cuda`` and ``REMAT_BUDGET`` set (bytes with a unit such as ``6GiB``, or a fraction of device memory
such as ``0.5``), importing remat installs the CUDA allocator with that budget (and ``REMAT_HOST_BUDGET`` for
paging) and switches the engine on for the importing thread (``REMAT_POLICY``); any problem is an ImportError that
names the variable. The CPU is then left alone: REMAT_BUDGET is the CUDA allocator's.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

import torch

from . import _engine
from ._library_search import find_library

__all__ = ["install_cuda_allocator", "installed_cuda_allocator", "cuda_library_path"]

_LIBRARY_NAME = "libremat_cuda.so"
_TORCH_LIBRARY_NAME = "libremat_torch.so"
_DEVICES = ("cpu", "cuda")
# absl::StatusCode numbers that remat_install_cuda_allocator returns (integration/cuda/c_api.h).
_INVALID_ARGUMENT = 3


@dataclass(frozen=True)
class CudaAllocator:
    """What install_cuda_allocator() installed."""

    budget: str                  # as given ("6GiB", "0.5", bytes), or as read from REMAT_BUDGET
    host_budget: Optional[str]   # pinned host memory for paging, or None
    policy: str                  # the engine's eviction policy
    engine: bool                 # the engine evicts (install_cuda_allocator(engine=True)), on `devices`
    library: Path
    arena: str = "contiguous"    # as asked ("contiguous", "stitch", "stitch:SIZE"), or as read from REMAT_ARENA
    devices: Tuple[int, ...] = ()  # the devices with an engine, ascending (empty without the engine)


_lock = threading.Lock()
_installed: Optional[CudaAllocator] = None
_library: Optional[ctypes.CDLL] = None
_library_file: Optional[Path] = None


def _candidate_paths() -> list:
    here = Path(__file__).resolve().parent
    candidates = [here / _LIBRARY_NAME]
    loaded = getattr(sys.modules.get(__package__), "_library_path", None)  # the libremat_torch.so remat loaded
    if loaded is not None:
        candidates.append(Path(loaded).resolve().parent / "cuda" / _LIBRARY_NAME)
    build_dir = os.environ.get("REMAT_BUILD_DIR")
    if build_dir:
        candidates.append(Path(build_dir) / "integration" / "cuda" / _LIBRARY_NAME)
    # integration/python/remat/cuda.py -> the repository root is three levels up.
    candidates.append(here.parents[2] / "build" / "integration" / "cuda" / _LIBRARY_NAME)
    return candidates


def cuda_library_path() -> Path:
    """The libremat_cuda.so that install_cuda_allocator() loads. RuntimeError if it was not built."""
    return find_library(
        "REMAT_CUDA_LIBRARY", _candidate_paths(), RuntimeError,
        f"remat: the CUDA library {_LIBRARY_NAME} was not built (it is built by `make build` when nvcc, the CUDA "
        f"toolkit's compiler, is found), or it is elsewhere: set REMAT_CUDA_LIBRARY to its path.")


def _load_library() -> ctypes.CDLL:
    global _library, _library_file
    if _library is not None:
        return _library
    path = cuda_library_path()
    try:
        # RTLD_GLOBAL: one copy of the CUDA runtime and of torch's libraries in the process.
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        raise RuntimeError(
            f"remat: cannot load {path}: {error}\n"
            f"If it was built against another torch version (this is torch {torch.__version__}), rebuild remat."
        ) from error
    lib.remat_cuda_torch_version.argtypes = []
    lib.remat_cuda_torch_version.restype = ctypes.c_char_p
    compiled = lib.remat_cuda_torch_version().decode()
    running = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if compiled != running:
        raise RuntimeError(
            f"remat: {path} was built against torch {compiled}, but torch {torch.__version__} is running. The "
            "library is tied to the torch minor version it was compiled against: rebuild remat with this torch."
        )
    lib.remat_install_cuda_allocator.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                                 ctypes.c_char_p, ctypes.c_size_t]
    lib.remat_install_cuda_allocator.restype = ctypes.c_int
    lib.remat_cuda_enable_engine.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                             ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.remat_cuda_enable_engine.restype = ctypes.c_int
    lib.remat_cuda_disable_engine.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.remat_cuda_disable_engine.restype = ctypes.c_int
    _library, _library_file = lib, path
    return lib


def _size_text(value: Union[int, float, str, None], name: str, fraction_ok: bool) -> Optional[str]:
    """The text the C++ parser gets (None: read the environment). ValueError for a value of the wrong type."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"remat: {name} must be bytes (int) or a string such as '6GiB', got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"remat: {name} must be > 0 bytes, got {value}")
        return str(value)
    if isinstance(value, float) and fraction_ok:
        if not 0 < value <= 1:
            raise ValueError(f"remat: a {name} fraction of device memory must be in (0, 1], got {value}")
        return repr(value)
    if isinstance(value, str) and value.strip():
        return value
    kinds = "bytes (int), a fraction of device memory (float in (0, 1]) or" if fraction_ok else "bytes (int) or"
    raise ValueError(f"remat: {name} must be {kinds} a string such as '6GiB', got {value!r}")


def _device_list(devices: Union[int, str, Sequence[int], None]) -> Optional[list]:
    """The engine's devices as asked: None for the current device, else a sorted list of distinct indices (range
    checked against the devices the driver reports, when it reports any). ValueError naming the problem."""
    if devices is None:
        return None
    count = torch.cuda.device_count()  # asks the driver; does not initialize torch's CUDA state
    if isinstance(devices, str):
        if devices != "all":
            raise ValueError(f"remat: devices must be None (the current device), a device index, a list of them or "
                             f"'all', got {devices!r}")
        return list(range(count))
    listed = [devices] if isinstance(devices, int) and not isinstance(devices, bool) else devices
    if not isinstance(listed, (list, tuple)) or not listed:
        raise ValueError(f"remat: devices must be None (the current device), a device index, a non-empty list of "
                         f"them or 'all', got {devices!r}")
    for device in listed:
        if isinstance(device, bool) or not isinstance(device, int):
            raise ValueError(f"remat: a device is an index (int), got {device!r} in devices={devices!r}")
        if device < 0:
            raise ValueError(f"remat: device {device} is not valid: a device index is >= 0")
        if count > 0 and device >= count:
            raise ValueError(f"remat: device {device} is out of range: this machine has {count} CUDA device(s)")
    if len(set(listed)) != len(listed):
        raise ValueError(f"remat: devices lists a device twice: {devices!r}")
    return sorted(listed)


def install_cuda_allocator(budget: Union[int, float, str, None] = None, policy: Optional[str] = None,
                           host_budget: Union[int, str, None] = None, costs: str = "measured",
                           offload: Optional[str] = None, engine: bool = True,
                           arena: Optional[str] = None,
                           devices: Union[int, str, Sequence[int], None] = None) -> CudaAllocator:
    """Makes remat PyTorch's CUDA allocator: one arena of `budget` per device, a hard limit (see the module's
    docstring). Call it after `import torch` and before anything initializes CUDA (the first CUDA tensor,
    stream or torch.cuda call that initializes CUDA).

    budget: bytes (int), a string with a unit ("6GiB", "512MiB"), or a fraction of each device's memory ("0.5"
        or 0.5); None reads REMAT_BUDGET. host_budget: pinned host memory for paging (None reads
        REMAT_HOST_BUDGET; unset: no paging). policy: an eviction policy name (remat.policies(); None reads
        REMAT_POLICY). costs: "measured" or "estimated", as for remat.enable(). offload: "off", "auto" or "always"
        (None reads REMAT_OFFLOAD, else off): page the engine's victims to host memory, up to host_budget. engine: also switch the engine on
        for this thread on `devices` (evict and rematerialize when the budget is full); False installs the allocator
        alone (a budget below the peak then raises torch.OutOfMemoryError). devices: where the engine runs, one
        engine per device, each with its own arena of `budget` (the budget applies to each device): None (the
        default) is the current device, as for torch.cuda's memory functions (device 0 unless the process selected
        another before CUDA started; with DDP, where each process uses cuda:rank, pass that rank's device, e.g.
        devices=int(os.environ["LOCAL_RANK"]) under torchrun); an index; a list of them; or "all" (every visible
        device). Ops go to the engine of the device their tensors live on; a copy between two devices is read by the
        source's engine and kept (or paged, never dropped) by the destination's. arena: "contiguous" (one segment of
        the budget per device), "stitch" or "stitch:SIZE" (physical granules, 2 MiB by default, mapped into
        contiguous address ranges, so that a request needs free granules rather than a hole; used where the device
        supports virtual memory management, else contiguous); None reads REMAT_ARENA, else contiguous. Never run
        on a GPU so far: tested on a test double of the CUDA runtime.

    Raises ValueError for a malformed budget (one budget, applied to each device), unknown policy or costs, devices
    that are not valid (not an index, negative, listed twice, out of range, or given with engine=False), and
    RuntimeError, with nothing installed, if
    CUDA was already initialized, if remat's CUDA allocator is already installed, if remat is already enabled (on
    the CPU), if libremat_cuda.so was not built or does not load, or if there is no CUDA device. If the allocator
    was installed but the engine then fails to start, RuntimeError says so: the allocator stays installed (an
    allocator torch has used cannot be taken back) and works without the engine, as with engine=False."""
    global _installed
    with _lock:
        if _installed is not None:
            raise RuntimeError(f"remat: the CUDA allocator is already installed ({_installed})")
        if torch.cuda.is_initialized():
            raise RuntimeError(
                "remat: CUDA is already initialized in this process, so remat cannot become the CUDA allocator: "
                "call remat.install_cuda_allocator() (or set REMAT_DEVICE=cuda and REMAT_BUDGET before "
                "`import remat`) before the first CUDA tensor, stream or torch.cuda call that initializes CUDA"
            )
        budget_text = _size_text(budget, "budget", fraction_ok=True)
        host_text = _size_text(host_budget, "host_budget", fraction_ok=False)
        policy_name = _engine.resolve_policy(policy)
        if costs not in _engine.COSTS:
            raise ValueError(f"remat: unknown costs {costs!r}; expected one of {', '.join(_engine.COSTS)}")
        offload_mode, _ = _engine.resolve_paging(offload, host_text)
        if devices is not None and not engine:
            raise ValueError("remat: devices chooses where the engine runs; with engine=False it runs nowhere "
                             "(the allocator serves every device anyway)")
        engine_devices = _device_list(devices)
        if engine and torch.ops.remat.is_enabled():
            raise RuntimeError("remat: remat is already enabled (on the CPU); call remat.disable() before installing "
                               "the CUDA allocator with its engine")
        lib = _load_library()
        error = ctypes.create_string_buffer(4096)
        status = lib.remat_install_cuda_allocator(
            budget_text.encode() if budget_text is not None else None,
            host_text.encode() if host_text is not None else None,
            arena.encode() if arena else None, error, len(error))
        if status != 0:
            message = error.value.decode(errors="replace")
            if not message.startswith("remat:"):
                message = f"remat: {message}"
            if status == _INVALID_ARGUMENT:
                raise ValueError(message)
            raise RuntimeError(message)
        _installed = CudaAllocator(
            budget=budget_text if budget_text is not None else os.environ.get("REMAT_BUDGET", ""),
            host_budget=host_text if host_text is not None else (os.environ.get("REMAT_HOST_BUDGET") or None),
            policy=policy_name, engine=engine, library=_library_file,
            arena=arena or os.environ.get("REMAT_ARENA") or "contiguous")
        if engine:
            for device in engine_devices if engine_devices is not None else [-1]:  # -1: the current device
                status = lib.remat_cuda_enable_engine(device, policy_name.encode(), costs.encode(),
                                                      offload_mode.encode(),
                                                      host_text.encode() if host_text is not None else None, error,
                                                      len(error))
                if status != 0:
                    message = error.value.decode(errors="replace")
                    if torch.ops.remat.engine_enabled():  # the devices started before this one stop too
                        lib.remat_cuda_disable_engine(error, len(error))
                    _installed = replace(_installed, engine=False)
                    raise RuntimeError(f"remat: the CUDA allocator is installed (and stays, without eviction), but "
                                       f"its engine could not start on "
                                       f"{'the current device' if device < 0 else f'device {device}'}: {message}")
            _installed = replace(_installed, devices=tuple(torch.ops.remat.engine_devices()))
            from . import _higher_order_ops
            _higher_order_ops.let_through()  # torch.cond and the like fall through remat's key, as on the CPU
        return _installed


def installed_cuda_allocator() -> Optional[CudaAllocator]:
    """What install_cuda_allocator() installed in this process, or None."""
    return _installed


def device_from_environment() -> str:
    """REMAT_DEVICE: "cpu" (also when unset or empty) or "cuda". ValueError naming the variable otherwise."""
    value = os.environ.get("REMAT_DEVICE", "")
    device = value.strip().lower()
    if not device:
        return "cpu"
    if device not in _DEVICES:
        raise ValueError(f"remat: REMAT_DEVICE={value!r} is not valid: expected one of {', '.join(_DEVICES)}")
    return device


def _install_from_environment() -> Optional[CudaAllocator]:
    try:
        device = device_from_environment()
    except ValueError as error:
        raise ImportError(str(error)) from error
    if device != "cuda":
        return None
    if not os.environ.get("REMAT_BUDGET", "").strip():
        raise ImportError("remat: REMAT_DEVICE=cuda needs REMAT_BUDGET (e.g. 6GiB, or 0.5 of device memory)")
    try:
        return install_cuda_allocator()
    except (ValueError, RuntimeError) as error:
        raise ImportError(f"remat: REMAT_DEVICE=cuda: {error}") from error


_install_from_environment()
