"""Programs that rebuild or convert their model while training, and forwards that write what they compute into
buffers: a model re-materialized in the middle of a run (to_empty, then every module's reset_parameters, as a
meta-device initialization does), parameters converted with torch.utils.swap_tensors (channels_last under
torch.__future__'s swap, load_state_dict(assign=True) under it), a VQ-VAE whose forward updates its codebook's
moving averages with index_add_, bucketize/searchsorted/histc choosing the embeddings a forward reads, a backward
limited to some parameters (backward(inputs=...)), boolean-mask writes (x[mask] = y, masked_scatter, index_put
with accumulate) inside a differentiated forward, and parameters moved to shared memory mid-run (share_memory())."""
import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import std_step


def ce_loss(model, data):
    return F.cross_entropy(model(data[0]), data[1])


def conv_net():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                         nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                         nn.Linear(128, 10))


def image_data(n=48, side=32):
    return torch.randn(n, 3, side, side), torch.randint(0, 10, (n,))


@contextlib.contextmanager
def swapping_conversions():
    """Module conversions (to(), load_state_dict(assign=True)) swap the parameters' contents in place
    (torch.utils.swap_tensors) instead of assigning .data; restored after."""
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


# 1. re-materialized mid-run: to_empty gives every parameter and buffer a fresh uninitialized storage, then each
#    module's reset_parameters draws new values into it (what a meta-device initialization runs)
def reinit_step(model, opt, data, i):
    if i == 1:
        model.to_empty(device="cpu")
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
        opt.state.clear()
    return std_step(ce_loss)(model, opt, data, i)


def reinit_build():
    m = nn.Sequential(nn.Linear(128, 256), nn.LayerNorm(256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                      nn.Linear(256, 10))
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(2048, 128), torch.randint(0, 10, (2048,)))


# 2. converted to channels_last mid-run with swap_tensors (the optimizer keeps the same Parameter objects)
def channels_last_step(model, opt, data, i):
    if i == 1:
        with swapping_conversions():
            model.to(memory_format=torch.channels_last)
    return std_step(ce_loss)(model, opt, data, i)


def channels_last_build():
    m = conv_net()
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), image_data()


# 3. load_state_dict(assign=True) under swap: an averaged copy of the weights swapped into the live parameters
def assign_step(model, opt, data, i):
    loss = std_step(ce_loss)(model, opt, data, i)
    if i == 1:
        with torch.no_grad():
            averaged = {k: (v * 0.5 + v.roll(1, 0) * 0.5 if v.is_floating_point() else v.clone())
                        for k, v in model.state_dict().items()}
        with swapping_conversions():
            model.load_state_dict(averaged, assign=True)
    return loss


def assign_build():
    m = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.LayerNorm(256),
                      nn.Linear(256, 10))
    return m, torch.optim.AdamW(m.parameters(), 1e-3), (torch.randn(512, 128), torch.randint(0, 10, (512,)))


# 4. VQ-VAE: the forward picks each vector's nearest code (cdist, argmin) and updates the codebook's moving averages
#    in its buffers (index_add_, mul_, add_ under no_grad); straight-through gradient to the encoder
class VectorQuantizer(nn.Module):
    def __init__(self, codes=64, dim=32, decay=0.9):
        super().__init__()
        self.decay = decay
        self.register_buffer("codebook", torch.randn(codes, dim))
        self.register_buffer("cluster_size", torch.ones(codes))
        self.register_buffer("code_sum", self.codebook.clone())

    def forward(self, z):
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        index = torch.cdist(flat, self.codebook).argmin(dim=1)
        quantized = self.codebook[index].view(z.shape[0], z.shape[2], z.shape[3], -1).permute(0, 3, 1, 2)
        if self.training:
            with torch.no_grad():
                counts = torch.zeros_like(self.cluster_size).index_add_(0, index, torch.ones_like(index, dtype=z.dtype))
                sums = torch.zeros_like(self.code_sum).index_add_(0, index, flat)
                self.cluster_size.mul_(self.decay).add_(counts, alpha=1 - self.decay)
                self.code_sum.mul_(self.decay).add_(sums, alpha=1 - self.decay)
                self.codebook.copy_(self.code_sum / (self.cluster_size.unsqueeze(1) + 1e-5))
        commitment = F.mse_loss(z, quantized.detach())
        return z + (quantized - z).detach(), commitment


class VqVae(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(3, 32, 4, 2, 1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1))
        self.quantizer = VectorQuantizer()
        self.decoder = nn.Sequential(nn.ConvTranspose2d(32, 32, 4, 2, 1), nn.ReLU(), nn.Conv2d(32, 3, 3, padding=1))

    def forward(self, x):
        quantized, commitment = self.quantizer(self.encoder(x))
        return F.mse_loss(self.decoder(quantized), x) + 0.25 * commitment


def vqvae_build():
    m = VqVae()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(24, 3, 32, 32),)


# 5. bins: bucketize and searchsorted choose the rows of an embedding a forward reads; histc weighs them
class BinnedFeatures(nn.Module):
    def __init__(self, bins=32, dim=32):
        super().__init__()
        self.register_buffer("edges", torch.linspace(-2, 2, bins - 1))
        self.embed = nn.Embedding(bins, dim)
        self.body = nn.Sequential(nn.Linear(dim * 2, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(),
                                  nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 10))

    def forward(self, x):
        h = torch.tanh(x) * 2
        coarse = torch.bucketize(h.detach(), self.edges)
        fine = torch.searchsorted(self.edges, h.detach().contiguous(), right=True)
        counts = torch.histc(h.detach(), bins=self.embed.num_embeddings, min=-2, max=2)
        weight = (counts / counts.sum())[coarse].unsqueeze(-1)
        features = torch.cat([(self.embed(coarse) * weight).mean(1), self.embed(fine).mean(1) * h.mean(1, True)], 1)
        return self.body(features)


def binned_build():
    m = BinnedFeatures()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(2048, 8), torch.randint(0, 10, (2048,)))


# 6. a backward limited to some parameters: the head from one loss, the body from another (inputs=)
def partial_step(model, opt, data, i):
    opt.zero_grad()
    features = model["body"](data[0])
    logits = model["head"](features)
    head_loss = F.cross_entropy(logits, data[1])
    body_loss = features.pow(2).mean() * 0.01 + F.cross_entropy(logits, data[1].flip(0))
    head_loss.backward(inputs=list(model["head"].parameters()), retain_graph=True)
    body_loss.backward(inputs=list(model["body"].parameters()))
    opt.step()
    return head_loss.detach() + body_loss.detach()


def partial_build():
    body = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
    m = nn.ModuleDict({"body": body, "head": nn.Linear(256, 10)})
    data = torch.randn(2048, 128), torch.randint(0, 10, (2048,))
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), data


# 7. boolean-mask writes in a differentiated forward: x[mask] = y, masked_scatter_, index_put_ with accumulate
class MaskedWrites(nn.Module):
    def __init__(self, d=128):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)
        self.out = nn.Linear(d, 10)

    def forward(self, x):
        h = self.a(x)
        mask = h.detach() > 0.3
        g = h.clone()
        g[mask] = self.b(x)[mask] * 0.5
        g = g.masked_scatter(~mask, torch.tanh(h)[~mask])
        rows = torch.nonzero(mask.any(1)).squeeze(1)
        g = g.index_put((rows,), self.b(h)[rows], accumulate=True)
        return self.out(torch.relu(g))


def masked_build():
    m = MaskedWrites()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(2048, 128), torch.randint(0, 10, (2048,)))


# 8. moved to shared memory mid-run, as a Hogwild trainer does before it starts its workers: share_memory() gives every
#    parameter and buffer a shared-memory storage (the same StorageImpl, its bytes moved out of remat's arena, where
#    the first step's clone put them)
def share_memory_step(model, opt, data, i):
    if i == 0:
        with torch.no_grad():
            for p in model.parameters():
                p.data = p.data.clone()
    if i == 1:
        model.share_memory()
        assert all(p.is_shared() for p in model.parameters())
    return std_step(ce_loss)(model, opt, data, i)


def share_memory_build():
    m = nn.Sequential(nn.Linear(128, 512), nn.Tanh(), nn.Linear(512, 512), nn.BatchNorm1d(512), nn.Tanh(),
                      nn.Linear(512, 10))
    data = torch.randn(2048, 128), torch.randint(0, 10, (2048,))
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), data


PROGRAMS = {
    "reinit_to_empty": (reinit_build, reinit_step),
    "swap_channels_last": (channels_last_build, channels_last_step),
    "swap_load_state_dict_assign": (assign_build, assign_step),
    "vqvae_ema_codebook": (vqvae_build, std_step(lambda m, d: m(d[0]))),
    "binned_lookup": (binned_build, std_step(ce_loss)),
    "partial_backward_inputs": (partial_build, partial_step),
    "boolean_mask_writes": (masked_build, std_step(ce_loss)),
    "share_memory_mid_run": (share_memory_build, share_memory_step),
}
