"""One rank of the FSDP2 test (test_fsdp.py): a 7-layer MLP, every layer and the whole model `fully_shard`ed (gloo,
CPU), trains 3 SGD steps without remat, under remat with a budget that never binds (the rank's peak), and under
remat at FRACTION of that peak, and saves the losses and this rank's parameter shards of the first and last runs.
With a budget in bytes instead of a fraction (argv[5] = "bytes:N"), it trains once under that budget and records
how the run ended (an OutOfMemoryError on this rank, another error, or success) in OUT/rank<r>.json.

    python fsdp_worker.py RANK WORLD_SIZE PORT OUT FRACTION|bytes:N
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import remat


def train(rank, budget=None):
    """(losses, {name: local shard}, remat stats or None)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.GELU()) for _ in range(6)], torch.nn.Linear(128, 4))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(100 + rank)  # each rank its own data
    data, target = torch.randn(512, 128), torch.randint(0, 4, (512,))
    losses, stats = [], None
    if budget is not None:
        remat.enable(budget, costs="estimated")
    try:
        for _ in range(3):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach().clone())
            del loss
    finally:
        if remat.is_enabled():
            remat.disable()
            stats = remat.stats()
    shards = {name: p.to_local().detach().clone() for name, p in model.named_parameters()}
    return losses, shards, stats


def main(rank, world_size, port, out_dir, budget_spec):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=30))
    if budget_spec.startswith("bytes:"):
        outcome = "trained"
        try:
            train(rank, int(budget_spec.split(":", 1)[1]))
        except torch.OutOfMemoryError as error:
            outcome = f"OutOfMemoryError: {str(error).splitlines()[0]}"
        except Exception as error:  # noqa: BLE001 (the other rank's failure reaches this one as a gloo error)
            outcome = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"outcome": outcome, "remat_enabled_after": remat.is_enabled()}, f)
    else:
        reference = train(rank)
        peak = train(rank, 1 << 30)[2]["peak_allocated_bytes"]
        budget = int(float(budget_spec) * peak)
        losses, shards, stats = train(rank, budget)
        stats["budget"] = budget
        torch.save({"reference": {"losses": reference[0], "shards": reference[1]},
                    "remat": {"losses": losses, "shards": shards}, "stats": stats},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 (a group the other rank left already)
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # torch 2.14's gloo may abort at interpreter shutdown (see ddp_worker.py)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
