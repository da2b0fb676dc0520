"""Test setup: JAX on CPU with 8 virtual devices, before JAX starts."""

import os
import sys

os.environ['JAX_PLATFORMS'] = 'cpu'  # libtpu may be installed (test extra)
# Make the repository root importable (launch/, benchmarks/).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update('jax_num_cpu_devices', 8)
