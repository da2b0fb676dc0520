r"""Submits a tunix_pw job to GKE through XPK.

  python launch/xpk.py --xpk_config=xpk_configs/v5p-64-pathways.yaml \
      --config=tunix_pw/configs/grpo.py:gemma2-2b [--config.x=y ...] \
      --workdir=/gcs/bucket/run [--workload=NAME] [--dry_run]

The run config is validated first, exactly as `tunix_pw.main` does before
any device work (files the config names are checked where the job runs, not
here). Then `xpk workload create-pathways` (mode: pathways) or `xpk workload
create` (mode: mcjax) renders the JobSet manifest with `python -m
tunix_pw.main <the same flags>` inside, the xpk_config's env, restarts on
exit 42 and a termination grace long enough for a checkpoint. `--dry_run`
stops there and prints the manifest's path; otherwise the manifest is
applied with kubectl, so what was inspected is what runs. Pathways manifests
get the restart policy XPK leaves out of them (max restarts, exit 42 on the
head pod, its termination grace), and every bucket the flags name as
`/gcs/BUCKET/...` (workdir, data, checkpoints) is mounted there with GCS
FUSE in the pods that run the job.
"""

from __future__ import annotations

import datetime
import difflib
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import types
from typing import Any

from absl import app, flags

from tunix_pw import checks, main as tunix_main
from tunix_pw import workdir as workdir_lib
from tunix_pw.errors import UsageError
from tunix_pw.rl import asynchronous
from tunix_pw.runtime import meshes, topology
from tunix_pw.runtime.preemption import EXIT_PREEMPTED

_XPK_CONFIG = flags.DEFINE_string('xpk_config', None,
                                  'Infrastructure YAML (xpk_configs/).')
_WORKLOAD = flags.DEFINE_string(
    'workload', '', 'Workload name (default: tunix-<job>-<time>).')
_DRY_RUN = flags.DEFINE_bool(
    'dry_run', False, 'Render the manifest and print its path; submit '
    'nothing.')
_MANIFEST = flags.DEFINE_string(
    'manifest', '', 'Where to write the manifest (default: a temp file).')

MODES = {'pathways': 'create-pathways', 'mcjax': 'create'}
PRIORITIES = ('very-low', 'low', 'medium', 'high', 'very-high')
FIELDS = {'cluster': str, 'project': str, 'zone': str, 'tpu_type': str,
          'num_slices': int, 'mode': str, 'image': str, 'priority': str,
          'max_restarts': int, 'termination_grace_seconds': int, 'env': dict}
# Exit codes a JobSet restarts on: ours (preempted after a checkpoint) and
# those of a signal-killed process, as XPK's multi-controller manifests do.
RESTART_CODES = [EXIT_PREEMPTED] + list(range(127, 256))
CHIPS_PER_HOST = 4
TRAINED_ROLES = ('actor', 'critic')  # what a checkpoint holds
# A checkpoint's write rate per host to GCS, conservatively, and the margin
# for the agreement on the stop and Orbax's commit.
WRITE_BYTES_PER_S = 200 << 20
GRACE_MARGIN_S = 60
_WORKLOAD_NAME = re.compile(r'^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$')


def load_xpk_config(path: str) -> dict[str, Any]:
  """The YAML at `path`, checked field by field: one sentence per problem."""
  import yaml  # pylint: disable=g-import-not-at-top
  if not path or not os.path.isfile(path):
    raise UsageError(f'--xpk_config={path!r}: no such file; see xpk_configs/.')
  try:
    with open(path) as f:
      config = yaml.safe_load(f)
  except yaml.YAMLError as e:
    raise UsageError(f'--xpk_config={path}: not valid YAML ({e}).') from None
  if not isinstance(config, dict):
    raise UsageError(f'--xpk_config={path}: expected a mapping of fields.')
  for key in config:
    if key not in FIELDS:
      close = difflib.get_close_matches(str(key), FIELDS, n=1)
      hint = f'did you mean {close[0]!r}?' if close else (
          f'fields: {", ".join(FIELDS)}.')
      raise UsageError(f'{path}: unknown field {key!r}; {hint}')
  for key, kind in FIELDS.items():
    value = config.get(key, {} if key == 'env' else None)
    if value is None or value == '':
      raise UsageError(f'{path}: {key} is missing; every xpk_config names '
                       f'{", ".join(k for k in FIELDS if k != "env")}.')
    if not isinstance(value, kind) or isinstance(value, bool):
      raise UsageError(f'{path}: {key}={value!r} must be a {kind.__name__}.')
    config[key] = value
  topology.parse(config['tpu_type'], f'{path}: tpu_type')
  if config['num_slices'] < 1:
    raise UsageError(f'{path}: num_slices={config["num_slices"]} must be at '
                     'least 1.')
  if config['mode'] not in MODES:
    raise UsageError(f'{path}: mode={config["mode"]!r} must be one of '
                     f'{", ".join(MODES)}.')
  if config['priority'] not in PRIORITIES:
    raise UsageError(f'{path}: priority={config["priority"]!r} must be one '
                     f'of {", ".join(PRIORITIES)}.')
  if config['max_restarts'] < 0 or config['termination_grace_seconds'] < 1:
    raise UsageError(f'{path}: max_restarts must be >= 0 and '
                     'termination_grace_seconds >= 1.')
  if not all(isinstance(k, str) and isinstance(v, (str, int, float))
             for k, v in config['env'].items()):
    raise UsageError(f'{path}: env must map names to strings or numbers.')
  return config


def checkpoint_bytes(config: Any) -> int:
  """Bytes of one checkpoint of a training job: its trainable parameters
  (LoRA: the adapters) and two Adam moments, from the model's shapes; 0 for
  jobs that train nothing."""
  if not all(k in config for k in ('model', 'lora', 'optimizer')):
    return 0
  import jax  # pylint: disable=g-import-not-at-top
  from tunix_pw.train import plans, setup  # pylint: disable=g-import-not-at-top
  _, params, _ = setup.split(plans.abstract_model(config),
                             config.lora.rank > 0)
  return 3 * sum(math.prod(x.shape) * x.dtype.itemsize
                 for x in jax.tree.leaves(params))


def hosts(xpk_config: dict[str, Any], config: Any = None) -> int:
  """The job's hosts; given its run config, those holding the trained
  roles' devices, which write the checkpoints (a disaggregated layout
  leaves the rollout's hosts out)."""
  tpu = topology.parse(xpk_config['tpu_type'])
  devices = [types.SimpleNamespace(id=i, slice_index=i // tpu.chips)
             for i in range(tpu.chips * xpk_config['num_slices'])]
  selected = (meshes.select(config.meshes, devices)
              if config is not None and 'meshes' in config else {})
  trained = [d for role in TRAINED_ROLES for d in selected.get(role, [])]
  return len({d.id // CHIPS_PER_HOST for d in trained or devices})


def termination_grace(config: Any, xpk_config: dict[str, Any]) -> tuple[
    int, str]:
  """The xpk_config's grace, raised to what a checkpoint takes if short."""
  writers = hosts(xpk_config, config)
  size = checkpoint_bytes(config)
  needed = math.ceil(size / writers / WRITE_BYTES_PER_S) + GRACE_MARGIN_S
  grace = max(xpk_config['termination_grace_seconds'], needed)
  return grace, (f'{grace} s (a {size / 2**30:.1f} GiB checkpoint written by '
                 f'{writers} hosts needs about {needed} s)')


def job_flags(argv: list[str]) -> list[str]:
  """The flags of the run itself (config, overrides, workdir), verbatim."""
  out = []
  for i, arg in enumerate(argv[1:], 1):
    if re.match(r'^--(no)?(config|workdir)([.=]|$)', arg):
      out.append(arg)
      if arg in ('--config', '--workdir') and i + 1 < len(argv):
        out.append(argv[i + 1])  # the value, as a separate argument
  return out


def workload_name(config: Any) -> str:
  name = _WORKLOAD.value or 'tunix-{}-{}'.format(
      config.job, datetime.datetime.now().strftime('%m%d-%H%M%S'))
  if not _WORKLOAD_NAME.match(name):
    raise UsageError(f'--workload={name!r} must be lowercase letters, digits '
                     'and dashes, start with a letter, at most 40 characters.')
  return name


def xpk_command(xpk_config: dict[str, Any], workload: str, command: str,
                grace: int, manifest: str) -> list[str]:
  args = [_xpk_binary(), 'workload', MODES[xpk_config['mode']],
          f'--cluster={xpk_config["cluster"]}',
          f'--project={xpk_config["project"]}',
          f'--zone={xpk_config["zone"]}', f'--workload={workload}',
          f'--tpu-type={xpk_config["tpu_type"]}',
          f'--num-slices={xpk_config["num_slices"]}',
          f'--docker-image={xpk_config["image"]}',
          f'--priority={xpk_config["priority"]}',
          f'--max-restarts={xpk_config["max_restarts"]}',
          f'--termination-grace-period-seconds={grace}',
          f'--command={command}']
  args += [f'--env={k}={v}' for k, v in xpk_config['env'].items()]
  return args + ['--dry-run', f'--output-manifest-file={manifest}']


def _xpk_binary() -> str:
  beside = os.path.join(os.path.dirname(sys.executable), 'xpk')
  return beside if os.path.exists(beside) else 'xpk'


def fuse_buckets(args: list[str]) -> list[str]:
  """The buckets the run's flags reach through GCS FUSE (`/gcs/BUCKET/...`)."""
  return sorted({m.group(1) for arg in args
                 for m in re.finditer(r'(?:^|=)/gcs/([^/\s]+)', arg)})


def patch(manifest: str, xpk_config: dict[str, Any], grace: int,
          buckets: list[str]) -> None:
  """What XPK's rendering leaves out. Pathways JobSets get their restarts:
  the head pod (our controller) exiting 42 fails its job, which the JobSet
  recreates up to `max_restarts` times; any other failing exit code fails
  the JobSet. The pods that run `tunix_pw.main` (the Pathways head, or
  every multi-controller host) mount each bucket at /gcs/BUCKET with the
  GKE GCS FUSE CSI driver."""
  import yaml  # pylint: disable=g-import-not-at-top
  with open(manifest) as f:
    documents = list(yaml.safe_load_all(f))
  jobset = next(d for d in documents if d and d.get('kind') == 'JobSet')
  spec = jobset['spec']
  pathways = xpk_config['mode'] == 'pathways'
  job = next(j for j in spec['replicatedJobs'] if j['name'] == (
      'pathways-head' if pathways else 'slice-job'))['template']['spec']
  pod = job['template']
  if pathways:
    spec['failurePolicy'] = dict(
        spec.get('failurePolicy') or {}, maxRestarts=xpk_config['max_restarts'],
        rules=[{'action': 'FailJobSet',
                'onJobFailureReasons': ['PodFailurePolicy']}])
    job['podFailurePolicy'] = {'rules': [{
        'action': 'FailJob', 'onExitCodes': {
            'containerName': 'jax-tpu', 'operator': 'NotIn',
            'values': RESTART_CODES}}]}
    pod['spec']['terminationGracePeriodSeconds'] = grace
  if buckets:
    metadata = pod.setdefault('metadata', {})
    metadata['annotations'] = dict(metadata.get('annotations') or {},
                                   **{'gke-gcsfuse/volumes': 'true'})
    [container] = [c for c in pod['spec']['containers']
                   if c['name'] == 'jax-tpu']
    for bucket in buckets:
      name = 'gcs-' + re.sub(r'[^a-z0-9-]', '-', bucket.lower())[:59]
      pod['spec'].setdefault('volumes', []).append({
          'name': name, 'csi': {
              'driver': 'gcsfuse.csi.storage.gke.io',
              'volumeAttributes': {'bucketName': bucket,
                                   'mountOptions': 'implicit-dirs'}}})
      container.setdefault('volumeMounts', []).append(
          {'name': name, 'mountPath': f'/gcs/{bucket}'})
  with open(manifest, 'w') as f:
    yaml.safe_dump_all(documents, f, sort_keys=False)


def _run(args: list[str], what: str) -> None:
  result = subprocess.run(args, capture_output=True, text=True, check=False)
  if result.returncode:
    tail = (result.stdout + result.stderr).strip().splitlines()[-5:]
    raise UsageError(f'{what} failed (exit {result.returncode}): '
                     + ' | '.join(tail))


def launch(argv: list[str]) -> str:
  """Validates, renders (and unless --dry_run submits); returns the
  manifest's path."""
  xpk_config = load_xpk_config(_XPK_CONFIG.value)
  config = tunix_main.CONFIG.value
  with checks.limited(files=False):  # the files are in its image and mounts
    tunix_main.static_checks(config)
  if xpk_config['mode'] == 'mcjax':  # refused by a job's processes only
    for block in [config] + [config[s] for s in config.get('stages', ())]:
      if 'rl' in block:
        asynchronous.check_controllers(block, hosts(xpk_config))
  workdir = tunix_main.WORKDIR.value
  if not (workdir.startswith('gs://') or os.path.isabs(workdir)):
    raise UsageError(f'--workdir={workdir!r} must outlive the pods (restarts '
                     'resume from it): pass gs://BUCKET/run, or an absolute '
                     'path such as /gcs/BUCKET/run, which the pods mount '
                     'with GCS FUSE.')
  grace, grace_note = termination_grace(config, xpk_config)
  run_flags = job_flags(argv)
  if not any(f.startswith('--config.runtime.compilation_cache_dir')
             for f in run_flags):  # the pod's disk dies with it: restarts
    # (preemption, a new topology) read the programs back instead
    run_flags.append('--config.runtime.compilation_cache_dir=' + (
        workdir_lib.path(workdir, workdir_lib.COMPILATION_CACHE)))
  command = shlex.join(['python', '-m', 'tunix_pw.main'] + run_flags)
  workload = workload_name(config)
  manifest = _MANIFEST.value or os.path.join(
      tempfile.mkdtemp(prefix='tunix_pw_xpk_'), f'{workload}.yaml')
  _run(xpk_command(xpk_config, workload, command, grace, manifest),
       'xpk (rendering the manifest)')
  buckets = fuse_buckets(run_flags)
  patch(manifest, xpk_config, grace, buckets)
  print(f'{workload}: {xpk_config["num_slices"]} x {xpk_config["tpu_type"]} '
        f'({xpk_config["mode"]}), termination grace {grace_note}\n'
        f'  command: {command}'
        + ''.join(f'\n  mounts gs://{b} at /gcs/{b} (GCS FUSE)'
                  for b in buckets), flush=True)
  if not _DRY_RUN.value:
    _run(['gcloud', 'container', 'clusters', 'get-credentials',
          xpk_config['cluster'], f'--project={xpk_config["project"]}',
          f'--location={xpk_config["zone"]}'], 'gcloud get-credentials')
    _run(['kubectl', 'apply', '-f', manifest], 'kubectl apply')
    print(f'submitted; follow it with: kubectl get jobset {workload}')
  print(f'manifest: {manifest}', flush=True)
  return manifest


def _main(argv: list[str]) -> None:
  try:
    launch(sys.argv)
  except UsageError as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    sys.exit(tunix_main.EXIT_USAGE)
  del argv


if __name__ == '__main__':
  app.run(_main, flags_parser=tunix_main.parse_flags)
