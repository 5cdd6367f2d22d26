"""Programs whose training set-up changes between steps, as fine-tuning and trainers' recovery code do: a frozen
backbone (its batch norm in eval mode) unfrozen after the first step, a layer made mid-run (under remat, so its
parameters live in remat's memory) joining the optimizer with add_param_group, model and optimizer rolled back to
state dicts taken after the first step (load_state_dict copies into the live tensors and replaces the optimizer's
state), full backward pre-hooks that scale gradients flowing into modules beside full backward hooks that log what
flows out, ReduceLROnPlateau stepping on a validation loss with every step's validation outputs kept to the end,
and an output layer tied to the embedding after the first step (the optimizer still lists the untied weight)."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import std_step


def ce_loss(model, data):
    return F.cross_entropy(model(data[0]), data[1])


def mlp(d_in=128, width=512, classes=10):
    return nn.Sequential(nn.Linear(d_in, width), nn.GELU(), nn.Linear(width, width), nn.LayerNorm(width), nn.GELU(),
                         nn.Linear(width, width), nn.Tanh(), nn.Linear(width, classes))


def vectors(n=1024, d=128, classes=10):
    return torch.randn(n, d), torch.randint(0, classes, (n,))


# 1. fine-tuning: the backbone frozen (requires_grad off, its batch norm in eval mode) for the first step, unfrozen
#    from the second; AdamW over every parameter from the start (a frozen one has no gradient and is skipped)
def unfreeze_step(model, opt, data, i):
    if i == 1:
        model["backbone"].requires_grad_(True)
        model["backbone"].train()
    opt.zero_grad()
    loss = F.cross_entropy(model["head"](model["backbone"](data[0])), data[1])
    loss.backward()
    opt.step()
    return loss


def unfreeze_build():
    backbone = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                             nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    m = nn.ModuleDict({"backbone": backbone, "head": nn.Linear(64, 10)})
    backbone.requires_grad_(False)
    backbone.eval()
    data = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    return m, torch.optim.AdamW(m.parameters(), 1e-3), data


# 2. progressive growing: at the second step a new layer is made (inside remat) and joins the model and, with
#    add_param_group, the optimizer at its own learning rate
class Growing(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = mlp(classes=256)
        self.heads = nn.ModuleList([nn.Linear(256, 10)])

    def forward(self, x):
        h = torch.relu(self.body(x))
        return sum(head(h) for head in self.heads)


def grow_step(model, opt, data, i):
    if i == 1:
        head = nn.Linear(256, 10)
        model.heads.append(head)
        opt.add_param_group({"params": head.parameters(), "lr": 3e-3})
    return std_step(ce_loss)(model, opt, data, i)


def grow_build():
    m = Growing()
    return m, torch.optim.Adam(m.parameters(), 1e-3), vectors()


# 3. rollback: state dicts copied after the first step (deepcopy, inside remat) are loaded back before the third, as
#    a trainer that restores its last good checkpoint after a loss spike does; load_state_dict copies the saved
#    values into the live parameters and gives the optimizer new state tensors
def rollback_step(model, opt, data, i):
    if i == 2:
        model.load_state_dict(model.saved_model)
        opt.load_state_dict(model.saved_optimizer)
    loss = std_step(ce_loss)(model, opt, data, i)
    if i == 0:
        model.saved_model = copy.deepcopy(model.state_dict())
        model.saved_optimizer = copy.deepcopy(opt.state_dict())
    return loss


def rollback_build():
    m = nn.Sequential(nn.Linear(128, 512), nn.BatchNorm1d(512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Dropout(0.1), nn.Linear(512, 10))
    return m, torch.optim.SGD(m.parameters(), 0.05, momentum=0.9, weight_decay=1e-4), vectors()


# 4. full backward pre-hooks scale the gradient flowing into two modules; full backward hooks log the norm of what
#    flows out of two others, and the next step's loss is weighted by those norms
class Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp()
        self.norms = []
        self.net[2].register_full_backward_pre_hook(lambda module, grad_out: (grad_out[0] * 0.5,))
        self.net[5].register_full_backward_pre_hook(lambda module, grad_out: (grad_out[0].clamp(-1e-3, 1e-3),))
        self.net[3].register_full_backward_hook(self.log_norm)
        self.net[6].register_full_backward_hook(self.log_norm)

    def log_norm(self, module, grad_in, grad_out):
        self.norms.append(grad_in[0].detach().norm())

    def forward(self, x):
        return self.net(x)


def hooked_step(model, opt, data, i):
    opt.zero_grad()
    scale = 1.0 if not model.norms else 1.0 / (1.0 + torch.stack(model.norms).sum())
    model.norms.clear()
    loss = ce_loss(model, data) * scale
    loss.backward()
    opt.step()
    return loss


def hooked_build():
    m = Hooked()
    return m, torch.optim.Adam(m.parameters(), 1e-3), vectors()


# 5. ReduceLROnPlateau steps on a validation loss computed under no_grad; every step's validation outputs are kept
#    and read at the end (the loss returned at the last step includes them)
def plateau_step(model, opt, data, i):
    loss = std_step(ce_loss)(model, opt, data, i)
    model.eval()
    with torch.no_grad():
        outputs = model(data[2])
        model.kept.append(outputs)
        model.plateau.step(F.cross_entropy(outputs, data[3]))
    model.train()
    if i == 2:
        return loss.detach() + torch.stack([o.square().mean() for o in model.kept]).sum()
    return loss


def plateau_build():
    m = nn.Sequential(nn.Linear(128, 512), nn.BatchNorm1d(512), nn.GELU(), nn.Linear(512, 512), nn.GELU(),
                      nn.Linear(512, 10))
    opt = torch.optim.SGD(m.parameters(), 0.5, momentum=0.9)
    m.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
    m.kept = []
    return m, opt, vectors() + vectors(256)


# 6. weight tying from the second step: the output layer's weight becomes the embedding's; the optimizer still lists
#    the untied weight, which no longer gets a gradient
class TiedLater(nn.Module):
    def __init__(self, vocab=512, dim=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.body = nn.Sequential(nn.Linear(dim, 256), nn.GELU(), nn.Linear(256, dim), nn.LayerNorm(dim))
        self.out = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        return self.out(self.body(self.embed(tokens)))


def tie_step(model, opt, data, i):
    if i == 1:
        model.out.weight = model.embed.weight
    opt.zero_grad()
    logits = model(data[0])
    loss = F.cross_entropy(logits.flatten(0, 1), data[1].flatten())
    loss.backward()
    opt.step()
    return loss


def tie_build():
    m = TiedLater()
    tokens = torch.randint(0, 512, (16, 32))
    return m, torch.optim.AdamW(m.parameters(), 1e-3), (tokens, tokens.roll(-1, 1))


PROGRAMS = {
    "unfreeze_mid_run": (unfreeze_build, unfreeze_step),
    "add_param_group_mid_run": (grow_build, grow_step),
    "rollback_state_dicts": (rollback_build, rollback_step),
    "full_backward_pre_hooks": (hooked_build, hooked_step),
    "plateau_kept_outputs": (plateau_build, plateau_step),
    "tie_weights_mid_run": (tie_build, tie_step),
}
