"""remat.bound.RequiredBytes, the lower bound the tests use to tell a budget remat fails at from one no
drop-and-recompute runtime can meet: what it must count (the module's docstring says why each is undroppable)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import remat
from remat.bound import RequiredBytes

HUGE = 4 << 30


def nbytes(tensors):
    return sum(t.untyped_storage().nbytes() for t in tensors)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.Tanh(), nn.Linear(512, 256))


def test_gradients_stay_undroppable_after_the_step_until_the_next_forward():
    # After optimizer.step() the gradients were computed from the parameters' old values: an op between the step
    # and the next forward (here a flattened copy of the parameters) runs with every gradient resident.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.01)
    x = torch.randn(64, 256)
    with RequiredBytes(model, opt, outside=[x]) as bound:
        for _ in range(2):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            with torch.no_grad():
                flat = torch.nn.utils.parameters_to_vector(model.parameters())
                scaled = flat * 0.5
            del flat, scaled
    params = nbytes(model.parameters())
    assert bound.required_bytes >= 3 * params, (bound.required_bytes, params, bound.at_op)  # gradients, flat, scaled


def test_parameters_the_program_made_count_once_stepped():
    # vector_to_parameters makes the parameters views of a vector made while measuring: once the optimizer wrote them
    # in place, nothing can recompute them, so every later op runs with them resident.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.01)
    x = torch.randn(64, 256)
    with torch.no_grad():
        base = torch.nn.utils.parameters_to_vector(model.parameters()).clone()
    with RequiredBytes(model, opt, outside=[x, base]) as bound:
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(base * 1.0, model.parameters())  # parameters in a new storage
        for _ in range(2):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    params = nbytes([base])
    # At the second backward: the parameters (one storage, stepped) and each weight gradient the op writes.
    assert bound.pinned_at_max >= params, (bound.pinned_at_max, params, bound.at_op)


def test_a_storage_placed_where_an_outside_one_died_counts():
    # Storages that existed before the measurement do not count, but only while they live: a later storage at a dead
    # one's address is the program's (vector_to_parameters frees the old parameters, and a gradient may then land at
    # one's address). Two storages over one Python buffer share its address for sure; an allocator only maybe.
    buffer = bytearray(4096)
    model = nn.Linear(4, 4)
    before = [torch.frombuffer(buffer, dtype=torch.float32)]
    bound = RequiredBytes(model, outside=before)
    with bound:
        before.clear()  # the outside storage dies while measured
        made = torch.frombuffer(buffer, dtype=torch.float32)  # a new storage at the dead one's address
        doubled = made * 2
    assert bound.required_bytes >= nbytes([made, doubled]), (bound.required_bytes, bound.at_op)


def test_optimizer_state_that_died_no_longer_counts():
    # The undroppable set is rescanned at the forward and the step only: state dropped in between (a new state
    # loaded, an optimizer replaced) is gone from memory, and the bound must not count it.
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), 0.01, momentum=0.9)
    opt.state[model.weight]["momentum_buffer"] = torch.zeros(1024)  # as a first step would have made it
    x = torch.randn(1024)
    with RequiredBytes(model, opt, outside=[x]) as bound:
        opt.state.clear()
        doubled = x * 2
    assert bound.pinned_at_max == 0 and bound.required_bytes == nbytes([doubled]), (bound.pinned_at_max,
                                                                                   bound.required_bytes)


def conv_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def conv_bound():
    model = conv_net()
    opt = torch.optim.SGD(model.parameters(), 0.01, momentum=0.9)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    with RequiredBytes(model, opt, outside=[x, y]) as bound:
        for _ in range(2):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return bound


def test_a_kernels_own_buffers_count_when_measured_under_remat():
    # Convolution's backward allocates buffers of its own while it runs: only remat's arena sees them, so under a
    # budget that never binds the bound counts them, and without remat it cannot.
    plain = conv_bound()
    with remat.enable(HUGE, costs="estimated"):
        measured = conv_bound()
    assert plain.kernel_bytes_at_max == 0
    assert measured.kernel_bytes_at_max > 0, measured.at_op
    assert measured.required_bytes >= plain.required_bytes + measured.kernel_bytes_at_max // 2, (
        plain.required_bytes, measured.required_bytes, measured.kernel_bytes_at_max, measured.at_op)


def test_the_gradient_made_last_was_made_beside_the_others():
    # Two bias-free layers, plain SGD (no state). Before the step both gradients are resident; whichever a runtime
    # makes last, its op ran beside the other gradient: gW2 = grad_out^T @ h1 (1 MiB, reading 32 KiB + 32 KiB) and
    # gW1 = grad_h1^T @ x (512 KiB, reading grad_h1's 32 KiB; x is outside). Made in the best order (gW2 first, as
    # its op holds the most beyond what it leaves), the second op holds 1 MiB + 32 KiB + 512 KiB: more than both
    # gradients during the step (1.5 MiB), which is all the bound counted before.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512, bias=False), nn.Linear(512, 512, bias=False))
    opt = torch.optim.SGD(model.parameters(), 0.01)
    x = torch.randn(16, 256)
    with RequiredBytes(model, opt, outside=[x]) as bound:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    KiB = 1024
    assert bound.required_bytes == 1024 * KiB + 32 * KiB + 512 * KiB, (bound.required_bytes, bound.at_op)
    assert bound.at_op.startswith("aten.mm.default (making a gradient"), bound.at_op


def test_the_input_made_last_was_made_beside_the_others():
    # add(a * b, c * d) with four 1 MiB activations: when the add runs, one product was made last, and its multiply
    # read two 1 MiB factors and wrote 1 MiB while the other product (1 MiB) was resident: 4 MiB, where the add
    # itself holds only 3 MiB (its two inputs and its output).
    MiB = 1 << 20
    model = nn.Linear(256, 256)
    x = torch.randn(MiB // 1024, 256)
    with RequiredBytes(model, outside=[x]) as bound:
        with torch.no_grad():
            a, b, c, d = (torch.sin(x + k) for k in range(4))
            left = a * b
            del a, b
            right = c * d
            del c, d
            total = left + right
    assert total.untyped_storage().nbytes() == MiB
    assert bound.required_bytes == 4 * MiB, (bound.required_bytes, bound.at_op)
    assert bound.at_op.startswith("aten.add.Tensor (its input made last, by aten.mul.Tensor"), bound.at_op


def _bound_with_kept_activations(read_after_step):
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(4)])
    opt = torch.optim.SGD(model.parameters(), 0.01)
    x = torch.randn(128, 256)
    kept = []
    for block in model:
        block.register_forward_hook(lambda module, inputs, out: kept.append(out))
    with RequiredBytes(model, opt, outside=[x]) as bound:
        for _ in range(2):
            kept.clear()
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            if read_after_step:
                logged = sum(k.sum() for k in kept)  # a user logging the activations after the step
                del logged
    return bound, nbytes(kept), nbytes(model.parameters())


def test_results_read_after_the_step_count_beside_the_gradients():
    # Each kept activation was computed from the first layer's weight, which the step overwrites: read after the step,
    # it was resident from that write on, beside every gradient.
    bound, kept, params = _bound_with_kept_activations(read_after_step=True)
    assert bound.required_bytes >= kept + params, (bound.required_bytes, kept, params, bound.at_op)
    assert "read after it" in bound.at_op, bound.at_op
    # Kept but never read again, they could stay dropped: the bound does not count them.
    unread, _, _ = _bound_with_kept_activations(read_after_step=False)
    assert unread.required_bytes < kept + params, (unread.required_bytes, kept, params, unread.at_op)
