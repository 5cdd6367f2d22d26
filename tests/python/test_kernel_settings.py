"""Process-wide settings that choose what a kernel computes (integration/kernel_settings.h): a replay runs under the
settings its op ran under, not the ones in force when remat replays it.

A program may change such a setting for part of a step: oneDNN off around some convolutions
(`torch.backends.mkldnn.flags(enabled=False)`: another convolution backend, other bits), a float64 default dtype
inside a block that makes positional features (`torch.linspace` without a dtype). The programs are the ecosystem
probe's (tests/python/ecosystem/kernel_settings.py), run by its harness (fixed seeds, one intra-op thread: with two,
the convolution without oneDNN differs from run to run even without remat). Each trains under budgets down from its
peak and must match the run without remat byte for byte (or run out of memory), and some budget must recompute.
"""
import pytest
import torch

from ecosystem import harness
from ecosystem.kernel_settings import PROGRAMS

CASES = ["onednn_off_one_conv", "float64_default_dtype_block"]


def train(name, budget=None):
    build, step = PROGRAMS[name]
    return harness.run(build, step, budget)


@pytest.mark.parametrize("name", CASES)
def test_a_replay_runs_under_the_settings_its_op_ran_under(name):
    build, step = PROGRAMS[name]
    trained, recomputed = harness.train_under_budgets(build, step, (1.2, 1.1, 1.0, 0.95, 0.9, 0.8, 0.7), name)
    assert recomputed > 0, f"no budget made remat recompute anything (trained at {trained}): the test shows nothing"


def test_the_settings_in_force_are_the_programs_again_after_a_replay():
    """A replay under other settings puts the program's back: after training with oneDNN off for one layer (replays
    of that layer run with it off), oneDNN is on and the default dtype float32, as the program left them."""
    _, unconstrained = train("onednn_off_one_conv", harness.HUGE)
    for fraction in (1.0, 0.9):
        try:
            _, stats = train("onednn_off_one_conv", int(unconstrained["peak_allocated_bytes"] * fraction))
            break
        except torch.OutOfMemoryError:
            continue
    assert stats["rematerializations"] > 0
    assert torch.backends.mkldnn.enabled
    assert torch.get_default_dtype() == torch.float32
