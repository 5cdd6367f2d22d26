"""Storages an op changes in ways an in-place write does not: it resizes one it writes (an out= argument of another
shape, resize_: the kernel gives the StorageImpl other memory of another size), or it writes part of one and then
fails. The new value of a resized storage is a fresh value of the new size, kept as a constant
(integration/op_in_flight.h, OpInFlight::Resized); a storage a failed op wrote keeps what the kernel left in it, as a
constant (EngineBridge::OpFailed). Before, remat counted a resize in place at the old size and a later restore failed
("restore source holds 262144 bytes, the evicted storage held 65536"), and a failed resize left the old value over
other memory (other bytes, or a segmentation fault).
Each program runs without remat and under budgets down to where it runs out; every run that finishes must match
the first byte for byte, and some budget must recompute.
"""
import pytest
import torch

import oracle
import remat

# torch warns that resizing a non-empty out= argument is deprecated; programs still do it.
pytestmark = pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")


def _mm_out(y):
    torch.mm(torch.randn(256, 64), torch.randn(64, 256), out=y)  # 64x256 to 256x256


def _cat_out(y):
    torch.cat([y * 1, y * 2, y.sin(), y.cos()], 0, out=y)


def _resize_and_fill(y):
    y.resize_(256, 256)
    y[64:].fill_(0.5)


def _shrink(y):
    y.resize_(32, 256)  # a storage keeps its bytes when a tensor shrinks


def program(resize, budget=None):
    torch.manual_seed(0)
    a = torch.randn(64, 64, requires_grad=True)
    b = torch.randn(64, 256)
    session = remat.enable(budget, costs="estimated") if budget else None
    try:
        h = torch.mm(a, b).tanh()
        with torch.no_grad():
            y = h.detach() * 3  # recomputable, then resized
            resize(y)
        z = (h.sum(0) * y.sum(0)).sin()
        pressure = [torch.randn(256, 256).exp() for _ in range(8)]
        loss = (y * 2).sum() + z.sum() + sum(p.sum() for p in pressure)
        loss.backward()
        results = [y.clone(), z.detach().clone(), loss.detach().clone(), a.grad.clone()]
        stats = remat.stats() if session else None
    finally:
        if session:
            remat.disable()
    return results, stats


@pytest.mark.parametrize("resize", [_mm_out, _cat_out, _resize_and_fill, _shrink],
                         ids=["mm_out", "cat_out", "resize_and_fill", "shrink"])
def test_a_resized_storage_keeps_its_new_size(resize):
    expected, _ = program(resize)
    recomputed, trained = 0, []
    for mib in (2, 1.2, 1.0, 0.8, 0.7):
        try:
            got, stats = program(resize, int(mib * (1 << 20)))
        except torch.OutOfMemoryError:
            continue
        for k, (want, have) in enumerate(zip(expected, got)):
            assert oracle.same_bytes(want, have), f"result {k} differs at {mib} MiB"
        recomputed += stats["rematerializations"]
        trained.append(mib)
    assert len(trained) >= 3 and recomputed > 0, f"trained at {trained}, {recomputed} recomputations: shows nothing"


def test_an_in_place_write_of_an_evicted_storage_is_not_a_resize():
    """An evicted storage's size reads 0 until remat brings it back for the op: the write keeps it evictable (the
    first version of the check took the size before the restore, pinned the value, and a later replay of
    torchvision's DeepLabV3 failed with 'replay of aten::hardswish_: input 0 is not resident')."""
    torch.manual_seed(0)
    with remat.enable(3 << 20, costs="estimated"):
        x = torch.randn(256, 1024).tanh()  # 1 MiB, recomputable
        evictions = remat.stats()["evictions"]
        filler = torch.empty(5 << 19, dtype=torch.uint8)  # 2.5 MiB, uninitialized: a constant, so x must go
        assert remat.stats()["evictions"] > evictions
        del filler
        pinned = remat.stats()["pinned_outputs"]
        x.relu_()
        assert remat.stats()["pinned_outputs"] == pinned
        got = x.clone()
    torch.manual_seed(0)
    assert oracle.same_bytes(torch.randn(256, 1024).tanh().relu_(), got)


def test_an_out_argument_made_empty_stays_recomputable():
    """torch's advice for out= (an empty tensor, resized by the op) gives a fresh value, evictable like any other
    output: only a resize of a value that already was one is kept."""
    with remat.enable(1 << 30, costs="estimated"):
        a, b = torch.randn(64, 64).tanh(), torch.randn(64, 64).tanh()
        out = torch.empty(0)
        pinned = remat.stats()["pinned_outputs"]
        torch.mm(a, b, out=out)
        assert remat.stats()["pinned_outputs"] == pinned


def _failing_index_select(y):
    """An op that resizes its out= argument and then fails (the index is out of range): the program catches the
    error and goes on with y, 3 x 256 now, as torch left it (its new rows uninitialized)."""
    try:
        torch.index_select(torch.randn(10, 256), 0, torch.tensor([0, 99, 1]), out=y)
    except IndexError:
        pass


def test_a_storage_resized_by_an_op_that_then_failed_keeps_its_new_size():
    def run(budget=None):
        torch.manual_seed(0)
        session = remat.enable(budget, costs="estimated") if budget else None
        try:
            y = torch.randn(1, 256).tanh()  # recomputable, 1 KiB
            _failing_index_select(y)
            y.fill_(0.5).add_(torch.arange(3.0).unsqueeze(1))  # rows 1 and 2 were uninitialized
            z = y.sin()
            pressure = [torch.randn(256, 256).exp() for _ in range(6)]
            result = [y.clone(), z.clone(), sum(p.sum() for p in pressure)]
            stats = remat.stats() if session else None
        finally:
            if session:
                remat.disable()
        return result, stats
    expected, _ = run()
    trained = []
    for kib in (1024, 896, 768, 640):
        try:
            got, stats = run(kib << 10)
        except torch.OutOfMemoryError:
            continue
        for k, (want, have) in enumerate(zip(expected, got)):
            assert oracle.same_bytes(want, have), f"result {k} differs at {kib} KiB"
        trained.append((kib, stats["evictions"]))
    assert len(trained) >= 2 and any(evictions > 0 for _, evictions in trained), trained


@pytest.mark.parametrize("write", ["scatter_", "index_put_", "index_fill_"])
def test_a_storage_an_op_wrote_before_it_failed_keeps_what_it_holds(write):
    """scatter_, index_put_ and index_fill_ with an out-of-range index write the elements before it, then fail: a
    program that catches the error goes on with those writes in the tensor; remat must not bring back the value from
    before the op when it evicts the tensor and needs it again."""
    index = torch.tensor([0, 1, 99, 3])

    def run(budget=None):
        torch.manual_seed(0)
        session = remat.enable(budget, costs="estimated") if budget else None
        try:
            y = torch.randn(512, 512).tanh()  # recomputable, 1 MiB
            flat = y.view(-1)
            try:
                if write == "scatter_":
                    flat.scatter_(0, index, torch.full((4,), 7.0))
                elif write == "index_put_":
                    flat.index_put_((index,), torch.full((4,), 7.0))
                else:
                    flat.index_fill_(0, index, 7.0)
            except (IndexError, RuntimeError):
                pass
            evictions = remat.stats()["evictions"] if session else 0
            filler = torch.empty(2 << 20, dtype=torch.uint8)  # uninitialized, a constant: only y can make room
            filler.fill_(1)
            evicted = (remat.stats()["evictions"] - evictions) if session else 0
            del filler
            result = [y.clone(), y.sin()]
        finally:
            if session:
                remat.disable()
        return result, evicted
    expected, _ = run()
    assert expected[0].view(-1)[0].item() == 7.0, "the op wrote before it failed (as torch 2.14 does)"
    got, evicted = run(int(2.5 * (1 << 20)))
    for k, (want, have) in enumerate(zip(expected, got)):
        assert oracle.same_bytes(want, have), f"result {k} differs (y evicted: {evicted} eviction(s))"
