"""Front ends and program shapes beyond eager nn.Modules: TorchScript (scripted, traced; this wheel's CPU fuser has
no LLVM backend, so no fused graph), Python dispatch modes around a step (FlopCounterMode, selective activation
checkpointing), forward-mode AD inside a loss, reparameterized sampling from torch.distributions, a GAN's two
optimizers, a hand-written SGD update, parametrizations, pruning masks, in-place random and clamping layers,
sorting and scattering ops with their backward."""
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import std_step


class Block(nn.Module):
    def __init__(self, d=128):
        super().__init__()
        self.a, self.b = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.b(torch.tanh(self.a(x)) * torch.sigmoid(self.a(x)))


def deep_mlp(d=128, depth=4):
    return nn.Sequential(*[Block(d) for _ in range(depth)], nn.Linear(d, 8))


# 1. torch.jit.script (the profiling executor differentiates the graph after its warm-up runs)
def script_build():
    m = torch.jit.script(deep_mlp())
    data = (torch.randn(256, 128), torch.randint(0, 8, (256,)))
    for _ in range(3):  # the executor profiles, then optimizes: every run then starts from the optimized graph
        ce_loss(m, data).backward()
    m.zero_grad(set_to_none=True)
    return m, torch.optim.Adam(m.parameters(), 1e-3), data


def ce_loss(m, d):
    return F.cross_entropy(m(d[0]), d[1])


# 2. torch.jit.trace of a conv net with batch norm
def trace_build():
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                        nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64, 10))
    x = torch.randn(8, 3, 32, 32)
    m = torch.jit.trace(net, x)
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), (x, torch.randint(0, 10, (8,)))


# 3. a whole step under FlopCounterMode (a Python dispatch mode sees every op first)
def flops_step(model, opt, data, i):
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False):
        return std_step(ce_loss)(model, opt, data, i)


def mlp_build():
    m = deep_mlp()
    return m, torch.optim.AdamW(m.parameters(), 1e-3), (torch.randn(256, 128), torch.randint(0, 8, (256,)))


# 4. selective activation checkpointing: save the matmuls, recompute the rest
class SacNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(128, 8)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
        ops = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default]
        context = functools.partial(create_selective_checkpoint_contexts, ops)
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False, context_fn=context)
        return self.head(x)


def sac_build():
    m = SacNet()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(256, 128), torch.randint(0, 8, (256,)))


# 5. forward-mode AD inside the loss: a Jacobian-vector-product penalty, then backward through it
def jvp_step(model, opt, data, i):
    from torch.func import jvp
    opt.zero_grad()
    x, y = data
    out, tangent = jvp(model, (x,), (torch.ones_like(x),))
    loss = F.cross_entropy(out, y) + 1e-3 * tangent.pow(2).mean()
    loss.backward()
    opt.step()
    return loss


def dual_step(model, opt, data, i):
    import torch.autograd.forward_ad as fwAD
    opt.zero_grad()
    x, y = data
    with fwAD.dual_level():
        out = model(fwAD.make_dual(x, torch.randn_like(x)))
        primal, tangent = fwAD.unpack_dual(out)
        loss = F.cross_entropy(primal, y) + 1e-3 * tangent.pow(2).mean()
    loss.backward()
    opt.step()
    return loss


# 6. torch.distributions: reparameterized Normal, Gamma, Dirichlet, relaxed categorical, Gumbel-softmax
class Sampler(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 4 * 16))
        self.dec = nn.Linear(16 * 4, 32)

    def forward(self, x):
        from torch import distributions as D
        mu, s, a, logits = self.enc(x).chunk(4, dim=1)
        z1 = D.Normal(mu, F.softplus(s) + 1e-3).rsample()
        z2 = D.Gamma(F.softplus(a) + 0.5, 1.0).rsample()
        z3 = D.Dirichlet(F.softplus(a) + 0.5).rsample()
        z4 = D.RelaxedOneHotCategorical(torch.tensor(0.5), logits=logits).rsample()
        z5 = F.gumbel_softmax(logits, tau=0.7, hard=True)
        kl = D.kl_divergence(D.Normal(mu, F.softplus(s) + 1e-3), D.Normal(0.0, 1.0)).mean()
        out = self.dec(torch.cat([z1, z2 + z3, z4, z5], 1))
        return F.mse_loss(out, x) + 1e-2 * kl


def dist_build():
    m = Sampler()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(128, 32),)


# 7. a GAN: the discriminator on detached fakes, then the generator through the discriminator
class Gan(nn.Module):
    def __init__(self):
        super().__init__()
        self.g = nn.Sequential(nn.Linear(16, 128), nn.LeakyReLU(0.2), nn.Linear(128, 128), nn.Tanh())
        self.d = nn.Sequential(nn.Linear(128, 128), nn.LeakyReLU(0.2), nn.Dropout(0.2), nn.Linear(128, 1))


class TwoOptimizers(torch.optim.Optimizer):
    """Adam for the discriminator and the generator, one object for the oracle to capture."""
    def __init__(self, gan):
        self.og = torch.optim.Adam(gan.g.parameters(), 2e-4, betas=(0.5, 0.999))
        self.od = torch.optim.Adam(gan.d.parameters(), 2e-4, betas=(0.5, 0.999))
        super().__init__(list(gan.parameters()), {})
        self.state = self.og.state | self.od.state

    def state_dict(self):
        g, d = self.og.state_dict()["state"], self.od.state_dict()["state"]
        return {"state": {**{f"g{k}": v for k, v in g.items()}, **{f"d{k}": v for k, v in d.items()}}}


def gan_build():
    m = Gan()
    return m, TwoOptimizers(m), (torch.randn(64, 128), torch.randn(64, 16))


def gan_step(model, opt, data, i):
    real, noise = data
    opt.od.zero_grad()
    fake = model.g(noise)
    ones, zeros = torch.ones(64, 1), torch.zeros(64, 1)
    d_loss = F.binary_cross_entropy_with_logits(model.d(real), ones) + \
        F.binary_cross_entropy_with_logits(model.d(fake.detach()), zeros)
    d_loss.backward()
    opt.od.step()
    opt.og.zero_grad()
    g_loss = F.binary_cross_entropy_with_logits(model.d(fake), ones)
    g_loss.backward()
    opt.og.step()
    opt.state = opt.og.state | opt.od.state
    return d_loss + g_loss


# 8. a hand-written SGD update in no_grad (no optimizer steps the parameters)
def manual_step(model, opt, data, i):
    loss = ce_loss(model, data)
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.05 * p.grad
            p.grad = None
    return loss


def manual_build():
    m = deep_mlp()
    return m, torch.optim.SGD(m.parameters(), 0.0), (torch.randn(256, 128), torch.randint(0, 8, (256,)))


# 9. parametrizations: orthogonal (matrix exponential), weight norm, and pruning masks
def param_build():
    from torch.nn.utils import parametrizations, prune
    m = deep_mlp()
    parametrizations.orthogonal(m[0].a)
    parametrizations.weight_norm(m[1].b)
    prune.l1_unstructured(m[2].a, "weight", amount=0.5)
    prune.random_unstructured(m[3].b, "weight", amount=0.3)
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(256, 128), torch.randint(0, 8, (256,)))


# 10. in-place random and clamping layers on activations
def inplace_build():
    m = nn.Sequential(nn.Linear(128, 256), nn.Dropout(0.3, inplace=True), nn.ReLU(inplace=True), nn.Linear(256, 256),
                      nn.Hardswish(inplace=True), nn.AlphaDropout(0.2), nn.Linear(256, 256), nn.Unflatten(1, (16, 4, 4)),
                      nn.Dropout2d(0.2, inplace=True), nn.Flatten(), nn.ReLU6(inplace=True),
                      nn.Linear(256, 256), nn.SELU(inplace=True), nn.FeatureAlphaDropout(0.1), nn.Linear(256, 8))
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), (torch.randn(256, 128), torch.randint(0, 8, (256,)))


# 11. sorting, top-k, cumulative and scattering ops, CTC, grid sampling, cdist
class Indexing(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 256)
        self.theta = nn.Linear(32, 6)
        self.rnn = nn.Linear(16, 11)

    def forward(self, x, idx):
        h = self.a(x)
        top, _ = h.topk(32, dim=1)
        srt, _ = h.sort(dim=1, descending=True)
        med = h.view(-1, 16, 16).median(dim=2).values
        cum = h.cumsum(1)[:, -8:] + h.logcumsumexp(1)[:, :8] + h[:, :64].cumprod(1)[:, :8].clamp(-5, 5)
        agg = torch.zeros(10, 256).index_add(0, idx, h) + torch.zeros(10, 256).scatter_reduce(
            0, idx[:, None].expand_as(h), h, "amax", include_self=False)
        img = torch.tanh(h).view(-1, 1, 16, 16)
        grid = F.affine_grid(self.theta(x).view(-1, 2, 3), (x.shape[0], 1, 8, 8), align_corners=False)
        warped = F.grid_sample(img, grid, align_corners=False)
        dist = torch.cdist(h[:, :32], h[:8, :32])
        logp = self.rnn(med).log_softmax(-1).unsqueeze(0).expand(16, -1, -1)
        tgt = (idx[:, None] % 10 + 1).expand(-1, 4)
        ctc = F.ctc_loss(logp, tgt, torch.full((x.shape[0],), 16), torch.full((x.shape[0],), 4))
        return top.mean() + srt[:, :4].mean() + cum.mean() + agg.pow(2).mean() + warped.mean() + dist.mean() + ctc


def indexing_build():
    m = Indexing()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(64, 32), torch.randint(0, 10, (64,)))


PROGRAMS = {
    "jit_script": (script_build, std_step(ce_loss)),
    "jit_trace_conv": (trace_build, std_step(ce_loss)),
    "flop_counter_mode": (mlp_build, flops_step),
    "selective_checkpoint": (sac_build, std_step(ce_loss)),
    "func_jvp_penalty": (mlp_build, jvp_step),
    "forward_ad_dual": (mlp_build, dual_step),
    "distributions_rsample": (dist_build, std_step(lambda m, d: m(d[0]))),
    "gan_two_optimizers": (gan_build, gan_step),
    "manual_sgd": (manual_build, manual_step),
    "parametrize_prune": (param_build, std_step(ce_loss)),
    "inplace_random_layers": (inplace_build, std_step(ce_loss)),
    "sort_scatter_ctc_grid": (indexing_build, std_step(lambda m, d: m(*d))),
}
