"""The generate job through main: prompts in, completions and JSONL out;
bad input exits 2 naming the problem."""

import base64
import io
import json

from flax import nnx
import numpy as np
from PIL import Image
import pytest
import torch

from tests import helpers
from tests.models import hf_models
from tunix_pw.models import checkpoints, hf, presets

CONFIG = '--config=tunix_pw/configs/generate.py:runlocal'


def test_prompts_file_to_jsonl(tmp_path):
  prompts = tmp_path / 'prompts.jsonl'
  prompts.write_text(
      json.dumps({'prompt': 'What is 2+2?'}) + '\n' +
      json.dumps({'messages': [{'role': 'user', 'content': 'Hi'}]}) + '\n')
  out = tmp_path / 'out.jsonl'
  result = helpers.run_main(CONFIG, f'--config.prompts_file={prompts}',
                            f'--config.output_jsonl={out}',
                            '--config.sampling.max_new_tokens=6',
                            f'--workdir={tmp_path / "w"}')
  assert result.returncode == 0, result.stderr
  records = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r['prompt'] for r in records] == ['What is 2+2?', 'user: Hi\nmodel: ']
  for r in records:
    assert len(r['tokens']) == len(r['logprobs']) <= 6
    assert all(lp <= 0 for lp in r['logprobs'])
  assert "=== 0: 'What is 2+2?'" in result.stdout


def test_generates_from_a_checkpoint_directory(tmp_path):
  cfg = presets.PRESETS['tiny-llama3']
  model = checkpoints.init(cfg, seed=3)
  hf.save(str(tmp_path / 'ckpt'), cfg, nnx.state(model))
  result = helpers.run_main(
      CONFIG, f'--config.model.checkpoint={tmp_path / "ckpt"}',
      '--config.model.tokenizer=char', '--config.prompt=12+30=',
      '--config.sampling.max_new_tokens=4', '--config.sampling.temperature=0.7',
      '--config.sampling.top_k=5', f'--workdir={tmp_path / "w"}')
  assert result.returncode == 0, result.stderr
  assert "=== 0: '12+30='" in result.stdout


@pytest.mark.parametrize('extra, lines, message', [
    ([], ['ok', '', 'fine'], 'prompts.txt:2: empty prompt'),
    ([], ['{"prompt": "a"}', '{not json'], 'prompts.jsonl:2: not JSON'),
    ([], ['{"prompt": 5}'], 'prompts.jsonl:1: not a JSON object with a '
     'string "prompt"'),
    ([], ['{"prompt": "a"}', '["a"]'], 'prompts.jsonl:2: not a JSON object'),
    ([], ['{"messages": "hi"}'], 'prompts.jsonl:1: not a JSON object'),
    ([], ['{"messages": [{"role": "user"}]}'], 'prompts.jsonl:1: not a JSON '
     'object'),
    ([], ['{"messages": [{"role": "user", "content": ["a"]}]}'],
     'prompts.jsonl:1: not a JSON object'),
    ([], ['{"messages": []}'], 'prompts.jsonl:1: not a JSON object'),
    (['--config.sampling.top_p=1.5'], ['ok'], 'top_p=1.5 must be in (0, 1]'),
    (['--config.sampling.max_new_tokens=0'], ['ok'],
     'max_new_tokens=0 must be at least 1'),
    (['--config.sampling.max_cache=16'], ['x' * 20],
     'exceeds the cache of 16 positions'),
    ([], ['{"prompt": "a", "images": "x.png"}'],
     'prompts.jsonl:1: "images" is not a list'),
    (['--config.images.max_per_record=1'],
     ['{"prompt": "a", "images": ["x.png", "y.png"]}'],
     'prompts.jsonl:1: 2 images, more than '
     '--config.images.max_per_record=1'),
    ([], ['{"prompt": "a", "images": ["../x.png"]}'],
     "prompts.jsonl:1: image 0 ('../x.png') is outside the data file's "
     'directory'),
    ([], ['{"prompt": "a <start_of_image>", "images": ["prompts.jsonl"]}'],
     'prompts.jsonl:1: image 0 is not a readable image'),
    (['--config.images.max_pixels=0'], ['ok'],
     '--config.images.max_pixels=0 must be at least 1'),
])
def test_bad_input_exits_2(tmp_path, extra, lines, message):
  name = 'prompts.jsonl' if lines[0].startswith('{') else 'prompts.txt'
  (tmp_path / name).write_text('\n'.join(lines) + '\n')
  result = helpers.run_main(CONFIG, f'--config.prompts_file={tmp_path / name}',
                            *extra, f'--workdir={tmp_path / "w"}')
  assert result.returncode == 2, result.stderr
  [line] = helpers.error_lines(result.stderr)
  assert message in line


def test_images_for_a_model_without_a_vision_tower_exit_2(tmp_path):
  png(tmp_path / 'a.png', 8, 8, 0)
  prompts = tmp_path / 'prompts.jsonl'
  prompts.write_text('{"prompt": "a <start_of_image>", "images": '
                     '["a.png"]}\n')
  result = helpers.run_main(CONFIG, f'--config.prompts_file={prompts}',
                            f'--workdir={tmp_path / "w"}')
  assert result.returncode == 2, result.stderr
  [line] = helpers.error_lines(result.stderr)
  assert ('prompts.jsonl:1: the prompt has images, but the gemma2 model '
          'has no vision tower.') in line


def png(path, width: int, height: int, seed: int) -> bytes:
  """A random RGB picture, written as PNG to `path`; returns its bytes."""
  pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3),
                                                dtype=np.uint8)
  Image.fromarray(pixels).save(path)
  return path.read_bytes()


PAN_AND_SCAN = dict(do_pan_and_scan=True, pan_and_scan_min_crop_size=12,
                    pan_and_scan_max_num_crops=3,
                    pan_and_scan_min_ratio_to_activate=1.2)


def test_generates_from_images_as_transformers_does(tmp_path):
  """A Gemma 3 vision-language checkpoint (model, tokenizer, processor):
  JSONL prompts with an image file, a data: URI, two images and none, in
  one batch, with pan and scan; greedy tokens equal transformers'
  generate through its own processor."""
  ckpt = tmp_path / 'ckpt'
  torch_model, processor = hf_models.vision_checkpoint(str(ckpt),
                                                       PAN_AND_SCAN)
  data = tmp_path / 'data'
  data.mkdir()
  png(data / 'wide.png', 100, 30, 0)  # cut into 3 crops
  square = base64.b64encode(png(tmp_path / 'square.png', 40, 40, 1))
  uri = 'data:image/png;base64,' + square.decode()
  records = [
      {'prompt': 'Look: <start_of_image> what is it?', 'images': ['wide.png']},
      {'prompt': 'No image here.'},
      {'prompt': 'A <start_of_image> and a <start_of_image>.',
       'images': [uri, 'wide.png']},
  ]
  prompts = data / 'prompts.jsonl'
  prompts.write_text(''.join(json.dumps(r) + '\n' for r in records))
  out = tmp_path / 'out.jsonl'
  result = helpers.run_main(
      '--config=tunix_pw/configs/generate.py',
      f'--config.model.checkpoint={ckpt}',
      f'--config.prompts_file={prompts}', f'--config.output_jsonl={out}',
      '--config.images.pan_and_scan=True',
      '--config.sampling.max_new_tokens=6', f'--workdir={tmp_path / "w"}')
  assert result.returncode == 0, result.stderr
  got = [json.loads(line) for line in out.read_text().splitlines()]
  for record, ours in zip(records, got):
    pictures = [Image.open(io.BytesIO(base64.b64decode(e.split(',')[1])))
                if e.startswith('data:') else Image.open(data / e)
                for e in record.get('images', [])]
    inputs = processor(images=[pictures] if pictures else None,
                       text=[record['prompt']], return_tensors='pt',
                       return_mm_token_type_ids=True, **PAN_AND_SCAN)
    with torch.no_grad():
      expected = torch_model.generate(
          **inputs, max_new_tokens=6, do_sample=False, eos_token_id=None,
          pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    tokens = expected.sequences[0, inputs['input_ids'].shape[1]:].tolist()
    n = len(ours['tokens'])
    assert ours['tokens'] == tokens[:n]
    assert n == 6 or tokens[n - 1] == processor.tokenizer.eos_token_id
    # The log-probabilities bind every prompt token and pixel.
    logprobs = [torch.log_softmax(step[0], -1)[t].item()
                for step, t in zip(expected.logits, tokens)]
    np.testing.assert_allclose(ours['logprobs'], logprobs[:n], atol=1e-4)
