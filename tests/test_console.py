"""The console: a bar with its rate and the time left, plain lines in logs
at a time cadence, lines said without tearing a terminal bar, and long
compilations announced."""

import io
import time

import jax
import jax.numpy as jnp

from tunix_pw import console


class Terminal(io.StringIO):

  def isatty(self):
    return True


def test_the_rate_and_eta_leave_out_the_first_update(monkeypatch):
  clock = [100.0]
  monkeypatch.setattr(time, 'perf_counter', lambda: clock[0])
  log = io.StringIO()
  with console.Progress(10, 'sft', stream=log) as bar:
    clock[0] += 30  # the first step compiles
    bar.update(loss=2.0)
    assert 'steps/s' not in bar.line() and 'ETA' not in bar.line()
    clock[0] += 2
    bar.update(4, loss=1.0)  # 4 steps in 2 s after the first
    assert ' 2 steps/s ETA 2s loss=1' in bar.line(), bar.line()
    clock[0] += 8
    bar.update(loss=0.5)  # 5 steps in 10 s: slower than a step a second
    assert ' 2 s/step ETA 8s' in bar.line(), bar.line()
    clock[0] += 2
    bar.update()  # a step without values keeps the last ones shown
    assert bar.line().endswith(' 7/10 42.0s 2 s/step ETA 6s loss=0.5'), (
        bar.line())


def test_plain_lines_come_at_the_time_cadence_and_at_the_end(monkeypatch):
  clock = [0.0]
  monkeypatch.setattr(time, 'perf_counter', lambda: clock[0])
  monkeypatch.setattr(console, 'plain_every_s', 60.0)
  log = io.StringIO()
  with console.Progress(100, 'grpo', stream=log) as bar:
    for _ in range(100):
      clock[0] += 1.5
      bar.update(reward=0.5)
  lines = log.getvalue().splitlines()
  done = [int(line.split()[2].split('/')[0]) for line in lines]
  assert done == [1, 41, 81, 100], lines  # the first, every 60 s, the last
  assert '\r' not in log.getvalue()


def test_a_said_line_clears_a_terminal_bar_and_redraws_it(capsys,
                                                          monkeypatch):
  monkeypatch.setattr(time, 'perf_counter', lambda: 5.0)
  screen = Terminal()
  with console.Progress(3, 'sft', stream=screen) as bar:
    bar.update(loss=1.0)
    console.say('sft: step 1: held-out ...', stream=screen)
  bar_line = 'sft [########................] 1/3 0.0s loss=1'
  assert screen.getvalue().split('\r\033[K') == [
      '', bar_line, 'sft: step 1: held-out ...\n', bar_line + '\n']
  del capsys


def test_a_long_compilation_is_announced_and_its_end_said(capsys):
  console.announce_compiles(after_s=0.0)
  jax.jit(lambda x: jnp.sin(x) * 3.25 + 1).lower(jnp.ones(7)).compile()
  time.sleep(1.5)
  out = capsys.readouterr().out
  assert 'compiled jit(<lambda>) in ' in out, out
