"""torch's higher-order operators (torch.cond, while_loop, map, scan, invoke_subgraph, ...) under remat.

They dispatch in Python, key by key, and raise "could not find kernel for HigherOrderOperator ..." at a key they
have no kernel for. remat's hook key is in every dispatch while remat is on (torch_ops.cc: hook_key), so torch.cond
failed at any budget, even in eager mode (it compiles itself with dynamo). They fall through it instead: the
operator runs as without remat, and the ops its branches and bodies run reach the hook one by one, recorded and
replayed as the ops of any Python function are.
"""

from __future__ import annotations

import torch
from torch import _ops

_done = False


def let_through() -> None:
    """Makes every higher-order operator, existing or made later, fall through remat's hook key. Idempotent; called
    by remat.enable()."""
    global _done
    if _done:
        return
    key = torch._C.DispatchKey(int(torch.ops.remat.hook_key_value()))
    if key not in _ops._HIGHER_ORDER_OP_DEFAULT_FALLTHROUGH_DISPATCH_KEYS:
        _ops._HIGHER_ORDER_OP_DEFAULT_FALLTHROUGH_DISPATCH_KEYS.append(key)  # operators made from now on
    for operator in _ops._higher_order_ops.values():
        operator.fallthrough(key)
    _done = True
