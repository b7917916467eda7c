"""Install the third-party FP8 libraries that the package registry offers only as source or as wheels with
CUDA sources inside (COAT, DeepGEMM), on a GPU box without network, and record how each attempt ended.

    python scripts/install_integrations.py fetch DIR      # on a machine with the registry: download them,
                                                          # and note in DIR what the registry does not have
    python scripts/install_integrations.py install DIR    # on the GPU box: install into $SITE, build, log

`install` writes $FP8BENCH_INSTALL_LOG (default $SITE/fp8bench_install.json): package → how it ended. The
backends' probes (fp8bench.backends.base.package_probe) quote it when the import fails, so a skipped case
names the failing step (install, build or import) and its error, seen on that machine.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PACKAGES = {"fp8-coat": "fp8-coat==1.0.11", "deep-gemm": "deep-gemm==1.0.0"}
LOOKED_UP = {"ms-amp": ("ms-amp", "msamp")}
"""Packages only looked up on the registry (pip download under each name); what `fetch` saw travels in
FETCHED to the GPU box, which cannot look itself."""
FETCHED = "fetch_status.json"


def tail(text: str, lines: int = 6) -> str:
    """The lines that say what went wrong: a compiler's first `error` lines if there are any (a failed build
    ends in a Python traceback that names none), else the last lines."""
    keep = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in keep if " error" in ln.lower() or ln.lower().startswith("error")]
    return " | ".join(errors[:4] if errors else keep[-lines:])[-900:]


TRANSCRIPT: list[str] = []
"""Every command's full output, written next to the log (the log keeps the telling lines only)."""


def sh(cmd: list[str], cwd: str | None = None, timeout: int = 900) -> tuple[bool, str, float]:
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        ok, out = p.returncode == 0, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        ok, out = False, f"timed out after {timeout} s"
    TRANSCRIPT.append(f"$ {' '.join(cmd)}  (in {cwd or '.'})\n{out}\n")
    return ok, out, time.monotonic() - t0


def fetch(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for spec in PACKAGES.values():
        ok, out, _ = sh([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(dest), spec])
        print(spec, "downloaded" if ok else f"FAILED: {tail(out)}")
    seen = {}
    for package, names in LOOKED_UP.items():
        misses = []
        for name in names:
            ok, out, _ = sh([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(dest), name])
            print(name, "downloaded" if ok else f"not available: {tail(out, 1)}")
            if not ok:
                misses.append(f"pip download {name}: {tail(out, 1)}")
        if len(misses) == len(names):
            seen[package] = f"not on the package registry ({'; '.join(misses)}), looked up by `fetch`"
    (dest / FETCHED).write_text(json.dumps(seen, indent=1))


def import_error(module: str, site: str) -> str:
    code = f"import sys; sys.path.insert(0, {site!r}); import {module}"
    ok, out, _ = sh([sys.executable, "-c", code], timeout=300)
    return "" if ok else tail(out, 2)


def install_coat(src: Path, site: str) -> str:
    wheels = glob.glob(str(src / "fp8_coat-*.whl"))
    if not wheels:
        return "install: no fp8_coat wheel was carried to this machine"
    ok, out, _ = sh([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--upgrade",
                     "--target", site, wheels[0]])
    if not ok:
        return f"install (pip install --no-deps {Path(wheels[0]).name}) failed: {tail(out)}"
    # CoatAdamW imports the CUDA extension qoptim_cuda, whose sources ship in the wheel: build it here
    kernels = Path(site) / "coat" / "optimizer" / "kernels"
    env_site = os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])
    ok, out, secs = sh(["env", f"PYTHONPATH={env_site}", f"MAX_JOBS={os.cpu_count()}", sys.executable, "setup.py",
                        "build_ext", "--inplace"], cwd=str(kernels))
    if not ok:
        return f"build of COAT's CUDA extension qoptim_cuda (setup.py build_ext) failed after {secs:.0f} s: {tail(out)}"
    for so in kernels.glob("qoptim_cuda*.so"):
        shutil.copy(so, site)
    for module in ("coat.activation.real_quantization.fp8linear", "coat.optimizer.fp8_adamw"):
        err = import_error(module, site)
        if err:
            return f"installed and built qoptim_cuda ({secs:.0f} s), but import {module} fails: {err}"
    return f"ok: installed, qoptim_cuda built in {secs:.0f} s"


def install_deepgemm(src: Path, site: str) -> str:
    sdists = glob.glob(str(src / "deep_gemm-*.tar.gz"))
    if not sdists:
        return "install: no deep_gemm source distribution was carried to this machine"
    ok, out, secs = sh([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-build-isolation",
                        "--target", site, sdists[0]])
    if not ok:
        return f"install (pip install {Path(sdists[0]).name}, the registry's only release) failed: {tail(out)}"
    err = import_error("deep_gemm", site)
    return f"installed, but import deep_gemm fails: {err}" if err else "ok: installed"


def install(src: Path) -> None:
    site = os.environ.get("SITE", "/tmp/site")
    log = Path(os.environ.get("FP8BENCH_INSTALL_LOG", f"{site}/fp8bench_install.json"))
    fetched = json.loads((src / FETCHED).read_text()) if (src / FETCHED).is_file() else {}
    status = {"fp8-coat": install_coat(src, site), "deep-gemm": install_deepgemm(src, site),
              **{p: fetched.get(p, f"not carried here (no {FETCHED} from `fetch`)") for p in LOOKED_UP}}
    log.write_text(json.dumps(status, indent=1))
    log.with_suffix(".transcript.txt").write_text("\n".join(TRANSCRIPT))
    for name, message in status.items():
        print(f"{name}: {message}")
    print(f"written {log}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("fetch", "install"):
        sys.exit(__doc__)
    (fetch if sys.argv[1] == "fetch" else install)(Path(sys.argv[2]))
