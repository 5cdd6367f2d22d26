"""FSDP2 under remat (issue 17, item 2): 2 processes, gloo on CPU, fsdp_worker.py.

FSDP2 frees each unsharded parameter after use (UntypedStorage.resize_(0)) and gathers it again later, outside
torch's ops; remat pins what was computed from the parameter before the bytes go (storage_will_change), so no
replay reads a freed parameter. Each rank at 0.8 of its own peak evicts and replays, and its losses and parameter
shards are byte-identical to FSDP2 without remat. A budget too small on one rank raises torch.OutOfMemoryError on
that rank, remat switches off there, and both processes end (no hang: bounded by the test's timeout)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

import oracle
from conftest import ROOT

WORKER = Path(__file__).resolve().parent / "fsdp_worker.py"
FRACTION = 0.8


def launch(out: Path, specs):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "integration" / "python"), str(WORKER.parent)]),
               OMP_NUM_THREADS="1")
    ranks = [subprocess.Popen([sys.executable, str(WORKER), str(rank), "2", str(port), str(out), spec], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank, spec in enumerate(specs)]
    for rank, process in enumerate(ranks):
        _, err = process.communicate(timeout=180)
        assert process.returncode == 0, f"rank {rank} failed:\n{err[-3000:]}"


def test_fsdp2_two_ranks_at_part_of_their_peak_are_byte_identical(tmp_path):
    launch(tmp_path, [str(FRACTION), str(FRACTION)])
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        stats = result["stats"]
        assert stats["evictions"] > 0 and stats["rematerializations"] > 0, stats
        assert stats["peak_allocated_bytes"] <= stats["budget"]
        reference, got = result["reference"], result["remat"]
        assert len(got["losses"]) == 3
        for step, (a, b) in enumerate(zip(reference["losses"], got["losses"])):
            assert oracle.same_bytes(a, b), f"rank {rank}: loss of step {step} differs"
        assert reference["shards"].keys() == got["shards"].keys()
        for name, shard in reference["shards"].items():
            assert oracle.same_bytes(shard, got["shards"][name]), f"rank {rank}: parameter shard {name} differs"


def test_a_budget_too_small_on_one_rank_raises_there_and_both_ranks_end(tmp_path):
    launch(tmp_path, [f"bytes:{1 << 30}", f"bytes:{64 << 10}"])
    outcomes = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert outcomes[1]["outcome"].startswith("OutOfMemoryError: remat: CPU memory budget exhausted"), outcomes
    assert not outcomes[1]["remat_enabled_after"]
    assert outcomes[0]["outcome"] != "trained", outcomes  # its peer left: a collective failed instead of hanging
    assert not outcomes[0]["remat_enabled_after"]
