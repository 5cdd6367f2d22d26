"""Extension points: retain_graph with grad hooks, torch.library custom ops (one mutating a buffer), functional batch
norm over views of one buffer with LazyLinear, in-place autograd Functions, nn.Transformer with masks, model ensembles
under vmap, embedding max_norm, two intra-op threads; a forward that writes saved tensors in place under
allow_mutation_on_saved_tensors, a multi-grad hook whose gradients' norms steer the next step, and Jacobian rows
from one batched autograd.grad call (is_grads_batched)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import std_step

# 1. retain_graph: two backward passes over one graph; retain_grad on an intermediate; a grad hook editing in place
class Mlp(nn.Module):
    def __init__(self, d=64, h=256):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(d, h), nn.Linear(h, h), nn.Linear(h, 4)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def retain_build():
    m = Mlp()
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), (torch.randn(512, 64),)


def retain_step(model, opt, data, i):
    opt.zero_grad()
    h = torch.tanh(model.a(data[0]))
    h.retain_grad()
    h.register_hook(lambda g: g.mul_(0.5))
    out = model.c(torch.tanh(model.b(h)))
    l1 = out.pow(2).mean()
    l1.backward(retain_graph=True)
    l2 = out.abs().mean()
    l2.backward()
    opt.step()
    return l1 + l2 + h.grad.sum()


# 2. a custom op (torch.library) that writes a buffer and returns a fresh tensor computed from it; a pure one too
@torch.library.custom_op("ecosystem::ema_scale", mutates_args=("state",))
def ema_scale(x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    state.mul_(0.9).add_(x.detach().abs().mean(), alpha=0.1)
    return x / (state + 1.0)


@ema_scale.register_fake
def _(x, state):
    return torch.empty_like(x)


@torch.library.custom_op("ecosystem::swish", mutates_args=())
def swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


@swish.register_fake
def _(x):
    return torch.empty_like(x)


def _swish_backward(ctx, g):
    x, = ctx.saved_tensors
    s = torch.sigmoid(x)
    return g * (s + x * s * (1 - s))


swish.register_autograd(_swish_backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))


class CustomOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(64, 256), nn.Linear(256, 256), nn.Linear(256, 4)
        self.register_buffer("state", torch.zeros(()))

    def forward(self, x):
        h = swish(self.a(x))
        h = self.b(h)
        h = h * ema_scale(h.detach(), self.state)
        return self.c(swish(h))


def custom_build():
    m = CustomOps()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(512, 64),)


# 3. batch norm functional with running stats that are views of one buffer, momentum=None, and LazyLinear
class ViewStats(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.LazyLinear(128)
        self.b = nn.Linear(128, 128)
        self.register_buffer("stats", torch.zeros(2, 128))
        self.stats[1].fill_(1.0)
        self.head = nn.Linear(128, 4)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        h = F.batch_norm(h, self.stats[0], self.stats[1], training=self.training, momentum=0.2)
        return self.head(torch.relu(self.b(h)))


def viewstats_build():
    m = ViewStats()
    m(torch.randn(2, 64))  # materialize the lazy layer before the optimizer sees it
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), (torch.randn(1024, 64),)


def viewstats_step(model, opt, data, i):
    model.eval()
    with torch.no_grad():
        ev = model(data[0][:64]).sum()
    model.train()
    opt.zero_grad()
    loss = model(data[0]).pow(2).mean()
    loss.backward()
    opt.step()
    return loss + ev * 0


# 4. an in-place autograd.Function (mark_dirty) and a Function saving an intermediate
class ScaleInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.mark_dirty(x)
        return x.mul_(2.0)

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


class SquareSave(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x * x
        t = torch.tanh(y)
        ctx.save_for_backward(x, t)
        return t

    @staticmethod
    def backward(ctx, g):
        x, t = ctx.saved_tensors
        return g * (1 - t * t) * 2 * x


class FnNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(64, 256), nn.Linear(256, 256), nn.Linear(256, 4)

    def forward(self, x):
        h = ScaleInPlace.apply(self.a(x))
        h = SquareSave.apply(self.b(h) * 0.1)
        return self.c(h)


def fn_build():
    m = FnNet()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(512, 64),)


# 5. full nn.Transformer (encoder-decoder) with causal and padding masks, label smoothing, two threads
def tr_build():
    m = nn.Transformer(d_model=64, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=128,
                       dropout=0.1, batch_first=True)
    src = torch.randn(8, 24, 64)
    tgt = torch.randn(8, 20, 64)
    pad = torch.zeros(8, 24, dtype=torch.bool)
    pad[:, 20:] = True
    return m, torch.optim.AdamW(m.parameters(), 1e-3), (src, tgt, pad)


def tr_loss(m, d):
    src, tgt, pad = d
    mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
    out = m(src, tgt, tgt_mask=mask, src_key_padding_mask=pad, memory_key_padding_mask=pad, tgt_is_causal=True)
    return F.cross_entropy(out.reshape(-1, 64), torch.arange(out.shape[0] * out.shape[1]) % 64, label_smoothing=0.1)


# 6. model ensembles with torch.func.stack_module_state + vmap
def ens_build():
    models = [Mlp(32, 64) for _ in range(4)]
    holder = nn.ModuleList(models)
    return holder, torch.optim.SGD(holder.parameters(), 0.05), (torch.randn(256, 32),)


def ens_step(model, opt, data, i):
    from torch.func import functional_call, stack_module_state, vmap
    opt.zero_grad()
    params, buffers = stack_module_state(list(model))
    base = Mlp(32, 64).to("meta")

    def f(p, b, x):
        return functional_call(base, (p, b), (x,))
    out = vmap(f, in_dims=(0, 0, None))(params, buffers, data[0])
    loss = out.pow(2).mean()
    grads = torch.autograd.grad(loss, list(params.values()))
    with torch.no_grad():
        for (name, _), g in zip(params.items(), grads):
            for k, m in enumerate(model):
                p = dict(m.named_parameters())[name]
                p.grad = g[k].clone()
    opt.step()
    return loss


# 7. embedding with max_norm and a large activation path (the renorm writes the weight in forward)
class MaxNorm2(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(200, 64, max_norm=1.0)
        self.a = nn.Linear(64, 256)
        self.b = nn.Linear(256, 4)

    def forward(self, idx):
        return self.b(torch.tanh(self.a(self.emb(idx)))).mean(1)


def maxnorm2_build():
    m = MaxNorm2()
    with torch.no_grad():
        m.emb.weight.mul_(3.0)
    return m, torch.optim.SGD(m.parameters(), 0.1), (torch.randint(0, 200, (64, 32)),)


# 8. conv net with two intra-op threads (reductions split across threads), bn, channels_last
def threads_build():
    torch.set_num_threads(2)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                      nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(512, 10))
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), (torch.randn(16, 3, 32, 32),)


# 9. in-place writes to tensors autograd saved, allowed by allow_mutation_on_saved_tensors (it clones a saved tensor
#    before its first write, so backward reads the value the forward saved)
class MutatesSaved(nn.Module):
    def __init__(self, d=128, h=512):
        super().__init__()
        self.a = nn.Linear(d, h)
        self.b = nn.Linear(h, h)
        self.out = nn.Linear(h, 10)

    def forward(self, x):
        h = self.a(x)
        y = torch.sin(h)  # saves h
        h.mul_(0.5)       # writes it afterwards
        z = self.b(torch.tanh(y) + h)
        w = z * z         # saves z
        z.add_(1.0)
        return self.out(torch.relu(w + z))


def mutation_step(model, opt, data, i):
    opt.zero_grad()
    with torch.autograd.graph.allow_mutation_on_saved_tensors():
        loss = F.cross_entropy(model(data[0]), data[1])
        loss.backward()
    opt.step()
    return loss


def mutation_build():
    m = MutatesSaved()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(2048, 128), torch.randint(0, 10, (2048,)))


# 10. register_multi_grad_hook over two hidden activations: once both gradients exist, their norms go into a buffer
#     that scales the next step's loss (a gradient statistic that crosses steps)
class GradStatistics(nn.Module):
    def __init__(self, d=128, h=512):
        super().__init__()
        self.a = nn.Linear(d, h)
        self.b = nn.Linear(h, h)
        self.out = nn.Linear(h, 10)
        self.register_buffer("grad_ratio", torch.ones(()))

    def forward(self, x):
        h1 = torch.tanh(self.a(x))
        h2 = torch.tanh(self.b(h1))
        if h1.requires_grad:
            def note(grads):
                with torch.no_grad():
                    self.grad_ratio.copy_((grads[0].norm() / (grads[1].norm() + 1e-6)).clamp(0.5, 2.0))
            torch.autograd.graph.register_multi_grad_hook((h1, h2), note)
        return self.out(h2)


def multi_hook_step(model, opt, data, i):
    opt.zero_grad()
    loss = F.cross_entropy(model(data[0]), data[1]) * model.grad_ratio.detach()
    loss.backward()
    opt.step()
    return loss


def multi_hook_build():
    m = GradStatistics()
    data = torch.randn(2048, 128), torch.randint(0, 10, (2048,))
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), data


# 11. the Jacobian of the logits with respect to a hidden layer, one row per class, from one autograd.grad call over
#     a batch of grad_outputs (is_grads_batched: vmap over the backward); its rows' norms weight the samples' losses
def batched_grad_step(model, opt, data, i):
    opt.zero_grad()
    hidden = model[:2](data[0])
    logits = model[2:](hidden)
    basis = torch.eye(10).unsqueeze(1).expand(10, *logits.shape)
    (rows,) = torch.autograd.grad(logits, hidden, basis, retain_graph=True, is_grads_batched=True)
    weight = rows.pow(2).sum((0, 2)).rsqrt().detach()
    loss = (F.cross_entropy(logits, data[1], reduction="none") * weight / weight.mean()).mean()
    loss.backward()
    opt.step()
    return loss


def batched_grad_build():
    m = nn.Sequential(nn.Linear(128, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 10))
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(512, 128), torch.randint(0, 10, (512,)))


PROGRAMS = {
    "retain_graph_hooks": (retain_build, retain_step),
    "custom_ops_library": (custom_build, std_step(lambda m, d: m(d[0]).pow(2).mean())),
    "bn_view_stats_lazy": (viewstats_build, viewstats_step),
    "autograd_function_inplace": (fn_build, std_step(lambda m, d: m(d[0]).pow(2).mean())),
    "transformer_full": (tr_build, std_step(tr_loss)),
    "ensemble_vmap": (ens_build, ens_step),
    "embedding_max_norm_big": (maxnorm2_build, std_step(lambda m, d: m(d[0]).pow(2).mean())),
    "two_threads_conv": (threads_build, std_step(lambda m, d: F.cross_entropy(m(d[0]), torch.arange(16) % 10))),
    "allow_mutation_on_saved": (mutation_build, mutation_step),
    "multi_grad_hook_statistics": (multi_hook_build, multi_hook_step),
    "batched_grad_jacobian_rows": (batched_grad_build, batched_grad_step),
}
