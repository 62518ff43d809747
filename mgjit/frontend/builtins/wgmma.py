"""Hopper's warpgroup MMA: `acc = mgjit.wgmma(acc, a, b)` (asynchronous) and `mgjit.wgmma_wait(n)`."""
from __future__ import annotations

from ... import dtypes, ir, language as lang, ops
from ..registry import builtin
from ..semantics import Semantics
from ..values import SmemRef, Tensor


@builtin(lang.wgmma, unit="wgmma")
def wgmma(t: Semantics, args: list, kwargs: dict) -> Tensor:
    if len(args) != 3 or kwargs:
        raise t.error("wgmma(acc, a, b) takes the accumulator and two SMEM tiles")
    acc, a, b = args
    if not isinstance(acc, Tensor) or not acc.shape:
        raise t.error("the wgmma accumulator must be a register array (e.g. mgjit.zeros((BM, BN), mgjit.float32))")
    if not isinstance(b, SmemRef):
        raise t.error("wgmma operand b must be an SMEM tile")
    if not isinstance(a, SmemRef) and not (isinstance(a, Tensor) and a.shape):
        raise t.error("wgmma operand a must be an SMEM tile or a register array")
    return t.emit(ops.Wgmma(acc.value, a.value, b.value, t.builder.loc))


@builtin(lang.wgmma_wait, unit="wgmma")
def wgmma_wait(t: Semantics, args: list, kwargs: dict) -> None:
    pending = args[0] if args else kwargs.get("pending", 0)
    if not isinstance(pending, int):
        raise t.error("wgmma_wait takes a static number of pending groups")
    # Every array in scope that a wgmma may still be writing goes through the wait, so that no read of an
    # accumulator can be scheduled before the tensor cores are done with it: float32 arrays made by a wgmma (or
    # a wait), or carried into a loop or out of a branch. Arrays computed by ordinary instructions (an iota, a
    # mask, a load) stay as they are, free for layout inference to place.
    names = [n for n, v in t.scope.items() if isinstance(v, Tensor) and v.shape and v.dtype == dtypes.float32
             and isinstance(v.value.owner, (ops.Wgmma, ops.WgmmaWait, ops.For, ops.If, ir.Block))]
    op = t.builder.add(ops.WgmmaWait(pending, [t.scope[n].value for n in names], t.builder.loc))
    for n, r in zip(names, op.results):
        t.scope[n] = Tensor(t, r)
