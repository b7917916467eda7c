"""An asv environment type for machines without a package index: `environment_type: "derived"`.

asv builds each commit it benchmarks into an environment of its own. Its `virtualenv`, `conda`, `uv` and
`rattler` types install every dependency from an index, which a GPU box often lacks and which would rebuild
torch, Transformer Engine and torchao per environment; its `existing` type installs nothing, so `asv
continuous` and `asv run A..B` cannot use it (one interpreter cannot hold two commits). `derived` sits
between them: a virtualenv made from the interpreter that runs asv, whose import path it extends (a .pth
file) with that interpreter's own, so the heavy dependencies come from there, while each commit of the
project is installed into the environment's own site-packages, which Python searches first, by the
`install_command` of asv.conf.json (pip with --no-index --no-deps). Paths that hold the project itself (a
source checkout on PYTHONPATH) are left out, so the installed commit is the one that runs.

asv loads this module through asv.conf.json's `"plugins": [".asv_plugins.fp8bench_env"]` (the leading dot:
import it from the directory asv runs in).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from asv import environment, util
from asv.console import log

PROJECT_PACKAGES = ("fp8bench", "fp8bench_kernels")
"""Import names of the project: a path holding one of them would shadow the commit asv installed."""


def _this_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def inherited_paths() -> list[str]:
    """The import path entries of this interpreter that a derived environment should see: existing folders
    and archives, without the standard library (the venv has its own) and without any that hold the
    project."""
    stdlib = os.path.realpath(sysconfig.get_path("stdlib"))  # site-packages may lie inside it (no venv)
    out: list[str] = []
    for p in sys.path:
        if not p or not os.path.exists(p):
            continue
        real = os.path.realpath(p)
        site_dir = "site-packages" in real or "dist-packages" in real
        if real in out or (real.startswith(stdlib) and not site_dir):
            continue
        if any((Path(real) / name).is_dir() for name in PROJECT_PACKAGES):
            if site_dir:  # leaving it out would leave torch out too
                raise environment.EnvironmentUnavailable(
                    f"{real} holds a copy of fp8bench installed without -e; it would shadow each commit asv "
                    "installs: uninstall it, or install the project with pip install -e")
            continue
        out.append(real)
    return out


class DerivedVirtualenv(environment.Environment):
    """A virtualenv per asv environment that inherits this interpreter's packages and installs the project
    per commit without the network."""

    tool_name = "derived"

    def __init__(self, conf, python, requirements, tagged_env_vars):
        if python != _this_python():
            raise environment.EnvironmentUnavailable(
                f"the derived environment uses the interpreter running asv (Python {_this_python()}), "
                f"not {python}")
        if requirements:
            raise environment.EnvironmentUnavailable(
                "the derived environment takes its packages from the interpreter running asv: leave "
                f"asv.conf.json's matrix empty (it has {sorted(requirements)})")
        # asv's base class names the environment's folder from these before it sets them itself
        self._python, self._requirements, self._tagged_env_vars = python, requirements, tagged_env_vars
        super().__init__(conf, python, requirements, tagged_env_vars)

    @classmethod
    def matches(cls, python):
        return python == _this_python()

    def check_presence(self):
        """The environment exists and its interpreter starts (it has no pip of its own: the inherited one
        installs into it)."""
        try:
            info = self.load_info_file(self._path)
        except (util.UserError, OSError):
            return False
        if info.get("tool_name") != self.tool_name or info.get("python") != self._python:
            return False
        try:
            self.run_executable("python", ["-c", "pass"])
        except (subprocess.CalledProcessError, OSError):
            return False
        return True

    def _setup(self):
        log.info(f"Creating a virtualenv for {self.name} derived from {sys.executable}")
        util.check_call([sys.executable, "-m", "venv", "--without-pip", self._path])
        site_packages = subprocess.run(
            [os.path.join(self._path, "bin", "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True, text=True, check=True).stdout.strip()
        Path(site_packages, "_fp8bench_inherited.pth").write_text("\n".join(inherited_paths()) + "\n")

    def run(self, args, **kwargs):
        log.debug(f"Running '{' '.join(args)}' in {self.name}")
        return self.run_executable("python", args, **kwargs)
