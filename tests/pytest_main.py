"""Bazel's py_test entry point: runs pytest on the test files it is given."""

import sys

import pytest

if __name__ == '__main__':
  # One file per Bazel test, in this process (no xdist workers).
  sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-n', '0',
                        *sys.argv[1:]]))
