"""Bad checkpoints fail with one clear error naming the tensor and file;
sharded (indexed) checkpoints load like single-file ones."""

import json
import os
import shutil

import numpy as np
import pytest

from tests.models import hf_models
from tunix_pw.errors import UsageError
from tunix_pw.models import checkpoints, safetensors_io

FILE = 'model.safetensors'


@pytest.fixture(scope='module')
def good(tmp_path_factory):
  d = tmp_path_factory.mktemp('good')
  hf_models.make('llama3', str(d))
  return d


def copy_with(good, tmp_path, change):
  """A copy of the checkpoint whose tensors `change(dict)` rewrites."""
  shutil.copytree(good, tmp_path, dirs_exist_ok=True)
  store = safetensors_io.SafetensorsDir(str(tmp_path))
  tensors = {n: np.array(store.get(n)) for n in store.names()}
  del store
  change(tensors)
  safetensors_io.save(str(tmp_path / FILE), tensors)
  return str(tmp_path)


LAYER = 'model.layers.1.self_attn.k_proj.weight'


@pytest.mark.parametrize('change, message', [
    (lambda t: t.pop(LAYER), f"tensor '{LAYER}' is missing"),
    (lambda t: t.update(extra=np.zeros(3, np.float32)),
     "unexpected tensor 'extra'"),
    (lambda t: t.update({LAYER: np.zeros((5, 64), np.float32)}),
     f"tensor '{LAYER}' in .*{FILE} has shape \\(5, 64\\)"),
    (lambda t: t.update({LAYER: t[LAYER].astype(np.int32)}),
     f"tensor '{LAYER}' in .*{FILE} has dtype int32"),
])
def test_bad_tensors_are_named(good, tmp_path, change, message):
  with pytest.raises(UsageError, match=message):
    checkpoints.load(copy_with(good, tmp_path, change))


def test_truncated_file_is_corrupt(good, tmp_path):
  shutil.copytree(good, tmp_path, dirs_exist_ok=True)
  path = tmp_path / FILE
  path.write_bytes(path.read_bytes()[:-100])
  with pytest.raises(UsageError, match='truncated or corrupt'):
    checkpoints.load(str(tmp_path))
  path.write_bytes(b'\xff' * 16)
  with pytest.raises(UsageError, match='not a readable safetensors file'):
    checkpoints.load(str(tmp_path))


def test_unknown_family_is_named(good, tmp_path):
  shutil.copytree(good, tmp_path, dirs_exist_ok=True)
  config = json.loads((tmp_path / 'config.json').read_text())
  (tmp_path / 'config.json').write_text(
      json.dumps({**config, 'model_type': 'bert'}))
  with pytest.raises(UsageError, match="unsupported model_type 'bert'"):
    checkpoints.load(str(tmp_path))


def test_missing_directory_and_unknown_layout(tmp_path):
  with pytest.raises(UsageError, match='does not exist'):
    checkpoints.load(str(tmp_path / 'nope'))
  with pytest.raises(UsageError, match='neither a Hugging Face'):
    checkpoints.load(str(tmp_path))


def test_sharded_index_checkpoint_loads_like_one_file(tmp_path):
  torch_model = hf_models.make('llama3', str(tmp_path / 'one'))
  torch_model.save_pretrained(str(tmp_path / 'many'), max_shard_size='20KB')
  assert os.path.exists(tmp_path / 'many' / safetensors_io.INDEX)
  assert len([f for f in os.listdir(tmp_path / 'many')
              if f.endswith('.safetensors')]) > 2
  one, _ = checkpoints.load(str(tmp_path / 'one'))
  many, _ = checkpoints.load(str(tmp_path / 'many'))
  tokens = np.arange(24).reshape(2, 12) % 97
  positions = np.broadcast_to(np.arange(12), (2, 12))
  np.testing.assert_array_equal(one(tokens, positions, np.ones_like(tokens))[0],
                                many(tokens, positions, np.ones_like(tokens))[0])


def test_an_index_naming_a_file_outside_the_checkpoint_is_refused(good,
                                                                  tmp_path):
  """A shard name like '../other/model.safetensors' would load another
  checkpoint (it did, before the check)."""
  other, mine = tmp_path / 'other', tmp_path / 'mine'
  shutil.copytree(good, other)
  shutil.copytree(good, mine)
  os.remove(mine / FILE)
  names = safetensors_io.SafetensorsDir(str(other)).names()
  (mine / safetensors_io.INDEX).write_text(json.dumps(
      {'weight_map': {n: '../other/model.safetensors' for n in names}}))
  with pytest.raises(UsageError, match="names the shard "
                     "'../other/model.safetensors', which is not a file name "
                     'inside'):
    checkpoints.load(str(mine))


@pytest.mark.parametrize('index', [
    '{not json', '{"metadata": {}}', '{"weight_map": ["a"]}',
    '{"weight_map": {"a": 3}}',
])
def test_a_malformed_index_is_named(good, tmp_path, index):
  shutil.copytree(good, tmp_path, dirs_exist_ok=True)
  (tmp_path / safetensors_io.INDEX).write_text(index)
  with pytest.raises(UsageError, match='index'):
    checkpoints.load(str(tmp_path))


@pytest.mark.parametrize('header', [
    b'[1, 2]', b'{"w": 3}', b'{"w": {"dtype": "F32", "shape": [2]}}',
    b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}',
])
def test_a_malformed_header_is_named(good, tmp_path, header):
  shutil.copytree(good, tmp_path, dirs_exist_ok=True)
  (tmp_path / FILE).write_bytes(len(header).to_bytes(8, 'little') + header)
  with pytest.raises(UsageError, match='not a readable safetensors file'):
    checkpoints.load(str(tmp_path))
