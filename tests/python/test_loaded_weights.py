"""Weights loaded from a checkpoint without a copy: torch.load(mmap=True), safetensors' load_file and Hugging Face's
from_pretrained give each tensor a slice of one mapped file (UntypedStorage.__getitem__), whose bytes are the file's,
not memory another owner may rewrite between ops. Ops that read such weights are replayed as any other
(cpu_allocator.h, LearnStorageSliceDeleter); before, every op reading a loaded weight had its outputs pinned, so a
model fine-tuned from a checkpoint recomputed almost nothing (a GPT-2 forward pinned 26 of its 103 ops' outputs).
"""
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import oracle
import remat
from ecosystem import harness
from ecosystem.storage_and_generation import PROGRAMS


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))


# Each loader returns (the model loaded from a checkpoint, the same model as built, the loss of a model).
def _mlp_loss(model):
    torch.manual_seed(1)
    return F.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 10, (32,)))


def _torch_load_mmap(where):
    m = _mlp()
    torch.save(m.state_dict(), os.path.join(where, "w.pt"))
    m.load_state_dict(torch.load(os.path.join(where, "w.pt"), mmap=True, weights_only=True), assign=True)
    return m, _mlp(), _mlp_loss


def _safetensors(where):
    from safetensors.torch import load_file, save_file
    m = _mlp()
    save_file(m.state_dict(), os.path.join(where, "w.safetensors"))
    m.load_state_dict(load_file(os.path.join(where, "w.safetensors")), assign=True)
    return m, _mlp(), _mlp_loss


def _from_pretrained(where):
    import transformers as tf
    tf.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64)
    built = tf.GPT2LMHeadModel(cfg)
    built.save_pretrained(where)

    def loss_of(model):
        ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))
        return model(input_ids=ids, labels=ids).loss
    return tf.GPT2LMHeadModel.from_pretrained(where).train(), built.train(), loss_of


@pytest.mark.parametrize("load", [_torch_load_mmap, _safetensors, _from_pretrained],
                         ids=["torch_load_mmap", "safetensors", "from_pretrained"])
def test_ops_reading_loaded_weights_are_replayable(load, tmp_path):
    """As many outputs pinned (not replayable) as with the same model built in memory."""
    loaded, built, loss_of = load(str(tmp_path))
    pinned = []
    for model in (loaded, built):
        with remat.enable(1 << 30, costs="estimated"):
            loss_of(model).backward()
            stats = remat.stats()
        assert stats["tracked_ops"] > 20
        pinned.append(stats["pinned_outputs"])
    assert pinned[0] == pinned[1], f"outputs pinned: {pinned[0]} loaded, {pinned[1]} built"


@pytest.mark.parametrize("name", ["mmap_loaded_weights", "safetensors_loaded_weights"])
def test_a_model_on_loaded_weights_trains_identically_and_recomputes(name):
    build, step = PROGRAMS[name]
    fractions = (0.9, 0.8, 0.7)  # a plain model on these budgets fits (probe)
    trained, recomputed = harness.train_under_budgets(build, step, fractions, name)
    assert trained == list(fractions), f"ran out of memory at {sorted(set(fractions) - set(trained))}"
    assert recomputed > 0, f"no budget made remat recompute anything (trained at {trained}): the test shows nothing"


def test_a_slice_of_a_tensor_remat_manages_stays_correct_under_pressure():
    """A slice of an activation's storage (its bytes are in remat's arena): remat must not evict or move the bytes
    under the slice while the slice is alive."""
    torch.manual_seed(0)
    with remat.enable(4 << 20, costs="estimated"):
        x = torch.randn(256, 1024).tanh()  # 1 MiB, recomputable
        view = torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage()[0:4096]).view(torch.float32)
        expected = x[0, :1024].clone()
        keep = [torch.randn(256, 1024).exp() for _ in range(6)]  # 6 MiB of pressure
        got = view.clone()
        del keep
    assert oracle.same_bytes(expected, got)
