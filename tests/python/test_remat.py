"""The remat Python package on CPU: enable/disable, the budget as a hard limit, stats, and training that is
identical to a run without remat by the byte oracle (oracle.py: losses, gradients, parameters, buffers, optimizer
state, eval-mode outputs). Small models and inputs: the whole file runs in seconds."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import oracle
import remat

MiB = 1 << 20


class SmallNet(torch.nn.Module):
    """Conv, batch norm, pooling, dropout, a residual add and a linear head: views, in-place ops and random ops."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.drop = torch.nn.Dropout(0.3)
        self.head = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv1(x)))
        y = y + torch.relu_(self.conv2(y))
        y = torch.nn.functional.max_pool2d(y, 2)
        return self.head(self.drop(y.flatten(1)))


class TinyTransformer(torch.nn.Module):
    """Embedding, one encoder layer with dropout (attention and feed-forward), and a head."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 32)
        self.layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.2, batch_first=True)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, tokens):
        return self.head(self.layer(self.embed(tokens)).mean(1))


class TinyLSTM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(12, 16, num_layers=2, dropout=0.2, batch_first=True)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


MODELS = {
    "cnn": (SmallNet, lambda: torch.randn(8, 3, 16, 16)),
    "transformer": (TinyTransformer, lambda: torch.randint(0, 50, (8, 12))),
    "lstm": (TinyLSTM, lambda: torch.randn(8, 10, 12)),
}


def train(steps=3, optimizer="sgd", model_name="cnn"):
    """Trains; returns (model, optimizer, losses, inputs): oracle.capture's arguments, to capture once remat is off."""
    torch.manual_seed(0)
    make_model, make_data = MODELS[model_name]
    model = make_model()
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = make_data()
    target = torch.randint(0, 10, (8,))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return model, opt, losses, data


@pytest.mark.parametrize("model_name,optimizer",
                         [("cnn", "sgd"), ("cnn", "adam"), ("transformer", "adam"), ("lstm", "sgd")])
def test_training_under_a_large_budget_is_bitwise_identical(model_name, optimizer):
    reference = oracle.capture(*train(optimizer=optimizer, model_name=model_name))
    budget = 256 * MiB
    with remat.enable(budget=budget):
        assert remat.is_enabled()
        under_remat = train(optimizer=optimizer, model_name=model_name)
        s = remat.stats()
    assert not remat.is_enabled()
    oracle.assert_identical(reference, oracle.capture(*under_remat), f"{model_name}/{optimizer} under remat")
    assert 0 < s["peak_allocated_bytes"] <= budget
    assert s["budget"] == budget
    assert s["allocations"] > 0 and s["failed_allocations"] == 0
    # Forward and backward ops of the training loop went through the hook; dropout and randn are random.
    assert s["ops_recorded"] > 50
    assert s["random_ops_recorded"] >= 3


def test_peak_is_real_and_stats_survive_disable():
    with remat.enable(budget="64MiB"):
        remat.reset_peak()
        before = remat.stats()["allocated_bytes"]
        x = torch.empty(MiB // 4)  # 1 MiB
        during = remat.stats()
        del x
        after = remat.stats()
    assert during["allocated_bytes"] == before + MiB
    assert during["peak_allocated_bytes"] >= before + MiB
    assert after["allocated_bytes"] == before
    final = remat.stats()
    assert final["enabled"] == 0
    assert final["budget"] == 64 * MiB
    assert final["peak_allocated_bytes"] == after["peak_allocated_bytes"]


def test_too_small_budget_raises_out_of_memory_naming_the_request():
    with remat.enable(budget=MiB):
        with pytest.raises(torch.OutOfMemoryError, match=r"tried to allocate 4194304 bytes.*budget 1048576"):
            torch.empty(MiB)  # 4 MiB of float32
        assert remat.stats()["failed_allocations"] == 1
    # A model that needs more than the budget fails the same way, and user code can catch it.
    budget = 128 * 1024
    with remat.enable(budget=budget):
        with pytest.raises(torch.OutOfMemoryError, match=r"tried to allocate \d+ bytes .*budget 131072"):
            train(steps=1)
        assert remat.stats()["failed_allocations"] >= 1
        assert remat.stats()["peak_allocated_bytes"] <= budget
    # The default allocator is back: the same request succeeds.
    assert torch.empty(MiB).numel() == MiB


def test_enable_disable_restores_the_allocator_and_tensors_cross_it():
    before = torch.arange(1000, dtype=torch.float32)
    remat.enable(budget=32 * MiB)  # the global switch
    allocations = remat.stats()["allocations"]
    during = torch.arange(1000, dtype=torch.float32) * 2
    assert remat.stats()["allocations"] > allocations
    mixed = before + during  # reads tensors from both allocators
    remat.disable()
    allocations = remat.stats()["allocations"]
    after = torch.arange(1000, dtype=torch.float32) * 3
    assert remat.stats()["allocations"] == allocations, "allocated from the arena after disable()"
    assert torch.equal(mixed + after, torch.arange(1000, dtype=torch.float32) * 6)
    during.resize_(100_000)  # a storage made under the arena grows through the restored allocator
    during.fill_(1)
    assert during.sum().item() == 100_000
    del before, during, mixed, after


def test_switch_misuse_is_a_clear_error():
    with pytest.raises(RuntimeError, match="not enabled"):
        remat.disable()
    with remat.enable(budget=MiB):
        with pytest.raises(RuntimeError, match="already enabled"):
            remat.enable(budget=MiB)
    with pytest.raises(RuntimeError, match="no CPU arena is installed"):
        remat.reset_peak()


def test_parse_size_is_the_runtimes_parser():
    assert remat.parse_size(4096) == 4096
    assert remat.parse_size("4096") == 4096
    assert remat.parse_size("64MiB") == 64 * MiB
    assert remat.parse_size("1.5 GB") == 1_500_000_000
    assert remat.parse_size("2gib") == 2 << 30
    assert remat.parse_size("2G") == 2 << 30
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert abs(remat.parse_size("0.5") - physical // 2) <= 1, "a fraction is of the machine's memory on CPU"
    for bad in ("", "12 parsecs", "-1", "0", "0.5B", "1.5", 0, -5, 0.5, True, None):
        with pytest.raises(ValueError):
            remat.parse_size(bad)


def test_version_check_names_both_versions():
    remat._check_torch_version("2.14", "2.14.1+cu130")
    with pytest.raises(ImportError, match=r"built against torch 2\.13, but torch 2\.14\.1 is running"):
        remat._check_torch_version("2.13", "2.14.1")


def run_python(code, **env):
    full_env = dict(os.environ)
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                          cwd=str(Path(remat.__file__).resolve().parents[1]), timeout=120)


def test_missing_library_is_a_clear_import_error():
    result = run_python("import remat", REMAT_LIBRARY="/nonexistent/libremat_torch.so")
    assert result.returncode != 0
    assert "REMAT_LIBRARY='/nonexistent/libremat_torch.so' does not name a file" in result.stderr


def test_remat_budget_enables_at_import_and_a_bad_one_fails():
    code = "import remat, torch; s = remat.stats(); print(remat.is_enabled(), s['budget'])"
    result = run_python(code, REMAT_BUDGET="48MiB")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", str(48 * MiB)]
    result = run_python("import remat", REMAT_BUDGET="lots")
    assert result.returncode != 0
    assert "REMAT_BUDGET='lots'" in result.stderr


def test_remat_trace_records_until_exit(tmp_path):
    trace = tmp_path / "env.jsonl"
    code = "import remat, torch; x = torch.ones(4, requires_grad=True); (x * 2).sum().backward()"
    result = run_python(code, REMAT_BUDGET="16MiB", REMAT_TRACE=str(trace))
    assert result.returncode == 0, result.stderr
    text = trace.read_text()
    assert '"NAME":"aten::mul.Tensor"' in text and text.endswith("\n"), "the trace was not closed at exit"


FULL_DISK_ERROR = "writing the trace /dev/full failed (No space left on device); the trace is incomplete"


def test_a_trace_on_a_full_disk_stops_the_run_within_a_step_naming_the_cause():
    # /dev/full takes every open and fails every write with ENOSPC, as a full disk does.
    with remat.enable(budget="256MiB"):
        remat.record("/dev/full")
        with pytest.raises(RuntimeError, match=re.escape(FULL_DISK_ERROR)):
            train(steps=20)  # the optimizer's step calls mark_step, which reports the lost lines
        with pytest.raises(RuntimeError, match=re.escape(FULL_DISK_ERROR)):
            remat.stats()
        with pytest.raises(RuntimeError, match=re.escape(FULL_DISK_ERROR)):
            remat.stop_recording()
        assert remat.stats()["enabled"] == 1  # stopped: the error was the recording's, not the session's


def test_remat_trace_on_a_full_disk_says_so_at_disable_and_at_exit():
    with remat.enable(budget="256MiB"):
        remat.record("/dev/full")
        x = torch.ones(64, 64)
        for _ in range(200):  # no stats() or optimizer step: the error waits for the end of the recording
            x = torch.tanh(x)
        with pytest.raises(RuntimeError, match=re.escape(FULL_DISK_ERROR)):
            remat.disable()
    code = "import remat, torch; x = torch.ones(64, 64)\nfor _ in range(200): x = torch.tanh(x)"
    result = run_python(code, REMAT_BUDGET="16MiB", REMAT_TRACE="/dev/full")
    assert FULL_DISK_ERROR in result.stderr, result.stderr


def test_distributed_data_parallel_two_processes_bitwise_identical(tmp_path):
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    worker = Path(__file__).with_name("ddp_worker.py")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(remat.__file__).resolve().parents[1]),
                                         env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    ranks = [subprocess.Popen([sys.executable, str(worker), str(rank), "2", str(port), str(tmp_path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    for rank, process in enumerate(ranks):
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, f"rank {rank} failed:\n{err}"
    results = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    for rank, result in enumerate(results):
        reference, under_remat = (oracle.Snapshot(**result[run]) for run in ("reference", "remat"))
        assert reference.parameters and reference.losses
        oracle.assert_identical(reference, under_remat, f"rank {rank} under remat")
        stats = result["stats"]
        assert 0 < stats["peak_allocated_bytes"] <= stats["budget"]
        assert stats["evictions"] > 0 and stats["rematerializations"] > 0, stats  # the budget binds
    # DDP kept the replicas' parameters in sync under remat too, byte for byte. (Not buffers: DDP broadcasts rank
    # 0's at each forward, which then updates them with the rank's own batch; each rank's buffers are checked against
    # its run without remat above.)
    ours, theirs = (oracle.Snapshot(**result["remat"]).parameters for result in results)
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert oracle.same_bytes(ours[key], theirs[key]), f"parameter {key} differs between the ranks"


def test_recorded_trace_replays_in_remat_sim(tmp_path):
    trace = tmp_path / "small_net.jsonl"
    with remat.enable(budget="256MiB"):
        with remat.record(trace) as recording:
            train(steps=1)
        with pytest.raises(RuntimeError, match="no trace is being recorded"):
            remat.stop_recording()
    assert recording.ops > 50
    lines = trace.read_text().splitlines()
    assert lines[0] == '{"INSTRUCTION":"ANNOTATE","ANNOTATION":"START"}'
    text = trace.read_text()
    # The hook records the ops autograd sees: conv2d as aten::convolution (its decomposition).
    for needle in ('"NAME":"aten::convolution"', '"INSTRUCTION":"MUTATE"', '"INSTRUCTION":"RELEASE"',
                   '"INSTRUCTION":"CONSTANT"', '"NAME":"aten::convolution_backward"'):
        assert needle in text, needle
    remat_sim = Path(os.environ["REMAT_LIBRARY"]).resolve().parents[1] / "tools" / "remat-sim"
    assert remat_sim.is_file(), f"{remat_sim} not built"
    result = subprocess.run([str(remat_sim), str(trace), "--ratios", "1.0,0.5", "--policies", "dtr-eq,lru",
                             "--jobs", "1"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "small_net" in result.stdout


def _fidelity_steps(policy, budget, trace=None):
    """An MLP (6 x 128, batch 2048, SGD) built before enable, as most programs do (its parameters are constants
    outside the arena), and batches made in each step; one step, then two steps recorded to `trace`. Returns the
    engine's evictions and rematerializations over the recorded steps, the peak of all three and the parameters'
    bytes."""
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(128, 128), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    remat.enable(budget, policy=policy, costs="estimated")
    try:
        def step():
            x, y = torch.randn(2048, 128), torch.randint(0, 10, (2048,))
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()

        step()
        before = remat.stats()
        if trace is None:
            step()
            step()
        else:
            with remat.record(trace):
                step()
                step()
        after = remat.stats()
    finally:
        remat.disable()
    return (after["evictions"] - before["evictions"], after["rematerializations"] - before["rematerializations"],
            after["peak_allocated_bytes"], sum(p.nbytes for p in model.parameters()))


@pytest.mark.parametrize("policy", ["dtr-eq", "msps", "lru"])
def test_a_recorded_run_replays_in_remat_sim_with_the_engines_choices(tmp_path, policy):
    # remat-sim runs the product's engine configuration: replaying a recording at the same budget and policy with
    # the same (estimated) costs makes the engine's choices again. The parameters are constants outside the arena: the
    # trace gives them 0 bytes, so the run's budget is the replay's (they counted their bytes before, and a replay at
    # the run's budget ran out or chose otherwise: resnet50 at 0.5). Counter mode: the arena's layout when
    # the recording began is not in the trace, so arena mode places blocks differently (see README, remat-sim).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _, _, peak, _ = _fidelity_steps(policy, "1GiB")
        budget = int(peak * 0.7)
        trace = tmp_path / "mlp.jsonl"
        evictions, remats, _, _ = _fidelity_steps(policy, budget, trace)
    finally:
        torch.set_num_threads(threads)
    assert evictions > 5, "the budget must bind"
    text = trace.read_text()
    for needle in ('"INSTRUCTION":"PIN"', '"ANNOTATION":"BACKWARD"', '"ANNOTATION":"FORWARD"'):
        assert needle in text, needle
    remat_sim = Path(os.environ["REMAT_LIBRARY"]).resolve().parents[1] / "tools" / "remat-sim"
    out = tmp_path / "sim.json"
    result = subprocess.run([str(remat_sim), str(trace), "--budgets", str(budget), "--policies",
                             policy, "--mode", "counter", "--overhead-limit", "0", "--jobs", "1", "--out", str(out)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    row = json.loads(out.read_text())[0]
    assert row["result"] == "pass", row
    # Measured equal: dtr-eq 10 and 14, msps 24 and 26, lru 18 and 14.
    assert (row["evictions"], row["rematerializations"]) == (evictions, remats)


def test_recording_needs_remat_enabled(tmp_path):
    with pytest.raises(RuntimeError, match="enable remat before recording"):
        remat.record(tmp_path / "t.jsonl")
