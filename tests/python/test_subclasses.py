"""Python tensor subclasses that hold real tensors under remat (integration/subclass_arguments.h, remat/_subclasses.py):
an op on one runs on its inner tensors inside __torch_dispatch__, where remat's hook cannot see. What it writes
there must pin what recorded ops computed from the old bytes (DTensor parameters updated in place by the optimizer,
read by the forward through to_local()), and what it reads there must be brought back and stay in place while it
runs (a subclass wrapping a result remat evicted). Every run is compared byte for byte with the run without remat."""
import os
import socket

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._pytree import tree_map

import oracle
import remat
from ecosystem.harness import HUGE, required_bytes, run


class Unwrapping(torch.Tensor):
    """A wrapper over one inner tensor whose ops run on it and return plain tensors (views of it for view ops), and
    whose in-place ops write it: what a parameter container or a quantized-weight subclass does."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(), dtype=inner.dtype,
                                                   requires_grad=False)

    def __init__(self, inner):
        self.inner = inner

    def __repr__(self):
        return f"Unwrapping({self.inner!r})"

    def __tensor_flatten__(self):
        return ["inner"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, size, stride):
        return Unwrapping(inner["inner"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            return Unwrapping(args[0].inner)
        unwrap = lambda t: t.inner if isinstance(t, Unwrapping) else t  # noqa: E731
        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        if func._schema.is_mutable and isinstance(args[0], Unwrapping):
            return args[0]
        return out


class WrappedWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(Unwrapping(torch.randn(512, 128) * 0.05))
        self.w2 = nn.Parameter(Unwrapping(torch.randn(512, 512) * 0.05))
        self.out = nn.Linear(512, 10)

    def forward(self, x):
        h = torch.tanh(x @ self.w1.t())
        h = torch.tanh(h @ self.w2.t())
        return self.out(torch.tanh(h @ self.w2.t()))


def wrapped_build():
    m = WrappedWeights()
    return m, torch.optim.SGD(m.parameters(), 0.05), (torch.randn(1024, 128), torch.randint(0, 10, (1024,)))


def ce_step(model, opt, data, i):
    opt.zero_grad()
    loss = F.cross_entropy(model(data[0]), data[1])
    loss.backward()
    opt.step()
    return loss


def train_at(build, step, fractions):
    """Trains at each fraction of the peak; every run must match the run without remat. Returns the
    rematerializations of each."""
    expected, _ = run(build, step)
    _, unconstrained = run(build, step, HUGE)
    recomputed = []
    for fraction in fractions:
        got, stats = run(build, step, int(unconstrained["peak_allocated_bytes"] * fraction))
        oracle.assert_identical(expected, got, f"at {fraction} of the peak")
        recomputed.append(stats["rematerializations"])
    return recomputed


def test_an_optimizer_writing_a_subclass_parameter_pins_what_was_computed_from_its_old_value():
    # SGD's add_ on an Unwrapping parameter writes its inner tensor inside __torch_dispatch__; the forward's matmuls
    # read that tensor through t()'s plain view. Without the pinning the gradients replayed after the first write
    # read the new weights (10 observables differed at 0.7).
    recomputed = train_at(wrapped_build, ce_step, (0.9, 0.7))
    assert recomputed[1] > 0


def test_required_bytes_counts_a_wrapper_subclass_by_its_inner_tensors():
    # A wrapper subclass has no memory of its own (its storage has no data): RequiredBytes reads its inner tensors.
    bound = required_bytes(wrapped_build, ce_step)
    _, unconstrained = run(wrapped_build, ce_step, HUGE)
    parameters = sum(p.numel() * p.element_size() for p in wrapped_build()[0].parameters())
    assert 3 * parameters <= bound <= unconstrained["peak_allocated_bytes"]  # weights, gradients, new gradients


def test_a_subclass_op_reads_a_result_remat_evicted_from_under_it():
    # The subclass wraps a recorded result; the program then fills the budget so remat evicts it. An op on the
    # subclass reads it inside __torch_dispatch__: it must be brought back (and stay in place while it runs), as a
    # plain op's input is.
    torch.manual_seed(0)
    x, w = torch.randn(1024, 256), torch.randn(256, 1024) * 0.05
    expected = torch.tanh(x @ w) * 2
    with remat.enable(12 << 20, costs="estimated"):
        wrapped = Unwrapping(torch.tanh(x @ w))  # 4 MiB, recorded
        kept = [torch.sigmoid(x @ (w * (k + 2))) for k in range(3)]
        evicted = remat.stats()["evictions"]
        doubled = wrapped * 2
        same = oracle.same_bytes(doubled, expected)
        del kept
    assert evicted > 0
    assert same


class JaggedPooling(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.mid, self.out = nn.Linear(64, 256), nn.Linear(256, 256), nn.Linear(256, 10)

    def forward(self, sequences):
        nested = torch.nested.as_nested_tensor(sequences, layout=torch.jagged)
        h = torch.relu(self.inp(nested))
        h = torch.tanh(self.mid(h)) + h
        return self.out(torch.stack([t.mean(0) for t in h.unbind()]))


def jagged_build():
    m = JaggedPooling()
    g = torch.Generator().manual_seed(3)
    sequences = [torch.randn(int(n), 64, generator=g) for n in torch.randint(50, 400, (24,), generator=g)]
    return m, torch.optim.Adam(m.parameters(), 1e-3), (sequences, torch.randint(0, 10, (24,)))


def test_a_jagged_nested_tensor_model_trains_at_its_peak_while_remat_evicts():
    # A jagged nested tensor is a Python subclass whose ragged size is a nested int. Its offsets come from recorded
    # ops, so remat may evict them; unbind's backward read them inside the subclass: "setStorage: ... out of bounds
    # for storage of size 0" before the hook held them. What the subclass computes inside is memory remat does not
    # know, so below the peak it runs out (0.95).
    recomputed = train_at(jagged_build, ce_step, (1.0,))
    assert recomputed[0] > 0


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("wrap_activation", [False, True], ids=["to_local", "to_local_and_from_local"])
def test_dtensor_parameters_read_through_to_local_train_identically(one_rank_group, wrap_activation):
    # Tensor-parallel style: the parameters are DTensors (one rank, replicated) and the forward computes on their
    # local tensors (to_local()); SGD's updates run on the DTensors. Without the pinning, 0.9 differed. With
    # wrap_activation the last activation, a recorded result, is wrapped back into a DTensor (from_local) and scaled.
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
    mesh = one_rank_group

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Parameter(distribute_tensor(torch.randn(512, 128) * 0.05, mesh, [Replicate()]))
            self.w2 = nn.Parameter(distribute_tensor(torch.randn(512, 512) * 0.05, mesh, [Replicate()]))
            self.out = nn.Linear(512, 10)

        def forward(self, x):
            w1, w2 = self.w1.to_local(), self.w2.to_local()
            h = torch.tanh(x @ w1.t())
            h = torch.tanh(h @ w2.t())
            h = torch.tanh(h @ w2.t())
            if wrap_activation:
                h = (DTensor.from_local(h, mesh, [Replicate()]) * 1.5).to_local()
            return self.out(h)

    def build():
        m = Net()
        return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), (torch.randn(1024, 128),
                                                                       torch.randint(0, 10, (1024,)))
    train_at(build, ce_step, (0.9, 0.85, 0.8))
