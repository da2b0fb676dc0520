"""Model presets by name: the real sizes, and tiny ones for tests and
`:runlocal` configs. Values follow each model's official Hugging Face
config.json (see tests/models/test_presets.py for the sources)."""

from __future__ import annotations

from tunix_pw.models.config import GLOBAL, LOCAL, ModelConfig, Rope


def _gemma(**kw) -> ModelConfig:
  return ModelConfig(family='gemma', vocab_size=256_000, **kw)


def _gemma2(num_layers: int, **kw) -> ModelConfig:
  return ModelConfig(
      family='gemma2', vocab_size=256_000, num_layers=num_layers,
      post_norms=True, attn_softcap=50.0, final_softcap=30.0,
      sliding_window=4096, scan_period=2,
      layer_types=tuple(LOCAL if i % 2 == 0 else GLOBAL
                        for i in range(num_layers)), **kw)


def _gemma3(num_layers: int, vocab_size: int = 262_208,
            sliding_window: int = 1024, global_scale: float = 8.0,
            **kw) -> ModelConfig:
  scaling = (Rope(1_000_000.0, 'linear', global_scale) if global_scale != 1
             else Rope(1_000_000.0))
  return ModelConfig(
      family='gemma3', vocab_size=vocab_size, num_layers=num_layers,
      post_norms=True, qk_norm=True, sliding_window=sliding_window,
      scan_period=6, rope_global=scaling, rope_local=Rope(10_000.0),
      layer_types=tuple(LOCAL if (i + 1) % 6 else GLOBAL
                        for i in range(num_layers)), **kw)


def _llama3(factor: float, tie: bool, **kw) -> ModelConfig:
  return ModelConfig(
      family='llama3', vocab_size=128_256, activation='silu', norm_eps=1e-5,
      norm_plus_one=False, embed_scale=False, tie_embeddings=tie,
      rope_global=Rope(500_000.0, 'llama3', factor, 1.0, 4.0, 8192),
      rope_local=Rope(500_000.0, 'llama3', factor, 1.0, 4.0, 8192), **kw)


def _qwen3(tie: bool, **kw) -> ModelConfig:
  kw = dict(dict(vocab_size=151_936, head_dim=128, num_kv_heads=8), **kw)
  return ModelConfig(
      family='qwen3', activation='silu', norm_plus_one=False,
      embed_scale=False, qk_norm=True, tie_embeddings=tie,
      rope_global=Rope(1_000_000.0), rope_local=Rope(1_000_000.0), **kw)


PRESETS: dict[str, ModelConfig] = {
    'gemma-2b': _gemma(embed_dim=2048, num_layers=18, num_heads=8,
                       num_kv_heads=1, head_dim=256, mlp_dim=16384),
    'gemma-7b': _gemma(embed_dim=3072, num_layers=28, num_heads=16,
                       num_kv_heads=16, head_dim=256, mlp_dim=24576),
    'gemma2-2b': _gemma2(26, embed_dim=2304, num_heads=8, num_kv_heads=4,
                         head_dim=256, mlp_dim=9216, query_scale=256),
    'gemma2-9b': _gemma2(42, embed_dim=3584, num_heads=16, num_kv_heads=8,
                         head_dim=256, mlp_dim=14336, query_scale=256),
    'gemma2-27b': _gemma2(46, embed_dim=4608, num_heads=32, num_kv_heads=16,
                          head_dim=128, mlp_dim=36864, query_scale=144),
    'gemma3-1b': _gemma3(26, vocab_size=262_144, sliding_window=512,
                         global_scale=1.0, embed_dim=1152, num_heads=4,
                         num_kv_heads=1, head_dim=256, mlp_dim=6912,
                         query_scale=256, max_position=32768),
    'gemma3-4b': _gemma3(34, embed_dim=2560, num_heads=8, num_kv_heads=4,
                         head_dim=256, mlp_dim=10240, query_scale=256,
                         max_position=131072),
    'gemma3-12b': _gemma3(48, embed_dim=3840, num_heads=16, num_kv_heads=8,
                          head_dim=256, mlp_dim=15360, query_scale=256,
                          max_position=131072),
    'gemma3-27b': _gemma3(62, embed_dim=5376, num_heads=32, num_kv_heads=16,
                          head_dim=128, mlp_dim=21504, query_scale=168,
                          max_position=131072),
    'llama3.2-1b': _llama3(32.0, True, embed_dim=2048, num_layers=16,
                           num_heads=32, num_kv_heads=8, head_dim=64,
                           mlp_dim=8192, max_position=131072),
    'llama3.2-3b': _llama3(32.0, True, embed_dim=3072, num_layers=28,
                           num_heads=24, num_kv_heads=8, head_dim=128,
                           mlp_dim=8192, max_position=131072),
    'llama3.1-8b': _llama3(8.0, False, embed_dim=4096, num_layers=32,
                           num_heads=32, num_kv_heads=8, head_dim=128,
                           mlp_dim=14336, max_position=131072),
    'qwen3-0.6b': _qwen3(True, embed_dim=1024, num_layers=28, num_heads=16,
                         mlp_dim=3072, max_position=40960),
    'qwen3-1.7b': _qwen3(True, embed_dim=2048, num_layers=28, num_heads=16,
                         mlp_dim=6144, max_position=40960),
    'qwen3-4b': _qwen3(True, embed_dim=2560, num_layers=36, num_heads=32,
                       mlp_dim=9728, max_position=40960),
    'qwen3-8b': _qwen3(False, embed_dim=4096, num_layers=36, num_heads=32,
                       mlp_dim=12288, max_position=40960),
    # Tiny sizes: tests, demos and every :runlocal config. The vocabulary is
    # the built-in character tokenizer's (see tokenizers.CharTokenizer).
    'tiny-gemma': _gemma(embed_dim=128, num_layers=4, num_heads=4,
                         num_kv_heads=1, head_dim=32, mlp_dim=512).replace(
                             vocab_size=128),
    'tiny-gemma2': _gemma2(4, embed_dim=128, num_heads=4, num_kv_heads=2,
                           head_dim=32, mlp_dim=512, query_scale=32).replace(
                               vocab_size=128, sliding_window=16),
    'tiny-gemma3': _gemma3(6, vocab_size=128, sliding_window=16,
                           embed_dim=128, num_heads=4, num_kv_heads=2,
                           head_dim=32, mlp_dim=512, query_scale=32),
    'tiny-llama3': _llama3(8.0, True, embed_dim=128, num_layers=4,
                           num_heads=4, num_kv_heads=2, head_dim=32,
                           mlp_dim=512).replace(vocab_size=128),
    'tiny-qwen3': _qwen3(True, vocab_size=128, embed_dim=128, num_layers=4,
                         num_heads=4, num_kv_heads=2, head_dim=32,
                         mlp_dim=512),
}
