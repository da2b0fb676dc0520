"""launch/xpk.py renders real JobSet manifests through the xpk CLI (dry run)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys

import pytest
from xpk.parser import core as xpk_parser
import yaml

from tests.helpers import ROOT, env, error_lines

CONFIGS = os.path.join(ROOT, 'xpk_configs')
RUN = ['--config=tunix_pw/configs/grpo.py:gemma2-2b',
       '--config.data.name=arithmetic', '--config.rl.kl_beta=0.01',
       '--workdir=/gcs/bucket/runs/r1']


def launch(tmp_path, *args: str) -> subprocess.CompletedProcess:
  # xpk keeps settings under $HOME: a fresh one per test.
  return subprocess.run(
      [sys.executable, os.path.join(ROOT, 'launch', 'xpk.py'), *args],
      cwd=ROOT, env=env(HOME=str(tmp_path)), capture_output=True, text=True,
      timeout=300)


def jobset(path) -> dict:
  documents = [d for d in yaml.safe_load_all(open(path)) if d]
  [found] = [d for d in documents if d['kind'] == 'JobSet']
  return found


@pytest.mark.parametrize('name', sorted(os.listdir(CONFIGS)))
def test_dry_run_renders_the_jobset(tmp_path, name):
  infra = yaml.safe_load(open(os.path.join(CONFIGS, name)))
  manifest = tmp_path / 'm.yaml'
  result = launch(tmp_path, f'--xpk_config={os.path.join(CONFIGS, name)}',
                  *RUN, '--workload=w1', '--dry_run', f'--manifest={manifest}')
  assert result.returncode == 0, result.stderr[-2000:]
  assert f'manifest: {manifest}' in result.stdout
  spec = jobset(manifest)['spec']
  jobs = {j['name']: j['template']['spec'] for j in spec['replicatedJobs']}
  pathways = infra['mode'] == 'pathways'
  ours = jobs['pathways-head' if pathways else 'slice-job']
  workers = spec['replicatedJobs'][[*jobs].index(
      'worker' if pathways else 'slice-job')]
  pod = dict(ours['template']['spec'],
             metadata=ours['template'].get('metadata') or {})
  [container] = [c for c in pod['containers'] if c['name'] == 'jax-tpu']
  script = container['command'][-1]
  assert ('python -m tunix_pw.main --config=tunix_pw/configs/grpo.py:'
          'gemma2-2b --config.data.name=arithmetic --config.rl.kl_beta=0.01 '
          '--workdir=/gcs/bucket/runs/r1 --config.runtime.compilation_cache_dir'
          '=/gcs/bucket/runs/r1/compilation_cache') in script  # outlives pods
  assert container['image'] == infra['image']
  env_vars = {e['name']: e.get('value') for e in container['env'] or []}
  for key, value in infra['env'].items():
    assert env_vars[key] == str(value)
  if pathways:
    assert env_vars['JAX_PLATFORMS'] == 'proxy'  # what the runtime detects
  assert restarts_on_42(ours)
  assert spec['failurePolicy']['maxRestarts'] == infra['max_restarts']
  assert pod['terminationGracePeriodSeconds'] >= infra[
      'termination_grace_seconds']
  assert workers['replicas'] == infra['num_slices']
  assert fuse_mounts(pod, container) == {'/gcs/bucket': 'bucket'}


def fuse_mounts(pod: dict, container: dict) -> dict[str, str]:
  """{mount path: bucket} of the container's GCS FUSE CSI volumes, the
  pod annotated for GKE's GCS FUSE sidecar."""
  volumes = {v['name']: v['csi']['volumeAttributes']['bucketName']
             for v in pod.get('volumes') or []
             if v.get('csi', {}).get('driver') == 'gcsfuse.csi.storage.gke.io'}
  assert not volumes or pod['metadata']['annotations'][
      'gke-gcsfuse/volumes'] == 'true'
  return {m['mountPath']: volumes[m['name']]
          for m in container.get('volumeMounts') or [] if m['name'] in volumes}


def restarts_on_42(job_spec: dict) -> bool:
  """Exit 42 fails the pod without failing the JobSet: restartable."""
  [rule] = job_spec['podFailurePolicy']['rules']
  codes = rule['onExitCodes']
  return (rule['action'] == 'FailJob' and codes['operator'] == 'NotIn' and
          42 in codes['values'] and 1 not in codes['values'])


def test_the_grace_period_fits_a_checkpoint(tmp_path):
  config = tmp_path / 'short.yaml'
  infra = yaml.safe_load(open(os.path.join(CONFIGS, 'v5e-16.yaml')))
  config.write_text(yaml.safe_dump(dict(infra, termination_grace_seconds=5)))
  manifest = tmp_path / 'm.yaml'
  result = launch(tmp_path, f'--xpk_config={config}', *RUN, '--dry_run',
                  f'--manifest={manifest}')
  assert result.returncode == 0, result.stderr[-2000:]
  # gemma2-2b: 2.61e9 float32 parameters and two Adam moments = 29.2 GiB,
  # written by the actor's hosts, 2 of the 4 in the default disaggregated
  # layout, at 200 MiB/s, plus a 60 s margin: 135 s.
  assert 'a 29.2 GiB checkpoint written by 2 hosts needs about 135 s' in \
      result.stdout
  pod = jobset(manifest)['spec']['replicatedJobs'][0]['template']['spec'][
      'template']['spec']
  assert pod['terminationGracePeriodSeconds'] == 135
  collocated = launch(tmp_path, f'--xpk_config={config}', *RUN,
                      '--config.meshes.layout=collocated',
                      '--config.meshes.actor.devices=all',
                      '--config.meshes.rollout.devices=all', '--dry_run',
                      f'--manifest={manifest}')
  assert 'written by 4 hosts needs about 98 s' in collocated.stdout


@pytest.mark.parametrize('change, message', [
    (dict(tpu_type='v9z-64'), "tpu_type='v9z-64' is not a TPU type XPK "
     'knows'),
    (dict(tpu_type='v5p-63'), "tpu_type='v5p-63' is not a slice size"),
    (dict(num_slices=0), 'num_slices=0 must be at least 1.'),
    (dict(image=None), 'image is missing'),
    (dict(mode='mpi'), "mode='mpi' must be one of pathways, mcjax."),
    (dict(slices=2), "unknown field 'slices'; did you mean 'num_slices'?"),
])
def test_a_bad_xpk_config_fails_before_xpk(tmp_path, change, message):
  infra = yaml.safe_load(open(os.path.join(CONFIGS, 'v5e-16.yaml')))
  infra.update(change)
  config = tmp_path / 'bad.yaml'
  config.write_text(yaml.safe_dump({k: v for k, v in infra.items()
                                    if v is not None}))
  manifest = tmp_path / 'm.yaml'
  result = launch(tmp_path, f'--xpk_config={config}', *RUN, '--dry_run',
                  f'--manifest={manifest}')
  assert result.returncode == 2
  [line] = error_lines(result.stderr)
  assert message in line and 'Traceback' not in result.stderr
  assert not manifest.exists() and '[XPK]' not in result.stdout


@pytest.mark.parametrize('args, message', [
    (['--config=tunix_pw/configs/grpo.py:gemma9-1b', '--workdir=/gcs/b/r'],
     "preset='gemma9-1b' is unknown"),
    (['--config=tunix_pw/configs/grpo.py:gemma2-2b',
      '--config.data.name=arithmetic', '--config.rl.micro_batch_size=7',
      '--workdir=/gcs/b/r'],
     'micro_batch_size=7'),
    (['--config=tunix_pw/configs/grpo.py:gemma2-2b',
      '--config.data.name=arithmetic', '--workdir=runs/r1'],
     "--workdir='runs/r1' must outlive the pods"),
    # What only a multi-controller job's processes would refuse (v5e-16 is
    # mcjax: 4 hosts).
    (['--config=tunix_pw/configs/grpo.py:gemma2-2b',
      '--config.data.name=arithmetic', '--config.rl.max_staleness=1',
      '--workdir=/gcs/b/r'],
     '--config.rl.max_staleness needs one controller'),
])
def test_the_run_config_is_validated_first(tmp_path, args, message):
  manifest = tmp_path / 'm.yaml'
  result = launch(tmp_path,
                  f'--xpk_config={os.path.join(CONFIGS, "v5e-16.yaml")}',
                  *args, '--dry_run', f'--manifest={manifest}')
  assert result.returncode == 2, result.stderr[-2000:]
  [line] = error_lines(result.stderr)
  assert message in line
  assert not manifest.exists()


def test_a_gs_workdir_needs_no_mount(tmp_path):
  """The job writes gs:// itself (tests/test_gcs.py): the pods get the
  URL, and no GCS FUSE volume; the compilation cache goes there too, unless
  the run names its own."""
  manifest = tmp_path / 'm.yaml'
  result = launch(tmp_path,
                  f'--xpk_config={os.path.join(CONFIGS, "v5e-16.yaml")}',
                  *RUN[:-1], '--workdir=gs://bucket/runs/r1', '--dry_run',
                  f'--manifest={manifest}')
  assert result.returncode == 0, result.stderr[-2000:]
  rendered = manifest.read_text()
  assert '--workdir=gs://bucket/runs/r1' in rendered
  assert 'gcsfuse' not in rendered
  assert ('--config.runtime.compilation_cache_dir=gs://bucket/runs/r1/'
          'compilation_cache') in rendered
  own = tmp_path / 'own.yaml'  # a cache the run names is kept
  result = launch(tmp_path,
                  f'--xpk_config={os.path.join(CONFIGS, "v5e-16.yaml")}',
                  *RUN[:-1], '--workdir=gs://bucket/runs/r1',
                  '--config.runtime.compilation_cache_dir=gs://bucket/xla',
                  '--dry_run', f'--manifest={own}')
  assert result.returncode == 0, result.stderr[-2000:]
  assert own.read_text().count('compilation_cache_dir') == 1
  assert 'compilation_cache_dir=gs://bucket/xla' in own.read_text()


def readme_commands(section: str) -> list[str]:
  """The commands of a docs/cluster.md section's sh blocks, as a user
  pastes them (continuation lines joined)."""
  text = open(os.path.join(ROOT, 'docs', 'cluster.md')).read()
  body = text.split(f'\n## {section}\n', 1)[1].split('\n## ', 1)[0]
  blocks = re.findall(r'```sh\n(.*?)```', body, re.S)
  return [' '.join(line.split()) for block in blocks
          for line in re.sub(r'\\\n', ' ', block).splitlines()
          if line.strip()]


def test_the_readme_launch_commands_run_as_written(tmp_path):
  commands = readme_commands('Launching on a real cluster')
  # What cannot run here: docker (no daemon), pip (the test extra has
  # installed the launch extra), the compile-only checks (minutes of
  # compiling each; tests/test_compile_only.py runs the machinery).
  rendered = [c for c in commands if c.startswith('python launch/xpk.py')]
  assert rendered and all(
      c.startswith(('docker ', "pip install -e '.[launch]'",
                    'JAX_PLATFORMS=cpu python -m tunix_pw.main ', 'xpk ',
                    'kubectl '))
      for c in commands if c not in rendered)
  # xpk's own commands (a cluster's, a workload's) parse with xpk's parser:
  # their subcommands, flags and names exist.
  xpk = argparse.ArgumentParser(prog='xpk')
  xpk_parser.set_parser(parser=xpk)
  cluster = [c for c in commands if c.startswith('xpk ')]
  assert len(cluster) >= 3
  for command in cluster:
    xpk.parse_args(shlex.split(command, comments=True)[1:])
  bin_dir = os.path.dirname(sys.executable)  # `python` is the test's
  for command in rendered:
    result = subprocess.run(
        command, shell=True, cwd=ROOT, capture_output=True, text=True,
        env=env(HOME=str(tmp_path), PATH=f'{bin_dir}:{os.environ["PATH"]}'),
        timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    [manifest] = re.findall(r'^manifest: (.*)$', result.stdout, re.M)
    head = jobset(manifest)['spec']['replicatedJobs'][0]['template']
    assert head['spec']['podFailurePolicy']  # Pathways: restarts on 42
    pod = dict(head['spec']['template']['spec'],
               metadata=head['spec']['template']['metadata'])
    [container] = [c for c in pod['containers'] if c['name'] == 'jax-tpu']
    assert command.split('--dry_run')[0].split('.yaml ')[1].strip() in \
        ' '.join(container['command'][-1].split())
    assert fuse_mounts(pod, container) == {'/gcs/BUCKET': 'BUCKET'}
