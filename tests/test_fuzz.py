"""Fuzzing through `main --check_only`, as a user meets it: random values of
random types for random fields of every config file, malformed JSONL data
and prompt files, corrupt safetensors shards and indexes. Every run must end
with exit 0, or exit 2 and one sentence: never a traceback, a hang or a
written workdir.

A few examples per config file run in the suite;
`TUNIX_PW_FUZZ_EXAMPLES=N python -m pytest -n 0 tests/test_fuzz.py` runs
N per file (the campaign in the README)."""

from __future__ import annotations

import importlib
import json
import os
import shutil

from flax import nnx
from hypothesis import HealthCheck, given, settings, strategies as st
import numpy as np
import pytest

from tests import helpers
from tunix_pw.models import checkpoints, hf, presets, safetensors_io

EXAMPLES = int(os.environ.get('TUNIX_PW_FUZZ_EXAMPLES', '3'))
# Every config file, with the argument a local run uses.
CONFIGS = [('agentic', 'runlocal'), ('data', ''), ('demo', ''),
           ('distill', 'runlocal'), ('dpo', 'runlocal'), ('eval', 'runlocal'),
           ('generate', 'runlocal'), ('grpo', 'runlocal'),
           ('grpo', 'runlocal,dapo'), ('pairs', 'runlocal'),
           ('ppo', 'runlocal'), ('reward_model', 'runlocal'),
           ('sft', 'runlocal'), ('smoke', '')]


def fields(name: str, arg: str) -> list[str]:
  """The config's leaf fields, dotted."""
  config = importlib.import_module(f'tunix_pw.configs.{name}').get_config(
      arg or None)
  out = []

  def walk(node, prefix):
    for key, value in node.items():
      if hasattr(value, 'items'):
        walk(value, f'{prefix}{key}.')
      else:
        out.append(prefix + key)

  walk(config, '')
  return out


VALUES = st.one_of(
    st.integers(-2**40, 2**40).map(str),
    st.sampled_from(['0', '-1', '1', 'nan', 'inf', '-inf', '1e309', '',
                     'True', 'False', 'None', '[]', '{}', "'", '"',
                     '(1,2)', 'fsdp=0', 'fsdp=-2,tp=0', '0:0', '5:1',
                     '/nonexistent/x', 'gs://b/x', '\u00e9\u6f22', ' ',
                     'all', 'none', '-0.0', '1e-400']),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    # argv holds no NUL and only encodable text
    st.text(max_size=12).filter(lambda s: '\x00' not in s and s.isprintable()))


@pytest.mark.parametrize('name, arg', CONFIGS,
                         ids=[f'{n}:{a}' for n, a in CONFIGS])
def test_random_overrides_exit_0_or_2_with_one_sentence(tmp_path, name, arg):
  names = fields(name, arg)

  @settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
            suppress_health_check=list(HealthCheck))
  @given(st.lists(st.tuples(st.sampled_from(names), VALUES), min_size=1,
                  max_size=3))
  def check(overrides):
    workdir = tmp_path / 'w'
    flags = [f'--config.{field}={value}' for field, value in overrides]
    config = f'--config=tunix_pw/configs/{name}.py' + (f':{arg}' if arg
                                                       else '')
    result = helpers.run_main(config, *flags, '--check_only',
                              f'--workdir={workdir}', timeout=120)
    said = f'{flags}: exit {result.returncode}\n{result.stderr[-2000:]}'
    assert result.returncode in (0, 2), said
    assert 'Traceback' not in result.stderr, said
    if result.returncode == 2:
      assert len(helpers.error_lines(result.stderr)) == 1, said
    assert not workdir.exists(), said

  check()  # pylint: disable=no-value-for-parameter


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(
        max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=8), inner, max_size=3), max_leaves=6)
# A well-formed record of each JSONL format, to break field by field.
RECORDS = {
    'gsm8k': {'question': 'What is 1+1?', 'answer': 'It is 2.\n#### 2'},
    'preferences': {'prompt': '1+1=', 'chosen': '2', 'rejected': '3'},
    'unpaired': {'prompt': '1+1=', 'completion': '2', 'label': True},
    'chat': {'messages': [{'role': 'user', 'content': '1+1?'},
                          {'role': 'assistant', 'content': '2'}]},
}


def lines(record: dict) -> st.SearchStrategy[list[str]]:
  """JSONL lines: the record whole, with a field of another value or
  missing, any JSON value, or text that is not JSON."""
  changed = st.sampled_from(sorted(record)).flatmap(lambda key: st.one_of(
      JSON.map(lambda v: {**record, key: v}),
      st.just({k: v for k, v in record.items() if k != key})))
  return st.lists(st.one_of(
      st.just(record), changed, JSON, st.text(max_size=20).filter(
          lambda s: '\n' not in s and '\r' not in s)).map(
              lambda x: x if isinstance(x, str) else json.dumps(x)),
                  min_size=1, max_size=6)


def ends_well(result, what) -> None:
  said = f'{what}: exit {result.returncode}\n{result.stderr[-2000:]}'
  assert result.returncode in (0, 2), said
  assert 'Traceback' not in result.stderr, said
  if result.returncode == 2:
    assert len(helpers.error_lines(result.stderr)) == 1, said


@pytest.mark.parametrize('name', sorted(RECORDS))
def test_malformed_jsonl_data_exits_0_or_2_with_one_sentence(tmp_path, name):
  runs = iter(range(10**6))

  @settings(max_examples=EXAMPLES, deadline=None,
            suppress_health_check=list(HealthCheck))
  @given(lines(RECORDS[name]), lines(RECORDS[name]))
  def check(train, test):
    run = tmp_path / str(next(runs))
    (run / 'data').mkdir(parents=True)
    for split, rows in (('train', train), ('test', test)):
      (run / 'data' / f'{split}.jsonl').write_text('\n'.join(rows) + '\n')
    ends_well(helpers.run_main(
        f'--config=tunix_pw/configs/data.py:{name}',
        f'--config.data.manual_dir={run / "data"}',
        f'--workdir={run / "w"}', timeout=120), [train, test])

  check()  # pylint: disable=no-value-for-parameter


def test_malformed_prompt_files_exit_0_or_2_with_one_sentence(tmp_path):
  runs = iter(range(10**6))

  @settings(max_examples=EXAMPLES, deadline=None,
            suppress_health_check=list(HealthCheck))
  @given(lines({'prompt': '1+1='}) | lines(RECORDS['chat']))
  def check(rows):
    run = tmp_path / str(next(runs))
    run.mkdir()
    (run / 'prompts.jsonl').write_text('\n'.join(rows) + '\n')
    ends_well(helpers.run_main(
        '--config=tunix_pw/configs/generate.py:runlocal',
        f'--config.prompts_file={run / "prompts.jsonl"}',
        '--config.sampling.max_new_tokens=4', f'--workdir={run / "w"}',
        timeout=120), rows)

  check()  # pylint: disable=no-value-for-parameter


@pytest.mark.parametrize('count', ['98026', '32490', '-8'])
def test_found_by_fuzzing_a_huge_virtual_device_count(tmp_path, count):
  """It hung (98026) or aborted (32490) in XLA."""
  result = helpers.run_main('--config=tunix_pw/configs/smoke.py',
                            f'--config.runtime.host_device_count={count}',
                            '--check_only', f'--workdir={tmp_path / "w"}',
                            timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  [line] = helpers.error_lines(result.stderr)
  assert f'host_device_count={count} must be between 0 and 512' in line


@pytest.fixture(scope='module')
def sharded_checkpoint(tmp_path_factory):
  """A tiny Llama 3 in Hugging Face's layout, in two safetensors shards with
  their index."""
  directory = tmp_path_factory.mktemp('hf')
  cfg = presets.PRESETS['tiny-llama3']
  hf.save(str(directory), cfg, nnx.state(checkpoints.init(cfg, seed=1)))
  store = safetensors_io.SafetensorsDir(str(directory))
  names = store.names()
  shards = {'model-00001-of-00002.safetensors': names[::2],
            'model-00002-of-00002.safetensors': names[1::2]}
  for shard, part in shards.items():
    safetensors_io.save(str(directory / shard),
                        {n: np.array(store.get(n)) for n in part})
  del store
  os.remove(directory / 'model.safetensors')
  (directory / safetensors_io.INDEX).write_text(json.dumps({'weight_map': {
      n: shard for shard, part in shards.items() for n in part}}))
  return directory


# A corruption: bytes overwritten (anywhere, or in a shard's header), a
# shard cut short, its header length rewritten, the index replaced whole
# or one of its entries changed.
CORRUPTIONS = st.one_of(
    st.tuples(st.sampled_from(['bytes', 'header bytes']), st.integers(0, 1),
              st.lists(st.tuples(st.floats(0, 1, exclude_max=True),
                                 st.integers(0, 255)), min_size=1,
                       max_size=8)),
    st.tuples(st.just('truncate'), st.integers(0, 1),
              st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just('header length'), st.integers(0, 1),
              st.integers(0, 2**64 - 1)),
    st.tuples(st.just('index'), st.just(0), JSON.map(json.dumps) | st.text(
        max_size=40)),
    st.tuples(st.just('index entry'), st.integers(0, 10**6), JSON))


def corrupt(directory, kind: str, which: int, how) -> None:
  shards = sorted(p for p in directory.iterdir()
                  if p.name.endswith('.safetensors'))
  path = shards[which % len(shards)] if shards else None
  index = directory / safetensors_io.INDEX
  if kind in ('bytes', 'header bytes'):
    data = bytearray(path.read_bytes())
    span = (8 + int.from_bytes(data[:8], 'little') if kind == 'header bytes'
            else len(data))
    for where, value in how:
      data[int(where * min(span, len(data)))] = value
    path.write_bytes(bytes(data))
  elif kind == 'truncate':
    path.write_bytes(path.read_bytes()[:int(how * path.stat().st_size)])
  elif kind == 'header length':
    path.write_bytes(how.to_bytes(8, 'little') + path.read_bytes()[8:])
  elif kind == 'index':
    index.write_text(how)
  else:
    weight_map = json.loads(index.read_text())['weight_map']
    name = sorted(weight_map)[which % len(weight_map)]
    weight_map[name] = how
    index.write_text(json.dumps({'weight_map': weight_map}))


def test_corrupt_checkpoints_exit_0_or_2_with_one_sentence(
    tmp_path, sharded_checkpoint):
  """--check_only reads config.json, the index and every header; a run that
  passes it then loads the tensors and generates."""
  runs = iter(range(10**6))

  @settings(max_examples=EXAMPLES, deadline=None,
            suppress_health_check=list(HealthCheck))
  @given(CORRUPTIONS)
  def check(corruption):
    run = tmp_path / str(next(runs))
    shutil.copytree(sharded_checkpoint, run / 'ckpt')
    corrupt(run / 'ckpt', *corruption)
    args = ['--config=tunix_pw/configs/generate.py:runlocal',
            f'--config.model.checkpoint={run / "ckpt"}',
            '--config.model.tokenizer=char', '--config.prompt=1+1=',
            '--config.sampling.max_new_tokens=2', f'--workdir={run / "w"}']
    checked = helpers.run_main(*args, '--check_only', timeout=120)
    ends_well(checked, corruption)
    assert not (run / 'w').exists(), corruption
    if checked.returncode == 0:
      ends_well(helpers.run_main(*args, timeout=120), corruption)

  check()  # pylint: disable=no-value-for-parameter


def test_found_by_fuzzing_a_truncated_header_is_caught_by_check_only(
    tmp_path, sharded_checkpoint):
  shutil.copytree(sharded_checkpoint, tmp_path / 'ckpt')
  corrupt(tmp_path / 'ckpt', 'truncate', 1, 0.5)
  result = helpers.run_main(
      '--config=tunix_pw/configs/generate.py:runlocal',
      f'--config.model.checkpoint={tmp_path / "ckpt"}', '--check_only',
      f'--workdir={tmp_path / "w"}')
  assert result.returncode == 2, result.stderr[-2000:]
  [line] = helpers.error_lines(result.stderr)
  assert 'model-00002-of-00002.safetensors' in line and (
      'truncated or corrupt' in line), line
  assert not (tmp_path / 'w').exists()
