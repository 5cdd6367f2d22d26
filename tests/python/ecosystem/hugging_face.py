"""Hugging Face models outside the zoo, from tiny configs (from_config, no download), AdamW, the model's own loss."""
import torch

import transformers as tf

tf.logging.set_verbosity_error()
H, L, NH, V, B, S = 64, 2, 4, 256, 4, 32


def hf_case(make):
    def build():
        torch.manual_seed(0)
        model, inputs = make()
        model.float().train()
        return model, torch.optim.AdamW(model.parameters(), 1e-3), (inputs,)

    def step(model, opt, data, i):
        opt.zero_grad()
        out = model(**data[0])
        loss = out.loss if getattr(out, "loss", None) is not None else out[0].float().pow(2).mean()
        loss.backward()
        opt.step()
        return loss
    return build, step


def ids(seq=S, vocab=V):
    return torch.randint(0, vocab, (B, seq))


def common(**kw):
    d = dict(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=NH, intermediate_size=2 * H,
             max_position_embeddings=4 * S)
    d.update(kw)
    return d


def deberta():
    cfg = tf.DebertaV2Config(**common(relative_attention=True, pos_att_type=["p2c", "c2p"], max_relative_positions=S))
    m = tf.AutoModelForMaskedLM.from_config(cfg)
    x = ids()
    return m, {"input_ids": x, "labels": x}


def reformer():
    cfg = tf.ReformerConfig(vocab_size=V, hidden_size=H, num_attention_heads=NH, attention_head_size=H // NH,
                            attn_layers=["local", "lsh", "local", "lsh"], feed_forward_size=2 * H,
                            axial_pos_embds=False,
                            max_position_embeddings=S, local_attn_chunk_length=8, lsh_attn_chunk_length=8,
                            num_buckets=4, is_decoder=True, hidden_dropout_prob=0.1, pad_token_id=0)
    m = tf.ReformerModelWithLMHead(cfg)
    x = ids()
    return m, {"input_ids": x, "labels": x}


def wav2vec2():
    cfg = tf.Wav2Vec2Config(vocab_size=32, hidden_size=H, num_hidden_layers=L, num_attention_heads=NH,
                            intermediate_size=2 * H, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2),
                            conv_kernel=(10, 3, 3),
                            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, mask_time_prob=0.2,
                            mask_time_length=2, feat_extract_norm="group", do_stable_layer_norm=False,
                            ctc_loss_reduction="mean", pad_token_id=0)
    m = tf.Wav2Vec2ForCTC(cfg)
    audio = torch.randn(B, 4000)
    labels = torch.randint(1, 32, (B, 10))
    return m, {"input_values": audio, "labels": labels}


def whisper():
    cfg = tf.WhisperConfig(vocab_size=V, num_mel_bins=16, encoder_layers=L, decoder_layers=L,
                           encoder_attention_heads=NH,
                           decoder_attention_heads=NH, d_model=H, encoder_ffn_dim=2 * H, decoder_ffn_dim=2 * H,
                           max_source_positions=50, max_target_positions=S, pad_token_id=0, decoder_start_token_id=1,
                           use_cache=False)
    m = tf.WhisperForConditionalGeneration(cfg)
    feats = torch.randn(B, 16, 100)
    return m, {"input_features": feats, "labels": ids(16)}


def vit_mae():
    cfg = tf.ViTMAEConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=NH, intermediate_size=2 * H,
                          image_size=32, patch_size=8, decoder_hidden_size=H, decoder_num_hidden_layers=1,
                          decoder_num_attention_heads=NH, decoder_intermediate_size=2 * H, mask_ratio=0.5)
    m = tf.ViTMAEForPreTraining(cfg)
    return m, {"pixel_values": torch.randn(B, 3, 32, 32)}


def swin():
    cfg = tf.SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
                        num_labels=5, drop_path_rate=0.1)
    m = tf.SwinForImageClassification(cfg)
    return m, {"pixel_values": torch.randn(B, 3, 32, 32), "labels": torch.randint(0, 5, (B,))}


def clip():
    cfg = tf.CLIPConfig(text_config=dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=L,
                                         num_attention_heads=NH, max_position_embeddings=S),
                        vision_config=dict(hidden_size=H, intermediate_size=2 * H, num_hidden_layers=L,
                                           num_attention_heads=NH, image_size=32, patch_size=8), projection_dim=32)
    m = tf.CLIPModel(cfg)
    return m, {"input_ids": ids(), "pixel_values": torch.randn(B, 3, 32, 32), "return_loss": True}


def mixtral():
    cfg = tf.MixtralConfig(**common(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                    output_router_logits=True, use_cache=False))
    m = tf.AutoModelForCausalLM.from_config(cfg)
    x = ids()
    return m, {"input_ids": x, "labels": x}


def mamba():
    cfg = tf.MambaConfig(vocab_size=V, hidden_size=H, state_size=8, num_hidden_layers=L, expand=2, conv_kernel=4,
                         use_cache=False)
    m = tf.MambaForCausalLM(cfg)
    x = ids()
    return m, {"input_ids": x, "labels": x}


def bloom():
    cfg = tf.BloomConfig(vocab_size=V, hidden_size=H, n_layer=L, n_head=NH, use_cache=False)
    m = tf.BloomForCausalLM(cfg)
    x = ids()
    return m, {"input_ids": x, "labels": x}


def xlnet():
    cfg = tf.XLNetConfig(vocab_size=V, d_model=H, n_layer=L, n_head=NH, d_inner=2 * H, use_mems_train=False)
    m = tf.XLNetLMHeadModel(cfg)
    x = ids()
    return m, {"input_ids": x, "labels": x}


def segformer():
    cfg = tf.SegformerConfig(num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                             hidden_sizes=[16, 32],
                             patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                             decoder_hidden_size=32, num_labels=4, drop_path_rate=0.1)
    m = tf.SegformerForSemanticSegmentation(cfg)
    return m, {"pixel_values": torch.randn(B, 3, 64, 64), "labels": torch.randint(0, 4, (B, 64, 64))}


def convnext():
    cfg = tf.ConvNextConfig(num_channels=3, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=5,
                            drop_path_rate=0.1)
    m = tf.ConvNextForImageClassification(cfg)
    return m, {"pixel_values": torch.randn(B, 3, 64, 64), "labels": torch.randint(0, 5, (B,))}


def longformer():
    cfg = tf.LongformerConfig(**common(attention_window=8, pad_token_id=1, max_position_embeddings=4 * S + 2))
    m = tf.LongformerForMaskedLM(cfg)
    x = ids()
    return m, {"input_ids": x, "labels": x}


def falcon():
    cfg = tf.FalconConfig(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=NH, alibi=True,
                          use_cache=False, new_decoder_architecture=False, multi_query=True)
    m = tf.FalconForCausalLM(cfg)
    x = ids()
    return m, {"input_ids": x, "labels": x}


MAKERS = {f.__name__: f for f in (deberta, reformer, wav2vec2, whisper, vit_mae, swin, clip, mixtral, mamba, bloom,
                                  xlnet, segformer, convnext, longformer, falcon)}
PROGRAMS = {"hf_" + name: hf_case(make) for name, make in MAKERS.items()}
