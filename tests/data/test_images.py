"""Gemma 3's image preprocessing against transformers' Gemma3Processor
(its PIL image processor and a tokenizer trained here with Gemma 3's image
tokens, saved together the way checkpoints ship them): pixel values and
input ids equal on images of several sizes, aspect ratios and modes, with
pan and scan on and off."""

import importlib.util

import numpy as np
from PIL import Image
import pytest

from tunix_pw.data import images
from tunix_pw.errors import UsageError
from tunix_pw.models import tokenizers

SIZE, SEQ = 32, 16


def pan_and_scan(on: bool) -> dict:
  return dict(do_pan_and_scan=on, pan_and_scan_min_crop_size=12,
              pan_and_scan_max_num_crops=3,
              pan_and_scan_min_ratio_to_activate=1.2)


def processor(directory: str, on: bool):
  """The processor, saved into `directory` with a checkpoint's files. (A
  Gemma3Processor call applies its own pan-and-scan defaults over the
  image processor's settings: the test passes them to each call.)"""
  from tests.models import hf_models  # pylint: disable=g-import-not-at-top
  return hf_models.vision_checkpoint(directory, pan_and_scan(on))[1]


def picture(width: int, height: int, mode: str, seed: int) -> Image.Image:
  rgb = np.random.default_rng(seed).integers(0, 256, (height, width, 3),
                                             dtype=np.uint8)
  return Image.fromarray(rgb).convert(mode)


# (width, height, mode): square, wide (crops across), tall (crops down),
# barely oblong (no crops), wider than the crop count allows, and the
# modes PIL converts (grey, with alpha, a palette).
PICTURES = [(40, 40, 'RGB'), (100, 30, 'RGB'), (27, 70, 'RGB'),
            (45, 40, 'RGB'), (200, 24, 'L'), (64, 31, 'RGBA'),
            (33, 90, 'P')]


@pytest.mark.skipif(not importlib.util.find_spec('transformers'),
                    reason='transformers is not installed (the test-core '
                    'extra)')
@pytest.mark.parametrize('on', [False, True], ids=['whole', 'pan_and_scan'])
def test_pixels_and_ids_equal_the_transformers_processor(tmp_path, on):
  reference = processor(str(tmp_path), on)
  ours = images.Processing.read(str(tmp_path))
  assert (ours.height, ours.image_seq_length) == (SIZE, SEQ)
  tokenizer = tokenizers.HFTokenizer(str(tmp_path))
  pics = [picture(w, h, mode, seed)
          for seed, (w, h, mode) in enumerate(PICTURES)]
  # One prompt per picture, and one with two pictures.
  prompts = [([p], f'What is in <start_of_image> number {i}?')
             for i, p in enumerate(pics)]
  prompts.append((pics[1:3], 'Compare <start_of_image> with '
                  '<start_of_image>.'))
  crops_seen = set()
  for pics_of, text in prompts:
    expected = reference(images=[pics_of], text=[text], return_tensors='np',
                         **pan_and_scan(on))
    pixels = [ours.pixels(p) for p in pics_of]
    crops = [len(p) - 1 for p in pixels]
    crops_seen.update(crops)
    np.testing.assert_array_equal(np.concatenate(pixels),
                                  expected['pixel_values'])
    ids = tokenizer.encode(ours.expand(text, crops), add_special_tokens=True)
    assert ids == expected['input_ids'][0].tolist()
  # The crops bind: across, down and capped by max_crops.
  assert crops_seen == ({0, 2, 3} if on else {0})


def test_bad_input_is_a_one_sentence_error(tmp_path):
  with pytest.raises(UsageError, match='has no preprocessor_config.json or '
                     'processor_config.json with an image_processor'):
    images.Processing.read(str(tmp_path))
  with pytest.raises(UsageError, match=r'the text has 2 image markers '
                     r'\(<start_of_image>\) for 1 images'):
    images.Processing().expand('<start_of_image><start_of_image>', [0])


def write_png(path, width: int, height: int) -> str:
  picture(width, height, 'RGB', 0).save(path)
  return path.name


@pytest.mark.parametrize('entry, limits, message', [
    (5, {}, 'is not a path or a data: URI'),
    ('../outside.png', {}, r"\('../outside.png'\) is outside the data "
     "file's directory"),
    ('/etc/passwd', {}, r"\('/etc/passwd'\) is outside"),
    ('link.png', {}, r"\('link.png'\) is outside"),  # a symlink out
    ('missing.png', {}, r"\('missing.png'\) does not exist"),
    ('notes.txt', {}, 'is not a readable image'),
    ('truncated.png', {}, 'is not a readable image'),
    ('big.png', dict(pixels=1000), 'is 40x30 pixels, more than 1000 '
     r'\(--config.images.max_pixels\)'),
    ('big.png', dict(bytes=100), r"\('big.png'\) has more than 100 bytes"),
    ('data:image/png,abc', {}, 'is a data: URI without base64 bytes'),
    ('data:image/png;base64,@@@', {}, 'whose base64 does not decode'),
    ('data:image/png;base64,' + 'A' * 400, dict(bytes=100),
     'holds more than 100 bytes'),
])
def test_open_image_refuses_bad_entries(tmp_path, entry, limits, message):
  data = tmp_path / 'data'
  data.mkdir()
  write_png(tmp_path / 'outside.png', 8, 8)
  (data / 'link.png').symlink_to(tmp_path / 'outside.png')
  (data / 'notes.txt').write_text('not an image')
  write_png(data / 'big.png', 40, 30)
  (data / 'truncated.png').write_bytes((data / 'big.png').read_bytes()[:80])
  with pytest.raises(ValueError, match=message):
    images.open_image(entry, str(data), images.Limits(**limits))


def test_open_image_reads_files_and_data_uris(tmp_path):
  import base64  # pylint: disable=g-import-not-at-top
  name = write_png(tmp_path / 'a.png', 40, 30)
  from_file = images.open_image(name, str(tmp_path), images.Limits())
  uri = 'data:image/png;base64,' + base64.b64encode(
      (tmp_path / 'a.png').read_bytes()).decode()
  from_uri = images.open_image(uri, str(tmp_path), images.Limits())
  assert from_file.size == from_uri.size == (40, 30)
  np.testing.assert_array_equal(np.asarray(from_file), np.asarray(from_uri))
