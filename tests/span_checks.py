"""What the spans of examples/matmul_hopper.py must look like, interpreted or on the GPU: per CTA, the producer
warpgroup has one "load tile" span per work item it loads (an output tile, or a stream-K range of one), each
consumer one "tile" span per work item holding an "mma" span and then an "epilogue" span; spans of one
warpgroup are ordered and do not overlap unless one holds the other."""
from __future__ import annotations

from typing import Sequence


def check_matmul_spans(prof, grid: int, tiles: int, items: Sequence[int] | None = None) -> None:
    """`items`: each CTA's number of work items (default: data-parallel, the tiles dealt out in turn)."""
    assert not prof.warnings, prof.warnings
    spans = prof.spans
    assert all(0 <= s.start <= s.end for s in spans)
    for cta in range(grid):
        mine = [s for s in spans if s.cta == (cta, 0, 0)]
        assert len({s.sm for s in mine}) == 1, "one CTA ran on one SM"
        expected = items[cta] if items is not None else len(range(cta, tiles, grid))
        producer = sorted((s for s in mine if s.warpgroup == 0), key=lambda s: s.start)
        assert [(s.name, s.depth) for s in producer] == [("load tile", 0)] * expected
        assert all(a.end <= b.start for a, b in zip(producer, producer[1:]))
        for wg in (1, 2):
            outer = sorted((s for s in mine if s.warpgroup == wg and s.depth == 0), key=lambda s: s.start)
            inner = sorted((s for s in mine if s.warpgroup == wg and s.depth == 1), key=lambda s: s.start)
            assert [s.name for s in outer] == ["tile"] * expected
            assert [s.name for s in inner] == ["mma", "epilogue"] * expected
            assert all(a.end <= b.start for a, b in zip(outer, outer[1:]))
            for tile, (mma, epilogue) in zip(outer, zip(inner[0::2], inner[1::2])):
                assert tile.start <= mma.start <= mma.end <= epilogue.start <= epilogue.end <= tile.end
