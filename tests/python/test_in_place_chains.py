"""A storage written in place over and over (a key/value cache filled token by token) is state, not an activation:
after kLongestReplayedInPlaceChain (8) in-place writes, its next value is a constant (integration/engine_bridge.cc).
Before, every version stayed evictable, and restoring one replayed every write since the cache was made (54 replays
deep in the probe's generate_then_train), so sampling from a small language model ran out at 0.7 of its peak,
well above the bound (0.49).
"""
import torch

import remat
from ecosystem import harness
from ecosystem.storage_and_generation import PROGRAMS


def test_sampling_with_a_cache_filled_in_place_trains_identically_at_0_7_of_its_peak():
    build, step = PROGRAMS["generate_then_train"]
    trained, recomputed = harness.train_under_budgets(build, step, (0.7,), "generate_then_train")
    assert trained == [0.7], "ran out of memory at 0.7 of its peak"
    assert recomputed > 0


def test_a_long_in_place_chain_becomes_a_constant():
    with remat.enable(1 << 30, costs="estimated"):
        cache = torch.zeros(64, 64)
        before = remat.stats()["pinned_outputs"]
        for t in range(8):
            cache[t].copy_(torch.full((64,), float(t)))
        after_eight = remat.stats()["pinned_outputs"]
        cache[8].copy_(torch.full((64,), 8.0))
        after_nine = remat.stats()["pinned_outputs"]
    assert (before, after_eight) == (before, before), "the first 8 in-place writes stay evictable"
    assert after_nine == before + 1
