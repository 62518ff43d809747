"""Row gathers with the TMA engine: TmaGather copies rows of a 2D GMEM tensor picked by an index array (row i of
the SMEM tile is row rows[i] of the tensor, columns [col, col + the tile's columns)), completing on an mbarrier
like a TMA load (one arrival with the tile's bytes). Embedding lookups and MoE token gathers.

Each row is a TMA box of one row and one column block of the tile (descriptor box (1, W)), written at the row's
unswizzled SMEM address: the TMA engine applies the swizzle from the address bits, as for any copy, so the rows
land where `tiles.Tile.offset` puts them. Blackwell issues four rows per instruction (`tile::gather4`, whose four
row indices one thread holds: the index array lives in `gather_layout`, four consecutive indices per thread);
Hopper one row per instruction (`cp.async.bulk.tensor.2d`), from the thread holding its index. Rows whose index
is outside the tensor read as zeros (the TMA's bounds), not as an error.
"""
from __future__ import annotations

from typing import Any

from .. import dtypes, infer, interpret, lower
from ..errors import Loc, Rule
from ..interpret.scheduler import Warpgroup
from ..ir import Op, Value, check, is_int_scalar, is_ref
from ..layouts import TiledLayout, blocked
from ..lower.context import element_offsets
from ..lower.emit import Index
from .smem import SmemTile, shared_address, tile_of
from .tma import TMA_SMEM_ALIGN, check_boxes, issue_load

ROWS_PER_GATHER4 = 4


def gather_layout(rows: int) -> TiledLayout:
    """The layout of a gather's index array: four consecutive indices per thread (the four rows of one
    gather4)."""
    return blocked((rows,), dtypes.int32)


class TmaGather(Op):
    """dst[i, :] = src[rows[i], col:col + dst.shape[1]] for every row i of the SMEM tile `dst`, by TMA; one
    arrival on `barrier` with the tile's bytes. `rows` is an int32 register array of dst.shape[0] indices."""

    name = "tma_gather"
    requires = "tma"

    def __init__(self, src: Value, rows: Value, col: Value, dst: Value, barrier: Value, descriptor: int,
                 loc: Loc | None):
        super().__init__([src, rows, col, dst, barrier], [], loc)
        self.descriptor = descriptor

    @property
    def src(self) -> Value:
        return self.operands[0]

    @property
    def rows(self) -> Value:
        return self.operands[1]

    @property
    def dst(self) -> Value:
        return self.operands[3]

    @property
    def barrier(self) -> Value:
        return self.operands[4]

    def attrs(self):
        return {"descriptor": self.descriptor}

    def verify(self):
        src, rows, col, dst, barrier = self.operands
        check(is_ref(src, "gmem") and src.type.rank == 2, self, "a row gather reads rows of a 2D tensor argument")
        check(is_ref(dst, "smem") and dst.type.rank == 2 and not dst.type.transposed, self,
               "a row gather writes a 2D SMEM tile (not a transposed view)")
        check(is_ref(barrier, "barrier") and barrier.type.rank == 0, self,
               "a row gather completes on one barrier: index the barrier array, e.g. bars[slot]")
        check(src.dtype == dst.dtype, self, f"TMA cannot convert: {src.dtype.name} rows into a {dst.dtype.name} tile")
        check(is_int_scalar(col), self, "the gather's first column is an integer")
        n = dst.type.shape[0]
        if not (rows.is_array and rows.dtype == dtypes.int32 and rows.type.shape == (n,)):
            raise self.error(f"the rows of a gather into a tile of {n} rows are an int32 array of shape ({n},), got "
                             f"{rows.type}", rule=Rule.TMA_BOX)
        if n % ROWS_PER_GATHER4:
            raise self.error(f"a row gather fills rows four at a time (Blackwell's gather4): the tile needs a "
                             f"multiple of 4 rows, got {n}", rule=Rule.TMA_BOX)
        stored = tile_of(dst.type)
        if stored.row_bytes % TMA_SMEM_ALIGN:
            raise self.error(f"a row gather writes rows at {TMA_SMEM_ALIGN}-byte aligned addresses (Hopper copies one "
                             f"row at a time), and this tile's rows are {stored.row_bytes} bytes apart: use a 128B "
                             f"swizzle, or unswizzled rows of a multiple of {TMA_SMEM_ALIGN} bytes", rule=Rule.TMA_BOX)
        check_boxes(self, dst)


@infer.rule(TmaGather)
def _infer_tma_gather(op: TmaGather, inf: infer.Inference) -> None:
    layout = gather_layout(op.rows.type.shape[0])
    if op.rows.layout != layout:
        inf.move_or_relayout(op, 1, layout)


# ---------------------------------------------------------------------------------------------- lowering

@lower.rule(TmaGather)
def _tma_gather(op: TmaGather, ctx: lower.Context) -> None:
    """The elected thread arms the barrier with the tile's bytes; each thread then copies the rows whose indices
    it holds (the first copy of each, where the layout replicates them), one column block at a time."""
    e = ctx.e
    dst: SmemTile = ctx.get(op.dst)
    stored = tile_of(dst.type)
    bar = shared_address(ctx, ctx.get(op.barrier).offset)
    desc = ctx.tma_descriptors[op.descriptor]
    elected = e.cmpi("eq", ctx.wg_tid, e.i32(0))
    e.asm_void(f"@$0 mbarrier.arrive.expect_tx.shared::cta.b64 _, [$1], {stored.nbytes};", "b,r", [elected, bar])
    rows: lower.Frag = ctx.frag(op.rows)
    shape = op.rows.type.shape
    primary = ctx.is_primary(rows.layout)
    first_row = ctx.thread_index(rows.layout, shape)[0]
    col = ctx.get(op.operands[2])
    base = shared_address(ctx, dst.offset)
    gather4 = "tma_gather4" in ctx.target.units
    step = ROWS_PER_GATHER4 if gather4 else 1
    mode = ".tile::gather4" if gather4 else ""
    slots = ", ".join(f"${i + 4}" for i in range(1 + step))
    offsets = element_offsets(rows.layout, shape)
    for i in range(0, len(offsets), step):
        row = Index(e, e.addi(first_row, e.i32(offsets[i][0])))
        for block in range(stored.blocks):
            column = block * stored.block_cols
            addr = e.addi(base, stored.offset(row, column, swizzled=False).value)
            e.asm_void(f"@$0 cp.async.bulk.tensor.2d.shared::cluster.global{mode}.mbarrier::complete_tx::bytes "
                       f"[$1], [$2, {{{slots}}}], [$3];", ",".join(["b", "r", "l", "r"] + ["r"] * (1 + step)),
                       [primary, addr, desc, bar, e.addi(col, e.i32(column)) if column else col,
                        *rows.elems[i:i + step]])


# ---------------------------------------------------------------------------------------------- interpreter

@interpret.rule(TmaGather)
def _interp_tma_gather(op: TmaGather, wg: Warpgroup) -> None:
    """The boxes the lowering issues, one row and one column block each, landing as a TMA load's do."""
    dst: SmemTile = wg.get(op.dst, op)
    rows = wg.get(op.rows, op).tolist()
    col = int(wg.scalar(op.operands[2], op))
    stored = tile_of(dst.type)
    spec = wg.run.kernel.tma_descriptors[op.descriptor]
    boxes: list[tuple[list[int], Any]] = [
        ([int(r), col + block * stored.block_cols], dst.offset + stored.offset(i, block * stored.block_cols,
                                                                                 swizzled=False))
        for i, r in enumerate(rows) for block in range(stored.blocks)]
    bar = wg.get(op.barrier, op).get(wg.cta)
    issue_load(op, wg, wg.get(op.src, op), spec, dst.type, boxes, [(wg.cta, bar)], bar)
