"""One rank of the DistributedDataParallel test (test_remat.py): trains the same small model 3 steps without
remat, under remat with a budget that never binds (its peak), and under remat at half that peak, and saves the
first and last runs' byte-oracle snapshots (oracle.py: losses, gradients,
parameters, buffers, optimizer state, eval-mode outputs; taken with remat off) for the parent to compare."""

import os
import sys

import torch
import torch.distributed as dist

import oracle  # tests/python, this script's directory


def train(model_seed, rank):
    torch.manual_seed(model_seed)
    model = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.GELU(), torch.nn.Dropout(0.2)) for _ in range(6)],
        torch.nn.Linear(128, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(100 + rank)  # each rank its own data and dropout masks
    data, target = torch.randn(512, 128), torch.randint(0, 4, (512,))
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return model, opt, losses, data


def snapshot(model, opt, losses, data):
    """The oracle's snapshot as a dict of tensors and plain values (torch.load's weights_only default reads it back;
    the parent rebuilds it with oracle.Snapshot(**...)). The eval outputs come from the module DDP wraps, not from
    DDP's forward, which would talk to the other rank."""
    return vars(oracle.capture(model, opt, losses, eval_inputs=data))


def main(rank, world_size, port, out_dir):
    import remat

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    reference = snapshot(*train(0, rank))
    with remat.enable(budget="1GiB", costs="estimated"):
        train(0, rank)
        peak = remat.stats()["peak_allocated_bytes"]
    with remat.enable(budget=peak // 2, costs="estimated"):  # each rank its own budget: half its own peak
        under_remat = train(0, rank)
        stats = remat.stats()
    stats["budget"] = peak // 2
    torch.save({"reference": reference, "remat": snapshot(*under_remat), "stats": stats},
               os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()
    # torch 2.14's gloo aborts now and then while the interpreter shuts down ("terminate called without an active
    # exception", after destroy_process_group; about 1 run in 10 on a loaded 2-core machine, with or without remat):
    # the results are saved, so leave without finalizing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
