"""The on-device profiler, host side: `with mgjit.trace("name"):` spans recorded per warpgroup, read back as
spans, a Chrome/Perfetto trace, or a matplotlib timeline.

```python
prof = mgjit.Profile(capacity=256)            # events per warpgroup
kernel[grid](..., profile=prof)               # this launch records its spans (it compiles a profiled variant)
prof.save("trace.json")                       # chrome://tracing, ui.perfetto.dev
prof.save("trace.png")                        # SM x warpgroup lanes; in a notebook, `prof` alone draws it
print(prof.summary())                         # per span: count, mean and total time
```

Profiling is chosen per launch: a launch with `profile=` runs a variant of the kernel compiled with its spans
(a separate cache entry, launched through the Python path), and every other launch runs the kernel compiled
without them, whose PTX is exactly that of the same kernel with no `mgjit.trace` in it.

The buffer holds one region per warpgroup of every CTA (CTA-major, x fastest, then the warpgroup): a header of
HEADER_WORDS int32 words (the SM it ran on, the number of events it recorded, which may exceed the capacity,
and %globaltimer at the warpgroup's start, low word first), then `capacity` events of EVENT_WORDS words (the
span's tag: its index + 1, with END_BIT on an end; the low 32 bits of %globaltimer, in nanoseconds). Thread 0
of each warpgroup records; an event costs a shared-memory load and store, a timer read and an 8-byte global
store. Spans time what a warpgroup issues: an async copy or MMA inside a span is timed by its issue, not its
completion (put its wait in the span to time that).

Under the interpreter (`kernel.interpret[grid](..., profile=prof)`) the same spans are recorded with a logical
clock: the "SM" is the CTA's linear index and time is one tick per event, in the order the interpreter ran the
warpgroups, so the picture shows nesting and interleaving, not durations.
"""
from __future__ import annotations

import dataclasses
import io
import json
from typing import Any, Sequence

HEADER_WORDS = 4
EVENT_WORDS = 2
END_BIT = 1 << 31


def event_tag(span: int, end: bool) -> int:
    """The tag word of an event: the span's index + 1 (0 marks no event), END_BIT set on its end."""
    return (span + 1) | (END_BIT if end else 0)


@dataclasses.dataclass(frozen=True)
class Span:
    """One recorded span. Times are nanoseconds from the earliest warpgroup start of the launch (ticks of the
    logical clock under the interpreter)."""

    name: str
    cta: tuple[int, int, int]
    warpgroup: int
    sm: int
    start: int
    end: int
    depth: int  # how many spans enclose it

    @property
    def duration(self) -> int:
        return self.end - self.start


@dataclasses.dataclass
class _Launch:
    """What one profiled launch left: its buffer (on the device until first read) and how to read it."""

    kernel: str
    buffer: Any  # torch.Tensor
    grid: tuple[int, int, int]
    num_warpgroups: int
    names: list[str]
    logical: bool


class Profile:
    """A profile buffer for launches: `kernel[grid](..., profile=Profile(capacity))`. Each launch that takes it
    replaces what it held; `capacity` is the number of events (two per span) each warpgroup can record."""

    def __init__(self, capacity: int = 256):
        if not isinstance(capacity, int) or capacity < 2:
            raise ValueError(f"capacity is the number of events per warpgroup, an int >= 2, got {capacity!r}")
        self.capacity = capacity
        self._launch: _Launch | None = None
        self._spans: list[Span] | None = None
        self.warnings: list[str] = []

    # -- the launch side (mgjit/hidden.py)
    def allocate(self, grid: Sequence[int], num_warpgroups: int, device: Any) -> Any:
        """A zeroed buffer for a launch of `grid` with `num_warpgroups` warpgroups per CTA."""
        import torch
        ctas = grid[0] * grid[1] * grid[2]
        words = ctas * num_warpgroups * (HEADER_WORDS + EVENT_WORDS * self.capacity)
        if words >= 2**31:
            raise ValueError(f"a profile of {ctas} CTAs x {num_warpgroups} warpgroups x {self.capacity} events "
                             f"needs {words} words, more than an int32 size can count: lower the capacity")
        return torch.zeros(words, dtype=torch.int32, device=device)

    def record(self, kernel: str, buffer: Any, grid: Sequence[int], num_warpgroups: int, names: list[str],
               logical: bool) -> None:
        """Take a launch's buffer (read lazily, so that the launch does not wait for the kernel)."""
        self._launch = _Launch(kernel, buffer, tuple(grid), num_warpgroups, list(names), logical)
        self._spans = None

    @classmethod
    def from_chrome_trace(cls, path: str) -> "Profile":
        """The spans of a trace `save` wrote, to draw or summarize elsewhere (on a machine with matplotlib)."""
        with open(path) as f:
            trace = json.load(f)
        logical = trace["otherData"]["clock"] == "logical"
        scale = 1 if logical else 1000
        spans = [Span(e["name"], tuple(e["args"]["cta"]), e["args"]["warpgroup"], e["pid"], round(e["ts"] * scale),
                      round((e["ts"] + e["dur"]) * scale), e["args"]["depth"])
                 for e in trace["traceEvents"] if e["ph"] == "X"]
        prof = cls()
        nwg = max((s.warpgroup for s in spans), default=0) + 1
        prof._launch = _Launch(trace["otherData"]["kernel"], None, (0, 0, 0), nwg, sorted({s.name for s in spans}),
                               logical)
        prof._spans = spans
        return prof

    # -- reading
    @property
    def kernel(self) -> str | None:
        return self._launch.kernel if self._launch else None

    @property
    def spans(self) -> list[Span]:
        """The spans of the last launch, by SM, CTA, warpgroup and start (this waits for the launch to end)."""
        if self._launch is None:
            raise RuntimeError("this Profile has recorded no launch yet: pass it as kernel[grid](..., profile=p)")
        if self._spans is None:
            self._spans, self.warnings = decode(self._launch.buffer.cpu(), self._launch.grid,
                                                self._launch.num_warpgroups, self._launch.names)
        return self._spans

    @property
    def unit(self) -> str:
        return "ticks" if self._launch is not None and self._launch.logical else "ns"

    def summary(self) -> str:
        """Per span name: count, mean and total duration, and the share of the launch's warpgroup-time."""
        by_name: dict[str, list[int]] = {}
        for s in self.spans:
            by_name.setdefault(s.name, []).append(s.duration)
        rows = [f"{'span':24} {'count':>7} {'mean ' + self.unit:>14} {'total ' + self.unit:>16}"]
        for name, durations in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
            rows.append(f"{name:24} {len(durations):7d} {sum(durations) / len(durations):14.1f} "
                        f"{sum(durations):16d}")
        return "\n".join(rows + [f"warning: {w}" for w in self.warnings])

    def chrome_trace(self) -> dict:
        """The spans as a Chrome trace (`chrome://tracing`, ui.perfetto.dev): a process per SM, a thread per
        warpgroup lane (CTAs that shared an SM at once get lanes of their own), complete events in µs."""
        spans = self.spans
        lanes = assign_lanes(spans)
        nwg = self._launch.num_warpgroups
        scale = 1.0 if self._launch.logical else 1e-3
        events: list[dict] = []
        for sm in sorted({s.sm for s in spans}):
            events.append({"name": "process_name", "ph": "M", "pid": sm, "args": {"name": f"SM {sm}"}})
        for (sm, lane) in sorted({(s.sm, lanes[s]) for s in spans}):
            events.append({"name": "thread_name", "ph": "M", "pid": sm, "tid": lane,
                           "args": {"name": _lane_name(lane, nwg)}})
        for s in spans:
            events.append({"name": s.name, "cat": self._launch.kernel, "ph": "X", "pid": s.sm, "tid": lanes[s],
                           "ts": s.start * scale, "dur": s.duration * scale,
                           "args": {"cta": list(s.cta), "warpgroup": s.warpgroup, "depth": s.depth}})
        return {"traceEvents": events, "displayTimeUnit": "ns",
                "otherData": {"kernel": self._launch.kernel, "clock": "logical" if self._launch.logical
                              else "globaltimer"}}

    def save(self, path: str) -> None:
        """Write the Chrome trace (a .json path) or the timeline picture (.png, .svg, .pdf)."""
        if str(path).endswith(".json"):
            with open(path, "w") as f:
                json.dump(self.chrome_trace(), f)
        else:
            self.timeline().savefig(path, dpi=120, bbox_inches="tight")

    def timeline(self, max_lanes: int = 64):
        """A matplotlib Figure: one row per SM and warpgroup lane, a bar per span, nested spans drawn inside
        the spans that enclose them."""
        return draw_timeline(self.spans, self._launch.num_warpgroups, self.unit, self._launch.kernel, max_lanes)

    def _repr_png_(self) -> bytes | None:
        if self._launch is None:
            return None
        buf = io.BytesIO()
        self.timeline().savefig(buf, format="png", dpi=100, bbox_inches="tight")
        return buf.getvalue()

    def __repr__(self) -> str:
        if self._launch is None:
            return f"Profile(capacity={self.capacity}, no launch recorded)"
        return f"Profile(capacity={self.capacity}, kernel={self._launch.kernel}, grid={self._launch.grid})"


def _lane_name(lane: int, num_warpgroups: int) -> str:
    slot, wg = divmod(lane, num_warpgroups)
    return f"wg {wg}" if slot == 0 else f"wg {wg} (CTA slot {slot})"


def decode(buffer: Any, grid: Sequence[int], num_warpgroups: int,
           names: Sequence[str]) -> tuple[list[Span], list[str]]:
    """The spans in a profile buffer (a CPU int32 tensor) and warnings about what could not be read back (a
    full region, a span that began and did not end)."""
    words = [w & 0xFFFFFFFF for w in buffer.tolist()]
    ctas = grid[0] * grid[1] * grid[2]
    regions = ctas * num_warpgroups
    size = len(words) // regions
    capacity = (size - HEADER_WORDS) // EVENT_WORDS
    raw, warnings = [], []
    for r in range(regions):
        base = r * size
        sm, count, lo, hi = words[base:base + HEADER_WORDS]
        start = lo | (hi << 32)
        cta_index, wg = divmod(r, num_warpgroups)
        cta = (cta_index % grid[0], (cta_index // grid[0]) % grid[1], cta_index // (grid[0] * grid[1]))
        if count > capacity:
            warnings.append(f"CTA {cta} warpgroup {wg} recorded {count} events, {count - capacity} more than the "
                            f"capacity of {capacity}: Profile(capacity=...) larger")
        open_spans: list[tuple[int, int]] = []
        for k in range(min(count, capacity)):
            tag, t = words[base + HEADER_WORDS + EVENT_WORDS * k:base + HEADER_WORDS + EVENT_WORDS * (k + 1)]
            when = start + ((t - lo) & 0xFFFFFFFF)
            span = (tag & ~END_BIT) - 1
            if not tag & END_BIT:
                open_spans.append((span, when))
                continue
            if not open_spans or open_spans[-1][0] != span:
                warnings.append(f"CTA {cta} warpgroup {wg}: span {names[span]!r} ended without beginning")
                continue
            _, began = open_spans.pop()
            raw.append((names[span], cta, wg, sm, began, when, len(open_spans)))
        if open_spans and count <= capacity:
            warnings.append(f"CTA {cta} warpgroup {wg}: span {names[open_spans[-1][0]]!r} began and did not end")
    origin = min((s[4] for s in raw), default=0)
    spans = [Span(n, c, w, sm, b - origin, e - origin, d) for n, c, w, sm, b, e, d in raw]
    spans.sort(key=lambda s: (s.sm, s.cta[::-1], s.warpgroup, s.start, s.depth))
    return spans, warnings


def assign_lanes(spans: Sequence[Span]) -> dict[Span, int]:
    """Per span, its lane within its SM: warpgroup + num_warpgroups * slot, where CTAs that ran on one SM at
    overlapping times take different slots (the lowest free one, in order of their first span)."""
    nwg = max((s.warpgroup for s in spans), default=0) + 1
    extent: dict[tuple, list[int]] = {}
    for s in spans:
        key = (s.sm, s.cta)
        lo_hi = extent.setdefault(key, [s.start, s.end])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], s.start), max(lo_hi[1], s.end)
    slot_of: dict[tuple, int] = {}
    busy: dict[int, list[int]] = {}  # SM -> end time of each slot's last CTA
    for (sm, cta), (lo, hi) in sorted(extent.items(), key=lambda kv: (kv[0][0], kv[1][0])):
        ends = busy.setdefault(sm, [])
        slot = next((i for i, end in enumerate(ends) if end <= lo), len(ends))
        if slot == len(ends):
            ends.append(hi)
        else:
            ends[slot] = hi
        slot_of[(sm, cta)] = slot
    return {s: s.warpgroup + nwg * slot_of[(s.sm, s.cta)] for s in spans}


def draw_timeline(spans: Sequence[Span], num_warpgroups: int, unit: str, title: str, max_lanes: int = 64):
    """The timeline Figure of `spans` (matplotlib is imported here, on first use)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    lanes = assign_lanes(spans)
    rows = sorted({(s.sm, lanes[s]) for s in spans})[:max_lanes]
    row_of = {r: i for i, r in enumerate(rows)}
    names = sorted({s.name for s in spans}, key=lambda n: min(s.start for s in spans if s.name == n))
    fig = Figure(figsize=(12, max(2.0, 0.35 * len(rows) + 1.2)))
    ax = fig.add_subplot()
    colors = {n: f"C{i % 10}" for i, n in enumerate(names)}
    scale, label = (1.0, "ticks (logical clock)") if unit == "ticks" else (1e-3, "µs")
    for s in spans:
        row = row_of.get((s.sm, lanes[s]))
        if row is None:
            continue
        height = max(0.8 - 0.2 * s.depth, 0.2)
        ax.broken_barh([(s.start * scale, max(s.duration * scale, 1e-9))], (row - height / 2, height),
                       facecolors=colors[s.name], edgecolor="black", linewidth=0.3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"SM {sm} {_lane_name(lane, num_warpgroups)}" for sm, lane in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel(label)
    shown = "" if len(rows) == len({(s.sm, lanes[s]) for s in spans}) else f" (first {len(rows)} lanes)"
    ax.set_title(f"{title}: mgjit.trace spans{shown}")
    ax.legend(handles=[Patch(color=colors[n], label=n) for n in names], loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig
