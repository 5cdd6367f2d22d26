"""Python tensor subclasses over real tensors (__torch_dispatch__ wrappers, integration/subclass_arguments.h): frozen
weights stored as int8 with a scale and dequantized by every op that reads them, under trained low-rank adapters (as
QLoRA's NF4 and torchao's quantized weights are), and a logging wrapper that passes every op of a training step
through to its inner tensor (as debugging and tracing subclasses do: everything such a wrapper computes is made
where remat cannot see, so none of it can be evicted). DTensor parameters: test_subclasses.py."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._pytree import tree_map

from .harness import std_step


def ce_loss(model, data):
    return F.cross_entropy(model(data[0]), data[1])


class Int8Weight(torch.Tensor):
    @staticmethod
    def __new__(cls, q, scale):
        return torch.Tensor._make_wrapper_subclass(cls, q.shape, dtype=scale.dtype, requires_grad=False)

    def __init__(self, q, scale):
        self.q, self.scale = q, scale

    def __repr__(self):
        return f"Int8Weight({tuple(self.shape)})"

    def __tensor_flatten__(self):
        return ["q", "scale"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, size, stride):
        return Int8Weight(inner["q"], inner["scale"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.detach.default:
            return Int8Weight(args[0].q, args[0].scale)
        dequantize = lambda t: t.q.to(t.scale.dtype) * t.scale if isinstance(t, Int8Weight) else t  # noqa: E731
        return func(*tree_map(dequantize, args), **tree_map(dequantize, kwargs or {}))


def quantized(w):
    scale = w.abs().amax(1, keepdim=True) / 127
    return Int8Weight(torch.round(w / scale).to(torch.int8), scale)


class LoraLinear(nn.Module):
    def __init__(self, d_in, d_out, rank=8):
        super().__init__()
        self.base = nn.Parameter(quantized(torch.randn(d_out, d_in) / d_in ** 0.5), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(d_out))
        self.a = nn.Parameter(torch.randn(rank, d_in) * 0.01)
        self.b = nn.Parameter(torch.randn(d_out, rank) * 0.01)

    def forward(self, x):
        return F.linear(x, self.base, self.bias) + (x @ self.a.t()) @ self.b.t()


def lora_build():
    m = nn.Sequential(LoraLinear(256, 512), nn.GELU(), LoraLinear(512, 512), nn.GELU(), LoraLinear(512, 512),
                      nn.Tanh(), nn.Linear(512, 10))
    trained = [p for p in m.parameters() if p.requires_grad]
    return m, torch.optim.AdamW(trained, 1e-3), (torch.randn(1024, 256), torch.randint(0, 10, (1024,)))


class LoggingTensor(torch.Tensor):
    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(), dtype=elem.dtype,
                                                   requires_grad=elem.requires_grad)

    def __init__(self, elem):
        self.elem = elem

    def __tensor_flatten__(self):
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, size, stride):
        return LoggingTensor(inner["elem"])

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.elem if isinstance(t, LoggingTensor) else t  # noqa: E731
        wrap = lambda t: LoggingTensor(t) if type(t) is torch.Tensor else t  # noqa: E731
        return tree_map(wrap, func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {})))


def logging_step(model, opt, data, i):
    opt.zero_grad()
    loss = F.cross_entropy(model(LoggingTensor(data[0])), LoggingTensor(data[1]))
    loss.backward()
    opt.step()
    return loss.elem


def logging_build():
    m = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 512), nn.LayerNorm(512), nn.GELU(),
                      nn.Linear(512, 10))
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(1024, 128), torch.randint(0, 10, (1024,)))


PROGRAMS = {
    "int8_lora_wrapper_subclass": (lora_build, std_step(ce_loss)),
    "logging_tensor_wrapper": (logging_build, logging_step),
}
