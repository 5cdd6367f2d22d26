#!/usr/bin/env python3
"""Train torchvision's resnet50 on synthetic data with remat as PyTorch's CUDA allocator, under a memory budget.

NOT RUN ON A GPU BY US: our machines have no GPU. The allocator's logic is tested in CI against a test double of the
CUDA runtime (tests/cuda/), and this script's failure without a GPU is tested (tests/python/test_cuda.py), but
nobody on the project has seen it train. It says so when it starts. If you run it, please report what you see.

    make build                      # builds build/integration/cuda/libremat_cuda.so when nvcc is present
    python examples/train_cuda.py --budget 6GiB --batch-size 64 --steps 20

What it does: `remat.install_cuda_allocator(budget=...)` before anything initializes CUDA, then a few training
steps of resnet50 on random images, printing per step the time, the loss and torch.cuda.memory_allocated /
max_memory_allocated / memory_reserved, which remat's allocator answers. The budget is a hard limit: memory_reserved
equals it, and an allocation that does not fit raises torch.OutOfMemoryError naming the request, the budget and
the largest free block once the engine cannot make room. The engine evicts and rematerializes on the device the
script trains on (--device, default 0, as a DDP process trains on cuda:rank: install_cuda_allocator(devices=...)
switches it on for this thread there; random ops' outputs are kept on CUDA so far, and victims are
paged to pinned host memory only with --offload), so a budget below the model's peak trains by recomputing; the script prints the engine's evictions and
rematerializations per step. A budget below what even that allows fails with that error; the script reports it and
exits with status 3.

Options: --budget (bytes with a unit, e.g. 6GiB, or a fraction of device memory, e.g. 0.5; default REMAT_BUDGET,
else 0.9), --host-budget (pinned host memory for paging; default REMAT_HOST_BUDGET), --policy (the engine's
eviction policy; default REMAT_POLICY, else dtr-eq), --offload (off, auto, always: page victims to pinned host
memory), --arena (contiguous, stitch, stitch:SIZE), --device (the CUDA device index to train on), --deterministic (deterministic kernels, to compare losses bit for bit
with --no-remat), --batch-size, --image-size, --steps, --no-remat (torch's own allocator, for
comparison). libremat_cuda.so is found as remat.cuda's docstring says (REMAT_CUDA_LIBRARY, or the build
directory). REMAT_BUDGET and REMAT_DEVICE are consumed here and removed from the environment before `import
remat`, so that remat does not also apply the budget to CPU memory.
Exit status: 0 trained; 2 no GPU or setup error; 3 out of the budget.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

NOT_RUN_NOTE = ("note: remat's CUDA allocator has not been run on a GPU by us (our machines have no GPU); "
                "its logic is tested against a test double of the CUDA runtime only. Please report what you see.")


def fail(message: str, status: int = 2) -> None:
    print(f"train_cuda.py: {message}", file=sys.stderr)
    sys.exit(status)


def import_remat():
    try:
        import remat
    except ModuleNotFoundError:  # not installed: the package in this checkout
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "python"))
        import remat
    return remat


def mib(n: int) -> str:
    return f"{n / 2**20:9.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", default=os.environ.get("REMAT_BUDGET") or "0.9")
    parser.add_argument("--host-budget", default=os.environ.get("REMAT_HOST_BUDGET") or None)
    parser.add_argument("--policy", default=None)
    parser.add_argument("--offload", default=None, help="off, auto or always (default REMAT_OFFLOAD, else off)")
    parser.add_argument("--arena", default=None,
                        help="contiguous, stitch or stitch:SIZE (default REMAT_ARENA, else contiguous)")
    parser.add_argument("--device", type=int, default=0, help="the CUDA device to train on (the engine runs there)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-remat", action="store_true", help="use torch's own CUDA allocator")
    parser.add_argument("--deterministic", action="store_true",
                        help="deterministic kernels (torch.use_deterministic_algorithms), so that the losses of a "
                             "run under remat can be compared bit for bit with those of --no-remat")
    args = parser.parse_args()
    print(NOT_RUN_NOTE, flush=True)
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition for determinism

    # The budget is the CUDA budget here: without this, `import remat` would also enable remat on the CPU with it
    # (REMAT_BUDGET), or install the CUDA allocator itself (REMAT_DEVICE=cuda).
    os.environ.pop("REMAT_BUDGET", None)
    os.environ.pop("REMAT_DEVICE", None)

    import torch  # noqa: E402  (after argument parsing, so --help works without torch)

    if args.no_remat:
        if not torch.cuda.is_available():
            fail(f"no CUDA GPU is available (torch.cuda.is_available() is False; torch {torch.__version__}, built "
                 f"for CUDA {torch.version.cuda}). This example trains on an NVIDIA GPU.")
    else:
        try:
            remat = import_remat()
        except ImportError as error:
            fail(f"cannot import remat: {error}")
        try:
            # Checks the budget, that CUDA is not initialized yet and that there is a CUDA device (RuntimeError
            # saying so on a machine without a GPU), then installs remat as torch's CUDA allocator.
            installed = remat.install_cuda_allocator(budget=args.budget, policy=args.policy,
                                                     host_budget=args.host_budget, offload=args.offload,
                                                     arena=args.arena, devices=args.device)
        except (ValueError, RuntimeError) as error:
            fail(f"cannot install remat's CUDA allocator: {error}")
        print(f"remat: CUDA allocator installed from {installed.library} with budget {installed.budget}, arena "
              f"{installed.arena}, engine on device(s) {list(installed.devices)}")

    import torchvision  # noqa: E402

    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)  # the same model and data in every run
    device = torch.device("cuda", args.device)
    torch.cuda.set_device(device)  # as a DDP process does with its rank's device
    name = torch.cuda.get_device_name(device)
    print(f"device: {name}; allocator: {torch.cuda.get_allocator_backend()}; "
          f"batch {args.batch_size} x 3 x {args.image_size} x {args.image_size}")
    try:
        model = torchvision.models.resnet50(weights=None).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
        labels = torch.randint(0, 1000, (args.batch_size,), device=device)
        for step in range(1, args.steps + 1):
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - start
            engine = "" if args.no_remat else (f"  evictions {remat.stats().get('evictions', 0)}  "
                                               f"remats {remat.stats().get('rematerializations', 0)}")
            print(f"step {step:3d}  {elapsed * 1000:8.1f} ms  loss {loss.item():.9g}  "
                  f"allocated {mib(torch.cuda.memory_allocated(device))}  "
                  f"peak {mib(torch.cuda.max_memory_allocated(device))}  "
                  f"reserved {mib(torch.cuda.memory_reserved(device))}{engine}")
    except torch.OutOfMemoryError as error:
        fail(f"out of the CUDA memory budget ({args.budget}): {error}\nEven evicting everything the engine can "
             "recompute does not make room: raise --budget or lower --batch-size.", 3)
    print("done")
    print(NOT_RUN_NOTE)


if __name__ == "__main__":
    main()
