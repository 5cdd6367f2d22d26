"""Process-wide settings that choose what a kernel computes (integration/kernel_settings.h): a replay runs under the
settings its op ran under, not the ones in force when remat replays it.

A program may change such a setting for part of a step: oneDNN off around some convolutions
(`torch.backends.mkldnn.flags(enabled=False)`: another convolution backend, other bits), a float64 default dtype
inside a block that makes positional features (`torch.linspace` without a dtype), a different intra-op thread count
for the forward and the backward. Each program below trains under budgets down from its peak and must match the run
without remat byte for byte (or run out of memory), and some budget must recompute something.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import oracle
import remat

HUGE = 4 << 30


class ConvWithoutOneDnnFirst(nn.Module):
    """The first convolution runs with oneDNN off (the slow_conv2d kernels), the rest with it on."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 32, 3, padding=1)
        self.c3 = nn.Conv2d(32, 32, 3, padding=1)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        with torch.backends.mkldnn.flags(enabled=False):
            h = torch.relu(self.c1(x))
        h = torch.relu(self.c2(h))
        h = torch.relu(self.c3(h))
        return self.head(h.mean((2, 3)))


class Float64PositionalFeatures(nn.Module):
    """Positional features made under a float64 default dtype (torch.linspace and torch.arange without a dtype), as
    code that sets the default dtype for a block does."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(64, 256)
        self.l2 = nn.Linear(256, 256)
        self.l3 = nn.Linear(256, 8)

    def forward(self, x):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            position = torch.linspace(0, 1, x.shape[0]).unsqueeze(1) * torch.arange(1, 65).unsqueeze(0)
            features = torch.sin(position)
        finally:
            torch.set_default_dtype(previous)
        h = torch.tanh(self.l1(x + features.float()))
        h = torch.tanh(self.l2(h))
        return self.l3(h)


def conv_case():
    return ConvWithoutOneDnnFirst, (torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))


def float64_case():
    return Float64PositionalFeatures, (torch.randn(512, 64), torch.randint(0, 8, (512,)))


CASES = {"onednn off for one layer": conv_case, "float64 default dtype for a block": float64_case}


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: with two, the convolution without oneDNN differs from run to run even without remat."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def train(case, budget=None, steps=3):
    torch.manual_seed(0)
    make, (x, y) = CASES[case]()
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses, stats = [], None
    if budget is not None:
        remat.enable(budget, costs="estimated")
    try:
        for _ in range(steps):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
            del loss
    finally:
        if remat.is_enabled():
            remat.disable()
            stats = remat.stats()
    return oracle.capture(model, opt, losses), stats


@pytest.mark.parametrize("case", list(CASES))
def test_a_replay_runs_under_the_settings_its_op_ran_under(case):
    expected, _ = train(case)
    _, unconstrained = train(case, HUGE)
    peak = unconstrained["peak_allocated_bytes"]
    recomputed, trained = 0, []
    for fraction in (1.2, 1.1, 1.0, 0.95, 0.9, 0.8, 0.7):
        try:
            got, stats = train(case, int(peak * fraction))
        except torch.OutOfMemoryError:
            continue
        oracle.assert_identical(expected, got, f"{case} at {fraction} of the peak")
        recomputed += stats["rematerializations"]
        trained.append(fraction)
    assert recomputed > 0, f"no budget made remat recompute anything (trained at {trained}): the test shows nothing"


def test_the_settings_in_force_are_the_programs_again_after_a_replay():
    """A replay under other settings puts the program's back: after training with oneDNN off for one layer (replays
    of that layer run with it off), oneDNN is on and the default dtype float32, as the program left them."""
    _, unconstrained = train("onednn off for one layer", HUGE)
    _, stats = train("onednn off for one layer", int(unconstrained["peak_allocated_bytes"] * 0.9))
    assert stats["rematerializations"] > 0
    assert torch.backends.mkldnn.enabled
    assert torch.get_default_dtype() == torch.float32
    assert torch.get_default_dtype() == torch.float32
