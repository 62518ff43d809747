"""Cluster launch control (Blackwell): `mgjit.clc_try_cancel(response, barrier=bars[i])` asks for a cluster of
the grid that has not launched yet, and `mgjit.clc_query(response)` reads the answer."""
from __future__ import annotations

from ... import language as lang, ops
from ..registry import builtin
from ..semantics import Semantics
from ..values import BarrierSlot, SmemRef, Tensor
from .barriers import slot_ref


@builtin(lang.clc_try_cancel, unit="clc")
def clc_try_cancel(t: Semantics, args: list, kwargs: dict) -> None:
    usage = "clc_try_cancel(response, barrier=bars[i], multicast=False)"
    response = args[0] if args else kwargs.get("response")
    bar = args[1] if len(args) > 1 else kwargs.get("barrier")
    multicast = kwargs.get("multicast", False)
    if (len(args) > 2 or set(kwargs) - {"response", "barrier", "multicast"} or not isinstance(response, SmemRef)
            or not isinstance(bar, BarrierSlot) or not isinstance(multicast, bool)):
        raise t.error(f"bad call: {usage} takes a 16-byte SMEM buffer, one barrier slot and a static bool")
    ref, _ = slot_ref(t, bar)
    t.builder.add(ops.ClcTryCancel(response.value, ref, multicast, t.builder.loc))


@builtin(lang.clc_query, unit="clc")
def clc_query(t: Semantics, args: list, kwargs: dict) -> tuple[Tensor, tuple[Tensor, ...]]:
    """`canceled, (x, y, z) = mgjit.clc_query(response)`."""
    if len(args) != 1 or kwargs or not isinstance(args[0], SmemRef):
        raise t.error("clc_query(response) reads a try_cancel's response (a 16-byte SMEM buffer)")
    op = t.builder.add(ops.ClcQuery(args[0].value, t.builder.loc))
    canceled, *first = (Tensor(t, r) for r in op.results)
    return canceled, tuple(first)
