"""Fresh `tunix_pw.main` processes without paying for its imports each time.

The server (`python -m tests.forkserver`) imports `tunix_pw.main` and
nothing else of ours, as `python -m tunix_pw.main` does before `main` runs,
then forks one child per run: the child takes the run's environment,
working directory, arguments and output files, runs the `tunix-pw` entry
point (or a script that wraps it) and ends as that command would (its exit
code, atexit handlers, output flushed). A run then starts in a fresh process
on a fresh JAX, minus the imports' 1.5 s of CPU (about 270 runs in the
suite). The parent (`ForkServer.run`) starts one server per test process
and falls back to a new interpreter where a run's environment differs from
the server's in what is read at import (helpers.run_main).

Protocol, one JSON line each way: a request ({argv, env, cwd, stdout,
stderr, code}), then {"pid"} once forked and {"returncode"} once it exited.
"""

from __future__ import annotations

from collections.abc import Callable
import functools
import json
import os
import select
import signal
import subprocess
import sys


def _become(request: dict) -> None:
  """In the forked child: the run's process, to its exit (SystemExit)."""
  os.environ.clear()
  os.environ.update(request['env'])
  os.chdir(request['cwd'])
  for fd, path, mode in ((0, os.devnull, os.O_RDONLY),
                         (1, request['stdout'], os.O_WRONLY),
                         (2, request['stderr'], os.O_WRONLY)):
    opened = os.open(path, mode)
    os.dup2(opened, fd)
    os.close(opened)
  sys.stdin = open(0, closefd=False)  # pylint: disable=consider-using-with
  from tunix_pw import main  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  sys.argv = [main.__file__, *request['argv']]
  if request['code']:  # a script that wraps main (helpers.KILLED_AT_STEP)
    exec(request['code'], {'__name__': '__main__'})  # pylint: disable=exec-used
  else:
    main.run()


def serve() -> None:
  import tunix_pw.main  # pylint: disable=g-import-not-at-top,unused-import,import-outside-toplevel
  for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
      _become(request)  # raises SystemExit up through this loop
    print(json.dumps(dict(pid=pid)), flush=True)
    returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    print(json.dumps(dict(returncode=returncode)), flush=True)


class ForkServer:
  """The parent's side: one server in `cwd`, started at the first run with
  the environment `env()` gives then; one run at a time."""

  def __init__(self, cwd: str, env: Callable[[], dict[str, str]]):
    self.cwd, self._env = cwd, env
    self._server: subprocess.Popen | None = None

  @functools.cached_property
  def env(self) -> dict[str, str]:
    return self._env()

  def run(self, argv: list[str], env: dict[str, str], tmpdir: str,
          timeout: float, code: str = '') -> subprocess.CompletedProcess:
    """Like subprocess.run(capture_output=True, text=True, timeout=...) of
    `python -m tunix_pw.main *argv` (or `python -c code *argv`) in `cwd`."""
    if self._server is None or self._server.poll() is not None:
      self._server = subprocess.Popen(
          [sys.executable, '-m', 'tests.forkserver'], cwd=self.cwd, env=self.env,
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    paths = [os.path.join(tmpdir, f'forkserver.{n}') for n in ('out', 'err')]
    for path in paths:
      open(path, 'w').close()  # pylint: disable=consider-using-with
    self._server.stdin.write(json.dumps(dict(
        argv=argv, env=env, cwd=self.cwd, stdout=paths[0], stderr=paths[1],
        code=code)).encode() + b'\n')
    pid = json.loads(self._server.stdout.readline())['pid']
    ready, _, _ = select.select([self._server.stdout], [], [], timeout)
    if not ready:
      os.kill(pid, signal.SIGKILL)
    returncode = json.loads(self._server.stdout.readline())['returncode']
    stdout, stderr = (open(p).read() for p in paths)  # pylint: disable=consider-using-with
    command = [sys.executable, '-c' if code else '-m',
               code or 'tunix_pw.main', *argv]
    if not ready:
      raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
    return subprocess.CompletedProcess(command, returncode, stdout, stderr)


if __name__ == '__main__':
  serve()
