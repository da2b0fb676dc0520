"""Tiny random Hugging Face models of every family whose configs make every
feature bind (sliding windows shorter than the sequence, soft-caps small
enough to clip, Llama-3 RoPE scaling, a Gemma 3 global layer, GQA and MQA),
written with transformers' own save_pretrained."""

from flax import nnx
import numpy as np
import torch
import transformers

from tunix_pw.models import checkpoints, hf

SEQ = 12  # longer than every sliding window below

CONFIGS = {
    'gemma': lambda: transformers.GemmaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        head_dim=16, hidden_activation='gelu_pytorch_tanh'),
    'gemma2': lambda: transformers.Gemma2Config(
        vocab_size=97, hidden_size=64, intermediate_size=96,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, sliding_window=4, query_pre_attn_scalar=24,
        attn_logit_softcapping=1.5, final_logit_softcapping=2.0),
    'gemma3': lambda: transformers.Gemma3TextConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96,
        num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, sliding_window=4, query_pre_attn_scalar=24,
        rope_parameters={
            'full_attention': {'rope_type': 'linear', 'factor': 8.0,
                               'rope_theta': 1_000_000.0},
            'sliding_attention': {'rope_type': 'default',
                                  'rope_theta': 10_000.0}}),
    'llama3': lambda: transformers.LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        tie_word_embeddings=False, rms_norm_eps=1e-5,
        rope_parameters={'rope_type': 'llama3', 'rope_theta': 500_000.0,
                         'factor': 8.0, 'low_freq_factor': 1.0,
                         'high_freq_factor': 4.0,
                         'original_max_position_embeddings': 16}),
    'qwen3': lambda: transformers.Qwen3Config(
        vocab_size=97, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, tie_word_embeddings=True),
}


# Gemma 3 with images: 32-pixel images in 4-pixel patches (an 8 x 8 grid)
# pooled to 16 soft tokens, longer than the decoder's sliding window.
IMAGE_TOKEN, BEGIN_IMAGE, END_IMAGE = 99, 97, 98


def vision_language_config(vocab_size=100, image_token=IMAGE_TOKEN,
                           begin=BEGIN_IMAGE, end=END_IMAGE):
  text = CONFIGS['gemma3']().to_dict()
  text['vocab_size'] = vocab_size
  return transformers.Gemma3Config(
      text_config=text,
      vision_config=dict(hidden_size=48, intermediate_size=80,
                         num_hidden_layers=2, num_attention_heads=2,
                         image_size=32, patch_size=4, vision_use_head=False),
      mm_tokens_per_image=16, image_token_index=image_token,
      boi_token_index=begin, eoi_token_index=end)


def make(family: str, directory: str, seed: int = 0, config=None):
  """Saves a random float32 model of `family` (of `config`, when given);
  returns the torch model."""
  torch.manual_seed(seed)
  if family == 'gemma3_vision':
    config = config or vision_language_config()
    build = transformers.Gemma3ForConditionalGeneration._from_config  # pylint: disable=protected-access
  else:
    config = CONFIGS[family]()
    build = transformers.AutoModelForCausalLM.from_config
  config._attn_implementation = 'eager'  # pylint: disable=protected-access
  model = build(config, torch_dtype=torch.float32).eval()
  with torch.no_grad():  # every weight random, norm scales included
    for p in model.parameters():
      p.copy_(torch.randn_like(p) * 0.2)
  model.save_pretrained(directory, safe_serialization=True)
  return model


def logits(model, tokens, mask, positions):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens),
                attention_mask=torch.tensor(mask),
                position_ids=torch.tensor(positions))
  return out.logits.float().numpy()


def export(directory: str, out: str) -> None:
  """Writes our load of the checkpoint in `directory` to `out` and checks
  that it loads back to the same config and parameters."""
  model, cfg = checkpoints.load(directory)
  hf.save(out, cfg, nnx.state(model))
  again, cfg2 = checkpoints.load(out)
  assert cfg2 == cfg
  for (p1, a), (p2, b) in zip(nnx.state(model).flat_state(),
                              nnx.state(again).flat_state()):
    assert p1 == p2
    np.testing.assert_array_equal(a.get_value(), b.get_value())


def vision_checkpoint(directory: str, pan_and_scan: dict,
                      fresh: bool = False):
  """A Gemma 3 vision-language checkpoint as one ships: the model, a
  tokenizer trained with Gemma 3's image tokens and the processor, in
  one directory. Returns the torch model and the processor. With
  `fresh`, the weights are our initialisation's (to train from), not
  random ones of every scale."""
  from tests.models import tiny_tokenizers  # pylint: disable=g-import-not-at-top
  tiny_tokenizers.make('gemma3_vision', directory)
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  ids = {name: tokenizer.convert_tokens_to_ids(token)
         for name, token in tiny_tokenizers.IMAGE_TOKENS.items()}
  model = make('gemma3_vision', directory, config=vision_language_config(
      len(tokenizer), ids['image_token'], ids['boi_token'],
      ids['eoi_token']))
  processor = transformers.Gemma3Processor(
      transformers.Gemma3ImageProcessorPil(size={'height': 32, 'width': 32},
                                           **pan_and_scan),
      tokenizer, image_seq_length=16)
  processor.save_pretrained(directory)
  if fresh:
    cfg = hf.read_config(directory)
    hf.save(directory, cfg, nnx.state(checkpoints.init(cfg)))
  return model, processor
