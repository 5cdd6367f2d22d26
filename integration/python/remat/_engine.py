"""remat with the engine behind it: storages are evicted under pressure and rematerialized on demand
(C++: integration/engine_session.h, engine_bridge.h, torch_executor.h).

The package's ``remat.enable(budget, policy=...)`` switches this on; this module holds the pieces:
``policies()`` lists the engine's registry, ``resolve_policy`` validates a name (or ``REMAT_POLICY``), and
``stats()`` merges the arena's numbers with the engine's (evictions, rematerializations, replayed time, search
time, fragmentation).
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Union

import torch

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


def enable(nbytes: int, policy: Optional[str] = None, costs: str = "measured") -> str:
    """Switches remat on with the engine; returns the policy used."""
    name = resolve_policy(policy)
    if costs not in COSTS:
        raise ValueError(f"remat: unknown costs {costs!r}; expected one of {', '.join(COSTS)}")
    torch.ops.remat.enable_engine(int(nbytes), name, costs)
    return name


def disable() -> None:
    torch.ops.remat.disable_engine()


def is_enabled() -> bool:
    return bool(torch.ops.remat.engine_enabled())


def engine_stats() -> Dict[str, Union[int, float]]:
    """The engine's numbers (of the current engine, else of the last one); empty before the first enable."""
    out: Dict[str, Union[int, float]] = {}
    for key, value in dict(torch.ops.remat.engine_stats()).items():
        out[key] = value if key == "fragmentation" else int(value)
    return out
