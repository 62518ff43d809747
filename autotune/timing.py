"""Timing one config: the `Run` handed to a timer, and the default timer (CUDA events, L2 flush, median).

A timer is any `callable(run) -> float` giving milliseconds. `run()` restores the in-place arguments and
launches once. Timers that know about it (the default one) call `run.setup()` and `run.launch()` apart so
that the restoring copies are not timed."""
from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config import Config

Timer = Callable[["Run"], float]


@dataclass(frozen=True)
class Run:
    """One launch of one config, as handed to a timer."""

    config: Config
    setup: Callable[[], None]   # copies `restore` arguments back and zeroes `reset` ones
    launch: Callable[[], None]  # launches the kernel once with this config

    def __call__(self) -> None:
        self.setup()
        self.launch()


class CudaEventTimer:
    """Median of many CUDA-event timings of a launch, with L2 flushed before each one.

    Runs for about `warmup_ms` untimed, then `rep_ms` timed (clamped to `min_reps`..`max_reps` launches).
    Before every timed launch it writes a `flush_bytes` buffer (larger than any Hopper/Blackwell L2), so
    that no launch finds its inputs in L2 left there by the one before."""

    def __init__(self, warmup_ms: float = 25.0, rep_ms: float = 100.0, min_reps: int = 10,
                 max_reps: int = 1000, flush_bytes: int = 256 << 20):
        if not 1 <= min_reps <= max_reps:
            raise ValueError(f"need 1 <= min_reps <= max_reps; got min_reps={min_reps}, max_reps={max_reps}")
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms
        self.min_reps, self.max_reps = min_reps, max_reps
        self.flush_bytes = flush_bytes
        self._flush: dict[int, Any] = {}  # device index -> flush buffer, allocated once per device

    @property
    def device(self) -> str:
        import torch

        return torch.cuda.get_device_name()

    def _flush_buffer(self, torch: Any) -> Any:
        """The flush buffer of the current device, kept across sweeps: made outside torch.compile's CUDA-graph
        pools, as a first sweep inside a "reduce-overhead" warm-up would otherwise leave it in one."""
        from ..torch_op import outside_graph_pools

        index = torch.cuda.current_device()
        if index not in self._flush:
            device = torch.device("cuda", index)
            self._flush[index] = outside_graph_pools(
                lambda: torch.empty(self.flush_bytes // 4, dtype=torch.int32, device=device), device)
        return self._flush[index]

    def __call__(self, run: Callable[[], None]) -> float:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("the default autotune timer times with CUDA events, but torch sees no CUDA "
                               "device; pass timer=callable(run) -> ms to mgjit.autotune to time otherwise")
        setup = getattr(run, "setup", lambda: None)
        launch = getattr(run, "launch", run)
        flush = self._flush_buffer(torch)

        # Estimate one launch (flush included, as in the timed loop) to size the warm-up and the reps.
        setup()
        launch()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            setup()
            flush.zero_()
            launch()
        end.record()
        torch.cuda.synchronize()
        estimate = max(start.elapsed_time(end) / 5, 1e-3)
        for _ in range(max(1, int(self.warmup_ms / estimate))):
            setup()
            launch()
        reps = min(self.max_reps, max(self.min_reps, int(self.rep_ms / estimate)))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            setup()
            flush.zero_()  # after setup: the restoring copies must not leave the inputs in L2 either
            starts[i].record()
            launch()
            ends[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def device_name(timer: Any) -> str:
    """The device that timings are stored under: the timer's `device` attribute where it has one (the
    default timer's is the CUDA device name), else the current CUDA device, else "cpu"."""
    name = getattr(timer, "device", None)
    if name is not None:
        return str(name)
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
