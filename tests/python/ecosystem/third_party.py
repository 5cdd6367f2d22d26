"""Libraries users train with (installed by scripts/setup.sh): timm's image models (with stochastic depth), a peft
LoRA adapter on a GPT-2, opacus' differentially private SGD (per-sample gradients from hooks, noise from a generator
of its own), einops' layers."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from ecosystem.harness import std_step


def timm_case(name, side=64, batch=32, **kw):
    def build():
        import timm
        m = timm.create_model(name, pretrained=False, num_classes=10, **kw)
        m.train()
        return m, torch.optim.SGD(m.parameters(), 1e-2), (torch.randn(batch, 3, side, side),
                                                          torch.randint(0, 10, (batch,)))
    return build, std_step(lambda m, d: F.cross_entropy(m(d[0]), d[1]))


def lora_build():
    from transformers import GPT2Config, GPT2LMHeadModel
    from peft import LoraConfig, get_peft_model
    cfg = GPT2Config(n_embd=128, n_layer=3, n_head=4, vocab_size=512, n_positions=128,
                     resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    base = GPT2LMHeadModel(cfg)
    m = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn", "c_fc"], lora_dropout=0.1,
                                        fan_in_fan_out=True))
    m.train()
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], 1e-3)
    return m, opt, (torch.randint(0, 512, (4, 64)),)


def lora_loss(m, d):
    return m(input_ids=d[0], labels=d[0]).loss


def opacus_build():
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                        nn.GroupNorm(4, 16), nn.Tanh(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256, 10))
    m = GradSampleModule(net)
    gen = torch.Generator().manual_seed(3)
    opt = DPOptimizer(torch.optim.SGD(m.parameters(), 0.05), noise_multiplier=1.0, max_grad_norm=1.0,
                      expected_batch_size=32, generator=gen)
    return m, opt, (torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,)))


def einops_build():
    from einops.layers.torch import Rearrange
    m = nn.Sequential(Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=4, p2=4), nn.Linear(48, 128), nn.GELU(),
                      nn.LayerNorm(128), Rearrange("b n d -> b d n"), nn.Conv1d(128, 128, 3, padding=1),
                      Rearrange("b d n -> b (d n)"), nn.Linear(128 * 64, 10))
    return m, torch.optim.Adam(m.parameters(), 1e-3), (torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))


PROGRAMS = {
    "timm_vit_tiny": timm_case("vit_tiny_patch16_224", side=64, img_size=64, drop_path_rate=0.1),
    "timm_convnext_atto": timm_case("convnext_atto", drop_path_rate=0.1),
    "timm_efficientnet_b0": timm_case("efficientnet_b0", drop_path_rate=0.1),
    "timm_resnet18d": timm_case("resnet18d"),
    "timm_mobilevitv2": timm_case("mobilevitv2_050"),
    "timm_regnetx": timm_case("regnetx_002"),
    "timm_swin": timm_case("swin_tiny_patch4_window7_224", side=64, batch=16, img_size=64, window_size=4),
    "timm_coatnet": timm_case("coatnet_nano_rw_224", side=64, batch=16, img_size=64),
    "timm_levit": timm_case("levit_128s", side=64, img_size=64),
    "timm_mixer": timm_case("mixer_s32_224", side=64, batch=16, img_size=64),
    "peft_lora_gpt2": (lora_build, std_step(lora_loss)),
    "opacus_dp_sgd": (opacus_build, std_step(lambda m, d: F.cross_entropy(m(d[0]), d[1]))),
    "einops_layers": (einops_build, std_step(lambda m, d: F.cross_entropy(m(d[0]), d[1]))),
}
