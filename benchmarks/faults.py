r"""The fault campaign: how SFT, DPO and GRPO runs come through faults.

  python benchmarks/faults.py            # the full campaign (~45 min here)
  python benchmarks/faults.py --faults=kill,disk --jobs=sft --kill_trials=2

Every trial starts the job through `main` in fresh processes, as XPK does,
injects one fault (`benchmarks/inject/sitecustomize.py` for the faults that
hit a chosen phase) and checks the outcome on disk:
- kill: SIGKILL at a random moment of the run (half the trials), or just
  after an asynchronous checkpoint write began (the other half); the same
  command resumes, and the final parameters equal an uninterrupted run's bit
  for bit.
- term: SIGTERM at the entry of a random call of each phase (GRPO: rollout,
  log-probs, update, weight sync, evaluation, checkpoint save; SFT and DPO:
  a step, a save): exit 42 within GKE's 30 s grace period; the resume is
  bit-identical.
- disk: the disk fills up as a checkpoint is written (a tmpfs in a private
  mount namespace, `unshare -m`): exit 1 with one error line, the complete
  checkpoints before it all restore, and with space again the same command
  resumes, bit-identical.
- peer: one controller of a 2-process run (launch/local.py) SIGKILLed or
  SIGSTOPped at the entry of a random call of each phase: the launcher exits
  non-zero within 60 s, leaves no process behind, and every complete
  checkpoint restores.

Prints a line per trial, the table (fault x job: trials, outcomes) and one
JSON line; exits 1 when any trial failed.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import functools
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top,wrong-import-position
import psutil  # pylint: disable=g-import-not-at-top,wrong-import-position

from tests import helpers  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.train import checkpoint, metrics  # pylint: disable=g-import-not-at-top,wrong-import-position

INJECT = os.path.join(ROOT, 'benchmarks', 'inject')
GRACE_S = 30.0  # GKE's default terminationGracePeriodSeconds
PEER_LIMIT_S = 60.0
# Each job small and complete: checkpoints every `every` of `steps` steps.
JOBS = {
    'sft': dict(steps=20, every=5, args=[
        '--config=tunix_pw/configs/sft.py:runlocal', '--config.log_every=5',
        '--config.eval_examples=0']),
    'dpo': dict(steps=20, every=5, args=[
        '--config=tunix_pw/configs/dpo.py:runlocal', '--config.log_every=5',
        '--config.eval_batch_size=50']),
    'grpo': dict(steps=6, every=2, evals=4, args=[
        '--config=tunix_pw/configs/grpo.py:runlocal', '--config.eval_every=2',
        '--config.eval_examples=16', '--config.eval_batch_size=16']),
}
PHASES = {'sft': ('step', 'save'), 'dpo': ('step', 'save'),
          'grpo': ('rollout', 'logps', 'update', 'sync', 'eval', 'save')}


def placement(job: str, processes: int) -> list[str]:
  """Mesh flags: SFT and DPO on one device per process, GRPO as runlocal
  (the actor and the rollout on 4 devices each) or, over 2 processes,
  collocated on all 8 (a disaggregated actor would live on one process).
  A stopped peer is noticed after 10 s."""
  if job == 'grpo':
    flags = helpers.GRPO_COLLOCATED if processes > 1 else []
  else:
    flags = [f'--config.runtime.host_device_count={processes}',
             f'--config.meshes.actor.axes=fsdp={processes}']
    if job == 'dpo':
      flags.append(f'--config.meshes.reference.axes=fsdp={processes}')
  return flags + (['--config.runtime.peer_timeout_s=10'] if processes > 1
                  else [])


def command(job: str, workdir: str, processes: int = 1) -> list[str]:
  spec = JOBS[job]
  return [*spec['args'], *placement(job, processes),
          f'--config.steps={spec["steps"]}',
          f'--config.checkpoint.every={spec["every"]}', f'--workdir={workdir}']


def calls(job: str, phase: str) -> int:
  """How many times a run calls the phase (the fault picks one)."""
  spec = JOBS[job]
  if phase == 'save':
    return spec['steps'] // spec['every']
  if phase == 'eval':
    return spec['evals']
  return spec['steps']


def env(fault: dict | None = None) -> dict[str, str]:
  out = helpers.env(PYTHONPATH=f'{INJECT}:{ROOT}')
  if fault:
    out['TUNIX_PW_FAULT'] = json.dumps(fault)
  return out


def main_command(job: str, workdir: str) -> list[str]:
  return [sys.executable, '-m', 'tunix_pw.main', *command(job, workdir)]


def run(job: str, workdir: str, fault: dict | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess:
  return subprocess.run(main_command(job, workdir), cwd=ROOT, env=env(fault),
                        capture_output=True, text=True, timeout=timeout)


_RESTORE = threading.Lock()  # Orbax restores one at a time in this process


def final_params(workdir: str, step: int) -> list[np.ndarray]:
  """A checkpoint's train state on this process's first device, whatever
  topology wrote it."""
  path = os.path.join(workdir, 'checkpoints', str(step), 'state')
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  with _RESTORE:
    checkpointer = ocp.StandardCheckpointer()
    target = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one),
        checkpointer.metadata(path).item_metadata)
    return [np.asarray(x) for x in jax.tree.leaves(
        checkpointer.restore(path, target))]


def unreadable(workdir: str) -> list[str]:
  """The complete checkpoints of `workdir` that do not restore, and a
  metrics file that does not read."""
  bad = []
  for step in checkpoint.complete_steps(workdir):
    try:
      final_params(workdir, step)
    except Exception as e:  # pylint: disable=broad-exception-caught
      bad.append(f'checkpoint {step}: {type(e).__name__}')
  if os.path.exists(os.path.join(workdir, 'metrics.jsonl')):
    try:
      metrics.read(workdir)
    except ValueError as e:
      bad.append(f'metrics.jsonl: {e}')
  return bad


class Campaign:
  """The uninterrupted runs (one per job, made once) and the trials."""

  def __init__(self, root: str):
    self.root = root
    self._straight, self._lock = {}, threading.Lock()
    self._locks = collections.defaultdict(threading.Lock)
    self._count = collections.Counter()

  def workdir(self, name: str) -> str:
    with self._lock:
      self._count[name] += 1
      path = os.path.join(self.root, f'{name}-{self._count[name]}')
    os.makedirs(path)
    return path

  def straight(self, job: str) -> tuple[list[np.ndarray], float]:
    """The uninterrupted run's final parameters and its wall time."""
    with self._locks[job]:
      if job not in self._straight:
        workdir = os.path.join(self.root, f'{job}-straight')
        start = time.monotonic()
        result = run(job, workdir)
        if result.returncode:
          raise RuntimeError(f'the uninterrupted {job} run failed: '
                             f'{result.stderr[-2000:]}')
        self._straight[job] = (final_params(workdir, JOBS[job]['steps']),
                               time.monotonic() - start)
      return self._straight[job]

  def resumed_equal(self, job: str, workdir: str) -> str:
    """'' when the same command resumes `workdir` and ends with the
    uninterrupted run's parameters, bit for bit; else what went wrong."""
    result = run(job, workdir)
    if result.returncode:
      return (f'the resume exited {result.returncode}: '
              f'{result.stderr.strip().splitlines()[-1:]}')
    got = final_params(workdir, JOBS[job]['steps'])
    want, _ = self.straight(job)
    if len(got) != len(want) or any(
        a.shape != b.shape or not np.array_equal(a, b)
        for a, b in zip(got, want)):
      return 'the resumed parameters differ from the uninterrupted run'
    return ''

  # The trials: each returns a row (job, fault, where, outcome, details).

  def kill(self, job: str, save: int, delay_s: float, share: float) -> dict:
    """SIGKILL `delay_s` after save call `save` began (0: `share` of the
    uninterrupted run's time after the start)."""
    _, seconds = self.straight(job)
    workdir = self.workdir(f'{job}-kill')
    if save:
      fault = dict(phase='save', call=save, signal='SIGKILL', after=True,
                   delay_s=delay_s)
      where = f'mid-write of save {save} (+{delay_s} s)'
      killed = run(job, workdir, fault)
    else:
      delay = share * seconds
      where = f'random, {delay:.1f} s in'
      proc = subprocess.Popen(main_command(job, workdir), cwd=ROOT, env=env(),
                              stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
      time.sleep(delay)
      proc.send_signal(signal.SIGKILL)
      _, stderr = proc.communicate()
      killed = subprocess.CompletedProcess([], proc.returncode, '', stderr)
    ckpts = os.path.join(workdir, 'checkpoints')
    torn = os.path.isdir(ckpts) and any('tmp' in n for n in os.listdir(ckpts))
    details = dict(killed_rc=killed.returncode, left_a_partial_write=torn,
                   complete_before=checkpoint.complete_steps(workdir))
    if killed.returncode != -signal.SIGKILL:
      return self.row(job, 'kill', where, 'the run was not killed '
                      f'(exit {killed.returncode})', details)
    return self.row(job, 'kill', where, self.resumed_equal(job, workdir),
                    details)

  def term(self, job: str, phase: str, call: int) -> dict:
    self.straight(job)
    workdir = self.workdir(f'{job}-term')
    stopped = run(job, workdir, dict(phase=phase, call=call,
                                     signal='SIGTERM'))
    ended = time.time()
    where = f'{phase}, call {call}'
    sent = fault_time(stopped.stderr)
    details = dict(exit_s=round(ended - sent, 2) if sent else None)
    if stopped.returncode != 42 or sent is None:
      problem = (f'exited {stopped.returncode}, not 42' if sent else
                 f'the fault never fired (exit {stopped.returncode})')
      return self.row(job, 'term', where, problem, details)
    if ended - sent > GRACE_S:
      return self.row(job, 'term', where, f'exit 42 took {ended - sent:.1f} '
                      f's, over the {GRACE_S:.0f} s grace', details)
    return self.row(job, 'term', where, self.resumed_equal(job, workdir),
                    details)

  def disk(self, job: str, save: int) -> dict:
    """The job on a 64 MiB tmpfs that fills up as save call `save` begins;
    then, with the filler gone, the same command again."""
    self.straight(job)
    trial = self.workdir(f'{job}-disk')
    mount = os.path.join(trial, 'disk')
    workdir, filler = os.path.join(mount, 'w'), os.path.join(mount, 'filler')
    main = ' '.join(map(shlex.quote, main_command(job, workdir)))
    fault = shlex.quote(json.dumps(dict(phase='save', call=save, fill=filler)))
    script = ' && '.join([
        f'mkdir -p {mount}', f'mount -t tmpfs -o size=64m tmpfs {mount}',
        f'(TUNIX_PW_FAULT={fault} {main} > {trial}/full.out '
        f'2> {trial}/full.err; echo $? > {trial}/full.rc)',
        f'cp -r {workdir} {trial}/after_fault', f'rm {filler}',
        f'({main} > {trial}/again.out 2> {trial}/again.err; '
        f'echo $? > {trial}/again.rc)', f'cp -r {workdir} {trial}/resumed'])
    done = subprocess.run(['unshare', '-m', '--propagation', 'private', 'sh',
                           '-c', script], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=900)
    where = f'save {save}'
    if done.returncode:
      return self.row(job, 'disk', where, f'the trial did not run: '
                      f'{done.stderr.strip()[-300:]}', {})
    read = lambda name: open(os.path.join(trial, name)).read()
    errors = helpers.error_lines(read('full.err'))
    after = os.path.join(trial, 'after_fault')
    details = dict(exit=int(read('full.rc')), error=errors[-1:],
                   complete_before=checkpoint.complete_steps(after))
    problem = ''
    if details['exit'] != 1 or len(errors) != 1 or 'is full' not in errors[0]:
      problem = 'no one-line disk-full error with exit 1'
    elif bad := unreadable(after):
      problem = f'unreadable after the fault: {bad}'
    elif int(read('again.rc')):
      problem = f'the resume exited {read("again.rc").strip()}'
    else:
      got = final_params(os.path.join(trial, 'resumed'), JOBS[job]['steps'])
      want, _ = self.straight(job)
      if any(not np.array_equal(a, b) for a, b in zip(got, want)):
        problem = 'the resumed parameters differ from the uninterrupted run'
    shutil.rmtree(os.path.join(trial, 'resumed'), ignore_errors=True)
    return self.row(job, 'disk', where, problem, details)

  def peer(self, job: str, phase: str, signame: str, call: int) -> dict:
    workdir = self.workdir(f'{job}-peer')
    fault = dict(phase=phase, call=call, signal=signame, process=1)
    launcher = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, 'launch', 'local.py'),
         '--num_processes=2', '--', *command(job, workdir, processes=2)],
        cwd=ROOT, env=env(fault), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
      output, _ = launcher.communicate(timeout=600)
    except subprocess.TimeoutExpired:
      for child in psutil.Process(launcher.pid).children(recursive=True):
        child.kill()
      launcher.kill()
      output, _ = launcher.communicate()
    ended = time.time()
    where = f'{phase}, call {call}, {signame}'
    sent = fault_time(output)
    details = dict(exit=launcher.returncode,
                   exit_s=round(ended - sent, 2) if sent else None)
    left = [p.pid for p in psutil.process_iter(['cmdline'])
            if workdir in ' '.join(p.info['cmdline'] or [])]
    for pid in left:
      os.kill(pid, signal.SIGKILL)
    if sent is None:
      problem = f'the fault never fired (exit {launcher.returncode})'
    elif launcher.returncode in (0, 42):
      problem = f'the launcher exited {launcher.returncode}'
    elif ended - sent > PEER_LIMIT_S:
      problem = f'the launcher took {ended - sent:.1f} s'
    elif left:
      problem = f'processes left behind: {left}'
    else:
      problem = '; '.join(unreadable(workdir))
    return self.row(job, 'peer', where, problem, details)

  @staticmethod
  def row(job: str, fault: str, where: str, problem: str,
          details: dict) -> dict:
    out = dict(job=job, fault=fault, where=where,
               outcome=problem or 'ok', **details)
    print(json.dumps(out), flush=True)
    return out


def fault_time(output: str) -> float | None:
  """When the injected fault struck (its `fault: ... at T` line)."""
  for line in output.splitlines():
    if 'fault: ' in line and ' at ' in line:
      return float(line.rsplit(' at ', 1)[1])
  return None


OUTCOMES = {  # what a trial of each fault that passed showed
    'kill': 'resumed, bit-identical',
    'term': 'exit 42 in the grace, resumed, bit-identical',
    'disk': 'exit 1 + one line, checkpoints intact, resumed, bit-identical',
    'peer': 'launcher non-zero < 60 s, nothing left, checkpoints intact',
}


def table(rows: list[dict]) -> str:
  """Markdown: fault x job, trials and outcomes."""
  lines = ['| fault | job | trials | outcome | failed |',
           '| --- | --- | --- | --- | --- |']
  for (fault, job), group in sorted(groups(rows).items()):
    failed = sum(r['outcome'] != 'ok' for r in group)
    lines.append(f'| {fault} | {job} | {len(group)} | {OUTCOMES[fault]} | '
                 f'{failed} |')
  return '\n'.join(lines)


def groups(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
  out = collections.defaultdict(list)
  for r in rows:
    out[r['fault'], r['job']].append(r)
  return out


def plan(campaign: Campaign, rng: random.Random, faults: list[str],
         jobs: list[str], kill_trials: int, term_trials: int,
         disk_trials: int):
  """The trials, as calls to make, their random choices drawn here (in
  order, so that a seed gives the same campaign however threads run)."""
  for job in jobs:
    pick = lambda phase: rng.randint(1, calls(job, phase))  # pylint: disable=cell-var-from-loop
    saves = calls(job, 'save')
    if 'kill' in faults:  # mid-write (one save is left to do) or at random
      for i in range(kill_trials):
        yield functools.partial(
            campaign.kill, job, rng.randrange(1, saves) if i % 2 else 0,
            round(rng.uniform(0, 0.05), 3), rng.uniform(0, 0.8))
    if 'term' in faults:
      for phase in PHASES[job]:
        for _ in range(term_trials):
          yield functools.partial(campaign.term, job, phase, pick(phase))
    if 'disk' in faults:
      for _ in range(disk_trials):
        yield functools.partial(campaign.disk, job, rng.randrange(1, saves))
    if 'peer' in faults:
      for phase in PHASES[job]:
        for signame in ('SIGKILL', 'SIGSTOP'):
          yield functools.partial(campaign.peer, job, phase, signame,
                                  pick(phase))


def main() -> None:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--faults', default='kill,term,disk,peer')
  parser.add_argument('--jobs', default='sft,dpo,grpo')
  parser.add_argument('--kill_trials', type=int, default=20)
  parser.add_argument('--term_trials', type=int, default=2,
                      help='per phase')
  parser.add_argument('--disk_trials', type=int, default=2)
  parser.add_argument('--workers', type=int, default=2,
                      help='trials at once (one per core)')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--keep', action='store_true',
                      help='keep the trials\' workdirs')
  args = parser.parse_args()
  faults, jobs = args.faults.split(','), args.jobs.split(',')
  root = tempfile.mkdtemp(prefix='tunix_pw_faults_')
  campaign = Campaign(root)
  start = time.monotonic()
  trials = list(plan(campaign, random.Random(args.seed), faults, jobs,
                     args.kill_trials, args.term_trials, args.disk_trials))
  with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
    list(pool.map(campaign.straight, jobs))  # the references first
    rows = list(pool.map(lambda trial: trial(), trials))
  if not args.keep:
    shutil.rmtree(root, ignore_errors=True)
  failed = [r for r in rows if r['outcome'] != 'ok']
  print(table(rows))
  print(json.dumps(dict(
      benchmark='faults', trials=len(rows), failed=len(failed),
      minutes=round((time.monotonic() - start) / 60, 1),
      per_fault_and_job={f'{f}/{j}': len(g) for (f, j), g in
                         sorted(groups(rows).items())},
      failures=failed)))
  sys.exit(1 if failed else 0)


if __name__ == '__main__':
  main()
