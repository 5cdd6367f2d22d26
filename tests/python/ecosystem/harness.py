"""How an ecosystem program runs: build() makes (model, optimizer, data) under fixed seeds; step(model, optimizer,
data, i) runs training step i and returns its loss. run() trains a few steps, with or without remat, and returns
the byte oracle's snapshot (oracle.py) and remat's stats; required_bytes() is remat.bound.RequiredBytes of the same
run (the drop-only lower bound).

Every run starts from the same random state: torch's default generator, numpy's (wav2vec2 draws its masks with
numpy), and torch.seed(), which Reformer calls in every forward for its reversible layers and which would otherwise
seed from the clock (two runs without remat would differ)."""
from __future__ import annotations

import contextlib
from typing import Callable, Optional, Tuple

import numpy as np
import torch

import oracle
import remat
from remat.bound import RequiredBytes

HUGE = 4 << 30
STEPS = 3


def std_step(loss_of: Callable) -> Callable:
    """The usual step: zero_grad, loss_of(model, data), backward, optimizer step."""
    def step(model, opt, data, i):
        opt.zero_grad()
        loss = loss_of(model, data)
        loss.backward()
        opt.step()
        return loss
    return step


@contextlib.contextmanager
def deterministic_seeds():
    """torch.seed() returns 1001, 1002, ... (and seeds with it, as it does) instead of a seed from the clock; one
    intra-op thread unless the program asks for more (its build may call torch.set_num_threads), restored after."""
    counter = [1000]
    original = torch.seed
    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    def seed():
        counter[0] += 1
        torch.manual_seed(counter[0])
        return counter[0]
    torch.seed = seed
    try:
        yield
    finally:
        torch.seed = original
        torch.set_num_threads(threads)


def build_seeded(build: Callable):
    torch.manual_seed(0)
    np.random.seed(0)
    model, opt, data = build()
    torch.manual_seed(1)
    np.random.seed(1)
    return model, opt, data


def run(build: Callable, step: Callable, budget: Optional[int] = None) -> Tuple[oracle.Snapshot, Optional[dict]]:
    """STEPS steps of the program; with a budget, drop-only under remat with estimated costs."""
    with deterministic_seeds():
        model, opt, data = build_seeded(build)
        losses, stats = [], None
        if budget is not None:
            remat.enable(budget, costs="estimated")
        try:
            for i in range(STEPS):
                loss = step(model, opt, data, i)
                losses.append(loss.detach().clone())
                del loss
        finally:
            if remat.is_enabled():
                remat.disable()
                stats = remat.stats()
    return oracle.capture(model, opt, losses), stats


def required_bytes(build: Callable, step: Callable) -> int:
    """RequiredBytes of the same run under a budget that never binds (so that kernels' own buffers count)."""
    with deterministic_seeds():
        model, opt, data = build_seeded(build)
        outside = [t for t in data if torch.is_tensor(t)]
        with remat.enable(HUGE, costs="estimated"), RequiredBytes(model, opt, outside=outside) as bound:
            for i in range(STEPS):
                loss = step(model, opt, data, i)
                del loss
    return bound.required_bytes


def train_under_budgets(build: Callable, step: Callable, fractions, label: str) -> Tuple[list, int]:
    """Trains the program at each fraction of its peak (measured under a budget that never binds); every run that
    finishes must match the run without remat byte for byte. Returns the fractions that trained (a run that ran out
    of memory is left out) and the rematerializations of all of them."""
    expected, _ = run(build, step)
    _, unconstrained = run(build, step, HUGE)
    peak = unconstrained["peak_allocated_bytes"]
    trained, recomputed = [], 0
    for fraction in fractions:
        try:
            got, stats = run(build, step, int(peak * fraction))
        except torch.OutOfMemoryError:
            continue
        oracle.assert_identical(expected, got, f"{label} at {fraction} of the peak")
        trained.append(fraction)
        recomputed += stats["rematerializations"]
    return trained, recomputed
