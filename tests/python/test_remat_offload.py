"""Paging to a second tier on CPU (issue 7): the training cases of test_remat_training.py train identically (the byte
oracle, oracle.py: losses, gradients, parameters, buffers, optimizer state and eval-mode outputs) with offload
"always" and "auto" at 0.3 of their peak, with real copies to a host tier (host memory outside the
arena, or a temporary file). The offload options and REMAT_OFFLOAD / REMAT_HOST_BUDGET are parsed by remat's C++
configuration parser; bad values are ValueErrors naming the option or the variable.

train() (test_remat_training.py) calls remat.enable(budget, policy=..., costs=...) without an offload argument, so the
offload mode reaches it the way it reaches any program: through REMAT_OFFLOAD. The whole matrix with paging, as a
table: SWEEP_MODES=off,always,auto python tests/python/test_remat_training.py
"""

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import oracle
import remat
from test_remat_training import (CASES, HUGE, MiB, reference_and_peak, train)

OFFLOAD_BUDGET = 0.3


@pytest.mark.parametrize("offload", ["always", "auto"])
@pytest.mark.parametrize("name,optimizer", CASES)
def test_training_with_offload_is_bitwise_identical(name, optimizer, offload, monkeypatch):
    reference, peak = reference_and_peak(name, optimizer)
    budget = int(peak * OFFLOAD_BUDGET)
    monkeypatch.setenv("REMAT_OFFLOAD", offload)
    got, stats = train(name, optimizer, budget=budget)
    oracle.assert_identical(reference, got, f"{name}/{optimizer} offload={offload} at {OFFLOAD_BUDGET}")
    assert stats["peak_allocated_bytes"] <= budget
    assert stats["failed_allocations"] == (stats["retried_ops"] + stats["retried_replays"]
                                           + stats["retried_composites"])  # every one recovered
    assert stats["page_outs"] > 0 and stats["page_ins"] > 0, stats
    assert stats["paged_out_bytes"] > 0 and stats["paged_in_bytes"] > 0, stats
    assert stats["page_out_wall_ns"] > 0 and stats["page_in_wall_ns"] > 0, stats


def test_the_file_backed_tier_trains_bitwise_identically(monkeypatch):
    reference, peak = reference_and_peak("gpt", "adam")
    monkeypatch.setattr(remat, "enable", functools.partial(remat.enable, offload="always", host_tier="file"))
    got, stats = train("gpt", "adam", budget=int(peak * 0.3))
    oracle.assert_identical(reference, got, "gpt/adam offload=always host_tier=file at 0.3")
    assert stats["page_outs"] > 0 and stats["page_ins"] > 0
    assert stats["host_tier_file_bytes"] > 0


def test_the_host_budget_is_respected_and_what_does_not_fit_is_dropped(monkeypatch):
    reference, peak = reference_and_peak("gpt", "sgd")
    host_budget = peak // 10
    monkeypatch.setenv("REMAT_OFFLOAD", "always")
    monkeypatch.setenv("REMAT_HOST_BUDGET", str(host_budget))
    got, stats = train("gpt", "sgd", budget=int(peak * 0.5))
    oracle.assert_identical(reference, got, "gpt/sgd offload=always, small host budget, at 0.5")
    assert 0 < stats["host_peak_bytes"] <= host_budget
    assert stats["page_outs"] > 0
    assert stats["evictions"] > stats["page_outs"], stats  # victims that did not fit were dropped


def test_stats_show_the_process_peak_resident_memory_beside_the_arena_and_the_host_tier():
    """On a CPU the arena and a memory host tier are the same RAM: remat.stats() shows the process's peak resident
    memory so that what paging did not save is visible (issue 21, item 3)."""
    with remat.enable("8MiB", offload="always", costs="estimated"):
        x = torch.randn(256, 256)
        kept = []
        for _ in range(64):  # 16 MiB made under an 8 MiB budget: half of it goes to the host tier
            x = (x @ x).tanh()
            kept.append(x)
        stats = remat.stats()
    assert stats["host_peak_bytes"] > 0
    assert stats["process_peak_rss_bytes"] >= stats["peak_allocated_bytes"] + stats["host_peak_bytes"]
    # Everything made is kept: the two tiers together held about all of it at once, more than either peak.
    together = stats["resident_and_host_peak_bytes"]
    assert max(stats["host_peak_bytes"], 8 << 20) < together <= stats["peak_allocated_bytes"] + stats["host_peak_bytes"]
    assert together >= 64 * 256 * 256 * 4


def test_offload_off_pages_nothing(monkeypatch):
    monkeypatch.setenv("REMAT_OFFLOAD", "off")
    peak = train("gpt", "sgd", budget=HUGE)[1]["peak_allocated_bytes"]
    stats = train("gpt", "sgd", budget=int(peak * 0.6))[1]
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


FAILING_WRITE = r"""
import resource, signal, torch, remat
# Files of this process may not grow past 1 MiB: the file tier's writes beyond that fail (EFBIG), as on a full disk.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
torch.manual_seed(0)
weights = [torch.randn(256, 256, requires_grad=True) for _ in range(8)]
x = torch.randn(512, 256)
with remat.enable("3MiB", offload="always", host_tier="file"):
    for _ in range(3):
        h = x
        for w in weights:
            h = (h @ w).tanh()
        h.sum().backward()
"""


def test_a_host_tier_write_that_fails_is_named_in_the_error():
    """A page-out whose write to the file tier fails (here: the process may not grow files past 1 MiB; a full disk
    fails the same way) used to end in a bare "budget exhausted ... Raise the budget": the error is now that write's
    failure, a RuntimeError naming the file and why, not an out-of-memory error (issue 22, item 3)."""
    cwd = str(Path(remat.__file__).resolve().parents[1])
    result = subprocess.run([sys.executable, "-c", FAILING_WRITE], capture_output=True, text=True, cwd=cwd,
                            timeout=300, env=os.environ)
    assert result.returncode != 0
    assert "OutOfMemoryError" not in result.stderr and "Raise the budget" not in result.stderr, result.stderr
    assert "RuntimeError: remat: allocating" in result.stderr, result.stderr
    assert "making room for" in result.stderr and "host tier file" in result.stderr
    assert "File too large" in result.stderr
