"""A constant written in place or let go while evicted results were computed from it (integration/engine_bridge.h,
CopyOldValue and ReleaseIfDead).

A replay recomputes a result from the values its op read. A constant (a parameter, anything remat cannot recompute)
about to be overwritten in place, by an optimizer step say, or about to die would take those values with it, so
remat used to bring back and pin everything computed from it first. After a backward pass that evicted gradients,
the first parameter update pinned every one of them at once, each with the replays it needs: ecosystem programs and
three cells of the training matrix ran out of memory there although the bound allowed their budget. Now, when what
pinning would bring back is larger than the constant, remat keeps the old value instead (a copy of it before an
in-place write; the dying storage itself otherwise) until nothing live needs it.

Every test: twelve 1 MiB results computed from a 1 MiB constant under an 8 MiB budget, so that a third of them are
evicted when the constant changes; then every result is read, and compared byte for byte with the same program run
without remat.
"""
import torch

import oracle
import remat

MiB = 1 << 20
FLOATS_PER_MIB = MiB // 4
RESULTS = 12


def _results_of(p):
    return [p * (i + 1) for i in range(RESULTS)]


def _copies(tensors):
    return [t.clone() for t in tensors]


def _assert_same(expected, got):
    assert len(expected) == len(got)
    for i, (e, g) in enumerate(zip(expected, got)):
        assert oracle.same_bytes(e, g), f"tensor {i} differs"


def _constant():
    """A 1 MiB tensor made outside remat, as a parameter is: a constant to remat (it cannot recompute it)."""
    torch.manual_seed(0)
    return torch.rand(FLOATS_PER_MIB)


def _write_in_place(p):
    ys = _results_of(p)
    with torch.no_grad():
        p.add_(1)  # what an optimizer step does to a parameter
    return _copies(ys + [p])


def test_a_constant_written_in_place_keeps_its_old_value_for_evicted_results():
    expected = _write_in_place(_constant())
    p = _constant()
    with remat.enable(8 * MiB):
        got = _write_in_place(p)
        stats = remat.stats()
    assert stats["evictions"] > 0 and stats["rematerializations"] > 0, stats  # results replayed from the copy
    assert stats["kept_old_values"] == 1, stats
    _assert_same(expected, got)


def test_a_kept_old_value_goes_when_what_was_computed_from_it_dies():
    p = _constant()
    with remat.enable(8 * MiB):
        ys = _results_of(p)
        with torch.no_grad():
            p.add_(1)
        assert remat.stats()["kept_old_values_now"] == 1
        del ys
        for _ in range(3):  # the next ops sweep the dead results and look at the kept old value
            q = p * 1
        assert remat.stats()["kept_old_values_now"] == 0, remat.stats()
        del q


def _write_half_way(p):
    # scatter_ writes the elements before an out-of-range index, then raises: the storage holds neither value.
    ys = _results_of(p)
    index = torch.tensor([0, 1, 2, FLOATS_PER_MIB + 5])
    try:
        with torch.no_grad():
            p.scatter_(0, index, torch.full((4,), 7.0))
    except RuntimeError as error:
        assert "index" in str(error)
    else:
        raise AssertionError("scatter_ accepted an index out of range")
    return _copies(ys + [p])


def test_a_write_that_fails_half_way_leaves_the_old_value_to_the_evicted_results():
    expected = _write_half_way(_constant())
    assert oracle.same_bytes(expected[-1][:3], torch.full((3,), 7.0))  # it did write part of it
    p = _constant()
    with remat.enable(8 * MiB):
        got = _write_half_way(p)
        stats = remat.stats()
    _assert_same(expected, got)
    assert stats["kept_old_values"] == 1 and stats["rematerializations"] > 0, stats


def _let_go(made_outside):
    c = made_outside.pop()  # the only reference from here on
    ys = _results_of(c)
    del c  # only the records of the results read it now
    return _copies(ys)


def test_a_dying_constant_stays_while_evicted_results_need_it():
    expected = _let_go([_constant()])
    made_outside = [_constant()]
    with remat.enable(8 * MiB):
        got = _let_go(made_outside)
        stats = remat.stats()
    assert stats["evictions"] > 0 and stats["rematerializations"] > 0, stats
    _assert_same(expected, got)
