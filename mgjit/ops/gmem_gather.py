"""GMEM gathers: `x[i, j]` with integer arrays among the indices reads, for each position of the arrays (broadcast
to one shape, scalars too), the element those indices name. An element whose index lies outside the tensor along
any axis reads as zero, or as the load's `other` (`mgjit.load(x, (rows, cols), other=v)`): as outside a window,
and a negative index is outside (it does not count from the end). Each thread loads the elements its layout gives
it, one predicated access each; threads holding copies of an element (a row's statistics, copied over the lanes
of the row) read the same address, one transaction for the warp. The result takes the indices' layout.

Cross-entropy's target logits, one a row (`logits[rows, targets]`), cost a load a row where a masked sum over the
row costs a compare, a select and an add an element.
"""
from __future__ import annotations

import torch

from .. import dtypes, infer, interpret, lower
from ..errors import Loc
from ..interpret import numerics
from ..interpret.scheduler import Warpgroup
from ..ir import ArrayType, Op, RefType, Value, check
from ..layouts import SplatLayout
from ..lower.context import LoweredRef, num_elems, splat_to
from .gmem_access import _all, _load_access, fill_bits


class Gather(Op):
    """The elements of `ref` at `indices` (one int32 array an axis, all of one shape); outside reads `other`."""

    name = "gather"

    def __init__(self, ref: Value, indices: list[Value], loc: Loc | None, other: int | float = 0):
        super().__init__([ref, *indices], [ArrayType(indices[0].type.shape, ref.dtype)], loc)
        self.other = other

    @property
    def ref(self) -> Value:
        return self.operands[0]

    @property
    def indices(self) -> list[Value]:
        return self.operands[1:]

    def attrs(self):
        return {} if self.other == 0 else {"other": self.other}

    def verify(self):
        check(isinstance(self.ref.type, RefType) and self.ref.type.space == "gmem", self,
              "expected a GMEM reference")
        check(len(self.indices) == self.ref.type.rank, self,
              f"a reference of rank {self.ref.type.rank} needs {self.ref.type.rank} indices, got {len(self.indices)}")
        shape = self.indices[0].type.shape
        for i in self.indices:
            check(i.is_array and i.dtype == dtypes.int32 and i.type.shape == shape, self,
                  f"gather indices are int32 arrays of shape {shape}, got {i.type}")


@infer.rule(Gather)
def _infer_gather(op: Gather, inf: infer.Inference) -> None:
    """The indices' common layout (`Inference.choose_common`)."""
    layout = inf.choose_common(op, list(range(1, len(op.operands))))
    inf.set_layout(op.result, layout, op)


@lower.rule(Gather)
def _gather(op: Gather, ctx: lower.Context) -> None:
    """Per element: its address (the sum of each index times its axis's stride, in 64 bits), whether every index
    is below its axis's size (compared unsigned, so a negative one is outside too), and one predicated access,
    whose register holds the fill's bits where it is off."""
    e = ctx.e
    ref: LoweredRef = ctx.get(op.ref)
    out = op.result
    layout, shape, dtype = out.layout, out.type.shape, ref.dtype
    frags = [splat_to(ctx, ctx.frag(i), layout) for i in op.indices]
    stride_bytes = [e.muli(s, e.i64(dtype.itemsize)) for s in ref.strides]
    bits = fill_bits(op.other, dtype)
    count = 1 if isinstance(layout, SplatLayout) else num_elems(layout, shape)
    elems = []
    for k in range(count):
        idx = [f.elems[k] for f in frags]
        addr = ref.ptr
        for i, stride in zip(idx, stride_bytes):
            addr = e.addi(addr, e.muli(e.ext_i64(i), stride))
        inside = _all(e, [e.cmpi("ult", i, n) for i, n in zip(idx, ref.sizes)])
        elems.extend(_load_access(ctx, addr, inside, dtype, 1, bits))
    ctx.set(out, lower.Frag(layout, shape, dtype, elems))


@interpret.rule(Gather)
def _interp_gather(op: Gather, wg: Warpgroup) -> None:
    ref = wg.get(op.ref, op)
    idx = [wg.get(i, op).to(torch.int64) for i in op.indices]
    inside = torch.ones(idx[0].shape, dtype=torch.bool)
    for i, n in zip(idx, ref.shape):
        inside &= (i >= 0) & (i < n)
    # Moved as bits (torch indexes no float8 tensor by a mask); the fill converted as the GPU's fill bits convert
    # it (ops/gmem.py, _interp_load).
    dtype, bits = numerics.torch_dtype(op.ref.dtype), numerics.storage_dtype(op.ref.dtype)
    out = torch.tensor([op.other], dtype=dtype).view(bits).expand(idx[0].shape).clone()
    picked = tuple(i[inside] for i in idx)
    wg.run.gmem.check_gather(ref, picked, wg.clock, op.loc, "this gather", wg.cta.program_id)
    out[inside] = ref.view(bits)[picked]
    wg.set(op.result, out.view(dtype))
