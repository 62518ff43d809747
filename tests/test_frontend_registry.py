"""The frontend's one dispatch table: every builtin of the language is registered once, in the module of its
hardware unit, and the unit it declares is the one its ops need on the target (Op.requires)."""
import inspect

import pytest

import mgjit
from mgjit import dtypes, frontend, ir, language as lang, targets
from mgjit.frontend import registry, values

BF16 = dtypes.bfloat16


def language_markers() -> list[lang.Builtin]:
    return [v for _, v in inspect.getmembers(lang) if isinstance(v, lang.Builtin)]


def test_every_marker_of_the_language_is_registered_once():
    builtins = registry.builtins()
    for marker in language_markers():
        kinds = {"builtin": marker in builtins, "loop": registry.find_loop(marker) is not None,
                 "context": registry.find_context(marker) is not None}
        assert sum(kinds.values()) == 1, f"mgjit.{marker.name}: registered as {kinds}"


def test_a_builtin_lives_in_the_module_of_its_unit():
    for marker, entry in registry.builtins().items():
        assert entry.fn.__module__.startswith("mgjit.frontend.builtins."), marker.name
        assert entry.unit is None or entry.unit in targets.UNITS, marker.name


def test_a_unit_must_be_a_hardware_unit_of_the_targets():
    with pytest.raises(ValueError, match="unknown hardware unit 'tensor cores'"):
        registry.builtin(lang.wgmma, unit="tensor cores")


@mgjit.kernel(num_warpgroups=2)
def hopper_units(a, c):
    bars = mgjit.barrier(1)
    a_s = mgjit.smem((64, 64), mgjit.bfloat16, swizzle=128)
    mgjit.copy_async(a, (0, 0), a_s, barrier=bars[0])
    bars[0].wait()
    acc = mgjit.wgmma(mgjit.zeros((64, 64), mgjit.float32), a_s, a_s)
    mgjit.wgmma_wait(0)
    mgjit.set_max_registers(232)
    rank = mgjit.cluster_rank()
    mgjit.cluster_sync()
    rank = mgjit.cluster_reduce(rank, "max")
    c_s = mgjit.smem((64, 64), mgjit.bfloat16, swizzle=128)
    c_s[...] = acc.astype(mgjit.bfloat16)
    mgjit.fence_async_shared()
    mgjit.store_async(c, (rank * 64, mgjit.warpgroup_id()), c_s)
    mgjit.store_async_wait(0)


@mgjit.kernel
def blackwell_units(a, c):
    bars = mgjit.barrier(1)
    a_s = mgjit.smem((128, 64), mgjit.bfloat16, swizzle=128)
    mgjit.copy_async(a, (0, 0), a_s, barrier=bars[0])
    bars[0].wait()
    acc = mgjit.tmem((128, 128), mgjit.float32)
    mgjit.tcgen05_mma(acc, a_s, a_s.T, accumulate=False)
    mgjit.tcgen05_commit(bars[0])
    bars[0].wait()
    c[0:128, 0:128] = acc.load().astype(c.dtype)


@mgjit.kernel
def blackwell_ws_units(a, c):
    bars = mgjit.barrier(2)
    response = mgjit.smem((2,), mgjit.int64)
    scales_s = mgjit.smem((1, 32, 16), mgjit.float8_e8m0fnu)
    scales = mgjit.tmem((128, 4), mgjit.float8_e8m0fnu, scales=True)
    if mgjit.warp_id() == 0:
        mgjit.clc_try_cancel(response, barrier=bars[0])
        bars[0].wait()
        canceled, _ = mgjit.clc_query(response)
    if mgjit.warp_id() == 1:
        mgjit.tcgen05_copy(scales, scales_s)
        mgjit.tcgen05_commit(bars[1])
        bars[1].wait()


@mgjit.kernel
def gmem_units(a, c, descriptors, sems):
    c_s = mgjit.smem((64, 64), mgjit.bfloat16, swizzle=128)
    c_s[...] = a[0:64, 0:64]
    mgjit.fence_async_shared()
    mgjit.store_async(mgjit.tma_bounded(c, (100, None), descriptors, 0), (0, 0), c_s)
    mgjit.store_async_wait(0)
    old = mgjit.atomic_add(sems, 0, 1, sem="acq_rel")
    mgjit.atomic_max(sems, 1, old)
    mgjit.atomic_cas(sems, 2, old, 2)
    mgjit.semaphore_signal(sems, 3)
    mgjit.semaphore_wait(sems, 3, 1)


# The kernels' parameters, by name.
PARAMS = {"a": ir.Param("a", "tensor", BF16, 2), "c": ir.Param("c", "tensor", BF16, 2),
          "descriptors": ir.Param("descriptors", "tensor", dtypes.uint8, 1),
          "sems": ir.Param("sems", "tensor", dtypes.int32, 1)}


def ops_per_builtin(kernel, monkeypatch) -> list[tuple[registry.Builtin, set]]:
    """Trace `kernel`, noting for each builtin call the units its ops require."""
    calls: list[tuple[registry.Builtin, set]] = []
    open_calls: list[set] = []
    find = registry.find_builtin

    def recording(entry):
        def fn(t, args, kwargs):
            calls.append((entry, set()))
            open_calls.append(calls[-1][1])
            try:
                return entry.fn(t, args, kwargs)
            finally:
                open_calls.pop()
        return registry.Builtin(entry.marker, fn, entry.unit, entry.positional)

    def noting(original):
        def add(self, op):
            if open_calls:
                open_calls[-1].add(op.requires)
            return original(self, op)
        return add

    monkeypatch.setattr(registry, "find_builtin", lambda marker: recording(find(marker)))
    monkeypatch.setattr(values.Builder, "add", noting(values.Builder.add))
    monkeypatch.setattr(values.Builder, "add_at_top", noting(values.Builder.add_at_top))
    params = [PARAMS[name] for name in inspect.signature(kernel.fn).parameters]
    frontend.trace(mgjit.source.SourceFunction(kernel.fn), params, {}, kernel.num_warpgroups)
    return calls


@pytest.mark.parametrize("kernel,named_units", [
    (hopper_units, {"mbarrier", "tma", "wgmma", "setmaxnreg", "cluster"}),
    (blackwell_units, {"mbarrier", "tma", "tcgen05"}),
    (blackwell_ws_units, {"mbarrier", "tcgen05", "clc", None}),
    (gmem_units, {"tma", None})], ids=["hopper", "blackwell", "blackwell-ws", "gmem"])
def test_a_builtins_unit_is_the_unit_its_ops_require(kernel, named_units, monkeypatch):
    calls = ops_per_builtin(kernel, monkeypatch)
    for entry, units in calls:
        assert units - {None} == ({entry.unit} if entry.unit else set()), (entry.marker.name, units)
    assert {entry.unit for entry, _ in calls} >= named_units


@mgjit.kernel
def bad_method(x, out, BLOCK: mgjit.constexpr):
    bars = mgjit.barrier(1)
    bars[0].signal()  # ERR


@mgjit.kernel
def bad_attribute(x, out, BLOCK: mgjit.constexpr):
    out[mgjit.ds(0, BLOCK)] = x.sum()  # ERR


@pytest.mark.parametrize("kernel,phrase", [(bad_method, "a barrier has no attribute `signal` (it has arrive, wait)"),
                                           (bad_attribute, "a tensor argument has no attribute `sum` "
                                                           "(it has dtype, ndim, shape)")],
                         ids=["method", "attribute"])
def test_what_a_value_does_not_have_is_an_error_that_lists_what_it_has(kernel, phrase):
    import torch
    x = torch.zeros(256)
    lines, first = inspect.getsourcelines(kernel.fn)
    line = first + next(i for i, text in enumerate(lines) if text.rstrip().endswith("# ERR"))
    with pytest.raises(mgjit.CompileError) as info:
        kernel.compile(x, x, BLOCK=256, target="sm_90a")
    assert phrase in str(info.value) and info.value.loc.line == line and info.value.loc.file == __file__
