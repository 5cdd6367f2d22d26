"""The ecosystem probe: training programs from outside the test matrix (tests/python/ecosystem/: training loops,
layers with side effects, extension points, every optimizer, Hugging Face models beyond the zoo, front ends such as
TorchScript and dispatch modes, timm, peft, opacus, einops, torchvision's detection, segmentation, video and flow
models, training patterns across steps: retries after errors, distillation, SWA, MAML, MoCo, adversarial training)
train under remat drop-only and are compared byte for byte (oracle.py) with the same program without remat.

Per program: its peak (a run with a budget that never binds) and RequiredBytes (remat.bound), then runs at 0.7 and 0.5
of the peak, each raised to 1.25x RequiredBytes when below it (a budget no drop-and-recompute runtime could meet
says nothing). Each run is:
  - identical (the oracle agrees),
  - a gap: torch.OutOfMemoryError above the bound (a kernel's workspace, results the program keeps across the
    optimizer step, fragmentation of a small model: reported, not failed),
  - FAIL: any difference or any other error. If the program without remat is not itself deterministic (two runs
    differ), the run says so instead of blaming remat.

`make test` runs every program but the slow ones (ecosystem.SLOW: torchvision's detection models and their like, a
minute or more each), about 3.5 minutes on 2 cores; REMAT_ECOSYSTEM=name,name runs the ones named, and `make
ecosystem` (REMAT_ECOSYSTEM=all) runs them all, about 15 minutes, and writes the table of results to
BUILD_DIR/ecosystem.md (REMAT_ECOSYSTEM_MARKDOWN=FILE chooses the file)."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List

import pytest
import torch

import oracle
from ecosystem import PROGRAMS, SLOW
from ecosystem.harness import HUGE, required_bytes, run

FRACTIONS = (0.7, 0.5)
BOUND_MARGIN = 1.25
RESULTS: Dict[str, List[str]] = {}


def selected() -> List[str]:
    which = os.environ.get("REMAT_ECOSYSTEM", "").strip()
    if which == "":
        return [name for name in PROGRAMS if name not in SLOW]
    if which == "all":
        return list(PROGRAMS)
    names = [n.strip() for n in which.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        raise ValueError(f"REMAT_ECOSYSTEM names unknown programs {unknown}; known: {sorted(PROGRAMS)}")
    return names


def where_it_ran_out(message: str) -> str:
    """' (running X and replaying Y ...; pinned results N)' from remat's out-of-memory report, or ''; for a result
    brought back outside any op's inputs, 'bringing back a result of X ... before 'W' overwrote ...'."""
    running = re.search(r"(running|bringing back a result of) '[^']*'( and replaying '[^']*' for it "
                        r"\(\d+ replay\(s\) deep\))?", message)
    overwriter = re.search(r"before '[^']*' overwrote", message)
    pinned = re.search(r"pinned results (\d+)", message)
    unknown = re.search(r"in blocks remat does not know (\d+)", message)
    parts = [running.group(0)] if running else []
    if running and overwriter:
        parts[0] += f" {overwriter.group(0)} a value its replay reads"
    if pinned and int(pinned.group(1)) > 0:
        parts.append(f"pinned results {pinned.group(1)}")
    if unknown and int(unknown.group(1)) > 0:
        parts.append(f"kernel buffers {unknown.group(1)}")
    return f" ({', '.join(parts)})" if parts else ""


def markdown() -> str:
    lines = ["| program | peak (bytes) | RequiredBytes / peak | runs |", "|---|---:|---:|---|"]
    for name, row in RESULTS.items():
        lines.append("| " + " | ".join([name] + row) + " |")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name", selected())
def test_a_program_from_outside_the_matrix_is_identical_wherever_it_runs(name):
    build, step = PROGRAMS[name]
    reference, _ = run(build, step)
    _, unconstrained = run(build, step, budget=HUGE)
    peak = unconstrained["peak_allocated_bytes"]
    bound = required_bytes(build, step)
    budgets = sorted({max(int(f * peak), int(BOUND_MARGIN * bound)) for f in FRACTIONS}, reverse=True)
    cells, failures = [], []
    for budget in budgets:
        label = f"{budget / peak:.2f}"
        try:
            got, stats = run(build, step, budget=budget)
        except torch.OutOfMemoryError as error:
            cells.append(f"{label}: gap{where_it_ran_out(str(error))}")
            continue
        except Exception as error:  # noqa: BLE001 -- any other error is the finding
            cells.append(f"{label}: FAIL ({type(error).__name__})")
            failures.append(f"{name} at {label} of its peak: {type(error).__name__}: {error}")
            continue
        try:
            oracle.assert_identical(reference, got, f"{name} at {label} of its peak")
            cells.append(f"{label}: identical ({stats['evictions']} evictions)")
        except AssertionError as difference:
            again, _ = run(build, step)
            try:
                oracle.assert_identical(reference, again, f"{name} without remat, run twice")
            except AssertionError:
                cells.append(f"{label}: not deterministic without remat")
                continue
            cells.append(f"{label}: FAIL (differs)")
            failures.append(str(difference))
    RESULTS[name] = [str(peak), f"{bound / peak:.2f}", "; ".join(cells)]
    if os.environ.get("REMAT_ECOSYSTEM_MARKDOWN"):
        Path(os.environ["REMAT_ECOSYSTEM_MARKDOWN"]).write_text(markdown())
    print(f"\n{name}: peak {peak}, RequiredBytes {bound / peak:.2f} of it: " + "; ".join(cells))
    assert not failures, "\n".join(failures)
