"""Finding and running ptxas, and finding libdevice: no system CUDA toolkit is required.

ptxas runs with a bounded wait (MGJIT_PTXAS_TIMEOUT seconds, 300 by default) in a private scratch directory
that a later compile cleans if a killed process left it behind. Its warnings, and any spill, become Python
warnings naming the kernel (`errors.PtxasWarning`, raised by the compiler).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .errors import CompileError, Rule


def timeout_seconds() -> float:
    """How long ptxas and the other tools mgjit runs may take (MGJIT_PTXAS_TIMEOUT, default 300 s)."""
    text = os.environ.get("MGJIT_PTXAS_TIMEOUT", "300")
    try:
        value = float(text)
    except ValueError:
        raise CompileError(f"MGJIT_PTXAS_TIMEOUT={text!r} is not a number of seconds") from None
    if value <= 0:
        raise CompileError(f"MGJIT_PTXAS_TIMEOUT={text!r} must be a positive number of seconds")
    return value


def run_tool(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    """Run a tool with the bounded wait; a CompileError that says so if it does not finish."""
    limit = timeout_seconds()
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        raise CompileError(f"{what} did not finish within {limit:g} s (MGJIT_PTXAS_TIMEOUT): {cmd[0]}",
                           rule=Rule.PTXAS) from None


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
    out = run_tool([ptxas_path(), "--version"], "ptxas --version").stdout
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
    """What identifies the code that compiles kernels, by content: mgjit's own source files, the MLIR
    bindings' version and the ptxas binary. Never a path or a time, so two installs of one version share keys
    (and the shared cache tier serves both)."""
    root = Path(__file__).parent
    sources = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        sources.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return (sources.hexdigest(), mlir_bindings_version(), _file_digest(ptxas_path()))


def _file_digest(path: str) -> str:
    """sha256 of a file. ptxas is ~50 MB (70 ms to hash), so the digest is remembered per user, keyed by the
    file's identity (device, inode, size, mtime): a replaced binary is hashed again."""
    st = os.stat(path)
    identity = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{os.path.realpath(path)}"
    memo = _memo_file()
    known = {}
    if memo is not None:
        try:
            known = json.loads(memo.read_text())
        except (OSError, ValueError):
            known = {}
    digest = known.get(identity) if isinstance(known, dict) else None
    if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digest = h.hexdigest()
        if memo is not None:
            kept = dict(list(known.items())[-7:]) if isinstance(known, dict) else {}
            _write_private(memo, json.dumps({**kept, identity: digest}))
    return digest



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

    @property
    def warnings(self) -> list[str]:
        """What ptxas warned about, one line each, its notes of a performance loss (given as info: wgmma
        serialized, C7515, a large slowdown), and the spill if any."""
        out = [re.sub(r"^ptxas\s+(warning|info)\s*:\s*", "", line.strip()) for line in self.text.splitlines()
               if re.match(r"\s*ptxas\s+warning\b", line)
               or re.match(r"\s*ptxas\s+info\s*:.*Performance Loss", line, re.IGNORECASE)]
        if self.spills:
            out.append(f"{self.spill_stores} bytes of spill stores and {self.spill_loads} bytes of spill loads "
                       f"to local memory ({self.registers} registers)")
        return out


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
    with tempfile.TemporaryDirectory(prefix="ptxas-", dir=_scratch_dir()) as tmp:
        src, out = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        cmd = [ptxas_path(), "-v", f"-arch={target}", "-O3", str(src), "-o", str(out)]
        proc = run_tool(cmd, f"ptxas for kernel {kernel_name} ({target})")
        if proc.returncode != 0:
            raise CompileError(f"ptxas failed for kernel {kernel_name} ({target}):\n{proc.stderr.strip()}",
                               rule=Rule.PTXAS)
        return out.read_bytes(), parse_report(proc.stderr + proc.stdout)


# A scratch directory left by a process killed while ptxas ran is removed once it is this old.
_STALE_SCRATCH_S = 3600.0


def _scratch_dir() -> str | None:
    """A directory of this user's own (0700, not a link) under the system's temporary directory for ptxas'
    files, swept of what killed compiles left behind; None (the temporary directory itself) if it cannot be
    had safely."""
    base = Path(tempfile.gettempdir()) / f"mgjit-{os.getuid()}"
    try:
        base.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(base)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    now = time.time()
    with os.scandir(base) as entries:
        for entry in entries:
            try:
                if (entry.name.startswith("ptxas-") and entry.is_dir(follow_symlinks=False)
                        and now - entry.stat(follow_symlinks=False).st_mtime > _STALE_SCRATCH_S):
                    shutil.rmtree(entry.path, ignore_errors=True)
            except OSError:
                continue
    return str(base)


def _memo_file() -> Path | None:
    scratch = _scratch_dir()
    return Path(scratch) / "digests.json" if scratch else None


def _write_private(path: Path, text: str) -> None:
    """Replace a file of ours atomically (a temporary file in the same directory, then rename)."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
