"""Every real-size preset has exactly the parameter count of the model's
official config, counted from the abstract model (nothing allocated)."""

import jax
import pytest

from tunix_pw.models import decoder, presets

# Totals computed from each model's official config.json (Gemma 3: the text
# decoder only), with tied embeddings counted once and every RMSNorm scale
# included. Their non-embedding parts equal the figures the technical
# reports and model cards publish:
#   Gemma 1: arXiv 2403.08295 Table 2 (2b: 1,981,884,416; 7b: 7,751,248,896)
#   Gemma 2: arXiv 2408.00118 Table 2 (2b: 2,024,517,888; 9b: 8,324,201,984;
#            27b: 26,047,480,320)
#   Gemma 3: arXiv 2503.19786 Table 1 (1b: 698M; 4b: 3,209M; 12b: 10,759M;
#            27b: 25,600M non-embedding)
#   Llama 3.2 / 3.1 model cards (1.23B, 3.21B, 8B); Qwen3 model cards
#   (0.6B/0.44B, 1.7B/1.4B, 4.0B/3.6B, 8.2B/6.95B non-embedding).
# Configs: https://huggingface.co/{google/gemma-2b, google/gemma-7b,
#   google/gemma-2-2b, google/gemma-2-9b, google/gemma-2-27b,
#   google/gemma-3-1b-pt, google/gemma-3-4b-pt, google/gemma-3-12b-pt,
#   google/gemma-3-27b-pt, meta-llama/Llama-3.2-1B, meta-llama/Llama-3.2-3B,
#   meta-llama/Llama-3.1-8B, Qwen/Qwen3-0.6B, Qwen/Qwen3-1.7B, Qwen/Qwen3-4B,
#   Qwen/Qwen3-8B}/blob/main/config.json
OFFICIAL = {
    'gemma-2b': 2_506_172_416,
    'gemma-7b': 8_537_680_896,
    'gemma2-2b': 2_614_341_888,
    'gemma2-9b': 9_241_705_984,
    'gemma2-27b': 27_227_128_320,
    'gemma3-1b': 999_885_952,
    'gemma3-4b': 3_880_263_168,
    'gemma3-12b': 11_766_034_176,
    'gemma3-27b': 27_009_346_304,
    'llama3.2-1b': 1_235_814_400,
    'llama3.2-3b': 3_212_749_824,
    'llama3.1-8b': 8_030_261_248,
    'qwen3-0.6b': 596_049_920,
    'qwen3-1.7b': 1_720_574_976,
    'qwen3-4b': 4_022_468_096,
    'qwen3-8b': 8_190_735_360,
}
# The official non-embedding figures, where published exactly.
NON_EMBEDDING = {
    'gemma-2b': 1_981_884_416, 'gemma-7b': 7_751_248_896,
    'gemma2-2b': 2_024_517_888, 'gemma2-9b': 8_324_201_984,
    'gemma2-27b': 26_047_480_320,
}


def count(name):
  model = decoder.abstract(presets.PRESETS[name])
  from flax import nnx  # pylint: disable=g-import-not-at-top
  state = nnx.state(model, nnx.Param)
  return sum(x.size for x in jax.tree.leaves(state)), model


@pytest.mark.parametrize('name', sorted(OFFICIAL))
def test_parameter_count_matches_the_official_config(name):
  total, model = count(name)
  assert total == OFFICIAL[name]
  if name in NON_EMBEDDING:
    assert total - model.embedding.size == NON_EMBEDDING[name]


def test_every_real_preset_is_checked():
  real = {n for n in presets.PRESETS if not n.startswith('tiny-')}
  assert real == set(OFFICIAL)


def test_gemma3_scans_blocks_of_six_plus_the_remainder():
  cfg = presets.PRESETS['gemma3-1b']  # 26 layers
  assert [(len(p), r) for p, r in cfg.groups] == [(6, 4), (2, 1)]
  assert cfg.groups[0][0] == ('local',) * 5 + ('global',)
  assert [(len(p), r) for p, r in presets.PRESETS['gemma2-9b'].groups] == [
      (2, 21)]
