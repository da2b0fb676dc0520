"""TCMalloc under job processes (tunix_pw/runtime/allocator.py): a job
started without it re-executes itself under it, as the same process."""

import ctypes.util

import pytest

from tests import helpers
from tunix_pw.runtime import allocator

needs_tcmalloc = pytest.mark.skipif(
    ctypes.util.find_library('tcmalloc_minimal') is None,
    reason="Debian's libtcmalloc-minimal4 is not installed (.ci/run does)")

# The process reports, as it exits, whether TCMalloc is mapped into it (an
# image replaced by exec never exits; a child process would report too).
REPORT = """
import atexit
atexit.register(lambda: print('allocator',
                              'tcmalloc' in open('/proc/self/maps').read()))
"""


@needs_tcmalloc
def test_preloaded_adds_tcmalloc_once_and_keeps_the_rest():
  environ = allocator.preloaded({'LD_PRELOAD': 'libx.so', 'A': '1'})
  assert environ['A'] == '1'
  first, library = environ['LD_PRELOAD'].split(' ')
  assert first == 'libx.so' and 'tcmalloc' in library
  assert allocator.preloaded(environ) is None  # there already
  assert allocator.preloaded({'TUNIX_PW_MALLOC': 'system'}) is None


@needs_tcmalloc
@pytest.mark.parametrize('malloc, mapped', [('', True), ('system', False)])
def test_a_job_runs_under_tcmalloc_unless_told_not_to(tmp_path, malloc,
                                                      mapped):
  (tmp_path / 'sitecustomize.py').write_text(REPORT)
  result = helpers.run_main(
      '--config=tunix_pw/configs/smoke.py', '--check_only',
      f'--workdir={tmp_path / "w"}', LD_PRELOAD='', TUNIX_PW_MALLOC=malloc,
      PYTHONPATH=f'{tmp_path}:{helpers.ROOT}')
  assert result.returncode == 0, result.stderr[-3000:]
  reports = [line for line in result.stdout.splitlines()
             if line.startswith('allocator')]
  assert reports == [f'allocator {mapped}']
