"""JSONL builders: GSM8K's final answers, preference pairs, chat turns, and
bad lines named with their file and line (or skipped and counted)."""

import json

import pytest

from tunix_pw.data import builders, pipeline
from tunix_pw.errors import UsageError

GSM8K = [
    {'question': 'Natalia sold clips to 48 friends...',
     'answer': 'She sold 48/2 = <<48/2=24>>24 clips.\n#### 72'},
    {'question': 'Weng earns $12 an hour...',
     'answer': 'Weng earns 12/60 = $<<12/60=0.2>>0.2.\n#### 10'},
    {'question': 'A big number?', 'answer': 'It is large.\n#### 1,234'},
    {'question': 'Negative?', 'answer': 'Below zero.\n#### -5'},
]


def write(directory, train, test=None):
  directory.mkdir(exist_ok=True)
  for split, rows in (('train', train), ('test', test or train[:1])):
    (directory / f'{split}.jsonl').write_text(
        ''.join(r if isinstance(r, str) else json.dumps(r) + '\n'
                for r in rows))
  return directory


def load(tmp_path, name, on_bad_line='error'):
  spec = pipeline.DataSpec(name, str(tmp_path / 'tfds'),
                           str(tmp_path / 'jsonl'), on_bad_line)
  return pipeline.prepare(spec)


def test_gsm8k_final_answers(tmp_path):
  write(tmp_path / 'jsonl', GSM8K)
  sources, skipped = load(tmp_path, 'gsm8k')
  got = sorted(builders.decode(sources['train'][i])['final_answer']
               for i in range(len(sources['train'])))
  assert got == sorted(['72', '10', '1234', '-5'])
  assert skipped == {'train': 0, 'test': 0}


@pytest.mark.parametrize('bad, message', [
    ('{not json\n', 'train.jsonl:3: '),
    (json.dumps({'question': 'q'}) + '\n', "train.jsonl:3: missing field 'answer'"),
    (json.dumps({'question': 'q', 'answer': 'no number'}) + '\n',
     "train.jsonl:3: the answer does not end in '#### <number>'"),
    (json.dumps({'question': '  ', 'answer': '#### 1'}) + '\n',
     "train.jsonl:3: field 'question' is empty"),
])
def test_gsm8k_bad_lines_name_file_and_line(tmp_path, bad, message):
  write(tmp_path / 'jsonl', GSM8K[:2] + [bad] + GSM8K[2:])
  with pytest.raises(UsageError, match=message):
    load(tmp_path, 'gsm8k')


def test_bad_lines_can_be_skipped_and_counted(tmp_path):
  write(tmp_path / 'jsonl', GSM8K[:2] + ['{oops\n', '{"question": "x"}\n'] +
        GSM8K[2:])
  sources, skipped = load(tmp_path, 'gsm8k', 'skip')
  assert len(sources['train']) == 4
  assert skipped == {'train': 2, 'test': 0}


@pytest.mark.parametrize('test, on_bad_line, message', [
    (['\n', '  \n'], 'error', 'test.jsonl holds no examples.'),
    (['{oops\n'], 'skip',
     r'test.jsonl holds no examples \(bad lines skipped: 1\)'),
])
def test_a_split_without_examples_is_named(tmp_path, test, on_bad_line,
                                           message):
  write(tmp_path / 'jsonl', GSM8K, test)
  with pytest.raises(UsageError, match=message):
    load(tmp_path, 'gsm8k', on_bad_line)


def test_preferences_and_chat(tmp_path):
  write(tmp_path / 'jsonl', [
      {'prompt': 'Say hi', 'chosen': 'Hi!', 'rejected': 'No.'}])
  sources, _ = load(tmp_path, 'preferences')
  assert builders.decode(sources['train'][0]) == {
      'prompt': 'Say hi', 'chosen': 'Hi!', 'rejected': 'No.'}
  chat = tmp_path / 'chat'
  write(chat, [{'messages': [{'role': 'user', 'content': 'Hi'},
                             {'role': 'model', 'content': 'Hello'}]}])
  spec = pipeline.DataSpec('chat', str(tmp_path / 'tfds'), str(chat))
  example = builders.decode(pipeline.prepare(spec)[0]['train'][0])
  assert example['messages'] == {'role': ['user', 'model'],
                                 'content': ['Hi', 'Hello']}


def test_edited_files_are_built_afresh(tmp_path):
  write(tmp_path / 'jsonl', GSM8K[:2])
  assert len(load(tmp_path, 'gsm8k')[0]['train']) == 2
  write(tmp_path / 'jsonl', GSM8K)
  assert len(load(tmp_path, 'gsm8k')[0]['train']) == 4


def test_files_are_hashed_once_per_version(tmp_path):
  """A job asks for its builder more than once (validation, then the
  build): unchanged files are not read again, edited ones are."""
  directory = str(write(tmp_path / 'jsonl', GSM8K[:2]))
  misses = builders._fingerprint.cache_info().misses
  first = builders.jsonl_config(directory)
  assert builders.jsonl_config(directory) == first
  assert builders._fingerprint.cache_info().misses == misses + 1
  write(tmp_path / 'jsonl', GSM8K)
  assert builders.jsonl_config(directory).name != first.name


def test_missing_manual_files_unknown_names_and_unread_directories(tmp_path):
  with pytest.raises(UsageError, match='train.jsonl is missing'):
    load(tmp_path, 'gsm8k')
  with pytest.raises(UsageError, match='manual_dir is required'):
    pipeline.DataSpec('chat', str(tmp_path)).builder()
  with pytest.raises(UsageError, match="name='wiki' is unknown"):
    pipeline.DataSpec('wiki', str(tmp_path)).builder()
  with pytest.raises(UsageError, match='not read by the arithmetic'):
    pipeline.DataSpec('arithmetic', str(tmp_path), str(tmp_path)).check()


def test_unpaired_examples_and_their_labels(tmp_path):
  write(tmp_path / 'jsonl', [
      {'prompt': '2+2=', 'completion': '4', 'label': True},
      {'prompt': '2+2=', 'completion': '5', 'label': False}])
  sources, _ = load(tmp_path, 'unpaired')
  assert [builders.decode(sources['train'][i]) for i in range(2)] == [
      {'prompt': '2+2=', 'completion': '4', 'label': True},
      {'prompt': '2+2=', 'completion': '5', 'label': False}]


def test_an_unpaired_label_must_be_a_boolean(tmp_path):
  write(tmp_path / 'jsonl', [
      {'prompt': '2+2=', 'completion': '4', 'label': True},
      {'prompt': '2+2=', 'completion': '5', 'label': 'no'}])
  with pytest.raises(UsageError,
                     match="train.jsonl:2: field 'label' is not true or false"):
    load(tmp_path, 'unpaired')
