"""The kernel modules as one fixture (`k`): tests/conftest.py turns Triton's interpreter on when there is no GPU."""

import importlib
import os

import pytest
from kernel_cases import CUDA, MODULES


@pytest.fixture(scope="module")
def k():
    """The kernel modules (tests/conftest.py turns Triton's interpreter on when there is no GPU)."""
    assert CUDA or os.environ.get("TRITON_INTERPRET") == "1"
    return type("Kernels", (), {name: importlib.import_module(f"fp8bench_kernels.{name}") for name in MODULES})
