"""Training under remat with the engine behind it (issue 6): resnet18, densenet121, inception_v3 (aux logits on), a
GPT-2-style transformer with dropout and an LSTM train 3 steps with SGD (momentum) and Adam under budgets of 0.8, 0.5
and 0.3 of their unconstrained peak. Every cell is checked by the byte oracle (oracle.py): losses, gradients,
parameters, buffers, optimizer state and the model's eval-mode outputs after training are bytewise those of a run
without remat; the arena's peak stays within the budget, and below 0.8 storages are evicted and rematerialized.

Most cells train by evicting and recomputing alone (offload off, remat's default). The others are listed below:
  INFEASIBLE: remat.bound.RequiredBytes, measured in the same test, is above the budget (gradients and optimizer
    state alone fill it), so no drop-and-recompute runtime could train there. The test checks the bound, that the
    drop-only run ends with torch.OutOfMemoryError (remat left off and usable), then trains with paging to host
    memory as well (offload "auto").
  GAP: the bound allows the budget but remat's heuristics ran out when last measured. The drop-only run is tried
    like any cell's: if it trains, the oracle checks it and the cell passes (the gap closed: a warning says to take
    it off the list). If it ends with torch.OutOfMemoryError, that is a known gap, never a failure: printed
    ("KNOWN GAP: ..."), counted in KNOWN_GAPS, given as a pytest warning and summed up when the module ends; the cell
    then trains with offload "auto" and the oracle checks that. Any other exception fails the cell.

The peak is measured under remat with a budget that never binds. Also the Python API over the engine:
remat.policies(), policy= and REMAT_POLICY, the engine's stats. Inputs are chosen so that the whole matrix runs in
minutes on 2 cores, and so that no single kernel needs more than 0.3 of the peak at once (at 16 x 128 px, resnet18's
stem batch norm backward allocates 64 MiB inside one call, more than 0.3 of that run's 185 MiB SGD peak: no runtime
could train it there, whatever it drops or pages).

    python tests/python/test_remat_training.py [MODEL ...]   # the matrix as a table (REMAT_BUILD_DIR as for pytest)
"""

import contextlib
import functools
import json
import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

if __name__ == "__main__":  # run as a script: find the package and the library as under pytest
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import conftest  # noqa: F401

import oracle
import remat
from remat.bound import RequiredBytes

MiB = 1 << 20
HUGE = 4 << 30


class GPT(torch.nn.Module):
    """A GPT-2-style decoder: token and position embeddings, pre-norm blocks with causal self-attention and a GELU
    MLP, dropout on embeddings, attention weights and residual branches, tied output projection."""

    def __init__(self, vocab=64, width=32, heads=4, layers=3, context=64, dropout=0.1):
        super().__init__()
        self.heads = heads
        self.tokens = torch.nn.Embedding(vocab, width)
        self.positions = torch.nn.Embedding(context, width)
        self.drop = torch.nn.Dropout(dropout)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(torch.nn.ModuleDict(dict(
                ln1=torch.nn.LayerNorm(width), qkv=torch.nn.Linear(width, 3 * width), proj=torch.nn.Linear(width, width),
                ln2=torch.nn.LayerNorm(width), fc=torch.nn.Linear(width, 4 * width), out=torch.nn.Linear(4 * width, width),
                attn_drop=torch.nn.Dropout(dropout), resid_drop=torch.nn.Dropout(dropout))))
        self.ln = torch.nn.LayerNorm(width)
        self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)))

    def forward(self, idx):
        b, t = idx.shape
        x = self.drop(self.tokens(idx) + self.positions(torch.arange(t)))
        for blk in self.blocks:
            h = blk["ln1"](x)
            q, k, v = blk["qkv"](h).split(x.shape[-1], dim=2)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1)
            y = (blk["attn_drop"](att) @ v).transpose(1, 2).reshape(b, t, -1)
            x = x + blk["resid_drop"](blk["proj"](y))
            x = x + blk["resid_drop"](blk["out"](torch.nn.functional.gelu(blk["fc"](blk["ln2"](x)))))
        return self.ln(x) @ self.tokens.weight.t()


# Images per model: (batch, side). Small enough for CI and for every kernel to fit in 0.3 of the peak (see above).
IMAGES = {"resnet18": (8, 128), "densenet121": (8, 128), "inception_v3": (4, 299)}


def build(name):
    """(model, inputs, targets, loss) with fixed seeds."""
    torch.manual_seed(0)
    if name in ("gpt", "lstm"):
        model = GPT() if name == "gpt" else LSTMModel()
        tokens = torch.randint(0, 64, (8, 65))

        def loss(logits, target):
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        return model, tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(), loss
    import torchvision
    batch, side = IMAGES[name]
    images = torch.randn(batch, 3, side, side)
    labels = torch.randint(0, 10, (batch,))
    if name == "inception_v3":
        # Aux logits on (299-pixel inputs are the smallest its aux head takes).
        model = torchvision.models.inception_v3(num_classes=10, aux_logits=True, init_weights=False)

        def loss(out, target):
            return (torch.nn.functional.cross_entropy(out.logits, target)
                    + 0.4 * torch.nn.functional.cross_entropy(out.aux_logits, target))
        return model, images, labels, loss
    model = getattr(torchvision.models, name)(num_classes=10)
    return model, images, labels, torch.nn.functional.cross_entropy


class LSTMModel(torch.nn.Module):
    """An LSTM language model, six layers with dropout between them (aten::lstm decomposes into mkldnn_rnn_layer
    per layer on CPU: one op holds a whole layer's sequence, so a deeper model is what makes low budgets possible)."""

    def __init__(self, vocab=64, width=32, hidden=64, layers=6):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, width)
        self.lstm = torch.nn.LSTM(width, hidden, num_layers=layers, dropout=0.1, batch_first=True)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, tokens):
        return self.head(self.lstm(self.embedding(tokens))[0])


def make_optimizer(optimizer, model):
    if optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def train(name, optimizer, budget=None, policy=None, steps=3, costs="estimated", offload=None):
    """Trains `steps` steps; with a budget, under remat (`offload` None: $REMAT_OFFLOAD, else off). Returns
    (snapshot, stats): the oracle's snapshot (losses, gradients, parameters, buffers, optimizer state, and the
    eval-mode outputs on the training inputs), taken once remat is off, and remat's stats (None without a budget)."""
    model, inputs, targets, loss_fn = build(name)
    opt = make_optimizer(optimizer, model)
    torch.manual_seed(1)  # dropout masks
    stats = None
    if budget is not None:
        paging = {} if offload is None else {"offload": offload}  # none given: remat.enable's default, as for users
        remat.enable(budget, policy=policy, costs=costs, **paging)
    try:
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            out = model(inputs)
            loss = loss_fn(out, targets)
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
            del out, loss
    finally:
        if budget is not None:
            remat.disable()
            stats = remat.stats()  # the last arena's and engine's numbers
    # Taken once remat is off, so that the copies and the eval forward pass do not count in the peak.
    return oracle.capture(model, opt, losses, eval_inputs=inputs), stats


@functools.lru_cache(maxsize=None)
def reference_and_peak(name, optimizer):
    """The run without remat and the peak under a budget that never binds (checked to be identical and to evict
    nothing), shared by the tests of one case. Kept for every case (about 1 GiB of snapshots, outside any arena):
    test_remat_offload.py runs first and takes each case in turn, and this module's matrix then finds them all."""
    reference = train(name, optimizer)[0]
    unconstrained, stats = train(name, optimizer, budget=HUGE)
    oracle.assert_identical(reference, unconstrained, f"{name}/{optimizer} unconstrained")
    assert stats["evictions"] == 0
    return reference, stats["peak_allocated_bytes"]


def required_bytes(name, optimizer, steps=3):
    """remat.bound.RequiredBytes of the same training run, under a budget that never binds (so that kernels' own
    buffers count: the LSTM's backward workspace)."""
    model, inputs, targets, loss_fn = build(name)
    opt = make_optimizer(optimizer, model)
    torch.manual_seed(1)
    with remat.enable(HUGE, costs="estimated"), RequiredBytes(model, opt, outside=[inputs, targets]) as bound:
        for _ in range(steps):
            opt.zero_grad()
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            opt.step()
            del loss
    return bound


BUDGETS = (0.8, 0.5, 0.3)
MODELS = ("gpt", "lstm", "resnet18", "densenet121", "inception_v3")
CASES = [(name, optimizer) for name in MODELS for optimizer in ("sgd", "adam")]

# The budgets (fractions of the unconstrained peak) at which evicting and recomputing alone does not train, by why;
# these cells train with paging (offload "auto"). Runs use estimated op costs (op_cost.h), so eviction choices, and
# whether a budget fits, are the same in every run. Measured with `SWEEP_MODES=off,auto python
# tests/python/test_remat_training.py`.
#   INFEASIBLE: RequiredBytes is above the budget: at some op, the optimizer's state (and during a step every
#     gradient) plus what the op reads and writes is more than the budget, for every drop-and-recompute policy.
#   GAP: RequiredBytes is within the budget, but drop-only remat ran out when measured: the DTR heuristics' replay
#     chains (each frame holding what it gathered) and the arena's fragmentation take more than the budget leaves.
#     Known gaps, not expected failures: the test tries drop-only first and reports the gap only if it still runs out.
INFEASIBLE = {
    ("resnet18", "sgd"): (0.5, 0.3),       # RequiredBytes 0.66: momentum, the gradients made before the last one
    ("resnet18", "adam"): (0.8, 0.5, 0.3),  # 0.83: the gradients and both moments during the step
    ("inception_v3", "sgd"): (0.3,),       # 0.37: momentum, the gradients made before the last one
    ("inception_v3", "adam"): (0.3,),      # 0.50
    # 0.32: both moments, and the LSTM layer backward made last (2.3 MB read, 1.1 MB held) beside the gradients the
    # five others made (0.6 MB); listed as a gap while the bound did not count those (0.296)
    ("lstm", "adam"): (0.3,),
}
GAP = {
    ("lstm", "sgd"): (0.3,),          # RequiredBytes 0.28 (0.05 of it mkldnn_rnn_layer_backward's workspace)
    ("densenet121", "adam"): (0.3,),  # 0.24
    ("inception_v3", "adam"): (0.5,),  # 0.497: within the budget by less than 1%
}
# gpt/sgd and gpt/adam at 0.3 (RequiredBytes 0.19 and 0.20) were gaps on the edge (replay chains 16 to 31 deep, the
# largest free block half a request); they train drop-only since the engine recycles dead ids (other slots, other
# placements and ties): no longer listed, so that losing them again fails.


class KnownGap(UserWarning):
    """A GAP cell whose drop-only run still ends in torch.OutOfMemoryError (or a listed gap that closed)."""


KNOWN_GAPS = []   # one "KNOWN GAP: ..." line per GAP cell met this session whose drop-only run ran out
CLOSED_GAPS = []  # GAP cells that trained drop-only: the list above is out of date
CELLS = []        # labels of the matrix cells checked


@pytest.fixture(scope="module", autouse=True)
def _known_gaps_summary(request):
    """When the module ends: how many matrix cells ran and how many known gaps they met, on the terminal (not
    captured) and as a warning."""
    yield
    if not CELLS:
        return
    lines = [f"remat training matrix: {len(CELLS)} cells checked, {len(KNOWN_GAPS)} known gaps met "
             f"(drop-only ran out, trained with offload auto)", *KNOWN_GAPS]
    lines += [f"GAP CLOSED: {label} trains drop-only now; take it off GAP" for label in CLOSED_GAPS]
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print("\n" + "\n".join(lines), flush=True)
    if KNOWN_GAPS or CLOSED_GAPS:
        warnings.warn(lines[0], KnownGap)


def note_known_gap(label, error):
    """Reports a GAP cell whose drop-only run ran out of memory: printed, counted and warned, never a failure."""
    first = (str(error).splitlines() or [""])[0]
    line = f"KNOWN GAP: {label}: {first}"
    KNOWN_GAPS.append(line)
    print(line, flush=True)
    warnings.warn(line, KnownGap)


def expect_out_of_memory(name, optimizer, budget, offload=None):
    with pytest.raises(torch.OutOfMemoryError, match=r"tried to allocate \d+ bytes"):
        train(name, optimizer, budget=budget, offload=offload)
    assert not remat.is_enabled()


@pytest.mark.parametrize("name,optimizer", CASES)
def test_training_under_budgets_is_bitwise_identical(name, optimizer):
    reference, peak = reference_and_peak(name, optimizer)
    bound = required_bytes(name, optimizer).required_bytes
    assert 0 < bound <= peak
    for fraction in BUDGETS:
        budget = int(peak * fraction)
        label = f"{name}/{optimizer} at {fraction}"
        if fraction in INFEASIBLE.get((name, optimizer), ()):
            # Proven by the bound, not a weakness: no drop-and-recompute runtime trains here.
            assert bound > budget, f"{label}: listed as infeasible, but RequiredBytes is {bound} <= {budget}"
            expect_out_of_memory(name, optimizer, budget, offload="off")
            label = f"{label} with offload auto"
            got = train(name, optimizer, budget=budget, offload="auto")
        elif fraction in GAP.get((name, optimizer), ()):
            assert bound <= budget, f"{label}: listed as a gap, but RequiredBytes is {bound} > {budget}"
            try:
                got = train(name, optimizer, budget=budget, offload="off")
            except torch.OutOfMemoryError as error:  # a known gap: reported, then trained with paging
                assert not remat.is_enabled()
                note_known_gap(label, error)
                label = f"{label} with offload auto"
                got = train(name, optimizer, budget=budget, offload="auto")
            else:
                CLOSED_GAPS.append(label)
                warnings.warn(f"GAP CLOSED: {label} trains drop-only now; take it off GAP", KnownGap)
        else:
            got = train(name, optimizer, budget=budget, offload="off")
            # a lower bound above a budget that trained dropping alone would be wrong
            assert bound <= budget, f"{label} trained drop-only, below RequiredBytes {bound} ({bound / peak:.3f})"
        snapshot, stats = got
        CELLS.append(label)
        oracle.assert_identical(reference, snapshot, label)
        assert stats["peak_allocated_bytes"] <= budget, label
        assert stats["failed_allocations"] == (stats["retried_ops"] + stats["retried_replays"]
                                           + stats["retried_composites"])  # every one recovered
        if fraction < 0.8:
            assert stats["evictions"] > 0 and stats["rematerializations"] > 0, (label, stats)


def test_parameters_inputs_foreign_memory_and_optimizer_state_are_never_evicted():
    """Under a budget at which remat evicts and recomputes, storages remat must never drop keep their memory at every
    module boundary of the forward and backward passes: the parameters and inputs (made before enable, at the same
    address throughout), a tensor over numpy memory and one over a Python buffer (torch.frombuffer, from_blob's
    path) made under remat and read by the forward pass, and the optimizer's state once a step made it (it may move
    within the arena, never lose its bytes). The oracle finds the results bytewise those of the same program without
    remat."""
    import numpy as np
    name, optimizer = "gpt", "adam"
    peak = reference_and_peak(name, optimizer)[1]
    array = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    buffer = bytearray(np.arange(64, dtype=np.float32).tobytes())

    def run(budget):
        model, inputs, targets, loss_fn = build(name)
        opt = make_optimizer(optimizer, model)
        torch.manual_seed(1)
        fixed = {id(t): t.untyped_storage().data_ptr() for t in [*model.parameters(), inputs, targets]}
        watched = {"parameter or input": [*model.parameters(), inputs, targets]}
        checks, losses = [], []

        def check(*_):
            for kind, tensors in watched.items():
                for t in tensors:
                    try:
                        address = t.untyped_storage().data_ptr()
                    except RuntimeError:  # remat refuses the pointer of an evicted storage outside an op
                        address = 0
                    assert address != 0, f"a {kind} was evicted"
                    assert fixed.get(id(t), address) == address, f"a {kind} moved"
            checks.append(1)

        hooks = [m.register_forward_hook(check) for m in model.modules()]
        hooks += [m.register_full_backward_hook(check) for m in model.modules() if m is not model]
        warnings.filterwarnings("ignore", "Full backward hook is firing", UserWarning)  # the embedding's input
        if budget is not None:
            remat.enable(budget, costs="estimated", offload="off")
        try:
            from_numpy = torch.from_numpy(array)
            from_buffer = torch.frombuffer(buffer, dtype=torch.float32)
            fixed.update({id(from_numpy): array.ctypes.data, id(from_buffer): from_buffer.data_ptr()})
            watched["tensor over foreign memory"] = [from_numpy, from_buffer]
            for _ in range(3):
                opt.zero_grad()
                loss = loss_fn(model(inputs) + from_numpy + from_buffer * 1e-3, targets)
                loss.backward()
                opt.step()
                watched["optimizer state"] = [t for state in opt.state.values() for t in state.values()
                                              if torch.is_tensor(t) and t.numel() > 1]
                check()
                losses.append(loss.detach().clone())
                del loss
        finally:
            for h in hooks:
                h.remove()
            stats = None
            if budget is not None:
                remat.disable()
                stats = remat.stats()
        return oracle.capture(model, opt, losses, eval_inputs=inputs), stats, len(checks)

    reference = run(None)
    got, stats, checks = run(int(peak * 0.5))
    assert stats["evictions"] > 0 and stats["rematerializations"] > 0, stats
    assert checks > 100
    oracle.assert_identical(reference[0], got, f"{name}/{optimizer} at 0.5 with foreign memory")
    assert np.array_equal(array, np.random.default_rng(0).standard_normal(64).astype(np.float32))
    assert bytes(buffer) == np.arange(64, dtype=np.float32).tobytes()


def test_the_optimizers_state_is_pinned_once_after_its_first_step():
    """Momentum buffers are rewritten in place every step: remat pins them after the step that makes them (a global
    optimizer hook), so recomputing one never replays earlier steps; later steps pin nothing new."""
    pinned = []
    for steps in (1, 3):
        model, inputs, targets, loss_fn = build("gpt")
        opt = make_optimizer("sgd", model)
        with remat.enable(HUGE, costs="estimated"):
            for _ in range(steps):
                opt.zero_grad()
                loss_fn(model(inputs), targets).backward()
                opt.step()
        pinned.append(remat.stats()["pinned_state"])
    assert 0 < pinned[0] <= len(list(model.parameters()))
    assert pinned[1] == pinned[0]


def test_too_small_a_budget_raises_out_of_memory_naming_the_request_and_what_holds_the_memory():
    with pytest.raises(torch.OutOfMemoryError) as raised:
        train("gpt", "adam", budget=256 * 1024)
    message = str(raised.value)
    assert "tried to allocate" in message and "budget 262144 bytes" in message, message
    assert "Raise the budget given to remat.enable()" in message, message
    # The engine's report: what the running ops lock, what is constant or pinned, the op that ran out.
    assert re.search(r"locked by the running ops \d+, constant \d+ of which \d+ in the arena, pinned results \d+, "
                     r"in blocks remat does not know \d+\), "
                     r"running 'aten::[\w.]+'", message), message
    assert not remat.is_enabled()
    train("gpt", "adam", budget=HUGE)  # and remat works again


def test_policies_come_from_the_engines_registry_and_an_unknown_one_is_a_clear_error():
    names = remat.policies()
    for name in ("dtr", "dtr-eq", "lru", "coop"):
        assert name in names
    with pytest.raises(ValueError, match=r"unknown policy 'belady'; registered policies: .*dtr-eq"):
        remat.enable(budget=16 * MiB, policy="belady")
    assert not remat.is_enabled()
    with remat.enable(budget=16 * MiB, policy="lru") as enabled:
        assert enabled.policy == "lru"
        (torch.ones(64) * 2).sum()
    stats = remat.stats()
    for key in ("evictions", "rematerializations", "replayed_time_ns", "search_ns", "fragmentation"):
        assert key in stats, key


def test_remat_policy_from_the_environment():
    cwd = str(Path(remat.__file__).resolve().parents[1])
    ok = subprocess.run([sys.executable, "-c", "import remat, torch; print(remat.enable(budget=1 << 20).policy)"],
                        capture_output=True, text=True, cwd=cwd, timeout=120, env={**os.environ, "REMAT_POLICY": "msps"})
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split()[-1] == "msps"
    bad = subprocess.run([sys.executable, "-c", "import remat"], capture_output=True, text=True, cwd=cwd, timeout=120,
                         env={**os.environ, "REMAT_POLICY": "nope"})
    assert bad.returncode != 0
    assert "unknown REMAT_POLICY 'nope'; registered policies:" in bad.stderr


def test_measured_costs_also_train_bitwise_identically():
    """The default cost source (measured op times) gives other eviction choices, the same results."""
    reference = train("gpt", "sgd")[0]
    peak = train("gpt", "sgd", budget=HUGE, costs="measured")[1]["peak_allocated_bytes"]
    got, stats = train("gpt", "sgd", budget=int(peak * 0.8), costs="measured")
    oracle.assert_identical(reference, got, "gpt/sgd at 0.8, measured costs")
    assert stats["evictions"] > 0


def test_estimated_costs_make_the_same_choices_in_every_run():
    peak = train("gpt", "adam", budget=HUGE)[1]["peak_allocated_bytes"]
    first = train("gpt", "adam", budget=int(peak * 0.6))[1]
    second = train("gpt", "adam", budget=int(peak * 0.6))[1]
    for key in ("evictions", "rematerializations", "peak_allocated_bytes", "replayed_time_ns"):
        assert first[key] == second[key], key


def test_unknown_costs_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown costs 'fast'; expected one of measured, estimated"):
        remat.enable(budget=16 * MiB, costs="fast")
    assert not remat.is_enabled()


def simulated_peak(trace, tmp_path):
    """remat-sim's unconstrained peak of a recorded trace (arena mode, dtr-eq), from the build remat loaded."""
    remat_sim = Path(remat.library_path()).resolve().parents[1] / "tools" / "remat-sim"
    out = tmp_path / "rows.json"
    result = subprocess.run([str(remat_sim), str(trace), "--ratios", "1.0", "--policies", "dtr-eq", "--mode", "arena",
                             "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text())[0]["peak_bytes"]


def test_a_trace_recorded_under_the_engine_replays_at_the_measured_peak(tmp_path):
    """remat.record under the engine: storages whose only references are the engine's records are released in the
    trace, so remat-sim's unconstrained peak matches what the arena measured. The parameters, made before enable
    outside the arena, are constants of 0 bytes in the trace, as the budget counts them."""
    model, inputs, targets, loss_fn = build("gpt")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trace = tmp_path / "gpt.jsonl"
    torch.manual_seed(1)
    with remat.enable(HUGE, costs="estimated"):
        with remat.record(trace):
            for _ in range(2):
                opt.zero_grad()
                loss = loss_fn(model(inputs), targets)
                loss.backward()
                opt.step()
                del loss
        measured = remat.stats()["peak_allocated_bytes"]
    simulated = simulated_peak(trace, tmp_path)
    assert simulated <= 1.25 * measured, (simulated, measured)


def test_a_trace_started_mid_run_declares_what_the_engine_holds(tmp_path):
    """remat.record started between steps: last step's gradients and the optimizer's state are in the arena though
    no op touches them before zero_grad (called here after the forward pass, as many loops do). The trace declares
    them at its start, so remat-sim's unconstrained peak counts them as the arena did; before, they were missing
    until the optimizer read them, and the replay's peak came out below what the arena measured."""
    model, inputs, targets, loss_fn = build("gpt")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trace = tmp_path / "mid.jsonl"

    def step():
        loss = loss_fn(model(inputs), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()

    torch.manual_seed(1)
    with remat.enable(HUGE, costs="estimated"):
        step()  # gradients and momentum now live in the arena
        with remat.record(trace):
            step()
        measured = remat.stats()["peak_allocated_bytes"]
    simulated = simulated_peak(trace, tmp_path)
    # 1% below: kernels' own temporaries (made and freed inside one op) are in the arena, not in the trace (0.8%
    # here); without the declaration the replay came out 2.7% below.
    assert 0.99 * measured <= simulated <= 1.25 * measured, (simulated, measured)


def test_records_nothing_can_need_are_pruned_and_results_stay_identical():
    """Every 1024 ops the bridge drops records whose outputs the engine reports dead and forgets storages
    nothing references; training goes on bitwise identical."""
    reference = train("gpt", "sgd", steps=8)[0]
    peak = train("gpt", "sgd", budget=HUGE, steps=8)[1]["peak_allocated_bytes"]
    got, stats = train("gpt", "sgd", budget=int(peak * 0.5), steps=8)
    oracle.assert_identical(reference, got, "gpt/sgd at 0.5 over 8 steps")
    assert stats["pruned_records"] > 0 and stats["pruned_entries"] > 0, stats


def test_a_released_value_a_replay_reads_stays_while_memory_allows():
    """A three-layer MLP with SGD momentum at 0.8 of its peak (RequiredBytes 0.64): a gradient the backward had to
    evict is brought back by replaying one op from the value it was computed from, which autograd has let go of by
    then. That value stays resident until memory is needed (the engine drops such values first under pressure);
    dropped at its release, as before, the replay went back through the whole backward to the loss and ran out."""
    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                                    torch.nn.Tanh(), torch.nn.Linear(256, 8))
        return model, torch.optim.SGD(model.parameters(), 0.01, momentum=0.9, nesterov=True), torch.randn(512, 64)

    def run(budget=None):
        model, opt, x = build()
        losses = []
        with remat.enable(budget, costs="estimated") if budget else contextlib.nullcontext():
            for _ in range(3):
                opt.zero_grad()
                loss = model(x).pow(2).mean()
                loss.backward()
                opt.step()
                losses.append(loss.detach().clone())
        return oracle.capture(model, opt, losses), remat.stats() if budget else None

    reference, _ = run()
    peak = run(HUGE)[1]["peak_allocated_bytes"]
    for fraction in (0.8, 0.7):
        got, stats = run(int(peak * fraction))
        oracle.assert_identical(reference, got, f"MLP with SGD momentum at {fraction}")
        assert stats["evictions"] > 0, stats


def test_a_long_run_keeps_a_bounded_number_of_records():
    """Records and storages the bridge keeps do not grow with the number of steps: gradients the optimizer pinned
    die once set to None (zero_grad), and with them the records that produced them (one per gradient and step
    stayed for good before)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()) for _ in range(4)],
                                torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    first, last = 30, 330
    seen = {}
    with remat.enable(HUGE):
        for step in range(1, last + 1):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if step in (first, last):
                seen[step] = remat.stats()
    # Pruning runs every 1024 ops: what is kept swings by up to that much, but not by a record per gradient and step.
    gradients = len(list(model.parameters()))
    assert (last - first) * gradients > 2 * 1100
    for key in ("kept_records", "tracked_storages"):
        assert seen[last][key] <= seen[first][key] + 1100, (key, seen[first][key], seen[last][key])


def test_the_engines_tables_stay_bounded_over_a_long_run_under_a_binding_budget():
    """2,000 steps of an MLP with Adam at 0.7 of its peak, drop-only (evictions and replays every step): the
    engine's op, tensor and storage slots stop growing after the warm-up (dead records are recycled), its compacted
    tables stay within their compaction bound, and the run is byte-identical to the same run without remat."""
    steps, marks = 2000, range(100, 2001, 100)

    def run(budget, steps=steps):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()) for _ in range(4)],
                                    torch.nn.Linear(64, 1))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = torch.randn(256, 64), torch.randn(256, 1)
        losses, seen = [], {}
        with remat.enable(budget, costs="estimated") if budget else contextlib.nullcontext():
            for step in range(1, steps + 1):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                losses.append(loss.item())  # a tensor per step would hold arena memory for the whole run
                if budget and step in marks:
                    seen[step] = remat.stats()
            peak = remat.stats()["peak_allocated_bytes"] if budget else None
        return oracle.capture(model, opt, [torch.tensor(l) for l in losses], eval_inputs=x), seen, peak

    reference = run(None)[0]
    budget = int(run(HUGE, steps=2)[2] * 0.7)
    got, seen, _ = run(budget)
    oracle.assert_identical(reference, got, "MLP/adam, 2000 steps at 0.7")
    assert seen[steps]["evictions"] > steps and seen[steps]["rematerializations"] > steps
    warm = [seen[step] for step in marks if step <= 300]
    for key in ("engine_op_slots", "engine_tensor_slots", "engine_storage_slots"):
        bound = max(stats[key] for stats in warm)
        assert all(seen[step][key] <= bound for step in marks), (key, [seen[step][key] for step in marks])
    assert seen[steps]["engine_op_slots"] < 2000  # a few steps' worth, not 2000 steps' (about 100 ops each)
    for step in marks:  # rebuilt once twice as large as what they index (and past 4096 entries)
        assert seen[step]["engine_union_find_nodes"] <= 2 * max(4096, 2 * seen[step]["engine_storage_slots"])
        assert seen[step]["engine_op_io_entries"] <= 2 * max(4096, 4 * seen[step]["engine_op_slots"])


def sweep(names, modes=("off",), fractions=BUDGETS):
    """One line per (model, optimizer, offload mode, fraction): PASS (the oracle finds it identical, peak within the
    budget) with evictions, rematerializations, pages and wall time, or FAIL with the first line of the error; and per
    (model, optimizer) the peak and RequiredBytes (drop-only bound, and the largest op: the bound with a tier). Wall
    times, the baseline's too, include the oracle's snapshot (one eval forward pass, without remat)."""
    import time
    for name in names:
        for optimizer in ("sgd", "adam"):
            start = time.perf_counter()
            reference = train(name, optimizer)[0]
            baseline_s = time.perf_counter() - start
            peak = train(name, optimizer, budget=HUGE)[1]["peak_allocated_bytes"]
            bound = required_bytes(name, optimizer)
            print(f"{name} {optimizer}: peak {peak / MiB:.1f} MiB, baseline {baseline_s:.2f} s, RequiredBytes "
                  f"{bound.required_bytes / peak:.2f} of the peak (at {bound.at_op}), largest op "
                  f"{bound.op_bytes / peak:.2f}", flush=True)
            for mode in modes:
                os.environ["REMAT_OFFLOAD"] = mode
                try:
                    for fraction in fractions:
                        budget = int(peak * fraction)
                        start = time.perf_counter()
                        try:
                            got, s = train(name, optimizer, budget=budget)
                            oracle.assert_identical(reference, got, f"{name}/{optimizer}/{mode} at {fraction}")
                            assert s["peak_allocated_bytes"] <= budget
                            print(f"  {mode:6} {fraction}: PASS {time.perf_counter() - start:.2f} s, evictions "
                                  f"{s['evictions']}, remats {s['rematerializations']}, retried "
                                  f"{s['retried_ops'] + s['retried_replays'] + s['retried_composites']}, "
                                  f"compactions {s['compactions']}, "
                                  f"paged out {s['paged_out_bytes'] / MiB:.1f} MiB", flush=True)
                        except (AssertionError, RuntimeError) as error:  # torch.OutOfMemoryError is a RuntimeError
                            first = (str(error).splitlines() or [""])[0]
                            print(f"  {mode:6} {fraction}: FAIL {type(error).__name__}: {first[:160]}", flush=True)
                finally:
                    del os.environ["REMAT_OFFLOAD"]


if __name__ == "__main__":
    modes = tuple(os.environ.get("SWEEP_MODES", "off").split(","))
    sweep(sys.argv[1:] or MODELS, modes)
