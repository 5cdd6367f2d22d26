"""The model zoo under remat: every model of zoo.py (torchvision classification models and Hugging Face decoder,
encoder and encoder-decoder families from small configs) trains 3 steps (2 for the slow ones) of SGD (lr 0.01,
momentum 0.9) at 0.5 of its unconstrained peak, with offload "off" and "auto", and each run either

  - trains with results identical to a run without remat, by the byte oracle (oracle.py: losses, gradients,
    parameters, buffers, optimizer state and the eval-mode outputs on the training inputs), with the arena's peak
    within the budget: "identical"; or
  - raises torch.OutOfMemoryError, leaves remat off, and remat.bound.RequiredBytes of the same run shows that the
    budget is below what any runtime needs: "infeasible". With offload "off" the bound is RequiredBytes'
    required_bytes (the optimizer's state, every gradient during the step, and what the op reads and writes: no
    drop-and-recompute runtime can go lower); with offload "auto", which may page gradients and optimizer state to
    host memory, it is its op_bytes (the largest op's own inputs and outputs: nothing can go lower).

An out-of-memory error at a budget the bound allows is a "known gap" of remat's heuristics: printed as
"KNOWN GAP: <model> offload=<mode> at 0.5: <first line of the error>", counted and warned about, never failed (so
that it passes the day it trains). Anything else fails: another exception (RuntimeError, ...), a byte difference
from the run without remat, a peak above the budget, or an unconstrained run (budget 4 GiB, which never binds)
that raises, differs or evicts. The peak is that unconstrained run's stats()["peak_allocated_bytes"]; all runs
under remat use estimated op costs, so eviction choices are the same in every run.

The quick subset (zoo.QUICK) runs by default, inside `make test`; REMAT_ZOO=all runs the whole catalogue
(`make zoo`, scripts/run_zoo.sh), REMAT_ZOO=name,name the models named. With REMAT_ZOO_MARKDOWN=FILE the table of
results is (re)written there after each model. As a script:

    python tests/python/test_zoo.py [--all] [--markdown FILE] [MODEL ...]   # REMAT_BUILD_DIR as for pytest
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import torch

if __name__ == "__main__":  # run as a script: find the package and the library as under pytest
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import conftest  # noqa: F401

import remat
from remat.bound import RequiredBytes

import oracle
import zoo

MiB = 1 << 20
HUGE = 4 << 30
FRACTION = 0.5
MODES = ("off", "auto")
LR, MOMENTUM = 0.01, 0.9

IDENTICAL, INFEASIBLE, GAP, FAIL = "identical", "infeasible", "gap", "FAIL"
# The third cell: drop-only at AT_BOUND_MARGIN x RequiredBytes, when FRACTION is below the bound and that budget is
# still under AT_BOUND_LIMIT of the peak (so that it evicts).
AT_BOUND, AT_BOUND_MARGIN, AT_BOUND_LIMIT = "off@bound", 1.1, 0.95


def selected() -> List[str]:
    """The models to run: REMAT_ZOO unset or "quick": zoo.QUICK; "all": the catalogue; else names, comma-separated."""
    which = os.environ.get("REMAT_ZOO", "quick").strip()
    if which in ("", "quick"):
        return list(zoo.QUICK)
    if which == "all":
        return list(zoo.CATALOGUE)
    return [name.strip() for name in which.split(",") if name.strip()]


@dataclass
class Run:
    snapshot: oracle.Snapshot
    stats: Optional[dict]
    seconds: float
    # The most arena memory of no storage remat knows after a forward pass (remat.stats()["unknown_arena_bytes"]):
    # memory made where remat cannot see it, which it can neither evict nor move.
    unknown_bytes: int = 0


def train(entry: zoo.Entry, budget: Optional[int] = None, offload: str = "off") -> Run:
    """Trains entry.steps steps of SGD; with a budget, under remat (estimated costs). Raises what training raised,
    with remat off. The snapshot is taken once remat is off."""
    case = entry.build()
    opt = torch.optim.SGD(case.model.parameters(), lr=LR, momentum=MOMENTUM)
    torch.manual_seed(1)  # dropout masks
    losses = []
    stats = None
    unknown = 0
    start = time.perf_counter()
    if budget is not None:
        remat.enable(budget, costs="estimated", offload=offload)
    try:
        for _ in range(entry.steps):
            opt.zero_grad()
            loss = case.loss(case.forward())
            if budget is not None:
                unknown = max(unknown, int(remat.stats()["unknown_arena_bytes"]))
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
            del loss
    finally:
        if remat.is_enabled():
            remat.disable()
        if budget is not None:
            stats = remat.stats()  # the last arena's and engine's numbers
    seconds = time.perf_counter() - start
    return Run(oracle.capture(case.model, opt, losses, eval_inputs=case.inputs), stats, seconds, unknown)


def required_bytes(entry: zoo.Entry) -> RequiredBytes:
    """remat.bound.RequiredBytes of the same training run, under a budget that never binds (so that kernels' own
    buffers count)."""
    case = entry.build()
    opt = torch.optim.SGD(case.model.parameters(), lr=LR, momentum=MOMENTUM)
    torch.manual_seed(1)
    with remat.enable(HUGE, costs="estimated"), RequiredBytes(case.model, opt, outside=case.outside) as bound:
        for _ in range(entry.steps):
            opt.zero_grad()
            loss = case.loss(case.forward())
            loss.backward()
            opt.step()
            del loss
    return bound


def first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"


@dataclass
class Cell:
    """One run under remat: its status, and the numbers the table shows."""
    status: str
    message: str = ""
    seconds: float = 0.0
    stats: Dict[str, float] = field(default_factory=dict)

    def get(self, key: str) -> int:
        return int(self.stats.get(key, 0)) if self.stats else 0


@dataclass
class Result:
    entry: zoo.Entry
    reference_seconds: float = 0.0
    peak: int = 0
    budget: int = 0
    required: int = 0     # RequiredBytes.required_bytes (the drop-only bound)
    op_bytes: int = 0     # RequiredBytes.op_bytes (the bound with a tier)
    at_op: str = ""
    unconstrained: Optional[Cell] = None
    cells: Dict[str, Cell] = field(default_factory=dict)

    def failures(self) -> List[str]:
        out = []
        if self.unconstrained is not None and self.unconstrained.status == FAIL:
            out.append(f"{self.entry.name} unconstrained: {self.unconstrained.message}")
        out += [f"{self.entry.name} {mode}: {cell.message}" for mode, cell in self.cells.items() if cell.status == FAIL]
        return out


def run_cell(entry: zoo.Entry, reference: Run, result: Result, mode: str, budget: Optional[int] = None) -> Cell:
    budget = result.budget if budget is None else budget
    offload = "off" if mode == AT_BOUND else mode
    start = time.perf_counter()
    try:
        run = train(entry, budget, offload)
    except torch.OutOfMemoryError as error:
        seconds = time.perf_counter() - start
        if remat.is_enabled():
            return Cell(FAIL, f"remat still enabled after {first_line(error)}", seconds)
        stats = remat.stats()  # the failed run's arena and engine, up to the error
        bound = result.op_bytes if offload == "auto" else result.required
        kind = "op_bytes" if offload == "auto" else "required_bytes"
        if bound > budget:
            return Cell(INFEASIBLE, f"RequiredBytes.{kind} {bound} > budget {budget}", seconds, stats)
        at = str(FRACTION) if budget == result.budget else f"{budget / max(result.peak, 1):.2f}"
        message = f"KNOWN GAP: {entry.name} offload={offload} at {at}: {first_line(error)}"
        print(message, flush=True)
        warnings.warn(message + f" (RequiredBytes.{kind} {bound} <= budget {budget})", stacklevel=2)
        return Cell(GAP, first_line(error), seconds, stats)
    except Exception as error:  # noqa: BLE001 (every other exception is a failure, reported with its message)
        seconds = time.perf_counter() - start
        return Cell(FAIL, first_line(error), seconds, {} if remat.is_enabled() else remat.stats())
    stats = run.stats
    diffs = oracle.differences(reference.snapshot, run.snapshot)
    if diffs:
        return Cell(FAIL, f"{len(diffs)} observables differ from the run without remat: " + "; ".join(diffs[:6]),
                    run.seconds, stats)
    if stats["peak_allocated_bytes"] > budget:
        return Cell(FAIL, f"peak_allocated_bytes {stats['peak_allocated_bytes']} > budget {budget}", run.seconds,
                    stats)
    return Cell(IDENTICAL, "", run.seconds, stats)


def run_model(entry: zoo.Entry, modes=MODES) -> Result:
    """Reference, unconstrained peak, RequiredBytes, then each mode at FRACTION of the peak."""
    result = Result(entry)
    reference = train(entry)
    result.reference_seconds = reference.seconds
    try:
        unconstrained = train(entry, HUGE, "off")
    except Exception as error:  # noqa: BLE001
        result.unconstrained = Cell(FAIL, f"at a budget of {HUGE} (never binds): {first_line(error)}")
        return result
    stats = unconstrained.stats
    result.peak = int(stats["peak_allocated_bytes"])
    diffs = oracle.differences(reference.snapshot, unconstrained.snapshot)
    if diffs:
        message = f"{len(diffs)} observables differ from the run without remat: " + "; ".join(diffs[:6])
        result.unconstrained = Cell(FAIL, message, unconstrained.seconds, stats)
    elif stats["evictions"] != 0:
        result.unconstrained = Cell(FAIL, f"{stats['evictions']} evictions at {HUGE}", unconstrained.seconds, stats)
    elif unconstrained.unknown_bytes != 0:
        message = (f"{unconstrained.unknown_bytes} bytes of the arena held no storage remat knows after a forward "
                   "pass (memory made where remat cannot see it: never evictable)")
        result.unconstrained = Cell(FAIL, message, unconstrained.seconds, stats)
    else:
        result.unconstrained = Cell(IDENTICAL, "", unconstrained.seconds, stats)
    del unconstrained
    bound = required_bytes(entry)
    result.required, result.op_bytes, result.at_op = bound.required_bytes, bound.op_bytes, bound.at_op
    del bound
    result.budget = int(FRACTION * result.peak)
    for mode in modes:
        result.cells[mode] = run_cell(entry, reference, result, mode)
    # Drop-only below FRACTION is often impossible for any runtime (gradients and momentum fill it): then recompute
    # alone is checked where the bound allows it, at AT_BOUND_MARGIN times the bound, if that still evicts.
    off = result.cells.get("off")
    at_bound = int(AT_BOUND_MARGIN * result.required)
    if off is not None and off.status == INFEASIBLE and at_bound < AT_BOUND_LIMIT * result.peak:
        result.cells[AT_BOUND] = run_cell(entry, reference, result, AT_BOUND, budget=at_bound)
    return result


RESULTS: List[Result] = []


# ---------------------------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------------------------

def _cell_text(cell: Optional[Cell], mode: str) -> str:
    if cell is None:
        return ""
    counts = f"{cell.get('evictions')} ev"
    if mode == "auto":
        counts = f"{cell.get('paged_out_bytes') / MiB:.1f} MiB paged, {counts}"
    return f"{cell.status}, {counts}" if cell.stats else cell.status


def shorten(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def summary(results: List[Result]) -> Dict[str, int]:
    counts = {IDENTICAL: 0, INFEASIBLE: 0, GAP: 0, FAIL: 0}
    for r in results:
        if r.unconstrained is not None and r.unconstrained.status == FAIL and not r.cells:
            counts[FAIL] += len(MODES)
        for cell in r.cells.values():
            counts[cell.status] += 1
    return counts


def markdown(results: List[Result]) -> str:
    lines = [f"| model | family | input | steps | peak MiB | RequiredBytes / peak (op) | offload off at {FRACTION} | "
             f"offload auto at {FRACTION} | off at {AT_BOUND_MARGIN} x RequiredBytes | "
             f"time s (no remat / off / auto / off at bound) |",
             "|---|---|---|---:|---:|---:|---|---|---|---:|"]
    for r in results:
        e = r.entry
        peak = f"{r.peak / MiB:.1f}" if r.peak else ""
        bound = f"{r.required / r.peak:.2f} ({r.op_bytes / r.peak:.2f})" if r.peak and r.required else ""
        if r.unconstrained is not None and r.unconstrained.status == FAIL and not r.cells:
            off = auto = "FAIL (unconstrained)"
            at_bound = ""
        else:
            off, auto = _cell_text(r.cells.get("off"), "off"), _cell_text(r.cells.get("auto"), "auto")
            at_bound = _cell_text(r.cells.get(AT_BOUND), "off")
            if at_bound and r.peak:
                at_bound = f"{int(AT_BOUND_MARGIN * r.required) / r.peak:.2f}: {at_bound}"
            if r.unconstrained is not None and r.unconstrained.status == FAIL:
                off, auto = f"{off}; unconstrained FAIL", f"{auto}; unconstrained FAIL"
        times = " / ".join(f"{s:.2f}" for s in [r.reference_seconds] + [c.seconds for c in r.cells.values()])
        lines.append(f"| {e.name} | {e.family} | {e.input} | {e.steps} | {peak} | {bound} | {off} | {auto} | "
                     f"{at_bound} | {times} |")
    counts = summary(results)
    lines.append("")
    lines.append(f"{len(results)} models, {sum(counts.values())} runs: " +
                 ", ".join(f"{counts[k]} {k}" for k in (IDENTICAL, INFEASIBLE, GAP, FAIL)) + ".")
    failures = [f for r in results for f in r.failures()]
    gaps = [f"{r.entry.name} {m}: {c.message}" for r in results for m, c in r.cells.items() if c.status == GAP]
    for title, items in (("Failures", failures), ("Known gaps", gaps)):
        if items:
            lines += ["", f"{title}:", ""] + [f"- {shorten(item)}" for item in items]
    if zoo.EXCLUDED:
        lines += ["", "Excluded:", ""] + [f"- {name}: {why}" for name, why in zoo.EXCLUDED.items()]
    return "\n".join(lines) + "\n"


def print_result(r: Result) -> None:
    bound = f"{r.required / r.peak:.2f}" if r.peak and r.required else "-"
    print(f"{r.entry.name} ({r.entry.family}, {r.entry.input}): peak {r.peak / MiB:.1f} MiB, RequiredBytes {bound} "
          f"of it (op {r.op_bytes / max(r.peak, 1):.2f}, at {r.at_op}), no remat {r.reference_seconds:.1f} s",
          flush=True)
    if r.unconstrained is not None and r.unconstrained.status == FAIL:
        print(f"  unconstrained: FAIL {r.unconstrained.message}", flush=True)
    for mode, c in r.cells.items():
        extra = f" {c.message}" if c.message else ""
        print(f"  {mode:4} {c.status:10} {c.seconds:6.1f} s evictions {c.get('evictions')} remats "
              f"{c.get('rematerializations')} paged out {c.get('paged_out_bytes') / MiB:.1f} MiB peak "
              f"{c.get('peak_allocated_bytes') / MiB:.1f} MiB{extra}", flush=True)


# ---------------------------------------------------------------------------------------------------------------
# pytest
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def _zoo_table():
    yield
    if RESULTS:
        counts = summary(RESULTS)
        print("\nzoo: " + ", ".join(f"{counts[k]} {k}" for k in (IDENTICAL, INFEASIBLE, GAP, FAIL)))


def test_the_catalogue_covers_every_torchvision_classification_model():
    import torchvision
    names = torchvision.models.list_models(module=torchvision.models)
    for name in names:
        assert (name in zoo.CATALOGUE) != (name in zoo.EXCLUDED), name
        assert name not in zoo.EXCLUDED or len(zoo.EXCLUDED[name]) > 20, f"{name}: exclusion without a reason"
    assert set(zoo.QUICK) <= set(zoo.CATALOGUE)
    families = {entry.family for entry in zoo.CATALOGUE.values()}
    assert {"torchvision", "hf decoder", "hf encoder", "hf encoder-decoder"} <= families


def _tiny_entry(name, loss_hook):
    """An MLP with dropout, more activations than parameters (it trains at 0.5 of its peak), whose loss goes through
    `loss_hook`: to check the harness's verdicts."""
    def build():
        torch.manual_seed(0)
        layers = [m for _ in range(6) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1))]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(64, 10))
        x, y = torch.randn(512, 64), torch.randint(0, 10, (512,))
        return zoo.Case(model, x, lambda out: loss_hook(torch.nn.functional.cross_entropy(out, y)), [x, y])
    return zoo.Entry(name, "test", "512 x 64", build)


def _under_a_binding_budget():
    return remat.is_enabled() and remat.stats()["budget"] < HUGE


def test_the_harness_fails_a_run_that_differs_from_the_run_without_remat():
    result = run_model(_tiny_entry("differs", lambda loss: loss * 1.5 if remat.is_enabled() else loss))
    assert result.unconstrained.status == FAIL and "differ" in result.unconstrained.message
    assert [cell.status for cell in result.cells.values()] == [FAIL, FAIL]
    assert all("loss[0] differs" in cell.message for cell in result.cells.values())
    assert not remat.is_enabled()


def test_the_harness_fails_a_run_that_raises_anything_but_out_of_memory():
    def hook(loss):
        if _under_a_binding_budget():
            raise RuntimeError("remat: this tensor's storage is evicted (a stand-in)")
        return loss
    result = run_model(_tiny_entry("raises", hook))
    assert result.unconstrained.status == IDENTICAL
    assert [cell.status for cell in result.cells.values()] == [FAIL, FAIL]
    assert all(cell.message == "RuntimeError: remat: this tensor's storage is evicted (a stand-in)"
               for cell in result.cells.values())
    assert len(result.failures()) == 2
    assert not remat.is_enabled()


@pytest.mark.filterwarnings("ignore:KNOWN GAP")  # the stand-in's gaps are not remat's: keep them out of the summary
def test_the_harness_tells_an_infeasible_budget_from_a_known_gap():
    def hook(loss):
        if _under_a_binding_budget():
            raise torch.OutOfMemoryError("remat: CPU memory budget exhausted (a stand-in)")
        return loss
    entry = _tiny_entry("stand-in", hook)
    result = run_model(entry)
    assert 0 < result.op_bytes <= result.required <= result.peak
    assert not result.failures() and not remat.is_enabled()
    for mode, bound in (("off", result.required), ("auto", result.op_bytes)):
        assert result.cells[mode].status == (INFEASIBLE if bound > result.budget else GAP), (mode, bound, result)
    # The same error with the bounds below the budget: known gaps, warned about, not failures.
    result.required = result.op_bytes = 1
    reference = train(entry)
    with pytest.warns(UserWarning, match="KNOWN GAP: stand-in offload=off at 0.5: OutOfMemoryError"):
        assert run_cell(entry, reference, result, "off").status == GAP
    # And above it: infeasible.
    result.required = result.op_bytes = result.budget + 1
    assert run_cell(entry, reference, result, "auto").status == INFEASIBLE


@pytest.mark.parametrize("name", ["llama", "gpt_neox"])
def test_a_decoder_trains_at_its_bound_though_it_keeps_its_loss_through_the_optimizer_step(name):
    """At 1.1 x RequiredBytes, drop-only, Hugging Face decoders (llama, mistral, phi, gpt_neox) ran out in their
    second optimizer step, bringing back 'aten::nll_loss_forward': under pressure in the backward pass the policy had
    evicted the 4-byte loss the step keeps (stale since the forward pass), and the first parameter update had to
    bring it back at once (nothing may be replayed from a parameter's old bytes), replaying the forward pass with
    gradients and momentum resident. Small results are last-resort victims now (EngineOptions::last_resort_bytes)."""
    result = run_model(zoo.CATALOGUE[name])
    assert AT_BOUND in result.cells, result
    cell = result.cells[AT_BOUND]
    assert cell.status == IDENTICAL, cell.message
    assert cell.get("evictions") > 0  # the budget binds


def test_running_out_while_a_parameter_update_brings_a_result_back_says_so():
    """opt at 1.1 x RequiredBytes, drop-only, runs out in an optimizer step (a known gap, docs/zoo_results.md): the
    first parameter update must bring back a gradient the backward pass evicted (nothing may be replayed from a
    parameter's old bytes), replaying the forward pass's logits. The error said "running 'aten::mm'", an op the
    program was not running; it now says that remat was bringing a result back, and which op's write asked for it.
    Trains once the gap closes; then there is no message to check."""
    entry = zoo.CATALOGUE["opt"]
    bound = required_bytes(entry).required_bytes
    try:
        train(entry, budget=int(AT_BOUND_MARGIN * bound))
    except torch.OutOfMemoryError as error:
        message = str(error)
        assert "bringing back a result of 'aten::" in message, message
        assert "running '" not in message, message
        assert "before 'aten::add_.Tensor' overwrote a value its replay reads" in message, message
    assert not remat.is_enabled()


@pytest.mark.parametrize("name", selected())
def test_model_trains_identically_at_half_its_peak_or_the_budget_is_infeasible(name):
    assert name in zoo.CATALOGUE, f"{name} is not in zoo.CATALOGUE (excluded: {zoo.EXCLUDED.get(name)})"
    result = run_model(zoo.CATALOGUE[name])
    RESULTS.append(result)
    print_result(result)
    if os.environ.get("REMAT_ZOO_MARKDOWN"):  # rewritten after every model: a long run shows its progress
        Path(os.environ["REMAT_ZOO_MARKDOWN"]).write_text(markdown(RESULTS))
    assert not remat.is_enabled()
    failures = result.failures()
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------------------------------
# The script
# ---------------------------------------------------------------------------------------------------------------

def main(argv: List[str]) -> int:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help="catalogue names (default: REMAT_ZOO, else the quick subset)")
    parser.add_argument("--all", action="store_true", help="the whole catalogue")
    parser.add_argument("--markdown", metavar="FILE", help="write the table there")
    args = parser.parse_args(argv)
    names = list(zoo.CATALOGUE) if args.all else (args.models or selected())
    unknown = [n for n in names if n not in zoo.CATALOGUE]
    if unknown:
        parser.error(f"not in the catalogue: {', '.join(unknown)}")
    start = time.perf_counter()
    results = []
    for name in names:
        try:
            result = run_model(zoo.CATALOGUE[name])
        except Exception as error:  # noqa: BLE001 (the reference run itself: report, go on)
            result = Result(zoo.CATALOGUE[name], unconstrained=Cell(FAIL, f"harness: {first_line(error)}"))
        finally:
            if remat.is_enabled():
                remat.disable()
        results.append(result)
        print_result(result)
        if args.markdown:  # rewritten after every model: a long run shows its progress
            Path(args.markdown).write_text(markdown(results))
    counts = summary(results)
    print(f"zoo: {len(results)} models in {time.perf_counter() - start:.0f} s: " +
          ", ".join(f"{counts[k]} {k}" for k in (IDENTICAL, INFEASIBLE, GAP, FAIL)), flush=True)
    return 1 if counts[FAIL] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
