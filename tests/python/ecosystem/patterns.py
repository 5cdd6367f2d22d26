"""Training patterns that span more than one forward and backward: a step that first fails in a kernel and is then
run again (as a loop that catches an error and retries does), knowledge distillation from a teacher run under
inference_mode, stochastic weight averaging with its batch-norm refresh, a parameter's data swapped mid-run, random
ops drawing from generators of their own (Gumbel-softmax among them), a scripted ensemble run with torch.jit.fork on
the inter-op pool, a module exported with torch.export and trained, a dynamically quantized frozen body under a
trained head, sparse CSR products, and an RNN cell unrolled by hand."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from .frontends import ce_loss, deep_mlp
from .harness import std_step


def adam(m):
    return torch.optim.Adam(m.parameters(), 1e-3)


def mlp_data(n=256, d=128, classes=8):
    return torch.randn(n, d), torch.randint(0, classes, (n,))


# 1. a forward that fails in a kernel (a shape error), caught, then the real step
def retry_build():
    m = deep_mlp()
    return m, adam(m), mlp_data()


def retry_step(model, opt, data, i):
    opt.zero_grad()
    h = model[0](data[0])
    try:
        torch.mm(h, torch.ones(3, 3))  # wrong shape: the kernel raises after its inputs were brought back
    except RuntimeError:
        pass
    try:
        model(data[0][:, :100])  # fails inside the first Linear, in the middle of a forward
    except RuntimeError:
        pass
    return std_step(ce_loss)(model, opt, data, i)


# 2. distillation: a teacher's logits under inference_mode, the student trained on them
def distill_build():
    teacher, student = deep_mlp(depth=6), deep_mlp(depth=3)
    teacher.eval()
    return nn.ModuleDict({"teacher": teacher, "student": student}), adam(student), mlp_data()


def distill_step(model, opt, data, i):
    opt.zero_grad()
    with torch.inference_mode():
        soft = F.softmax(model["teacher"](data[0]) / 2.0, dim=-1)
    logits = model["student"](data[0])
    loss = F.kl_div(F.log_softmax(logits / 2.0, -1), soft.clone(), reduction="batchmean") + F.cross_entropy(logits,
                                                                                                            data[1])
    loss.backward()
    opt.step()
    return loss


# 3. stochastic weight averaging: AveragedModel updated every step, its batch norm refreshed by update_bn
def swa_build():
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                        nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64, 10))
    swa = torch.optim.swa_utils.AveragedModel(net)
    x = torch.randn(16, 3, 24, 24)
    return nn.ModuleDict({"net": net, "swa": swa}), torch.optim.SGD(net.parameters(), 0.05, momentum=0.9), (
        x, torch.randint(0, 10, (16,)))


def swa_step(model, opt, data, i):
    loss = std_step(lambda m, d: F.cross_entropy(m["net"](d[0]), d[1]))(model, opt, data, i)
    model["swa"].update_parameters(model["net"])
    loader = [data[0][:8], data[0][8:]]
    torch.optim.swa_utils.update_bn(loader, model["swa"])
    return loss + model["swa"](data[0]).sum() * 0


# 4. a parameter's data replaced mid-run (weight surgery, re-initialisation of a layer)
def swap_build():
    m = deep_mlp()
    return m, torch.optim.SGD(m.parameters(), 0.01, momentum=0.9), mlp_data()


def swap_step(model, opt, data, i):
    loss = std_step(ce_loss)(model, opt, data, i)
    with torch.no_grad():
        w = model[1].a.weight
        w.data = w.data.flip(0).contiguous()
        model[2].b.bias.data.mul_(0.5)
    return loss


# 5. random ops with generators of their own, and Gumbel-softmax (exponential_ into empty_like)
class OwnGenerators(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head = deep_mlp(depth=2), nn.Linear(8, 8)
        self.gen = torch.Generator().manual_seed(7)

    def forward(self, x):
        h = self.body(x + 0.1 * torch.randn(x.shape, generator=self.gen))
        keep = torch.bernoulli(torch.full_like(h, 0.8), generator=self.gen)
        g = F.gumbel_softmax(h * keep, tau=0.5, hard=True)
        order = torch.randperm(h.shape[0], generator=self.gen)
        picks = torch.multinomial(F.softmax(h, -1), 2, generator=self.gen)
        return self.head(g[order]) + h.gather(1, picks).sum(1, keepdim=True)


def generators_build():
    m = OwnGenerators()
    return m, adam(m), mlp_data()


# 6. a scripted ensemble whose members run with torch.jit.fork (on the inter-op thread pool)
class Member(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = deep_mlp(depth=2)

    def forward(self, x):
        return self.net(x)


class ForkedEnsemble(nn.Module):
    def __init__(self):
        super().__init__()
        self.members = nn.ModuleList([Member() for _ in range(3)])

    def forward(self, x):
        futures = [torch.jit.fork(member, x) for member in self.members]
        return torch.stack([torch.jit.wait(f) for f in futures]).mean(0)


def fork_build():
    m = torch.jit.script(ForkedEnsemble())
    data = mlp_data()
    for _ in range(3):  # the profiling executor's warm-up, as in frontends.script_build
        ce_loss(m, data).backward()
    m.zero_grad(set_to_none=True)
    return m, adam(m), data


# 7. a module captured by torch.export and trained through its unlifted module
def export_build():
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.GELU(), nn.Conv2d(16, 16, 3, padding=1), nn.SiLU(),
                        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64, 10))
    x = torch.randn(8, 3, 24, 24)
    m = torch.export.export(net, (x,)).module()
    return m, adam(m), (x, torch.randint(0, 10, (8,)))


# 8. a dynamically quantized frozen body (quantized::linear_dynamic, packed weights) under a trained head
class QuantizedBody(nn.Module):
    def __init__(self):
        super().__init__()
        body = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU())
        self.body = torch.ao.quantization.quantize_dynamic(body, {nn.Linear}, dtype=torch.qint8)
        self.head = deep_mlp(depth=2)

    def forward(self, x):
        return self.head(self.body(x))


def quant_build():
    m = QuantizedBody()
    return m, torch.optim.Adam(m.head.parameters(), 1e-3), mlp_data()


# 9. sparse CSR matrices: a fixed sparse adjacency (graph convolution) and a CSR made from activations
class GraphConv(nn.Module):
    def __init__(self, n=256):
        super().__init__()
        dense = (torch.rand(n, n) < 0.05).float()
        self.register_buffer("adj", (dense + torch.eye(n)).to_sparse_csr())
        self.l1, self.l2 = nn.Linear(128, 128), nn.Linear(128, 8)

    def forward(self, x):
        h = torch.relu(self.adj @ self.l1(x))
        return self.l2(self.adj @ h)


def graph_build():
    m = GraphConv()
    return m, adam(m), mlp_data()


# 10. an LSTMCell and a GRUCell unrolled over 24 steps in Python (many small ops, state carried across steps)
class Unrolled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm, self.gru, self.out = nn.LSTMCell(32, 64), nn.GRUCell(64, 64), nn.Linear(64, 8)

    def forward(self, x):
        h = c = g = torch.zeros(x.shape[1], 64)
        for t in range(x.shape[0]):
            h, c = self.lstm(x[t], (h, c))
            g = self.gru(h, g)
        return self.out(g)


def unrolled_build():
    m = Unrolled()
    return m, adam(m), (torch.randn(24, 64, 32), torch.randint(0, 8, (64,)))


# 11. a mean teacher copied with copy.deepcopy while remat is on, updated by an EMA of the student
def mean_teacher_build():
    m = deep_mlp()
    return nn.ModuleDict({"student": m}), adam(m), mlp_data()


def mean_teacher_step(model, opt, data, i):
    if "teacher" not in model:
        model["teacher"] = copy.deepcopy(model["student"]).requires_grad_(False)
    opt.zero_grad()
    out = model["student"](data[0])
    with torch.no_grad():
        target = model["teacher"](data[0] + 0.01).argmax(-1)
    loss = F.cross_entropy(out, data[1]) + 0.5 * F.cross_entropy(out, target)
    loss.backward()
    opt.step()
    with torch.no_grad():
        torch._foreach_lerp_(list(model["teacher"].parameters()), list(model["student"].parameters()), 0.1)
    return loss


# 12. truncated backpropagation through time: the hidden state, detached, carried from step to step
class Carry(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm, self.out = nn.LSTM(32, 96, num_layers=2), nn.Linear(96, 8)
        self.state = None

    def forward(self, x):
        y, state = self.lstm(x, self.state)
        self.state = tuple(s.detach() for s in state)
        return self.out(y[-1])


def tbptt_build():
    m = Carry()
    return m, adam(m), (torch.randn(20, 48, 32), torch.randint(0, 8, (48,)))


def tbptt_step(model, opt, data, i):
    x = data[0] + 0.1 * i  # each step a new chunk of the sequence
    return std_step(ce_loss)(model, opt, (x, data[1]), i)


# 13. adversarial training: three steps of projected gradient ascent on the input, then the step on the result
def pgd_step(model, opt, data, i):
    x, y = data
    delta = torch.zeros_like(x, requires_grad=True)
    for _ in range(3):
        (g,) = torch.autograd.grad(ce_loss(model, (x + delta, y)), delta)
        delta = (delta + 0.01 * g.sign()).clamp(-0.03, 0.03).detach().requires_grad_(True)
    return std_step(ce_loss)(model, opt, (x + delta.detach(), y), i)


def pgd_build():
    m = deep_mlp()
    return m, torch.optim.SGD(m.parameters(), 0.01, momentum=0.9), mlp_data()


# 14. MAML: an inner step through torch.func.functional_call with create_graph, the outer loss through it
def maml_step(model, opt, data, i):
    params = dict(model.named_parameters())
    support, query = (data[0][:128], data[1][:128]), (data[0][128:], data[1][128:])
    inner = F.cross_entropy(torch.func.functional_call(model, params, (support[0],)), support[1])
    grads = torch.autograd.grad(inner, list(params.values()), create_graph=True)
    adapted = {k: v - 0.1 * g for (k, v), g in zip(params.items(), grads)}
    opt.zero_grad()
    loss = F.cross_entropy(torch.func.functional_call(model, adapted, (query[0],)), query[1])
    loss.backward()
    opt.step()
    return loss


def maml_build():
    m = deep_mlp(depth=2)
    return m, adam(m), mlp_data()


# 15. MoCo: a key encoder updated by momentum and a queue of keys (a buffer) overwritten in place every step
class MoCo(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k = deep_mlp(depth=2), deep_mlp(depth=2)
        self.k.load_state_dict(self.q.state_dict())
        self.k.requires_grad_(False)
        self.register_buffer("queue", F.normalize(torch.randn(512, 8), dim=1))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        q = F.normalize(self.q(x), dim=1)
        with torch.no_grad():
            for pk, pq in zip(self.k.parameters(), self.q.parameters()):
                pk.mul_(0.9).add_(pq.detach(), alpha=0.1)
            k = F.normalize(self.k(x.flip(0)), dim=1)
        logits = torch.cat([(q * k).sum(1, keepdim=True), q @ self.queue.clone().t()], 1)  # the queue is overwritten below / 0.07
        with torch.no_grad():
            start = int(self.ptr)
            self.queue[start:start + k.shape[0]] = k
            self.ptr.fill_((start + k.shape[0]) % self.queue.shape[0])
        return F.cross_entropy(logits, torch.zeros(x.shape[0], dtype=torch.long))


def moco_build():
    m = MoCo()
    return m, torch.optim.SGD(m.q.parameters(), 0.03, momentum=0.9), mlp_data(n=128)


# 16. parameters flattened into one vector and written back (parameters_to_vector / vector_to_parameters)
def flat_step(model, opt, data, i):
    loss = std_step(ce_loss)(model, opt, data, i)
    with torch.no_grad():
        flat = torch.nn.utils.parameters_to_vector(model.parameters())
        torch.nn.utils.vector_to_parameters(flat * 0.999, model.parameters())
    return loss


def flat_build():
    m = deep_mlp()
    return m, torch.optim.SGD(m.parameters(), 0.01), mlp_data()


# 17. a zoo of losses (weights, ignore_index, label smoothing, pos_weight, margins, log targets)
class LossZoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = deep_mlp(depth=2)

    def forward(self, x, y):
        h = self.body(x)
        a, b = h[:, :4], h[:, 4:]
        target = torch.where(y % 5 == 0, torch.full_like(y, -100), y)
        sign = (y % 2) * 2 - 1
        return (F.cross_entropy(h, y, label_smoothing=0.1) + F.nll_loss(h.log_softmax(-1), target, ignore_index=-100,
                                                                        weight=torch.linspace(0.5, 1.5, 8))
                + F.binary_cross_entropy_with_logits(a, (b > 0).float(), pos_weight=torch.full((4,), 2.0))
                + F.margin_ranking_loss(a[:, 0], b[:, 0], sign.float()) + F.triplet_margin_loss(a, b, a.flip(0))
                + F.cosine_embedding_loss(a, b, sign.float()) + F.huber_loss(a, b) + F.smooth_l1_loss(a, b, beta=0.5)
                + F.poisson_nll_loss(a, b.exp()) + F.gaussian_nll_loss(a, b, a.exp())
                + F.multilabel_soft_margin_loss(h, (h > 0).float()) + F.multi_margin_loss(h, y)
                + F.kl_div(a.log_softmax(-1), b.log_softmax(-1), log_target=True, reduction="batchmean")
                + F.hinge_embedding_loss(a, sign[:, None].float().expand_as(a)))


def losses_build():
    m = LossZoo()
    return m, adam(m), mlp_data()


# 18. shape ops with their backward: fold/unfold, pixel (un)shuffle, antialiased interpolation, roll, flip,
# as_strided, channel shuffle, a tensor set_ onto another's storage
class ShapeZoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(4, 8, 3, padding=1)
        self.head = nn.Linear(8 * 16 * 16 + 144, 10)

    def forward(self, x):
        h = torch.relu(self.c1(x))  # N, 16, 32, 32
        h = F.pixel_shuffle(F.pixel_unshuffle(h, 2), 2).roll(3, dims=-1).flip(-2)
        h = F.channel_shuffle(h, 4)
        small = F.interpolate(h, size=(16, 16), mode="bilinear", antialias=True, align_corners=False)
        patches = F.unfold(small, 2, stride=2)
        back = F.fold(patches * 0.5, (16, 16), 2, stride=2)
        y = torch.relu(self.c2(back[:, :4]))
        diag = y.as_strided((y.shape[0], 144), (y.stride(0), 1), 3).sin()
        alias = torch.empty(0).set_(y.untyped_storage(), y.storage_offset(), y.shape, y.stride())
        return self.head(torch.cat([alias.flatten(1) * 1.0, diag], 1))


def shapes_build():
    m = ShapeZoo()
    return m, adam(m), (torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))


PROGRAMS = {
    "retry_after_kernel_error": (retry_build, retry_step),
    "distill_inference_mode": (distill_build, distill_step),
    "swa_update_bn": (swa_build, swa_step),
    "param_data_swap": (swap_build, swap_step),
    "own_generators_gumbel": (generators_build, std_step(ce_loss)),
    "jit_fork_ensemble": (fork_build, std_step(ce_loss)),
    "export_unlifted": (export_build, std_step(ce_loss)),
    "dynamic_quant_body": (quant_build, std_step(ce_loss)),
    "sparse_csr_graph": (graph_build, std_step(ce_loss)),
    "unrolled_cells": (unrolled_build, std_step(ce_loss)),
    "mean_teacher_deepcopy": (mean_teacher_build, mean_teacher_step),
    "tbptt_carry": (tbptt_build, tbptt_step),
    "pgd_adversarial": (pgd_build, pgd_step),
    "maml_inner_loop": (maml_build, maml_step),
    "moco_queue": (moco_build, std_step(lambda m, d: m(d[0]))),
    "vector_to_parameters": (flat_build, flat_step),
    "loss_zoo": (losses_build, std_step(lambda m, d: m(*d))),
    "shape_ops_zoo": (shapes_build, std_step(ce_loss)),
}
