"""mgjit.min_ctas_per_sm (PTX .minnctapersm): the directive in the PTX, the register cap ptxas applies, the
interpreter's register pool under it, and the errors that name the line; on the CPU."""
import inspect
import re
import types

import pytest

import mgjit
from mgjit.errors import Check, InterpretError

torch = pytest.importorskip("torch")


def line_of(kernel, text: str) -> int:
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@mgjit.kernel
def doubled(x, out, OCC: mgjit.constexpr):
    mgjit.min_ctas_per_sm(OCC)
    out[mgjit.ds(0, 128)] = x[mgjit.ds(0, 128)] * 2.0


@pytest.mark.parametrize("occ", [1, 2, 16])
def test_the_ptx_asks_ptxas_for_the_occupancy(occ):
    x = torch.empty(128)
    c = doubled.compile(x, x, OCC=occ, target="sm_90a")
    assert re.search(rf"\.maxntid 128, 1, 1\s*\.minnctapersm {occ}\b", c.ptx), c.ptx[:600]
    assert ("min_ctas_per_sm=" in c.ir.splitlines()[0]) == (occ > 1)


@mgjit.device
def two_rows_softmax(x, out):
    """Two 8192-column rows per program, held in registers (128 float32 a thread)."""
    r0 = mgjit.program_id(0) * 2
    v = x[mgjit.ds(r0, 2), mgjit.ds(0, 8192)].astype(mgjit.float32)
    e = mgjit.exp(v - v.max(axis=1)[:, None])
    out[mgjit.ds(r0, 2), mgjit.ds(0, 8192)] = (e / e.sum(axis=1)[:, None]).astype(out.dtype)


@mgjit.kernel
def softmax_of_two_rows(x, out, OCC: mgjit.constexpr):
    mgjit.min_ctas_per_sm(OCC)
    two_rows_softmax(x, out)


def test_ptxas_caps_the_registers():
    """Two 8192-column bf16 rows in one warpgroup (128 f32 values a thread) take more than 170 registers; asked
    for 3 CTAs per SM, ptxas fits 65536 / (3 * 128) = 170 (168 in its steps of 8), without spilling."""
    x = torch.empty(64, 8192, dtype=torch.bfloat16)
    registers = {}
    for occ in (1, 3):
        c = softmax_of_two_rows.compile(x, x, OCC=occ, target="sm_90a")
        registers[occ] = c.registers
        assert c.spills == 0
    assert registers[1] > 170 >= registers[3], registers


@mgjit.kernel(num_warpgroups=2)
def regrow(x, out, OCC: mgjit.constexpr, GROW: mgjit.constexpr):
    mgjit.min_ctas_per_sm(OCC)
    if mgjit.warpgroup_id() == 0:
        mgjit.set_max_registers(56, increase=False)
    else:
        mgjit.set_max_registers(GROW, increase=True)
        out[mgjit.ds(0, 128)] = x[mgjit.ds(0, 128)] + 1.0


def test_the_interpreter_starts_each_thread_at_the_capped_count():
    """Two CTAs of 256 threads per SM: 128 registers a thread at entry. Warpgroup 0 frees 72 x 128; warpgroup 1
    can grow to 200 with them, not to 208."""
    x = torch.randn(128)
    out = torch.full((128,), float("nan"))
    regrow.interpret[(1,)](x, out, OCC=2, GROW=200)
    assert torch.equal(out, x + 1)
    with pytest.raises(InterpretError) as info:
        regrow.interpret[(1,)](x, out, OCC=2, GROW=208)
    assert info.value.check == Check.DEADLOCK
    assert "set_max_registers(208) for 10240 more registers; the CTA's pool has 9216 free" in str(info.value)


@mgjit.kernel
def runtime_count(x, n):
    mgjit.min_ctas_per_sm(n)


@mgjit.kernel
def too_many(x, OCC: mgjit.constexpr):
    mgjit.min_ctas_per_sm(OCC)


@mgjit.kernel
def two_answers(x):
    mgjit.min_ctas_per_sm(2)
    mgjit.min_ctas_per_sm(3)


@pytest.mark.parametrize("kernel,args,text,phrase", [
    (runtime_count, (3,), "mgjit.min_ctas_per_sm(n)", "takes a static int"),
    (too_many, ({"OCC": 17}), "mgjit.min_ctas_per_sm(OCC)", "expected 1..16"),
    (too_many, ({"OCC": 0}), "mgjit.min_ctas_per_sm(OCC)", "got 0"),
    (two_answers, (), "mgjit.min_ctas_per_sm(3)", "asked for 2"),
])
def test_errors_name_the_line(kernel, args, text, phrase):
    positional = args if isinstance(args, tuple) else ()
    named = args if isinstance(args, dict) else {}
    with pytest.raises(mgjit.CompileError) as info:
        kernel.compile(torch.empty(128), *positional, **named, target="sm_90a")
    assert info.value.loc.line == line_of(kernel, text) and phrase in str(info.value), str(info.value)


@pytest.mark.parametrize("args", [(0, 1), (17, 1), (4, 0)])
def test_max_active_clusters_refuses_impossible_clusters(args):
    with pytest.raises(ValueError, match="expected 1 <= ctas <= 16 and ctas_per_sm >= 1"):
        mgjit.max_active_clusters(*args)


class _OccupancyDriver:
    """The driver calls max_active_clusters makes, answering 7 clusters and counting the occupancy queries."""
    CUresult = types.SimpleNamespace(CUDA_SUCCESS=0)
    CUdevice_attribute = types.SimpleNamespace(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR=1,
                                               CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK=2)
    CUfunction_attribute = types.SimpleNamespace(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED=1,
                                                 CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=2)
    CUlaunchAttributeID = types.SimpleNamespace(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION=1)

    def __init__(self):
        self.queries = []

    def CUlaunchConfig(self):
        return types.SimpleNamespace()

    def CUlaunchAttribute(self):
        return types.SimpleNamespace(value=types.SimpleNamespace(clusterDim=types.SimpleNamespace()))

    def cuInit(self, flags):
        return (0,)

    def cuModuleLoadData(self, image):
        return 0, "module"

    def cuModuleGetFunction(self, module, name):
        return 0, "probe"

    def cuFuncSetAttribute(self, function, attribute, value):
        return (0,)

    def cuDeviceGetAttribute(self, attribute, device):
        return 0, {1: 233472, 2: 1024}[attribute]

    def cuOccupancyMaxActiveClusters(self, function, config):
        self.queries.append((config.gridDimX, config.sharedMemBytes))
        return 0, 7


def test_max_active_clusters_asks_the_driver_once_per_arguments(monkeypatch):
    """The occupancy calculator's answer is kept per (ctas, ctas_per_sm, threads, device): a query took 3 to 4.5
    ms on an H200, which a persistent cluster grid sized at each launch would pay every time."""
    from mgjit import runtime
    fake = _OccupancyDriver()
    monkeypatch.setattr(runtime, "_driver", fake)
    monkeypatch.setattr(runtime, "_probes", {})
    monkeypatch.setattr(runtime, "ensure_context", lambda device: 0)
    mgjit.max_active_clusters.cache_clear()
    try:
        assert [mgjit.max_active_clusters(8, 2) for _ in range(3)] == [7, 7, 7]
        assert fake.queries == [(8, 233472 // 2 - 1024 - 1024)]
        assert mgjit.max_active_clusters(4, 2) == 7 and len(fake.queries) == 2
    finally:
        mgjit.max_active_clusters.cache_clear()


@pytest.mark.gpu
def test_max_active_clusters_on_the_gpu():
    """No more clusters than the SMs hold at ctas_per_sm CTAs each, all of them for clusters of one CTA, and a
    cluster of 16 CTAs fitting at least once."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for per_sm in (1, 2, 4):
        assert mgjit.max_active_clusters(1, per_sm) == sms * per_sm
        got = [mgjit.max_active_clusters(c, per_sm) for c in (2, 4, 8, 16)]
        assert all(1 <= g <= sms * per_sm // c for g, c in zip(got, (2, 4, 8, 16))), got
