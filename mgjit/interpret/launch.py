"""`kernel.interpret[grid](...)`: bind a call as a launch would, build the IR the compiler would lower (trace,
specialization checks, target check, layout inference: `compiler.trace` and `compiler.check_and_infer`), move
CUDA tensors to the CPU and back, and run the grid one cluster at a time (scheduler.run_grid)."""
from __future__ import annotations

import dataclasses
import functools
import random
import weakref
from typing import Any, Callable, Iterator

import torch

from .. import compiler, deps, hidden, ir, jit, specialize, targets
from ..errors import LaunchError
from ..ops.clc import ClusterLaunches
from ..ops.smem_scopes import check_smem_budget, smem_plan
from ..ops.tmem import static_refs
from ..profiler import Profile
from ..specialize import Specialization
from . import numerics
from .checker import GmemWrites
from .machine import CTA, Cluster
from .scheduler import POLICIES, run_grid

# Per kernel: what its IR depends on, and its IR per specialization.
_IR: "weakref.WeakKeyDictionary[jit.Kernel, tuple[deps.Dependencies, dict]]" = weakref.WeakKeyDictionary()


class Interpreter:
    """Runs a kernel on the CPU: `interpreter[grid](*args, num_warpgroups=None, cluster=None, **kwargs)`, with
    the arguments a launch takes. `interpreter(policy=..., seed=..., target=..., resident=...)` makes one with
    another schedule (scheduler.POLICIES), target (default: the first whose hardware the kernel's ops all need)
    or number of clusters running from the start, which cluster launch control cannot cancel (ops/clc.py)."""

    def __init__(self, kernel: jit.Kernel, policy: str = "late", seed: int = 0, target: str | None = None,
                 resident: int = 1):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if not isinstance(resident, int) or resident < 1:
            raise ValueError(f"resident must be a positive number of clusters, got {resident!r}")
        self.kernel = kernel
        self.policy = policy
        self.seed = seed
        self.target = target
        self.resident = resident

    def __call__(self, policy: str = "late", seed: int = 0, target: str | None = None,
                 resident: int = 1) -> "Interpreter":
        return Interpreter(self.kernel, policy, seed, target, resident)

    def __getitem__(self, grid) -> Callable[..., None]:
        return functools.partial(self.launch, grid)

    def launch(self, grid, *args, num_warpgroups: int | None = None, cluster=None, profile: Profile | None = None,
               **kwargs) -> None:
        kernel = self.kernel
        runtime, consts = kernel._bind(args, kwargs)
        specs = specialize.of_arguments(kernel.name, kernel.runtime_names, runtime, kernel.fixed_dtypes)
        spec = kernel._specialization(specs, consts, self.target or targets.DEFAULT.name,
                                      jit._warpgroups(num_warpgroups, kernel.num_warpgroups), jit._cluster(cluster),
                                      profile is not None)
        program = self.program(spec)
        grid = _grid(kernel.name, grid, spec.cluster)
        host, write_back = _to_host(kernel.name, runtime)
        params = {v.id: (x if isinstance(s, specialize.TensorSpec) else numerics.constant(x, s.dtype))
                  for v, x, s in zip(program.args, host, spec.args)}
        # mgjit.print's and the profiler's buffers, on the CPU, decoded as a GPU launch decodes them.
        buffers = hidden.allocate(program.hidden_buffers, grid, spec.num_warpgroups, "cpu", profile)
        for (_, buf), info in zip(buffers, sorted(program.hidden_buffers.values(), key=lambda i: i["param"])):
            params[program.args[info["param"]].id] = buf
        # Every tensor here is small: waking torch's intra-op threads costs more than they save (milliseconds per
        # op on a busy machine), so the interpreter runs on one.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            Run(program, grid, spec.cluster, params, self.policy, self.seed, self.resident).execute()
        finally:
            torch.set_num_threads(threads)
        write_back()
        hidden.finish(kernel.name, program.hidden_buffers, buffers, grid, spec.num_warpgroups, profile, logical=True)

    def program(self, spec: Specialization) -> ir.Kernel:
        """The kernel's IR for `spec` with layouts inferred: what the compiler lowers. Kept until a helper or
        global the kernel reads is redefined (deps.py), as compiled kernels are."""
        known = _IR.get(self.kernel)
        if known is None or known[0].changed():
            known = _IR[self.kernel] = (deps.of_kernel(self.kernel.source), {})
        cache = known[1]
        key = (spec, self.target)
        if key not in cache:
            program = compiler.trace(self.kernel.source, spec)
            if self.target is None:
                units = {op.requires for op in program.walk() if op.requires is not None}
                spec = dataclasses.replace(spec, target=targets.covering(units).name)
            compiler.check_and_infer(program, spec)
            check_smem_budget(program, targets.get(spec.target).smem_bytes)
            cache[key] = program
        return cache[key]


def _grid(name: str, grid: Any, cluster: tuple[int, int, int]) -> tuple[int, int, int]:
    g = (grid,) if isinstance(grid, int) else tuple(grid)
    if not 1 <= len(g) <= 3 or not all(isinstance(x, int) and x > 0 for x in g):
        raise LaunchError(f"{name}: a grid is 1 to 3 positive ints, got {grid!r}")
    g = g + (1,) * (3 - len(g))
    if any(x % c for x, c in zip(g, cluster)):
        raise LaunchError(f"{name}: the grid {g} is not a whole number of clusters of {cluster}")
    return g


def _to_host(name: str, values: list[Any]) -> tuple[list[Any], Callable[[], None]]:
    """CPU tensors as they are; each CUDA tensor as a view of a CPU copy of its whole storage, one copy per
    storage so that arguments that alias still alias. The returned function copies those storages back."""
    copies: dict[int, tuple[Any, Any]] = {}
    out = []
    for v in values:
        if not isinstance(v, torch.Tensor) or v.device.type == "cpu":
            out.append(v)
            continue
        if v.device.type != "cuda":
            raise LaunchError(f"{name}: the interpreter runs on CPU or CUDA tensors, got one on {v.device}")
        storage = v.untyped_storage()
        if storage.data_ptr() not in copies:
            copies[storage.data_ptr()] = (storage, storage.cpu())
        view = torch.empty(0, dtype=v.dtype)
        view.set_(copies[storage.data_ptr()][1], v.storage_offset(), v.shape, v.stride())
        out.append(view)

    def write_back() -> None:
        for device, host in copies.values():
            device.copy_(host)

    return out, write_back


class Run:
    """One launch being interpreted."""

    def __init__(self, kernel: ir.Kernel, grid: tuple[int, int, int], cluster: tuple[int, int, int],
                 params: dict[int, Any], policy: str, seed: int, resident: int = 1):
        self.kernel = kernel
        self.grid = grid
        self.cluster = cluster
        self.params = {**params, **static_refs(kernel)}
        self.policy = policy
        self.rng = random.Random(seed)
        self.smem_offsets, self.smem_bytes = smem_plan(kernel)
        self.ticks = 0  # the logical clock that profiled spans record (mgjit/profiler.py)
        self.gmem = GmemWrites()  # plain GMEM stores and released atomics' clocks, for the race checker
        # Under the random schedule the clusters launch in an order drawn from the seed: a GPU promises none, and
        # CTAs that hand work to each other through GMEM (a fix-up's pieces and counts) must not depend on one.
        self.launches = ClusterLaunches(grid, cluster, resident, self.rng if policy == "random" else None)

    def execute(self) -> None:
        run_grid(self, self.clusters())

    def clusters(self) -> Iterator[Cluster]:
        """The grid's clusters in launch order, each made (and launched) when the scheduler starts it; a cluster
        that cluster launch control cancelled before then never runs (ops/clc.py)."""
        cx, cy, cz = self.cluster
        for x, y, z in self.launches:
            yield Cluster([CTA((x + i, y + j, z + k), i + cx * (j + cy * k), self.kernel.num_warpgroups,
                               self.smem_bytes, self.kernel.min_ctas_per_sm)
                           for k in range(cz) for j in range(cy) for i in range(cx)],
                          self.cluster)
