"""Layout inference: give every register array a layout, inserting explicit Relayout ops where two
producers disagree.

This module is the driver: it walks the IR and calls each op's inference rule, registered with
`@infer.rule(OpClass)` in the op's family module (`mgjit/ops/`). Anchors fix layouts (a GMEM load or iota
takes the coalesced `blocked` layout, a constant is a splat, an MMA result takes WGMMA); elementwise ops
propagate them; a reduction derives its result layout from its operand; a broadcast looks for a layout already
in use at the result shape whose reduction is the operand's layout, so that `x - x.max(axis=1)[:, None]` moves
no data. A conflict with a free anchor (`Op.free_anchor`: a load or an iota) restarts inference with the
anchor placed in the layout its user needs (again where a later user needs another: each layout once, and where
users pull it back to one it left, the first it was placed in, for good); any other conflict inserts a Relayout.
Operands that all come from free anchors meet in a layout in which none of those anchors costs more (`Op.costs_in`:
a float32 read from shared memory beside bf16 rows takes their 8 bytes a lane, not 32 bytes of its own, conflicted).
Loop-carried arrays settle by re-inferring the body when the carried layout changes (an undo log rolls back the
previous attempt).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

from . import ir
from .errors import Rule
from .layouts import SPLAT, Layout, LayoutError, SplatLayout, TiledLayout, blocked, blocked_reducing_to, spread
from .registry import RuleRegistry

InferRule = Callable[[ir.Op, "Inference"], None]
RULES: RuleRegistry[InferRule] = RuleRegistry("layout inference")
rule = RULES.rule
_relayout_op: type | None = None


def relayout_op(cls: type) -> type:
    """Class decorator: the op inference inserts to move an array into another layout, `cls(x, layout, loc)`
    (ops/arrays.py declares it; the driver must not import the op families, which import the driver)."""
    global _relayout_op
    _relayout_op = cls
    return cls


class Restart(Exception):
    """Re-run inference with some free anchors placed in the layouts their users need."""

    def __init__(self, overrides: dict[int, Layout]):
        self.overrides = overrides


def free_origins(v: ir.Value, depth: int = 0) -> set[ir.Op] | None:
    """The ops a tiled value's layout comes from, if every one can produce any layout for free (else None):
    free anchors, and broadcasts of values that come from free anchors or are splats (the broadcast is then
    the op to place: its rule places its operand in turn) or that every thread holds whole (`takes_any_layout`),
    through elementwise ops and the branches of an if."""
    op = v.owner
    if depth > 32 or not isinstance(op, ir.Op):
        return None
    if op.free_anchor:
        return {op}
    if op.joins_yields:  # an if's result: what each branch yields for it
        index = next(i for i, r in enumerate(op.results) if r is v)
        joined: set[ir.Op] = set()
        for region in op.regions:
            y = region.ops[-1].operands[index]
            if isinstance(y.layout, TiledLayout):
                sub = free_origins(y, depth + 1)
                if sub is None:
                    return None
                joined |= sub
        return joined
    if op.free_with_operand:
        src = op.operands[0]
        if isinstance(src.layout, SplatLayout) or op.takes_any_layout or (
                isinstance(src.layout, TiledLayout) and free_origins(src, depth + 1) is not None):
            return {op}
        return None
    if op.elementwise:
        out: set[ir.Op] = set()
        for x in op.operands:
            if x.is_array and isinstance(x.layout, TiledLayout):
                sub = free_origins(x, depth + 1)
                if sub is None:
                    return None
                out |= sub
        return out
    return None


class Placements:
    """Where restarts have placed each free anchor. An anchor may move to a layout it has not been in (a later user
    needs another: the row index of a piped row's last two lines, `arange(2)[:, None] * 256 + arange(256)[None,
    :]`, was placed for the default layout of the line and later needed in the layout the line is stored from;
    kept, it went through shared memory, two barriers, on every row). Users that pull it back to a layout it left
    disagree for good (cross-entropy's targets, broadcast against two parts of a row): it returns to the first
    layout it was placed in and stays there, and the others' conflicts become Relayouts."""

    def __init__(self) -> None:
        self.history: dict[int, list[Layout]] = defaultdict(list)  # id(anchor op) -> the layouts it was placed in
        self.fixed: set[int] = set()

    def movable(self, anchors: set[ir.Op], layout: Layout, overrides: dict[int, Layout]) -> list[ir.Op]:
        """Those of `anchors` that a restart may place in `layout`: elsewhere, not fixed, and never in it before
        unless it was their first."""
        moving = [a for a in anchors if overrides.get(id(a)) != layout and id(a) not in self.fixed]
        if not all(layout not in self.history[id(a)] or self.history[id(a)][0] == layout for a in moving):
            return []
        return moving

    def record(self, placed: dict[int, Layout]) -> None:
        for key, layout in placed.items():
            if layout in self.history[key]:
                self.fixed.add(key)
            else:
                self.history[key].append(layout)


class Inference:
    def __init__(self, kernel: ir.Kernel, overrides: dict[int, Layout] | None = None,
                 specs: dict[int, Any] | None = None, placements: Placements | None = None, frozen: bool = False):
        self.kernel = kernel
        self.overrides = overrides or {}  # id(anchor op) -> the layout it must produce
        self.placements = placements or Placements()
        self.frozen = frozen  # no restarts: every conflict is a Relayout
        self.specs = specs or {}  # argument value id -> TensorSpec (tensors) or int divisor (compiler.specs_by_value)
        self.log: list[tuple] = []  # undo log: ("layout", value, old) | ("relayout", block, op, user, index, old)
        self.by_shape: dict[tuple, list[TiledLayout]] = defaultdict(list)
        self.current_block: ir.Block = kernel.body  # the block of the op whose rule runs
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
                raise (op.error(str(e), rule=Rule.LAYOUT) if op else e) from None
            _check_registers(value, layout, op)
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
        op = _relayout_op(src, layout, user.loc)
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
        """Infer a block's ops; `current_block` is the block of the op whose rule runs (restored after a region
        nested in it)."""
        outer = self.current_block
        for op in list(block.ops):
            fn = RULES.get(type(op))
            if fn is None:
                raise op.error(f"internal error: no layout inference rule for `{op.name}`")
            self.current_block = block
            fn(op, self)
        self.current_block = outer

    def placement(self, anchors: set[ir.Op] | None, layout: Layout) -> Restart | None:
        """The restart that places free anchors `anchors` (free_origins' answer) in `layout`: those of them that are
        elsewhere and may move there (`Placements.movable`); None where none may, or in the last attempt."""
        moving = [] if self.frozen else self.placements.movable(anchors or set(), layout, self.overrides)
        return Restart({id(a): layout for a in moving}) if moving else None

    def move_or_relayout(self, op: ir.Op, index: int, layout: Layout) -> None:
        """Make operand `index` of `op` arrive in `layout`: by restarting with its free anchors placed there
        when it comes from nothing else, else through a Relayout."""
        value = op.operands[index]
        anchors = free_origins(value) if isinstance(value.layout, TiledLayout) else None
        restart = self.placement(anchors, layout)
        if restart is not None:
            raise restart
        self.relayout(self.current_block, op, index, layout)

    def place_reduced(self, value: ir.Value, layout: Layout) -> Restart | None:
        """The restart that makes a row reduction (`Op.reduces_rows`) land in `layout` by placing its operand's free
        anchors in the `blocked` layout that reduces there (`blocked_reducing_to`), or None: rows held as parts of
        different widths (256 + 128 columns), whose own layouts spread their rows differently, meet without a
        relayout of their statistics (and of the parts those scale)."""
        op = value.owner
        if not isinstance(op, ir.Op) or not op.reduces_rows or not isinstance(layout, TiledLayout):
            return None
        src = op.operands[0]
        anchors = free_origins(src) if isinstance(src.layout, TiledLayout) else None
        wanted = blocked_reducing_to(src.type.shape, src.dtype, layout) if anchors else None
        return self.placement(anchors, wanted) if wanted is not None else None

    def choose_common(self, op: ir.Op, indices: list[int]) -> Layout | None:
        """One layout for the array operands at `indices` of an elementwise op: the first tiled one wins and
        the other tiled operands are relayouted to it; splats mix with anything for free."""
        arrays = [i for i in indices if op.operands[i].is_array]
        if not arrays:
            return None
        tiled = [i for i in arrays if isinstance(op.operands[i].layout, TiledLayout)]
        if not tiled:
            return SPLAT
        # Prefer the layout of data over that of an index computation (an iota, or a broadcast of one, adapts
        # for free: a causal mask takes the layout of the scores, never the other way round).
        origins = {i: free_origins(op.operands[i]) for i in tiled}
        data = [i for i in tiled if not (origins[i] and all(_index_only(o) for o in origins[i]))]
        target = _costless(op, tiled, origins, op.operands[(data or tiled)[0]].layout)
        moves: dict[int, Layout] = {}
        for i in tiled:
            if op.operands[i].layout == target:
                continue
            restart = self.placement(origins[i], target) or self.place_reduced(op.operands[i], target)
            if restart is not None:
                moves.update(restart.overrides)
            else:
                self.relayout(self.current_block, op, i, target)
        if moves:
            raise Restart(moves)
        return target


def _costless(op: ir.Op, tiled: list[int], origins: dict[int, set[ir.Op] | None], target: Layout) -> Layout:
    """`target`, unless a free anchor of the operands would make its result in it at a cost (`Op.costs_in`: a
    float32 weight read from shared memory in the layout of the bf16 row it scales, 32 bytes a lane, two-way bank
    conflicted) and another operand's layout, which every operand can take for free, costs none of them (16 bytes
    of float32 a lane; the row read 8 bytes a lane). Piped layernorm over bf16 rows of 16385 with float32 weights
    read twice the wavefronts of its bf16-weighted twin (13.3 M against 6.6 M, 4.9 M of them conflicts; ncu, H200)
    and ran 0.75 of copy bandwidth against 0.81; with its rows read 8 bytes a lane, 0.84."""
    anchors = [a for i in tiled for a in origins[i] or ()]

    def costly(layout: Layout) -> bool:
        return any(a.costs_in(layout) for a in anchors)

    if not costly(target):
        return target
    for i in tiled:
        layout = op.operands[i].layout
        if all(origins[j] is not None or op.operands[j].layout == layout for j in tiled) and not costly(layout):
            return layout
    return target


def spread_stored(op: ir.Op, inf: Inference, value: ir.Value,
                  fits: Callable[[TiledLayout], bool] = lambda layout: True) -> None:
    """The inference rule's part of a store (to GMEM or SMEM) of `value`: where its layout has threads holding
    copies and it comes from free anchors alone (a line loaded from SMEM, masked with an iota, stored), restart
    with them in the `spread` layout, so that every thread moves elements of its own. Piped rows store the first
    line of each row from SMEM through such a window: one warp's lanes stored 8 bf16 each, element by element
    (the row starts anywhere in a word), while the other three issued the same stores predicated off; spread,
    each thread stores 2. `fits`: whether the store takes the spread layout as well (an SMEM tile's banks)."""
    layout = value.layout
    if not value.is_array or not isinstance(layout, TiledLayout) or not layout.replicated:
        return
    try:
        wanted = spread(value.type.shape, value.type.dtype)
    except LayoutError:
        return
    if wanted.replicated or wanted == layout or not fits(wanted):
        return
    restart = inf.placement(free_origins(value), wanted)
    if restart is not None:
        raise restart


def _index_only(op: ir.Op) -> bool:
    """An op whose result only carries indices: an iota, or a broadcast of index computations."""
    if op.free_with_operand:
        origins = free_origins(op.operands[0]) if isinstance(op.operands[0].layout, TiledLayout) else None
        return origins is not None and all(_index_only(o) for o in origins)
    return op.index_only


def infer_layouts(kernel: ir.Kernel, specs: dict[int, Any] | None = None) -> None:
    """Give every array value of `kernel` a layout. `specs`: what the launch's specialization knows of each
    argument (by value id, compiler.specs_by_value): rules that depend on alignment read it (gmem loads)."""
    overrides: dict[int, Layout] = {}
    placements = Placements()
    # Each restart places an anchor in a layout it has not been in, or back in its first for good, so inference
    # ends; a kernel's free anchors rarely move more than once or twice. The last attempt restarts no more.
    attempts = 1 + 4 * sum(1 for op in kernel.walk() if op.free_anchor or op.free_with_operand)
    for attempt in range(attempts + 1):
        inf = Inference(kernel, overrides, specs, placements, frozen=attempt == attempts)
        try:
            inf.block(kernel.body)
            break
        except Restart as restart:
            inf.undo(0)
            overrides.update(restart.overrides)
            placements.record(restart.overrides)
    for op in kernel.walk():
        for v in [*op.results, *(a for r in op.regions for a in r.args)]:
            if v.is_array and v.layout is None:
                raise op.error(f"internal error: no layout was inferred for the result of {op.name}")


# A thread has at most 255 32-bit registers: an array that needs more than that, by itself, lives in local
# memory (a spill of every element, each access a round trip), so it is refused where it is made.
MAX_REGISTERS_PER_THREAD = 255


def _check_registers(value: ir.Value, layout: TiledLayout, op: ir.Op | None) -> None:
    elements = layout.vector_length
    for d in layout.registers_shape(value.type.shape):
        elements *= d
    registers = -(-elements * value.dtype.storage_bits // 32)
    if registers > MAX_REGISTERS_PER_THREAD and op is not None:
        raise op.error(f"this {value.type} array needs {registers} registers in each thread ({elements} elements "
                       f"per thread), more than the {MAX_REGISTERS_PER_THREAD} a thread has: it would spill to "
                       f"local memory. Give each program a smaller block, or loop over the block in pieces",
                       rule=Rule.REGISTERS)


def join(a: Layout | None, b: Layout | None) -> Layout | None:
    """The layout two producers of one value (a loop's init and yield, an if's branches) settle on."""
    if a is None or a == b:
        return b
    if isinstance(a, SplatLayout):
        return b
    return a


def no_arrays(op: ir.Op, inf: Inference) -> None:
    """The inference rule of ops that make no register arrays: nothing to infer."""


def free_anchor_layout(op: ir.Op, inf: Inference) -> None:
    """The inference rule of a free anchor (a GMEM load, an iota): the layout a restart placed it in, else the
    coalesced `blocked` layout of its shape."""
    result = op.results[0]
    if result.is_array:
        try:
            layout = inf.overrides.get(id(op)) or blocked(result.type.shape, result.type.dtype)
        except LayoutError as e:
            raise op.error(str(e), rule=Rule.LAYOUT) from None
        inf.set_layout(result, layout, op)
