"""Every torch.optim optimizer (the for-loop, fused and foreach implementations: foreach updates every parameter
in one op, which CPU tensors take only when asked), zero_grad(set_to_none=False) with accumulation, float64,
Hessian-vector products, a learning rate held in a tensor that a schedule writes in place, foreach gradient clipping
under a one-cycle schedule."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .harness import std_step

OPTS = {
    "adagrad": lambda p: torch.optim.Adagrad(p, 0.01),
    "adadelta": lambda p: torch.optim.Adadelta(p),
    "adamax": lambda p: torch.optim.Adamax(p, 1e-3),
    "nadam": lambda p: torch.optim.NAdam(p, 1e-3),
    "radam": lambda p: torch.optim.RAdam(p, 1e-3),
    "asgd": lambda p: torch.optim.ASGD(p, 0.01, t0=1),
    "rprop": lambda p: torch.optim.Rprop(p, 0.01),
    "sgd_nesterov_wd": lambda p: torch.optim.SGD(p, 0.01, momentum=0.9, nesterov=True, weight_decay=1e-4),
    "adamw_amsgrad": lambda p: torch.optim.AdamW(p, 1e-3, amsgrad=True),
    "adam_fused": lambda p: torch.optim.Adam(p, 1e-3, fused=True),
    "adafactor": lambda p: torch.optim.Adafactor(p, 1e-2),
    "rmsprop_centered_momentum": lambda p: torch.optim.RMSprop(p, 1e-3, centered=True, momentum=0.9),
    "sgd_fused": lambda p: torch.optim.SGD(p, 0.01, momentum=0.9, fused=True),
    "sgd_foreach": lambda p: torch.optim.SGD(p, 0.01, momentum=0.9, dampening=0.1, foreach=True),
    "adam_foreach": lambda p: torch.optim.Adam(p, 1e-3, foreach=True),
    "adamw_foreach_amsgrad_maximize": lambda p: torch.optim.AdamW(p, 1e-3, amsgrad=True, maximize=True, foreach=True),
    "nadam_foreach_decoupled": lambda p: torch.optim.NAdam(p, 1e-3, weight_decay=0.01, decoupled_weight_decay=True,
                                                           foreach=True),
    "rmsprop_foreach": lambda p: torch.optim.RMSprop(p, 1e-3, momentum=0.5, foreach=True),
    "adagrad_foreach": lambda p: torch.optim.Adagrad(p, 0.01, lr_decay=1e-3, foreach=True),
}


def mlp(dtype=torch.float32):
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8)).to(dtype)


def opt_case(make_opt, dtype=torch.float32):
    def build():
        m = mlp(dtype)
        return m, make_opt(m.parameters()), (torch.randn(512, 64, dtype=dtype),)
    return build


def keep_grads_step(model, opt, data, i):
    opt.zero_grad(set_to_none=False)
    for half in data[0].chunk(2):
        loss = model(half).pow(2).mean()
        loss.backward()
    opt.step()
    return loss


def hvp_step(model, opt, data, i):
    opt.zero_grad()
    loss = model(data[0]).pow(2).mean()
    params = [p for p in model.parameters()]
    grads = torch.autograd.grad(loss, params, create_graph=True)
    v = [torch.ones_like(g) for g in grads]
    hv = torch.autograd.grad(grads, params, grad_outputs=v)
    for p, g, h in zip(params, grads, hv):
        p.grad = g.detach() + 1e-3 * h
    opt.step()
    return loss


PROGRAMS = {f"opt_{k}": (opt_case(v), std_step(lambda m, d: m(d[0]).pow(2).mean())) for k, v in OPTS.items()}
PROGRAMS["keep_grads_accumulate"] = (opt_case(OPTS["nadam"]), keep_grads_step)
PROGRAMS["float64_adam"] = (opt_case(lambda p: torch.optim.Adam(p, 1e-3), torch.float64),
                         std_step(lambda m, d: m(d[0]).pow(2).mean()))


def tensor_lr_step(model, opt, data, i):
    """Adam with its learning rate in a tensor (for-loop implementation: the foreach one takes a tensor lr only when
    capturable, which the CPU is not), decayed in place after each step as a schedule does with a tensor lr."""
    loss = std_step(lambda m, d: m(d[0]).pow(2).mean())(model, opt, data, i)
    opt.param_groups[0]["lr"].mul_(0.5)
    return loss


PROGRAMS["adam_tensor_lr"] = (opt_case(lambda p: torch.optim.Adam(p, torch.tensor(1e-3), foreach=False)),
                              tensor_lr_step)
PROGRAMS["hvp"] = (opt_case(lambda p: torch.optim.SGD(p, 0.01)), hvp_step)


def clip_schedule_build():
    m = mlp()
    opt = torch.optim.AdamW(m.parameters(), 1e-3, foreach=True)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=10)
    return m, opt, (torch.randn(512, 64), schedule)


def clip_schedule_step(model, opt, data, i):
    """foreach gradient-norm clipping (one op reads every gradient, one scales them all in place), then a one-cycle
    schedule (data[1]) that changes the learning rate and the betas between steps."""
    schedule = data[1]
    opt.zero_grad()
    loss = model(data[0]).pow(2).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05, foreach=True)
    opt.step()
    schedule.step()
    return loss


PROGRAMS["clip_foreach_one_cycle"] = (clip_schedule_build, clip_schedule_step)
