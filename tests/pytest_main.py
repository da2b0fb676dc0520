"""Bazel's py_test entry point: runs pytest on the test files it is given."""

import sys

import pytest

if __name__ == '__main__':
  sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', *sys.argv[1:]]))
