"""Training loops outside the matrix: double backward, torch.func, custom autograd Functions, LBFGS, accumulation with
clipping and fused optimizers, hooks, sparse embeddings, complex FFT layers, random ops, in-place writes on views, a
packed LSTM, an LSTM with dropout between its layers, linalg, channels_last with bf16 autocast, the nested-tensor eval
fast path."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import std_step

# 1. gradient penalty (double backward)
def gp_build():
    m = nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 128), nn.Softplus(), nn.Linear(128, 1))
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(256, 32),)


def gp_step(model, opt, data, i):
    opt.zero_grad()
    x = data[0].clone().requires_grad_(True)
    out = model(x)
    g, = torch.autograd.grad(out.sum(), x, create_graph=True)
    loss = out.mean() + ((g.norm(2, dim=1) - 1) ** 2).mean()
    loss.backward()
    opt.step()
    return loss


# 2. torch.func per-sample gradients
def func_build():
    m = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 4))
    return m, torch.optim.SGD(m.parameters(), 0.1), (torch.randn(64, 16), torch.randint(0, 4, (64,)))


def func_step(model, opt, data, i):
    from torch.func import functional_call, grad, vmap
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_one(p, x, y):
        out = functional_call(model, p, (x.unsqueeze(0),))
        return F.cross_entropy(out, y.unsqueeze(0))
    g = vmap(grad(loss_one), in_dims=(None, 0, 0))(params, *data)
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.grad = g[k].clamp(-1, 1).mean(0)
    opt.step()
    return F.cross_entropy(model(data[0]), data[1])


# 3. custom autograd Function
class Swishy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, beta):
        s = torch.sigmoid(beta * x)
        ctx.save_for_backward(x, s)
        ctx.beta = beta
        return x * s

    @staticmethod
    def backward(ctx, g):
        x, s = ctx.saved_tensors
        return g * (s + ctx.beta * x * s * (1 - s)), None


def custom_build():
    layers = nn.ModuleList(nn.Linear(128, 128) for _ in range(6))
    return layers, torch.optim.SGD(layers.parameters(), 0.05, momentum=0.9), (torch.randn(256, 128),)


def custom_loss(model, data):
    x = data[0]
    for l in model:
        x = Swishy.apply(l(x), 1.5)
    return x.pow(2).mean()


# 4. LBFGS
def lbfgs_build():
    m = nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 1))
    return m, torch.optim.LBFGS(m.parameters(), lr=0.5, max_iter=5), (torch.randn(256, 32), torch.randn(256, 1))


def lbfgs_step(model, opt, data, i):
    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(data[0]), data[1])
        loss.backward()
        return loss
    return opt.step(closure)


# 5. gradient accumulation + clip + AdamW fused/foreach + weight tying
class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(300, 64)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True), 2)
        self.head = nn.Linear(64, 300, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.enc(self.emb(ids)))


def tied_build(fused):
    def build():
        m = Tied()
        opt = torch.optim.AdamW(m.parameters(), 1e-3, fused=fused, foreach=None if fused else True)
        return m, opt, (torch.randint(0, 300, (8, 48)),)
    return build


def accum_step(model, opt, data, i):
    opt.zero_grad()
    total = 0
    for half in data[0].chunk(2):
        out = model(half)
        loss = F.cross_entropy(out[:, :-1].reshape(-1, 300), half[:, 1:].reshape(-1)) / 2
        loss.backward()
        total = total + loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    return total


# 6. hooks: tensor hook modifying grad, forward hook keeping activations
def hooks_build():
    m = nn.Sequential(*[nn.Sequential(nn.Linear(128, 128), nn.ReLU()) for _ in range(6)])
    return m, torch.optim.SGD(m.parameters(), 0.05), (torch.randn(256, 128),)


def hooks_step(model, opt, data, i):
    kept = []
    handles = [blk.register_forward_hook(lambda mod, inp, out: kept.append(out)) for blk in model]
    opt.zero_grad()
    x = data[0]
    out = model(x)
    out.register_hook(lambda g: g * 2)
    loss = out.pow(2).mean() + sum(k.mean() for k in kept) * 0.01
    loss.backward()
    opt.step()
    for h in handles:
        h.remove()
    # read the kept activations after the step (a user logging them)
    s = sum(k.sum() for k in kept)
    return loss + 0 * s


# 7. sparse embedding with SparseAdam
def sparse_build():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(1000, 64, sparse=True)
            self.mlp = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
        def forward(self, ids):
            return self.mlp(self.emb(ids).mean(1))
    m = M()

    class Two:
        """SparseAdam for the sparse embedding, Adam for the rest, stepped as one optimizer."""

        def __init__(self):
            self.a = torch.optim.SparseAdam(list(m.emb.parameters()), 1e-2)
            self.b = torch.optim.Adam(list(m.mlp.parameters()), 1e-3)
            self.param_groups = self.a.param_groups + self.b.param_groups
            self.state = {**self.a.state, **self.b.state}

        def zero_grad(self):
            self.a.zero_grad()
            self.b.zero_grad()

        def step(self):
            self.a.step()
            self.b.step()
            self.state = {**self.a.state, **self.b.state}

        def state_dict(self):
            state = {("a", k): v for k, v in self.a.state_dict()["state"].items()}
            state.update({("b", k): v for k, v in self.b.state_dict()["state"].items()})
            return {"state": state}

        # remat.bound.RequiredBytes hooks the optimizer's steps: both of them.
        def register_step_pre_hook(self, hook):
            return Handles(self.a.register_step_pre_hook(hook), self.b.register_step_pre_hook(hook))

        def register_step_post_hook(self, hook):
            return Handles(self.a.register_step_post_hook(hook), self.b.register_step_post_hook(hook))

    class Handles:
        def __init__(self, *handles):
            self.handles = handles

        def remove(self):
            for handle in self.handles:
                handle.remove()

    return m, Two(), (torch.randint(0, 1000, (128, 20)), torch.randn(128, 1))


# 8. complex / FFT
class FftLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 65, dtype=torch.cfloat) * 0.1)
        self.lin = nn.Linear(128, 128)

    def forward(self, x):
        for k in range(4):
            f = torch.fft.rfft(x, dim=-1) * self.w[k]
            x = torch.relu(self.lin(torch.fft.irfft(f, n=128, dim=-1))) + x
        return x


def fft_build():
    m = FftLayers()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(256, 128),)


# 9. random ops in forward: rrelu, gumbel_softmax, stochastic depth, dropout2d, alpha dropout, multinomial
def random_build():
    import torchvision
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.ModuleList(nn.Linear(128, 128) for _ in range(4))
            self.rrelu = nn.RReLU()
            self.ad = nn.AlphaDropout(0.2)
            self.d2 = nn.Dropout1d(0.2)
        def forward(self, x):
            x = self.rrelu(self.l[0](x))
            x = self.ad(self.l[1](x))
            x = torchvision.ops.stochastic_depth(self.l[2](x), 0.3, "row", True) + x
            x = self.d2(x.unsqueeze(-1)).squeeze(-1)
            y = F.gumbel_softmax(self.l[3](x), tau=0.5)
            idx = torch.multinomial(torch.softmax(x.detach(), -1), 2)
            return y + x.gather(1, idx).sum(1, keepdim=True)
    m = M()
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), (torch.randn(256, 128),)


# 10. in-place on views, index_put_, scatter_, masked_fill_
def views_build():
    m = nn.ModuleList(nn.Linear(128, 128) for _ in range(5))
    return m, torch.optim.SGD(m.parameters(), 0.05), (torch.randn(256, 128),)


def views_loss(model, data):
    x = data[0]
    for i, l in enumerate(model):
        x = torch.tanh(l(x)) * 1.0
        x[:, : 32] += 0.5 * x[:, 32:64]
        x = x.masked_fill(x > 0.9, 0.0)
        x = x.clone()
        x.index_put_((torch.arange(0, 256, 7),), x[torch.arange(0, 256, 7)] * 2)
        x = x.scatter(1, torch.arange(128).repeat(256, 1)[:, :8], 1.0)
    return x.pow(2).mean()


# 11. LSTM packed
def lstm_build():
    m = nn.LSTM(32, 128, num_layers=2, batch_first=True)
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(16, 40, 32), torch.randint(5, 41, (16,)))


def lstm_loss(model, data):
    x, lengths = data
    packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, _ = model(packed)
    padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
    return padded.pow(2).mean()


# 11b. LSTM with dropout between its layers (random draws between them), both directions and a projection
def lstm_dropout_build():
    m = nn.LSTM(32, 96, num_layers=3, dropout=0.3, bidirectional=True, proj_size=48, batch_first=True)
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(32, 40, 32),)


def lstm_dropout_loss(model, data):
    out, (h, c) = model(data[0])
    return out.pow(2).mean() + h.pow(2).mean() + c.abs().mean()


# 12. linalg backward
def linalg_build():
    m = nn.ModuleList(nn.Linear(64, 64) for _ in range(3))
    return m, torch.optim.SGD(m.parameters(), 0.01), (torch.randn(32, 64, 64),)


def linalg_loss(model, data):
    x = data[0]
    for l in model:
        x = l(x)
        q, r = torch.linalg.qr(x)
        x = q + 0.01 * torch.linalg.solve(r.transpose(-1, -2) @ r + 5 * torch.eye(64), x)
    s = torch.linalg.svdvals(x)
    return s.sum() + torch.cdist(x, x).mean()


# 13. mixed bf16 autocast + GradScaler-free conv net with channels_last
def cl_build():
    m = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(4, 32), nn.GELU(),
                      nn.Conv2d(32, 32, 3, padding=1), nn.InstanceNorm2d(32, affine=True, track_running_stats=True),
                      nn.SiLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    m = m.to(memory_format=torch.channels_last)
    images = torch.randn(16, 3, 48, 48).to(memory_format=torch.channels_last)
    return m, torch.optim.Adam(m.parameters(), 1e-3), (images, torch.randint(0, 10, (16,)))


def cl_loss(model, data):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(data[0])
    return F.cross_entropy(out.float(), data[1])


# 14. nested tensor fast path in eval (padding mask) between train steps
def nested_build():
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True), 2,
                                enable_nested_tensor=True)
    return enc, torch.optim.SGD(enc.parameters(), 0.01), (torch.randn(8, 24, 64),)


def nested_step(model, opt, data, i):
    mask = torch.zeros(8, 24, dtype=torch.bool)
    mask[:, 16:] = True
    model.eval()
    with torch.no_grad():
        ev = model(data[0], src_key_padding_mask=mask)
    model.train()
    opt.zero_grad()
    out = model(data[0], src_key_padding_mask=mask)
    loss = out.pow(2).mean() + 0 * ev.sum()
    loss.backward()
    opt.step()
    return loss + ev.abs().mean()


PROGRAMS = {
    "grad_penalty": (gp_build, gp_step),
    "torch_func_vmap": (func_build, func_step),
    "custom_function": (custom_build, std_step(custom_loss)),
    "lbfgs": (lbfgs_build, lbfgs_step),
    "tied_adamw_foreach_accum": (tied_build(False), accum_step),
    "tied_adamw_fused_accum": (tied_build(True), accum_step),
    "hooks": (hooks_build, hooks_step),
    "sparse_embedding": (sparse_build, std_step(lambda m, d: F.mse_loss(m(d[0]), d[1]))),
    "fft_complex": (fft_build, std_step(lambda m, d: m(d[0]).pow(2).mean())),
    "random_ops": (random_build, std_step(lambda m, d: m(d[0]).pow(2).mean())),
    "inplace_views": (views_build, std_step(views_loss)),
    "lstm_packed": (lstm_build, std_step(lstm_loss)),
    "lstm_dropout_bidirectional_proj": (lstm_dropout_build, std_step(lstm_dropout_loss)),
    "linalg": (linalg_build, std_step(linalg_loss)),
    "channels_last_bf16": (cl_build, std_step(cl_loss)),
    "nested_eval": (nested_build, nested_step),
}
