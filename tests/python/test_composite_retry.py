"""A composite op that runs out of memory runs again once its arguments can move (integration/composite_attempt.h).

While a composite kernel runs, remat keeps its resident arguments in place (it may read them through raw pointers
between the ops it calls), so a large buffer one of those ops asks for can find free memory on both sides of an
argument and no hole: the op's own retry cannot move what the composite holds. Found on a bf16 channels_last
convolution under autocast (tests/python/ecosystem/training_loops.py, channels_last_bf16), which ran out at 1.08 of
its unconstrained peak with 36 MB free in an arena of 38.6 MB: its 21 MB im2col buffer met the input that
aten::convolution holds. Once the composite's kernel has unwound, nothing reads its arguments: remat compacts the
arena and runs it again, unless running it again would repeat something (an op it ran wrote one of its arguments,
drew random numbers, ...): then the error stands.

Each test lays out the arena so that the argument sits between two holes smaller than the request and larger
together.
"""
import pytest
import torch

import remat

MiB = 1 << 20
FLOATS_PER_MIB = MiB // 4

_library = torch.library.Library("remat_composite_retry_test", "DEF")
_library.define("tile7(Tensor x) -> Tensor")
_library.define("count_and_tile7(Tensor x, Tensor counter) -> Tensor")


def _tile7(x):
    return torch.cat([x] * 7)


def _count_and_tile7(x, counter):
    counter.add_(1)  # writes an argument the schema does not declare: its only effect, for the test to see
    return torch.cat([x] * 7)


# CompositeImplicitAutograd: the hook sees the ops these call (recorded), not the op itself.
_library.impl("tile7", _tile7, "CompositeImplicitAutograd")
_library.impl("count_and_tile7", _count_and_tile7, "CompositeImplicitAutograd")


def _argument_between_two_holes():
    """Under a 12 MiB budget: a 1 MiB tensor with free blocks of 5 MiB below and about 6 MiB above it."""
    below = torch.empty(5 * FLOATS_PER_MIB)
    x = torch.rand(FLOATS_PER_MIB)
    above = torch.empty(6 * FLOATS_PER_MIB - 2048)
    del below, above
    stats = remat.stats()
    assert stats["free_bytes"] >= 10 * MiB and stats["largest_free_block"] < 7 * MiB, stats  # the layout tested
    return x


@pytest.mark.parametrize("tile", [lambda x: x.tile(7), torch.ops.remat_composite_retry_test.tile7],
                         ids=["aten_tile", "python_composite"])
def test_a_composite_whose_argument_splits_free_memory_runs_again(tile):
    torch.manual_seed(0)
    expected = tile(torch.rand(FLOATS_PER_MIB))
    torch.manual_seed(0)
    with remat.enable(12 * MiB):
        x = _argument_between_two_holes()
        got = tile(x)  # asks for 7 MiB inside the composite, which holds x in place
        retried = remat.stats()["retried_composites"]
        got = got.numpy().tobytes()
    assert got == expected.numpy().tobytes()
    assert retried == 1


def test_a_composite_that_wrote_an_argument_is_not_run_again():
    torch.manual_seed(0)
    with remat.enable(12 * MiB):
        counter = torch.zeros(16)
        x = _argument_between_two_holes()
        with pytest.raises(torch.OutOfMemoryError, match="tried to allocate 7340032 bytes"):
            torch.ops.remat_composite_retry_test.count_and_tile7(x, counter)
        retried = remat.stats()["retried_composites"]
        written = counter.clone()
    assert retried == 0
    # written once: running it again would have written it twice
    assert written.numpy().tobytes() == torch.ones(16).numpy().tobytes()
