"""remat against static checkpointing at equal memory (issue 21, item 4), side by side in one process.

    PYTHONPATH=integration/python REMAT_BUILD_DIR=build python bench/checkpoint_side_by_side.py
    ... --models transformer --steps 4 --rounds 3 --json /tmp/side_by_side.json

Models: torchvision resnet50 (10 classes, batch 16 of 3x128x128, SGD lr 0.01 momentum 0.9, cross-entropy) and the
GPT-style transformer of examples/train.py (its Transformer and build(): width 64, 4 blocks, context 128, dropout
0.1; batch 32; the same SGD). Methods per model:
  baseline               the plain model, no checkpointing, remat off;
  checkpoint_blocks      torch.utils.checkpoint.checkpoint(use_reentrant=False) around every Bottleneck of resnet50
                         / every transformer block;
  checkpoint_sequential  torch.utils.checkpoint.checkpoint_sequential(4 segments, use_reentrant=False) over the
                         model as a chain of its children (resnet50: the stem conv1-bn1-relu-maxpool as one element,
                         since its relu is in place, then layer1..layer4, avgpool, flatten, fc: segments [stem,
                         layer1] [layer2, layer3] [layer4, avgpool] checkpointed, [flatten, fc] not; transformer:
                         embeddings, the 4 blocks, final norm with the tied head: [embeddings] [block 1] [block 2]
                         checkpointed, blocks 3-4 and the head not; torch never checkpoints the last segment);
  remat@blocks           the plain model under remat.enable(budget=checkpoint_blocks' measured peak,
                         costs="estimated", default policy, offload="off"): dropping and recomputing only;
  remat@sequential       the same at checkpoint_sequential's measured peak.
  plan@blocks, plan@sequential  the same with policy="plan" (plan mode: the second step recorded, planned on a
                         background thread, the plan followed from then on).

Peak accounting, the same for every method: the model, its optimizer and the data are built BEFORE remat is
enabled (parameters, inputs and targets live outside the arena for every method alike); then each non-remat
method runs the warm-up steps and one step under remat.enable(budget="64GiB", costs="estimated"), a budget that never
binds, so remat's arena is the allocator and its peak_allocated_bytes is what the step allocates (activations,
gradients, momentum). peak/baseline is that peak over the baseline's. The remat rows show the highest arena peak of
their timed runs (at most their budget).

Timing: torch.set_num_threads(1). Each round runs every method in turn, the order rotated by one each round; each
run builds a fresh model (same seeds), runs 4 warm-up steps and --steps timed steps, timed by time.process_time()
(CPU time of the process) and time.perf_counter() (wall). Per method: the median CPU time per step over all rounds
and its ratio to the baseline's median; the same for wall time; for the remat methods evictions and
rematerializations per timed step (the engine's counters read before and after the timed steps; estimated costs make
the same choices every round). "identical": the loss of the first timed step equals (torch.equal) the baseline's of
the same round and seed, in every round (for the checkpointing methods too; note that checkpointing recomputes
resnet50's batch norms, so their running statistics are updated twice per step, which the loss does not see).

Prints a Markdown table, preceded by the date, `uptime` and the command; --json FILE writes the raw numbers.
Exits 0 when every remat run's losses were identical, 1 otherwise (an out-of-memory run is reported, not a failure).
"""

import argparse
import datetime
import gc
import importlib.util
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

_REPO = Path(__file__).resolve().parents[1]


def _load_train_example():
    """examples/train.py as a module (it imports remat, from the checkout if the package is not installed)."""
    spec = importlib.util.spec_from_file_location("remat_example_train", _REPO / "examples" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train = _load_train_example()
remat = train.remat

MODELS = ("resnet50", "transformer")
METHODS = ("baseline", "checkpoint_blocks", "checkpoint_sequential", "remat@blocks", "remat@sequential",
           "plan@blocks", "plan@sequential")
REMAT_TARGET = {"remat@blocks": "checkpoint_blocks", "remat@sequential": "checkpoint_sequential",
                "plan@blocks": "checkpoint_blocks", "plan@sequential": "checkpoint_sequential"}
# Warm-up steps before the timed ones, for every method (so that the timed steps are the same steps of the same
# seeds): plan mode (policy "plan") records the second step, plans it on a background thread and follows the plan
# from the first step end after it is ready.
WARMUP = 4
NEVER_BINDS = "64GiB"
DEFAULT_BATCH = {"resnet50": 16, "transformer": 32}
SEGMENTS = 4


# ---------------------------------------------------------------------------------------------- forward functions

def _ckpt(fn, x):
    return checkpoint(fn, x, use_reentrant=False)


def _resnet_forward(m, x, wrap):
    """torchvision's ResNet._forward_impl with every Bottleneck called through `wrap`."""
    x = m.maxpool(m.relu(m.bn1(m.conv1(x))))
    for layer in (m.layer1, m.layer2, m.layer3, m.layer4):
        for block in layer:
            x = wrap(block, x)
    return m.fc(torch.flatten(m.avgpool(x), 1))


def _resnet_chain(m):
    # The stem is one element: torchvision's relu is in place, and a segment starting at it would modify the
    # segment's saved input ("modified by an inplace operation" in backward).
    stem = lambda x: m.maxpool(m.relu(m.bn1(m.conv1(x))))  # noqa: E731
    return [stem, m.layer1, m.layer2, m.layer3, m.layer4, m.avgpool, lambda x: torch.flatten(x, 1), m.fc]


# The transformer's forward (examples/train.py, Transformer.forward) cut into its stages, the same ops in the same
# order, so that the plain model and the checkpointed ones compute the same thing.

def _gpt_embed(m, idx):
    return m.drop(m.tokens(idx) + m.positions(torch.arange(idx.shape[1])))


def _gpt_block(m, blk, x):
    b, t, _ = x.shape
    q, k, v = blk["qkv"](blk["ln1"](x)).split(x.shape[-1], dim=2)
    q, k, v = (z.view(b, t, m.heads, -1).transpose(1, 2) for z in (q, k, v))
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    att = blk["drop"](att.masked_fill(~m.mask[:t, :t], float("-inf")).softmax(-1))
    x = x + blk["drop"](blk["proj"]((att @ v).transpose(1, 2).reshape(b, t, -1)))
    return x + blk["drop"](blk["out"](torch.nn.functional.gelu(blk["fc"](blk["ln2"](x)))))


def _gpt_head(m, x):
    return m.ln(x) @ m.tokens.weight.t()


def _gpt_chain(m):
    return ([lambda idx: _gpt_embed(m, idx)] + [lambda x, blk=blk: _gpt_block(m, blk, x) for blk in m.blocks]
            + [lambda x: _gpt_head(m, x)])


def forward_for(model_name, method, m):
    """The forward function of `method` on model `m` (the remat methods and the baseline call the plain model)."""
    if method == "checkpoint_blocks":
        if model_name == "resnet50":
            return lambda x: _resnet_forward(m, x, _ckpt)

        def gpt_blocks(idx):
            x = _gpt_embed(m, idx)
            for blk in m.blocks:
                x = _ckpt(lambda y, blk=blk: _gpt_block(m, blk, y), x)
            return _gpt_head(m, x)
        return gpt_blocks
    if method == "checkpoint_sequential":
        chain = _resnet_chain(m) if model_name == "resnet50" else _gpt_chain(m)
        return lambda x: checkpoint_sequential(chain, SEGMENTS, x, use_reentrant=False)
    return m


# ---------------------------------------------------------------------------------------------------- one run

def build(cli, model_name):
    """Fresh model, optimizer and data with fixed seeds (examples/train.py's build(): seed 0)."""
    ns = argparse.Namespace(model=model_name, batch=batch_of(cli, model_name), image_size=cli.image_size,
                            optimizer="sgd")
    model, inputs, targets, loss_fn = train.build(ns)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, inputs, targets, loss_fn, opt


def batch_of(cli, model_name):
    return cli.batch if cli.batch is not None else DEFAULT_BATCH[model_name]


def run(cli, model_name, method, steps, budget=None):
    """Builds the model (before remat is enabled), then the warm-up steps (WARMUP) and `steps` timed steps, under remat with
    `budget` bytes if given. Returns losses, per-step CPU and wall seconds, and remat's numbers."""
    model, inputs, targets, loss_fn, opt = build(cli, model_name)
    fwd = forward_for(model_name, method, model)
    gc.collect()
    torch.manual_seed(1)

    def step():
        opt.zero_grad()
        loss = loss_fn(fwd(inputs), targets)
        loss.backward()
        opt.step()
        return loss.detach().clone()

    out = {"losses": [], "cpu": [], "wall": []}
    enabled = None
    plan = method.startswith("plan@")
    if budget is not None:
        enabled = remat.enable(budget, policy="plan" if plan else None, costs=cli.costs, offload="off")
        out["policy"] = enabled.policy
    try:
        for _ in range(WARMUP):
            step()  # warm-up: allocates gradients and momentum (plan mode: and makes its plan)
        before = remat.stats() if enabled else None
        for _ in range(steps):
            c0, w0 = time.process_time(), time.perf_counter()
            loss = step()
            c1, w1 = time.process_time(), time.perf_counter()
            out["cpu"].append(c1 - c0)
            out["wall"].append(w1 - w0)
            out["losses"].append(loss)
        if enabled:
            after = remat.stats()
            out["evictions"] = after["evictions"] - before["evictions"]
            out["rematerializations"] = after["rematerializations"] - before["rematerializations"]
            out["peak"] = after["peak_allocated_bytes"]
            if plan:
                out["plan"] = remat.plan_status()
    finally:
        if enabled is not None and remat.is_enabled():
            remat.disable()
    del model, opt, fwd
    gc.collect()
    return out


# ------------------------------------------------------------------------------------------------------- main

def measure_model(cli, model_name, log):
    result = {"model": model_name, "batch": batch_of(cli, model_name), "methods": {}}
    methods = result["methods"]
    # Peaks: every non-remat method under a budget that never binds (the warm-up steps and one step).
    peaks = {}
    for method in METHODS:
        if method in REMAT_TARGET:
            continue
        r = run(cli, model_name, method, 1, budget=NEVER_BINDS)
        peaks[method] = r["peak"]
        log(f"{model_name} {method}: peak {r['peak'] / 2**20:.1f} MiB")
    for method in METHODS:
        budget = peaks[REMAT_TARGET[method]] if method in REMAT_TARGET else None
        methods[method] = {"peak_bytes": peaks.get(method), "budget_bytes": budget, "cpu": [], "wall": [],
                           "first_loss_identical": [], "evictions": [], "rematerializations": [], "peaks": [],
                           "oom": None}
    # Timing rounds, order rotated by one each round.
    for rnd in range(cli.rounds):
        order = METHODS[rnd % len(METHODS):] + METHODS[:rnd % len(METHODS)]
        firsts = {}
        for method in order:
            entry = methods[method]
            if entry["oom"]:
                continue
            try:
                r = run(cli, model_name, method, cli.steps, budget=entry["budget_bytes"])
            except torch.OutOfMemoryError as error:
                entry["oom"] = str(error).splitlines()[0]
                log(f"{model_name} {method} round {rnd + 1}: out of memory: {entry['oom']}")
                continue
            entry["cpu"] += r["cpu"]
            entry["wall"] += r["wall"]
            entry.setdefault("losses", []).append([x.item() for x in r["losses"]])
            firsts[method] = r["losses"][0]
            if "evictions" in r:
                entry["evictions"].append(r["evictions"] / cli.steps)
                entry["rematerializations"].append(r["rematerializations"] / cli.steps)
                entry["peaks"].append(r["peak"])
                if not method.startswith("plan@"):
                    entry["policy"] = r["policy"]
                if "plan" in r:
                    entry.setdefault("plan_status", []).append(r["plan"])
            log(f"{model_name} round {rnd + 1} {method}: cpu/step {statistics.median(r['cpu']) * 1e3:.0f} ms, "
                f"wall/step {statistics.median(r['wall']) * 1e3:.0f} ms"
                + (f", evictions {r['evictions']}, remats {r['rematerializations']}" if "evictions" in r else "")
                + (f", plan: {r['plan']}" if "plan" in r else ""))
        base = firsts.get("baseline")
        for method, loss in firsts.items():
            methods[method]["first_loss_identical"].append(base is not None and torch.equal(loss, base))
    for method, entry in methods.items():
        if entry["peaks"]:
            entry["peak_bytes"] = max(entry["peaks"])
        entry["cpu_median"] = statistics.median(entry["cpu"]) if entry["cpu"] else None
        entry["wall_median"] = statistics.median(entry["wall"]) if entry["wall"] else None
    base = methods["baseline"]
    for entry in methods.values():
        entry["peak_ratio"] = entry["peak_bytes"] / base["peak_bytes"] if entry["peak_bytes"] else None
        entry["cpu_ratio"] = entry["cpu_median"] / base["cpu_median"] if entry["cpu_median"] else None
        entry["wall_ratio"] = entry["wall_median"] / base["wall_median"] if entry["wall_median"] else None
    return result


def describe(model_name, cli):
    if model_name == "resnet50":
        return f"resnet50, batch {batch_of(cli, model_name)}, {cli.image_size} px"
    return f"transformer, batch {batch_of(cli, model_name)}"


def table(cli, results):
    lines = ["| model | method | peak / baseline | CPU time/step ratio | wall ratio | evictions / remats per step "
             "| identical |", "|---|---|---:|---:|---:|---:|---|"]
    for res in results:
        first = True
        for method, e in res["methods"].items():
            model_cell = describe(res["model"], cli) if first else ""
            first = False
            peak = f"{e['peak_ratio']:.2f} ({e['peak_bytes'] / 2**20:.1f} MiB)" if e["peak_ratio"] else "-"
            if e["oom"] and not e["cpu"]:
                lines.append(f"| {model_cell} | {method} | {peak} | oom: {e['oom']} | | | |")
                continue
            ev = "-"
            if e["evictions"]:
                ev = f"{statistics.median(e['evictions']):.0f} / {statistics.median(e['rematerializations']):.0f}"
            same = "yes" if e["first_loss_identical"] and all(e["first_loss_identical"]) else "no"
            if method == "baseline":
                same = "-"
            lines.append(f"| {model_cell} | {method} | {peak} | {e['cpu_ratio']:.2f}x | {e['wall_ratio']:.2f}x "
                         f"| {ev} | {same} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per run, after 4 warm-up steps")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; every method runs once per round")
    parser.add_argument("--batch", type=int, default=None,
                        help="batch for every model (default: resnet50 16, transformer 32)")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--costs", choices=("estimated", "measured"), default="estimated",
                        help="remat's op costs in the budgeted runs (remat.enable(costs=...))")
    parser.add_argument("--json", default=None, metavar="FILE", help="write the raw numbers here")
    cli = parser.parse_args()
    models = [m.strip() for m in cli.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        parser.error(f"unknown --models value(s) {', '.join(map(repr, unknown)) or repr(cli.models)}; "
                     f"choose from {', '.join(MODELS)}")
    if cli.steps < 1 or cli.rounds < 1:
        parser.error("--steps and --rounds must be at least 1")
    torch.set_num_threads(1)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    t0 = time.perf_counter()
    results = [measure_model(cli, m, log) for m in models]
    elapsed = time.perf_counter() - t0
    load_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0]] + sys.argv[1:])

    policy = next((e["policy"] for r in results for e in r["methods"].values() if "policy" in e), "default")
    print(f"date: {started:%Y-%m-%d %H:%M} UTC; run took {elapsed:.0f} s")
    print(f"uptime before: {load_before}")
    print(f"uptime after:  {load_after}")
    print(f"command: {command}")
    print(f"torch {torch.__version__}, 1 intra-op thread; {cli.steps} timed steps after {WARMUP} warm-up steps per run, "
          f"{cli.rounds} rounds (order rotated); SGD lr 0.01 momentum 0.9. Model, optimizer and data are built "
          f"before remat.enable for every method (parameters and inputs outside the arena); peaks are remat's arena "
          f"peak under a {NEVER_BINDS} budget that never binds (remat rows: their arena peak under their budget). "
          f"remat rows: policy {policy} (plan@: plan), {cli.costs} costs, offload off, arena "
          f"{os.environ.get('REMAT_ARENA', 'contiguous')}. Ratios are medians of per-step times "
          f"against the baseline's of the same run.")
    print()
    print(table(cli, results))
    print()
    for r in results:
        b = r["methods"]["baseline"]
        print(f"{r['model']} baseline: {b['cpu_median'] * 1e3:.0f} ms CPU / {b['wall_median'] * 1e3:.0f} ms wall "
              f"per step (per-step CPU: {' '.join(f'{x * 1e3:.0f}' for x in b['cpu'])} ms), "
              f"peak {b['peak_bytes'] / 2**20:.1f} MiB")

    ok = all(all(e["first_loss_identical"]) for r in results for m, e in r["methods"].items()
             if m in REMAT_TARGET and e["first_loss_identical"])
    if cli.json:
        with open(cli.json, "w") as f:
            json.dump({"date": f"{started:%Y-%m-%d %H:%M} UTC", "uptime_before": load_before,
                       "uptime_after": load_after, "command": command, "elapsed_s": elapsed, "steps": cli.steps,
                       "rounds": cli.rounds, "image_size": cli.image_size, "torch": torch.__version__,
                       "results": results}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
