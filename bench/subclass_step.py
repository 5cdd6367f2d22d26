"""What remat costs a model whose every op runs on a tensor subclass (integration/subclass_arguments.h): an MLP whose
parameters and input are DTensors (one rank, gloo, replicated), SGD with momentum (foreach). Each such op passes
through remat's hook and costs a Python callback that names its inner tensors, which remat holds for the call.

Rounds alternate a step without remat and a step under remat with a budget that never binds; the figure is the
median CPU time per step of each, and their ratio.

    PYTHONPATH=integration/python REMAT_BUILD_DIR=build python bench/subclass_step.py [--rounds 5] [--steps 10]
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, distribute_tensor

import remat


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(s.getsockname()[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(args.layers)])
    for layer in model:
        layer.weight = nn.Parameter(distribute_tensor(layer.weight.detach(), mesh, [Replicate()]))
        layer.bias = nn.Parameter(distribute_tensor(layer.bias.detach(), mesh, [Replicate()]))
    optimizer = torch.optim.SGD(model.parameters(), 0.01, momentum=0.9, foreach=True)
    x = distribute_tensor(torch.randn(64, args.width), mesh, [Replicate()])

    def step_seconds():
        start = time.process_time()
        for _ in range(args.steps):
            optimizer.zero_grad()
            model(x).to_local().square().mean().backward()
            optimizer.step()
        return (time.process_time() - start) / args.steps

    step_seconds()  # warm-up: DTensor's sharding propagation caches
    without, under = [], []
    for _ in range(args.rounds):
        without.append(step_seconds())
        with remat.enable(64 << 30, costs="estimated"):
            under.append(step_seconds())
    dist.destroy_process_group()
    a, b = statistics.median(without), statistics.median(under)
    print(f"DTensor MLP ({args.layers} x {args.width}), CPU time per step, median of {args.rounds} rounds of "
          f"{args.steps} steps: without remat {a * 1e3:.2f} ms, under remat {b * 1e3:.2f} ms, ratio {b / a:.2f}x")


if __name__ == "__main__":
    main()
