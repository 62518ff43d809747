"""Python source → IR: an interpreter over a kernel's AST. Python values (constexprs, shapes, dtypes) are
evaluated at compile time, IR values flow through the traced values (values.py), `for`/`if` on runtime values
become structured IR (control.py), calls of mgjit builtins and methods of traced values go to what
`registry` holds for them (builtins/), and `@mgjit.device` helpers are inlined. Anything outside the language
is a CompileError naming the file, line and construct.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import math
from typing import Any

from .. import dtypes, ir, language as lang
from ..dtypes import DType
from ..errors import CompileError
from ..source import DeviceFunction, SourceFunction
from . import registry
from .builtins import debug, tcgen05  # importing builtins/ registers the builtins of every hardware unit
from .builtins.clusters import EXCHANGES
from .control import ControlFlow, Return, assigned_names, hidden
from .values import Builder, Expanded, Ref, Shape, Tensor, Traced, WarpCondition, WarpIndex

_ALLOWED_PY_BUILTINS = {"range", "len", "int", "float", "bool", "min", "max", "abs", "tuple", "list",
                        "isinstance", "enumerate", "zip", "True", "False", "None", "print"}
_BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "floordiv",
           ast.Mod: "mod", ast.Pow: "pow", ast.BitAnd: "and", ast.BitOr: "or", ast.BitXor: "xor",
           ast.LShift: "shl", ast.RShift: "shr"}
_CMPOPS = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}


class BoundMember:
    """`value.method` read in a kernel, to be called."""

    def __init__(self, member: registry.Member, value: Any):
        self.member = member
        self.value = value


class Tracer(ControlFlow):
    """Walks one kernel's AST (and the helpers it calls) emitting IR into a Builder."""

    # -- statements
    def stmt(self, node: ast.stmt) -> None:
        self.at(node)
        method = getattr(self, f"stmt_{type(node).__name__}", None)
        if method is None:
            raise self.error(f"`{type(node).__name__}` statements are not supported in mgjit kernels", node)
        method(node)

    def stmt_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # docstring
        self.expr(node.value)

    def stmt_Pass(self, node: ast.Pass) -> None:
        pass

    def stmt_Assign(self, node: ast.Assign) -> None:
        value = self.expr(node.value)
        for target in node.targets:
            self.assign(target, value)

    def stmt_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is None:
            raise self.error("a bare annotation declares nothing in a kernel; assign a value")
        self.assign(node.target, self.expr(node.value))

    def stmt_AugAssign(self, node: ast.AugAssign) -> None:
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise self.error(f"operator {type(node.op).__name__} is not supported")
        if isinstance(node.target, ast.Name):
            current = self.lookup(node.target.id, node.target)
            self.assign(node.target, self.apply_binop(op, current, self.expr(node.value)))
        elif isinstance(node.target, ast.Subscript):
            ref = self.expr(node.target.value)
            index = self.subscript_index(node.target.slice)
            if not isinstance(ref, Ref):
                raise self.error("augmented assignment to an element works on references only")
            current = self.getitem(ref, index)
            self.setitem(ref, index, self.apply_binop(op, current, self.expr(node.value)))
        else:
            raise self.error("unsupported augmented assignment target")

    def assign(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            self.scope[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, (Tensor, Ref)) or not isinstance(value, (tuple, list)):
                raise self.error("only static tuples can be unpacked")
            if len(value) != len(target.elts):
                raise self.error(f"cannot unpack {len(value)} values into {len(target.elts)} names")
            for t, v in zip(target.elts, value):
                self.assign(t, v)
        elif isinstance(target, ast.Subscript):
            obj = self.expr(target.value)
            if registry.find_member(obj, "__setitem__") is None:
                raise self.error("only references (tensor arguments) can be assigned to by index; register "
                                 "arrays are values — build a new one with mgjit.where")
            self.setitem(obj, self.subscript_index(target.slice), value)
        else:
            raise self.error(f"cannot assign to {type(target).__name__}")

    def stmt_Return(self, node: ast.Return) -> None:
        if self.depth == 0 and node.value is not None:
            raise self.error("a kernel cannot return a value; store results into an output argument")
        raise Return(self.expr(node.value) if node.value is not None else None, node)

    def stmt_Assert(self, node: ast.Assert) -> None:
        cond = self.expr(node.test)
        if isinstance(cond, (Tensor, Expanded)):
            raise self.error("assert needs a compile-time condition (on constexprs and shapes)")
        if not cond:
            msg = self.expr(node.msg) if node.msg is not None else "assertion failed"
            raise self.error(f"static assertion failed: {msg}")

    def stmt_While(self, node: ast.While) -> None:
        raise self.error("while loops are not supported; use `for i in range(...)`")

    def stmt_If(self, node: ast.If) -> None:
        cond = self.expr(node.test)
        if isinstance(cond, WarpCondition):
            return self.warp_role(cond.warp, node)
        if isinstance(cond, WarpIndex):
            raise self.error("`if mgjit.warp_id() == w:` names the warp of a role; compare it with a warp number")
        if not isinstance(cond, (Tensor, Expanded)):
            self.run_body(node.body if cond else node.orelse)
            return
        self.branch(cond, lambda: self.run_body(node.body), lambda: self.run_body(node.orelse),
                    assigned_names(node.body) | assigned_names(node.orelse), node)

    def stmt_For(self, node: ast.For) -> None:
        if node.orelse:
            raise self.error("for ... else is not supported")
        if not isinstance(node.iter, ast.Call):
            raise self.error("mgjit loops iterate over range(...) or mgjit.static_range(...)")
        fn = self.expr(node.iter.func)
        trace_loop = registry.find_loop(fn)
        if trace_loop is None:
            raise self.error("mgjit loops iterate over range(...) or mgjit.static_range(...)")
        args = [self.expr(a) for a in node.iter.args]
        kwargs = {k.arg: self.expr(k.value) for k in node.iter.keywords}
        trace_loop(self, node, args, kwargs)

    def stmt_With(self, node: ast.With) -> None:
        leaving = []
        for item in node.items:
            call = item.context_expr
            try:
                enter = registry.find_context(self.expr(call.func)) if isinstance(call, ast.Call) else None
            except CompileError:
                enter = None
            if enter is None:
                raise self.error("`with` statements in a kernel open mgjit scopes only: `with mgjit.trace(\"name\"):` "
                                 "or `with mgjit.scoped_smem(...) as buf:`", call)
            args = [self.expr(a) for a in call.args]
            kwargs = {k.arg: self.expr(k.value) for k in call.keywords}
            value, leave = enter(self, args, kwargs)
            leaving.append(leave)
            if item.optional_vars is not None:
                if value is None:
                    raise self.error(f"`with {ast.unparse(call)}` binds nothing: leave out `as "
                                     f"{ast.unparse(item.optional_vars)}`", item.optional_vars)
                self.assign(item.optional_vars, value)
        try:
            self.run_body(node.body)
        finally:  # the block is left on a return too (an error abandons the trace anyway)
            for leave in reversed(leaving):
                self.at(node)
                leave()

    # -- expressions
    def expr(self, node: ast.expr) -> Any:
        saved = self.node
        self.at(node)
        method = getattr(self, f"expr_{type(node).__name__}", None)
        if method is None:
            raise self.error(f"`{type(node).__name__}` expressions are not supported in mgjit kernels", node)
        out = method(node)
        self.node = saved
        if saved is not None:
            self.builder.loc = self.src.loc(saved)
        return out

    def expr_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def expr_Name(self, node: ast.Name) -> Any:
        return self.lookup(node.id, node)

    def lookup(self, name: str, node: ast.AST) -> Any:
        if name in self.scope:
            return self.scope[name]
        if name in self.closure:
            return self.closure[name]
        if name in self.globals:
            return self.globals[name]
        if name in _ALLOWED_PY_BUILTINS and hasattr(builtins, name):
            return getattr(builtins, name)
        raise self.error(f"name `{name}` is not defined (a variable first assigned inside a runtime loop or on "
                         "one branch of a runtime `if` is not visible after it)", node)

    def expr_Tuple(self, node: ast.Tuple) -> tuple:
        return tuple(self.expr(e) for e in node.elts)

    expr_List = expr_Tuple

    def expr_Attribute(self, node: ast.Attribute) -> Any:
        obj = self.expr(node.value)
        if isinstance(obj, Traced):
            member = registry.find_member(obj, node.attr)
            if member is not None and not node.attr.startswith("__"):
                return member.fn(self, obj) if member.is_attribute else BoundMember(member, obj)
            if node.attr in obj.attributes:
                value = getattr(obj, node.attr)
                if node.attr == "shape":
                    return Shape(value, f"`{obj.name}`" if isinstance(obj, Ref) else "the " + obj.kind.split(" ", 1)[1])
                return value
            raise self.error(f"{obj.kind} has no attribute `{node.attr}` (it has "
                             f"{', '.join(registry.member_names(obj))})")
        try:
            return getattr(obj, node.attr)
        except AttributeError:
            raise self.error(f"{type(obj).__name__} has no attribute `{node.attr}`") from None

    def subscript_index(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Tuple):
            return tuple(self.subscript_index(e) for e in node.elts)
        if isinstance(node, ast.Slice):
            return slice(*(self.expr(p) if p is not None else None for p in (node.lower, node.upper, node.step)))
        return self.expr(node)

    def expr_Subscript(self, node: ast.Subscript) -> Any:
        obj = self.expr(node.value)
        index = self.subscript_index(node.slice)
        if isinstance(obj, Traced) and registry.find_member(obj, "__getitem__") is not None:
            return self.getitem(obj, index)
        if isinstance(obj, (tuple, list, dict)):
            if isinstance(index, Tensor):
                raise self.error("a static sequence cannot be indexed with a runtime value")
            try:
                return obj[index]
            except (IndexError, KeyError, TypeError) as e:
                raise self.error(self._bad_index(obj, index, e)) from None
        raise self.error(f"cannot index a {type(obj).__name__}")

    def _bad_index(self, obj: Any, index: Any, e: Exception) -> str:
        if isinstance(obj, Shape) and isinstance(index, int):
            n = len(obj)
            return f"{obj.of} has {n} dimension{'s' if n != 1 else ''}, got index {index} of its shape"
        if isinstance(e, KeyError):
            return f"key {index!r} is not in the dict"
        if isinstance(e, IndexError):
            return f"index {index!r} is out of range for a {type(obj).__name__} of {len(obj)} elements"
        return f"cannot index a {type(obj).__name__} with {type(index).__name__} {index!r}"

    def getitem(self, obj: Traced, index: Any) -> Any:
        return registry.find_member(obj, "__getitem__").fn(self, obj, index)

    def setitem(self, obj: Traced, index: Any, value: Any) -> None:
        registry.find_member(obj, "__setitem__").fn(self, obj, index, value)

    def expr_BinOp(self, node: ast.BinOp) -> Any:
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise self.error(f"operator {type(node.op).__name__} is not supported")
        return self.apply_binop(op, self.expr(node.left), self.expr(node.right))

    def expr_UnaryOp(self, node: ast.UnaryOp) -> Any:
        x = self.expr(node.operand)
        if not isinstance(x, (Tensor, Expanded)):
            return {ast.USub: lambda v: -v, ast.UAdd: lambda v: +v, ast.Not: lambda v: not v,
                    ast.Invert: lambda v: ~v}[type(node.op)](x)
        if isinstance(node.op, ast.Not):
            raise self.error("`not` on a runtime value is not supported; use `~` (or == 0)")
        if isinstance(node.op, ast.UAdd):
            return x
        return self.unary("neg" if isinstance(node.op, ast.USub) else "not", x)

    def expr_Compare(self, node: ast.Compare) -> Any:
        if len(node.ops) != 1:
            values = [self.expr(node.left)] + [self.expr(c) for c in node.comparators]
            if any(isinstance(v, (Tensor, Expanded)) for v in values):
                raise self.error("chained comparisons of runtime values are not supported; combine two "
                                 "comparisons with &")
            for op, a, b in zip(node.ops, values, values[1:]):
                kind = _CMPOPS.get(type(op))
                if kind is None:
                    raise self.error(f"comparison {type(op).__name__} is not supported in a chain")
                if not self.apply_compare(kind, a, b):
                    return False
            return True
        kind = _CMPOPS.get(type(node.ops[0]))
        a, b = self.expr(node.left), self.expr(node.comparators[0])
        if not isinstance(a, (Tensor, Expanded)) and not isinstance(b, (Tensor, Expanded)):
            if isinstance(node.ops[0], (ast.Is, ast.IsNot, ast.In, ast.NotIn)):
                return {ast.Is: lambda: a is b, ast.IsNot: lambda: a is not b, ast.In: lambda: a in b,
                        ast.NotIn: lambda: a not in b}[type(node.ops[0])]()
        elif kind is None:
            raise self.error(f"comparison {type(node.ops[0]).__name__} is not supported on runtime values")
        return self.apply_compare(kind, a, b)

    def expr_BoolOp(self, node: ast.BoolOp) -> Any:
        values = [self.expr(v) for v in node.values]
        if any(isinstance(v, (Tensor, Expanded)) for v in values):
            raise self.error("`and`/`or` need compile-time values; for runtime conditions use & and |")
        out = values[0]
        for v in values[1:]:
            out = (out and v) if isinstance(node.op, ast.And) else (out or v)
        return out

    def expr_IfExp(self, node: ast.IfExp) -> Any:
        cond = self.expr(node.test)
        if isinstance(cond, (Tensor, Expanded)):
            return self.select(cond, self.expr(node.body), self.expr(node.orelse))
        return self.expr(node.body) if cond else self.expr(node.orelse)

    def expr_JoinedStr(self, node: ast.JoinedStr) -> Any:
        parts = []
        for v in node.values:
            if isinstance(v, ast.FormattedValue):
                parts.append(format(self.expr(v.value)))
            else:
                parts.append(self.expr(v))
        return "".join(map(str, parts))

    # -- calls
    def expr_Call(self, node: ast.Call) -> Any:
        fn = self.expr(node.func)
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                args.extend(self.expr(a.value))
            else:
                args.append(self.expr(a))
        kwargs = {k.arg: self.expr(k.value) for k in node.keywords if k.arg is not None}
        self.at(node)
        return self.call(fn, args, kwargs, node)

    def call(self, fn: Any, args: list, kwargs: dict, node: ast.Call) -> Any:
        if isinstance(fn, lang.Builtin):
            return self.call_builtin(fn, args, kwargs)
        if isinstance(fn, BoundMember):
            return fn.member.fn(self, fn.value, args, kwargs)
        if fn is lang.ds:
            try:
                return lang.ds(*args, **kwargs)
            except TypeError as e:
                raise self.error(f"bad mgjit.ds(...): {e}") from None
        if isinstance(fn, DeviceFunction):
            return self.inline(fn, args, kwargs, node)
        if hasattr(fn, "__mgjit_kernel__"):
            raise self.error(f"{fn.__name__} is an @mgjit.kernel; helpers called from kernels are @mgjit.device")
        if fn is builtins.print:
            raise self.error("Python's print is not supported inside kernels; to print from the GPU use "
                             "mgjit.print(\"x = {}\", x)")
        if fn in (builtins.min, builtins.max) and any(isinstance(a, (Tensor, Expanded)) for a in args):
            if len(args) != 2 or kwargs:
                raise self.error(f"{fn.__name__} on runtime values takes exactly two arguments")
            return self.binary(fn.__name__, args[0], args[1])
        if fn is builtins.abs and args and isinstance(args[0], Tensor):
            return self.unary("abs", args[0])
        if fn in (builtins.float, builtins.int, builtins.bool) and args and isinstance(args[0], Tensor):
            target = {builtins.float: dtypes.float32, builtins.int: dtypes.int32, builtins.bool: dtypes.bool_}[fn]
            return self.cast(args[0], target)
        if isinstance(fn, type) and issubclass(fn, DType):
            raise self.error("dtypes are not callable")
        if fn is builtins.range:
            raise self.error("range(...) can only be iterated by a for loop")
        if any(isinstance(a, (Tensor, Ref, Expanded)) for a in [*args, *kwargs.values()]):
            name = getattr(fn, "__name__", repr(fn))
            raise self.error(f"`{name}` is a plain Python function and cannot take runtime values; decorate it "
                             "with @mgjit.device to call it from a kernel")
        if callable(fn) and (fn in vars(builtins).values() or getattr(fn, "__module__", "") in ("math", "builtins")):
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                raise self.error(f"compile-time call of {getattr(fn, '__name__', fn)} failed: {e}") from None
        raise self.error(f"calling {getattr(fn, '__name__', repr(fn))} is not supported in kernels (only mgjit "
                         "builtins, @mgjit.device functions and compile-time math)")

    def call_builtin(self, fn: lang.Builtin, args: list, kwargs: dict) -> Any:
        entry = registry.find_builtin(fn)
        if entry is None:
            if registry.find_loop(fn) is not None:
                raise self.error(f"{fn.name} can only be iterated by a for loop")
            if registry.find_context(fn) is not None:
                raise self.error(f"mgjit.{fn.name} opens a `with` block: `with mgjit.{fn.name}(...):`")
            raise self.error(f"mgjit.{fn.name} is not supported here")
        if entry.positional is not None:
            lo, hi = entry.positional
            if not lo <= len(args) <= hi:
                raise self.error(f"mgjit.{fn.name} takes {lo}..{hi} positional arguments, got {len(args)}")
        return entry.fn(self, args, kwargs)

    def inline(self, fn: DeviceFunction, args: list, kwargs: dict, node: ast.Call) -> Any:
        if self.depth > 32:
            raise self.error(f"device function {fn.__name__} recurses too deeply (recursion is not supported)")
        src = fn.source
        sig = inspect.signature(fn.fn)
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise self.error(f"bad call of {fn.__name__}: {e}") from None
        bound.apply_defaults()
        # The helper is inlined: it waits on the caller's barriers in the caller's phases and hands them back.
        phases = {n: self.scope[n] for n in hidden(self.scope)}
        tracer = Tracer(src, self.builder, {**phases, **bound.arguments}, self.depth + 1, parent=self)
        saved_loc = self.builder.loc
        try:
            tracer.run_body(src.node.body)
            result = None
        except Return as r:
            result = r.value
        finally:
            self.builder.loc = saved_loc
        self.scope.update({n: tracer.scope[n] for n in hidden(tracer.scope)})
        return result


def trace(source: SourceFunction, params: list[ir.Param], constexprs: dict[str, Any],
          num_warpgroups: int, cluster: tuple[int, int, int] = (1, 1, 1), profile: bool = False) -> ir.Kernel:
    """Build the IR of one specialization of a kernel (with profile=True, one that records mgjit.trace spans)."""
    body = ir.Block()
    builder = Builder(body)
    params = list(params)
    args: list[ir.Value] = []
    scope: dict[str, Any] = dict(constexprs)
    tracer = Tracer(source, builder, scope)
    tracer.num_warpgroups = num_warpgroups
    tracer.cluster = cluster
    tracer.profile = profile
    if math.prod(cluster) > 1:
        scope[EXCHANGES] = tracer.to_tensor(0)
    debug.start(tracer, source.loc(source.node))
    for i, p in enumerate(params):
        tracer.param_index[p.name] = i
        if p.kind == "tensor":
            v = ir.Value(ir.RefType("gmem", p.dtype, p.rank))
            scope[p.name] = Ref(tracer, v, p.name)
        else:
            v = ir.Value(ir.ScalarType(p.dtype))
            scope[p.name] = Tensor(tracer, v)
        args.append(v)
    try:
        tracer.run_body(source.node.body)
    except Return:
        pass
    except RecursionError:
        raise tracer.error("the kernel is nested too deeply to compile") from None
    cta_group = tcgen05.finish(body, source.loc(source.node))
    hidden_buffers = debug.finish(tracer, params, args)
    kernel = ir.Kernel(source.name, params, args, body, num_warpgroups, source.loc(source.node),
                       tracer.tma_descriptors, cta_group, hidden_buffers, tracer.occupancy.get("count", 1))
    ir.verify(kernel)
    return kernel
