"""Layout inference: give every register array a layout, inserting explicit Relayout ops where two
producers disagree.

Anchors fix layouts (a GMEM load or iota takes the coalesced `blocked` layout, a constant is a splat, an
MMA result will take WGMMA); elementwise ops propagate them; a reduction derives its result layout from
its operand; a broadcast looks for a layout already in use at the result shape whose reduction is the
operand's layout, so that `x - x.max(axis=1)[:, None]` moves no data. Loop-carried arrays settle by
re-inferring the body when the carried layout changes (an undo log rolls back the previous attempt).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

from . import ir
from .registry import RuleRegistry
from .layouts import SPLAT, WGMMA, Layout, LayoutError, SplatLayout, TiledLayout, blocked

Rule = Callable[[ir.Op, "Inference"], None]
RULES: RuleRegistry[Rule] = RuleRegistry("layout inference")
rule = RULES.rule


class _Restart(Exception):
    """Re-run inference with some flexible anchors placed in the layouts their users need."""

    def __init__(self, overrides: dict[int, Layout]):
        self.overrides = overrides


# Ops whose result can be produced in any register layout at no extra cost, so that a conflict with them
# is better solved by moving the anchor than by a relayout.
_FLEXIBLE_ANCHORS = (ir.Iota, ir.Load)
_ELEMENTWISE = (ir.Unary, ir.Cast, ir.Binary, ir.Compare, ir.Select)


def _flexible_origins(v: ir.Value, depth: int = 0) -> set[ir.Op] | None:
    """The anchors a tiled value's layout comes from, if every one of them is flexible (else None)."""
    op = v.owner
    if depth > 32 or not isinstance(op, ir.Op):
        return None
    if isinstance(op, _FLEXIBLE_ANCHORS):
        return {op}
    if isinstance(op, _ELEMENTWISE):
        out: set[ir.Op] = set()
        for x in op.operands:
            if x.is_array and isinstance(x.layout, TiledLayout):
                sub = _flexible_origins(x, depth + 1)
                if sub is None:
                    return None
                out |= sub
        return out
    return None


class Inference:
    def __init__(self, kernel: ir.Kernel, overrides: dict[int, Layout] | None = None):
        self.kernel = kernel
        self.overrides = overrides or {}  # id(anchor op) -> the layout it must produce
        self.log: list[tuple] = []  # undo log: ("layout", value, old) | ("relayout", block, op, user, index, old)
        self.by_shape: dict[tuple, list[TiledLayout]] = defaultdict(list)
        self.uses: dict[int, int] = defaultdict(int)
        for op in kernel.walk():
            for v in op.operands:
                self.uses[v.id] += 1

    # -- mutation with undo
    def set_layout(self, value: ir.Value, layout: Layout, op: ir.Op | None = None) -> None:
        if not value.is_array:
            return
        if isinstance(layout, TiledLayout):
            try:
                layout.check_shape(value.type.shape)
            except LayoutError as e:
                raise (op.error(str(e), rule="layout") if op else e) from None
            known = self.by_shape[value.type.shape]
            if layout not in known:
                known.append(layout)
        self.log.append(("layout", value, value.layout))
        value.layout = layout

    def relayout(self, block: ir.Block, user: ir.Op, index: int, layout: Layout) -> ir.Value:
        """Make operand `index` of `user` arrive in `layout`, through a Relayout op placed before `user`."""
        src = user.operands[index]
        if src.layout == layout:
            return src
        op = ir.Relayout(src, layout, user.loc)
        self.log.append(("layout", op.results[0], None))
        block.ops.insert(block.ops.index(user), op)
        self.log.append(("relayout", block, op, user, index, src))
        user.operands[index] = op.results[0]
        return op.results[0]

    def undo(self, mark: int) -> None:
        while len(self.log) > mark:
            entry = self.log.pop()
            if entry[0] == "layout":
                entry[1].layout = entry[2]
            else:
                _, block, op, user, index, old = entry
                block.ops.remove(op)
                user.operands[index] = old

    # -- driver
    def block(self, block: ir.Block) -> None:
        for op in list(block.ops):
            fn = RULES.get(type(op))
            if fn is None:
                raise op.error(f"internal error: no layout inference rule for `{op.name}`")
            self.current_block = block
            fn(op, self)

    def choose_common(self, op: ir.Op, indices: list[int]) -> Layout | None:
        """One layout for the array operands at `indices` of an elementwise op: the first tiled one wins and
        the other tiled operands are relayouted to it; splats mix with anything for free."""
        arrays = [i for i in indices if op.operands[i].is_array]
        if not arrays:
            return None
        tiled = [i for i in arrays if isinstance(op.operands[i].layout, TiledLayout)]
        if not tiled:
            return SPLAT
        # Prefer the layout of data over that of an index computation (an iota adapts for free).
        origins = {i: _flexible_origins(op.operands[i]) for i in tiled}
        data = [i for i in tiled if not (origins[i] and all(isinstance(o, ir.Iota) for o in origins[i]))]
        target = op.operands[(data or tiled)[0]].layout
        moves: dict[int, Layout] = {}
        for i in tiled:
            if op.operands[i].layout == target:
                continue
            anchors = origins[i]
            if anchors and all(id(a) not in self.overrides for a in anchors):
                moves.update({id(a): target for a in anchors})
            else:
                self.relayout(self.current_block, op, i, target)
        if moves:
            raise _Restart(moves)
        return target


def infer_layouts(kernel: ir.Kernel) -> None:
    overrides: dict[int, Layout] = {}
    for _ in range(16):
        inf = Inference(kernel, overrides)
        try:
            inf.block(kernel.body)
            break
        except _Restart as restart:
            inf.undo(0)
            overrides.update(restart.overrides)
    else:
        raise kernel.body.ops[0].error("layout inference did not converge") if kernel.body.ops else AssertionError
    for op in kernel.walk():
        for v in [*op.results, *(a for r in op.regions for a in r.args)]:
            if v.is_array and v.layout is None:
                raise op.error(f"internal error: no layout was inferred for the result of {op.name}")


# ---------------------------------------------------------------------------------------------- rules

@rule(ir.Constant, ir.ProgramId, ir.NumPrograms, ir.WarpgroupId, ir.RefDim, ir.Store, ir.Yield, ir.SmemAlloc,
      ir.BarrierAlloc, ir.RefIndex, ir.RefTranspose, ir.TmaLoad, ir.BarrierArrive, ir.BarrierWait,
      ir.FenceAsyncShared, ir.SetMaxRegisters, ir.TmaStore, ir.TmaStoreWait, ir.SmemStore,
      ir.ClusterRank, ir.ClusterSync)
def _no_arrays(op: ir.Op, inf: Inference) -> None:
    pass


@rule(ir.Splat)
def _splat(op: ir.Splat, inf: Inference) -> None:
    inf.set_layout(op.result, SPLAT, op)


@rule(ir.Iota, ir.Load)
def _gmem_anchor(op: ir.Op, inf: Inference) -> None:
    if op.results[0].is_array:
        t = op.results[0].type
        try:
            layout = inf.overrides.get(id(op)) or blocked(t.shape, t.dtype)
        except LayoutError as e:
            raise op.error(str(e), rule="layout") from None
        inf.set_layout(op.results[0], layout, op)


@rule(ir.Unary, ir.Cast)
def _same_as_operand(op: ir.Op, inf: Inference) -> None:
    if op.result.is_array:
        inf.set_layout(op.result, op.operands[0].layout, op)


@rule(ir.Binary, ir.Compare, ir.Select)
def _elementwise(op: ir.Op, inf: Inference) -> None:
    layout = inf.choose_common(op, list(range(len(op.operands))))
    if layout is not None:
        inf.set_layout(op.result, layout, op)


@rule(ir.Wgmma)
def _wgmma(op: ir.Wgmma, inf: Inference) -> None:
    """The accumulator lives in the WGMMA layout (an anchor): a zeros splat moves into it for free."""
    if op.operands[0].layout != WGMMA:
        inf.relayout(inf.current_block, op, 0, WGMMA)
    a = op.operands[1]
    if a.is_array and a.layout != WGMMA:  # A from registers: the wgmma operand fragment is the WGMMA layout
        anchors = _flexible_origins(a) if isinstance(a.layout, TiledLayout) else None
        if anchors and all(id(x) not in inf.overrides for x in anchors):
            raise _Restart({id(x): WGMMA for x in anchors})
        inf.relayout(inf.current_block, op, 1, WGMMA)
    inf.set_layout(op.result, WGMMA, op)


@rule(ir.WgmmaWait)
def _wgmma_wait(op: ir.WgmmaWait, inf: Inference) -> None:
    for x, r in zip(op.operands, op.results):
        inf.set_layout(r, x.layout, op)


@rule(ir.Relayout)
def _relayout(op: ir.Relayout, inf: Inference) -> None:
    pass


@rule(ir.Reduce)
def _reduce(op: ir.Reduce, inf: Inference) -> None:
    src = op.operands[0]
    if not op.result.is_array:
        return
    if isinstance(src.layout, SplatLayout):
        inf.set_layout(op.result, SPLAT, op)
        return
    try:
        layout = src.layout.reduce(op.axes, len(src.type.shape))
    except LayoutError as e:
        raise op.error(f"cannot reduce axes {op.axes} of this array's layout: {e}", rule="layout") from None
    inf.set_layout(op.result, layout, op)


@rule(ir.Broadcast)
def _broadcast(op: ir.Broadcast, inf: Inference) -> None:
    src = op.operands[0]
    shape = op.result.type.shape
    if isinstance(src.layout, SplatLayout):
        inf.set_layout(op.result, SPLAT, op)
        return
    axes = tuple(d for d in range(len(shape)) if d not in op.dims)
    candidates = list(reversed(inf.by_shape.get(shape, [])))
    try:
        candidates.append(blocked(shape, op.result.dtype))
    except LayoutError as e:
        raise op.error(str(e), rule="layout") from None
    for layout in candidates:
        if layout.reduce(axes, len(shape)) == src.layout:
            inf.set_layout(op.result, layout, op)
            return
    target = candidates[0]
    wanted = target.reduce(axes, len(shape))
    anchors = _flexible_origins(src)
    if anchors and all(id(a) not in inf.overrides for a in anchors):
        # The operand comes (through elementwise ops) from loads/iotas only: load it straight into the layout.
        raise _Restart({id(a): wanted for a in anchors})
    inf.relayout(inf.current_block, op, 0, wanted)
    inf.set_layout(op.result, target, op)


def _join(a: Layout | None, b: Layout | None) -> Layout | None:
    if a is None or a == b:
        return b
    if isinstance(a, SplatLayout):
        return b
    return a


@rule(ir.For)
def _for(op: ir.For, inf: Inference) -> None:
    body = op.body
    carried = [a for a in body.args[1:]]
    layouts = [v.layout for v in op.inits]
    yield_op = body.ops[-1]
    for _ in range(4):
        mark = len(inf.log)
        for arg, layout in zip(carried, layouts):
            if arg.is_array:
                inf.set_layout(arg, layout, op)
        saved = inf.current_block
        inf.block(body)
        inf.current_block = saved
        yielded = [v.layout for v in yield_op.operands]
        joined = [_join(a, y) if arg.is_array else None for arg, a, y in zip(carried, layouts, yielded)]
        if joined == layouts:
            break
        inf.undo(mark)
        layouts = joined
    else:
        raise op.error("layout inference for the loop-carried arrays does not settle; "
                       "consider initialising them from a load or an explicit layout")
    for i, (arg, layout) in enumerate(zip(carried, layouts)):
        if arg.is_array:
            if yield_op.operands[i].layout != layout:
                inf.relayout(body, yield_op, i, layout)
            if op.inits[i].layout != layout:
                inf.relayout(inf.current_block, op, 3 + i, layout)
            inf.set_layout(op.results[i], layout, op)


@rule(ir.If)
def _if(op: ir.If, inf: Inference) -> None:
    saved = inf.current_block
    for region in op.regions:
        inf.block(region)
    inf.current_block = saved
    then_yield, else_yield = op.regions[0].ops[-1], op.regions[1].ops[-1]
    for i, r in enumerate(op.results):
        if not r.is_array:
            continue
        layout = _join(then_yield.operands[i].layout, else_yield.operands[i].layout)
        for region, y in zip(op.regions, (then_yield, else_yield)):
            if y.operands[i].layout != layout:
                inf.relayout(region, y, i, layout)
        inf.set_layout(r, layout, op)


# ---------------------------------------------------------------------------------------------- Blackwell

def _tmem_layout(op: ir.Op, t: ir.TmemRefType):
    from .tmem_layouts import TMEMLayoutError
    try:
        return ir.tmem_layout(t)
    except TMEMLayoutError as e:
        raise op.error(str(e), rule="tmem-layout") from None


def _tmem_register_layout(op: ir.Op, ref: ir.Value) -> TiledLayout:
    from .tmem_layouts import TMEMLayoutError
    try:
        return _tmem_layout(op, ref.type).register_layout(ref.dtype.bits)
    except TMEMLayoutError as e:
        raise op.error(f"{ref.type} cannot move through registers: {e}", rule="tmem-layout") from None


@rule(ir.TmemAlloc, ir.TmemSlice)
def _tmem_ref(op: ir.Op, inf: Inference) -> None:
    """A TMEM reference's layout follows from its type (128 rows: default; 64 rows: half-lane, or m64 collective
    in a 2-CTA kernel; packing from the dtype) and is recorded on the reference, where the IR printer shows it."""
    op.result.layout = _tmem_layout(op, op.result.type)


@rule(ir.TmemLoad)
def _tmem_load(op: ir.TmemLoad, inf: Inference) -> None:
    """An anchor: tcgen05.ld delivers the register layout that matches the TMEM layout (TCGEN05 for default,
    WGMMA for half-lane, the m64-collective layout)."""
    inf.set_layout(op.result, _tmem_register_layout(op, op.operands[0]), op)


@rule(ir.TmemStore)
def _tmem_store(op: ir.TmemStore, inf: Inference) -> None:
    target = _tmem_register_layout(op, op.operands[0])
    value = op.operands[1]
    if value.layout == target:
        return
    # Data loaded from GMEM (or an iota) straight into the layout tcgen05.st needs, rather than relayouted.
    anchors = _flexible_origins(value) if isinstance(value.layout, TiledLayout) else None
    if anchors and all(id(a) not in inf.overrides for a in anchors):
        raise _Restart({id(a): target for a in anchors})
    inf.relayout(inf.current_block, op, 1, target)


@rule(ir.Tcgen05Commit)
def _tcgen05_commit(op: ir.Tcgen05Commit, inf: Inference) -> None:
    op.cta_group = ir.kernel_cta_group(inf.kernel)


@rule(ir.Tcgen05Mma, ir.TmemDealloc, ir.TmaLoadCollective)
def _tcgen05_no_arrays(op: ir.Op, inf: Inference) -> None:
    pass
