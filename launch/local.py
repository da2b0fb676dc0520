r"""Runs a tunix_pw job as N controller processes on this machine.

  python launch/local.py --num_processes=2 -- \
      --config=tunix_pw/configs/smoke.py --workdir=/tmp/smoke2

Each process gets exactly the environment a GKE/XPK JobSet gives a CPU pod
(JAX_COORDINATOR_ADDRESS, JAX_PROCESS_COUNT, PROCESSES_IN_JOB, JOB_INDEX,
JOB_COMPLETION_INDEX), so the multi-controller backend runs unchanged. Logs
stream with a `[pN]` prefix. SIGTERM/SIGINT are forwarded to every process.
When a process fails, the others are stopped and the launcher exits with that
process's code; exit 42 (preempted after a checkpoint) waits for the others,
which agreed on the same stop. With `--restarts=N`, a failed run is started
again up to N times on the survivors (one process fewer each time, each
keeping its share of `--config.runtime.host_device_count`): the job resumes
from its last checkpoint on the smaller topology.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

PREEMPTED = 42
STOP_GRACE_SECONDS = 10.0
# After a stop is asked for (SIGTERM, or one process exiting 42), how long
# the processes get to checkpoint and exit before they are killed.
PREEMPT_WAIT_SECONDS = 120.0


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def process_env(index: int, count: int, port: int) -> dict[str, str]:
  """The JobSet variables for process `index` of `count` (one job)."""
  return {
      'JAX_COORDINATOR_ADDRESS': f'localhost:{port}',
      'JAX_PROCESS_COUNT': str(count),
      'PROCESSES_IN_JOB': str(count),
      'JOB_INDEX': '0',
      'JOB_COMPLETION_INDEX': str(index),
  }


def _stream(index: int, pipe) -> None:
  for line in iter(pipe.readline, b''):
    sys.stdout.write(f'[p{index}] {line.decode(errors="replace")}')
    sys.stdout.flush()


def _stop(procs: list[subprocess.Popen]) -> None:
  """SIGTERM the live processes, then SIGKILL what outlives the grace."""
  for p in procs:
    if p.poll() is None:
      p.send_signal(signal.SIGTERM)
  deadline = time.monotonic() + STOP_GRACE_SECONDS
  for p in procs:
    try:
      p.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()


def launch(num_processes: int, job_args: list[str], restarts: int = 0) -> int:
  """The job on `num_processes` processes; after a failure, again on the
  survivors, `restarts` times at most."""
  code = run_once(num_processes, job_args)
  while code not in (0, PREEMPTED) and restarts and num_processes > 1:
    restarts -= 1
    job_args = _with_devices_per_process(job_args, num_processes,
                                         num_processes - 1)
    num_processes -= 1
    print(f'[launch] restarting on the {num_processes} surviving '
          f'process(es)', flush=True)
    code = run_once(num_processes, job_args)
  return code


def _with_devices_per_process(job_args: list[str], before: int,
                              after: int) -> list[str]:
  """The job's virtual CPU device count (a total) scaled with its process
  count, so that each survivor keeps its own devices, as hosts do."""
  flag = '--config.runtime.host_device_count='
  return [f'{flag}{int(a[len(flag):]) * after // before}'
          if a.startswith(flag) else a for a in job_args]


def run_once(num_processes: int, job_args: list[str]) -> int:
  port = free_port()
  procs = []
  for i in range(num_processes):
    env = {**os.environ, **process_env(i, num_processes, port)}
    procs.append(subprocess.Popen(
        [sys.executable, '-m', 'tunix_pw.main', *job_args], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
  streams = [threading.Thread(target=_stream, args=(i, p.stdout), daemon=True)
             for i, p in enumerate(procs)]
  for t in streams:
    t.start()

  stopping_since = []  # when a SIGTERM/SIGINT or an exit 42 asked for a stop

  def forward(signum, _):
    stopping_since.append(time.monotonic())
    for p in procs:
      if p.poll() is None:
        p.send_signal(signal.SIGTERM if signum == signal.SIGINT else signum)

  signal.signal(signal.SIGTERM, forward)
  signal.signal(signal.SIGINT, forward)

  code = 0
  while any(p.poll() is None for p in procs):
    failed = [p for p in procs if p.poll() not in (None, 0, PREEMPTED)]
    if not stopping_since and any(p.poll() == PREEMPTED for p in procs):
      stopping_since.append(time.monotonic())
    late = (stopping_since and
            time.monotonic() - stopping_since[0] > PREEMPT_WAIT_SECONDS)
    if failed or late:
      code = _exit_code(failed[0].returncode) if failed else PREEMPTED
      culprit = (f'process {procs.index(failed[0])} exited with {code}'
                 if failed else 'the processes did not stop in time')
      print(f'[launch] {culprit}; stopping the others', flush=True)
      _stop(procs)
      break
    time.sleep(0.1)
  for t in streams:
    t.join()
  print(f'[launch] exit codes: {[_exit_code(p.returncode) for p in procs]}',
        flush=True)
  return code or next((_exit_code(p.returncode) for p in procs
                       if p.returncode), 0)


def _exit_code(returncode: int) -> int:
  """A child's return code as a shell exit status (signal N -> 128 + N)."""
  return 128 - returncode if returncode < 0 else returncode


def main() -> None:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--num_processes', type=int, default=2)
  parser.add_argument('--restarts', type=int, default=0,
                      help='after a failure, start again on the survivors '
                      '(one process fewer) up to this many times')
  parser.add_argument('job_args', nargs=argparse.REMAINDER,
                      help='-- then the arguments of tunix_pw.main')
  args = parser.parse_args()
  job_args = args.job_args[1:] if args.job_args[:1] == ['--'] else args.job_args
  if args.num_processes < 1:
    parser.error('--num_processes must be at least 1')
  if args.restarts < 0:
    parser.error('--restarts must be at least 0')
  sys.exit(launch(args.num_processes, job_args, args.restarts))


if __name__ == '__main__':
  main()
