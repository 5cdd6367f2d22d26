"""Hugging Face Trainer under remat with no code change (issue 17, item 3): trainer_worker.py runs a Trainer (small
GPT-2, synthetic data, 5 steps, a checkpoint saved at step 5) once without remat, once with REMAT_BUDGET = 1 GiB
(to measure the peak under remat) and once with REMAT_BUDGET = 0.6 of that peak. The budgeted run evicts and
rematerializes, stays within its budget, and its logged losses, saved weights and saved optimizer state are
byte-identical to the run without remat; the saved checkpoint loads with from_pretrained."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file

import oracle
from conftest import ROOT

WORKER = Path(__file__).resolve().parent / "trainer_worker.py"


def run_trainer(out: Path, budget=None) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "integration" / "python"),
                                                       str(WORKER.parent)]))
    env.pop("REMAT_BUDGET", None)
    if budget is not None:
        env["REMAT_BUDGET"] = str(budget)
    done = subprocess.run([sys.executable, str(WORKER), str(out)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "run.json").read_text())


def test_trainer_with_only_REMAT_BUDGET_is_byte_identical_and_its_checkpoint_loads(tmp_path):
    reference = run_trainer(tmp_path / "reference")
    unconstrained = run_trainer(tmp_path / "unconstrained", budget=1 << 30)
    assert unconstrained["stats"]["evictions"] == 0
    budget = int(0.6 * unconstrained["stats"]["peak_allocated_bytes"])
    got = run_trainer(tmp_path / "budgeted", budget=budget)
    stats = got["stats"]
    assert stats["evictions"] > 0 and stats["rematerializations"] > 0, stats
    assert stats["peak_allocated_bytes"] <= budget

    assert got["losses"] == reference["losses"] and len(got["losses"]) == 5
    saved = {name: tmp_path / name / "checkpoint-5" for name in ("reference", "budgeted")}
    weights = {name: load_file(str(path / "model.safetensors")) for name, path in saved.items()}
    assert weights["reference"].keys() == weights["budgeted"].keys()
    for key, tensor in weights["reference"].items():
        assert oracle.same_bytes(tensor, weights["budgeted"][key]), f"saved weight {key} differs"
    optimizers = {name: torch.load(path / "optimizer.pt") for name, path in saved.items()}
    for index, state in optimizers["reference"]["state"].items():
        for key, value in state.items():
            if torch.is_tensor(value):
                assert oracle.same_bytes(value, optimizers["budgeted"]["state"][index][key]), (index, key)

    loaded = transformers.GPT2LMHeadModel.from_pretrained(saved["budgeted"])
    for name, parameter in loaded.named_parameters():
        if name in weights["budgeted"]:
            assert oracle.same_bytes(parameter.detach(), weights["budgeted"][name]), f"loaded {name} differs"
