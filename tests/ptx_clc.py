"""Cluster launch control on tests/ptx_sim.py: clusterlaunchcontrol.try_cancel and query_cancel (PTX ISA 9.7.19,
sm_100). The simulator launches a grid's clusters one after another in order (x fastest), each run to its end, so
while one runs every later one waits to launch: a try_cancel cancels the first of those not yet cancelled (none
once the grid is through) and writes its 16-byte response into shared memory, completing its 16 bytes on the
mbarrier. The hardware's encoding of the response is opaque (only query_cancel reads it); here it is four 32-bit
words, (1, x, y, z) for a cancelled cluster whose first CTA is (x, y, z), zeros where none was.
"""
from __future__ import annotations

import numpy as np
from ptx_arith import SimError

RESPONSE_BYTES = 16


class ClusterQueue:
    """The clusters of a grid in launch order, by their first CTA: those launched, and those cancelled."""

    def __init__(self, origins: list[tuple[int, int, int]]):
        self.origins, self.launched, self.cancelled = origins, 0, set()

    def launch(self) -> tuple[int, int, int] | None:
        """The next cluster to launch (skipping the cancelled ones), or None once the grid is through."""
        while self.launched < len(self.origins):
            self.launched += 1
            if self.launched - 1 not in self.cancelled:
                return self.origins[self.launched - 1]
        return None

    def cancel(self) -> tuple[int, int, int] | None:
        """Cancel the first cluster not launched nor cancelled: its first CTA, or None where none is left."""
        first = next((i for i in range(self.launched, len(self.origins)) if i not in self.cancelled), None)
        if first is None:
            return None
        self.cancelled.add(first)
        return self.origins[first]


class ClcOps:
    """The CTA's (tests/ptx_sim.py) cluster launch control instructions; `launches` is the grid's ClusterQueue."""

    def op_clusterlaunchcontrol(self, parts, ops, run):
        kind = parts[1]
        if kind == "try_cancel":
            self._try_cancel(parts, ops, run)
        elif kind == "query_cancel":
            self._query(parts, ops, run)
        else:
            raise SimError(f"the simulator does not know {'.'.join(parts)}")

    def _try_cancel(self, parts, ops, run):
        """try_cancel.async.shared::cta.mbarrier::complete_tx::bytes[.multicast::cluster::all].b128 [resp], [bar]:
        one cancellation per issuing thread; multicast writes the response and completes the bytes in every CTA of
        the cluster, at the same offsets."""
        resp, bar = self.address(ops[0]), self.address(ops[1])
        targets = self.cluster if "multicast::cluster::all" in ".".join(parts) else [self]
        for lane in np.nonzero(run)[0]:
            origin = self.launches.cancel()
            words = np.array((1, *origin) if origin else (0, 0, 0, 0), dtype=np.uint32)
            for cta in targets:
                offset = int(resp[lane])
                if offset % RESPONSE_BYTES or offset + RESPONSE_BYTES > len(cta.smem):
                    raise SimError(f"a try_cancel response at shared offset {offset}: 16 bytes, 16-byte aligned")
                cta.smem[offset:offset + RESPONSE_BYTES] = words.view(np.uint8)
                self._barrier(cta, int(bar[lane])).complete_tx(RESPONSE_BYTES)

    def _query(self, parts, ops, run):
        """query_cancel.is_canceled.pred.b128 p, r / query_cancel.get_first_ctaid::{x,y,z}.b32.b128 d, r."""
        lo, hi = (self.per_thread(f"{ops[1].strip()}:{half}", 64).astype(np.uint64) for half in ("lo", "hi"))
        mask = np.uint64(0xFFFFFFFF)
        if parts[2] == "is_canceled":
            self.write(ops[0], (lo & mask) != 0, run)
            return
        axis = parts[2].split("::")[-1]
        value = {"x": lo >> np.uint64(32), "y": hi & mask, "z": hi >> np.uint64(32)}[axis]
        self.write(ops[0], value & mask, run)
