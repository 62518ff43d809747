"""The programs of the differential fuzzer (tools/fuzz.py): a tree of typed statements and expressions
(`Stmt`, `Node`) with the tensors and scalars to launch it on (`Program`), printed as the Python source of an
`@mgjit.kernel` and its `@mgjit.device` helpers (`source`). fuzz_gen.py makes random ones; fuzz_ref.py evaluates
them with the language's semantics.

Every store goes to its own output tensor, at a row owned by one (program, warpgroup) and loop iteration, so no
two threads ever write one element: the GPU's result is deterministic.
"""
from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import torch

from mgjit import dtypes
from mgjit.dtypes import DType

F32, F16, BF16, F64 = dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64
E4M3, E5M2 = dtypes.float8_e4m3fn, dtypes.float8_e5m2
I8, I16, I32, I64, U8, BOOL = dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.bool_
ALL = (F32, F16, BF16, F64, E4M3, E5M2, I8, I16, I32, I64, U8, BOOL)
UNARY_MATH = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "erf", "sin", "cos")
PY_DTYPES = {int: I32, float: F32, bool: BOOL}  # the dtype a Python number takes on its own
REDUCIBLE = (F32, F16, BF16, F64, E4M3, E5M2, I8, I16, I32, I64, U8)  # reductions refuse bool arrays
LOOP_ROWS = 6  # an output's extent along each enclosing loop (iterations past it are dropped stores)
MAX_OUTPUTS = 10  # few enough that kernels stay small (a kernel may take 32764 bytes of parameters)
MAX_INPUTS = 8
MAX_HELPERS = 3


@dataclasses.dataclass(frozen=True)
class Ty:
    """A value's type: a dtype and shape, or a weak Python number (dtype None, `py` int/float/bool). A view is
    an `x[:, None]` or keepdims result: it broadcasts, but is not an array of its own."""

    dtype: DType | None
    shape: tuple[int, ...] = ()
    py: type | None = None
    view: bool = False


def weak(py: type) -> Ty:
    return Ty(None, (), py)


def promote(a: DType, b: DType) -> DType:
    """The language's promotion (torch's rules for mgjit's types): the spec the reference follows."""
    if a == b:
        return a
    if a.is_float != b.is_float:
        return a if a.is_float else b
    if a.is_float:
        if {a, b} <= {F16, BF16} or {a, b} == {E4M3, E5M2}:
            return F32 if {a, b} == {F16, BF16} else F16
        return a if a.bits > b.bits else b
    if BOOL in (a, b):
        return b if a == BOOL else a
    if {a, b} == {I8, U8}:
        return I16
    if U8 in (a, b):
        other = b if a == U8 else a
        return other if other.bits > 8 else I16
    return a if a.bits > b.bits else b


@dataclasses.dataclass
class Node:
    """An expression: `op` names its production (see fuzz_ref.EVAL), `args` its sub-expressions."""

    op: str
    ty: Ty
    args: list["Node"] = dataclasses.field(default_factory=list)
    attrs: dict = dataclasses.field(default_factory=dict)

    def walk(self):
        yield self
        for a in self.args:
            yield from a.walk()


@dataclasses.dataclass
class Stmt:
    """kind: assign (names, value, aug), store (out, sizes, starts, value, aug), if (cond, body, orelse),
    for (name, bounds, carried: the dtype each Python number it carries settles on; body), static_for (name,
    count, body), const_if (cond source, taken, body, orelse)."""

    kind: str
    attrs: dict
    body: list["Stmt"] = dataclasses.field(default_factory=list)
    orelse: list["Stmt"] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Tensor:
    """A tensor argument: `data` is the whole buffer, `view` how the kernel sees it (offset, transposed or
    row-padded views of it test alignment and strides)."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    layout: str = "contiguous"
    data: torch.Tensor | None = None

    def view_of(self, buffer: torch.Tensor) -> torch.Tensor:
        n = 1
        for d in self.shape:
            n *= d
        if self.layout == "offset":
            return buffer[1:1 + n].view(self.shape)
        if self.layout == "transposed":
            return buffer[:n].view(self.shape[::-1]).t()
        if self.layout == "padded":
            rows, cols = self.shape
            return buffer[:rows * (cols + 3)].view(rows, cols + 3)[:, :cols]
        return buffer[:n].view(self.shape)


@dataclasses.dataclass
class Helper:
    name: str
    params: list[tuple[str, Ty]]
    body: list[Stmt]
    returns: list[Node]


@dataclasses.dataclass
class Program:
    seed: int
    num_warpgroups: int
    grid: int
    inputs: list[Tensor]
    outputs: list[Tensor]
    scalars: list[tuple[str, Any]]  # runtime int/float/bool arguments and their values
    consts: list[tuple[str, Any]]  # constexpr arguments and their values
    helpers: list[Helper]
    body: list[Stmt]

    @property
    def rows(self) -> int:
        return self.grid * self.num_warpgroups


# ---------------------------------------------------------------------------------------------- values

def random_values(rng: random.Random, dtype: DType, n: int, specials: bool) -> torch.Tensor:
    """n elements of `dtype`: mostly small, sometimes the whole range, and (if `specials`) infinities, NaN
    and signed zeros."""
    g = torch.Generator().manual_seed(rng.getrandbits(32))
    if dtype == BOOL:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_float:
        scale = rng.choice([1.0, 1.0, 4.0, 100.0, 1e-3])
        x = torch.randn(n, generator=g, dtype=torch.float64) * scale
        if rng.random() < 0.3:
            x = x.round()
        if specials:
            pick = torch.rand(n, generator=g)
            table = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan")], dtype=torch.float64)
            x = torch.where(pick < 0.08, table[torch.randint(0, 5, (n,), generator=g)], x)
        return x.to(getattr(torch, dtype.torch_name))
    lo, hi = (0, 2 ** dtype.bits) if dtype == U8 else (-2 ** (dtype.bits - 1), 2 ** (dtype.bits - 1) - 1)
    if rng.random() < 0.6:
        lo, hi = max(lo, -12), min(hi, 13)
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(getattr(torch, dtype.torch_name))


def literal(rng: random.Random, py: type, dtype: DType | None = None) -> Any:
    """A Python number that fits `dtype` (the weak literal takes the other operand's type)."""
    if py is bool:
        return rng.random() < 0.5
    if py is float:
        return rng.choice([0.5, 1.0, 2.0, -1.5, 3.0, 0.0, 1e-3, 10.0, -0.25, 100.0])
    lo, hi = (-3, 9)
    if dtype is not None and dtype.is_int and dtype != BOOL:
        lo, hi = (0, 9) if dtype == U8 else (-8, 9)
        if rng.random() < 0.15:
            hi = min(2 ** (dtype.bits - 1) - 1, 1000) if dtype != U8 else 255
    return rng.randint(lo, hi)


def fill_value(rng: random.Random, dtype: DType) -> Any:
    """A value for mgjit.load's other= that `dtype` holds: infinities, NaN and signed zeros among the floats
    (finite ones for fp8, which saturates them where the language rounds), any in range for the integers."""
    if dtype == BOOL:
        return rng.random() < 0.5
    if dtype.is_int:
        low, high = dtype.int_range
        return rng.choice([low, high, -1 if low < 0 else 1, 7])
    if dtype in (E4M3, E5M2):
        return rng.choice([-1.5, 0.5, -0.0, 2.0])
    return rng.choice([-math.inf, math.inf, math.nan, -0.0, 0.5, -1.5])


def lit(value: Any) -> Node:
    return Node("lit", weak(type(value)), attrs={"value": value})


def var(name: str, ty: Ty = Ty(I32)) -> Node:
    return Node("var", ty, attrs={"name": name})


def binop(kind: str, a: Node, b: Node) -> Node:
    """An integer binary op; weak (folded in Python) when both operands are."""
    ty = Ty(I32) if a.ty.dtype is not None or b.ty.dtype is not None else weak(int)
    return Node("binary", ty, [a, b], {"kind": kind, "form": "op"})


def buffer_elems(t: Tensor) -> int:
    n = 1
    for d in t.shape:
        n *= d
    return t.shape[0] * (t.shape[1] + 3) if t.layout == "padded" else n + 1


def broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    out: list[int] = []
    for i in range(1, max(len(s) for s in shapes) + 1):
        dims = {s[-i] for s in shapes if i <= len(s)} - {1}
        if len(dims) > 1:
            return None
        out.append(dims.pop() if dims else 1)
    return tuple(out[::-1])


# ---------------------------------------------------------------------------------------------- source text

_OPS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%", "pow": "**", "and": "&",
        "or": "|", "xor": "^", "shl": "<<", "shr": ">>", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==",
        "ne": "!="}


def dtype_source(d: DType) -> str:
    return "mgjit.bool_" if d == BOOL else f"mgjit.{d.name}"


def expr_source(n: Node) -> str:
    a = [expr_source(x) for x in n.args]
    op, at = n.op, n.attrs
    if op == "var":
        return at["name"]
    if op == "lit":
        return f"({at['value']!r})" if not isinstance(at["value"], bool) and at["value"] < 0 else repr(at["value"])
    if op in ("pid", "nprog"):
        return "mgjit.program_id(0)" if op == "pid" else "mgjit.num_programs(0)"
    if op == "wgid":
        return "mgjit.warpgroup_id()"
    if op == "refdim":
        return f"{at['ref']}.shape[{at['axis']}]"
    if op == "full":
        shape, dtype = _shape_source(n.ty.shape), dtype_source(n.ty.dtype)
        if at["value"] == 0 and not isinstance(at["value"], bool):
            return f"mgjit.zeros({shape}, {dtype})"
        return f"mgjit.full({shape}, {at['value']!r}, dtype={dtype})"
    if op == "arange":
        size = _size_source(n.ty.shape[0])
        return f"mgjit.arange({size})" if at["start"] == 0 else f"mgjit.arange({at['start']}, {at['start']} + {size})"
    if op in ("load", "gather"):
        items = _window_items(a, at["sizes"]) if op == "load" else a
        if "other" not in at:
            return f"{at['ref']}[{', '.join(items)}]"
        index = _index_source(items)
        other = at["other"]
        fill = f"float('{other}')" if isinstance(other, float) and not math.isfinite(other) else repr(other)
        return f"mgjit.load({at['ref']}, {index}, other={fill})"
    if op == "cast":
        return f"({a[0]}).{n.attrs.get('form', 'astype')}({dtype_source(n.ty.dtype)})"
    if op == "unary":
        kind = at["kind"]
        return {"neg": f"(-{a[0]})", "not": f"(~{a[0]})", "abs": f"abs({a[0]})"}.get(kind, f"mgjit.{kind}({a[0]})")
    if op == "binary":
        kind = at["kind"]
        if kind == "cdiv":
            return f"mgjit.cdiv({a[0]}, {a[1]})"
        if kind in ("min", "max"):
            return f"mgjit.{kind}imum({a[0]}, {a[1]})" if at["form"] == "fn" else f"{kind}({a[0]}, {a[1]})"
        return f"({a[0]} {_OPS[kind]} {a[1]})"
    if op == "compare":
        return f"({a[0]} {_OPS[at['kind']]} {a[1]})"
    if op == "where":
        return f"({a[1]} if {a[0]} else {a[2]})" if at["form"] == "ifexp" else f"mgjit.where({a[0]}, {a[1]}, {a[2]})"
    if op == "reduce":
        kw = ([f"axis={at['axis']!r}"] if at["axis"] is not None else []) + (["keepdims=True"] if at["keepdims"] else [])
        if at["form"] == "fn":
            return f"mgjit.{at['kind']}({', '.join([a[0]] + kw)})"
        return f"({a[0]}).{at['kind']}({', '.join(kw)})"
    if op == "expand":
        return f"({a[0]})[:, None]" if at["axis"] == 1 else f"({a[0]})[None, :]"
    if op == "slice":
        return f"({a[0]})[{', '.join(f'{s}:{s + n}' for s, n in zip(at['starts'], n.ty.shape))}]"
    if op in ("fma", "clz", "popc"):
        return f"mgjit.{op}({', '.join(a)})"
    if op == "call":
        return f"{at['helper']}({', '.join(a)})"
    raise ValueError(op)


def _shape_source(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(_size_source(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _size_source(n: int) -> str:
    return str(n)


def _window_items(starts: list[str], sizes: list) -> list[str]:
    """The index items of a window: an integer where its size is None (the axis squeezed), else a mgjit.ds."""
    return [s if size is None else f"mgjit.ds({s}, {_size_source(size)})" for s, size in zip(starts, sizes)]


def _index_source(items: list[str]) -> str:
    """An index as a call takes it (mgjit.load, mgjit.atomic_add): one item, or a tuple of them."""
    return items[0] if len(items) == 1 else f"({', '.join(items)})"


def stmts_source(stmts: list[Stmt], indent: str) -> list[str]:
    lines = []
    for s in stmts:
        at = s.attrs
        if s.kind == "assign":
            op = f" {_OPS[at['aug']]}= " if at["aug"] else " = "
            lines.append(f"{indent}{', '.join(at['names'])}{op}{expr_source(at['value'])}")
        elif s.kind == "smem":
            ty = at["value"].ty
            several = at["warpgroups"] > 1
            shape = ((at["warpgroups"],) if several else ()) + ty.shape
            cell = f"{at['buf']}[wg]" if several else at["buf"]
            lines += [f"{indent}{at['buf']} = mgjit.smem({shape}, {dtype_source(ty.dtype)})",
                      f"{indent}{cell}[...] = {expr_source(at['value'])}",
                      f"{indent}{at['name']} = {cell}[...]"]
        elif s.kind == "atomic":
            index = _index_source(_window_items([expr_source(x) for x in at["starts"]], at["sizes"]))
            lines.append(f"{indent}mgjit.atomic_{at['kind']}({at['out']}, {index}, {expr_source(at['value'])})")
        elif s.kind == "store":
            items = _window_items([expr_source(x) for x in at["starts"]], at["sizes"])
            op = f" {_OPS[at['aug']]}= " if at.get("aug") else " = "
            if at.get("staged"):
                lines.append(f"{indent}mgjit.store({at['out']}, {_index_source(items)}, {expr_source(at['value'])}, "
                             f"staged=True)")
            else:
                lines.append(f"{indent}{at['out']}[{', '.join(items)}]{op}{expr_source(at['value'])}")
        else:
            head = {"if": lambda: f"if {expr_source(at.get('cond'))}:" if s.kind == "if" else "",
                    "for": lambda: f"for {at['name']} in range({', '.join(expr_source(b) for b in at['bounds'])}):",
                    "static_for": lambda: f"for {at['name']} in mgjit.static_range({at['count']}):",
                    "const_if": lambda: f"if {at['cond']}:"}[s.kind]()
            lines.append(indent + head)
            lines += stmts_source(s.body, indent + "    ") or [indent + "    pass"]
            if s.orelse:
                lines.append(indent + "else:")
                lines += stmts_source(s.orelse, indent + "    ")
    return lines


def source(p: Program, name: str = "fuzz_kernel") -> str:
    """The program as a module: its helpers and the kernel."""
    lines = [f"# mgjit fuzz kernel, seed {p.seed}", "import mgjit", ""]
    for h in p.helpers:
        lines += ["", "@mgjit.device", f"def {h.name}({', '.join(n for n, _ in h.params)}):"]
        lines += stmts_source(h.body, "    ")
        lines.append(f"    return {', '.join(expr_source(r) for r in h.returns)}")
        lines.append("")
    params = [t.name for t in p.inputs + p.outputs] + [n for n, _ in p.scalars] + \
             [f"{n}: mgjit.constexpr" for n, _ in p.consts]
    deco = "@mgjit.kernel" if p.num_warpgroups == 1 else f"@mgjit.kernel(num_warpgroups={p.num_warpgroups})"
    lines += ["", deco, f"def {name}({', '.join(params)}):"]
    lines += stmts_source(p.body, "    ")
    return "\n".join(lines) + "\n"

