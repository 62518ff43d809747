"""Random valid mgjit kernels for differential fuzzing (issue 10, item 4): a grammar of typed expressions
and statements (fuzz_program.py holds the tree and prints it as source).

The grammar, by the type (dtype, shape) an expression must have: variables, launch scalars, program and
warpgroup ids, reference sizes, GMEM windows `x[r, mgjit.ds(start, N)]` (dynamic starts, ragged edges),
gathers `x[rows, cols]` (integer arrays among the indices, broadcast; indices outside read zero or other=),
arange/full/zeros, casts, unary math, binary and comparison operators (numpy broadcasting, `x[:, None]`, weak
Python numbers, operands of mixed dtypes), where/minimum/maximum/fma/clz/popc, reductions on any axis (keepdims
too), static slices of register arrays (`x[a:b, c:d]`), @mgjit.device helpers. Statements: assignments, stores
(of 2D values half the time as `mgjit.store(out, index, value, staged=True)`), runtime `for`/`if` (nested),
static_range, constexpr branches. Every choice comes from seeded random.Randoms: a seed is a program.

What the language refuses (each a CompileError at the user's line, tested elsewhere) is not generated:
reductions of bool arrays, and of `x[:, None]`-style views; - // % << >> ** on bools; a Python
number that does not fit the dtype it meets (-3 with a uint8 array); arrays needing more than 255 registers a
thread; more parameters than the target's parameter space; variables that change dtype or shape in a runtime
loop or branch. Stores never race: see fuzz_program.py.
"""
from __future__ import annotations

import math
import random
from typing import Any

from fuzz_program import (ALL, BOOL, F32, I8, I32, I64, LOOP_ROWS, MAX_HELPERS, MAX_INPUTS, MAX_OUTPUTS, PY_DTYPES,
                          REDUCIBLE, fill_value,
                          U8, UNARY_MATH, Helper, Node, Program, Stmt, Tensor, Ty, broadcast, buffer_elems, binop,
                          lit, literal, promote, random_values, var, weak)
from mgjit.dtypes import DType

# ---------------------------------------------------------------------------------------------- the generator

class Generator:
    """Builds one random Program from a seed."""

    def __init__(self, seed: int, max_depth: int = 3, max_stmts: int = 10):
        self.rng = random.Random(seed)
        self.fills = random.Random(f"{seed} fills")  # loads' other=, drawn apart: a seed's program is as before
        self.smem_rng = random.Random(f"{seed} smem")  # where an array goes through SMEM: seeds without one keep theirs
        self.atomic_rng = random.Random(f"{seed} atomics")  # likewise for atomics
        self.gather_rng = random.Random(f"{seed} gathers")  # and for gathers
        self.staged_rng = random.Random(f"{seed} staged")  # and for staged stores
        self.slice_rng = random.Random(f"{seed} slices")  # and for static slices of register arrays
        self.seed = seed
        self.max_depth = max_depth
        self.max_stmts = max_stmts
        r = self.rng
        self.num_warpgroups = r.choice([1, 1, 1, 2, 3])
        self.grid = r.choice([1, 1, 2, 3])
        self.specials = r.random() < 0.3
        self.R, self.C = r.choice([(8, 16), (4, 32), (16, 16), (2, 64), (8, 8), (1, 8), (32, 4), (4, 128)])
        self.N = r.choice([self.C, self.C, 64, 128, 256, 16, 1, 512])
        self.dtypes = r.sample(ALL, r.randint(2, 4)) + [r.choice([F32, I32])]
        self.inputs: list[Tensor] = []
        self.outputs: list[Tensor] = []
        self.scalars: list[tuple[str, Any]] = []
        self.consts: list[tuple[str, Any]] = [("C0", r.randint(0, 4)), ("BLOCK", self.N)]
        self.helpers: list[Helper] = []
        self.scope: list[dict[str, Ty]] = [{}]
        self.loops: list[Node] = []  # enclosing loop variables (rows of the outputs stored in them)
        self.static_vars: list[str] = []
        self.in_helper = False
        self.indexing = False
        for i, (py, value) in enumerate([(int, r.randint(-2, 5)), (int, r.choice([r.randint(0, 40), 16, 32])),
                                         (float, r.choice([0.5, -2.0, 3.25, 1e-2])), (bool, r.random() < 0.5),
                                         (int, r.choice([3, 2 ** 33 + 5, -7]))]):
            self.scalars.append((f"s{i}", value))

    # -- scope
    def vars(self) -> dict[str, Ty]:
        out: dict[str, Ty] = {}
        for frame in self.scope:
            out.update(frame)
        return out

    def declare(self, name: str, ty: Ty) -> None:
        for frame in reversed(self.scope):
            if name in frame:
                return
        self.scope[-1][name] = ty

    def fresh(self) -> str:
        self.counter = getattr(self, "counter", 0) + 1
        return f"v{self.counter}"

    def scalar_ty(self, value: Any) -> Ty:
        if isinstance(value, bool):
            return Ty(BOOL)
        if isinstance(value, float):
            return Ty(F32)
        return Ty(I32 if -2 ** 31 <= value < 2 ** 31 else I64)

    # -- shapes
    def shape(self) -> tuple[int, ...]:
        r = self.rng.random()
        return () if r < 0.2 else (self.N,) if r < 0.45 else (self.C,) if r < 0.6 else (self.R,) if r < 0.7 \
            else (self.R, self.C)

    def dtype(self) -> DType:
        return self.rng.choice(self.dtypes) if self.rng.random() < 0.85 else self.rng.choice(ALL)

    # -- expressions
    def expr(self, ty: Ty, depth: int) -> Node:
        """An expression of exactly type `ty` (not a view)."""
        r = self.rng
        if ty.shape and not self.in_helper and self.gather_rng.random() < 0.05:
            gathered = self.gather(ty, depth)
            if gathered is not None:
                return gathered
        # Sides capped: a slice's source is 2-4x as large a side, nested slices grow again, and the inputs loaded
        # for them must fit the PTX simulator's memory.
        if ty.shape and depth < self.max_depth and max(ty.shape) <= 128 and math.prod(ty.shape) <= 512 \
                and self.slice_rng.random() < 0.02:
            return self.sliced(ty, depth)
        leaf = depth >= self.max_depth or r.random() < 0.15
        choices = self.leaf_options(ty) if leaf else self.leaf_options(ty) + self.inner_options(ty, depth)
        return r.choice(choices)()

    def sliced(self, ty: Ty, depth: int) -> Node:
        """`x[a:b, c:d]` of a larger array (twice or four times a side): starts on whole multiples of the slice's
        sides (often whole tiles of the larger array's layout: registers selected) or anywhere (through SMEM)."""
        r = self.slice_rng
        if len(ty.shape) == 1:
            src = (r.choice([2, 4]) * ty.shape[0],)
        else:
            src = r.choice([(2 * ty.shape[0], ty.shape[1]), (ty.shape[0], 2 * ty.shape[1]),
                            (2 * ty.shape[0], 2 * ty.shape[1])])
        aligned = r.random() < 0.5
        starts = [r.randrange(0, m - n + 1, n if aligned else 1) for m, n in zip(src, ty.shape)]
        return Node("slice", ty, [self.expr(Ty(ty.dtype, src), depth + 1)], {"starts": starts})

    def leaf_options(self, ty: Ty) -> list:
        d, shape = ty.dtype, ty.shape
        opts = []
        names = [n for n, t in self.vars().items() if t == ty]
        if names:
            opts += [lambda: Node("var", ty, attrs={"name": self.rng.choice(names)})] * 3
        if not self.in_helper:
            if shape or self.rng.random() < 0.5:
                opts.append(lambda: self.load(ty))
            for name, value in self.scalars:
                if self.scalar_ty(value) == ty:
                    opts.append(lambda name=name: Node("var", ty, attrs={"name": name}))
            if ty == Ty(I32):
                opts += [lambda: Node("pid", ty), lambda: self.index_expr(typed=True), lambda: Node("nprog", ty)]
        if shape:
            opts.append(lambda: Node("full", ty, attrs={"value": literal(self.rng, self.py_of(d), d)}))
        if shape and len(shape) == 1 and d == I32:
            opts.append(lambda: Node("arange", ty, attrs={"start": self.rng.choice([0, 0, 3, -5])}))
        if not opts:  # a scalar of a dtype nothing provides: cast a program id
            opts.append(lambda: Node("cast", ty, [Node("pid", Ty(I32))]))
        return opts

    def py_of(self, d: DType) -> type:
        return float if d.is_float else bool if d == BOOL else int

    def inner_options(self, ty: Ty, depth: int) -> list:
        d, shape = ty.dtype, ty.shape
        nxt = depth + 1
        opts = [lambda: Node("cast", ty, [self.expr(Ty(self.other_dtype(d), shape), nxt)],
                             {"form": self.rng.choice(["astype", "astype", "to"])})] * 2
        opts += [lambda: self.binary(ty, nxt)] * 4
        if d == BOOL:
            opts += [lambda: self.compare(ty, nxt)] * 3
            opts.append(lambda: Node("unary", ty, [self.expr(ty, nxt)], {"kind": "not"}))
        else:
            opts.append(lambda: Node("unary", ty, [self.expr(ty, nxt)], {"kind": self.rng.choice(["neg", "abs"])}))
        if d.is_float:
            opts += [lambda: self.math(ty, nxt)] * 2
            opts.append(lambda: Node("fma", ty, self.operands(ty, nxt, 3, allow_weak=False)))
        if d.is_int and d != BOOL:
            opts.append(lambda: Node("unary", ty, [self.expr(ty, nxt)], {"kind": "not"}))
            opts.append(lambda: Node(self.rng.choice(["clz", "popc"]), ty, [self.expr(ty, nxt)]))
        opts += [lambda: self.where(ty, nxt)] * 2
        if d in REDUCIBLE and len(shape) < 2:
            opts += [lambda: self.reduce(ty, nxt)] * 2
        if not self.in_helper and depth <= 1 and len(self.helpers) < MAX_HELPERS:
            opts.append(lambda: self.call(ty, nxt))
        return opts

    def other_dtype(self, d: DType) -> DType:
        return self.rng.choice([x for x in self.dtypes + [self.rng.choice(ALL)] if x != d] or [F32])

    def operand(self, ty: Ty, shape: tuple[int, ...], depth: int, allow_weak: bool = True) -> Node:
        """An operand that broadcasts to `shape` in an op of dtype `ty.dtype`: the full shape, a trailing part,
        a view (`x[:, None]`, `x[None, :]`, a keepdims reduction), a scalar, or a weak Python number."""
        r, d = self.rng, ty.dtype
        x = r.random()
        if allow_weak and x < 0.15 and d != BOOL:
            if self.static_vars and d.is_int and r.random() < 0.5:
                return Node("var", weak(int), attrs={"name": r.choice(self.static_vars)})
            if d.is_int and not self.in_helper and r.random() < 0.3:
                return Node("var", weak(int), attrs={"name": "C0"})
            return Node("lit", weak(self.py_of(d)), attrs={"value": literal(r, self.py_of(d), d)})
        if len(shape) == 2 and x < 0.55:
            R, C = shape
            y = r.random()
            if y < 0.3:
                return self.expr(Ty(d, (C,)), depth)
            if y < 0.6:
                return Node("expand", Ty(d, (R, 1), view=True), [self.expr(Ty(d, (R,)), depth)], {"axis": 1})
            if y < 0.8:
                return Node("expand", Ty(d, (1, C), view=True), [self.expr(Ty(d, (C,)), depth)], {"axis": 0})
            if d in REDUCIBLE:
                return self.reduce(Ty(d, (R, 1), view=True), depth)
        if shape and x < 0.3:
            return self.expr(Ty(d), depth)
        return self.expr(Ty(d, shape), depth)

    def operands(self, ty: Ty, depth: int, n: int = 2, allow_weak: bool = True) -> list[Node]:
        """n operands whose broadcast is exactly ty.shape, and not a view (views with only scalars stay one)."""
        for _ in range(8):
            ops = [self.operand(ty, ty.shape, depth, allow_weak and i == n - 1) for i in range(n)]
            arrays = [o.ty for o in ops if o.ty.shape]
            stays_view = arrays and all(t.view for t in arrays) and len({t.shape for t in arrays}) == 1
            if broadcast([o.ty.shape for o in ops]) == ty.shape and not stays_view:
                if self.rng.random() < 0.5:
                    ops.reverse()
                return ops
        return [self.expr(ty, depth) for _ in range(n)]

    def binary(self, ty: Ty, depth: int) -> Node:
        r, d = self.rng, ty.dtype
        if d == BOOL:
            kinds = ["and", "or", "xor", "min", "max", "add", "mul"]
        elif d.is_float:
            kinds = ["add", "sub", "mul", "div", "min", "max", "floordiv", "mod", "pow", "add", "mul"]
        else:
            kinds = ["add", "sub", "mul", "floordiv", "mod", "min", "max", "and", "or", "xor", "shl", "shr", "cdiv"]
        kind = r.choice(kinds)
        if kind == "cdiv" and ty.shape:
            kind = "add"
        # Mixed dtypes that promote to d, or an int division giving a float.
        operand_ty = ty
        if kind == "div" and d == F32 and r.random() < 0.3:
            operand_ty = Ty(r.choice([I32, I8, U8, BOOL, I64]), ty.shape)
        ops = self.operands(Ty(operand_ty.dtype, ty.shape), depth, allow_weak=kind not in ("cdiv",))
        if r.random() < 0.3 and operand_ty == ty:
            ops = self.mixed(ops, [(x, y) for x in ALL for y in ALL if promote(x, y) == d])
        form = r.choice(["op", "op", "fn"]) if kind in ("min", "max") else "op"
        return Node("binary", ty, ops, {"kind": kind, "form": form})

    def mixed(self, ops: list[Node], pairs: list[tuple[DType, DType]]) -> list[Node]:
        """Two operands cast to one of `pairs` of dtypes, to exercise promotion."""
        if any(o.ty.dtype is None for o in ops):  # a Python number takes its partner's dtype: no pair to pick
            return ops
        pair = self.rng.choice(pairs)
        return [o if o.ty.dtype == want else Node("cast", Ty(want, o.ty.shape, view=o.ty.view), [o])
                for o, want in zip(ops, pair)]

    def compare(self, ty: Ty, depth: int) -> Node:
        d = self.dtype()
        kind = self.rng.choice(["lt", "le", "gt", "ge", "eq", "ne"])
        ops = self.operands(Ty(d, ty.shape), depth)
        if self.rng.random() < 0.3:
            ops = self.mixed(ops, [(x, y) for x in ALL for y in ALL])
        return Node("compare", ty, ops, {"kind": kind})

    def where(self, ty: Ty, depth: int) -> Node:
        cond = self.operand(Ty(BOOL), ty.shape, depth, allow_weak=False)
        a, b = self.operands(ty, depth)
        form = "ifexp" if self.rng.random() < 0.3 else "where"
        return Node("where", ty, [cond, a, b], {"form": form})

    def math(self, ty: Ty, depth: int) -> Node:
        kind = self.rng.choice(UNARY_MATH)
        src = Ty(self.rng.choice([I32, I8, BOOL]), ty.shape) if ty.dtype == F32 and self.rng.random() < 0.2 else ty
        return Node("unary", ty, [self.expr(src, depth)], {"kind": kind})

    def reduce(self, ty: Ty, depth: int) -> Node:
        """A reduction whose result has type ty (a view: keepdims)."""
        r, d = self.rng, ty.dtype
        kind = r.choice(["sum", "max", "min"])
        form = r.choice(["method", "fn"])
        if ty.view:  # (R, 1) from (R, C), keepdims over axis 1
            R = ty.shape[0]
            return Node("reduce", ty, [self.expr(Ty(d, (R, min(self.C, 2048 // R))), depth)],
                        {"kind": kind, "axis": r.choice([1, -1]), "keepdims": True, "form": form})
        if not ty.shape:
            src = r.choice([(self.N,), (self.C,), (self.R, self.C)])
            axis = r.choice([None, None, tuple(range(len(src)))]) if len(src) == 2 else r.choice([None, 0, -1])
            keepdims = len(src) == 2 and axis is None and r.random() < 0.3
            return Node("reduce", ty, [self.expr(Ty(d, src), depth)],
                        {"kind": kind, "axis": axis, "keepdims": keepdims, "form": form})
        (n,) = ty.shape
        other = self.rng.choice([x for x in (1, 2, 4, 8, 16) if x * n <= 2048])
        axis = r.choice([0, 1])
        src = (other, n) if axis == 0 else (n, other)
        return Node("reduce", ty, [self.expr(Ty(d, src), depth)],
                    {"kind": kind, "axis": axis if r.random() < 0.7 else axis - 2, "keepdims": False, "form": form})

    def load(self, ty: Ty) -> Node:
        """A GMEM window of an input of ty's dtype (made on first use): rank 1 or 2, dynamic starts."""
        r, d, shape = self.rng, ty.dtype, ty.shape
        want_rank = r.choice([1, 2]) if len(shape) < 2 else 2
        want_rank = max(want_rank, len(shape))
        cands = [t for t in self.inputs if t.dtype == d and len(t.shape) == want_rank]
        if (not cands or r.random() < 0.2) and len(self.inputs) < MAX_INPUTS:
            extent = max(shape) if shape else 4
            dims = tuple(r.randint(1, 2 * extent + 3) for _ in range(want_rank))
            if r.random() < 0.3:  # a last dimension of whole 16-byte vectors: accesses may be vectorized
                dims = dims[:-1] + (16 * r.randint(1, max(1, dims[-1] // 16 + 1)),)
            layout = r.choice(["contiguous", "contiguous", "offset"] + (["transposed", "padded"] if want_rank == 2 else []))
            cands = [Tensor(f"x{len(self.inputs)}", d, dims, layout)]
            self.inputs += cands
        if not cands:  # as many inputs as allowed: load one of another dtype and cast it
            others = [t for t in self.inputs if len(t.shape) >= len(shape)]
            if not others:
                return Node("full", ty, attrs={"value": literal(r, self.py_of(d), d)})
            t = r.choice(others)
            return Node("cast", ty, [self.load_from(t, Ty(t.dtype, shape))])
        return self.load_from(r.choice(cands), ty)

    def load_from(self, t: Tensor, ty: Ty) -> Node:
        shape = ty.shape
        sizes = [None] * (len(t.shape) - len(shape)) + list(shape)  # None: an integer index (the axis squeezed)
        if sizes == [None, shape[0] if shape else None] and shape and self.rng.random() < 0.3:
            sizes = [shape[0], None]  # a column: elements a row stride apart
        attrs = {"ref": t.name, "sizes": sizes}
        if self.fills.random() < 0.25:  # mgjit.load(x, index, other=v): what lies outside reads v
            attrs["other"] = fill_value(self.fills, t.dtype)
        return Node("load", ty, [self.index_expr() for _ in sizes], attrs)

    def gather(self, ty: Ty, depth: int) -> Node | None:
        """ref[i, j] with integer arrays among its indices, broadcast to ty's shape, from an input of ty's dtype
        (None where there is none): each axis an int32 array (`positions`) or an index scalar, at least one an
        array; a 2D gather from a 2D input may take a column and a row of positions instead."""
        g, shape = self.gather_rng, ty.shape
        cands = [t for t in self.inputs if t.dtype == ty.dtype]
        if not cands:
            return None
        t = g.choice(cands)
        arrays = [g.random() < 0.6 for _ in t.shape]
        if not any(arrays):
            arrays[g.randrange(len(arrays))] = True
        grid = len(shape) == 2 and len(t.shape) == 2 and g.random() < 0.4
        index = []
        for axis, array in enumerate(arrays):
            if grid:
                line = self.positions((shape[axis],), depth)
                index.append(Node("expand", Ty(I32, (shape[0], 1) if axis == 0 else (1, shape[1])), [line],
                                  {"axis": 1 - axis}))
            else:
                index.append(self.positions(shape, depth) if array else self.index_expr(typed=True))
        attrs = {"ref": t.name}
        if g.random() < 0.3:
            attrs["other"] = fill_value(g, t.dtype)
        return Node("gather", ty, index, attrs)

    def positions(self, shape: tuple[int, ...], depth: int) -> Node:
        """An int32 array of `shape`: an arange plus an index scalar (a 1D one, mostly inside the tensor), or any
        int32 expression."""
        if len(shape) == 1 and self.gather_rng.random() < 0.6:
            start = Node("arange", Ty(I32, shape), attrs={"start": 0})
            return Node("binary", Ty(I32, shape), [start, self.index_expr(typed=True)], {"kind": "add", "form": "op"})
        return self.expr(Ty(I32, shape), depth + 1)

    def index_expr(self, typed: bool = False) -> Node:
        """A small integer scalar: program or warpgroup id, loop variables, launch ints, sizes, literals, and
        sums of those. Weak (a Python int) where all its parts are, unless `typed`."""
        r = self.rng
        bases = [lambda: lit(r.randint(-4, 12))]
        if not self.in_helper:
            bases += [lambda: var("pid"), lambda: var("s0"), lambda: var("s1")]
            if self.inputs:
                t = r.choice(self.inputs)
                bases.append(lambda: Node("refdim", Ty(I32), attrs={"ref": t.name, "axis": r.randrange(len(t.shape))}))
        if self.num_warpgroups > 1 and not self.in_helper:
            bases.append(lambda: var("wg"))
        bases += [lambda v=v: Node("var", v.ty, attrs=dict(v.attrs)) for v in self.loops]
        if not typed and not self.in_helper and not self.indexing:
            bases.append(lambda: var("s4", Ty(I64)))
            ints = [t for t in self.inputs if t.dtype in (I32, I8, I64) and len(t.shape) == 1]  # signed: -3 + x
            if ints:  # an index loaded from memory: a gather
                t = r.choice(ints)
                bases.append(lambda: self.indexed(lambda: self.load_from(t, Ty(t.dtype))))
        a = r.choice(bases)()
        if r.random() < 0.5:
            b = r.choice(bases)() if r.random() < 0.5 else lit(r.randint(1, 4))
            a = binop(r.choice(["add", "sub", "mul"] if b.op == "lit" else ["add", "sub"]), a, b)
        return binop("add", var("pid"), a) if typed and a.ty.dtype is None else a

    def indexed(self, make):
        """make(), with no index loaded from memory (nor the int64 launch value) inside it."""
        self.indexing = True
        try:
            return make()
        finally:
            self.indexing = False

    def call(self, ty: Ty, depth: int) -> Node:
        """A call of a new @mgjit.device helper returning ty."""
        params = [(f"p{i}", Ty(self.dtype(), self.rng.choice([ty.shape, ()]))) for i in range(self.rng.randint(1, 3))]
        args = [self.expr(pty, depth) for _, pty in params]
        saved = self.scope, self.loops, self.static_vars
        self.scope, self.loops, self.static_vars, self.in_helper = [dict(params)], [], [], True
        body = self.block(2, depth)
        returns = [self.expr(ty, depth)]
        self.scope, self.loops, self.static_vars = saved
        self.in_helper = False
        helper = Helper(f"helper{len(self.helpers)}", params, body, returns)
        self.helpers.append(helper)
        return Node("call", ty, args, {"helper": helper.name})

    # -- statements
    def block(self, n: int, depth: int) -> list[Stmt]:
        return [s for _ in range(n) for s in self.stmt(depth)]

    def stmt(self, depth: int) -> list[Stmt]:
        r = self.rng
        if not self.in_helper and self.smem_rng.random() < 0.08:
            return [self.smem_stmt()]
        if not self.in_helper and self.atomic_rng.random() < 0.05 and len(self.outputs) < MAX_OUTPUTS:
            return [self.atomic_stmt()]
        x = r.random()
        control = depth < 2
        if control and x < 0.12:
            return self.for_stmt(depth)
        if control and x < 0.22:
            return [self.if_stmt(depth)]
        if control and x < 0.27:
            return [self.static_for(depth)]
        if x < 0.31 and not self.in_helper and depth < 3:
            return [self.const_if(depth)]
        if not self.in_helper and x < 0.45 and len(self.outputs) < MAX_OUTPUTS:
            return [self.store(self.expr(Ty(self.dtype(), self.shape()), 0))]
        existing = [(n, t) for n, t in self.vars().items() if n[0] in "vp" and n[1:].isdigit()]
        if existing and x < 0.65:
            name, ty = r.choice(existing)
            aug = r.choice(AUG[_category(ty.dtype)]) if r.random() < 0.2 else None
            return [Stmt("assign", {"names": [name], "value": self.expr(ty, 0), "aug": aug})]
        ty = Ty(self.dtype(), self.shape())
        name = self.fresh()
        value = self.expr(ty, 0)
        self.declare(name, ty)
        return [Stmt("assign", {"names": [name], "value": value, "aug": None})]

    def smem_stmt(self) -> Stmt:
        """`v = <array through SMEM>`: a buffer allocated where it stands (in loops and branches too), the array
        stored into it and read back; a kernel of several warpgroups gives each its own slice of the buffer."""
        shape = self.shape() or (self.C,)
        ty = Ty(self.dtype(), shape)
        value = self.expr(ty, 0)
        name = self.fresh()
        self.declare(name, ty)
        return Stmt("smem", {"name": name, "buf": f"buf_{name}", "value": value,
                             "warpgroups": self.num_warpgroups})

    def atomic_stmt(self) -> Stmt:
        """`mgjit.atomic_add/min/max(out, window, value)` on an int32 output of its own, at a start shared by every
        program and warpgroup (they contend), possibly ragged: the old values are not used (their order is the
        schedule's), the result is (integer add, min and max commute)."""
        r = self.rng
        shape = self.shape()
        value = self.expr(Ty(I32, shape), 0)
        kind = r.choice(["add", "add", "min", "max"])
        dims = [r.choice([n, n + r.randint(0, 5), max(1, n - r.randint(1, 5))]) for n in shape] or [r.randint(1, 3)]
        sizes = list(shape) or [None]
        starts = [r.choice([lit(r.randint(-2, 2)), var("s0"), lit(0)]) for _ in shape] or [lit(r.randrange(dims[0]))]
        out = Tensor(f"out{len(self.outputs)}", I32, tuple(dims), r.choice(["contiguous", "offset"]))
        self.outputs.append(out)
        return Stmt("atomic", {"out": out.name, "kind": kind, "sizes": sizes, "starts": starts, "value": value})

    def nested(self, depth: int, extra: dict[str, Ty] | None = None) -> list[Stmt]:
        self.scope.append(dict(extra or {}))
        body = self.block(self.rng.randint(1, 3), depth + 1)
        self.scope.pop()
        return body

    def for_stmt(self, depth: int) -> list[Stmt]:
        r = self.rng
        name = f"i{len(self.loops)}"
        lo = r.choice([lit(r.randint(-1, 2)), self.indexed(self.index_expr)])  # no loaded bound: a few trips
        hi = binop("add", lo, lit(r.randint(0, 4))) if r.random() < 0.7 or self.in_helper else var("s0")
        step = [lit(r.choice([1, 1, 2]))] if r.random() < 0.5 else []
        self.loops.append(var(name))
        body = self.nested(depth, {name: Ty(I32)})
        self.loops.pop()
        if r.random() > 0.3:
            return [Stmt("for", {"name": name, "bounds": [lo, hi] + step}, body)]
        # acc = <a Python number>; for ...: acc = acc + x: acc enters the loop as the dtype the loop settles on,
        # the promotion of the number's own dtype (int32, float32, bool) and x's.
        py = r.choice([int, float, bool])
        acc, d = self.fresh(), self.dtype()
        carried = promote(PY_DTYPES[py], d)
        step_value = Node("binary", Ty(carried), [var(acc, Ty(carried)), self.expr(Ty(d), 1)],
                          {"kind": r.choice(["add", "max"]), "form": "op"})
        body.insert(r.randrange(len(body) + 1), Stmt("assign", {"names": [acc], "value": step_value, "aug": None}))
        self.declare(acc, Ty(carried))
        return [Stmt("assign", {"names": [acc], "value": lit(literal(r, py)), "aug": None}),
                Stmt("for", {"name": name, "bounds": [lo, hi] + step, "carried": {acc: carried}}, body)]

    def if_stmt(self, depth: int) -> Stmt:
        r = self.rng
        a = self.index_expr() if r.random() < 0.6 else self.expr(Ty(r.choice([F32, I32, BOOL, I8])), 2)
        if a.ty.dtype == BOOL and r.random() < 0.5:
            cond = a
        else:
            b = lit(r.randint(-1, 3))
            cond = Node("compare", Ty(BOOL), [a, b], {"kind": r.choice(["lt", "le", "gt", "ge", "eq", "ne"])})
        body = self.nested(depth)
        orelse = self.nested(depth) if r.random() < 0.5 else []
        return Stmt("if", {"cond": cond}, body, orelse)

    def static_for(self, depth: int) -> Stmt:
        name = f"j{len(self.static_vars)}"
        self.static_vars.append(name)
        self.loops.append(Node("var", weak(int), attrs={"name": name}))
        body = self.nested(depth)
        self.loops.pop()
        self.static_vars.pop()
        return Stmt("static_for", {"name": name, "count": self.rng.randint(1, 3)}, body)

    def const_if(self, depth: int) -> Stmt:
        cond = self.rng.choice(["C0 > 1", "C0 == 0", "BLOCK >= 64", "C0 % 2 == 1"])
        return Stmt("const_if", {"cond": cond}, self.nested(depth), self.nested(depth) if self.rng.random() < 0.5 else [])

    def store(self, value: Node) -> Stmt:
        """Store `value` (cast to the output's dtype) into a new output at this (program, warpgroup)'s row,
        the enclosing loops' iterations, and a window at a loop-invariant (possibly ragged) start."""
        r = self.rng
        ty = value.ty
        out_dtype = ty.dtype if r.random() < 0.6 else self.dtype()
        if out_dtype != ty.dtype:
            value = Node("cast", Ty(out_dtype, ty.shape), [value])
        aug = r.choice(AUG[_category(out_dtype)]) if r.random() < 0.15 else None
        if r.random() < 0.05:  # a Python number, converted to the output's dtype and broadcast
            py = self.py_of(out_dtype) if aug else r.choice([int, float, bool])
            value = lit(literal(r, py, out_dtype if py is int else None))
        dims, sizes, starts = [self.rows()], [None], [var("row")]
        for v in self.loops:
            dims.append(LOOP_ROWS)
            sizes.append(None)
            starts.append(Node("var", v.ty, attrs=dict(v.attrs)))
        for n in ty.shape:
            dims.append(r.choice([n, n, n + r.randint(0, 5), max(1, n - r.randint(1, 5))]))
            sizes.append(n)
            starts.append(r.choice([lit(r.randint(-2, 2)), var("s0"), lit(0)]))
        if not ty.shape:
            dims.append(r.randint(1, 3))
            sizes.append(None)
            starts.append(lit(r.randrange(dims[-1])))
        out = Tensor(f"out{len(self.outputs)}", out_dtype, tuple(dims), r.choice(["contiguous"] * 3 + ["offset"]))
        self.outputs.append(out)
        # mgjit.store(out, index, value, staged=True): 2D values, through shared memory where the layout allows
        staged = len(ty.shape) == 2 and not aug and self.staged_rng.random() < 0.5
        return Stmt("store", {"out": out.name, "sizes": sizes, "starts": starts, "value": value, "aug": aug,
                              "staged": staged})

    def rows(self) -> int:
        return self.grid * self.num_warpgroups

    def program(self) -> Program:
        head = [Stmt("assign", {"names": ["pid"], "value": Node("pid", Ty(I32)), "aug": None})]
        self.scope[0]["pid"] = Ty(I32)
        row = var("pid")
        if self.num_warpgroups > 1:
            head.append(Stmt("assign", {"names": ["wg"], "value": Node("wgid", Ty(I32)), "aug": None}))
            self.scope[0]["wg"] = Ty(I32)
            row = binop("add", binop("mul", row, lit(self.num_warpgroups)), var("wg"))
        head.append(Stmt("assign", {"names": ["row"], "value": row, "aug": None}))
        self.scope[0]["row"] = Ty(I32)
        body = self.block(self.rng.randint(3, self.max_stmts), 0)
        finals = [n for n, t in self.scope[0].items() if n.startswith("v")][-3:]
        body += [self.store(Node("var", self.scope[0][n], attrs={"name": n})) for n in finals]
        if not self.outputs:
            body.append(self.store(self.expr(Ty(self.dtype(), self.shape()), 0)))
        for t in self.inputs + self.outputs:
            t.data = random_values(self.rng, t.dtype, buffer_elems(t), self.specials)
        return Program(self.seed, self.num_warpgroups, self.grid, self.inputs, self.outputs, self.scalars,
                       self.consts, self.helpers, head + body)


def _category(d: DType) -> str:
    return "float" if d.is_float else "bool" if d == BOOL else "int"


AUG = {"float": ["add", "sub", "mul"], "int": ["add", "sub", "mul", "xor", "or", "and"], "bool": ["or", "and", "xor"]}


def generate(seed: int, **kwargs) -> Program:
    return Generator(seed, **kwargs).program()


