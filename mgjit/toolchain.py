"""Finding and running ptxas, and finding libdevice: no system CUDA toolkit is required."""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import CompileError


def _wheel_dirs() -> list[Path]:
    """Where the nvidia-cuda-nvcc / nvidia-nvvm wheels put their files (layout differs by CUDA major)."""
    out = []
    for base in map(Path, sys.path):
        for sub in ("nvidia/cu13", "nvidia/cuda_nvcc", "nvidia/cu12"):
            if (base / sub).is_dir():
                out.append(base / sub)
    return out


@functools.lru_cache(maxsize=None)
def ptxas_path() -> str:
    env = os.environ.get("MGJIT_PTXAS")
    if env:
        if not os.access(env, os.X_OK):
            raise CompileError(f"MGJIT_PTXAS={env} is not an executable file")
        return env
    candidates = [d / "bin" / "ptxas" for d in _wheel_dirs()]
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home:
        candidates.append(Path(cuda_home) / "bin" / "ptxas")
    candidates.append(Path("/usr/local/cuda/bin/ptxas"))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("ptxas")
    if found:
        return found
    raise CompileError("ptxas not found: install the nvidia-cuda-nvcc wheel (a dependency of mgjit) "
                       "or point MGJIT_PTXAS at a ptxas binary")


@functools.lru_cache(maxsize=None)
def ptxas_version() -> str:
    out = subprocess.run([ptxas_path(), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"V(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1]


@functools.lru_cache(maxsize=None)
def libdevice_path() -> str:
    env = os.environ.get("MGJIT_LIBDEVICE")
    candidates = [Path(env)] if env else []
    candidates += [d / "nvvm" / "libdevice" / "libdevice.10.bc" for d in _wheel_dirs()]
    for base in map(Path, sys.path):
        candidates.append(base / "nvidia" / "cuda_nvcc" / "nvvm" / "libdevice" / "libdevice.10.bc")
    cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    candidates.append(Path(cuda_home) / "nvvm" / "libdevice" / "libdevice.10.bc")
    for c in candidates:
        if c.is_file():
            return str(c)
    raise CompileError("libdevice.10.bc not found (needed for tanh/erf/sin/cos): install the nvidia-nvvm wheel "
                       "or set MGJIT_LIBDEVICE")


@functools.lru_cache(maxsize=None)
def compiler_fingerprint() -> tuple:
    """What identifies the code that compiles kernels: mgjit's own source files (stat only: cheap, and any
    edit or reinstall changes it), the MLIR bindings' version and the ptxas binary."""
    root = Path(__file__).parent
    files = tuple((str(p.relative_to(root)), st.st_size, st.st_mtime_ns)
                  for p in sorted(root.rglob("*.py")) for st in [p.stat()])
    ptxas = ptxas_path()
    st = os.stat(ptxas)
    return (files, mlir_bindings_version(), (ptxas, st.st_size, st.st_mtime_ns))


def mlir_bindings_version() -> str:
    """The MLIR bindings' distribution version, read from package metadata (MLIR itself is not imported)."""
    from importlib import metadata
    top = os.environ.get("MGJIT_MLIR_PACKAGE", "numba_cuda_mlir._mlir").split(".")[0]
    for dist in (top.replace("_", "-"), top):
        try:
            return f"{dist}=={metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return f"{top}==unknown"


@dataclasses.dataclass(frozen=True)
class PtxasReport:
    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    smem_static: int
    text: str

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


def parse_report(text: str) -> PtxasReport:
    def find(pattern: str) -> int:
        m = re.search(pattern, text)
        return int(m.group(1)) if m else 0
    return PtxasReport(
        registers=find(r"Used (\d+) registers"),
        spill_stores=find(r"(\d+) bytes spill stores"),
        spill_loads=find(r"(\d+) bytes spill loads"),
        stack_frame=find(r"(\d+) bytes stack frame"),
        smem_static=find(r"(\d+) bytes smem"),
        text=text,
    )


def assemble(ptx: str, target: str, kernel_name: str) -> tuple[bytes, PtxasReport]:
    """ptxas the PTX for `target` (e.g. sm_90a); returns the cubin and the parsed resource report."""
    with tempfile.TemporaryDirectory(prefix="mgjit-") as tmp:
        src, out = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        cmd = [ptxas_path(), "-v", f"-arch={target}", "-O3", str(src), "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"ptxas failed for kernel {kernel_name} ({target}):\n{proc.stderr.strip()}",
                               rule="ptxas")
        return out.read_bytes(), parse_report(proc.stderr + proc.stdout)
