"""Environment -> backend and process id, for every cluster flavour."""

import pytest

from tunix_pw.errors import UsageError
from tunix_pw.runtime import backend

CPU_POD = dict(JAX_COORDINATOR_ADDRESS='job-slice-0-0.job',
               JAX_PROCESS_COUNT='8', PROCESSES_IN_JOB='4')


@pytest.mark.parametrize('env, flags, expected', [
    ({}, {}, ('local', None, 1, 0)),
    ({'JAX_PLATFORMS': 'proxy'}, {}, ('pathways', None, 1, 0)),
    ({'JAX_PLATFORMS': 'cpu,proxy', **CPU_POD}, {}, ('pathways', None, 1, 0)),
    # XPK CPU JobSet: id = JOB_INDEX * PROCESSES_IN_JOB + JOB_COMPLETION_INDEX.
    ({**CPU_POD, 'JOB_INDEX': '1', 'JOB_COMPLETION_INDEX': '2'}, {},
     ('multi_controller', 'job-slice-0-0.job:1234', 8, 6)),
    ({**CPU_POD, 'JAX_COORDINATOR_ADDRESS': 'h:99', 'JOB_INDEX': '0',
      'JOB_COMPLETION_INDEX': '3'}, {}, ('multi_controller', 'h:99', 8, 3)),
    # XPK GPU JobSet.
    ({'JAX_COORDINATOR_ADDRESS': 'g-0-0.g', 'JAX_COORDINATOR_PORT': '6002',
      'NNODES': '4', 'NODE_RANK': '3'}, {},
     ('multi_controller', 'g-0-0.g:6002', 4, 3)),
    # TPU pod slice: 4 hosts.
    ({'TPU_WORKER_HOSTNAMES': 'h0,h1,h2,h3', 'TPU_WORKER_ID': '2'}, {},
     ('multi_controller', 'h0:8476', 4, 2)),
    # Multi-slice TPU: 2 slices of 4 hosts; slice 1, worker 3 -> id 7.
    ({'TPU_WORKER_HOSTNAMES': 'h0,h1,h2,h3', 'TPU_WORKER_ID': '3',
      'MEGASCALE_NUM_SLICES': '2', 'MEGASCALE_SLICE_ID': '1',
      'MEGASCALE_COORDINATOR_ADDRESS': 'mc'}, {},
     ('multi_controller', 'mc:8476', 8, 7)),
    # A single TPU VM is a local run.
    ({'TPU_WORKER_HOSTNAMES': 'h0', 'TPU_WORKER_ID': '0'}, {},
     ('local', None, 1, 0)),
    # Explicit flags win over the environment.
    ({**CPU_POD, 'JOB_INDEX': '0', 'JOB_COMPLETION_INDEX': '0'},
     dict(coordinator_address='me:5', process_count=2, process_id=1),
     ('multi_controller', 'me:5', 2, 1)),
])
def test_detect(env, flags, expected):
  d = backend.detect(env, **flags)
  assert (d.backend, d.coordinator_address, d.process_count,
          d.process_id) == expected
  assert d.reason


@pytest.mark.parametrize('env, flags, message', [
    (CPU_POD, {}, 'JOB_INDEX is missing'),
    ({**CPU_POD, 'JOB_INDEX': 'x', 'JOB_COMPLETION_INDEX': '0'}, {},
     'not an integer'),
    ({**CPU_POD, 'JOB_INDEX': '2', 'JOB_COMPLETION_INDEX': '0'}, {},
     'outside JAX_PROCESS_COUNT'),
    ({}, dict(coordinator_address='me:5', process_count=2, process_id=2),
     '--process_id'),
])
def test_detect_rejects_inconsistent_environments(env, flags, message):
  with pytest.raises(UsageError, match=message):
    backend.detect(env, **flags)
