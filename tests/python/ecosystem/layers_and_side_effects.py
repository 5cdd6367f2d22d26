"""Layers and code with side effects: parametrizations that write buffers in forward, embedding max_norm, InstanceNorm
with running statistics, attention dropout, pooling with indices, activation checkpointing inside remat,
data-dependent shapes, explicit generators, saved-tensor hooks, QAT, EMA with optimizer-in-backward, anomaly mode
and exports, torch.save mid-step, jacrev, eval passes between steps, buffers updated in forward, GradScaler,
tensor subclasses."""
import io

import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import std_step

# 1. spectral norm parametrization (power iteration writes u, v in place in forward) + weight norm
def spectral_build():
    from torch.nn.utils import parametrizations as P
    m = nn.Sequential(P.spectral_norm(nn.Linear(32, 128)), nn.ReLU(), P.weight_norm(nn.Linear(128, 128)), nn.ReLU(),
                      nn.Linear(128, 8))
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(256, 32),)


# 2. embedding with max_norm (embedding_renorm_ writes the weight in place in forward)
class MaxNormEmb(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(500, 64, max_norm=1.0)
        self.lin = nn.Linear(64, 64)
        self.out = nn.Linear(64, 4)

    def forward(self, idx):
        h = self.emb(idx).mean(1)
        return self.out(torch.tanh(self.lin(h)))


def maxnorm_build():
    m = MaxNormEmb()
    with torch.no_grad():
        m.emb.weight.mul_(3.0)
    return m, torch.optim.SGD(m.parameters(), 0.1), (torch.randint(0, 500, (128, 20)), torch.randn(128, 4))


# 3. GRU (not packed) + GroupNorm + InstanceNorm with running stats + LayerNorm
class GruNorms(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(16, 64, num_layers=2, batch_first=True)
        self.gn = nn.GroupNorm(4, 64)
        self.inorm = nn.InstanceNorm1d(64, track_running_stats=True, affine=True)
        self.ln = nn.LayerNorm(64)
        self.head = nn.Linear(64, 3)

    def forward(self, x):
        h, _ = self.gru(x)                    # (B, T, 64)
        h = h.transpose(1, 2)                 # (B, 64, T)
        h = self.inorm(self.gn(h))
        return self.head(self.ln(h.transpose(1, 2)).mean(1))


def gru_build():
    m = GruNorms()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(32, 40, 16), torch.randn(32, 3))


# 4. multi-head attention with dropout + SDPA with dropout (random in attention)
class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(64, 4, dropout=0.1, batch_first=True)
        self.q = nn.Linear(64, 192)
        self.o = nn.Linear(64, 64)

    def forward(self, x):
        h, _ = self.mha(x, x, x, need_weights=False)
        q, k, v = self.q(h).view(x.shape[0], x.shape[1], 3, 4, 16).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(x.shape))


def attn_build():
    m = Attn()
    return m, torch.optim.AdamW(m.parameters(), 1e-3), (torch.randn(16, 48, 64),)


# 5. EmbeddingBag + max_pool with indices + max_unpool + interpolate + pixel_shuffle + unfold
class PoolNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(300, 16, mode="sum")
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 4, 3, padding=1)
        self.head = nn.Linear(16 + 4 * 16 * 16, 5)

    def forward(self, idx, offsets, img):
        e = self.bag(idx, offsets)
        h = F.relu(self.conv(img))
        p, ind = F.max_pool2d(h, 2, return_indices=True)
        u = F.max_unpool2d(p, ind, 2)
        u = F.interpolate(u, scale_factor=0.5, mode="bilinear", align_corners=False)
        u = F.pixel_shuffle(F.relu(self.conv2(u)).repeat(1, 4, 1, 1), 2)[:, :4]
        cols = F.unfold(u, 3, padding=1).view(u.shape[0], -1, 16 * 16)[:, 0:4].reshape(u.shape[0], -1)
        return self.head(torch.cat([e, cols], 1))


def pool_build():
    m = PoolNet()
    idx = torch.randint(0, 300, (32 * 6,))
    offsets = torch.arange(0, 32 * 6, 6)
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), (idx, offsets, torch.randn(32, 1, 32, 32))


def pool_loss(m, d):
    return m(*d).pow(2).mean()


# 6. torch.utils.checkpoint inside remat (reentrant and not)
class Ckpt(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Dropout(0.1), nn.Linear(256, 64))
                                    for _ in range(4))
        self.reentrant = reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        for b in self.blocks:
            x = x + checkpoint(b, x, use_reentrant=self.reentrant)
        return x


def ckpt_build(reentrant):
    def build():
        m = Ckpt(reentrant)
        x = torch.randn(128, 64, requires_grad=reentrant)
        return m, torch.optim.Adam(m.parameters(), 1e-3), (x,)
    return build


# 7. data-dependent shapes: nonzero, unique, masked_select, boolean indexing, topk/sort + gather
class DataDep(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 64)

    def forward(self, x):
        h = torch.relu(self.a(x))
        keep = h.sum(1) > h.sum(1).median()
        sel = h[keep]
        u, inv = torch.unique(sel.argmax(1), return_inverse=True)
        top, ti = torch.topk(self.b(sel), 8, dim=1)
        s, si = torch.sort(top, dim=1)
        ms = torch.masked_select(h, h > 0.5)
        nz = torch.nonzero(h > 1.0)
        return s.gather(1, si).sum() + ms.sum() * 1e-3 + inv.float().sum() * 0 + nz.shape[0] * 1e-6 + u.numel() * 0


def datadep_build():
    m = DataDep()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(256, 32),)


# 8. an explicit generator in forward (noise injection), bernoulli_ in place, distributions rsample (VAE)
class Vae(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(64, 2 * 16)
        self.dec = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 64))
        self.g = torch.Generator().manual_seed(123)

    def forward(self, x):
        noise = torch.randn(x.shape, generator=self.g) * 0.1
        mask = torch.empty_like(x).bernoulli_(0.9)
        mu, logv = self.enc((x + noise) * mask).chunk(2, 1)
        q = torch.distributions.Normal(mu, (0.5 * logv).exp())
        z = q.rsample()
        kl = torch.distributions.kl_divergence(q, torch.distributions.Normal(0.0, 1.0)).sum(1).mean()
        return F.mse_loss(self.dec(z), x) + kl * 1e-2


def vae_build():
    m = Vae()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(256, 64),)


# 9. saved tensor hooks: save_on_cpu and a custom pack hook that copies
def hooks_build():
    m = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8))
    return m, torch.optim.SGD(m.parameters(), 0.1), (torch.randn(256, 64),)


def hooks_step(model, opt, data, i):
    opt.zero_grad()
    if i % 2 == 0:
        with torch.autograd.graph.save_on_cpu():
            loss = model(data[0]).pow(2).mean()
    else:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone() * 1.0, lambda t: t):
            loss = model(data[0]).pow(2).mean()
    loss.backward()
    opt.step()
    return loss


# 10. QAT: observers and fake quant update buffers in place in forward
def qat_build():
    import torch.ao.quantization as Q
    m = nn.Sequential(Q.QuantStub(), nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8), Q.DeQuantStub())
    m.train()
    m.qconfig = Q.get_default_qat_qconfig("x86")
    Q.prepare_qat(m, inplace=True)
    return m, torch.optim.SGD(m.parameters(), 0.05), (torch.randn(128, 32),)


# 11. EMA / SWA model averaging, optimizer in backward via post-accumulate-grad hooks
def ema_build():
    m = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 32))
    ema = torch.optim.swa_utils.AveragedModel(m, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    object.__setattr__(m, "ema", ema)  # not a submodule: its parameters are not the model's
    base = list(m.parameters())
    opts = {p: torch.optim.SGD([p], 0.05) for p in base}

    def hook(p):
        opts[p].step()
        opts[p].zero_grad()
    for p in base:
        p.register_post_accumulate_grad_hook(hook)
    return m, torch.optim.SGD(base, 0.0), (torch.randn(256, 32),)


def ema_step(model, opt, data, i):
    out = model[2](model[1](model[0](data[0])))
    loss = (out - data[0]).pow(2).mean()
    loss.backward()
    model.ema.update_parameters(model)
    return loss


# 12. anomaly detection + gradient clipping by norm + out= variants + .item()/.tolist()/.numpy() mid-step
def anomaly_build():
    m = nn.Sequential(nn.Linear(32, 128), nn.SiLU(), nn.Linear(128, 128), nn.Mish(), nn.Linear(128, 4))
    return m, torch.optim.RMSprop(m.parameters(), 1e-3), (torch.randn(256, 32),)


def anomaly_step(model, opt, data, i):
    opt.zero_grad()
    with torch.autograd.detect_anomaly():
        h = model[1](model[0](data[0]))
        buf = torch.empty_like(h)
        torch.mul(h.detach(), 0.5, out=buf)
        s = float(h.abs().max().item()) + sum(h[0, :4].tolist()) + float(h.detach().numpy()[1, 1])
        out = model[4](model[3](model[2](buf + h)))
        loss = out.pow(2).mean() + 0 * s
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    return loss


# 13. torch.save / torch.load of activations and optimizer state mid-training
def save_build():
    m = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(256, 64),)


def save_step(model, opt, data, i):
    opt.zero_grad()
    h1 = model[1](model[0](data[0]))
    h2 = model[3](model[2](h1))
    out = model[4](h2)
    loss = out.pow(2).mean()
    loss.backward()
    opt.step()
    b = io.BytesIO()
    torch.save({"h1": h1, "opt": opt.state_dict()}, b)
    b.seek(0)
    back = torch.load(b)
    return loss + back["h1"].sum() * 0 + back["h1"][3, 5]


# 14. jacrev / hessian of a small loss as a regularizer
def jac_build():
    m = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 8))
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(64, 8),)


def jac_step(model, opt, data, i):
    from torch.func import jacrev, vmap
    opt.zero_grad()
    J = vmap(jacrev(model))(data[0])
    loss = model(data[0]).pow(2).mean() + 1e-2 * J.pow(2).sum((1, 2)).mean()
    loss.backward()
    opt.step()
    return loss


# 15. conv zoo: transposed, dilated, depthwise, 3d conv, with BN in eval between train steps, momentum=None
class ConvZoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.c3 = nn.Conv3d(1, 4, 3, padding=1)
        self.dw = nn.Conv2d(16, 16, 3, padding=2, dilation=2, groups=16)
        self.bn = nn.BatchNorm2d(16, momentum=None)
        self.tc = nn.ConvTranspose2d(16, 4, 4, stride=2, padding=1)
        self.head = nn.Linear(4 * 32 * 32, 3)

    def forward(self, x):
        h = F.relu(self.c3(x))                       # (B, 4, 4, 16, 16)
        h = h.reshape(x.shape[0], 16, 16, 16)
        h = F.relu(self.bn(self.dw(h)))
        return self.head(self.tc(h).flatten(1))


def convzoo_build():
    m = ConvZoo()
    return m, torch.optim.SGD(m.parameters(), 0.02, momentum=0.9, nesterov=True), (torch.randn(16, 1, 4, 16, 16),)


def convzoo_step(model, opt, data, i):
    model.eval()
    with torch.no_grad():
        ev = model(data[0]).sum()
    model.train()
    opt.zero_grad()
    loss = model(data[0]).pow(2).mean()
    loss.backward()
    opt.step()
    return loss + ev * 0


# 16. a user module that updates its own buffer in place in forward (custom running mean, no_grad)
class RunningCenter(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 8)
        self.register_buffer("mean", torch.zeros(64))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        h = torch.tanh(self.a(x))
        if self.training:
            with torch.no_grad():
                self.mean.mul_(0.9).add_(h.mean(0), alpha=0.1)
                self.count += 1
        return self.b(h - self.mean)


def center_build():
    m = RunningCenter()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(256, 32),)


# 17. GradScaler on CPU with float16 autocast? (bf16) + the scaler's unscale / inf check
def scaler_build():
    m = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 8))
    return m, torch.optim.SGD(m.parameters(), 0.05), (torch.randn(128, 32),)


_scalers = {}


def scaler_step(model, opt, data, i):
    sc = _scalers.setdefault(id(opt), torch.amp.GradScaler("cpu", init_scale=2.0 ** 10))
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(data[0]).float().pow(2).mean()
    sc.scale(loss).backward()
    sc.step(opt)
    sc.update()
    return loss


# 18. tensor subclass via __torch_function__ + Parameter reassign via .data + p.data.copy_
class Tagged(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def subclass_build():
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    return m, torch.optim.SGD(m.parameters(), 0.05), (torch.randn(128, 32),)


def subclass_step(model, opt, data, i):
    opt.zero_grad()
    x = data[0].as_subclass(Tagged)
    loss = model(x).pow(2).mean().as_subclass(torch.Tensor)
    loss.backward()
    opt.step()
    with torch.no_grad():
        model[0].weight.data = model[0].weight.data.clone()
        model[2].bias.data.copy_(model[2].bias.data * 0.99)
    return loss


PROGRAMS = {
    "spectral_weight_norm": (spectral_build, std_step(lambda m, d: m(d[0]).pow(2).mean())),
    "embedding_max_norm": (maxnorm_build, std_step(lambda m, d: F.mse_loss(m(d[0]), d[1]))),
    "gru_norms": (gru_build, std_step(lambda m, d: F.mse_loss(m(d[0]), d[1]))),
    "attention_dropout": (attn_build, std_step(lambda m, d: m(d[0]).pow(2).mean())),
    "pool_bag_unpool": (pool_build, std_step(pool_loss)),
    "checkpoint_nonreentrant": (ckpt_build(False), std_step(lambda m, d: m(d[0]).pow(2).mean())),
    "checkpoint_reentrant": (ckpt_build(True), std_step(lambda m, d: m(d[0]).pow(2).mean())),
    "data_dependent": (datadep_build, std_step(lambda m, d: m(d[0]))),
    "vae_generator": (vae_build, std_step(lambda m, d: m(d[0]))),
    "saved_tensor_hooks": (hooks_build, hooks_step),
    "qat": (qat_build, std_step(lambda m, d: m(d[0]).pow(2).mean())),
    "ema_opt_in_backward": (ema_build, ema_step),
    "anomaly_out_item": (anomaly_build, anomaly_step),
    "save_load": (save_build, save_step),
    "jacrev": (jac_build, jac_step),
    "conv_zoo_eval": (convzoo_build, convzoo_step),
    "buffer_in_forward": (center_build, std_step(lambda m, d: m(d[0]).pow(2).mean())),
    "grad_scaler_bf16": (scaler_build, scaler_step),
    "subclass_data": (subclass_build, subclass_step),
}
