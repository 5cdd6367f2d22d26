"""A constant the program lets go of while evicted results were computed from it (integration/engine_bridge.h,
ReleaseIfDead, PinningCostsMoreThan).

A replay recomputes a result from the values its op read. A constant (a tensor made outside remat, a result remat
cannot recompute) that dies while records still read it would take those values with it, so remat brought back and
pinned everything computed from it first, all at once. When what that would bring back (gradients not counted: an
optimizer step brings each back anyway) is larger than the constant, remat now keeps the constant in memory instead,
until nothing live needs it.
"""
import torch

import oracle
import remat

MiB = 1 << 20
FLOATS_PER_MIB = MiB // 4
RESULTS = 12


def _constant():
    """A 1 MiB tensor made outside remat, as a parameter is: a constant to remat (it cannot recompute it)."""
    torch.manual_seed(0)
    return torch.rand(FLOATS_PER_MIB)


def _let_go(made_outside):
    c = made_outside.pop()  # the only reference from here on
    ys = [c * (i + 1) for i in range(RESULTS)]
    del c  # only the records of the results read it now
    return [y.clone() for y in ys]


def test_a_dying_constant_stays_while_evicted_results_need_it():
    # Twelve 1 MiB results of a 1 MiB constant under an 8 MiB budget: a third of them are evicted when it dies;
    # bringing them all back (before) ran out of memory.
    expected = _let_go([_constant()])
    made_outside = [_constant()]
    with remat.enable(8 * MiB):
        got = _let_go(made_outside)
        stats = remat.stats()
    assert stats["evictions"] > 0 and stats["rematerializations"] > 0, stats
    assert len(expected) == len(got) == RESULTS
    for i, (e, g) in enumerate(zip(expected, got)):
        assert oracle.same_bytes(e, g), f"result {i} differs"
