"""A tiny Hugging Face checkpoint to try the examples without downloading
one: a Gemma 2 architecture with random weights and a byte-level BPE
tokenizer trained here on the example data, with Gemma's chat template,
saved by transformers in the layout a real checkpoint has.

  python examples/tiny_checkpoint.py /tmp/tiny-gemma2

Needs torch and transformers (`pip install -e '.[test]'`). Every example
names a real checkpoint as /ckpt/gemma-2-2b-it; put this directory there,
or pass it instead, to run the example end to end on a CPU.
"""

import pathlib
import sys

import tokenizers
import torch
import transformers

DATA = pathlib.Path(__file__).parent / 'data'
SPECIALS = ['<pad>', '<eos>', '<bos>', '<unk>', '<start_of_turn>',
            '<end_of_turn>']
# Gemma's template: turns as '<start_of_turn>user\n...<end_of_turn>\n'.
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' "
    "else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + "
    "'<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


def tokenizer() -> transformers.PreTrainedTokenizerFast:
  bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token='<unk>'))
  bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=False)
  bpe.decoder = tokenizers.decoders.ByteLevel()
  corpus = [line for path in sorted(DATA.glob('*.jsonl'))
            for line in path.read_text().splitlines()]
  bpe.train_from_iterator(corpus, tokenizers.trainers.BpeTrainer(
      vocab_size=512, special_tokens=SPECIALS,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=bpe, pad_token='<pad>', eos_token='<eos>',
      bos_token='<bos>', unk_token='<unk>')
  fast.chat_template = TEMPLATE
  return fast


def save(directory: str) -> None:
  tok = tokenizer()
  torch.manual_seed(0)
  config = transformers.Gemma2Config(
      vocab_size=len(tok), hidden_size=64, intermediate_size=128,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      head_dim=16, sliding_window=64, max_position_embeddings=1024,
      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
      bos_token_id=tok.bos_token_id)
  model = transformers.AutoModelForCausalLM.from_config(config)
  model.save_pretrained(directory, safe_serialization=True)
  tok.save_pretrained(directory)


if __name__ == '__main__':
  if len(sys.argv) != 2:
    sys.exit('usage: python examples/tiny_checkpoint.py DIRECTORY')
  save(sys.argv[1])
  print(f'a tiny Gemma 2 checkpoint with its tokenizer is in {sys.argv[1]}')
