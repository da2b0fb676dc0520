"""Runs untrusted Python (a model's code) in a real sandbox: Debian's
bubblewrap, started under an unprivileged user.

These machines run as root, and a root bwrap keeps its capabilities (a
remount to read-write works), so the sandbox starts through `setpriv` as
nobody (65534) with no groups. Inside: a read-only root, a private /tmp,
/dev and /proc of its own, no network and no other namespace shared, all
capabilities dropped, killed with its parent. Outside, rlimits (set by
util-linux's prlimit, not in a forked Python child) bound its
CPU time, address space, file size (stdout and stderr are files, so an
output flood stops there) and process count, and a wall clock kills its
whole process group; the output comes back truncated.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
import time

from tunix_pw.errors import UsageError

NOBODY = 65534
TOOLS = ('bwrap', 'setpriv', 'prlimit')
# The interpreter inside: the system's, which nobody can run (a venv's may
# live under a home that only root can read).
PYTHON = '/usr/bin/python3'


@dataclasses.dataclass(frozen=True)
class Limits:
  cpu_s: int = 5  # CPU seconds (SIGXCPU, then SIGKILL)
  wall_s: float = 10.0  # the whole process group is killed after this
  memory_mb: int = 1024  # address space
  file_mb: int = 8  # any file written, stdout and stderr included
  processes: int = 32  # processes and threads of the sandbox's user
  output_bytes: int = 16 * 1024  # of stdout and of stderr kept


@dataclasses.dataclass(frozen=True)
class Result:
  returncode: int  # negative: killed by that signal
  stdout: str
  stderr: str
  timed_out: bool  # the wall clock ran out
  truncated: bool  # some output was cut at `output_bytes`
  seconds: float

  @property
  def ok(self) -> bool:
    return self.returncode == 0 and not self.timed_out

  @property
  def killed(self) -> bool:
    """Stopped at a limit: the wall clock, or a signal such as CPU
    time's or memory's (bwrap exits with 128 + its child's signal)."""
    return self.timed_out or not 0 <= self.returncode <= 128


def check_available() -> None:
  """A config error (one sentence) when the sandbox cannot start here."""
  missing = [t for t in TOOLS if shutil.which(t) is None] + (
      [] if os.access(PYTHON, os.X_OK) else [PYTHON])
  if missing:
    raise UsageError(
        f'the code sandbox needs {" and ".join(missing)}, not found; '
        'install them with apt-get install bubblewrap util-linux python3.')


def command(argv: list[str], limits: Limits = Limits()) -> list[str]:
  """`argv` wrapped: prlimit's rlimits (inherited by all it starts), setpriv
  to nobody, then bwrap's namespaces. (No preexec_fn: forking a
  multithreaded process, as JAX's is, to run Python in the child can
  deadlock.)"""
  mb = 1024 * 1024
  return ['prlimit', f'--cpu={limits.cpu_s}',
          f'--as={limits.memory_mb * mb}', f'--fsize={limits.file_mb * mb}',
          f'--nproc={limits.processes}', '--core=0',
          'setpriv', f'--reuid={NOBODY}', f'--regid={NOBODY}',
          '--clear-groups', 'bwrap', '--ro-bind', '/', '/', '--dev', '/dev',
          '--proc', '/proc', '--tmpfs', '/tmp', '--chdir', '/tmp',
          '--unshare-all', '--die-with-parent', '--new-session',
          # No bwrap init inside: its exits outlive the outer bwrap as
          # zombies that a lazy PID 1 leaves to count against the process
          # limit (30 runs exhausted it).
          '--as-pid-1',
          '--cap-drop', 'ALL', '--setenv', 'HOME', '/tmp', *argv]


def _read(f, limit: int) -> tuple[str, bool]:
  f.seek(0)
  data = f.read(limit + 1)
  return data[:limit].decode(errors='replace'), len(data) > limit


def run_python(code: str, stdin: str = '', limits: Limits = Limits(),
               python: str = PYTHON) -> Result:
  """Runs `code` with `python -I` in the sandbox; never raises for what the
  code does (crashes, limits and timeouts come back in the Result)."""
  check_available()
  start = time.monotonic()
  with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
    proc = subprocess.Popen(
        command([python, '-I', '-c', code], limits), stdin=subprocess.PIPE,
        stdout=out, stderr=err, start_new_session=True)
    timed_out = False
    try:
      proc.communicate(stdin.encode(), timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
      timed_out = True
    finally:
      try:  # the whole group: setpriv, bwrap and (through it) the sandbox
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      proc.wait()
    stdout, cut_out = _read(out, limits.output_bytes)
    stderr, cut_err = _read(err, limits.output_bytes)
  return Result(proc.returncode, stdout, stderr, timed_out,
                cut_out or cut_err, time.monotonic() - start)
