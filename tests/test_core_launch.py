"""The C launch fast path on a stub GPU (tests/launch_stub.py): its dispatch key agrees with
specialize.argument_key() on every kind of argument, each change that matters finds another plan, the packed
parameters are what the kernel's ABI says (and what the Python path passes), empty grids launch nothing, and a
miss during CUDA graph capture is an error."""
import os
import struct
import sys

import pytest

import mgjit
from mgjit import launch, specialize

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(__file__))
from launch_stub import StubGPU, tensor_values  # noqa: E402


@pytest.fixture
def gpu(monkeypatch):
    try:
        return StubGPU(monkeypatch)
    except RuntimeError as e:  # no C compiler or no DLPack exchange API: nothing to test here
        pytest.skip(f"the C launcher is unavailable: {e}")


def add(x, y, out, n, BLOCK: mgjit.constexpr):
    start = mgjit.program_id(0) * BLOCK
    out[mgjit.ds(start, BLOCK)] = x[mgjit.ds(start, BLOCK)] + y[mgjit.ds(start, BLOCK)] + n


def scale(x, out, alpha, flag, SCALE: mgjit.constexpr, BLOCK: mgjit.constexpr):
    v = x[mgjit.program_id(1), mgjit.ds(0, BLOCK)] * alpha * SCALE
    out[mgjit.ds(0, BLOCK)] = mgjit.where(flag, v, -v)


def _key_arguments():
    base = torch.arange(4096, dtype=torch.float32)
    m = base[:1024].view(32, 32)
    yield from [base, base[1:], base[2:], base[4:], base[:4095], m, m[1:], m[:, 1:], m[:, :31], m.t(), m[:, ::2],
                m[:, :1], m.view(32, 32, 1)[:, :, :1].expand(32, 32, 4), torch.tensor(3.0), base[:0],
                torch.zeros(0, 3), torch.zeros(4, 0), torch.nn.Parameter(base[:64]),
                torch.zeros(8, requires_grad=True), base.view(2, 2, 1024)[:, :, 8:]]
    for dtype in (torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64,
                  torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2):
        t = torch.zeros(64, 24, dtype=dtype)
        yield from [t, t[:, 1:], t[1:], t[:, 3:]]
    yield from [0, 1, 15, 16, -16, -17, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**63 - 1, -2**63, 1.5, 0.0, True,
                False]


def test_the_c_key_says_what_argument_key_says(gpu):
    """Every argument's C key word decodes to exactly the part specialize.argument_key() computes."""
    from mgjit import fastlaunch
    seen = []

    def miss(key, runtime, consts, nwg, cluster):
        seen.append((key, runtime))

    arguments = list(_key_arguments())
    for v in arguments:  # a fresh dispatcher each time: every call misses, unless it takes the slow path
        gpu.module.Dispatcher(("v",), (False,), (object(),), object(), miss, lambda *a, **k: None)[(1,)](v)
    assert len(seen) == len(arguments)
    python_key = specialize.argument_key()
    for key, (v,) in seen:
        (part,) = gpu.module.decode(key)
        if isinstance(part, tuple) and len(part) == 6:
            part = (getattr(torch, fastlaunch.KEY_DTYPES[part[0]].torch_name), *part[1:])
        assert part == python_key(v, []), v


def test_what_the_c_path_leaves_to_python(gpu):
    """Tensor subclasses, ints beyond 64 bits, other types, unhashable constexprs: the slow path, every time."""
    slow = []
    dispatcher = gpu.module.Dispatcher(("v", "C"), (False, True), (object(), None), object(),
                                       lambda *a: pytest.fail("no miss"), lambda grid, *a, **k: slow.append(a))

    class Sub(torch.Tensor):
        pass

    odd = [torch.zeros(4).as_subclass(Sub), 2**64, None, "text", [1], torch.zeros(2, dtype=torch.complex64)]
    for v in odd:
        dispatcher[(1,)](v)
    dispatcher[(1,)](1, C=[1, 2])
    dispatcher[(1,)](1, D=3)
    assert len(slow) == len(odd) + 2


def test_a_launch_packs_the_abi_values_and_hits_after_one_miss(gpu):
    k = mgjit.kernel(add)
    x, y, out = torch.randn(4096), torch.randn(4096), torch.empty(4096)
    k[(4,)](x, y, out, 7, BLOCK=1024)
    k[(4,)](x, y, out, 9, BLOCK=1024)
    assert gpu.misses == 1
    first, second = gpu.launches
    assert first.path == second.path == "c"
    assert first.grid == (4, 1, 1) and first.threads == 128 and first.cluster == (1, 1, 1)
    assert first.values == (*tensor_values(x), *tensor_values(y), *tensor_values(out), 7)
    assert second.values[-1] == 9
    assert k._native.plan_count() == 1


def test_the_python_path_passes_what_the_c_path_packs(monkeypatch):
    values = {}
    x, out = torch.randn(2, 512)[:, 3:259], torch.empty(256)
    for c_launcher in (True, False):
        gpu = StubGPU(monkeypatch, c_launcher=c_launcher)
        k = mgjit.kernel(scale)
        k[(1, 2)](x, out, 0.25, True, SCALE=3, BLOCK=256)
        (launch,) = gpu.launches
        assert launch.path == ("c" if c_launcher else "python")
        values[c_launcher] = launch.values
    assert values[True] == values[False]
    assert values[True] == (*tensor_values(x), *tensor_values(out), 0.25, True)


@pytest.mark.parametrize("change", ["alignment", "stride", "dtype", "rank", "int divisibility", "int width",
                                    "constexpr value", "constexpr type", "num_warpgroups"])
def test_each_change_that_matters_finds_another_plan(gpu, change):
    k = mgjit.kernel(add)
    x = torch.randn(8192)
    args = dict(x=x, y=x, out=x, n=1024, BLOCK=1024)
    changed = dict(args)
    if change == "alignment":
        changed["y"] = x[2:]
    elif change == "stride":
        changed["y"] = x[::2]
    elif change == "dtype":
        changed["y"] = x.half()
    elif change == "rank":
        changed["y"] = x.view(8, 1024)
    elif change == "int divisibility":
        changed["n"] = 1000
    elif change == "int width":
        changed["n"] = 2**40
    elif change == "constexpr value":
        changed["BLOCK"] = 512
    elif change == "constexpr type":
        changed["BLOCK"] = 1024.0
    extra = {"num_warpgroups": 2} if change == "num_warpgroups" else {}
    k[(1,)](**args)
    try:
        k[(1,)](**changed, **extra)
    except mgjit.CompileError:
        pass  # a float BLOCK, a rank-2 window of a rank-1 slice: what matters is that it missed
    assert gpu.misses == 2
    k[(1,)](**args)
    assert gpu.misses == 2


def offset(x, out, SHIFT: mgjit.constexpr, BLOCK: mgjit.constexpr):
    out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, BLOCK)] + SHIFT


@pytest.mark.parametrize("c_launcher", [True, False], ids=["c", "python"])
def test_constexprs_equal_by_value_but_not_by_bits_find_other_kernels(monkeypatch, c_launcher):
    """-0.0 == 0.0, yet x + -0.0 and x + 0.0 are different kernels (-0.0 + -0.0 is -0.0): each gets its own, in
    the compile memo and in both launch paths, also inside a tuple; a NaN constexpr finds its kernel again."""
    try:
        gpu = StubGPU(monkeypatch, c_launcher=c_launcher)
    except RuntimeError as e:
        pytest.skip(f"the C launcher is unavailable: {e}")
    k = mgjit.kernel(offset)
    x, out = torch.randn(256), torch.empty(256)
    zero, negative = k.compile(x, out, SHIFT=0.0, BLOCK=256), k.compile(x, out, SHIFT=-0.0, BLOCK=256)
    assert zero is not negative and zero.ptx != negative.ptx
    functions = set()
    for shift in (0.0, -0.0, 0.0, -0.0, float("nan"), float("nan")):
        k[(1,)](x, out, SHIFT=shift, BLOCK=256)
        functions.add(gpu.launches[-1].function)
    assert len(functions) == 3 and gpu.misses == 3
    assert launch.strict_constexpr((0.0, 1)) != launch.strict_constexpr((-0.0, 1))
    assert launch.strict_constexpr(1) != launch.strict_constexpr(1.0) != launch.strict_constexpr(True)


def test_equal_keys_share_a_plan(gpu):
    """1000 and 1004 are both not multiples of 16 (the plan assumes neither is a multiple of 8); a new tensor
    with the same properties, and the same arguments by keyword, find the first plan."""
    k = mgjit.kernel(add)
    x = torch.randn(4096)
    k[(1,)](x, x, x, 1000, BLOCK=1024)
    k[(1,)](torch.randn(4096), x, x, 1004, BLOCK=1024)
    k[(1,)](x=x, y=x, out=x, n=1004, BLOCK=1024)
    assert gpu.misses == 1 and len(gpu.launches) == 3


@pytest.mark.parametrize("redefine", ["global", "helper", "default", "deleted helper"])
def test_a_redefined_global_or_helper_misses(gpu, redefine):
    """The C launcher's own check of what a kernel reads (mgjit.deps.Dependencies.watched) sees each change."""
    module = _load(os.path.join(os.path.dirname(__file__), "launch_globals.py"))
    x = torch.randn(256)
    module.shifted[(1,)](x, x, BLOCK=256)
    module.shifted[(1,)](x, x, BLOCK=256)
    assert gpu.misses == 1
    if redefine == "global":
        module.OFFSET = 2
    elif redefine == "helper":
        module.bump = mgjit.device(unchanged)
    elif redefine == "default":
        module.bump.fn.__defaults__ = (2.0,)
    else:  # the kernel now reads an unbound name: the launch misses and the compiler says so
        del module.bump
        with pytest.raises(mgjit.CompileError, match="bump"):
            module.shifted[(1,)](x, x, BLOCK=256)
        assert gpu.misses == 2 and len(gpu.launches) == 2
        return
    module.shifted[(1,)](x, x, BLOCK=256)
    module.shifted[(1,)](x, x, BLOCK=256)
    assert gpu.misses == 2 and len(gpu.launches) == 4


def unchanged(v):
    return v


def test_the_examples_kernels_run_no_python_check_per_launch():
    """What the row examples' kernels and the Hopper matmul read (their helpers, constants, and the helpers'
    default arguments) is checked by the C launcher itself: no Python guard runs on a launch. The Python check
    of some 50 names took 3 of the 5 us a layernorm launch cost on the CPU."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    import cross_entropy
    import layernorm
    import matmul_hopper
    import rmsnorm
    import softmax
    for kernel in (softmax.softmax_kernel, rmsnorm.rmsnorm_kernel, layernorm.layernorm_rows,
                   cross_entropy.cross_entropy_rows, matmul_hopper.matmul_kernel):
        kernel.source_key()
        watched, guard = kernel._guard()
        assert guard is None and watched, kernel.name
    module = _load(os.path.join(os.path.dirname(__file__), "launch_globals.py"))
    module.shifted.source_key()
    watched, guard = module.shifted._guard()
    assert guard is None
    assert {name for entry in watched if isinstance(entry[1], tuple) for name in entry[1]} == {"OFFSET", "bump"}
    assert [entry[1] for entry in watched if isinstance(entry[1], str)] == ["__defaults__"]


def _load(path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("launch_globals", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_empty_grid_launches_nothing_and_a_negative_one_is_an_error(gpu):
    k = mgjit.kernel(add)
    x = torch.randn(0)
    for grid in [(0,), 0, (4, 0), (1, 1, 0), [0, 2]]:
        k[grid](x, x, x, 0, BLOCK=1024)
    assert gpu.launches == [] and gpu.misses == 1  # checked and compiled once, never launched
    for grid in [(-1,), (1, -2), (1, 65536), (1, 2, 3, 4), "1", (1.0,)]:
        with pytest.raises(mgjit.LaunchError, match="grid"):
            k[grid](x, x, x, 0, BLOCK=1024)
    assert gpu.launches == []


def test_a_miss_during_capture_is_an_error_and_a_hit_launches(gpu):
    k = mgjit.kernel(add)
    x = torch.randn(4096)
    k[(4,)](x, x, x, 16, BLOCK=1024)
    gpu.capturing = True
    k[(4,)](x, x, x, 32, BLOCK=1024)
    with pytest.raises(mgjit.LaunchError, match="CUDA graph is being captured.*warm-up"):
        k[(4,)](x, x, x, 33, BLOCK=1024)
    assert gpu.misses == 2 and len(gpu.launches) == 2


def test_tma_descriptors_and_clusters_in_c(gpu):
    """The C plan encodes each TMA descriptor with the arguments TensorMaps gives cuTensorMapEncodeTiled (the stub
    encoder writes them into the descriptor) and launches a cluster kernel with its cluster shape."""
    from test_gpu_matmul import multicast_copy
    from mgjit import runtime
    k = mgjit.kernel(multicast_copy.fn)
    x, out = torch.randn(6 * 64, 64).bfloat16(), torch.empty(12 * 64, 64).bfloat16()
    k[(12,)](x, out, R=64, C=64, cluster=(2, 1, 1))
    (launch,) = gpu.launches
    assert launch.cluster == (2, 1, 1) and launch.grid == (12, 1, 1)
    descriptors = [v for v in launch.values if isinstance(v, bytes)]
    assert len(descriptors) == 2
    compiled = k.compile(x, out, R=64, C=64, cluster=(2, 1, 1))
    for blob, desc, t in zip(descriptors, compiled.meta["tma"], (x, out)):
        words = struct.unpack("<16Q", blob)
        param, dtype, swizzle, interleave, l2, oob, box, itemsize = runtime.tensormap_arguments(compiled.params,
                                                                                                  desc)
        assert words[0] == dtype | 2 << 8 | interleave << 16 | swizzle << 24 | l2 << 32 | oob << 40
        assert words[1] == t.data_ptr()
        assert words[2:4] == (t.shape[1], t.shape[0]) and words[7] == t.stride(0) * 2
        assert words[12] == box[1] | box[0] << 32 and words[15] == 0x0101
    # Alternating operands of one shape (the layers of a model) each get their own descriptors, from 8 cached.
    operands = [(torch.randn(6 * 64, 64).bfloat16(), torch.empty(12 * 64, 64).bfloat16()) for _ in range(10)]
    for xi, oi in operands + operands[:3]:
        k[(12,)](xi, oi, R=64, C=64, cluster=(2, 1, 1))
        blobs = [v for v in gpu.launches[-1].values if isinstance(v, bytes)]
        assert [struct.unpack("<16Q", b)[1] for b in blobs] == [xi.data_ptr(), oi.data_ptr()]
    with pytest.raises(mgjit.LaunchError, match="whole number of clusters"):
        k[(3,)](x, out, R=64, C=64, cluster=(2, 1, 1))


@pytest.mark.parametrize("cols,dtype,promotion", [(16, "bfloat16", 64), (64, "bfloat16", 128), (64, "float8_e4m3fn", 64),
                                                   (128, "float8_e4m3fn", 128), (128, "bfloat16", 256),
                                                   (256, "float32", 256)])
def test_l2_promotion_is_a_box_row_wide(cols, dtype, promotion):
    """L2 fetches what a box row spans (64 to 256 bytes), not the next k-slice beside a matmul's 128-byte one."""
    from mgjit import dtypes, runtime
    assert runtime.l2_promotion({"box": [64, cols]}, dtypes.BY_NAME[dtype]) == promotion


def test_interpret_mode_bypasses_the_c_launcher(gpu, monkeypatch):
    k = mgjit.kernel(add)
    x, y, out = torch.randn(1024), torch.randn(1024), torch.full((1024,), float("nan"))
    k[(1,)](x, y, out, 1, BLOCK=1024)
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    k[(1,)](x, y, out, 1, BLOCK=1024)
    torch.testing.assert_close(out, x + y + 1)
    assert len(gpu.launches) == 1


def test_unusual_calls_get_clear_errors_through_the_slow_path(gpu):
    k = mgjit.kernel(add)
    x = torch.randn(1024)
    with pytest.raises(mgjit.LaunchError, match="missing the argument `n`"):
        k[(1,)](x, x, x, BLOCK=1024)
    with pytest.raises(mgjit.LaunchError, match="has no parameter `BLOKC`"):
        k[(1,)](x, x, x, 1, BLOKC=1024)
    with pytest.raises(mgjit.LaunchError, match="is a str"):
        k[(1,)](x, x, x, "1", BLOCK=1024)
    with pytest.raises(mgjit.LaunchError, match="does not fit in 64 bits|does not fit its parameter"):
        k[(1,)](x, x, x, 2**70, BLOCK=1024)
    with pytest.raises(mgjit.LaunchError, match="dimensions must be below 2"):
        k[(1,)](x[:1].expand(2**31), x, x, 1, BLOCK=1024)
    assert gpu.launches == []


def test_the_fallback_warns_once(monkeypatch):
    from mgjit import fastlaunch
    monkeypatch.setattr(fastlaunch, "_module", None)
    monkeypatch.setattr(fastlaunch, "_failed", None)
    monkeypatch.delenv("MGJIT_NO_C_LAUNCHER", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def no_compiler():
        raise RuntimeError("no C compiler found")

    monkeypatch.setattr(fastlaunch, "module", no_compiler)
    with pytest.warns(RuntimeWarning, match="no C compiler found.*slower Python path"):
        assert fastlaunch.load() is None
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fastlaunch.load() is None


class _Timer:
    """A fake timer: BLOCK=512 with two warpgroups is fastest."""
    device = "stub-gpu"

    def __call__(self, run) -> float:
        run()
        return 1.0 if run.config.kwargs["BLOCK"] == 512 and run.config.num_warpgroups == 2 else 2.0


def test_an_autotuned_kernel_launches_in_c_after_its_first_call(gpu, monkeypatch, tmp_path):
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    configs = [mgjit.Config(BLOCK=b, num_warpgroups=w) for b in (256, 512) for w in (1, 2)]
    tuned = mgjit.autotune(configs=configs, key=["n"], timer=_Timer(), jobs=1)(mgjit.kernel(add))
    misses = []
    original = tuned._c_miss
    monkeypatch.setattr(tuned, "_c_miss", lambda *a, **k: misses.append(1) or original(*a, **k))
    x = torch.randn(4096)
    grids = []

    def grid(meta):
        grids.append(meta)
        return (meta["n"] // meta["BLOCK"],)

    tuned[grid](x, x, x, 4096)
    sweep = len(gpu.launches)
    tuned[grid](x, x, x, 4096)
    tuned[grid](x=x, y=torch.randn(4096), out=x, n=4096)
    assert len(misses) == 1 and len(gpu.launches) == sweep + 2
    last = gpu.launches[-1]
    assert last.path == "c" and last.grid == (8, 1, 1) and last.threads == 256
    assert grids[-1] == {"x": x, "y": grids[-1]["y"], "out": x, "n": 4096, "BLOCK": 512, "num_warpgroups": 2}
    tuned[grid](x, x, x, 2048)  # a new tuning key: Python sweeps again
    tuned[grid](x.half(), x.half(), x.half(), 4096)  # a new dtype too
    assert len(misses) == 3
    gpu.capturing = True
    tuned[grid](x, x, x, 4096)
    with pytest.raises(mgjit.LaunchError, match="cannot tune while a CUDA graph"):
        tuned[grid](x, x, x, 1024)
