"""Prompts and chats tokenized exactly as Hugging Face does, for tokenizers
in four chat styles (tests/models/tiny_tokenizers.py).

Our side runs in a fresh process that never imports transformers (a test
that had imported it first once hid a crash: transformers loads
`jinja2.ext`); transformers' side runs here."""

import json
import subprocess
import sys
import time

import pytest
import transformers

from tests import helpers
from tests.models import tiny_tokenizers as tiny
from tunix_pw.errors import UsageError
from tunix_pw.models import chat_template, tokenizers

OURS = """
import json, sys
from tests.models import tiny_tokenizers as tiny
from tunix_pw.models import tokenizers
directory, style = sys.argv[1:]
tok = tokenizers.load(directory)
out = dict(
    texts=[tokenizers.encode_prompt(tok, t, chat=False) for t in tiny.TEXTS],
    chats={name: tok.encode_chat(messages, tools=tools, **switches)
           for name, messages, tools, switches in tiny.chats(style)},
    prompts={name: tokenizers.encode_prompt(tok, messages, chat=True)
             for name, messages, _, _ in tiny.chats(style)},
    chat_text=tokenizers.encode_prompt(tok, tiny.TEXTS[0], chat=True))
assert 'transformers' not in sys.modules, 'the check must not import it'
print(json.dumps(out))
"""


@pytest.fixture(scope='module', params=sorted(tiny.STYLES))
def style_dir(request, tmp_path_factory):
  style = request.param
  return style, tiny.make(style, str(tmp_path_factory.mktemp(style)))


def ours_in_fresh_process(style: str, directory: str) -> dict:
  result = subprocess.run([sys.executable, '-c', OURS, directory, style],
                          cwd=helpers.ROOT, env=helpers.env(),
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  return json.loads(result.stdout)


def test_ids_equal_transformers(style_dir):
  style, directory = style_dir
  ours = ours_in_fresh_process(style, directory)
  ref = transformers.AutoTokenizer.from_pretrained(directory)

  def chat_ids(messages, tools=None, **switches):
    return list(ref.apply_chat_template(
        messages, tools=tools, tokenize=True, add_generation_prompt=True,
        return_dict=False, **switches))

  assert ours['texts'] == [ref(t)['input_ids'] for t in tiny.TEXTS]
  for name, messages, tools, switches in tiny.chats(style):
    expected = chat_ids(messages, tools, **switches)
    assert ours['chats'][name] == expected, name
    if not tools and not switches:  # what the jobs' prompts take
      assert ours['prompts'][name] == expected, name
  assert ours['chat_text'] == chat_ids(
      [{'role': 'user', 'content': tiny.TEXTS[0]}])
  # Each style's own convention, so the comparison above means something.
  first = ours['chats']['user'][0]
  bos = ref.convert_tokens_to_ids(ref.bos_token) if ref.bos_token else None
  assert (ours['texts'][0][0] == bos) == (style in ('llama3', 'gemma'))
  assert (first == bos) == (style != 'qwen3')
  assert ours['chats']['user'][1] != first  # never a second BOS


def test_generation_spans_are_the_assistant_turns(tmp_path):
  tok = tokenizers.load(tiny.make('llama3', str(tmp_path)))
  messages = tiny.CHATS[2][1]
  text, spans = tok.template.render_with_spans(messages)
  assert text == tok.chat(messages, add_generation_prompt=False)
  assert [text[a:b] for a, b in spans] == ['The answer is 42.<|eot_id|>']


def test_no_html_escaping_and_switches(tmp_path):
  tok = tokenizers.load(tiny.make('qwen3', str(tmp_path)))
  text = tok.chat([{'role': 'user', 'content': 'Hi'}], tools=[tiny.WEATHER],
                  enable_thinking=False)
  assert '\\"<unit>\\" & \'format\'' in text  # jinja's tojson: \u003c
  assert text.endswith('<think>\n\n</think>\n\n')


@pytest.mark.parametrize('template, message', [
    ('{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}'
     '{% endfor %}', 'more than 1,000,000 loop iterations'),
    ('{% macro f(n) %}{% for i in range(99) %}{{ f(n) }}{% endfor %}'
     '{% endmacro %}{{ f(0) }}', 'failed to render'),
    ("{{ 'x' * 100000000 }}", '`*` would build'),
    ('{{ 10 ** 100000000 }}', '`**` would build'),
    ("{{ raise_exception('no system role') }}", 'no system role'),
    ('{{ messages.__class__.__mro__ }}', 'failed to render'),
])
def test_hostile_templates_fail_fast(tmp_path, template, message):
  tiny.make('chatml_bos', str(tmp_path))
  (tmp_path / 'chat_template.jinja').write_text(template)
  tok = tokenizers.load(str(tmp_path))
  start = time.monotonic()
  with pytest.raises(UsageError, match='chat_template.jinja') as e:
    tok.encode_chat([{'role': 'user', 'content': 'hi'}])
  assert message in str(e.value)
  assert time.monotonic() - start < 10


def test_template_that_does_not_compile(tmp_path):
  tiny.make('gemma', str(tmp_path))
  (tmp_path / 'chat_template.jinja').write_text('{% for m in messages %}')
  with pytest.raises(UsageError, match='chat_template.jinja: the chat '
                     'template does not compile'):
    tokenizers.load(str(tmp_path))


def test_budget_resets_between_renders():
  template = chat_template.ChatTemplate(
      '{% for i in range(60000) %}{% endfor %}{{ messages[0].content }}',
      'inline', {})
  for _ in range(30):  # 1.8M iterations over all renders: each is fine
    assert template.render([{'role': 'user', 'content': 'ok'}]) == 'ok'
