"""Structured control flow: `if` and `for` on runtime values become `If` and `For` ops whose results carry the
variables the body reassigns (and the hidden barrier phases); compile-time ones are unrolled; the
`if mgjit.warp_id() == w:` blocks of a block become the regions of one WarpSplit (warp roles). The machinery
takes the body as a callable, so that the statements (tracer.py) and mgjit.pipeline (builtins/pipeline.py)
trace loops and branches the same way.
"""
from __future__ import annotations

import ast
import builtins
from typing import Any, Callable, Iterable, Iterator, Sequence

from .. import dtypes, ir, language as lang, ops
from .registry import loop
from .semantics import Semantics, python_scalar_dtype
from .values import Expanded, Tensor


class Return(Exception):
    """A `return` statement, unwinding to the kernel or helper being traced."""

    def __init__(self, value: Any, node: ast.AST):
        self.value = value
        self.node = node


def assigned_names(stmts: Sequence[ast.stmt]) -> set[str]:
    """The names statements assign (at any depth)."""
    names = set()
    for stmt in stmts:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.add(n.id)
    return names


def hidden(scope: dict[str, Any]) -> set[str]:
    """Variables the trace keeps for the user (barrier phases), carried through loops and ifs like theirs."""
    return {n for n in scope if n.startswith("$")}


class ControlFlow(Semantics):
    """Runtime branches and loops, for any body."""

    _rest_guard: Tensor | None = None

    def run_body(self, stmts: Sequence[ast.stmt]) -> None:
        """Trace statements in order; after one that asked for it (`guard_rest`), the rest of the block runs
        under a runtime `if` (a trailing `return` stays outside it, so that a helper still returns)."""
        for i, stmt in enumerate(stmts):
            self.stmt(stmt)
            guard, self._rest_guard = self._rest_guard, None
            if guard is not None:
                rest = list(stmts[i + 1:])
                tail = rest[-1:] if rest and isinstance(rest[-1], ast.Return) else []
                body = rest[:len(rest) - len(tail)]
                if body:
                    self.branch(guard, lambda: self.run_body(body), lambda: None, assigned_names(body), body[0])
                for last in tail:
                    self.stmt(last)
                return

    def guard_rest(self, cond: Tensor) -> None:
        """Trace the statements after the current one, to the end of their block, under `if cond:`."""
        self._rest_guard = cond

    def branch(self, cond: Tensor | Expanded, then: Callable[[], None], orelse: Callable[[], None],
               assigned: Iterable[str], node: ast.AST) -> None:
        """Trace `if cond: then() else: orelse()` on a runtime condition, at `node`; afterwards the variables of
        `assigned` (and the hidden ones) hold what either branch left in them."""
        if cond.shape:
            raise self.error("an `if` condition must be a scalar; for arrays use mgjit.where")
        if cond.dtype != dtypes.bool_:
            cond = self.compare("ne", cond, 0)
        names = sorted(set(assigned) | hidden(self.scope))

        def trace_branch(body: Callable[[], None]) -> tuple[ir.Block, dict[str, Any]]:
            saved_block, saved_scope = self.builder.block, self.scope
            self.scope = dict(saved_scope)
            block = ir.Block()
            self.builder.block = block
            try:
                body()
            except Return as r:
                raise self.error("return inside a runtime `if` is not supported; assign to a variable "
                                 "and return after the `if`", r.node)
            finally:
                self.builder.block, out_scope = saved_block, self.scope
                self.scope = saved_scope
            return block, out_scope

        if_loc = self.src.loc(node)
        (then_block, then_scope), (else_block, else_scope) = trace_branch(then), trace_branch(orelse)
        results = []  # (label, then value, else value) of each leaf the branches leave different
        joined = []  # (name, its value on the then branch, each leaf: its value, or None for the next result)
        for name in names:
            if not (name in then_scope and name in else_scope):
                continue  # defined on one path only: not visible after the if
            a, b = then_scope[name], else_scope[name]
            changed = _changed_structure(name, a, b)
            if changed:
                label, then_kind, else_kind = changed
                raise self.error(f"`{label}` is {then_kind} after one branch of a runtime `if` and {else_kind} "
                                 "after the other; a tuple must keep its length on both", node)
            leaves = []
            for (label, la), (_, lb) in zip(_leaves(name, a), _leaves(name, b)):
                # unchanged, or both branches assigned the same value (`v = s` on each)
                same = la is lb or (not isinstance(la, (Tensor, Expanded)) and not isinstance(lb, (Tensor, Expanded))
                                    and la == lb)
                leaves.append(la if same else None)
                if not same:
                    results.append((label, la, lb))
            joined.append((name, a, leaves))
        types = []
        for i, (name, a, b) in enumerate(results):
            a, b = self._join_branch_values(name, a, b, then_block, else_block, node)
            results[i] = (name, a, b)
            types.append(a.value.type)
        op = ops.If(cond.value, types, if_loc)
        op.regions[0].ops = then_block.ops
        op.regions[1].ops = else_block.ops
        op.regions[0].ops.append(ops.Yield([a.value for _, a, _ in results], if_loc))
        op.regions[1].ops.append(ops.Yield([b.value for _, _, b in results], if_loc))
        self.builder.add(op)
        out = iter(Tensor(self, r) for r in op.results)
        for name, template, leaves in joined:
            self.scope[name] = _rebuild(template, iter(next(out) if leaf is None else leaf for leaf in leaves))

    def warp_role(self, warp: int, node: ast.If) -> None:
        """`if mgjit.warp_id() == w:`: the body is warp w's role, a region of the WarpSplit that ends this block
        (consecutive roles share one). What the body assigns stays inside it (its barrier phases included)."""
        if node.orelse:
            raise self.error("a warp's role has no `else`: the other warps skip it and go on", node.orelse[0])
        split = self.builder.block.ops[-1] if self.builder.block.ops else None
        if not isinstance(split, ops.WarpSplit):
            split = self.builder.add(ops.WarpSplit(self.src.loc(node)))
        region = split.regions[warp]
        if region.ops:
            region.ops.pop()  # its Yield: a second role of the same warp runs after the first
        saved_block, saved_scope = self.builder.block, self.scope
        self.scope = dict(saved_scope)
        self.builder.block = region
        try:
            self.run_body(node.body)
        except Return as r:
            raise self.error("return inside a warp's role is not supported", r.node)
        finally:
            self.builder.block, self.scope = saved_block, saved_scope
        region.ops.append(ops.Yield([], self.src.loc(node)))
        split.verify()

    def _join_branch_values(self, name, a, b, then_block, else_block, node: ast.If) -> tuple[Tensor, Tensor]:
        saved = self.builder.block
        try:
            ta_dtype = a.dtype if isinstance(a, (Tensor, Expanded)) else None
            tb_dtype = b.dtype if isinstance(b, (Tensor, Expanded)) else None
            dtype = dtypes.promote(ta_dtype or python_scalar_dtype(a), tb_dtype or python_scalar_dtype(b))
            out = []
            for v, block in ((a, then_block), (b, else_block)):
                if not isinstance(v, (Tensor, Expanded)) and not isinstance(v, (int, float, bool)):
                    raise self.error(f"`{name}` holds a {type(v).__name__} on one branch of a runtime `if`; "
                                     "only numbers and arrays can differ between branches", node)
                # A branch that ends in warp roles: its value is one from before them (what a role assigns stays
                # in it), so it is made there, before the WarpSplit that must end the block.
                split = block.ops.pop() if block.ops and isinstance(block.ops[-1], ops.WarpSplit) else None
                self.builder.block = block
                out.append(self.cast(self.to_tensor(v, dtype), dtype))
                if split is not None:
                    block.ops.append(split)
        finally:
            self.builder.block = saved
        if out[0].shape != out[1].shape:
            raise self.error(f"`{name}` has shape {out[0].shape} on one branch and {out[1].shape} on the other", node)
        return out[0], out[1]

    def range_bounds(self, args: list) -> list[Tensor]:
        """The int32 (lower, upper, step) of `range(*args)` in a runtime loop."""
        if not 1 <= len(args) <= 3:
            raise self.error("range takes 1 to 3 arguments")
        for v in args:
            if isinstance(v, (Tensor, Expanded)):
                if v.shape or v.dtype.is_float:
                    what = f"an array of shape {tuple(v.shape)}" if v.shape else f"a runtime {v.dtype.name}"
                    raise self.error(f"range bounds must be integer scalars, got {what}")
            elif not isinstance(v, int):
                raise self.error(f"range bounds must be integers, got {type(v).__name__} {v!r}")
        lower, upper, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
        if not isinstance(step, Tensor) and step <= 0:
            raise self.error("range steps must be positive (count upwards); a runtime step must be positive too")
        return [self.cast(self.to_tensor(v, dtypes.int32), dtypes.int32) for v in (lower, upper, step)]

    def runtime_loop(self, node: ast.AST, target: str | None, bounds: list[Tensor], body: Callable[[Tensor], None],
                     assigned: set[str]) -> None:
        """Trace `for target in range(*bounds): body(target)` as a For op, at `node` (with `target` None, the
        induction variable is not in scope). The variables of `assigned` (those the body assigns) that exist
        before the loop are carried through it; the others end with it. A carried tuple (of numbers, arrays or
        tuples) is carried element by element and must keep its structure."""
        carried = [n for n in sorted(assigned | hidden(self.scope)) if n in self.scope and n != target]
        inits = {n: self.scope[n] for n in carried}
        leaves = [leaf for n in carried for leaf in _leaves(n, inits[n])]
        for label, v in leaves:
            if not isinstance(v, (Tensor, int, float, bool)):
                raise self.error(f"`{label}` is reassigned in a runtime loop but holds a {type(v).__name__}; only "
                                 "numbers, arrays and tuples of them can be carried through a loop")
        init_types = {label: (v.dtype if isinstance(v, Tensor) else python_scalar_dtype(v)) for label, v in leaves}
        for _ in range(3):  # carried dtypes settle after a promotion or two (e.g. `acc = 0` then `acc += x_f32`)
            op, yielded = self._trace_loop(node, target, body, bounds, carried, inits, init_types)
            new_types = {label: dtypes.promote(init_types[label], y.dtype) for label, y in yielded}
            if new_types == init_types:
                break
            init_types = new_types
        else:
            raise self.error("loop-carried variables do not settle on a dtype")
        for (label, init), (_, y) in zip(leaves, yielded):
            init_shape = init.shape if isinstance(init, Tensor) else ()
            if y.shape != init_shape:
                raise self.error(f"`{label}` changes shape in the loop from {init_shape} to {y.shape}; initialise it "
                                 f"with the loop's shape (e.g. mgjit.zeros({y.shape}, ...))")
        self.builder.add(op)
        for n in assigned - set(carried):
            self.scope.pop(n, None)
        if target is not None:
            self.scope.pop(target, None)
        results = iter(Tensor(self, r) for r in op.results)
        for n in carried:
            self.scope[n] = _rebuild(inits[n], results)

    def _trace_loop(self, node, target, body_fn, bounds, carried, inits, init_types):
        """The For op of one trace of the loop and its yielded leaves, (label, Tensor) in the order of
        `_leaves` over `carried`."""
        init_values = [self.cast(self.to_tensor(v, init_types[label]), init_types[label])
                       for n in carried for label, v in _leaves(n, inits[n])]
        op = ops.For(bounds[0].value, bounds[1].value, bounds[2].value, [v.value for v in init_values],
                     self.builder.loc)
        body = op.body
        saved_block, saved_scope = self.builder.block, self.scope
        self.scope = dict(saved_scope)
        self.builder.block = body
        try:
            induction = Tensor(self, body.args[0])
            if target is not None:
                self.scope[target] = induction
            args = iter(Tensor(self, arg) for arg in body.args[1:])
            for n in carried:
                self.scope[n] = _rebuild(inits[n], args)
            try:
                body_fn(induction)
            except Return as r:
                raise self.error("return inside a runtime loop is not supported", r.node)
            self.at(node)
            yielded = []
            for n in carried:
                v = self.scope[n]
                changed = _changed_structure(n, inits[n], v)
                if changed:
                    label, before, after = changed
                    raise self.error(f"`{label}` is {before} before the loop but {after} in it; a carried tuple "
                                     "must keep its length")
                for label, leaf in _leaves(n, v):
                    if isinstance(leaf, Expanded):
                        raise self.error(f"`{label}` is an expanded view and cannot be carried through a loop")
                    if not isinstance(leaf, (Tensor, int, float, bool)):
                        raise self.error(f"`{label}` becomes a {type(leaf).__name__} in the loop; it must stay a "
                                         "number or array")
                    yielded.append((label, self.to_tensor(leaf, init_types[label])))
            casted = [self.cast(t, dtypes.promote(init_types[label], t.dtype)) for label, t in yielded]
            body.ops.append(ops.Yield([t.value for t in casted], self.builder.loc))
        finally:
            self.builder.block, self.scope = saved_block, saved_scope
        return op, yielded


def _leaves(label: str, value: Any) -> list[tuple[str, Any]]:
    """A carried variable's values, tuples flattened depth first, each labelled as the user would index it."""
    if isinstance(value, tuple):
        return [leaf for i, item in enumerate(value) for leaf in _leaves(f"{label}[{i}]", item)]
    return [(label, value)]


def _rebuild(template: Any, values: Iterator) -> Any:
    """`template`'s tuple structure filled with the next values of the iterator `values`."""
    if isinstance(template, tuple):
        return tuple(_rebuild(item, values) for item in template)
    return next(values)


def _changed_structure(label: str, before: Any, after: Any) -> tuple[str, str, str] | None:
    """The first place where `after`'s tuples differ from `before`'s: (its label, what it was, what it is)."""
    def kind(v: Any) -> str:
        return f"a tuple of {len(v)}" if isinstance(v, tuple) else "not a tuple"

    if isinstance(before, tuple) and isinstance(after, tuple) and len(before) == len(after):
        for i, (b, a) in enumerate(zip(before, after)):
            changed = _changed_structure(f"{label}[{i}]", b, a)
            if changed:
                return changed
        return None
    if isinstance(before, tuple) or isinstance(after, tuple):
        return label, kind(before), kind(after)
    return None


@loop(builtins.range)
def runtime_range(t: ControlFlow, node: ast.For, args: list, kwargs: dict) -> None:
    """`for i in range(...)`: a For op (folded by nothing: the bounds may be runtime values)."""
    if kwargs:
        raise t.error("range takes no keyword arguments")
    if not isinstance(node.target, ast.Name):
        raise t.error("the loop variable must be a single name")
    bounds = t.range_bounds(args)
    t.runtime_loop(node, node.target.id, bounds, lambda _: t.run_body(node.body), assigned_names(node.body))


@loop(lang.static_range)
def static_range(t: ControlFlow, node: ast.For, args: list, kwargs: dict) -> None:
    """`for i in mgjit.static_range(...)`: the body traced once per value, at compile time."""
    if kwargs:
        raise t.error("range takes no keyword arguments")
    if any(isinstance(a, (Tensor, Expanded)) for a in args):
        raise t.error("static_range bounds must be compile-time values")
    try:
        values = range(*args)
    except TypeError as e:
        raise t.error(f"static_range bounds must be integers: {e}") from None
    for i in values:
        t.assign(node.target, i)
        t.run_body(node.body)
