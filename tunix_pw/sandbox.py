"""Runs untrusted Python (a model's code) in a real sandbox: Debian's
bubblewrap, started as an unprivileged user of its own.

What a run gets:
- **Its own uid.** These machines run as root, and a root bwrap keeps its
  capabilities, so each run starts through `setpriv` as one of `SLOTS`
  unprivileged uids that no account uses (`UID_BASE` on), held for the run
  by a lock file that every process on the host takes (`LOCKS`). The
  process limit (RLIMIT_NPROC) counts per uid, so one run's fork bomb
  cannot starve another run, here or in another job process.
- **A total memory cap.** A memory cgroup per slot (v1 `memory`, or v2's
  `memory.max` where the job's cgroup delegates it) holds every process of
  the run and its /tmp: a forking memory bomb ends at the cap, not at
  `processes` times a per-process limit. Without a writable cgroup file
  system (a container that is not privileged) the sandbox does not start:
  `check_available` says so in one sentence, and `--check_only` with it.
- **Nothing of the host's but the interpreter.** An empty environment
  (PATH, HOME, LANG only); read-only binds of /usr, the /bin and /lib
  links and the few /etc files the loader reads; not /root, /home, the
  host's /tmp, the project, the data or a venv. A private /tmp capped at
  `tmp_mb` (ENOSPC past it), /dev and /proc of its own, no network and no
  other namespace shared, all capabilities dropped, killed with its parent.
- **Limits.** rlimits set by util-linux's prlimit (not in a forked Python
  child) bound CPU time, address space, file size (stdout and stderr are
  files, so an output flood stops there) and processes; a wall clock kills
  the whole process group; the output comes back truncated.

What it does not promise: the kernel is shared (a kernel exploit escapes
any namespace sandbox), CPU time is limited per process but not shared out
between concurrent runs, and a run waits for a free slot when `SLOTS` runs
are in flight. A run that cannot start (bwrap or a cgroup failing) comes
back with `started=False`: the infrastructure failed, not the code.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time

from tunix_pw.errors import UsageError

TOOLS = ('bwrap', 'setpriv', 'prlimit')
# The interpreter inside: the system's, which any uid can run (a venv's may
# live under a home that only root can read, and is not bound).
PYTHON = '/usr/bin/python3'
SLOTS = 64  # concurrent runs on a host; more wait for a free slot
UID_BASE = 0x5A000000  # slot i runs as uid (and gid) UID_BASE + i
LOCKS = '/tmp/tunix_pw_sandbox'  # a lock file per slot, shared by processes
_SYSTEM = ('/usr', '/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32')
_ETC = ('/etc/ld.so.cache', '/etc/ld.so.conf', '/etc/ld.so.conf.d',
        '/etc/alternatives', '/etc/localtime')
_CGROUP = 'tunix_pw_sandbox'


@dataclasses.dataclass(frozen=True)
class Limits:
  cpu_s: int = 5  # CPU seconds per process (SIGXCPU, then SIGKILL)
  wall_s: float = 10.0  # the whole process group is killed after this
  memory_mb: int = 1024  # the run's total: all its processes and its /tmp
  tmp_mb: int = 64  # its private /tmp
  file_mb: int = 8  # any file written, stdout and stderr included
  processes: int = 32  # processes and threads of the run (its own uid)
  output_bytes: int = 16 * 1024  # of stdout and of stderr kept


@dataclasses.dataclass(frozen=True)
class Result:
  returncode: int  # negative: killed by that signal
  stdout: str
  stderr: str
  timed_out: bool  # the wall clock ran out
  truncated: bool  # some output was cut at `output_bytes`
  seconds: float
  started: bool = True  # False: the sandbox itself failed to start
  memory_peak_mb: float = 0.0  # the run's cgroup at its highest

  @property
  def ok(self) -> bool:
    return self.started and self.returncode == 0 and not self.timed_out

  @property
  def killed(self) -> bool:
    """Stopped at a limit: the wall clock, or a signal such as CPU
    time's or memory's (bwrap exits with 128 + its child's signal)."""
    return self.started and (self.timed_out or
                             not 0 <= self.returncode <= 128)


def _memory_root() -> tuple[str, int] | None:
  """(the directory of this process's memory cgroup, the cgroup version),
  or None when there is no memory controller to use."""
  with open('/proc/self/cgroup') as f:
    lines = [line.rstrip('\n').split(':', 2) for line in f]
  for _, controllers, path in lines:
    if 'memory' in controllers.split(',') and os.path.isdir(
        '/sys/fs/cgroup/memory'):
      return f'/sys/fs/cgroup/memory{path}', 1
  unified = '/sys/fs/cgroup/cgroup.controllers'
  for number, controllers, path in lines:
    if number == '0' and os.path.exists(unified):
      with open(unified) as f:
        if 'memory' in f.read().split():
          return f'/sys/fs/cgroup{path}'.rstrip('/'), 2
  return None


def _write(path: str, value: str) -> None:
  with open(path, 'w') as f:
    f.write(value)


def _cgroup_parent() -> tuple[str, int]:
  """The sandbox's cgroup directory (made on first use); OSError or
  FileNotFoundError when it cannot be."""
  found = _memory_root()
  if found is None:
    raise FileNotFoundError('no memory cgroup controller')
  root, version = found
  parent = os.path.join(root, _CGROUP)
  os.makedirs(parent, exist_ok=True)
  if version == 2:  # a v2 child gets memory.max only when it is delegated
    for directory in (root, parent):
      _write(os.path.join(directory, 'cgroup.subtree_control'), '+memory')
  return parent, version


def check_available() -> None:
  """A config error (one sentence) when the sandbox cannot start here."""
  missing = [t for t in TOOLS if shutil.which(t) is None] + (
      [] if os.access(PYTHON, os.X_OK) else [PYTHON])
  if missing:
    raise UsageError(
        f'the code sandbox needs {" and ".join(missing)}, not found; '
        'install them with apt-get install bubblewrap util-linux python3.')
  try:
    _cgroup_parent()
  except OSError as e:
    raise UsageError(
        'the code sandbox caps each run\'s memory in a cgroup of its own and '
        f'cannot make one here ({e}); run it as root where /sys/fs/cgroup '
        'is writable (on GKE, a privileged container).') from None


class _Slot:
  """A slot held for one run, host-wide: its uid and its memory cgroup."""

  def __enter__(self) -> _Slot:
    os.makedirs(LOCKS, exist_ok=True)
    while True:  # flock: a lock per open file, so threads exclude too
      for i in range(SLOTS):
        lock = open(os.path.join(LOCKS, str(i)), 'a')  # pylint: disable=consider-using-with
        try:
          fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
          lock.close()
          continue
        self.index, self._lock = i, lock
        return self
      time.sleep(0.01)

  def __exit__(self, *_) -> None:
    self._lock.close()  # releases the lock

  @property
  def uid(self) -> int:
    return UID_BASE + self.index

  def cgroup(self, memory_mb: int) -> tuple[str, int]:
    """The slot's cgroup with the run's cap set and its peak reset."""
    parent, version = _cgroup_parent()
    path = os.path.join(parent, str(self.index))
    os.makedirs(path, exist_ok=True)
    limit = str(memory_mb * 1024 * 1024)
    if version == 1:
      swap = os.path.join(path, 'memory.memsw.limit_in_bytes')
      if os.path.exists(swap):  # never below the memory limit: lift it first
        _write(swap, '-1')
      _write(os.path.join(path, 'memory.limit_in_bytes'), limit)
      if os.path.exists(swap):
        _write(swap, limit)
      _write(os.path.join(path, 'memory.max_usage_in_bytes'), '0')
    else:
      _write(os.path.join(path, 'memory.max'), limit)
      _write(os.path.join(path, 'memory.swap.max'), '0')
    return path, version


def _peak_mb(cgroup: str, version: int) -> float:
  name = 'memory.max_usage_in_bytes' if version == 1 else 'memory.peak'
  try:
    with open(os.path.join(cgroup, name)) as f:
      return int(f.read()) / 2**20
  except OSError:
    return 0.0


def _binds() -> list[str]:
  """The system directories (links as links) and /etc files, read-only."""
  out = []
  for path in _SYSTEM:
    if os.path.islink(path):
      out += ['--symlink', os.readlink(path), path]
    elif os.path.isdir(path):
      out += ['--ro-bind', path, path]
  for path in _ETC:
    out += ['--ro-bind-try', path, path]
  return out


def command(argv: list[str], limits: Limits, uid: int, cgroup: str,
            info_fd: int) -> list[str]:
  """`argv` wrapped: a shell that joins `cgroup` and execs prlimit (whose
  rlimits all it starts inherit), setpriv to `uid`, then bwrap's
  namespaces, which writes its child's pid to `info_fd` once set up. (No
  preexec_fn: forking a multithreaded process, as JAX's is, to run Python
  in the child can deadlock.)"""
  mb = 1024 * 1024
  return ['/bin/sh', '-c', 'echo $$ > "$0" && exec "$@"',
          os.path.join(cgroup, 'cgroup.procs'),
          'prlimit', f'--cpu={limits.cpu_s}',
          f'--as={limits.memory_mb * mb}', f'--fsize={limits.file_mb * mb}',
          f'--nproc={limits.processes}', '--core=0',
          'setpriv', f'--reuid={uid}', f'--regid={uid}', '--clear-groups',
          'bwrap', '--unshare-all', '--die-with-parent', '--new-session',
          # No bwrap init inside: its exits outlive the outer bwrap as
          # zombies that a lazy PID 1 leaves to count against the process
          # limit (30 runs exhausted it).
          '--as-pid-1', '--cap-drop', 'ALL', '--clearenv',
          '--setenv', 'PATH', '/usr/bin:/bin', '--setenv', 'HOME', '/tmp',
          '--setenv', 'LANG', 'C.UTF-8', *_binds(), '--dev', '/dev',
          '--proc', '/proc', '--size', str(limits.tmp_mb * mb),
          '--tmpfs', '/tmp', '--remount-ro', '/', '--chdir', '/tmp',
          '--info-fd', str(info_fd),
          *argv]


def _read(f, limit: int) -> tuple[str, bool]:
  f.seek(0)
  data = f.read(limit + 1)
  return data[:limit].decode(errors='replace'), len(data) > limit


def run_python(code: str, stdin: str = '', limits: Limits = Limits(),
               python: str = PYTHON) -> Result:
  """Runs `code` with `python -I` in the sandbox; never raises for what the
  code does (crashes, limits and timeouts come back in the Result), nor
  when the sandbox cannot start (`started=False`)."""
  check_available()
  with _Slot() as slot, tempfile.TemporaryFile() as out, \
      tempfile.TemporaryFile() as err:
    start = time.monotonic()
    cgroup, version = slot.cgroup(limits.memory_mb)
    info_read, info_write = os.pipe()
    try:
      proc = subprocess.Popen(
          command([python, '-I', '-c', code], limits, slot.uid, cgroup,
                  info_write),
          stdin=subprocess.PIPE, stdout=out, stderr=err,
          start_new_session=True, pass_fds=(info_write,),
          env={'PATH': '/usr/sbin:/usr/bin:/sbin:/bin'})
    finally:
      os.close(info_write)
    timed_out = False
    try:
      proc.communicate(stdin.encode(), timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
      timed_out = True
    finally:
      try:  # the whole group: sh's exec chain and (through bwrap) the run
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      proc.wait()
      with os.fdopen(info_read, 'rb') as info:
        started = bool(info.read())
    stdout, cut_out = _read(out, limits.output_bytes)
    stderr, cut_err = _read(err, limits.output_bytes)
    return Result(proc.returncode, stdout, stderr, timed_out,
                  cut_out or cut_err, time.monotonic() - start, started,
                  _peak_mb(cgroup, version))
