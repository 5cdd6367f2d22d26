"""torch's higher-order operators under remat (remat/_higher_order_ops.py). torch.cond dispatches in Python, key by
key, and raised "could not find kernel for HigherOrderOperator cond" at remat's hook key: a model with a
data-dependent branch failed at any budget, even one that never binds. It falls through the key now, and the ops
its branches run reach the hook.

Not yet (README, "Works with"): under a binding budget such a model runs out early (at 0.9 of its peak: each cond
call's operand and the buffers cond's backward writes in place are kept as constants), and remat.bound.RequiredBytes,
a dispatch mode, does not handle higher-order operators.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import remat
from ecosystem import harness


class CondBlock(nn.Module):
    """A residual block whose branch depends on the data: torch.cond picks a GELU or a tanh path."""

    def __init__(self, d=128):
        super().__init__()
        self.a, self.b = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        h = self.a(x)
        h = torch.cond(h.mean() > 0, lambda t: F.gelu(t) * torch.sigmoid(t), lambda t: torch.tanh(t) * t, (h,))
        return x + self.b(h)


def build():
    m = nn.Sequential(*[CondBlock() for _ in range(4)], nn.Linear(128, 10))
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(128, 128), torch.randint(0, 10, (128,)))


def test_a_model_branching_with_torch_cond_trains_identically_under_remat():
    step = harness.std_step(lambda m, d: F.cross_entropy(m(d[0]), d[1]))
    trained, _ = harness.train_under_budgets(build, step, (1.0,), "torch_cond_branches")
    assert trained == [1.0], "ran out of memory at its own peak"


def test_torch_cond_takes_the_branch_the_data_picks():
    with remat.enable(64 << 20):
        x = torch.arange(6.0)
        up = torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))
        down = torch.cond(x.sum() < 0, lambda t: t + 1, lambda t: t - 1, (x,))
    assert up.numpy().tobytes() == (x + 1).numpy().tobytes()
    assert down.numpy().tobytes() == (x - 1).numpy().tobytes()


def test_while_loop_scan_and_map_give_the_values_they_give_without_remat():
    from torch._higher_order_ops import while_loop
    from torch._higher_order_ops.map import map as map_over
    from torch._higher_order_ops.scan import scan

    def run():
        counted = while_loop(lambda i, x: i < 5, lambda i, x: (i + 1, x + i), (torch.tensor(0), torch.zeros(4)))[1]
        carry, ys = scan(lambda c, x: (c + x, (c * 2).clone()), torch.zeros(3), torch.arange(12.0).reshape(4, 3))
        mapped = map_over(lambda a: a.sin(), torch.arange(6.0).reshape(2, 3))
        return [counted, carry, ys, mapped]

    expected = run()
    with remat.enable(64 << 20):
        got = run()
    for e, g in zip(expected, got):
        assert e.shape == g.shape and e.numpy().tobytes() == g.numpy().tobytes()
