"""Programs whose state reaches a step by a side channel: random layers that write their noise into a tensor
(RReLU) or draw their own samples (fractional max pooling), batch norm's cumulative average (momentum=None, which
reads num_batches_tracked on the host), ops writing into buffers the program keeps across steps (out=), the
autograd profiler with memory profiling, features kept in Python between steps, a loss computed from numpy on the
host, a model reading an observation buffer numpy rewrites, saved-tensor hooks through numpy, and a gradient hook
writing through numpy under a cached parametrization, PPO over a rollout buffer written in place, and a
diffusion-style step (random timesteps and noise, guidance dropout, an EMA of the weights)."""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import std_step


def ce_loss(model, data):
    return F.cross_entropy(model(data[0]), data[1])


def image_data(batch=16, side=32, classes=10):
    return (torch.randn(batch, 3, side, side), torch.randint(0, classes, (batch,)))


# 1. RReLU in training (rrelu_with_noise writes the slopes it drew into a noise tensor its backward reads) and
#    fractional max pooling (samples drawn inside the op)
class RandomLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 32, 3, padding=1)
        self.act = nn.RReLU()
        self.pool = nn.FractionalMaxPool2d(2, output_ratio=0.6)
        self.c2 = nn.Conv2d(32, 32, 3, padding=1)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        h = self.pool(self.act(self.c1(x)))
        h = self.act(self.c2(h))
        return self.head(h.mean((2, 3)))


def random_layers_build():
    m = RandomLayers()
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), image_data()


# 2. batch norm with momentum=None: a cumulative average whose factor comes from num_batches_tracked on the host
def cumulative_bn_build():
    m = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32, momentum=None), nn.ReLU(),
                      nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32, momentum=None), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    return m, torch.optim.SGD(m.parameters(), 0.05), image_data()


# 3. ops writing into buffers kept across steps (out=): a projection workspace and a running feature sum
class OutBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(64, 256)
        self.w2 = nn.Linear(256, 10)
        self.register_buffer("workspace", torch.zeros(1024, 256))
        self.register_buffer("feature_sum", torch.zeros(256))

    def forward(self, x):
        with torch.no_grad():
            torch.matmul(x, self.w1.weight.t(), out=self.workspace)  # a side computation into a kept buffer
            torch.add(self.feature_sum, self.workspace.sum(0), out=self.feature_sum)
        h = torch.tanh(self.w1(x) + 1e-3 * self.feature_sum)
        return self.w2(h)


def out_buffers_build():
    m = OutBuffers()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(1024, 64), torch.randint(0, 10, (1024,)))


# 4. the autograd profiler with memory profiling around every step (its allocation reports come through remat's
#    allocator)
def profiled_step(model, opt, data, i):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                record_shapes=True) as prof:
        loss = std_step(ce_loss)(model, opt, data, i)
    assert len(prof.key_averages()) > 0
    return loss


def profiled_build():
    m = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                      nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    return m, torch.optim.SGD(m.parameters(), 0.05), image_data()


# 5. features kept in a Python list across steps (a memory bank of detached embeddings, read by a contrastive loss)
class Bank(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 128))
        self.bank = []

    def forward(self, x):
        z = F.normalize(self.enc(x), dim=1)
        loss = -(z * z.roll(1, 0)).sum(1).mean()
        for old in self.bank:
            loss = loss + (z @ old.t()).logsumexp(1).mean() * 0.1
        self.bank = (self.bank + [z.detach()])[-3:]
        return loss


def bank_build():
    m = Bank()
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(256, 64),)


# 6. a loss weight computed on the host with numpy from the model's outputs every step (.detach().numpy())
def host_weight_loss(model, data):
    out = model(data[0])
    probs = torch.softmax(out, 1).detach().numpy()
    weights = torch.from_numpy((1.0 - probs.max(1)).astype(np.float32))  # harder samples count more
    return (F.cross_entropy(out, data[1], reduction="none") * weights).mean()


def host_weight_build():
    m = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    return m, torch.optim.SGD(m.parameters(), 0.05), (torch.randn(256, 64), torch.randint(0, 10, (256,)))


# 7. an environment loop: numpy writes each step's observations into one buffer the model reads via from_numpy, and
#    the previous step's value estimate (computed from the previous observations) is the target of this step's
#    (a replay of the previous estimate would read the new observations)
class ValueNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 1))
        self.buffer = np.zeros((2048, 32), dtype=np.float32)
        self.obs = torch.from_numpy(self.buffer)
        self.previous = None


def env_step(model, opt, data, i):
    model.buffer[:] = np.random.default_rng(i).standard_normal((2048, 32), dtype=np.float32)
    value = model.body(model.obs)
    loss = value.pow(2).mean()
    if model.previous is not None:
        loss = loss + (value - 0.9 * model.previous).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    model.previous = value.detach()
    return loss


def env_build():
    m = ValueNet()
    return m, torch.optim.Adam(m.parameters(), 1e-3), ()


# 8. saved-tensor hooks that pack activations into numpy arrays and unpack them with torch.from_numpy (a user's own
#    offloading: the unpacked tensors are borrowed memory)
def numpy_hooks_step(model, opt, data, i):
    def pack(t):
        return t.detach().numpy().copy() if t.dtype == torch.float32 and t.dim() > 1 else t

    def unpack(saved):
        return torch.from_numpy(saved) if isinstance(saved, np.ndarray) else saved

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = ce_loss(model, data)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def numpy_hooks_build():
    m = nn.Sequential(nn.Linear(64, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 10))
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9), (torch.randn(512, 64),
                                                                     torch.randint(0, 10, (512,)))


# 9. gradient hooks that scale a gradient in place through numpy, and a parametrization cached for the step
class Orthogonal(nn.Module):
    def forward(self, w):
        return torch.linalg.qr(w)[0]


def grad_numpy_build():
    from torch.nn.utils import parametrize
    m = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 10))
    parametrize.register_parametrization(m[2], "weight", Orthogonal())

    def halve(grad):
        grad.numpy()[...] *= 0.5  # written through the export
        return grad
    m[0].weight.register_hook(halve)
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(512, 64), torch.randint(0, 10, (512,)))


def cached_parametrization_step(model, opt, data, i):
    from torch.nn.utils import parametrize
    with parametrize.cached():
        return std_step(ce_loss)(model, opt, data, i)


# 10. PPO-style: a rollout buffer (tensors the program keeps) written row by row in place under no_grad from the
#     policy's own outputs, advantages computed backwards in time, then two epochs of shuffled minibatch updates of a
#     clipped surrogate over the buffer
class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(24, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh())
        self.pi = nn.Linear(512, 6)
        self.v = nn.Linear(512, 1)
        self.obs = torch.zeros(16, 256, 24)
        self.actions = torch.zeros(16, 256, dtype=torch.long)
        self.logp = torch.zeros(16, 256)
        self.values = torch.zeros(16, 256)
        self.rewards = torch.zeros(16, 256)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def ppo_step(model, opt, data, i):
    generator = torch.Generator().manual_seed(100 + i)
    with torch.no_grad():
        obs = torch.randn(256, 24, generator=generator)
        for t in range(16):
            logits, value = model(obs)
            dist = torch.distributions.Categorical(logits=logits)
            action = dist.sample()
            model.obs[t] = obs
            model.actions[t] = action
            model.logp[t] = dist.log_prob(action)
            model.values[t] = value
            model.rewards[t] = (action == 2).float() - 0.01 * obs.pow(2).mean(1)
            obs = 0.9 * obs + 0.1 * torch.randn(256, 24, generator=generator)
        advantages = torch.zeros_like(model.rewards)
        running = torch.zeros(256)
        for t in reversed(range(16)):
            running = model.rewards[t] - model.values[t] + 0.99 * running
            advantages[t] = running
        returns = advantages + model.values
    flat = lambda t: t.reshape(16 * 256, *t.shape[2:])  # noqa: E731
    obs_b, act_b, logp_b, adv_b, ret_b = map(flat, (model.obs, model.actions, model.logp, advantages, returns))
    loss = None
    for epoch in range(2):
        order = torch.randperm(16 * 256, generator=generator)
        for start in range(0, 16 * 256, 1024):
            idx = order[start:start + 1024]
            logits, value = model(obs_b[idx])
            logp = torch.distributions.Categorical(logits=logits).log_prob(act_b[idx])
            ratio = (logp - logp_b[idx]).exp()
            surrogate = torch.min(ratio * adv_b[idx], ratio.clamp(0.8, 1.2) * adv_b[idx])
            loss = -surrogate.mean() + 0.5 * (value - ret_b[idx]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
    return loss


def ppo_build():
    m = ActorCritic()
    return m, torch.optim.Adam(m.parameters(), 3e-4), ()


# 11. diffusion-style: random timesteps per sample, noise drawn in the step, classifier-free guidance dropout of the
#     condition by a random mask, sinusoidal time embeddings, and an EMA of the weights updated after every step
class TinyDenoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.time = nn.Sequential(nn.Linear(64, 128), nn.SiLU(), nn.Linear(128, 128))
        self.cond = nn.Embedding(11, 128)
        self.inp = nn.Conv2d(3, 64, 3, padding=1)
        self.mid = nn.Sequential(nn.GroupNorm(8, 64), nn.SiLU(), nn.Conv2d(64, 64, 3, padding=1), nn.GroupNorm(8, 64),
                                 nn.SiLU(), nn.Conv2d(64, 64, 3, padding=1))
        self.out = nn.Conv2d(64, 3, 3, padding=1)

    def forward(self, x, t, c):
        freqs = torch.exp(-torch.arange(32) * (9.2 / 32))
        emb = torch.cat([torch.sin(t[:, None] * freqs), torch.cos(t[:, None] * freqs)], 1)
        scale = (self.time(emb) + self.cond(c))[:, :64, None, None]
        h = self.inp(x)
        return self.out(h + self.mid(h * (1 + scale)))


def diffusion_step(model, opt, data, i):
    x0, c = data
    t = torch.randint(0, 1000, (x0.shape[0],)).float()
    alpha = torch.cos(t / 1000 * 1.5707963)[:, None, None, None]
    noise = torch.randn_like(x0)
    c = torch.where(torch.rand(c.shape) < 0.1, torch.full_like(c, 10), c)  # drop the condition for guidance
    loss = F.mse_loss(model(alpha * x0 + (1 - alpha ** 2).sqrt() * noise, t, c), noise)
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        for e, p in zip(model.ema, model.parameters()):
            e.lerp_(p, 0.01)
    return loss


def diffusion_build():
    m = TinyDenoiser()
    m.ema = [p.detach().clone() for p in m.parameters()]
    return m, torch.optim.AdamW(m.parameters(), 1e-3), (torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))


PROGRAMS = {
    "rrelu_fractional_pool": (random_layers_build, std_step(ce_loss)),
    "batch_norm_cumulative": (cumulative_bn_build, std_step(ce_loss)),
    "out_buffers_across_steps": (out_buffers_build, std_step(ce_loss)),
    "profiler_memory": (profiled_build, profiled_step),
    "feature_bank": (bank_build, std_step(lambda m, d: m(d[0]))),
    "host_numpy_weights": (host_weight_build, std_step(host_weight_loss)),
    "numpy_observation_buffer": (env_build, env_step),
    "numpy_saved_tensor_hooks": (numpy_hooks_build, numpy_hooks_step),
    "numpy_grad_hook_cached_parametrization": (grad_numpy_build, cached_parametrization_step),
    "ppo_rollout_buffer": (ppo_build, ppo_step),
    "diffusion_cfg_ema": (diffusion_build, diffusion_step),
}
