"""Paging to a second tier on CPU (issue 7): the training cases of test_remat_training.py train bitwise identically
with offload "always" and "auto" at budgets their drop-only runs cannot reach, with real copies to a host tier
(host memory outside the arena, or a temporary file). The offload options and REMAT_OFFLOAD / REMAT_HOST_BUDGET
are parsed by remat's C++ configuration parser; bad values are ValueErrors naming the option or the variable.

train() (test_remat_training.py) calls remat.enable(budget, policy=..., costs=...) without offload arguments, so the
offload mode reaches it the way it reaches any program: through REMAT_OFFLOAD."""

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if __name__ == "__main__":  # run as a script (the sweep at the end): the paths pytest's conftest.py sets up
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import conftest  # noqa: F401

import remat  # noqa: E402
from test_remat_training import CASES, HUGE, MiB, assert_identical, train

# (model, optimizer, offload) -> budgets as fractions of the measured unconstrained peak, with estimated op costs
# (the same choices in every run). Only budgets that pass are listed; measured on 2026-11-22 by running this file as
# a script (see the end of the file and integration/README.md, "Paging to a second tier (CPU)"):
#   - gpt, resnet18/sgd and densenet121/sgd pass at 0.3 in both modes: what cannot be dropped (gradients,
#     optimizer state, results pinned by optimizer steps) is paged out instead. Lowest passing: gpt/sgd 0.25 (both
#     modes), gpt/adam 0.25 (always) and 0.3 (auto), resnet18/sgd 0.2 (both; 0.15 and 0.1 fail), densenet121/sgd
#     0.15 (always) and 0.1 (auto, the lowest tried). Below those an allocation fails with OutOfMemoryError: the running op's inputs
#     and outputs and the fragmentation around them leave no hole.
#   - lstm (sgd and adam) does not pass at 0.3 to 0.6 in either mode: at 0.3 one allocation inside aten::lstm
#     (2 MB) is larger than the budget; at 0.4 to 0.6 a 570 KB request finds free bytes but no hole after paging
#     everything it can (fragmentation). Its lowest passing budget stays that of dropping alone (CASES).
OFFLOAD_CASES = {
    ("gpt", "sgd", "always"): (0.3, 0.25),
    ("gpt", "sgd", "auto"): (0.3, 0.25),
    ("gpt", "adam", "always"): (0.3, 0.25),
    ("gpt", "adam", "auto"): (0.3,),
    ("resnet18", "sgd", "always"): (0.3, 0.2),
    ("resnet18", "sgd", "auto"): (0.3, 0.2),
    ("densenet121", "sgd", "always"): (0.3, 0.15),
    ("densenet121", "sgd", "auto"): (0.3, 0.1),
}


@pytest.fixture(autouse=True)
def _remat_off_after_each_test():
    yield
    if remat.is_enabled():
        remat.disable()


@pytest.mark.parametrize("name,optimizer,offload", list(OFFLOAD_CASES))
def test_training_with_offload_is_bitwise_identical(name, optimizer, offload, monkeypatch):
    assert (name, optimizer) in CASES
    reference = train(name, optimizer)
    peak = train(name, optimizer, budget=HUGE)[3]["peak_allocated_bytes"]
    drop_only_lowest = min(CASES[(name, optimizer)])
    monkeypatch.setenv("REMAT_OFFLOAD", offload)
    for fraction in OFFLOAD_CASES[(name, optimizer, offload)]:
        assert fraction < drop_only_lowest  # a budget that dropping alone does not reach today
        budget = int(peak * fraction)
        got = train(name, optimizer, budget=budget)
        stats = got[3]
        assert_identical(reference, got, f"{name}/{optimizer} offload={offload} at {fraction}")
        assert stats["peak_allocated_bytes"] <= budget
        assert stats["failed_allocations"] == stats["retried_ops"] + stats["retried_replays"]  # every one recovered
        assert stats["page_outs"] > 0 and stats["page_ins"] > 0, stats
        assert stats["paged_out_bytes"] > 0 and stats["paged_in_bytes"] > 0, stats
        assert stats["page_out_wall_ns"] > 0 and stats["page_in_wall_ns"] > 0, stats


def test_the_file_backed_tier_trains_bitwise_identically(monkeypatch):
    reference = train("gpt", "adam")
    peak = train("gpt", "adam", budget=HUGE)[3]["peak_allocated_bytes"]
    monkeypatch.setattr(remat, "enable", functools.partial(remat.enable, offload="always", host_tier="file"))
    got = train("gpt", "adam", budget=int(peak * 0.3))
    assert_identical(reference, got, "gpt/adam offload=always host_tier=file at 0.3")
    stats = got[3]
    assert stats["page_outs"] > 0 and stats["page_ins"] > 0
    assert stats["host_tier_file_bytes"] > 0


def test_the_host_budget_is_respected_and_what_does_not_fit_is_dropped(monkeypatch):
    reference = train("gpt", "sgd")
    peak = train("gpt", "sgd", budget=HUGE)[3]["peak_allocated_bytes"]
    host_budget = peak // 10
    monkeypatch.setenv("REMAT_OFFLOAD", "always")
    monkeypatch.setenv("REMAT_HOST_BUDGET", str(host_budget))
    got = train("gpt", "sgd", budget=int(peak * 0.5))
    assert_identical(reference, got, "gpt/sgd offload=always, small host budget, at 0.5")
    stats = got[3]
    assert 0 < stats["host_peak_bytes"] <= host_budget
    assert stats["page_outs"] > 0
    assert stats["evictions"] > stats["page_outs"], stats  # victims that did not fit were dropped


def test_offload_off_pages_nothing(monkeypatch):
    monkeypatch.setenv("REMAT_OFFLOAD", "off")
    peak = train("gpt", "sgd", budget=HUGE)[3]["peak_allocated_bytes"]
    stats = train("gpt", "sgd", budget=int(peak * 0.6))[3]
    assert stats["evictions"] > 0
    assert stats["page_outs"] == 0 and stats["paged_out_bytes"] == 0 and stats["host_peak_bytes"] == 0


def test_enable_reports_the_offload_settings(monkeypatch):
    monkeypatch.delenv("REMAT_OFFLOAD", raising=False)
    monkeypatch.delenv("REMAT_HOST_BUDGET", raising=False)
    with remat.enable(budget=16 * MiB, offload="auto", host_budget="64MiB") as enabled:
        assert (enabled.offload, enabled.host_budget, enabled.host_tier) == ("auto", 64 * MiB, "memory")
        assert "offload='auto'" in repr(enabled)
    monkeypatch.setenv("REMAT_OFFLOAD", "always")
    monkeypatch.setenv("REMAT_HOST_BUDGET", "1GiB")
    with remat.enable(budget=16 * MiB) as enabled:
        assert (enabled.offload, enabled.host_budget) == ("always", 1 << 30)
    with remat.enable(budget=16 * MiB, offload="off") as enabled:  # the argument wins over the environment
        assert enabled.offload == "off"
    for key in ("page_outs", "page_ins", "paged_out_bytes", "paged_in_bytes", "stall_ns", "host_peak_bytes"):
        assert key in remat.stats(), key


@pytest.mark.parametrize("kwargs,match", [
    (dict(offload="sometimes"), r"offload: unknown offload mode \"sometimes\"; expected off, auto or always"),
    (dict(offload=1), r"offload is one of 'off', 'auto', 'always'"),
    (dict(offload="auto", host_budget="lots"), r"host_budget: .*lots"),
    (dict(offload="auto", host_budget=0), r"host_budget must be > 0 bytes"),
    (dict(offload="auto", host_tier="flash"), r"unknown host_tier 'flash'; expected one of memory, file"),
])
def test_bad_offload_options_are_value_errors_naming_the_option(kwargs, match):
    with pytest.raises(ValueError, match=match):
        remat.enable(budget=16 * MiB, **kwargs)
    assert not remat.is_enabled()


def test_bad_offload_variables_are_value_errors_naming_the_variable(monkeypatch):
    monkeypatch.setenv("REMAT_OFFLOAD", "sometimes")
    with pytest.raises(ValueError, match=r"REMAT_OFFLOAD=\"sometimes\" is not valid"):
        remat.enable(budget=16 * MiB)
    monkeypatch.setenv("REMAT_OFFLOAD", "auto")
    monkeypatch.setenv("REMAT_HOST_BUDGET", "12 parsecs")
    with pytest.raises(ValueError, match=r"REMAT_HOST_BUDGET=\"12 parsecs\" is not valid"):
        remat.enable(budget=16 * MiB)
    assert not remat.is_enabled()
    cwd = str(Path(remat.__file__).resolve().parents[1])
    env = {**os.environ, "REMAT_BUDGET": "64MiB", "REMAT_OFFLOAD": "sideways"}
    env.pop("REMAT_HOST_BUDGET", None)
    bad = subprocess.run([sys.executable, "-c", "import remat"], capture_output=True, text=True, cwd=cwd, timeout=120,
                         env=env)
    assert bad.returncode != 0
    assert "ImportError" in bad.stderr and "REMAT_OFFLOAD=\"sideways\" is not valid" in bad.stderr


def _sweep(name, optimizer, mode, fractions):
    """One row per fraction: PASS (bitwise identical, peak within the budget) with the paging numbers, or FAIL."""
    import time
    reference = train(name, optimizer)
    start = time.perf_counter()
    train(name, optimizer)  # warm: the baseline time without remat
    baseline_s = time.perf_counter() - start
    peak = train(name, optimizer, budget=HUGE)[3]["peak_allocated_bytes"]
    os.environ["REMAT_OFFLOAD"] = mode
    try:
        for fraction in fractions:
            budget = int(peak * fraction)
            try:
                start = time.perf_counter()
                got = train(name, optimizer, budget=budget)
                wall_s = time.perf_counter() - start
                assert_identical(reference, got, f"{name}/{optimizer}/{mode} at {fraction}")
                s = got[3]
                assert s["peak_allocated_bytes"] <= budget
                print(f"{name} {optimizer} {mode} {fraction} PASS peak={peak} evictions={s['evictions']} "
                      f"rematerializations={s['rematerializations']} retried={s['retried_ops'] + s['retried_replays']} "
                      f"compactions={s['compactions']} page_outs={s['page_outs']} "
                      f"page_ins={s['page_ins']} paged_out_bytes={s['paged_out_bytes']} "
                      f"paged_in_bytes={s['paged_in_bytes']} host_peak_bytes={s['host_peak_bytes']} "
                      f"wall_s={wall_s:.2f} baseline_wall_s={baseline_s:.2f} "
                      f"copy_wall_s={(s['page_out_wall_ns'] + s['page_in_wall_ns']) / 1e9:.2f}", flush=True)
            except (AssertionError, RuntimeError) as error:  # torch.OutOfMemoryError is a RuntimeError
                print(f"{name} {optimizer} {mode} {fraction} FAIL {type(error).__name__}: "
                      f"{(str(error).splitlines() or [''])[0][:200]}", flush=True)
    finally:
        del os.environ["REMAT_OFFLOAD"]


if __name__ == "__main__":
    # python tests/python/test_remat_offload.py MODEL OPTIMIZER MODE FRACTION[,FRACTION...]
    # (with REMAT_BUILD_DIR set as for pytest; run from anywhere)
    if len(sys.argv) != 5:
        sys.exit("usage: test_remat_offload.py MODEL OPTIMIZER off|auto|always FRACTION[,FRACTION...]")
    _sweep(sys.argv[1], sys.argv[2], sys.argv[3], [float(f) for f in sys.argv[4].split(",")])
