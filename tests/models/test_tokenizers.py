"""Tokenizers: SentencePiece and tokenizer.json through our interface equal
transformers loaded from the same directory; chat templates; the built-in
character tokenizer."""

import json

import pytest
import sentencepiece as spm
import tokenizers
import transformers

from tunix_pw.errors import UsageError
from tunix_pw.models import tokenizers as ours

TEXTS = ['What is 12 + 30? The answer is 42.', 'Hello  world\n  two spaces',
         'emoji 🙂 and ünïcödé', '   leading', '<start_of_turn>user\nhi']
CORPUS = ['The quick brown fox jumps over the lazy dog.',
          'What is 12 + 30? The answer is 42.',
          'Gemma models are trained with SentencePiece tokenizers!'] * 50


@pytest.fixture(scope='module')
def sentencepiece_dir(tmp_path_factory):
  """A SentencePiece model trained here with Gemma's settings (no dummy
  prefix, byte fallback, turn markers as user-defined symbols)."""
  d = tmp_path_factory.mktemp('sp')
  (d / 'corpus.txt').write_text('\n'.join(CORPUS))
  spm.SentencePieceTrainer.train(
      input=str(d / 'corpus.txt'), model_prefix=str(d / 'tokenizer'),
      vocab_size=400, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
      user_defined_symbols=['<start_of_turn>', '<end_of_turn>'],
      byte_fallback=True, model_type='bpe', add_dummy_prefix=False,
      remove_extra_whitespaces=False, normalization_rule_name='identity',
      minloglevel=2)
  (d / 'tokenizer_config.json').write_text(json.dumps(dict(
      tokenizer_class='GemmaTokenizer', bos_token='<s>', eos_token='</s>',
      pad_token='<pad>', unk_token='<unk>', add_bos_token=True)))
  return d


def test_sentencepiece_matches_transformers(sentencepiece_dir):
  tok = ours.load(str(sentencepiece_dir))
  assert isinstance(tok, ours.SentencePieceTokenizer)
  reference = transformers.AutoTokenizer.from_pretrained(
      str(sentencepiece_dir))
  for text in TEXTS:
    ids = tok.encode(text, add_special_tokens=True)
    assert ids == reference(text)['input_ids'], text
    assert tok.decode(ids[1:]) == text
  assert (tok.bos_id, tok.eos_id, tok.pad_id) == (2, 1, 0)
  assert tok.stop_ids == (1, tok.sp.PieceToId('<end_of_turn>'))


LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")


@pytest.fixture(scope='module')
def tokenizer_json_dir(tmp_path_factory):
  """A byte-level BPE tokenizer.json with Llama 3's special tokens and chat
  template, the way transformers saves one."""
  d = tmp_path_factory.mktemp('hf')
  bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
  bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=False)
  bpe.decoder = tokenizers.decoders.ByteLevel()
  specials = ['<|begin_of_text|>', '<|end_of_text|>', '<|start_header_id|>',
              '<|end_header_id|>', '<|eot_id|>']
  bpe.train_from_iterator(CORPUS, tokenizers.trainers.BpeTrainer(
      vocab_size=300, special_tokens=specials,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=bpe, bos_token='<|begin_of_text|>',
      eos_token='<|end_of_text|>')
  fast.chat_template = LLAMA3_TEMPLATE
  fast.save_pretrained(str(d))
  return d


def test_tokenizer_json_and_chat_template_match_transformers(
    tokenizer_json_dir):
  tok = ours.load(str(tokenizer_json_dir))
  assert isinstance(tok, ours.HFTokenizer)
  reference = transformers.AutoTokenizer.from_pretrained(
      str(tokenizer_json_dir))
  for text in TEXTS:
    assert tok.encode(text) == reference.encode(text,
                                                add_special_tokens=False)
  messages = [{'role': 'system', 'content': 'Be brief.'},
              {'role': 'user', 'content': ' What is 12 + 30? '}]
  text = tok.chat(messages)
  assert text == reference.apply_chat_template(
      messages, tokenize=False, add_generation_prompt=True)
  assert text.startswith('<|begin_of_text|><|start_header_id|>system')
  assert tok.stop_ids == tuple(sorted(
      {tok.eos_id, reference.convert_tokens_to_ids('<|eot_id|>')}))


def test_gemma_chat_format():
  text = ours.gemma_chat([{'role': 'system', 'content': 'Be brief.'},
                          {'role': 'user', 'content': 'Hi'},
                          {'role': 'assistant', 'content': 'Hello'},
                          {'role': 'user', 'content': '2+2?'}])
  assert text == ('<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n'
                  '<start_of_turn>model\nHello<end_of_turn>\n'
                  '<start_of_turn>user\n2+2?<end_of_turn>\n'
                  '<start_of_turn>model\n')


def test_char_tokenizer_needs_no_files():
  tok = ours.load('char')
  ids = tok.encode("12+30=42\n", add_special_tokens=True)
  assert ids[0] == tok.bos_id and max(ids) < tok.vocab_size
  assert tok.decode(ids) == '12+30=42\n'
  assert tok.encode('é') == [tok.unk_id]


def test_bad_tokenizer_directories(tmp_path):
  with pytest.raises(UsageError, match='holds no tokenizer'):
    ours.load(str(tmp_path))
  (tmp_path / 'tokenizer.model').write_bytes(b'not a model')
  with pytest.raises(UsageError, match='not a readable SentencePiece'):
    ours.load(str(tmp_path))


@pytest.mark.parametrize('text', ['{not json', '[1, 2]'])
def test_a_malformed_tokenizer_config_is_named(tokenizer_json_dir, tmp_path,
                                               text):
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.copytree(tokenizer_json_dir, tmp_path, dirs_exist_ok=True)
  (tmp_path / 'tokenizer_config.json').write_text(text)
  with pytest.raises(UsageError, match='tokenizer_config.json'):
    ours.load(str(tmp_path))
