#!/usr/bin/env python3
"""Train torchvision's resnet50 on synthetic data with remat as PyTorch's CUDA allocator, under a memory budget.

NOT YET RUN ON A GPU BY US: our machines have no GPU. The allocator's logic is tested in CI against a test double
of the CUDA runtime (tests/cuda/); this script is what a user with an NVIDIA GPU runs.

    make build                      # builds build/integration/cuda/libremat_cuda.so when nvcc is present
    python examples/train_cuda.py --budget 6GiB --batch-size 64 --steps 20

What it does: loads libremat_cuda.so, installs remat as torch's CUDA allocator (before anything initializes
CUDA), then trains resnet50 for a few steps on random images and prints, per step, the time, the loss and
torch.cuda.memory_allocated / max_memory_allocated / memory_reserved, which remat's allocator answers. The budget is
a hard limit: memory_reserved equals it, and an allocation that does not fit raises torch.OutOfMemoryError naming
the request. (Until the engine's eviction is connected to the CUDA allocator, nothing is evicted to make room, so a
budget below the model's peak fails with that error; the script reports it and exits with status 3.)

Options: --budget (bytes with a unit, e.g. 6GiB, or a fraction of device memory, e.g. 0.5; default REMAT_BUDGET,
else 0.9), --host-budget (pinned host memory for paging; default REMAT_HOST_BUDGET), --library (path to
libremat_cuda.so; default REMAT_CUDA_LIBRARY, else build*/integration/cuda/ in this checkout), --batch-size,
--image-size, --steps, --no-remat (torch's own allocator, for comparison).
Exit status: 0 trained; 2 no GPU or setup error; 3 out of the budget.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIBRARY = "libremat_cuda.so"


def fail(message: str, status: int = 2) -> "None":
    print(f"train_cuda.py: {message}", file=sys.stderr)
    sys.exit(status)


def find_library(explicit: str | None) -> Path:
    for candidate in (explicit, os.environ.get("REMAT_CUDA_LIBRARY")):
        if candidate:
            path = Path(candidate)
            if not path.is_file():
                fail(f"{candidate!r} is not a file (expected the built {LIBRARY})")
            return path
    build_dirs = [os.environ["BUILD_DIR"]] if os.environ.get("BUILD_DIR") else []
    build_dirs += ["build"] + sorted(p.name for p in REPO.glob("build*") if p.name != "build")
    for build_dir in build_dirs:
        path = REPO / build_dir / "integration" / "cuda" / LIBRARY
        if path.is_file():
            return path
    fail(f"cannot find {LIBRARY}: build it (make build, with nvcc installed) or pass --library / set "
         "REMAT_CUDA_LIBRARY to its path")
    raise AssertionError  # unreachable


def install_remat(torch, library: Path, budget: str, host_budget: str | None) -> None:
    """Makes remat torch's CUDA allocator. Must run before anything initializes CUDA in torch."""
    if torch.cuda.is_initialized():
        fail("CUDA is already initialized in this process; remat must be installed before the first CUDA tensor")
    lib = ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    lib.remat_install_cuda_allocator.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.remat_install_cuda_allocator.restype = ctypes.c_int
    error = ctypes.create_string_buffer(4096)
    status = lib.remat_install_cuda_allocator(budget.encode(), host_budget.encode() if host_budget else None,
                                              error, len(error))
    if status != 0:
        fail(f"cannot install remat's CUDA allocator: {error.value.decode()}")


def mib(n: int) -> str:
    return f"{n / 2**20:9.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", default=os.environ.get("REMAT_BUDGET") or "0.9")
    parser.add_argument("--host-budget", default=os.environ.get("REMAT_HOST_BUDGET"))
    parser.add_argument("--library", default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-remat", action="store_true", help="use torch's own CUDA allocator")
    args = parser.parse_args()

    import torch  # noqa: E402  (after argument parsing, so --help works without torch)

    # torch.cuda.is_available() asks the driver for a device count; it does not initialize torch's CUDA state, so
    # the allocator can still be installed afterwards.
    if not torch.cuda.is_available():
        fail(f"no CUDA GPU is available (torch.cuda.is_available() is False; torch {torch.__version__}, built for "
             f"CUDA {torch.version.cuda}). This example trains on an NVIDIA GPU with remat as the CUDA allocator; "
             "run it on a machine with a GPU and a driver that supports that CUDA version.")
    if not args.no_remat:
        library = find_library(args.library)
        install_remat(torch, library, args.budget, args.host_budget)
        print(f"remat: CUDA allocator installed from {library} with budget {args.budget}")

    import torchvision  # noqa: E402

    device = torch.device("cuda")
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
            print(f"step {step:3d}  {elapsed * 1000:8.1f} ms  loss {loss.item():7.4f}  "
                  f"allocated {mib(torch.cuda.memory_allocated(device))}  "
                  f"peak {mib(torch.cuda.max_memory_allocated(device))}  "
                  f"reserved {mib(torch.cuda.memory_reserved(device))}")
    except torch.OutOfMemoryError as error:
        fail(f"out of the CUDA memory budget ({args.budget}): {error}\nRaise --budget or lower --batch-size.", 3)
    print("done")


if __name__ == "__main__":
    main()
