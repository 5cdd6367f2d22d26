"""Pictures of a run (issue 20): remat.dump_snapshot writes what torch.cuda.memory._snapshot() writes, and PyTorch's
own memory_viz functions read it; remat.trace writes a Chrome trace with ops, nested replays, remat's events and
memory counters, alongside torch.profiler; python -m remat.plot draws it. The GPT test model trains 2 steps at 0.5
of its peak (drop-only), so evictions and replays happen."""

import base64
import json
import os
import pickle
import re
import subprocess
import sys

import pytest
import torch
from torch.cuda import _memory_viz

from conftest import ROOT
import remat
import test_remat_training as training

BUDGET_FRACTION = 0.5


@pytest.fixture(scope="module")
def gpt_budget():
    return int(BUDGET_FRACTION * training.reference_and_peak("gpt", "sgd")[1])


def train_gpt(steps=2):
    model, inputs, targets, loss_fn = training.build("gpt")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    torch.manual_seed(1)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        del loss
    return model


def live_blocks_from_history(trace):
    """Replays a memory_viz event history from an empty arena: the addresses allocated at its end."""
    live = {}
    for event in trace:
        if event["action"] == "alloc":
            assert event["addr"] not in live, f"alloc at a live address: {event}"
            live[event["addr"]] = event["size"]
        elif event["action"] == "free_completed":
            assert live.pop(event["addr"]) == event["size"], f"free of a different size: {event}"
    return live


def embedded_snapshot(html):
    """The snapshot a memory_viz HTML page embeds (base64 of the pickle, as torch.cuda._memory_viz writes it)."""
    files = json.loads(re.search(r"const local_files = (\[.*?\])\n", html).group(1))
    return pickle.loads(base64.b64decode(files[0]["base64"]))


def test_a_snapshot_is_what_memory_viz_reads_and_holds_remats_events(tmp_path, gpt_budget):
    path = tmp_path / "snapshot.pickle"
    remat.record_memory_history()  # before the arena exists: the history sees every block it ever holds
    try:
        with remat.enable(gpt_budget, costs="estimated"):
            train_gpt()
            remat.dump_snapshot(path)
            stats = remat.stats()
    finally:
        remat.record_memory_history(False)
    assert stats["evictions"] > 0 and stats["rematerializations"] > 0, stats
    snapshot = pickle.loads(path.read_bytes())

    (segment,) = snapshot["segments"]
    assert segment["total_size"] == stats["reserved_bytes"]
    assert segment["allocated_size"] == stats["allocated_bytes"]
    allocated = {b["address"]: b["size"] for b in segment["blocks"] if b["state"] == "active_allocated"}
    trace = snapshot["device_traces"][0]
    assert live_blocks_from_history(trace) == allocated  # the history accounts for every byte of the arena
    actions = {e["action"] for e in trace}
    assert {"alloc", "free_requested", "free_completed", "remat_evict", "remat_rematerialize"} <= actions, actions
    evict = next(e for e in trace if e["action"] == "remat_evict")
    assert evict["size"] > 0 and evict["addr"] > 0
    freed_by_eviction = [e for e in trace if e["action"] == "free_completed"
                         and e["frames"] and e["frames"][0]["name"] == "remat: evict"]
    assert freed_by_eviction, "the frees that evictions cause carry remat's context"
    assert any(f["name"].startswith("aten::") for f in freed_by_eviction[0]["frames"][1:])

    # PyTorch's own readers.
    text = _memory_viz.trace(snapshot)
    assert "remat_evict" in text and "remat_rematerialize" in text
    flame = _memory_viz.segments(snapshot, format_flamegraph=lambda lines: lines)
    assert "active_allocated;remat:0:aten::" in flame
    for html in (_memory_viz.trace_plot(snapshot), _memory_viz.segment_plot(snapshot)):
        embedded = embedded_snapshot(html)
        assert any(e["action"] == "remat_evict" for e in embedded["device_traces"][0])


def test_the_ring_keeps_the_newest_events():
    with remat.enable(64 << 20, costs="estimated"):
        remat.record_memory_history(max_entries=100)
        x = torch.randn(256, 256)
        for _ in range(200):
            x = torch.tanh(x)
        recorded = remat._history.memory_events()
        remat.record_memory_history(False)
    assert len(recorded["events"]) == 100
    assert recorded["dropped"] > 0
    with pytest.raises(ValueError, match="max_entries must be a positive int"):
        remat.record_memory_history(max_entries=0)
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda', got 'tpu'"):
        remat.dump_snapshot("unused.pickle", device="tpu")
    with pytest.raises(RuntimeError, match="no CUDA snapshot: remat's CUDA allocator is not installed"):
        remat.dump_snapshot("unused.pickle", device="cuda")


def test_a_chrome_trace_nests_replays_under_ops_alongside_the_profiler(tmp_path, gpt_budget):
    path = tmp_path / "run.json"
    profile_path = tmp_path / "profile.json"
    with remat.enable(gpt_budget, costs="estimated"):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            with remat.trace(path):
                train_gpt()
        allocated_now = remat.stats()["allocated_bytes"]
    profiler.export_chrome_trace(str(profile_path))
    assert any(e.get("name", "").startswith("aten::") for e in json.loads(profile_path.read_text())["traceEvents"])

    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    ops = [e for e in spans if e["cat"] == "op"]
    replays = [e for e in spans if e["cat"] == "replay"]
    assert ops and replays
    for replay in replays:  # inside a span one level up, on its thread
        assert replay["args"]["depth"] >= 1
        assert any(o["tid"] == replay["tid"] and o["args"]["depth"] == replay["args"]["depth"] - 1
                   and o["ts"] <= replay["ts"] and replay["ts"] + replay["dur"] <= o["ts"] + o["dur"]
                   for o in spans), replay
    instants = {e["name"] for e in events if e["ph"] == "i"}
    assert {"evict", "rematerialize"} <= instants, instants
    memory = [e for e in events if e["ph"] == "C" and e["name"] == remat._history.MEMORY_COUNTER]
    assert memory[-1]["args"]["allocated"] == allocated_now  # the counter follows the arena to the byte


def test_remat_plot_draws_a_trace_and_names_a_bad_file(tmp_path, gpt_budget):
    trace_path, image = tmp_path / "run.json", tmp_path / "run.png"
    with remat.enable(gpt_budget, costs="estimated"):
        with remat.trace(trace_path):
            train_gpt(steps=1)
    plot = [sys.executable, "-m", "remat.plot"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "integration" / "python"))
    done = subprocess.run(plot + [str(trace_path), str(image)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = tmp_path / "not_a_trace.json"
    bad.write_text('{"traceEvents": []}')
    done = subprocess.run(plot + [str(bad), str(image)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2
    assert "not a remat.trace file" in done.stderr
