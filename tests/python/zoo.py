"""The model zoo: every torchvision classification model, and Hugging Face decoder, encoder and encoder-decoder
families built from small configs, as training cases for test_zoo.py.

torchvision: every model of torchvision.models.list_models(module=torchvision.models), built with num_classes=10 and
random initialisation (weights=None), at batch 2 and the smallest square input each accepts from a floor of 64 px
(64 for most; inception_v3 without aux logits needs 75; maxvit_t's 7 x 7 partitions over a /32 network need 224,
its only size; the ViTs are built for 64 px, 70 px for a 14 px patch, with the builder's image_size), except the
models in EXCLUDED, each with the reason. The floor is the issue's 64 px: most models would take less (the probe
below: 16 px for most, 32 for convnext, densenet, squeezenet and vgg, 64 for alexnet), but there a step is all
parameters, gradients and momentum, with next to no activations left to evict.

Hugging Face (transformers, from config classes: nothing is downloaded): hidden 64, 2 layers, 4 heads, vocabulary
256, sequences of 32 tokens (targets of 16 for encoder-decoders), batch 2, each family's default dropout, eager
attention (and sdpa as well for GPT-2 and Llama), use_cache off, with the head that returns a loss from labels:
causal LM for decoders, masked LM for encoders, seq2seq LM for encoder-decoders.

Every case is built under torch.manual_seed(0) (weights, inputs, labels); the harness seeds again before the first
step (dropout masks). A Case is a model in train mode, the inputs it is called with (a tensor, or a dict of keyword
arguments), and the function from its output to the loss.

    from zoo import CATALOGUE, QUICK, EXCLUDED
    case = CATALOGUE["gpt2"].build()
    loss = case.loss(case.forward())
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Union

import torch

BATCH = 2
NUM_CLASSES = 10
MIN_SIDE = 64            # the floor of the torchvision input sides (most models accept smaller ones too)
VOCAB = 256
SEQ = 32                 # tokens per sequence (encoder inputs)
TARGET_SEQ = 16          # decoder tokens of the encoder-decoders
HIDDEN = 64
LAYERS = 2
HEADS = 4


@dataclass
class Case:
    """One training case: model (train mode), the inputs it is called with, and output -> scalar loss."""
    model: torch.nn.Module
    inputs: Union[torch.Tensor, Dict[str, torch.Tensor]]
    loss: Callable[[Any], torch.Tensor]
    outside: List[torch.Tensor] = field(default_factory=list)  # tensors made before remat is enabled (RequiredBytes)

    def forward(self):
        if isinstance(self.inputs, dict):
            return self.model(**self.inputs)
        return self.model(self.inputs)


@dataclass(frozen=True)
class Entry:
    name: str
    family: str      # "torchvision" or "hf decoder" / "hf encoder" / "hf encoder-decoder"
    input: str       # the training input, e.g. "2 x 3 x 64 x 64"
    build: Callable[[], Case]
    steps: int = 3   # 2 for the slow ones (SLOW below)


# ---------------------------------------------------------------------------------------------------------------
# torchvision
# ---------------------------------------------------------------------------------------------------------------

# Models left out, with why. Measured on this machine (2 cores, 23 GiB; torch 2.14.1 CPU) with
# `python tests/python/zoo.py --probe NAME`: parameters, and one SGD step (momentum) at the zoo's input without remat.
# The unconstrained run that measures a model's peak has a budget of 4 GiB (test_zoo.HUGE); the gradients and the
# momentum alone are 8 bytes per parameter, all in remat's arena.
EXCLUDED: Dict[str, str] = {
    "vit_h_14": "630 M parameters: gradients and SGD momentum alone are 4.7 GiB, above the 4 GiB budget of the "
                "unconstrained run, which raises torch.OutOfMemoryError in the first optimizer step (checked), so "
                "its peak cannot be measured (one SGD step at 2 x 3 x 70 x 70 takes 2.1 s without remat)",
    "regnet_y_128gf": "637 M parameters: gradients and SGD momentum alone are 4.7 GiB, above the 4 GiB budget of the "
                      "unconstrained run, which raises torch.OutOfMemoryError in the first optimizer step (checked), "
                      "so its peak cannot be measured (one SGD step at 2 x 3 x 64 x 64 takes 3-5 s without remat)",
}

# Inputs other than MIN_SIDE: the builder's kwargs, and the side.
SIDES = {
    "inception_v3": 75,   # its stem and Mixed_6a/7a strides need 75 px; the aux head needs 299 (off here)
    "maxvit_t": 224,      # partition_size 7 (fixed by maxvit_t) at every /4../32 stage: 7 * 32 = 224, its only size
    "vit_h_14": 70,       # image_size a multiple of the patch: 5 x 5 patches of 14 px
}
BUILD_KWARGS: Dict[str, Dict[str, Any]] = {
    "inception_v3": dict(aux_logits=False, init_weights=False),
    "googlenet": dict(aux_logits=True, init_weights=True),   # aux heads on (they work at 64 px); loss weighs them 0.3
    "maxvit_t": dict(input_size=(224, 224)),
}
# Two steps instead of three for the slow ones: over 60 M parameters. At these inputs their steps are mostly weight
# gradients and the update (convnext_large 0.8 s, vit_l_16 1.0 s per step without remat on an idle machine), and
# with offload "auto" at 0.5 of the peak they page 1 to 4 GiB per run.
SLOW_PARAMETERS = 60_000_000
SLOW = {"convnext_base", "convnext_large", "efficientnet_b7", "efficientnet_v2_l", "regnet_x_32gf", "regnet_y_16gf",
        "regnet_y_32gf", "resnext101_32x8d", "resnext101_64x4d", "swin_b", "swin_v2_b", "vgg11", "vgg11_bn", "vgg13",
        "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn", "vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32",
        "wide_resnet101_2", "wide_resnet50_2"}


def _torchvision_side(name: str) -> int:
    return SIDES.get(name, MIN_SIDE)


def _torchvision_kwargs(name: str) -> Dict[str, Any]:
    kwargs = dict(BUILD_KWARGS.get(name, {}))
    if name.startswith("vit_"):
        kwargs["image_size"] = _torchvision_side(name)
    return kwargs


def _classification_loss(labels):
    def loss(out):
        if isinstance(out, tuple) and hasattr(out, "_fields"):  # GoogLeNetOutputs(logits, aux_logits2, aux_logits1)
            main, *aux = [o for o in out if o is not None]
            return torch.nn.functional.cross_entropy(main, labels) + 0.3 * sum(
                torch.nn.functional.cross_entropy(a, labels) for a in aux)
        return torch.nn.functional.cross_entropy(out, labels)
    return loss


def build_torchvision(name: str, side: int = 0, batch: int = BATCH) -> Case:
    import torchvision
    side = side or _torchvision_side(name)
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None, num_classes=NUM_CLASSES, **_torchvision_kwargs(name))
    model.train()
    images = torch.randn(batch, 3, side, side)
    labels = torch.randint(0, NUM_CLASSES, (batch,))
    return Case(model, images, _classification_loss(labels), [images, labels])


def torchvision_names() -> List[str]:
    import torchvision
    return list(torchvision.models.list_models(module=torchvision.models))


# ---------------------------------------------------------------------------------------------------------------
# Hugging Face
# ---------------------------------------------------------------------------------------------------------------

def _decoder_config(kind: str):
    import transformers as tf
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  intermediate_size=2 * HIDDEN, max_position_embeddings=2 * SEQ, use_cache=False)
    if kind == "gpt2":
        return tf.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=2 * SEQ,
                             bos_token_id=0, eos_token_id=0, use_cache=False)
    if kind == "llama":
        return tf.LlamaConfig(num_key_value_heads=2, **common)
    if kind == "mistral":
        return tf.MistralConfig(num_key_value_heads=2, sliding_window=SEQ // 2, **common)
    if kind == "qwen2":
        return tf.Qwen2Config(num_key_value_heads=2, **common)
    if kind == "gpt_neox":
        return tf.GPTNeoXConfig(**common)
    if kind == "opt":
        return tf.OPTConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                            ffn_dim=2 * HIDDEN, word_embed_proj_dim=HIDDEN, max_position_embeddings=2 * SEQ,
                            use_cache=False)
    if kind == "phi":
        return tf.PhiConfig(**common)
    if kind == "gemma":
        return tf.GemmaConfig(num_key_value_heads=1, head_dim=HIDDEN // HEADS, **common)
    raise KeyError(kind)


def _encoder_config(kind: str):
    import transformers as tf
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  intermediate_size=2 * HIDDEN, max_position_embeddings=2 * SEQ)
    if kind == "bert":
        return tf.BertConfig(**common)
    if kind == "roberta":
        return tf.RobertaConfig(**common)
    if kind == "distilbert":
        return tf.DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=2 * HIDDEN,
                                   max_position_embeddings=2 * SEQ)
    if kind == "electra":
        return tf.ElectraConfig(embedding_size=HIDDEN // 2, **common)
    if kind == "albert":
        return tf.AlbertConfig(embedding_size=HIDDEN // 2, **common)
    raise KeyError(kind)


def _seq2seq_config(kind: str):
    import transformers as tf
    if kind == "t5":
        return tf.T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=2 * HIDDEN, num_layers=LAYERS,
                           num_decoder_layers=LAYERS, num_heads=HEADS, decoder_start_token_id=0, pad_token_id=0,
                           use_cache=False)
    common = dict(vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=LAYERS, decoder_layers=LAYERS,
                  encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=2 * HIDDEN,
                  decoder_ffn_dim=2 * HIDDEN, max_position_embeddings=2 * SEQ, use_cache=False)
    if kind == "bart":
        return tf.BartConfig(**common)
    if kind == "pegasus":
        return tf.PegasusConfig(decoder_start_token_id=0, pad_token_id=0, **common)
    raise KeyError(kind)


HF_FAMILIES = {"hf decoder": ("AutoModelForCausalLM", _decoder_config),
               "hf encoder": ("AutoModelForMaskedLM", _encoder_config),
               "hf encoder-decoder": ("AutoModelForSeq2SeqLM", _seq2seq_config)}


def build_hf(kind: str, family: str, attention: str = "eager") -> Case:
    import transformers
    transformers.logging.set_verbosity_error()  # "loss_type=None ... Using the default loss" on every build
    auto_name, make_config = HF_FAMILIES[family]
    torch.manual_seed(0)
    config = make_config(kind)
    model = getattr(transformers, auto_name).from_config(config, attn_implementation=attention)
    model.float().train()   # from_config leaves dropout as configured; train mode so that it runs
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    if family == "hf decoder":
        inputs = {"input_ids": ids, "labels": ids}
        outside = [ids]
    elif family == "hf encoder":
        labels = torch.randint(0, VOCAB, (BATCH, SEQ))
        inputs = {"input_ids": ids, "labels": labels}
        outside = [ids, labels]
    else:
        labels = torch.randint(0, VOCAB, (BATCH, TARGET_SEQ))
        inputs = {"input_ids": ids, "labels": labels}
        outside = [ids, labels]
    return Case(model, inputs, lambda out: out.loss, outside)


HF_MODELS = [  # (catalogue name, kind, family, attention)
    ("gpt2", "gpt2", "hf decoder", "eager"),
    ("gpt2-sdpa", "gpt2", "hf decoder", "sdpa"),
    ("llama", "llama", "hf decoder", "eager"),
    ("llama-sdpa", "llama", "hf decoder", "sdpa"),
    ("mistral", "mistral", "hf decoder", "eager"),
    ("qwen2", "qwen2", "hf decoder", "eager"),
    ("gpt_neox", "gpt_neox", "hf decoder", "eager"),
    ("opt", "opt", "hf decoder", "eager"),
    ("phi", "phi", "hf decoder", "eager"),
    ("gemma", "gemma", "hf decoder", "eager"),
    ("bert", "bert", "hf encoder", "eager"),
    ("roberta", "roberta", "hf encoder", "eager"),
    ("distilbert", "distilbert", "hf encoder", "eager"),
    ("electra", "electra", "hf encoder", "eager"),
    ("albert", "albert", "hf encoder", "eager"),
    ("t5", "t5", "hf encoder-decoder", "eager"),
    ("bart", "bart", "hf encoder-decoder", "eager"),
    ("pegasus", "pegasus", "hf encoder-decoder", "eager"),
]


# ---------------------------------------------------------------------------------------------------------------
# The catalogue
# ---------------------------------------------------------------------------------------------------------------

def _catalogue() -> Dict[str, Entry]:
    entries: Dict[str, Entry] = {}
    for name in torchvision_names():
        if name in EXCLUDED:
            continue
        side = _torchvision_side(name)
        entries[name] = Entry(name, "torchvision", f"{BATCH} x 3 x {side} x {side}",
                              lambda name=name: build_torchvision(name), steps=2 if name in SLOW else 3)
    for name, kind, family, attention in HF_MODELS:
        shape = f"{BATCH} x {SEQ} tokens" + (f" -> {TARGET_SEQ}" if family == "hf encoder-decoder" else "")
        entries[name] = Entry(name, family, f"{shape}, {attention}",
                              lambda kind=kind, family=family, attention=attention: build_hf(kind, family, attention))
    return entries


CATALOGUE: Dict[str, Entry] = _catalogue()

# The quick subset (make test): CNNs with and without batch norm, a ViT, decoders with and without SiLU, an encoder,
# an encoder-decoder. Chosen for coverage and speed (a few minutes in all on 2 cores).
QUICK = ["resnet18", "mobilenet_v3_small", "vit_b_32", "gpt2", "llama-sdpa", "bert", "t5"]


# ---------------------------------------------------------------------------------------------------------------
# The probe: what the exclusions and the sides above are measured with
# ---------------------------------------------------------------------------------------------------------------

def probe(name: str, sides=(16, 32, 64, 75, 96, 128, 224)) -> Dict[str, Any]:
    """For one torchvision model: parameters, the smallest side (from `sides`) a train-mode step accepts at batch 2,
    and the time of one SGD step (momentum) without remat at the zoo's side."""
    import time
    out: Dict[str, Any] = {"name": name}
    smallest = None
    for side in sides:
        if name.startswith("vit_") or name == "maxvit_t":
            break  # fixed sizes, set by the builder's kwargs
        try:
            case = build_torchvision(name, side=side)
            case.loss(case.forward()).backward()
            smallest = side
            break
        except Exception as error:  # noqa: BLE001 (a probe: any failure means "not at this side")
            out.setdefault("errors", []).append(f"{side}: {type(error).__name__}: {str(error).splitlines()[0][:100]}")
    out["smallest_side"] = smallest
    start = time.perf_counter()
    case = build_torchvision(name)
    out["build_s"] = time.perf_counter() - start
    out["params"] = sum(p.numel() for p in case.model.parameters())
    opt = torch.optim.SGD(case.model.parameters(), lr=0.01, momentum=0.9)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        opt.zero_grad()
        case.loss(case.forward()).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    out["step_s"] = times
    return out


if __name__ == "__main__":
    import json
    import sys
    if sys.argv[1:2] == ["--probe"]:
        for name in sys.argv[2:] or torchvision_names():
            print(json.dumps(probe(name)), flush=True)
    else:
        for entry in CATALOGUE.values():
            print(f"{entry.name:24} {entry.family:20} {entry.input} steps={entry.steps}")
        print(f"excluded: {EXCLUDED}")
