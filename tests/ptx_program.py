"""The PTX parser of tests/ptx_sim.py: a kernel's parameters, local-memory depots, registers declared inside
inline assembly, labels (those of a one-line inline-asm block scoped to it, as in PTX), the jump tables of
brx.idx (.branchtargets) and instructions, each as (guard, opcode, operands); the functions the kernel calls (a
libdevice routine LLVM keeps out of line, `__internal_accurate_pow`), their code after the kernel's with their
registers renamed apart from its; the module's initialized global arrays (libdevice's `__cudart_sin_cos_coeffs`)."""
from __future__ import annotations

import re
from typing import Any

import numpy as np
from ptx_arith import bits_dtype


def _split(line: str) -> list[str]:
    """Statements of a PTX line (inline asm puts several on one line)."""
    line = line.split("//")[0].strip()
    return [s.strip() for s in line.split(";") if s.strip()]


class Program:
    def __init__(self, ptx: str):
        self.params: list[str] = []
        self.code: list[tuple] = []
        self.labels: dict[str, int] = {}
        self.declared: dict[str, Any] = {}  # registers an inline-asm block declares by name: their dtypes
        # Shared memory reached by the async proxy, mbarriers or other CTAs: no race check (SmemRaces)
        self.async_smem = bool(re.search(r"mbarrier|cp\.async|st\.async|wgmma|tcgen05|shared::cluster|barrier\.cluster",
                                         ptx))
        # Initialized module globals (.global .align 16 .b8 name[128] = {70, 210, ...}): their bytes, the ones the
        # initializer leaves out zero
        self.globals: dict[str, bytes] = {
            name: bytes(int(b) for b in data.split(",")).ljust(int(size), b"\0") for name, size, data in
            re.findall(r"\.global\s+\.align\s+\d+\s+\.b8\s+(\w+)\[(\d+)\]\s*=\s*\{([^}]*)\}", ptx)}
        self.global_addresses: dict[str, int] = {}  # their addresses, where ptx_sim.launch places them
        body = ptx[ptx.index(".entry"):]
        header, rest = body.split("{", 1)
        self.functions: dict[str, tuple[list[str], str | None]] = {}  # name (its entry's label): (params, return)
        rest = _functions_as_labels(rest, self.functions)
        self.params = re.findall(r"\.param\s+(?:\.align\s+\d+\s+)?\.\w+\s+(?:\.ptr\s+\.global\s+\.align\s+\d+\s+)?(\w+)",
                                 header)
        # The TMA descriptors, passed by value as 128 bytes: their generic addresses are ptx_tma.TMAP_BASE + 128 * slot
        self.tensormaps = re.findall(r"\.param\s+\.align\s+64\s+\.b8\s+(\w+)\[128\]", header)
        # A thread's local memory (arrays LLVM keeps on the stack): each depot at its offset in one arena.
        self.depots: dict[str, int] = {}
        self.local_bytes = 0
        for name, size in re.findall(r"\.local\s+\.align\s+\d+\s+\.b8\s+(\w+)\[(\d+)\]", rest):
            self.depots[name] = self.local_bytes
            self.local_bytes += -(-int(size) // 16) * 16
        # Jump tables (LLVM's for a switch: brx.idx %r, $L_brx_0): their labels in order, taken out of the code
        self.branchtargets: dict[str, list[str]] = {}

        def table(m: re.Match) -> str:
            self.branchtargets[m.group(1)] = [t.strip() for t in m.group(2).split(",")]
            return ""
        rest = re.sub(r"(\$?\w+):\s*\.branchtargets\s*([^;]*);", table, rest)
        for line in rest.splitlines():
            line = line.split("//")[0].strip()
            if not line or line in ("{", "}") or line.startswith("."):
                continue
            m = re.match(r"^(\$?[\w.]+):$", line)
            if m:
                self.labels[m.group(1)] = len(self.code)
                continue
            # The labels of a one-line inline-asm block are scoped to it, as in PTX: made unique to the line
            for name in re.findall(r"(?:^|[;{])\s*(\w+):", line):
                line = re.sub(rf"\b{name}\b", f"{name}@{len(self.code)}", line)
            for stmt in _split(line):
                if stmt.startswith(("{", "}")):  # an inline-asm block's braces, not a vector operand's
                    stmt = stmt.strip("{} ")
                    if not stmt:
                        continue
                m = re.match(r"^\.reg\s+\.(pred|[bfsu]\d+)\s+(.*)$", stmt)
                if m and m.group(1) == "b128":  # two 64-bit halves, NAME:lo and NAME:hi (mov.b128 packs them)
                    self.declared.update((f"{n.strip()}:{half}", np.uint64) for n in m.group(2).split(",")
                                         for half in ("lo", "hi"))
                    continue
                if m:
                    dtype = np.bool_ if m.group(1) == "pred" else bits_dtype(re.sub("^[su]", "b", m.group(1)))
                    self.declared.update((n.strip(), dtype) for n in m.group(2).split(","))
                    continue
                m = re.match(r"^([\w@]+):\s*(.*)$", stmt)
                if m:
                    self.labels[m.group(1)] = len(self.code)
                    stmt = m.group(2).strip("{} ")
                    if not stmt:
                        continue
                guard = None
                m = re.match(r"^@(!?)(%?\w+)\s+(.*)$", stmt)
                if m:
                    guard = (m.group(1) == "!", m.group(2))
                    stmt = m.group(3)
                parts = stmt.split(None, 1)
                self.code.append((guard, parts[0], _operands(parts[1]) if len(parts) > 1 else []))
        self.waits = [i for i, (_, opcode, _) in enumerate(self.code) if opcode.startswith("mbarrier.try_wait")]


# A called function's registers are its own: renamed past the kernel's (%rd4 of the first function: %rd1000004)
_RENAMED = 1_000_000
_FUNCTION = re.compile(r"^\.func\s+(?:\(\s*\.param\s+\.\w+\s+(\w+)\s*\)\s*)?(\w+)\s*\(([^)]*)\)\s*\{", re.M)


def _functions_as_labels(text: str, functions: dict) -> str:
    """The kernel's text with each function defined after it (`.func (.param .b64 func_retval0) name(.param .b64
    name_param_0, ...) { ... }`) made a label, `name:`, followed by its body with its registers renamed; each
    recorded in `functions` as (its parameters' names, its return parameter's name or None)."""
    out, at = [], 0
    for k, m in enumerate(_FUNCTION.finditer(text)):
        retval, name, params = m.group(1), m.group(2), m.group(3)
        depth, end = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        offset = _RENAMED * (k + 1)
        body = re.sub(r"%(p|rs|rd|r|fd|f)(\d+)\b", lambda r: f"%{r.group(1)}{int(r.group(2)) + offset}",
                      text[m.end():end - 1])
        out += [text[at:m.start()], f"\n{name}:\n", body, "\n"]
        functions[name] = (re.findall(r"\.param\s+\.\w+\s+(\w+)", params), retval)
        at = end
    return "".join(out + [text[at:]])


def _operands(text: str) -> list:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out
