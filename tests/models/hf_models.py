"""Tiny random Hugging Face models of every family whose configs make every
feature bind (sliding windows shorter than the sequence, soft-caps small
enough to clip, Llama-3 RoPE scaling, a Gemma 3 global layer, GQA and MQA),
written with transformers' own save_pretrained."""

import torch
import transformers

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


def make(family: str, directory: str, seed: int = 0):
  """Saves a random float32 model of `family`; returns the torch model."""
  torch.manual_seed(seed)
  config = CONFIGS[family]()
  config._attn_implementation = 'eager'  # pylint: disable=protected-access
  model = transformers.AutoModelForCausalLM.from_config(
      config, torch_dtype=torch.float32).eval()
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
