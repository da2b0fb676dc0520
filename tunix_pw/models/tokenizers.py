"""Tokenizers behind one small interface, and chat templates.

- `CharTokenizer`: built in, needs no files (the demo and every `:runlocal`
  config); ids are ASCII codes, 0/1/2 are pad/bos/eos.
- `SentencePieceTokenizer`: Gemma's `tokenizer.model`.
- `HFTokenizer`: a Hugging Face `tokenizer.json` with its
  `tokenizer_config.json` (special tokens) and the Jinja chat template that
  Llama 3 and Qwen 3 checkpoints declare (`chat_template.jinja`, or inside
  `tokenizer_config.json` in older checkpoints).

`load(directory)` picks the one a checkpoint directory holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import json
import os
import shutil
from typing import Any, Protocol

from tunix_pw.errors import UsageError
from tunix_pw.models.chat_template import ChatTemplate

Message = dict[str, str]  # {'role': 'user' | 'model' | 'assistant' | ..., 'content': ...}

GEMMA_TURN = '<start_of_turn>{role}\n{content}<end_of_turn>\n'
GEMMA_GENERATION = '<start_of_turn>model\n'


class Tokenizer(Protocol):
  """Text <-> ids. `encode(text, add_special_tokens=True)` adds what the
  tokenizer's own post-processing adds to plain text (transformers'
  `tokenizer(text)`); `encode_chat` gives the ids of a rendered chat, whose
  special tokens the template owns (transformers' `apply_chat_template(...,
  tokenize=True)`): `encode_rendered` of `chat`'s text."""

  vocab_size: int
  pad_id: int
  bos_id: int | None
  eos_id: int
  stop_ids: tuple[int, ...]  # ids that end a generated turn

  def encode(self, text: str,
             add_special_tokens: bool = False) -> list[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...

  def special_text(self, token_id: int) -> str:
    """A special token's text as templates write it ('' for none)."""

  def chat(self, messages: Sequence[Message],
           add_generation_prompt: bool = True, **template_vars: Any) -> str: ...

  def encode_chat(self, messages: Sequence[Message],
                  add_generation_prompt: bool = True,
                  **template_vars: Any) -> list[int]: ...

  def encode_rendered(self, text: str) -> list[int]: ...


def _messages(prompt: str | Sequence[Message]) -> list[Message]:
  if isinstance(prompt, str):
    return [dict(role='user', content=prompt)]
  return list(prompt)


def render_prompt(tokenizer: Tokenizer, prompt: str | Sequence[Message],
                  chat: bool) -> str:
  """A prompt's text as the model reads it (messages always take the chat
  template; text does with `chat`)."""
  if isinstance(prompt, str) and not chat:
    return prompt
  return tokenizer.chat(_messages(prompt))


def encode_prompt(tokenizer: Tokenizer, prompt: str | Sequence[Message],
                  chat: bool, expand: Callable[[str], str] = lambda t: t
                  ) -> list[int]:
  """The one rule for a prompt's ids, used by every job: what
  `render_prompt` renders through the chat template keeps the template's
  specials and gets none added; plain text gets what the tokenizer's
  post-processor adds. Answers and completions appended to a prompt are
  `encode(text)`, without specials; no EOS ever ends a prompt. `expand`
  rewrites the rendered text first (a prompt's image markers written
  out, data/images.py)."""
  if isinstance(prompt, str) and not chat:
    return tokenizer.encode(expand(prompt), add_special_tokens=True)
  return tokenizer.encode_rendered(expand(tokenizer.chat(_messages(prompt))))


def gemma_chat(messages: Sequence[Message],
               add_generation_prompt: bool = True) -> str:
  """Gemma's turn format; a system message is folded into the first user
  turn, as Gemma has no system role."""
  turns, system = [], ''
  for m in messages:
    if m['role'] == 'system':
      system = m['content'] + '\n\n'
      continue
    role = 'model' if m['role'] in ('model', 'assistant') else 'user'
    content = (system + m['content']) if role == 'user' else m['content']
    system = '' if role == 'user' else system
    turns.append(GEMMA_TURN.format(role=role, content=content))
  return ''.join(turns) + (GEMMA_GENERATION if add_generation_prompt else '')


_CHAR_ROLES = {'assistant': 'model'}  # as its generation prompt says


class CharTokenizer:
  """ASCII characters as ids (4..127); 0 pad, 1 bos, 2 eos, 3 unknown.
  Chats render one `role: content` line per message."""

  vocab_size = 128
  pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3
  stop_ids = (2,)

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    try:  # the common case, at C speed: ASCII text
      ids = list(text.encode('ascii'))
    except UnicodeEncodeError:
      ids = [ord(c) if ord(c) < 128 else self.unk_id for c in text]
    if ids and min(ids) < 4:  # control characters 0-3 would alias specials
      ids = [i if i >= 4 else self.unk_id for i in ids]
    return [self.bos_id] + ids if add_special_tokens else ids

  def decode(self, ids: Sequence[int]) -> str:
    return ''.join(chr(i) for i in ids if i >= 4)

  def special_text(self, token_id: int) -> str:
    return ''

  def chat(self, messages: Sequence[Message],
           add_generation_prompt: bool = True, **template_vars: Any) -> str:
    del template_vars  # a fixed format
    text = ''.join(f'{_CHAR_ROLES.get(m["role"], m["role"])}: '
                   f'{m["content"]}\n' for m in messages)
    return text + ('model: ' if add_generation_prompt else '')

  def encode_chat(self, messages: Sequence[Message],
                  add_generation_prompt: bool = True,
                  **template_vars: Any) -> list[int]:
    return self.encode_rendered(self.chat(messages, add_generation_prompt))

  def encode_rendered(self, text: str) -> list[int]:
    return self.encode(text, True)


class SentencePieceTokenizer:
  """A SentencePiece model (Gemma's tokenizer.model), Gemma chat format."""

  def __init__(self, model_file: str):
    import sentencepiece  # pylint: disable=g-import-not-at-top
    self.sp = sentencepiece.SentencePieceProcessor()
    try:
      self.sp.Load(model_file)
    except (OSError, RuntimeError) as e:
      raise UsageError(f'{model_file} is not a readable SentencePiece '
                       f'model ({e}).') from None
    self.vocab_size = self.sp.GetPieceSize()
    self.bos_id = self.sp.bos_id() if self.sp.bos_id() >= 0 else None
    self.eos_id = self.sp.eos_id()
    self.pad_id = max(self.sp.pad_id(), 0)
    end_of_turn = self.sp.PieceToId('<end_of_turn>')
    self.stop_ids = tuple(sorted({self.eos_id} | (
        {end_of_turn} if end_of_turn != self.sp.unk_id() else set())))

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    ids = self.sp.EncodeAsIds(text)
    bos = [self.bos_id] if self.bos_id is not None else []
    return bos + ids if add_special_tokens else ids

  def decode(self, ids: Sequence[int]) -> str:
    return self.sp.DecodeIds([int(i) for i in ids])

  def special_text(self, token_id: int) -> str:
    return self.sp.IdToPiece(token_id)

  def chat(self, messages: Sequence[Message],
           add_generation_prompt: bool = True, **template_vars: Any) -> str:
    del template_vars  # Gemma's fixed format
    return gemma_chat(messages, add_generation_prompt)

  def encode_chat(self, messages: Sequence[Message],
                  add_generation_prompt: bool = True,
                  **template_vars: Any) -> list[int]:
    return self.encode_rendered(self.chat(messages, add_generation_prompt))

  def encode_rendered(self, text: str) -> list[int]:
    # Gemma's template opens with {{ bos_token }}, which SentencePiece does
    # not parse from text: the id goes in directly.
    return self.encode(text, True)


SPECIAL_TOKENS = ('bos_token', 'eos_token', 'unk_token', 'sep_token',
                  'pad_token', 'cls_token', 'mask_token')


def _token_text(value) -> str | None:
  return value.get('content') if isinstance(value, dict) else value


def _chat_template(directory: str, config: dict,
                   config_path: str) -> tuple[str | None, str]:
  """(the template transformers would use, its file): chat_template.jinja
  (newer checkpoints), else tokenizer_config.json's (a string, or named
  ones)."""
  path = os.path.join(directory, 'chat_template.jinja')
  if os.path.exists(path):
    with open(path) as f:
      return f.read(), path
  template = config.get('chat_template')
  if isinstance(template, list):
    named = {t['name']: t['template'] for t in template}
    template = named.get('default', next(iter(named.values()), None))
  return template, config_path


def _read_config(path: str) -> dict[str, Any]:
  if not os.path.exists(path):
    return {}
  try:
    with open(path) as f:
      config = json.load(f)
  except (OSError, ValueError) as e:
    raise UsageError(f'{path} is not readable JSON ({e}).') from None
  if not isinstance(config, dict):
    raise UsageError(f'{path} holds {type(config).__name__}, not a JSON '
                     'object.')
  return config


class HFTokenizer:
  """tokenizer.json + tokenizer_config.json (specials, chat template)."""

  def __init__(self, directory: str):
    import tokenizers  # pylint: disable=g-import-not-at-top
    path = os.path.join(directory, 'tokenizer.json')
    try:
      self.tok = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # the Rust library raises its own exception types
      raise UsageError(f'{path} is not a readable tokenizer.json '
                       f'({e}).') from None
    config_path = os.path.join(directory, 'tokenizer_config.json')
    self.config = _read_config(config_path)
    self.vocab_size = self.tok.get_vocab_size()
    self.special_tokens = {
        name: text for name in SPECIAL_TOKENS
        if (text := _token_text(self.config.get(name))) is not None}

    def special(name):
      text = self.special_tokens.get(name)
      return None if text is None else self.tok.token_to_id(text)

    self.bos_id = special('bos_token')
    self.eos_id = special('eos_token')
    if self.eos_id is None:
      raise UsageError(f'{config_path} names no eos_token that '
                       f'{path} knows.')
    self.pad_id = special('pad_token')
    self.pad_id = self.eos_id if self.pad_id is None else self.pad_id
    stops = {self.eos_id}
    for text in ('<end_of_turn>', '<|eot_id|>', '<|im_end|>'):
      if (i := self.tok.token_to_id(text)) is not None:
        stops.add(i)
    self.stop_ids = tuple(sorted(stops))
    source, origin = _chat_template(directory, self.config, config_path)
    self.template = (ChatTemplate(source, origin, self.special_tokens)
                     if source else None)

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    # Specials come from tokenizer.json's post-processor alone: transformers
    # (5.x) ignores tokenizer_config.json's add_bos_token / add_eos_token
    # when a tokenizer.json exists, and adds nothing when it has none.
    return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

  def decode(self, ids: Sequence[int]) -> str:
    return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)

  def special_text(self, token_id: int) -> str:
    return self.tok.id_to_token(token_id) or ''

  def chat(self, messages: Sequence[Message],
           add_generation_prompt: bool = True, **template_vars: Any) -> str:
    if not self.template:  # no template: Gemma's turns, as plain text
      return gemma_chat(messages, add_generation_prompt)
    return self.template.render(messages, add_generation_prompt,
                                **template_vars)

  def encode_chat(self, messages: Sequence[Message],
                  add_generation_prompt: bool = True,
                  **template_vars: Any) -> list[int]:
    return self.encode_rendered(self.chat(messages, add_generation_prompt,
                                          **template_vars))

  def encode_rendered(self, text: str) -> list[int]:
    return self.encode(text, add_special_tokens=not self.template)


# What save_pretrained writes for a tokenizer and a processor (those a
# directory has).
FILES = ('tokenizer.json', 'tokenizer.model', 'tokenizer_config.json',
         'special_tokens_map.json', 'added_tokens.json', 'chat_template.jinja',
         # a vision-language model's processor: its image preprocessing
         'preprocessor_config.json', 'processor_config.json')


def save(source: str, directory: str) -> None:
  """Copies the tokenizer files of `source` (a directory, or a
  SentencePiece .model file) into `directory`; the built-in character
  tokenizer has none."""
  if not source or source == 'char':
    return
  if os.path.isfile(source):
    shutil.copyfile(source, os.path.join(directory, 'tokenizer.model'))
    return
  for name in FILES:
    if os.path.exists(path := os.path.join(source, name)):
      shutil.copyfile(path, os.path.join(directory, name))


def load(directory: str | None) -> Tokenizer:
  """The tokenizer a checkpoint directory holds; the built-in character
  tokenizer when `directory` is empty or 'char'."""
  if not directory or directory == 'char':
    return CharTokenizer()
  if os.path.exists(os.path.join(directory, 'tokenizer.json')):
    return HFTokenizer(directory)
  model = os.path.join(directory, 'tokenizer.model')
  if os.path.exists(model):
    return SentencePieceTokenizer(model)
  if os.path.isfile(directory) and directory.endswith('.model'):
    return SentencePieceTokenizer(directory)
  raise UsageError(f'{directory} holds no tokenizer.json or tokenizer.model.')
