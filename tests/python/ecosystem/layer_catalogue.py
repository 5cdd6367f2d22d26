"""Layers and tensor ops the other programs do not reach: a causal TransformerDecoder (pre-norm, a generated square
mask with tgt_is_causal, cross-attention to an encoded memory), RMSNorm, PReLU, LocalResponseNorm, max pooling
whose indices MaxUnpool2d reads back, a weighted EmbeddingBag with offsets, cumulative sums and products, and
attention written with einsum, baddbmm and bmm behind a forward pre-hook that rewrites its keyword arguments."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import std_step


def ce_loss(model, data):
    return F.cross_entropy(model(*data[:-1]), data[-1])


# 1. a decoder-only stack as sequence models build it from torch.nn: pre-norm TransformerDecoderLayers with dropout,
#    a causal mask from generate_square_subsequent_mask (tgt_is_causal=True), cross-attention to an encoded prefix
class CausalDecoder(nn.Module):
    def __init__(self, vocab=96, d=64, length=48):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.memory = nn.Sequential(nn.Linear(d, d), nn.GELU())
        layer = nn.TransformerDecoderLayer(d, 4, dim_feedforward=128, dropout=0.1, batch_first=True, norm_first=True)
        self.decoder = nn.TransformerDecoder(layer, num_layers=2)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(length))

    def forward(self, tokens, prefix):
        memory = self.memory(self.embed(prefix))
        h = self.decoder(self.embed(tokens), memory, tgt_mask=self.mask, tgt_is_causal=True)
        return self.head(h).flatten(0, 1)


def decoder_build():
    m = CausalDecoder()
    tokens = torch.randint(0, 96, (16, 49))
    return m, torch.optim.AdamW(m.parameters(), 1e-3), (tokens[:, :-1], torch.randint(0, 96, (16, 12)),
                                                       tokens[:, 1:].flatten())


# 2. normalizations and activations with parameters or windows of their own, and max pooling whose indices
#    (an integer tensor, saved for backward too) MaxUnpool2d reads to scatter the values back
class NormsAndUnpooling(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.act1 = nn.PReLU(16)
        self.lrn = nn.LocalResponseNorm(5)
        self.pool = nn.MaxPool2d(2, return_indices=True)
        self.unpool = nn.MaxUnpool2d(2)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.act2 = nn.PReLU()
        self.norm = nn.RMSNorm([16 * 16 * 16])
        self.head = nn.Linear(16 * 16 * 16, 10)

    def forward(self, x):
        h = self.lrn(self.act1(self.conv1(x)))
        pooled, indices = self.pool(h)
        h = self.unpool(pooled, indices, output_size=h.shape) + h
        h = self.act2(self.conv2(h))
        return self.head(self.norm(h.flatten(1)))


def norms_build():
    m = NormsAndUnpooling()
    return m, torch.optim.SGD(m.parameters(), 0.01, momentum=0.9), (torch.randn(32, 3, 16, 16),
                                                                   torch.randint(0, 10, (32,)))


# 3. bags of tokens summed with per-sample weights (EmbeddingBag with offsets, as recommender models use), and
#    running features from cumsum and cumprod along the bag
class WeightedBags(nn.Module):
    def __init__(self, vocab=5000, d=128):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, d, mode="sum")
        self.gate = nn.Linear(d, d)
        self.head = nn.Sequential(nn.Linear(2 * d, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))

    def forward(self, ids, offsets, weights):
        h = self.bag(ids, offsets, per_sample_weights=weights)
        running = torch.cumsum(h, dim=1) / h.shape[1]
        decay = torch.cumprod(torch.sigmoid(self.gate(h)), dim=1)
        return self.head(torch.cat([running, decay * h], dim=1))


def bags_build():
    m = WeightedBags()
    lengths = torch.randint(1, 20, (2048,))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    ids = torch.randint(0, 5000, (int(lengths.sum()),))
    weights = torch.rand(ids.shape[0])
    return m, torch.optim.Adam(m.parameters(), 1e-3), (ids, offsets, weights, torch.randint(0, 10, (2048,)))


# 4. attention written by hand with einsum, baddbmm (a learned bias added to the scores) and bmm, behind a forward
#    pre-hook registered with_kwargs that rewrites a keyword argument (a temperature) before every call
class EinsumAttention(nn.Module):
    def __init__(self, d=64, length=32):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.bias = nn.Parameter(torch.zeros(length, length))
        self.out = nn.Linear(d, d)

    def forward(self, x, temperature=1.0):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = torch.baddbmm(self.bias.expand(x.shape[0], -1, -1), q, k.transpose(1, 2), alpha=1 / temperature)
        weights = torch.einsum("bij->bij", scores.softmax(-1))
        return self.out(torch.bmm(weights, v)) + x


class EinsumNet(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.embed = nn.Linear(16, d)
        self.blocks = nn.ModuleList(EinsumAttention(d) for _ in range(3))
        for block in self.blocks:
            block.register_forward_pre_hook(self.sharpen, with_kwargs=True)
        self.head = nn.Linear(d, 10)

    @staticmethod
    def sharpen(module, args, kwargs):
        return args, {**kwargs, "temperature": 8.0 ** 0.5}

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h, temperature=1.0)
        return self.head(torch.einsum("bld->bd", h) / h.shape[1])


def einsum_build():
    m = EinsumNet()
    return m, torch.optim.RMSprop(m.parameters(), 1e-3), (torch.randn(64, 32, 16), torch.randint(0, 10, (64,)))


PROGRAMS = {
    "transformer_decoder_causal": (decoder_build, std_step(ce_loss)),
    "norms_prelu_unpool": (norms_build, std_step(ce_loss)),
    "embedding_bag_weighted": (bags_build, std_step(ce_loss)),
    "einsum_baddbmm_pre_hook": (einsum_build, std_step(ce_loss)),
}
