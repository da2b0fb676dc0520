"""Fault injection for `benchmarks/faults.py`, inside the processes it
starts (by hand or through launch/local.py): with this folder first on
PYTHONPATH, Python imports this module at start-up. TUNIX_PW_FAULT, a JSON
object, names a phase of a job, which call of it fails, and how:

  {"phase": "rollout", "call": 3, "signal": "SIGTERM"}    at its entry
  {"phase": "save", "call": 2, "signal": "SIGKILL", "after": true,
   "delay_s": 0.01}                                       mid-write
  {"phase": "save", "call": 3, "fill": "/mnt/filler"}     the disk fills
  {"phase": "sync", "call": 2, "signal": "SIGSTOP", "process": 1}

`process` limits the fault to the process of that JOB_COMPLETION_INDEX
(launch/local.py's children). Each fault first prints `fault: ... at T` (T:
Unix time) to stderr. A process without TUNIX_PW_FAULT is left alone.
"""

import functools
import importlib
import json
import os
import signal
import sys
import threading
import time

# phase -> (module, class or None, function): where the phase begins.
PHASES = {
    'rollout': ('tunix_pw.rl.trainer', None, 'rollout_stages'),
    'logps': ('tunix_pw.rl.trainer', None, 'log_probs'),
    'update': ('tunix_pw.rl.trainer', None, 'update_policy'),
    'sync': ('tunix_pw.sampling.sampler', 'Sampler', 'update_weights'),
    'eval': ('tunix_pw.train.evaluate', None, 'exact_match'),
    'save': ('tunix_pw.train.checkpoint', 'Checkpointer', 'save'),
    'step': ('tunix_pw.train.loop', 'Tracker', 'add'),  # SFT, DPO
}
SPARE_BYTES = 1 << 20  # left free by "fill": metrics still fit, a checkpoint not


def fill(path: str) -> None:
  """A file at `path` that takes all but SPARE_BYTES of its filesystem."""
  stat = os.statvfs(os.path.dirname(path))
  size = max(stat.f_bavail * stat.f_frsize - SPARE_BYTES, 1)
  fd = os.open(path, os.O_CREAT | os.O_WRONLY)
  try:
    os.posix_fallocate(fd, 0, size)
  finally:
    os.close(fd)


def strike(fault: dict, what: str) -> None:
  print(f'fault: {what} at {time.time():.3f}', file=sys.stderr, flush=True)
  if 'fill' in fault:
    fill(fault['fill'])
  else:
    time.sleep(fault.get('delay_s', 0.0))
    os.kill(os.getpid(), getattr(signal, fault['signal']))


def install(fault: dict) -> None:
  module_name, class_name, name = PHASES[fault['phase']]
  owner = importlib.import_module(module_name)
  if class_name:
    owner = getattr(owner, class_name)
  original, calls, lock = getattr(owner, name), [0], threading.Lock()
  what = (f'{fault.get("signal", "disk full")} in {fault["phase"]} '
          f'(call {fault["call"]})')

  @functools.wraps(original)
  def faulty(*args, **kwargs):
    with lock:
      calls[0] += 1
      now = calls[0] == fault['call']
    if now and not fault.get('after'):
      strike(fault, what)
    result = original(*args, **kwargs)
    if now and fault.get('after'):
      strike(fault, what)
    return result

  setattr(owner, name, faulty)


def main() -> None:
  raw = os.environ.get('TUNIX_PW_FAULT')
  if not raw:
    return
  fault = json.loads(raw)
  if 'process' in fault and os.environ.get('JOB_COMPLETION_INDEX') != str(
      fault['process']):
    return  # another process of the job, or the launcher
  install(fault)


main()
