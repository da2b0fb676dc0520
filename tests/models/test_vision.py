"""Gemma 3 with images against transformers' Gemma3ForConditionalGeneration
(torch, CPU, float32) on a tiny random checkpoint that transformers writes:
the vision tower's features, the merged embeddings, logits and greedy
tokens for prompts with one and with two images; export; LoRA on the
tower; the sampler's checks of images against image tokens."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from tests.models import hf_models
from tunix_pw.configs import common
from tunix_pw.errors import UsageError
from tunix_pw.models import checkpoints, lora
from tunix_pw.sampling.rollout import SamplingConfig
from tunix_pw.sampling.sampler import Sampler

TOKENS = 16  # soft tokens per image (hf_models.vision_language_config)


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('gemma3_vision'))
  return directory, hf_models.make('gemma3_vision', directory)


def image_span() -> list[int]:
  """An image's place in a prompt, as Gemma 3's processor writes it."""
  return ([hf_models.BEGIN_IMAGE] + [hf_models.IMAGE_TOKEN] * TOKENS +
          [hf_models.END_IMAGE])


# One prompt with one image, one with two (text before, between, after).
PROMPTS = [[2, 5, 6] + image_span() + [7, 8],
           [2, 9] + image_span() + [10, 11, 12] + image_span() + [13]]


def images(count: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).normal(
      size=(count, 3, 32, 32)).astype(np.float32)


PIXELS = [images(1, 1), images(2, 2)]


def left_padded():
  """PROMPTS left-padded into one batch (HF gets the same mask and
  positions) and each row's images, zeros after its own."""
  width = max(map(len, PROMPTS))
  tokens = np.zeros((2, width), np.int64)
  mask = np.zeros((2, width), np.int64)
  for row, p in enumerate(PROMPTS):
    tokens[row, width - len(p):] = p
    mask[row, width - len(p):] = 1
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  ours = np.zeros((2, 2, 3, 32, 32), np.float32)
  for row, own in enumerate(PIXELS):
    ours[row, :len(own)] = own
  return tokens, mask, positions, ours


def torch_forward(model, tokens, mask, positions):
  with torch.no_grad():
    return model(
        input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
        position_ids=torch.tensor(positions),
        pixel_values=torch.tensor(np.concatenate(PIXELS)),
        token_type_ids=torch.tensor(tokens == hf_models.IMAGE_TOKEN).long(),
        output_hidden_states=True)


def test_the_vision_tower_matches_transformers(checkpoint):
  directory, torch_model = checkpoint
  model, cfg = checkpoints.load(directory)
  assert cfg.vision.tokens_per_image == TOKENS
  pixels = images(3)
  with torch.no_grad():
    encoded = torch_model.model.vision_tower(
        pixel_values=torch.tensor(pixels)).last_hidden_state.numpy()
    soft = torch_model.model.get_image_features(
        torch.tensor(pixels)).pooler_output.numpy()
  np.testing.assert_allclose(model.vision.encode(jnp.asarray(pixels)),
                             encoded, atol=1e-4, rtol=0)
  np.testing.assert_allclose(model.vision(jnp.asarray(pixels)), soft,
                             atol=1e-4, rtol=0)
  assert soft.shape == (3, TOKENS, cfg.embed_dim)


def test_embeddings_and_logits_match_with_one_and_two_images(checkpoint):
  directory, torch_model = checkpoint
  model, _ = checkpoints.load(directory)
  tokens, mask, positions, pixels = left_padded()
  expected = torch_forward(torch_model, tokens, mask, positions)
  embedded, _ = model.embed(jnp.asarray(tokens), jnp.asarray(pixels))
  valid = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(embedded)[valid],
                             expected.hidden_states[0].numpy()[valid],
                             atol=1e-4, rtol=0)
  logits, _ = model(jnp.asarray(tokens), jnp.asarray(positions),
                    jnp.asarray(mask), images=jnp.asarray(pixels))
  np.testing.assert_allclose(np.asarray(logits)[valid],
                             expected.logits.numpy()[valid], atol=1e-4,
                             rtol=0)
  # The images matter: other pixels give other logits after them.
  other, _ = model(jnp.asarray(tokens), jnp.asarray(positions),
                   jnp.asarray(mask), images=jnp.asarray(pixels) + 1.0)
  assert np.abs(np.asarray(other) - np.asarray(logits))[:, -1].max() > 1e-2


@pytest.mark.parametrize('row', [0, 1], ids=['one_image', 'two_images'])
def test_greedy_tokens_equal_transformers(checkpoint, row):
  directory, torch_model = checkpoint
  model, _ = checkpoints.load(directory)
  prompt = PROMPTS[row]
  with torch.no_grad():
    expected = torch_model.generate(
        input_ids=torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        pixel_values=torch.tensor(PIXELS[row]),
        token_type_ids=torch.tensor(
            [[int(t == hf_models.IMAGE_TOKEN) for t in prompt]]),
        max_new_tokens=8, do_sample=False, eos_token_id=None,
        pad_token_id=0)[0, len(prompt):].tolist()
  sampler = Sampler(model, pad_id=0, eos_ids=())
  out = sampler.generate([prompt], SamplingConfig(max_new_tokens=8,
                                                  temperature=0.0),
                         images=[PIXELS[row]])
  assert out.tokens[0].tolist() == expected


def test_export_round_trip_and_transformers_reads_it(checkpoint, tmp_path):
  directory, torch_model = checkpoint
  hf_models.export(directory, str(tmp_path))
  reread = transformers.Gemma3ForConditionalGeneration.from_pretrained(
      str(tmp_path), attn_implementation='eager').eval()
  tokens, mask, positions, _ = left_padded()
  np.testing.assert_allclose(
      torch_forward(reread, tokens, mask, positions).logits.numpy(),
      torch_forward(torch_model, tokens, mask, positions).logits.numpy(),
      atol=1e-5)


def test_lora_leaves_the_tower_frozen_unless_targeted(checkpoint):
  directory, _ = checkpoint
  default = common.lora(rank=4).targets
  model, _ = checkpoints.load(directory)
  adapted = lora.apply(model, default, rank=4, alpha=8.0)
  assert adapted and not any(p.startswith('vision') for p in adapted)
  model, _ = checkpoints.load(directory)
  adapted = lora.apply(model, r'vision/.*attn/(q|v)', rank=4, alpha=8.0)
  assert adapted == ['vision/blocks/attn/q', 'vision/blocks/attn/v']
  before = model.vision(jnp.asarray(images(1)))
  model.vision.blocks.attn.q_lora_b[...] = jnp.ones_like(
      model.vision.blocks.attn.q_lora_b[...])
  assert np.abs(model.vision(jnp.asarray(images(1))) - before).max() > 1e-3


def test_the_sampler_checks_images_against_image_tokens(checkpoint):
  directory, _ = checkpoint
  model, _ = checkpoints.load(directory)
  sampler = Sampler(model, pad_id=0, eos_ids=())
  sampling = SamplingConfig(max_new_tokens=2, temperature=0.0)
  with pytest.raises(UsageError, match='prompt 1 has 32 image tokens for 1 '
                     'images of 16 tokens each'):
    sampler.generate(PROMPTS, sampling, images=[PIXELS[0], PIXELS[0]])
  with pytest.raises(UsageError, match=r'image 0 of prompt 0 has shape '
                     r'\(3, 16, 16\), expected \(3, 32, 32\)'):
    sampler.generate(PROMPTS[:1], sampling,
                     images=[np.zeros((1, 3, 16, 16), np.float32)])
  with pytest.raises(UsageError, match='1 image lists for 2 prompts'):
    sampler.generate(PROMPTS, sampling, images=PIXELS[:1])
