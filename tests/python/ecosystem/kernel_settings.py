"""Programs that change a process-wide setting choosing what kernels compute for part of a step: oneDNN off around
one convolution, a float64 default dtype inside a block, another intra-op thread count for the backward than for the
forward, deterministic algorithms around a scatter, the math backend of
scaled dot-product attention for one layer."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .harness import std_step


def ce_loss(model, data):
    return F.cross_entropy(model(data[0]), data[1])


class OneDnnOffFirst(nn.Module):
    """The first convolution runs with oneDNN off (the slow_conv2d kernels), the rest with it on."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.c3 = nn.Conv2d(64, 64, 3, padding=1)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        with torch.backends.mkldnn.flags(enabled=False):
            h = F.relu(self.c1(x))
        h = F.max_pool2d(F.relu(self.c2(h)), 2)
        return self.head(F.relu(self.c3(h)).mean((2, 3)))


def onednn_build():
    m = OneDnnOffFirst()
    return m, torch.optim.SGD(m.parameters(), 0.01, momentum=0.9), (torch.randn(16, 3, 32, 32),
                                                                     torch.randint(0, 10, (16,)))


class Float64Block(nn.Module):
    """Positional features made under a float64 default dtype (torch.linspace and torch.arange without a dtype), as
    code that sets the default dtype for a block does."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(64, 256)
        self.l2 = nn.Linear(256, 256)
        self.l3 = nn.Linear(256, 8)

    def forward(self, x):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            position = torch.linspace(0, 1, x.shape[0]).unsqueeze(1) * torch.arange(1, 65).unsqueeze(0)
            features = torch.sin(position)
        finally:
            torch.set_default_dtype(previous)
        h = torch.tanh(self.l1(x + features.float()))
        h = torch.tanh(self.l2(h))
        return self.l3(h)


def float64_build():
    m = Float64Block()
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), (torch.randn(512, 64), torch.randint(0, 8, (512,)))


def threads_step(model, opt, data, i):
    opt.zero_grad()
    torch.set_num_threads(2)
    loss = ce_loss(model, data) + 1e-3 * model[0].weight.sum()
    torch.set_num_threads(1)
    loss.backward()
    opt.step()
    return loss


def threads_build():
    m = nn.Sequential(nn.Linear(512, 1024), nn.Tanh(), nn.Linear(1024, 1024), nn.Tanh(), nn.Linear(1024, 10))
    return m, torch.optim.SGD(m.parameters(), 0.01), (torch.randn(256, 512), torch.randint(0, 10, (256,)))


class DeterministicScatter(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(16, 128)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))

    def forward(self, x, index):
        h = self.embed(x)
        with _deterministic():
            pooled = torch.zeros(64, 128).index_add(0, index, h)
            counts = torch.zeros(64).scatter_add(0, index, torch.ones(index.shape[0]))
        return self.head(pooled / counts.clamp(min=1).unsqueeze(1))


class _deterministic:
    def __enter__(self):
        self.previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.previous)


def scatter_build():
    m = DeterministicScatter()
    data = (torch.randn(4096, 16), torch.randint(0, 64, (4096,)), torch.randint(0, 4, (64,)))
    return m, torch.optim.SGD(m.parameters(), 0.01), data


class MathAttention(nn.Module):
    def __init__(self, width=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.ModuleList(nn.Linear(width, 3 * width) for _ in range(2))
        self.head = nn.Linear(width, 10)

    def attend(self, layer, x):
        b, s, w = x.shape
        q, k, v = layer(x).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, w)

    def forward(self, x):
        with sdpa_kernel(SDPBackend.MATH):
            x = x + self.attend(self.qkv[0], x)
        x = x + self.attend(self.qkv[1], x)
        return self.head(x.mean(1))


def attention_build():
    m = MathAttention()
    return m, torch.optim.AdamW(m.parameters(), 1e-3), (torch.randn(8, 128, 64), torch.randint(0, 10, (8,)))


PROGRAMS = {
    "onednn_off_one_conv": (onednn_build, std_step(ce_loss)),
    "float64_default_dtype_block": (float64_build, std_step(ce_loss)),
    "threads_forward_backward": (threads_build, threads_step),
    "deterministic_scatter_scope": (scatter_build,
                                    std_step(lambda m, d: F.cross_entropy(m(d[0], d[1]), d[2]))),
    "sdpa_math_backend_one_layer": (attention_build, std_step(ce_loss)),
}
