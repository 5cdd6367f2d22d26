#!/usr/bin/env python3
"""remat's paging against torch.autograd.graph.save_on_cpu at equal device memory, on a CUDA GPU (issue 19, item 4).

NOT RUN ON A GPU BY US: our machines have no GPU; without one this script says so and exits with status 2 (tested by
tests/python/test_cuda.py). The first person with a GPU: please run it and report the table.

    python bench/cuda_paging_vs_save_on_cpu.py [--model resnet50|gpt] [--batch-size N] [--steps N]

Each configuration runs in its own process (remat must become the CUDA allocator before CUDA initializes, so it
cannot share a process with a run of torch's own allocator):
  1. torch's allocator, nothing saved elsewhere: the step time and the peak (max_memory_allocated), the baseline;
  2. torch's allocator with every saved activation in pinned host memory (save_on_cpu(pin_memory=True)): its peak P
     and step time (its copies run on the compute stream, with no overlap);
  3. remat with budget P and offload "auto" (pages victims to pinned host memory when the copy is cheaper than
     recomputing), and 4. the same drop-only (offload "off").
It prints one row per configuration: median step time over the steps after the first, ratio to the baseline, the
peak device memory, remat's evictions, rematerializations and page-outs, and the sum of the losses of the steps
(the same model, inputs and seeds in every run: with deterministic algorithms on, every row's sum should be equal).
Exit status: 0 ran; 2 no GPU or remat could not be installed; 3 a configuration ran out of memory.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

NOT_RUN_NOTE = ("note: this benchmark has not been run on a GPU by us (our machines have no GPU). "
                "Please report what it prints.")
ROOT = Path(__file__).resolve().parents[1]


def build(args, torch):
    """(model, inputs, targets, loss function) on the GPU, the same in every process."""
    torch.manual_seed(0)
    device = torch.device("cuda")
    if args.model == "resnet50":
        import torchvision
        model = torchvision.models.resnet50(weights=None).to(device)
        inputs = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
        targets = torch.randint(0, 1000, (args.batch_size,), device=device)
        return model, inputs, targets, torch.nn.CrossEntropyLoss()
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, dropout=0.0,
                                             batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, num_layers=8),
                                torch.nn.Linear(512, 512)).to(device)
    inputs = torch.randn(args.batch_size, 512, 512, device=device)
    targets = torch.randn(args.batch_size, 512, 512, device=device)
    return model, inputs, targets, torch.nn.MSELoss()


def child(args) -> int:
    """One configuration, in this process; prints one JSON line."""
    os.environ.pop("REMAT_BUDGET", None)
    os.environ.pop("REMAT_DEVICE", None)
    import torch
    remat = None
    if args.config in ("remat-auto", "remat-off"):
        sys.path.insert(0, str(ROOT / "integration" / "python"))
        import remat as remat_module
        remat = remat_module
        remat.install_cuda_allocator(budget=str(args.budget), costs="estimated",
                                     offload="auto" if args.config == "remat-auto" else "off",
                                     host_budget=args.host_budget)
    elif not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA GPU is available"}))
        return 2
    torch.use_deterministic_algorithms(True, warn_only=True)
    model, inputs, targets, loss_fn = build(args, torch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times, losses = [], []
    try:
        for _ in range(args.steps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            if args.config == "save_on_cpu":
                with torch.autograd.graph.save_on_cpu(pin_memory=True):
                    loss = loss_fn(model(inputs), targets)
            else:
                loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            losses.append(loss.item())
    except torch.OutOfMemoryError as error:
        print(json.dumps({"error": f"out of memory: {str(error).splitlines()[0]}"}))
        return 3
    stats = remat.stats() if remat is not None else {}
    print(json.dumps({"step_s": statistics.median(times[1:] or times), "peak": torch.cuda.max_memory_allocated(),
                      "loss_sum": sum(losses), "evictions": stats.get("evictions", 0),
                      "remats": stats.get("rematerializations", 0), "page_outs": stats.get("page_outs", 0)}))
    return 0


def run(args, config: str, budget: int = 0):
    command = [sys.executable, __file__, "--child", config, "--model", args.model, "--batch-size",
               str(args.batch_size), "--image-size", str(args.image_size), "--steps", str(args.steps),
               "--budget", str(budget), "--host-budget", args.host_budget]
    result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": (result.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def main(argv) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("resnet50", "gpt"), default="resnet50")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--host-budget", default="64GiB")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--config", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        args.config = args.child
        return child(args)
    print(NOT_RUN_NOTE, flush=True)
    import torch
    if not torch.cuda.is_available():
        print(f"cuda_paging_vs_save_on_cpu.py: no CUDA GPU is available (torch {torch.__version__}, built for CUDA "
              f"{torch.version.cuda}): this benchmark needs an NVIDIA GPU.", file=sys.stderr)
        return 2
    rows = [("torch", run(args, "torch")), ("torch + save_on_cpu", run(args, "save_on_cpu"))]
    saved = rows[1][1]
    if "error" in saved:
        print(f"save_on_cpu failed: {saved['error']}", file=sys.stderr)
        return 3
    for name, config in (("remat, offload auto", "remat-auto"), ("remat, drop-only", "remat-off")):
        rows.append((f"{name} at save_on_cpu's peak", run(args, config, budget=saved["peak"])))
    base = rows[0][1].get("step_s")
    print(f"\n{args.model}, batch {args.batch_size}, {args.steps} steps, {torch.cuda.get_device_name()}")
    print("| configuration | step | vs torch | peak MiB | evictions | remats | page-outs | loss sum |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    status = 0
    for name, row in rows:
        if "error" in row:
            print(f"| {name} | {row['error']} | | | | | | |")
            status = 3
            continue
        ratio = f"{row['step_s'] / base:.2f}x" if base else "-"
        print(f"| {name} | {row['step_s'] * 1000:.1f} ms | {ratio} | {row['peak'] / 2**20:.1f} | {row['evictions']} "
              f"| {row['remats']} | {row['page_outs']} | {row['loss_sum']:.6f} |")
    print(NOT_RUN_NOTE)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
