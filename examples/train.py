"""Train a torchvision model (or a small GPT-style transformer) on synthetic CPU data under a remat budget, and
check that remat changed nothing but memory.

    python examples/train.py                          # resnet50, budget 0.8 of the measured peak
    python examples/train.py --model resnet18 --budget 0.5 --policy coop
    python examples/train.py --model transformer --budget 6MiB

Three runs with the same seeds: without remat (baseline time, losses, parameters), under remat with a budget that
never binds (the unconstrained peak of what remat allocates: activations, gradients, optimizer state; the model
and the data are made before remat is enabled), then under the budget. The budget is bytes ("6GiB", "512MiB",
"4096") or a fraction of that measured peak ("0.5"). Prints both peaks, step times, the overhead and whether
losses and parameters are bitwise identical; exits 1 if they are not, 2 if the budget is too small.
"""

import argparse
import contextlib
import math
import sys
import time
from pathlib import Path

import torch

try:
    import remat
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "python"))
    import remat

HUGE = 64 << 30


class Transformer(torch.nn.Module):
    """GPT-2-style: embeddings, pre-norm blocks (causal attention written out, GELU MLP), dropout, tied head."""

    def __init__(self, vocab=256, width=64, heads=4, layers=4, context=128, dropout=0.1):
        super().__init__()
        self.heads = heads
        self.tokens = torch.nn.Embedding(vocab, width)
        self.positions = torch.nn.Embedding(context, width)
        self.drop = torch.nn.Dropout(dropout)
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict(dict(
            ln1=torch.nn.LayerNorm(width), qkv=torch.nn.Linear(width, 3 * width), proj=torch.nn.Linear(width, width),
            ln2=torch.nn.LayerNorm(width), fc=torch.nn.Linear(width, 4 * width), out=torch.nn.Linear(4 * width, width),
            drop=torch.nn.Dropout(dropout))) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(width)
        self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)))

    def forward(self, idx):
        b, t = idx.shape
        x = self.drop(self.tokens(idx) + self.positions(torch.arange(t)))
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).split(x.shape[-1], dim=2)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            att = blk["drop"](att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1))
            x = x + blk["drop"](blk["proj"]((att @ v).transpose(1, 2).reshape(b, t, -1)))
            x = x + blk["drop"](blk["out"](torch.nn.functional.gelu(blk["fc"](blk["ln2"](x)))))
        return self.ln(x) @ self.tokens.weight.t()


def build(args):
    torch.manual_seed(0)
    if args.model == "transformer":
        model = Transformer()
        tokens = torch.randint(0, 256, (args.batch, 129))
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

        def loss_fn(logits, target):
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        return model, inputs, targets, loss_fn
    import torchvision
    kwargs = {"num_classes": 10}
    if args.model == "inception_v3":
        kwargs.update(aux_logits=True, init_weights=False)
    model = getattr(torchvision.models, args.model)(**kwargs)
    size = max(args.image_size, 75) if args.model == "inception_v3" else args.image_size
    inputs = torch.randn(args.batch, 3, size, size)
    targets = torch.randint(0, 10, (args.batch,))

    def loss_fn(out, target):
        if isinstance(out, tuple):  # inception_v3's aux logits
            return torch.nn.functional.cross_entropy(out[0], target) + 0.4 * torch.nn.functional.cross_entropy(
                out[1], target)
        return torch.nn.functional.cross_entropy(out, target)
    return model, inputs, targets, loss_fn


def make_optimizer(args, model):
    """SGD with momentum or Adam, as --optimizer says (the same for every run of one comparison)."""
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def run(args, budget=None, pictures=False):
    """Trains args.steps steps; returns (losses, params, seconds per step after the first, stats or None). With
    `pictures`, writes args.trace (remat.trace) and args.snapshot (remat.dump_snapshot) when they are set."""
    model, inputs, targets, loss_fn = build(args)
    opt = make_optimizer(args, model)
    torch.manual_seed(1)
    stats = None
    times = []
    if budget is not None:
        remat.enable(budget, policy=args.policy, costs=args.costs, offload=args.offload, host_tier=args.host_tier)
    timeline = remat.trace(args.trace) if pictures and args.trace else contextlib.nullcontext()
    if pictures and args.snapshot:
        remat.record_memory_history()
    try:
        with timeline:
            losses = train_steps(args, model, inputs, targets, loss_fn, opt, times)
        if pictures and args.snapshot:
            remat.dump_snapshot(args.snapshot)
            remat.record_memory_history(False)
    finally:
        if budget is not None:
            remat.disable()
            stats = remat.stats()  # the last arena's and engine's numbers
    params = [p.detach().clone() for p in model.parameters()]
    step_time = sum(times[1:]) / max(1, len(times) - 1) if len(times) > 1 else times[0]
    return losses, params, step_time, stats


def train_steps(args, model, inputs, targets, loss_fn, opt, times):
    """args.steps training steps; appends each step's seconds to `times`; returns the losses."""
    losses = []
    for _ in range(args.steps):
        start = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
        del loss
        times.append(time.perf_counter() - start)
    return losses


def identical(a, b):
    return len(a) == len(b) and all(
        x.shape == y.shape and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))
        for x, y in zip(a, b))


def mib(n):
    return f"{n / (1 << 20):.1f} MiB"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50",
                        help="a torchvision classification model (resnet18, resnet50, densenet121, inception_v3, "
                             "...) or 'transformer'")
    parser.add_argument("--budget", default="0.8", help="bytes (6GiB) or a fraction of the measured peak (0.5)")
    parser.add_argument("--policy", default=None, help=f"eviction policy, one of {', '.join(remat.policies())}")
    parser.add_argument("--costs", choices=("measured", "estimated"), default="measured",
                        help="how the engine weighs ops: measured time, or an estimate from shapes (the same "
                             "eviction choices in every run)")
    parser.add_argument("--offload", choices=("off", "auto", "always"), default=None,
                        help="page storages (gradients and optimizer state included) to a host tier instead of "
                             "only dropping them; default REMAT_OFFLOAD, else off")
    parser.add_argument("--host-tier", choices=("memory", "file"), default="memory",
                        help="where paged storages go: host memory outside the budget, or a temporary file")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--trace", default=None,
                        help="write the budgeted run's timeline here (Chrome trace JSON: remat.trace; draw it with "
                             "python -m remat.plot; the step time then includes recording)")
    parser.add_argument("--snapshot", default=None,
                        help="write the budgeted run's memory snapshot here (memory_viz pickle: remat.dump_snapshot)")
    args = parser.parse_args()
    if args.policy is not None and args.policy not in remat.policies():
        parser.error(f"unknown policy {args.policy!r}; registered policies: {', '.join(remat.policies())}")
    torch.set_num_threads(max(1, torch.get_num_threads()))

    print(f"model {args.model}, batch {args.batch}, {args.steps} steps, {args.optimizer}, "
          f"policy {args.policy or 'default'}, {args.costs} costs, offload {args.offload or 'default'}")
    base_losses, base_params, base_time, _ = run(args)
    print(f"baseline (no remat):       {base_time * 1e3:8.1f} ms/step")
    _, _, _, free = run(args, budget=HUGE)
    peak = free["peak_allocated_bytes"]
    print(f"unconstrained peak:        {mib(peak)} (what remat allocates: activations, gradients, optimizer state)")
    budget = int(peak * float(args.budget)) if "." in args.budget else remat.parse_size(args.budget)
    print(f"budget:                    {mib(budget)} ({budget / peak:.2f} of the peak)")
    try:
        losses, params, step_time, stats = run(args, budget=budget, pictures=True)
    except torch.OutOfMemoryError as error:
        print(f"budget too small for {args.model} under remat: {str(error).splitlines()[0]}")
        return 2
    print(f"remat peak:                {mib(stats['peak_allocated_bytes'])}")
    print(f"remat step time:           {step_time * 1e3:8.1f} ms/step (overhead {step_time / base_time:.2f}x)")
    if stats.get("page_outs", 0):
        print(f"paged out {mib(stats['paged_out_bytes'])} in {stats['page_outs']} copies, paged in "
              f"{mib(stats['paged_in_bytes'])}; host tier peak {mib(stats['host_peak_bytes'])} ({args.host_tier}), "
              f"process peak RSS {mib(stats['process_peak_rss_bytes'])} (all three runs)")
    print(f"evictions {stats['evictions']}, rematerializations {stats['rematerializations']}, replayed "
          f"{stats['replayed_time_ns'] / 1e6:.1f} ms, search {stats['search_ns'] / 1e6:.1f} ms, fragmentation "
          f"{stats['fragmentation']:.3f}")
    same = identical(base_losses, losses) and identical(base_params, params)
    print(f"losses: {' '.join(f'{x.item():.6f}' for x in losses)}")
    print(f"results identical: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
