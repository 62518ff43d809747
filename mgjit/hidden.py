"""Launching kernels with hidden buffers: the parameters the compiler appends for `mgjit.print` (records) and
for profiling (`mgjit.trace` spans), listed in `Kernel.hidden_buffers` and a compiled kernel's metadata.

Such a launch takes the Python path: `HiddenPlan` allocates the buffers for the launch's grid, appends them to
the arguments (each an int32 vector: address, size, stride), launches, then prints what the kernel printed
(waiting for it) and hands the profile buffer to its `Profile` (read when the spans are asked for). A kernel
that prints launches this way on every call (the C launcher gets no plan for it); a kernel is profiled by
`kernel[grid](..., profile=mgjit.Profile())`, which compiles the variant with spans (`launch_profiled`). The
interpreter allocates the same buffers on the CPU and decodes them the same way (`allocate`, `finish`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from . import jit, launch, printing, specialize
from .errors import LaunchError
from .profiler import Profile

if TYPE_CHECKING:
    import torch


def allocate(hidden: dict[str, dict], grid: Sequence[int], num_warpgroups: int, device: Any,
             profile: Profile | None) -> list[tuple[str, "torch.Tensor"]]:
    """The buffers of one launch, in the order of their parameters."""
    import torch
    out = []
    for name, _ in sorted(hidden.items(), key=lambda item: item[1]["param"]):
        if name == "print":
            buf = torch.empty(printing.buffer_words(), dtype=torch.int32, device=device)
            buf[:printing.CURSOR_WORDS].zero_()
        elif profile is not None:
            buf = profile.allocate(grid, num_warpgroups, device)
        else:
            raise LaunchError("internal error: a kernel compiled to profile was launched without a Profile")
        out.append((name, buf))
    return out


def finish(kernel: str, hidden: dict[str, dict], buffers: list[tuple[str, "torch.Tensor"]], grid: Sequence[int],
           num_warpgroups: int, profile: Profile | None, logical: bool) -> None:
    """After a launch: print its records (this waits for the kernel), give the profile its buffer."""
    for name, buf in buffers:
        if name == "print":
            for line in printing.lines(buf, hidden["print"]["sites"], grid):
                print(line)
        else:
            profile.record(kernel, buf, grid, num_warpgroups, hidden["profile"]["spans"], logical)


class HiddenPlan(launch.Plan):
    """The launch plan of a kernel with hidden buffers: the Python path, with the buffers made per launch."""

    def __init__(self, name: str, compiled, device: int):
        super().__init__(name, compiled, device, c_module=None)
        self.hidden: dict[str, dict] = compiled.meta["hidden_buffers"]
        self.num_warpgroups: int = compiled.meta["num_warpgroups"]

    def __call__(self, grid: Any, values: list, profile: Profile | None = None) -> None:
        import torch
        g = launch.normalise(self.name, grid, self.cluster)
        if g is None:
            return
        if torch.cuda.is_current_stream_capturing():
            raise LaunchError(f"{self.name} prints (mgjit.print) or is profiled: such a launch reads its buffers "
                              "back after the kernel, which a CUDA graph being captured cannot do")
        buffers = allocate(self.hidden, g, self.num_warpgroups, self.device, profile)
        for _, buf in buffers:
            values = values + [buf.data_ptr(), buf.numel(), 1]
        super().__call__(g, values)
        finish(self.name, self.hidden, buffers, g, self.num_warpgroups, profile, logical=False)


def launch_profiled(kernel: jit.Kernel, grid: Any, args: tuple, kwargs: dict) -> None:
    """`kernel[grid](..., profile=p)`: launch the variant of the kernel compiled with its spans, recording
    them into `p` (an mgjit.Profile)."""
    profile = kwargs.pop("profile")
    if profile is None:  # profile=None: an ordinary launch
        return kernel._dispatch(grid, *args, **kwargs)
    if not isinstance(profile, Profile):
        raise LaunchError(f"{kernel.name}: profile= takes an mgjit.Profile, got {type(profile).__name__}")
    num_warpgroups, cluster = kwargs.pop("num_warpgroups", None), kwargs.pop("cluster", None)
    runtime, consts = kernel._bind(args, kwargs)
    kernel._refresh_if_redefined()
    values: list = []
    key_of = specialize.argument_key()
    parts = tuple(key_of(v, values) for v in runtime)
    key = ("profile", parts, launch.constexpr_key(kernel.constexpr_names, consts), num_warpgroups, cluster)
    try:
        plan = kernel._plans.get(key)
    except TypeError:
        raise LaunchError(f"constexpr arguments of {kernel.name} must be hashable: {consts}") from None
    if plan is None:
        arg_specs = tuple(specialize.from_key(kernel.name, n, part, kernel.fixed_dtypes.get(n))
                          for n, part in zip(kernel.runtime_names, parts))
        jit._refuse_during_capture(kernel.name, kernel.runtime_names, arg_specs, consts)
        plan = kernel._make_plan(arg_specs, consts, jit._warpgroups(num_warpgroups, kernel.num_warpgroups),
                                 jit._cluster(cluster), runtime, profile=True)
        kernel._plans[key] = plan
    plan(grid, values, profile=profile)
