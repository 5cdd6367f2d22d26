"""Programs whose storages change behind ops, come from outside the allocator or are seen through other dtypes, and
generate-then-train loops: an out= buffer that an op resizes (a storage that grows in place, step after step),
weights loaded from a memory-mapped checkpoint (torch.load(mmap=True), load_state_dict(assign=True): storages no
allocator made, written by the optimizer; the same from safetensors), parameters and gradients as views of two flat
buffers (ZeRO-style), LLaMA's rotary embedding through view_as_complex and a torch.polar buffer, an update rounded
stochastically through the float32 bits seen as int32, and language models that sample with a key/value cache under
no_grad and then train on what they sampled (the loop of RLHF and self-training; a tiny one of our own with a static
cache, and GPT-2 through transformers' generate). Flex attention has no backward on the CPU in torch 2.14: not here."""
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import std_step


def ce_loss(model, data):
    return F.cross_entropy(model(data[0]), data[1])


class ResizedOutBuffer(nn.Module):
    """Features computed under no_grad into a buffer the op resizes (out= of another shape), then trained on. The
    buffer's storage grows in place as the batch's feature count grows from step to step."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scratch", torch.empty(0), persistent=False)
        self.proj = nn.Parameter(torch.randn(64, 256) / 8)
        self.body = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256),
                                  nn.Tanh(), nn.Linear(256, 10))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        rows = x.shape[0] // 4 * (1 + self.calls % 4)  # 1/4, 2/4, 3/4, all of the batch
        with torch.no_grad():
            self.scratch.resize_(0)  # reuse the out tensor, as torch's deprecation warning advises
            torch.mm(x[:rows], self.proj, out=self.scratch)
            self.scratch.tanh_()
        return self.body(self.scratch)


def resize_build():
    m = ResizedOutBuffer()
    data = (torch.randn(2048, 64), torch.randint(0, 10, (2048,)))
    return m, torch.optim.SGD(m.parameters(), 0.02, momentum=0.9), data


def resize_loss(model, data):
    out = model(data[0])
    return F.cross_entropy(out, data[1][:out.shape[0]])


def _wide_activations():
    """Small weights, a large batch's activations: the budget binds on activations, not on weights."""
    return nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                         nn.Linear(256, 10))


def mmap_build():
    m = _wide_activations()
    with tempfile.TemporaryDirectory() as where:
        path = os.path.join(where, "weights.pt")
        torch.save(m.state_dict(), path)
        state = torch.load(path, mmap=True, weights_only=True)
        m.load_state_dict(state, assign=True)  # the parameters are now views of the mapped file (MAP_PRIVATE)
    return m, torch.optim.AdamW(m.parameters(), 1e-3), (torch.randn(2048, 128), torch.randint(0, 10, (2048,)))


class TinyLm(nn.Module):
    """A decoder with a key/value cache: forward(ids) for training, generate() for sampling with the cache."""

    def __init__(self, vocab=128, width=64, heads=4, layers=2, context=64):
        super().__init__()
        self.heads, self.context = heads, context
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.qkv = nn.ModuleList(nn.Linear(width, 3 * width) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(),
                                               nn.Linear(4 * width, width)) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def layer(self, k, h, cache, start):
        b, s, w = h.shape
        q, key, value = self.qkv[k](h).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        if cache is not None:  # preallocated (b, heads, context, w/heads) buffers written in place, as static caches do
            cache[k][0][:, :, start:start + s].copy_(key)
            cache[k][1][:, :, start:start + s].copy_(value)
            key, value = cache[k][0][:, :, :start + s], cache[k][1][:, :, :start + s]
        att = F.scaled_dot_product_attention(q, key, value, is_causal=cache is None)
        h = h + self.out[k](att.transpose(1, 2).reshape(b, s, w))
        return h + self.mlp[k](h)

    def forward(self, ids, cache=None, start=0):
        h = self.embed(ids) + self.position(torch.arange(start, start + ids.shape[1]))
        for k in range(len(self.qkv)):
            h = self.layer(k, h, cache, start)
        return self.head(self.norm(h))

    @torch.no_grad()
    def generate(self, prompt, new_tokens, generator):
        b, w = prompt.shape[0], self.embed.embedding_dim
        cache = [[torch.zeros(b, self.heads, self.context, w // self.heads) for _ in range(2)] for _ in self.qkv]
        logits = self(prompt, cache, 0)[:, -1]
        ids = [prompt]
        for t in range(new_tokens):
            token = torch.multinomial(F.softmax(logits, -1), 1, generator=generator)
            ids.append(token)
            logits = self(token, cache, prompt.shape[1] + t)[:, -1]
        return torch.cat(ids, 1)


def generate_build():
    m = TinyLm()
    return m, torch.optim.AdamW(m.parameters(), 1e-3), (torch.randint(0, 128, (8, 8)),)


def generate_step(model, opt, data, i):
    generator = torch.Generator().manual_seed(100 + i)
    model.eval()
    sample = model.generate(data[0], 24, generator)
    model.train()
    opt.zero_grad()
    logits = model(sample[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), sample[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    return loss


def hf_generate_build():
    import transformers as tf
    tf.logging.set_verbosity_error()
    cfg = tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64, pad_token_id=0,
                        eos_token_id=None)
    m = tf.GPT2LMHeadModel(cfg)
    return m, torch.optim.AdamW(m.parameters(), 1e-3), (torch.randint(1, 256, (4, 8)),)


def hf_generate_step(model, opt, data, i):
    """Transformers' own generate (sampling, its dynamic key/value cache), then a training step on the samples."""
    model.eval()
    with torch.no_grad():
        sample = model.generate(data[0], attention_mask=torch.ones_like(data[0]), do_sample=True, top_k=50,
                                max_new_tokens=16, min_new_tokens=16)
    model.train()
    opt.zero_grad()
    loss = model(input_ids=sample, labels=sample).loss
    loss.backward()
    opt.step()
    return loss


def safetensors_build():
    from safetensors.torch import load_file, save_file
    m = _wide_activations()
    with tempfile.TemporaryDirectory() as where:
        path = os.path.join(where, "weights.safetensors")
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, path)
        m.load_state_dict(load_file(path), assign=True)
    return m, torch.optim.AdamW(m.parameters(), 1e-3), (torch.randn(2048, 128), torch.randint(0, 10, (2048,)))


def flat_grads_build():
    """Every parameter and its gradient are views of two flat buffers (as ZeRO-style and apex optimizers arrange);
    backward accumulates into the gradient views in place and the optimizer steps the flat buffer."""
    m = nn.Sequential(nn.Linear(128, 512), nn.SiLU(), nn.Linear(512, 512), nn.SiLU(), nn.Linear(512, 10))
    total = sum(p.numel() for p in m.parameters())
    flat = torch.empty(total)
    flat_grad = torch.zeros(total)
    offset = 0
    for p in m.parameters():
        n = p.numel()
        flat[offset:offset + n].copy_(p.detach().reshape(-1))
        p.data = flat[offset:offset + n].view_as(p)
        p.grad = flat_grad[offset:offset + n].view_as(p)
        offset += n
    master = nn.Parameter(flat)  # the optimizer's view: one tensor over every parameter
    master.grad = flat_grad
    return m, torch.optim.SGD([master], 0.02, momentum=0.9), (torch.randn(256, 128), torch.randint(0, 10, (256,)))


def flat_grads_step(model, opt, data, i):
    for group in opt.param_groups:
        group["params"][0].grad.zero_()
    loss = ce_loss(model, data)
    loss.backward()
    opt.step()
    return loss


class RotaryComplex(nn.Module):
    """LLaMA's reference rotary embedding: queries and keys seen as complex numbers (view_as_complex of a float
    reshape), multiplied by a complex64 buffer made with torch.polar, and seen as floats again (view_as_real)."""

    def __init__(self, width=64, heads=4, seq=64):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))
        self.head = nn.Linear(width, 10)
        half = width // heads // 2
        angles = torch.outer(torch.arange(seq).float(), 1.0 / (10000 ** (torch.arange(half).float() / half)))
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles), persistent=False)

    def rotate(self, x):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * self.freqs_cis[:x.shape[1]].unsqueeze(1)).flatten(3).type_as(x)

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, w // self.heads).unbind(2)
        q, k = self.rotate(q), self.rotate(k)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        h = x + self.out(att.transpose(1, 2).reshape(b, s, w))
        return self.head((h + self.mlp(h)).mean(1))


def rotary_build():
    m = RotaryComplex()
    return m, torch.optim.AdamW(m.parameters(), 1e-3), (torch.randn(32, 64, 64), torch.randint(0, 10, (32,)))


def stochastic_rounding_step(model, opt, data, i):
    """SGD whose update is rounded to bfloat16 stochastically through the float32 bits (x.view(torch.int32)), as
    low-precision optimizers do, with the random bits drawn from a generator of its own."""
    generator = torch.Generator().manual_seed(7 + i)
    model.zero_grad()
    loss = ce_loss(model, data)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            updated = p - 0.05 * p.grad
            bits = updated.view(torch.int32)
            noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, generator=generator)
            rounded = (bits + noise).bitwise_and_(-65536)
            p.copy_(rounded.view(torch.float32))
    return loss


def stochastic_rounding_build():
    m = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10))
    return m, None, (torch.randn(1024, 128), torch.randint(0, 10, (1024,)))


PROGRAMS = {
    "out_buffer_resized": (resize_build, std_step(resize_loss)),
    "mmap_loaded_weights": (mmap_build, std_step(ce_loss)),
    "generate_then_train": (generate_build, generate_step),
    "hf_generate_then_train": (hf_generate_build, hf_generate_step),
    "safetensors_loaded_weights": (safetensors_build, std_step(ce_loss)),
    "flat_grad_buffers": (flat_grads_build, flat_grads_step),
    "rotary_view_as_complex": (rotary_build, std_step(ce_loss)),
    "stochastic_rounding_int_view": (stochastic_rounding_build, stochastic_rounding_step),
}
