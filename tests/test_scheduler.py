"""fp8bench.run.scheduler: the Slurm job a process runs in, from the variables Slurm sets, and the CPUs its
allocation gives. A real job's variables are checked in tests/test_slurm.py; here, what each variable means."""

from __future__ import annotations

import os

import pytest

from fp8bench.run.scheduler import allocated_cpus, slurm_context

ARRAY_TASK = {"SLURM_JOB_ID": "23", "SLURM_ARRAY_JOB_ID": "21", "SLURM_ARRAY_TASK_ID": "2", "SLURMD_NODENAME": "n7",
              "SLURM_JOB_PARTITION": "cpu", "SLURM_CPUS_PER_TASK": "4", "SLURM_RESTART_COUNT": "1",
              "SLURM_JOB_ACCOUNT": "proj", "SLURM_JOB_NAME": "fp8bench"}


def test_outside_slurm_there_is_no_context():
    assert slurm_context({"PATH": "/bin"}) == {}


def test_an_array_task_is_named_as_squeue_and_sacct_name_it():
    ctx = slurm_context(ARRAY_TASK)
    assert ctx == {"scheduler": "slurm", "job_id": "21_2", "slurm_job_id": "23", "array_job_id": "21",
                   "array_task_id": "2", "node": "n7", "partition": "cpu", "cpus_per_task": 4, "restart_count": 1,
                   "account": "proj", "job_name": "fp8bench"}


def test_a_plain_job_keeps_its_id_and_a_first_run_has_restart_count_0():
    ctx = slurm_context({"SLURM_JOB_ID": "5", "SLURM_CPUS_ON_NODE": "2"})
    assert ctx == {"scheduler": "slurm", "job_id": "5", "cpus_on_node": 2, "restart_count": 0}


AFFINITY = len(os.sched_getaffinity(0))


@pytest.mark.parametrize("environ,expected", [
    ({}, AFFINITY),  # not in Slurm: the process affinity
    ({"SLURM_JOB_ID": "1", "SLURM_CPUS_PER_TASK": "1"}, 1),
    ({"SLURM_JOB_ID": "1", "SLURM_CPUS_PER_TASK": "999"}, AFFINITY),  # never more than the affinity allows
    ({"SLURM_JOB_ID": "1", "SLURM_CPUS_ON_NODE": str(2 * AFFINITY), "SLURM_TASKS_PER_NODE": "2(x3)"}, AFFINITY),
    ({"SLURM_JOB_ID": "1", "SLURM_CPUS_ON_NODE": "1", "SLURM_NTASKS_PER_NODE": "1"}, 1),
    ({"SLURM_JOB_ID": "1"}, AFFINITY),  # nothing said about CPUs: the affinity
])
def test_allocated_cpus(environ, expected):
    assert allocated_cpus(environ) == expected
