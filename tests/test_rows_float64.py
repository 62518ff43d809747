"""float64 rows in the row examples are computed in float64 (examples/_rows.py `wide`, _rows_launch.py
`for_dtypes`): they were computed in float32, 1e-8 off torch's float64 softmax and norms with nothing said. Every
float64 mapping of each kernel, forced, interpreted against torch in float64 on fresh random inputs with the outputs
poisoned; the wrappers as users call them, in the interpreter, and with float64 weights beside float32 rows; every
float64 mapping compiled for sm_90a and a few run from their PTX on tests/ptx_sim.py; on a GPU, every float64
mapping forced and the tuned wrappers."""
import os
import sys
from pathlib import Path

import pytest

import mgjit

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _rows  # noqa: E402
from _rows import sm_count  # noqa: E402
import _rows_launch  # noqa: E402
import _rows_piped  # noqa: E402
import cross_entropy as ce  # noqa: E402
import fused_elementwise as fe  # noqa: E402
import layernorm as ln  # noqa: E402
import ptx_sim  # noqa: E402
import rmsnorm as rms  # noqa: E402
import softmax as sm  # noqa: E402

F64 = torch.float64
# float32 arithmetic leaves 1e-8 to 1e-7 of relative error in these outputs; float64's, 1e-15 to 1e-14
TOL = 1e-12


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.dtype == F64 and not out.isnan().any(), "an output element was not written (NaN poison left)"
    return ((out - ref).norm() / ref.norm().clamp_min(1.0)).item()  # losses of one class are 0


def cases(x: torch.Tensor) -> list:
    """(name, kernel, args, constexprs, its mappings (`float64_mappings` takes float64's), [(output, reference)]) of
    each row example for x."""
    n = x.shape[1]
    w, b = torch.randn(n, dtype=F64, device=x.device), torch.randn(n, dtype=F64, device=x.device)
    target = torch.randint(0, n, (x.shape[0],), device=x.device)
    target[::3] = -100
    out = [torch.full_like(x, float("nan")) for _ in range(3)]
    loss, lse = (torch.full((x.shape[0],), float("nan"), dtype=F64, device=x.device) for _ in range(2))
    return [
        ("softmax", sm.softmax_kernel, (x, out[0], x, out[0]), {}, sm.mapping(n),
         [(out[0], torch.softmax(x, 1))]),
        ("rmsnorm", rms.rmsnorm_kernel, (x, w, out[1], x, out[1], x), {"eps": 1e-6}, rms.rmsnorm_mapping(n),
         [(out[1], torch.nn.functional.rms_norm(x, (n,), w, 1e-6))]),
        ("layernorm", ln.layernorm_rows, (x, w, b, out[2], x, out[2], x, x), {"eps": 1e-5}, ln.layernorm_mapping(n),
         [(out[2], torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5))]),
        ("cross_entropy", ce.cross_entropy_rows, (x, target, loss, lse, -100, x, loss, loss), {}, ce.mapping(n),
         [(loss, torch.nn.functional.cross_entropy(x, target, reduction="none")), (lse, torch.logsumexp(x, 1))]),
    ]


def poison(checks: list) -> None:
    for got, _ in checks:
        got.fill_(float("nan"))


def float64_mappings(configs, n: int = 0) -> tuple[mgjit.Config, ...]:
    """The float64 mappings of `configs` (of rows of n columns: with float64's own chunkings)."""
    kept = _rows_launch.in_float64(tuple(configs), False, n)
    assert not any(c.kwargs.get("PIPE") or c.kwargs.get("PERSIST") for c in kept)
    return kept


@pytest.mark.parametrize("n", [1, 3, 37, 300, 777, 5000, 9000])
def test_every_float64_mapping_interpreted(n):
    """Rows of 5000 on two warpgroups, 9000 over clusters (held and chunked) among them."""
    x = torch.randn(5, n, dtype=F64) * 4 + 1
    for name, kernel, args, constexprs, configs, checks in cases(x):
        for config in float64_mappings(configs, n):
            poison(checks)
            kernel.interpret[_rows.grid(x.shape[0], config)](*args, **constexprs, **config.launch_kwargs())
            for got, ref in checks:
                assert rel(got, ref) < TOL, f"{name} {config}"


def test_the_wrappers_compute_float64_in_float64(monkeypatch):
    """As users call them (MGJIT_INTERPRET=1: the launches interpret); cross-entropy's losses and logsumexps are
    float64 too. Float64 weights beside float32 rows take the float64 mappings (their stashes would not fit as
    float32's) and come out as torch's in float64 to float32's rounding of the rows' output."""
    monkeypatch.setenv("MGJIT_INTERPRET", "1")
    x = torch.randn(3, 7, 300, dtype=F64) * 3
    w, b = torch.randn(300, dtype=F64), torch.randn(300, dtype=F64)
    assert rel(sm.softmax(x), torch.softmax(x, -1)) < TOL
    assert rel(sm.softmax(x, dim=1), torch.softmax(x, 1)) < TOL
    assert rel(rms.rmsnorm(x, w), torch.nn.functional.rms_norm(x, (300,), w, 1e-6)) < TOL
    assert rel(ln.layernorm(x, w, b), torch.nn.functional.layer_norm(x, (300,), w, b, 1e-5)) < TOL
    logits, target = x.reshape(21, 300), torch.randint(0, 300, (21,))
    loss, lse = ce.cross_entropy(logits, target)
    assert rel(loss, torch.nn.functional.cross_entropy(logits, target, reduction="none")) < TOL
    assert rel(lse, torch.logsumexp(logits, 1)) < TOL
    y, z = torch.randn_like(x), torch.randn_like(x)
    assert rel(fe.fused(x, y, z), torch.nn.functional.gelu(x, approximate="tanh") * y + z) < TOL
    forced = torch.randn(64, 300, dtype=F64)
    assert rel(sm.softmax(forced, rows_per_program=16), torch.softmax(forced, -1)) < TOL
    assert [c.kwargs["ROWS"] for c in _rows_launch.in_float64(sm.mapping(300, 16), True)] == [16]  # as asked
    rows = x.float()
    got = ln.layernorm(rows, w, b).double()
    assert rel(got, torch.nn.functional.layer_norm(rows.double(), (300,), w, b, 1e-5)) < 1e-6
    got = rms.rmsnorm(rows, w).double()
    assert rel(got, torch.nn.functional.rms_norm(rows.double(), (300,), w, 1e-6)) < 1e-6


@pytest.mark.parametrize("n", [3, 4001, 5000])
def test_every_float64_mapping_compiles(n):
    """4001: a row of three arrays is also tried as one padded one, whose four rows of 4096 in float64 would take
    256 registers a thread (left out: _rows_launch.FLOAT64_HELD)."""
    x = torch.randn(4, n, dtype=F64)
    for name, kernel, args, constexprs, configs, _ in cases(x):
        for config in float64_mappings(configs, n):
            ptx = kernel.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a").ptx
            assert ".f64" in ptx, f"{name} {config}"


def test_float64_register_caps():
    """Mappings, held or streamed, are also tried at the FLOAT64_OCC warpgroups an SM (as CTAs of their warpgroups)
    whose register share holds their elements (2 registers each) and FLOAT64_SPARE_REGISTERS; not chunked or
    already capped ones. Streamed ones in chunks of 8192 are also tried in chunks of 4096, which fit."""
    assert _rows_launch.float64_occupancies(_rows.hold(1, (4096, 128))) == (3, 4)  # 33 elements a thread
    assert _rows_launch.float64_occupancies(_rows.hold(1, (4096,))) == (3, 4)
    assert _rows_launch.float64_occupancies(_rows.hold(1, (8192,))) == ()  # 64: 176 registers, over 170
    assert _rows_launch.float64_occupancies(_rows.hold(16, (8192,))) == ()
    assert _rows_launch.float64_occupancies(_rows.hold(1, (8192,), 4)) == ()
    assert _rows_launch.float64_occupancies(_rows.hold(1, (4096,), 8)) == (3, 4)  # a cluster's CTAs
    assert _rows_launch.float64_occupancies(_rows.hold(1, (4096,), 4, 2)) == (2,)  # 4 warpgroups an SM
    assert _rows_launch.float64_occupancies(_rows.hold(1, (2048,), 1, 3)) == ()  # 3 a CTA: not 2 CTAs
    assert _rows_launch.float64_occupancies(_rows.streaming(4096)) == (3, 4)  # a chunk of 4096: 32 a thread
    assert _rows_launch.float64_occupancies(_rows.streaming(8192)) == ()
    assert _rows_launch.float64_occupancies(_rows.chunked(8, 1024, 13)) == ()  # shared memory bounds it
    assert _rows_launch.float64_occupancies(_rows.hold(4, (1024,)).replace(OCC=8)) == ()
    kept = _rows_launch.in_float64(ce.mapping(4097))
    assert {c.kwargs.get("OCC", 0) for c in kept if c.kwargs["PARTS"] == (4096, 128)} == {0, 3, 4}
    streamed = {(c.kwargs["BLOCK"], c.kwargs["OCC"]) for c in _rows_launch.in_float64(ce.mapping(32000))
                if c.kwargs["BLOCK"] and not c.kwargs["CHUNKS"]}
    assert streamed == {(8192, 0), (4096, 0), (4096, 3), (4096, 4)}


@pytest.mark.parametrize("n", [1, 127, 4097, 100003])
def test_float64_mappings_tune(n):
    """The wrappers tune over their float64 mappings: mgjit.autotune takes them (every config sets the same
    constexprs; the capped ones' OCC is 0 in the others)."""
    for name, kernel, _, _, configs, _ in cases(torch.randn(1, n, dtype=F64)):
        mgjit.autotune(configs=list(float64_mappings(configs, n)), key=[kernel.arg_names[0]])(kernel)


def test_float64_register_caps_compile_without_spills():
    """ptxas fits the capped mappings of rows of 4097 (33 float64 elements a thread, libdevice's exps inlined)
    without spilling: a spill to local memory would cost what the cap saves."""
    x = torch.randn(2, 4097, dtype=F64)
    for name, kernel, args, constexprs, configs, _ in cases(x):
        if name not in ("softmax", "cross_entropy"):
            continue
        for config in float64_mappings(configs, x.shape[1]):
            if config.kwargs.get("OCC"):
                compiled = kernel.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a")
                assert compiled.spills == 0, f"{name} {config}: {compiled.ptxas_report}"


def chunks_of(configs) -> set[tuple[int, int, int]]:
    return {(c.kwargs["CTAS"], c.kwargs["BLOCK"], c.kwargs["CHUNKS"]) for c in configs if c.kwargs["CHUNKS"]}


def test_float64_chunkings():
    """Float64 rows are also chunked by their bytes (_rows_launch.float64_chunkings): segments of at most 4096
    columns (32 KB) over up to 16 CTAs, in chunks of 512 or 1024 columns, none wholly past the row's end; the 16-bit
    rows' chunkings stay as they were (none of 16 CTAs), and so do short rows' float64 mappings (none chunked)."""
    assert chunks_of(_rows_launch.float64_chunkings(sm.mapping(32000), 32000)) == {(8, 512, 8), (8, 1024, 4)}
    assert chunks_of(_rows_launch.float64_chunkings(sm.mapping(100003), 100003)) == {(16, 512, 13)}  # 7 of 1024: 16th
    assert chunks_of(_rows_launch.float64_chunkings(ce.mapping(262144), 262144)) == {
        (16, 512, 32), (16, 1024, 16), (16, 2048, 8)}  # segments of 16384 columns: twice the widest chunk too
    assert _rows_launch.float64_chunkings(sm.mapping(4000), 4000) == ()  # no chunked mapping to take after
    assert _rows_launch.float64_chunkings(sm.mapping(32000), 0) == ()
    assert max(c.kwargs["CTAS"] for c in sm.mapping(100003)) == 8
    for name, _, _, _, configs, _ in cases(torch.randn(1, 100003, dtype=F64)):
        kept = float64_mappings(configs, 100003)
        assert (16, 512, 13) in chunks_of(kept) and (8, 1024, 13) in chunks_of(kept), name
        assert len({tuple(sorted(c.kwargs)) for c in kept}) == 1, name  # one set of constexprs: the tuner takes them
        assert (16, 512, 13) not in chunks_of(_rows_launch.in_float64(tuple(configs))), name


def test_float64_chunkings_fit_four_ctas_an_sm():
    """A float64 segment of rows of 100003 over 16 CTAs (53 KB of shared memory, four CTAs an SM) compiles
    without spills in registers that four CTAs an SM hold."""
    x = torch.randn(2, 100003, dtype=F64)
    for name, kernel, args, constexprs, configs, _ in cases(x):
        config = next(c for c in float64_mappings(configs, 100003) if c.kwargs["CTAS"] == 16)
        compiled = kernel.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a")
        assert compiled.spills == 0 and compiled.registers * 128 * 4 <= 65536, f"{name}: {compiled.ptxas_report}"


KINDS = {"held": lambda c: not c.kwargs["BLOCK"] and c.kwargs["CTAS"] == c.kwargs["WGS"] == 1,
         "streamed": lambda c: c.kwargs["BLOCK"] and not c.kwargs["CHUNKS"],
         "cluster": lambda c: c.kwargs["CTAS"] > 1 and not c.kwargs["BLOCK"],
         "chunked": lambda c: c.kwargs["CHUNKS"] and c.kwargs["BLOCK"] == 512}


@pytest.mark.parametrize("n,kind", [(37, "held"), (777, "held"), (5000, "streamed"), (9000, "cluster"),
                                    (5000, "chunked")])
def test_float64_mappings_from_their_ptx(n, kind):
    """Held rows (a row of 777 in three arrays), streamed ones, rows over a cluster of two CTAs and float64's own
    chunks (softmax keeping its exps in the segment's shared memory), from the sm_90a PTX on the simulator: float64
    shuffles, exchanges between CTAs, exps and rsqrts as the GPU runs them."""
    x = torch.randn(2, n, dtype=F64) * 4 + 1
    for name, kernel, args, constexprs, configs, checks in cases(x):
        config = next(c for c in float64_mappings(configs, n) if KINDS[kind](c))
        compiled = kernel.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a")
        poison(checks)
        dev = ptx_sim.Device()
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        for t in dict.fromkeys(tensors):
            dev.place(t)
        dev.run(compiled, _rows.grid(x.shape[0], config), *args, cluster=config.kwargs["CTAS"])
        for got, ref in checks:
            assert rel(dev.fetch(got), ref) < TOL, f"{name} {config}"


def piped(name: str, n: int) -> list[mgjit.Config]:
    """The float64 piped mappings of softmax, RMSNorm or layernorm over rows of n columns, as their wrappers offer
    them for contiguous float64 rows."""
    configs = {"softmax": lambda: sm.mapping(n, None, 8), "rmsnorm": lambda: rms.rmsnorm_mapping(n, None, 8, (8,)),
               "layernorm": lambda: ln.layernorm_mapping(n, None, 8, (8, 8))}[name]()
    return [c for c in _rows_launch.in_float64(configs, False, n, True) if c.kwargs["PIPE"]]


def run_piped(name: str, launch, n: int, config: mgjit.Config, device: str = "cpu"):
    """(out, reference) of a row kernel over float64 rows of n columns (means of either sign: a layernorm row far
    from its predecessor's mean is read twice) under a piped mapping, its grid
    `_rows.grid`'s for more rows than its rings hold at once, `launch(kernel, grid, args, constexprs)` running it."""
    programs = 2 * config.kwargs["PIPE"] if device == "cpu" else sm_count(torch.device(device)) * config.kwargs["PIPE"]
    rows = programs * (config.kwargs["STAGES"] + 1) + 1
    x = torch.randn(rows, n, dtype=F64, device=device) * 3 + torch.randn(rows, 1, dtype=F64, device=device) * 30
    out = torch.full_like(x, float("nan"))
    grid = _rows.grid(x.shape[0], config, x.device)
    lines = (_rows_piped.lines(x), _rows_piped.lines(out))
    if name == "softmax":
        launch(sm.softmax_kernel, grid, (x, out, *lines), {})
        return out, torch.softmax(x, 1)
    w, b = torch.randn(n, dtype=F64, device=device), torch.randn(n, dtype=F64, device=device)
    if name == "rmsnorm":
        launch(rms.rmsnorm_kernel, grid, (x, w, out, *lines, _rows_piped.weight_rows(w)), {"eps": 1e-6})
        return out, torch.nn.functional.rms_norm(x, (n,), w, 1e-6)
    launch(ln.layernorm_rows, grid, (x, w, b, out, *lines, *map(_rows_piped.weight_rows, (w, b))), {"eps": 1e-5})
    return out, torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5)


def test_float64_piped_mappings():
    """Float64 rows piped through shared memory hold half the lines in registers that float32 rows do (two
    registers an element): one CTA a row up to 32 lines (8192 columns), a cluster's segments up to 40 lines at one
    program an SM, 32 at two. Softmax, RMSNorm and layernorm pipe float64 rows where `piped` asks (their wrappers:
    where x is float64); cross-entropy does not (its segment statistics are float32's)."""
    assert _rows_piped.register_lines(65, 8) == 32 and _rows_piped.register_lines(65, 2) == 65
    assert [(c.kwargs["CTAS"], c.kwargs["PL"]) for c in piped("softmax", 4097)] == [(1, (16, 1))] * 3
    assert {(c.kwargs["CTAS"], c.kwargs["PL"]) for c in piped("softmax", 100003)} == {(16, (16, 8, 1))}
    assert {(c.kwargs["CTAS"], c.kwargs["PL"], c.kwargs["STASH"]) for c in piped("rmsnorm", 100003)} == {
        (16, (16, 8, 1), 2)}
    for name in _rows_launch.PIPED_FLOAT64:
        for n in (8193, 32000, 100003):
            assert all(sum(c.kwargs["PL"]) <= 32 for c in piped(name, n)), (name, n)
    assert not [c for c in _rows_launch.in_float64(sm.mapping(8193, None, 8), False, 8193) if c.kwargs["PIPE"]]
    assert not [c for c in _rows_launch.for_dtypes(ln.layernorm_mapping(8193, None, 8, (8, 8)), (F64,), n=8193)
                if c.kwargs.get("PIPE")]
    assert [c for c in _rows_launch.for_dtypes(ce.mapping(100003, 8), (F64,), n=100003) if c.kwargs.get("PIPE")] == []
    norms = rms.rmsnorm_mapping(8193, None, 8, (8,))  # piped only where the rows, not just the weights, are float64
    assert [c for c in _rows_launch.for_dtypes(norms, (F64, F64), n=8193, piped=True) if c.kwargs.get("PIPE")]
    f32_rows = _rows_launch.for_dtypes(norms, (torch.float32, F64), n=8193, piped=True)
    assert not [c for c in f32_rows if c.kwargs.get("PIPE")]


@pytest.mark.parametrize("name", _rows_launch.PIPED_FLOAT64)
@pytest.mark.parametrize("n", [4097, 8193, 32000, 100003])
def test_float64_piped_interpreted(name, n):
    """Every float64 piped mapping (one CTA a row, a cluster's segments) against torch in float64."""
    for config in piped(name, n):
        out, ref = run_piped(name, lambda kernel, grid, args, named: kernel.interpret[grid](
            *args, **named, **config.launch_kwargs()), n, config)
        assert rel(out, ref) < TOL, config


@pytest.mark.parametrize("name", _rows_launch.PIPED_FLOAT64)
@pytest.mark.parametrize("n", [4097, 8193])
def test_float64_piped_from_their_ptx(name, n):
    """The sm_90a PTX of a float64 piped mapping on the simulator: float64 lines copied by TMA into the slots,
    the rows computed in float64, their stores (one CTA a row; two CTAs a cluster, swapping 64-bit statistics),
    RMSNorm's float64 weights stashed."""
    config = piped(name, n)[0]

    def launch(kernel, grid, args, named):
        compiled = kernel.compile(*args, **named, **config.launch_kwargs(), target="sm_90a")
        assert compiled.spills == 0, compiled.ptxas_report
        dev = ptx_sim.Device()
        for t in args[:{"softmax": 2, "rmsnorm": 3}.get(name, 4)]:  # the views (lines, weight rows) share storage
            dev.place(t)
        dev.run(compiled, grid, *args, cluster=config.kwargs["CTAS"])
        out = args[1] if name == "softmax" else args[2 if name == "rmsnorm" else 3]
        out.copy_(dev.fetch(out))

    out, ref = run_piped(name, launch, n, config)
    assert rel(out, ref) < TOL, config


@pytest.mark.gpu
@pytest.mark.parametrize("name", _rows_launch.PIPED_FLOAT64)
@pytest.mark.parametrize("n", [4097, 8193, 32000, 65536, 100003])
def test_float64_piped_on_the_gpu(name, n):
    """Every float64 piped mapping on a GPU, on the grid the wrapper launches (persistent programs or clusters),
    more rows than they take at once."""
    if not torch.cuda.is_available() or os.environ.get("MGJIT_INTERPRET") == "1":
        pytest.skip("needs a GPU")
    for config in piped(name, n):
        out, ref = run_piped(name, lambda kernel, grid, args, named: kernel[grid](
            *args, **named, **config.launch_kwargs()), n, config, "cuda")
        assert rel(out, ref) < TOL, config


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 3, 127, 1000, 4097, 9000, 100003])
def test_float64_rows_on_the_gpu(n):
    """Every float64 mapping forced, then the tuned wrappers, against torch in float64."""
    if not torch.cuda.is_available() or os.environ.get("MGJIT_INTERPRET") == "1":
        pytest.skip("needs a GPU")
    x = torch.randn(67, n, dtype=F64, device="cuda") * 4 + 1
    for name, kernel, args, constexprs, configs, checks in cases(x):
        for config in float64_mappings(configs, n):
            poison(checks)
            kernel[_rows.grid(x.shape[0], config, x.device)](*args, **constexprs, **config.launch_kwargs())
            for got, ref in checks:
                assert rel(got, ref) < TOL, f"{name} {config}"
    w, b = torch.randn(n, dtype=F64, device="cuda"), torch.randn(n, dtype=F64, device="cuda")
    target = torch.randint(0, n, (x.shape[0],), device="cuda")
    assert rel(sm.softmax(x), torch.softmax(x, -1)) < TOL
    assert rel(rms.rmsnorm(x, w), torch.nn.functional.rms_norm(x, (n,), w, 1e-6)) < TOL
    assert rel(ln.layernorm(x, w, b), torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5)) < TOL
    loss, lse = ce.cross_entropy(x, target)
    assert rel(loss, torch.nn.functional.cross_entropy(x, target, reduction="none")) < TOL
    assert rel(lse, torch.logsumexp(x, 1)) < TOL
