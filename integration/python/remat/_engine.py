"""remat with the engine behind it: storages are evicted under pressure and rematerialized on demand
(C++: integration/engine_session.h, engine_bridge.h, torch_executor.h).

The package's ``remat.enable(budget, policy=...)`` switches this on; this module holds the pieces:
``policies()`` lists the engine's registry, ``resolve_policy`` validates a name (or ``REMAT_POLICY``), and
``stats()`` merges the arena's numbers with the engine's (evictions, rematerializations, replayed time, search
time, fragmentation, paging), and ``resolve_paging`` parses ``offload``/``host_budget`` or ``REMAT_OFFLOAD``/
``REMAT_HOST_BUDGET`` with the C++ configuration parser. After every optimizer step (a global step hook, idle
while remat is off) the optimizer's state is pinned: momentum and Adam's moments are rewritten in place every step,
so recomputing them would replay every step since they were made.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple, Union

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

DEFAULT_POLICY = "dtr-eq"


def policies() -> List[str]:
    """The eviction policies the engine's registry knows (policies/registry.h), sorted."""
    return sorted(str(name) for name in torch.ops.remat.policies())


def resolve_policy(policy: Optional[str]) -> str:
    """`policy`, else $REMAT_POLICY, else the default; ValueError naming the registered ones if unknown."""
    source = "policy"
    if policy is None:
        policy = os.environ.get("REMAT_POLICY") or None
        source = "REMAT_POLICY"
    if policy is None:
        return DEFAULT_POLICY
    known = policies()
    if not isinstance(policy, str) or policy not in known:
        raise ValueError(f"remat: unknown {source} {policy!r}; registered policies: {', '.join(known)}")
    return policy


COSTS = ("measured", "estimated")


def resolve_paging(offload: Optional[str] = None, host_budget: Union[int, str, None] = None) -> Tuple[str, int]:
    """(offload mode, host budget in bytes or -1 for unlimited): the arguments, else $REMAT_OFFLOAD and
    $REMAT_HOST_BUDGET, parsed by remat's C++ configuration parser (runtime/config.h). ValueError naming the option
    or the variable for a malformed value."""
    if offload is not None and not isinstance(offload, str):
        raise ValueError(f"remat: offload is one of 'off', 'auto', 'always', got {offload!r}")
    if isinstance(host_budget, bool) or not isinstance(host_budget, (int, str, type(None))):
        raise ValueError(f"remat: host_budget is an int (bytes) or a string such as '8GiB', got {host_budget!r}")
    if isinstance(host_budget, int):
        if host_budget <= 0:
            raise ValueError(f"remat: host_budget must be > 0 bytes, got {host_budget}")
        host_budget = str(host_budget)
    try:
        mode, nbytes = torch.ops.remat.resolve_paging(offload, host_budget)
    except RuntimeError as error:
        raise ValueError(str(error).splitlines()[0]) from None
    return str(mode), int(nbytes)


HOST_TIERS = ("memory", "file")

# The CPU arena (issue 18): "contiguous", one block of the budget's size (a request needs a hole), or "stitch",
# address space eight times the budget backed granule by granule from a pool of the budget's size (a request
# needs free granules: fragmentation cannot make it fail). STITCH_GRANULE: the CPU granule, chosen by measurement
# (README, "Stitching arena"); above STITCH_MAX_GRANULES granules in the budget it doubles until they fit, because
# each granule can be a mapping of its own and Linux allows 65,530 per process (vm.max_map_count).
ARENAS = ("contiguous", "stitch")
DEFAULT_ARENA = "contiguous"
STITCH_GRANULE = 64 << 10
STITCH_MAX_GRANULES = 16384


def resolve_arena(arena: Optional[str], budget: Optional[int] = None) -> Tuple[str, int]:
    """(arena kind, stitching granule in bytes or 0): `arena`, else $REMAT_ARENA, else the default. "stitch:SIZE"
    (e.g. "stitch:2MiB") chooses the granule: a power of two of at least a page; plain "stitch" takes STITCH_GRANULE,
    doubled while `budget` (bytes) holds more than STITCH_MAX_GRANULES of them. ValueError naming the option or the
    variable for anything else."""
    source = "arena"
    if arena is None:
        arena = os.environ.get("REMAT_ARENA") or None
        source = "REMAT_ARENA"
    if arena is None:
        arena = DEFAULT_ARENA
    kind, _, size = arena.partition(":") if isinstance(arena, str) else (arena, "", "")
    if kind not in ARENAS or (size and kind != "stitch"):
        raise ValueError(f"remat: unknown {source} {arena!r}; expected one of {', '.join(ARENAS)} or 'stitch:SIZE'")
    if kind != "stitch":
        return kind, 0
    granule = STITCH_GRANULE
    while budget is not None and budget > STITCH_MAX_GRANULES * granule:
        granule *= 2
    if size:
        try:
            granule = int(torch.ops.remat.parse_budget(size))
        except RuntimeError:
            granule = 0
        if granule < 4096 or granule & (granule - 1):
            raise ValueError(f"remat: {source} {arena!r}: the granule must be a power of two of at least 4 KiB "
                             "(such as 64KiB or 2MiB)")
    return kind, granule


# The costs the engine was last enabled with (remat.record writes the same into a trace by default).
enabled_costs = "measured"


def enable(nbytes: int, policy: Optional[str] = None, costs: str = "measured", offload: Optional[str] = None,
           host_budget: Union[int, str, None] = None, host_tier: str = "memory", page_constants: bool = True,
           arena: Optional[str] = None) -> str:
    """Switches remat on with the engine; returns the policy used."""
    name = resolve_policy(policy)
    if costs not in COSTS:
        raise ValueError(f"remat: unknown costs {costs!r}; expected one of {', '.join(COSTS)}")
    mode, host_bytes = resolve_paging(offload, host_budget)
    if host_tier not in HOST_TIERS:
        raise ValueError(f"remat: unknown host_tier {host_tier!r}; expected one of {', '.join(HOST_TIERS)}")
    _, granule = resolve_arena(arena, int(nbytes))
    torch.ops.remat.enable_engine(int(nbytes), name, costs, mode, host_bytes, host_tier, bool(page_constants),
                                  granule)
    global enabled_costs
    enabled_costs = costs
    return name


def disable() -> None:
    torch.ops.remat.disable_engine()


def is_enabled() -> bool:
    return bool(torch.ops.remat.engine_enabled())


def engine_stats() -> Dict[str, Union[int, float]]:
    """The engine's numbers (of the current engine, else of the last one); empty before the first enable."""
    out: Dict[str, Union[int, float]] = {}
    for key, value in dict(torch.ops.remat.engine_stats()).items():
        out[key] = value if key in ("fragmentation", "plan_planned_overhead") else int(value)
    return out


def _tensors_in(value, found: List[torch.Tensor]) -> None:
    """Appends the tensors of `value` (a tensor, or a list, tuple or dict of them, nested), in order."""
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _tensors_in(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors_in(item, found)


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> List[torch.Tensor]:
    """The tensors of `optimizer.state` (momentum buffers, Adam's moments and step counts), including those in lists,
    tuples and dicts inside it (LBFGS keeps its history of directions and steps in lists), in the state's order (the
    order pin_state pins and pages them in). A module-level walk, not a recursive closure: a closure that calls
    itself is a reference cycle, which kept the list and its tensors alive until the garbage collector ran."""
    found: List[torch.Tensor] = []
    for state in optimizer.state.values():
        _tensors_in(state, found)
    return found


def _pin_optimizer_state(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    """torch.optim's global step post hook: pins the tensors of `optimizer.state` (EngineBridge::PinState), then
    ends the training iteration (mark_step: plan mode records, plans and follows per iteration)."""
    if not is_enabled():
        return
    tensors = optimizer_state_tensors(optimizer)
    if tensors:
        torch.ops.remat.pin_state(tensors)
    torch.ops.remat.mark_step()


_OPTIMIZER_HOOK = register_optimizer_step_post_hook(_pin_optimizer_state)
