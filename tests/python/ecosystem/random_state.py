"""Programs that steer torch's random state themselves, and autograd Functions written the less common ways: a forward
that rewinds the global generator (get_rng_state/set_rng_state) to draw one dropout mask twice, noise drawn under
torch.random.fork_rng with a seed of its own, self-normalizing layers with AlphaDropout and FeatureAlphaDropout,
gradient noise drawn in a tensor hook during backward, checkpoint_sequential with preserve_rng_state=False (its
recomputation draws new masks), variable-length sequences through pad_sequence, a packed GRU and
pad_packed_sequence, and a custom Function with once_differentiable, set_materialize_grads(False), a tensor kept on
ctx as an attribute and an output that gets no gradient."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence
from torch.utils.checkpoint import checkpoint_sequential

from .harness import std_step


def ce_loss(model, data):
    return F.cross_entropy(model(data[0]), data[1])


def mlp_data(n=2048, d=128):
    return torch.randn(n, d), torch.randint(0, 10, (n,))


# 1. one dropout mask drawn twice: the forward saves the global generator's state and rewinds it (siamese branches
#    that must see the same mask, as R-Drop's ablations and consistency losses do)
class RewoundDropout(nn.Module):
    def __init__(self, d=128):
        super().__init__()
        self.a = nn.Linear(d, 512)
        self.b = nn.Linear(d, 512)
        self.out = nn.Linear(512, 10)

    def forward(self, x):
        state = torch.get_rng_state()
        left = F.dropout(torch.relu(self.a(x)), 0.3, self.training)
        torch.set_rng_state(state)
        right = F.dropout(torch.relu(self.b(x)), 0.3, self.training)
        return self.out(left + right)


def rewind_build():
    m = RewoundDropout()
    return m, torch.optim.Adam(m.parameters(), 1e-3), mlp_data()


# 2. noise drawn under fork_rng with a seed of its own (a fixed augmentation), between dropout layers that draw from
#    the global generator, which fork_rng restores on exit
class ForkedNoise(nn.Module):
    def __init__(self, d=128):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, 512), nn.ReLU(), nn.Dropout(0.2))
        self.head = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Dropout(0.2), nn.Linear(512, 10))

    def forward(self, x):
        h = self.body(x)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1234)
            h = h + 0.1 * torch.randn_like(h)
        return self.head(h)


def fork_build():
    m = ForkedNoise()
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), mlp_data()


# 3. self-normalizing layers: SELU with AlphaDropout, and FeatureAlphaDropout on a convolution's channels
def selu_build():
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.SELU(), nn.FeatureAlphaDropout(0.1),
                      nn.Conv2d(16, 16, 3, padding=1), nn.SELU(), nn.Flatten(), nn.Linear(16 * 16 * 16, 256),
                      nn.SELU(), nn.AlphaDropout(0.1), nn.Linear(256, 256), nn.SELU(), nn.AlphaDropout(0.1),
                      nn.Linear(256, 10))
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(128, 3, 16, 16), torch.randint(0, 10, (128,)))


# 4. gradient noise drawn during backward: a hook on a hidden activation adds torch.randn_like(grad) (the global
#    generator, between the replays remat runs in the same backward)
class NoisyGradients(nn.Module):
    def __init__(self, d=128):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d if i == 0 else 512, 512) for i in range(4))
        self.out = nn.Linear(512, 10)

    def forward(self, x):
        h = x
        for layer in self.layers:
            h = F.dropout(torch.tanh(layer(h)), 0.1, self.training)
            if h.requires_grad:
                h.register_hook(lambda g: g + 1e-3 * torch.randn_like(g))
        return self.out(h)


def grad_noise_build():
    m = NoisyGradients()
    return m, torch.optim.Adam(m.parameters(), 1e-3), mlp_data()


# 5. checkpoint_sequential (non-reentrant) with preserve_rng_state=False: the recomputation in backward draws new
#    dropout masks from wherever the global generator is then (torch's documented behaviour, which remat must keep)
def unpreserved_step(model, opt, data, i):
    opt.zero_grad()
    out = checkpoint_sequential(model, 3, data[0], use_reentrant=False, preserve_rng_state=False)
    loss = F.cross_entropy(out, data[1])
    loss.backward()
    opt.step()
    return loss


def unpreserved_build():
    layers = []
    for i in range(6):
        layers += [nn.Linear(128 if i == 0 else 512, 512), nn.GELU(), nn.Dropout(0.2)]
    m = nn.Sequential(*layers, nn.Linear(512, 10))
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), mlp_data()


# 6. variable-length sequences: pad_sequence, pack_padded_sequence (unsorted), a two-layer bidirectional GRU with
#    dropout, pad_packed_sequence, a masked mean over the valid steps
class PackedGru(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(32, 64, num_layers=2, dropout=0.2, bidirectional=True, batch_first=True)
        self.out = nn.Linear(128, 10)

    def forward(self, sequences, lengths):
        padded = pad_sequence(sequences, batch_first=True)
        packed = pack_padded_sequence(padded, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.gru(packed)
        out, out_lengths = pad_packed_sequence(out, batch_first=True)
        mask = torch.arange(out.shape[1]).unsqueeze(0) < out_lengths.unsqueeze(1)
        return self.out((out * mask.unsqueeze(-1)).sum(1) / out_lengths.unsqueeze(1))


def packed_gru_build():
    m = PackedGru()
    lengths = torch.randint(8, 48, (64,))
    sequences = [torch.randn(int(n), 32) for n in lengths]
    return m, torch.optim.Adam(m.parameters(), 1e-3), (sequences, lengths, torch.randint(0, 10, (64,)))


def packed_gru_loss(model, data):
    return F.cross_entropy(model(data[0], data[1]), data[2])


# 7. a custom Function written the less common ways: once_differentiable backward, set_materialize_grads(False) (the
#    unused output's gradient arrives as None), a mask kept on ctx as an attribute rather than saved, its output saved
class GatedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        ctx.set_materialize_grads(False)
        mask = x > 0
        y = torch.where(mask, x * weight, x * 0.1)
        ctx.mask = mask
        ctx.save_for_backward(y, weight)
        return y, mask.sum(1).to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y, grad_count):
        assert grad_count is None
        y, weight = ctx.saved_tensors
        if grad_y is None:
            return None, None
        grad_x = torch.where(ctx.mask, grad_y * weight, grad_y * 0.1)
        grad_w = (grad_y * torch.where(ctx.mask, y / weight, torch.zeros_like(y))).sum(0)
        return grad_x, grad_w


class GatedNet(nn.Module):
    def __init__(self, d=128):
        super().__init__()
        self.a = nn.Linear(d, 512)
        self.gate = nn.Parameter(torch.ones(512) * 0.9)
        self.b = nn.Linear(512, 512)
        self.gate2 = nn.Parameter(torch.ones(512) * 1.1)
        self.out = nn.Linear(512, 10)

    def forward(self, x):
        h, _ = GatedScale.apply(self.a(x), self.gate)
        h, count = GatedScale.apply(self.b(h), self.gate2)
        return self.out(h) + 0 * count.detach().unsqueeze(1)


def gated_build():
    m = GatedNet()
    return m, torch.optim.Adam(m.parameters(), 1e-3), mlp_data()


PROGRAMS = {
    "rng_state_rewound_dropout": (rewind_build, std_step(ce_loss)),
    "fork_rng_seeded_noise": (fork_build, std_step(ce_loss)),
    "selu_alpha_dropout": (selu_build, std_step(ce_loss)),
    "grad_noise_hook": (grad_noise_build, std_step(ce_loss)),
    "checkpoint_sequential_unpreserved_rng": (unpreserved_build, unpreserved_step),
    "packed_gru_pad_sequence": (packed_gru_build, std_step(packed_gru_loss)),
    "function_once_differentiable": (gated_build, std_step(ce_loss)),
}
