"""TMA kernels from their sm_90a PTX on the CPU (tests/ptx_sim.py with tests/ptx_tma.py): boxes loaded and stored
through every swizzle, at the tensor's ragged edge, and the piped row kernels (examples/_rows_piped.py: rings of
slots, envelopes, stashed weights, clusters, segments) against torch and the interpreter, outputs poisoned, with
the copies landing at either end of the window the memory model allows them."""
import os
import sys
from pathlib import Path

import pytest

import mgjit

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "examples"), str(Path(__file__).resolve().parent)]
import _rows  # noqa: E402
import _rows_piped as piped  # noqa: E402
import cross_entropy as ce  # noqa: E402
import layernorm as ln  # noqa: E402
import ptx_sim  # noqa: E402
import rmsnorm as rms  # noqa: E402
import softmax as sm  # noqa: E402
from _rows_piped import piped_views  # noqa: E402
from ptx_tma import TensorMap  # noqa: E402

BF16 = torch.bfloat16
LANDS = ("late", "early")


@mgjit.kernel
def box_round_trip(x, out, back, R: mgjit.constexpr, C: mgjit.constexpr, SW: mgjit.constexpr):
    """A box of x through SMEM, read into registers (+1, to out), and written back by TMA from a second tile."""
    s = mgjit.smem((R, C), x.dtype, swizzle=SW)
    t = mgjit.smem((R, C), x.dtype, swizzle=SW)
    bar = mgjit.barrier(1)
    r0 = mgjit.program_id(0) * R
    mgjit.copy_async(x, (r0, 8), s, barrier=bar[0])
    bar[0].wait()
    v = s[...]
    out[mgjit.ds(r0, R), mgjit.ds(0, C)] = v + 1.0
    t[...] = v * 2.0
    mgjit.fence_async_shared()
    mgjit.store_async(back, (r0, 8), t)
    mgjit.store_async_wait(0)


@mgjit.kernel
def stored_twice(x, out, R: mgjit.constexpr, C: mgjit.constexpr):
    """A tile stored by TMA, waited for, written again from registers and stored again."""
    t = mgjit.smem((R, C), x.dtype)
    v = x[mgjit.ds(0, R), mgjit.ds(0, C)]
    t[...] = v
    mgjit.fence_async_shared()
    mgjit.store_async(out, (0, 0), t)
    mgjit.store_async_wait(0)
    t[...] = v * 2.0
    mgjit.fence_async_shared()
    mgjit.store_async(out, (R, 0), t)
    mgjit.store_async_wait(0)


@pytest.mark.parametrize("lands", LANDS)
def test_a_store_after_a_tma_store_wait_meets_the_warpgroup_first(lands):
    """The wait for a TMA store's reads is one thread's (`cp.async.bulk.wait_group.read`): the warpgroup meets
    before its next store to SMEM overwrites the tile, not at the wait itself, so a wait that no such store
    follows (the last, or a piped row's before the one thread refills the slot) meets nothing. From the PTX,
    with the store reading its tile as late as the wait."""
    x = torch.randn(64, 64)
    out = torch.full((128, 64), float("nan"))
    compiled = stored_twice.compile(x, out, R=64, C=64, target="sm_90a")
    ptx = compiled.ptx
    first, last = ptx.index("wait_group.read"), ptx.rindex("wait_group.read")
    assert "bar.sync" in ptx[first:ptx.index("st.shared", first)]
    assert "bar.sync" not in ptx[last:]
    assert ptx.count("bar.sync") == 3  # the two fences' meetings, and the one before the second store
    dev = ptx_sim.Device()
    dev.lands = lands
    dev.run(compiled, (1,), x, out)
    assert torch.equal(dev.fetch(out), torch.cat([x, x * 2.0]))


@pytest.mark.parametrize("lands", LANDS)
@pytest.mark.parametrize("swizzle", [None, 32, 64, 128])
def test_boxes_load_and_store_through_every_swizzle_at_a_ragged_edge(swizzle, lands):
    """Rows of 200 in boxes of 64 (the last box three quarters past the end: zero-filled in, dropped out), at
    column 8 of a wider tensor: what the PTX reads from the swizzled tile is the box, and what it stores lands
    at the box's place and nowhere else."""
    cols = (swizzle or 64) // 2
    x = torch.randn(200, cols + 16).to(BF16)
    out = torch.full((256, cols), float("nan")).to(BF16)
    back = torch.full_like(x, float("nan"))
    compiled = box_round_trip.compile(x, out, back, R=64, C=cols, SW=swizzle, target="sm_90a")
    assert [d["swizzle"] for d in compiled.meta["tma"]] == [swizzle or 0] * 2
    dev = ptx_sim.Device()
    dev.lands = lands
    dev.run(compiled, (4,), x, out, back)
    box = x[:, 8:8 + cols]
    assert torch.equal(dev.fetch(out)[:200], box + 1.0)
    assert torch.equal(dev.fetch(out)[200:], torch.ones(56, cols).to(BF16))  # zero-filled past the end, + 1
    want = torch.full_like(x, float("nan"))
    want[:, 8:8 + cols] = box * 2.0
    assert torch.allclose(dev.fetch(back), want, rtol=0, atol=0, equal_nan=True)


def test_tensor_maps_refuse_what_the_driver_refuses():
    with pytest.raises(ptx_sim.SimError, match="16-byte aligned"):
        TensorMap(8, (4, 40), (80, 2), (4, 40), 2, 0)
    with pytest.raises(ptx_sim.SimError, match="128B swizzle"):
        TensorMap(0, (4, 128), (256, 2), (4, 128), 2, 128)  # 256 bytes a box row: wider than the swizzle


@mgjit.kernel
def box_from_column(x, out, col):
    """A (64, 64) box of x from column col on, through SMEM (128B swizzle) into out."""
    s = mgjit.smem((64, 64), x.dtype, swizzle=128)
    bar = mgjit.barrier(1)
    mgjit.copy_async(x, (0, col), s, barrier=bar[0])
    bar[0].wait()
    out[mgjit.ds(0, 64), mgjit.ds(0, 64)] = s[...]


@mgjit.kernel
def box_from_column_3(x, out):
    s = mgjit.smem((64, 64), x.dtype, swizzle=128)
    bar = mgjit.barrier(1)
    mgjit.copy_async(x, (0, 3), s, barrier=bar[0])
    bar[0].wait()
    out[mgjit.ds(0, 64), mgjit.ds(0, 64)] = s[...]


@pytest.mark.parametrize("col", [8, 3, 133])
def test_a_box_starts_on_16_bytes_of_its_rows(col):
    """A TMA load's box starting 3 or 133 bf16 elements into the rows of a tensor whose strides TMA accepts
    (an H200 faulted on both: illegal instruction) is refused by the simulator and by the interpreter, which names
    the copy, and at compile time where the start is a constant; 8 elements in (16 bytes) both copy."""
    x = torch.randn(64, 256, dtype=BF16)
    out = torch.full((64, 64), float("nan"), dtype=BF16)
    compiled = box_from_column.compile(x, out, col, target="sm_90a")
    dev = ptx_sim.Device(4 << 20)
    if col * 2 % 16:
        with pytest.raises(ptx_sim.SimError, match="not a multiple of 16"):
            dev.run(compiled, (1,), x, out, col)
        with pytest.raises(mgjit.InterpretError, match="illegal instruction") as e:
            box_from_column.interpret[(1,)](x, out, col)
        assert e.value.check == mgjit.Check.TMA_START and "copy_async" in str(e.value)
        with pytest.raises(mgjit.CompileError, match="element 3 of x's innermost dimension") as e:
            box_from_column_3.compile(x, out, target="sm_90a")
        assert "copy_async(x, (0, 3)" in e.value.loc.text, e.value.loc
        return
    dev.run(compiled, (1,), x, out, col)
    assert torch.equal(dev.fetch(out), x[:, col:col + 64])
    box_from_column.interpret[(1,)](x, out, col)
    assert torch.equal(out, x[:, col:col + 64])


def row_case(name: str, x: torch.Tensor, config: mgjit.Config, in_place: bool = False):
    """(kernel, its arguments with outputs poisoned, constexprs, the outputs, torch's values of them, tolerance) of a
    row example's piped mapping over x (`in_place`: written into x itself, for the kernels with a row output)."""
    n, dtype = x.shape[1], x.dtype
    w, b = torch.randn(n).to(dtype), torch.randn(n).to(dtype)
    out = x if in_place else torch.full_like(x, float("nan"))
    xd = x.double()
    if name == "softmax":
        return sm.softmax_kernel, (x, out, *piped_views((x, out))[1]), {}, [out], [torch.softmax(xd, 1)], 2e-2
    if name == "rmsnorm":
        return (rms.rmsnorm_kernel, (x, w, out, *piped_views((x, out), (w,))[1]), {"eps": 1e-6}, [out],
                [torch.nn.functional.rms_norm(xd, (n,), w.double(), 1e-6)], 2e-2)
    if name == "layernorm":
        return (ln.layernorm_rows, (x, w, b, out, *piped_views((x, out), (w, b))[1]), {"eps": 1e-5}, [out],
                [torch.nn.functional.layer_norm(xd, (n,), w.double(), b.double(), 1e-5)], 2e-2)
    target = torch.randint(0, n, (x.shape[0],)).where(torch.rand(x.shape[0]) < 0.5, x.float().argmax(1))
    target[::4] = -100
    loss, lse = torch.full((x.shape[0],), float("nan")), torch.full((x.shape[0],), float("nan"))
    args = (x, target, loss, lse, -100, *piped_views((x,))[1], *ce.scratch(x, (config,)))
    return (ce.cross_entropy_rows, args, {}, [loss, lse],
            [torch.nn.functional.cross_entropy(xd, target, reduction="none"), torch.logsumexp(xd, 1)], 1e-5)


def agree(ptx: torch.Tensor, interpreted: torch.Tensor) -> bool:
    """The PTX's values are the interpreter's, up to the last bits of float32 sums taken in another order: float32
    outputs within 1e-5 of the largest; a few 16-bit outputs rounded to a neighbour where those bits lie at a tie
    (or, near 0, where the output cancelled)."""
    if ptx.dtype == torch.float32:  # layernorm of rows far from 0: its mean's last bits, relative to the std
        return torch.allclose(ptx, interpreted, rtol=1e-5, atol=1e-5 * interpreted.abs().nan_to_num().max().item(),
                              equal_nan=True)
    p, i = ptx.double(), interpreted.double()
    off = ~torch.isclose(p, i, rtol=0, atol=0, equal_nan=True)
    near = (p - i).abs() <= torch.maximum(p.abs(), i.abs()) * torch.finfo(ptx.dtype).eps + 1e-5
    return bool((near | ~off).all()) and off.sum().item() <= 0.02 * off.numel()


def candidates(name: str, n: int, itemsize: int = 2) -> tuple[mgjit.Config, ...]:
    """Every mapping a row example's wrapper may tune over for rows of n elements of `itemsize` bytes (weights of
    the same)."""
    return {"softmax": lambda: sm.mapping(n, None, itemsize),
            "rmsnorm": lambda: rms.rmsnorm_mapping(n, None, itemsize, (itemsize,)),
            "layernorm": lambda: ln.layernorm_mapping(n, None, itemsize, (itemsize, itemsize)),
            "cross_entropy": lambda: ce.mapping(n, itemsize)}[name]()


def piped_configs(name: str, n: int, itemsize: int = 2) -> list[mgjit.Config]:
    """The piped mappings among `candidates`."""
    return [c for c in candidates(name, n, itemsize) if c.kwargs["PIPE"]]


def piped_programs(config: mgjit.Config) -> int:
    """The programs (clusters) `simulate_rows` runs a piped mapping on: the fewest it takes (STASH, where it
    stashes weights), else 2."""
    return config.kwargs.get("STASH") or 2


def ring_rows(config: mgjit.Config) -> int:
    """Rows enough for each program of `simulate_rows`' grid to take as many as its ring has slots and one more
    (a slot refilled)."""
    return piped_programs(config) * (config.kwargs["STAGES"] + 1)


def simulate_rows(name: str, x: torch.Tensor, config: mgjit.Config, lands: str) -> list[torch.Tensor]:
    """The row example's outputs over x from the PTX of `config` on the simulator (a piped mapping on a grid of the
    fewest programs or clusters it takes, each looping over rows past its ring of slots), checked against torch;
    then the same launch interpreted, which must agree. The simulator launches the grid in an order drawn from the
    rows' count (a GPU promises none): cross-entropy's pieces of a row are then merged by either program."""
    kernel, args, constexprs, outputs, refs, tol = row_case(name, x, config)
    k = config.kwargs
    if k["PIPE"]:
        grid = (piped_programs(config) * k["CTAS"],)
        assert x.shape[0] * (k.get("SEGS") or 1) > ring_rows(config)
    else:
        grid = _rows.grid(x.shape[0], config)
    compiled = kernel.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a")
    dev = ptx_sim.Device(64 << 20)
    dev.lands, dev.order = lands, x.shape[0]
    dev.run(compiled, grid, *args, cluster=k["CTAS"])
    got = [dev.fetch(o).clone() for o in outputs]
    if k.get("SEGS", 0) > 1:  # cross-entropy's segments: the row that merges sets its count back to 0
        assert not dev.fetch(args[-1]).any()
    for o in outputs:
        o.fill_(float("nan"))
    os.environ["MGJIT_INTERPRET"] = "1"
    try:
        for g, ref in zip(got, refs):
            assert not g.isnan().any() or ref.isnan().any(), "some of the poisoned output was never written"
            assert torch.allclose(g.double(), ref, rtol=tol, atol=tol, equal_nan=True), (name, config)
        kernel[grid](*args, **constexprs, **config.launch_kwargs())
    finally:
        del os.environ["MGJIT_INTERPRET"]
    for g, interpreted in zip(got, outputs):
        assert agree(g, interpreted), (name, config)
    return got


# Rows of 8193 (each starting elsewhere in 16 bytes: envelopes, the weights' windows over a stash of 8 programs),
# 8192 (every row on 16 bytes), 20001 over clusters of 2 to 4 CTAs, 50257 in segments (33 and 50 lines).
PIPED = [("softmax", 8193, 0), ("rmsnorm", 8193, 0), ("layernorm", 8193, 1), ("cross_entropy", 8193, 0),
         ("rmsnorm", 8192, 0), ("softmax", 20001, -1), ("layernorm", 20001, -1), ("rmsnorm", 20001, 0),
         ("cross_entropy", 50257, 0), ("cross_entropy", 50257, -1)]


@pytest.mark.parametrize("lands", LANDS)
@pytest.mark.parametrize("name,n,index", PIPED, ids=[f"{k}-{n}-{i}" for k, n, i in PIPED])
def test_piped_rows_from_their_ptx(name, n, index, lands):
    config = piped_configs(name, n)[index]
    rows = ring_rows(config) + 3
    simulate_rows(name, (torch.randn(rows, n) * 3 + 1).to(BF16), config, lands)


def test_layernorm_piped_rows_of_every_mean_from_their_ptx():
    """Layernorm's piped rows fill the envelope's outside with a guess at the row's mean (examples/layernorm.py,
    layernorm_piped): 0 for a program's first row, else the row before's mean, and a row far from its guess is
    read again. Each of the 8 programs takes rows p, p + 8, ...: its first row near 0, its second and third near
    500 (read again, then shifted by the second's mean), its fourth near 0 again (read again), its fifth near 0;
    program 1's first row holds a NaN and program 2's second an infinity, which must reach no later row of theirs
    (the NaN mean carried as the next fill made every later row NaN: tried)."""
    config = piped_configs("layernorm", 8193)[1]
    assert piped_programs(config) == 8 and config.kwargs["CTAS"] == 1
    x = torch.randn(ring_rows(config) + 3, 8193) * 3 + 1
    x[8:24] += 500
    x[1, 7] = float("nan")
    x[10, 100] = float("inf")
    got = simulate_rows("layernorm", x.to(BF16), config, "late")[0]
    finite = torch.ones(x.shape[0], dtype=torch.bool)
    finite[[1, 10]] = False
    assert got[finite].isfinite().all() and got[~finite].isnan().all()


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
def test_lone_programs_over_16_ctas_from_their_ptx(name):
    """The shape the norms' long float32 rows take (examples/_rows_piped.py, `cluster_splits`: rows of 150000 over
    16 CTAs of 37 lines): one program an SM of four slots, each CTA's segment in several register arrays (here 15
    lines, 8 + 4 + 2 + 1) with its weights stashed, the last segment shorter (11 lines), every slot reused."""
    config = piped.piped(60001, 4, 1, 4, 16, lines=15)
    assert config.kwargs["PL"] == (8, 4, 2, 1) and config.kwargs["LAST"] == 11
    simulate_rows(name, torch.randn(ring_rows(config) + 3, 60001) * 3 + 1, config, "late")


# bf16 rows that had no piped mapping: 16 CTAs of 47 lines at two programs an SM (WIDER_CLUSTER_SHAPES), weights
# stashed over a grid of a multiple of 2 clusters; 8 CTAs of 80 lines at one program an SM (LONE_CLUSTER_SHAPES).
LONG = [("rmsnorm", 190324, 16, (32, 16), 3, 2), ("layernorm", 152120, 8, (64, 16), 3, 1)]


@pytest.mark.parametrize("name,n,ctas,lines,stages,per_sm", LONG, ids=[f"{k}-{n}" for k, n, *_ in LONG])
def test_long_rows_piped_from_their_ptx(name, n, ctas, lines, stages, per_sm):
    config = next(c for c in piped_configs(name, n) if (c.kwargs["CTAS"], c.kwargs["PL"], c.kwargs["STAGES"],
                                                          c.kwargs["PIPE"]) == (ctas, lines, stages, per_sm))
    simulate_rows(name, (torch.randn(ring_rows(config) + 1, n) * 3 + 1).to(BF16), config, "early")


@pytest.mark.parametrize("lands", LANDS)
@pytest.mark.parametrize("name,n,index", [("layernorm", 8193, 1), ("softmax", 20001, -1)])
def test_piped_rows_in_place_from_their_ptx(name, n, index, lands):
    """out=x, as a tuned shape launches its piped mapping in place (examples/_rows_launch.py, tuned_launch): each row's
    envelope reads its neighbours' columns (dropped) while other programs, or the CTAs of other clusters, write
    theirs; every row comes out as torch computes it from the input."""
    config = piped_configs(name, n)[index]
    x = (torch.randn(ring_rows(config) + 3, n) * 3 + 1).to(BF16)
    kernel, args, constexprs, _, refs, tol = row_case(name, x, config, in_place=True)
    compiled = kernel.compile(*args, **constexprs, **config.launch_kwargs(), target="sm_90a")
    dev = ptx_sim.Device(64 << 20)
    dev.lands = lands
    dev.run(compiled, (piped_programs(config) * config.kwargs["CTAS"],), *args, cluster=config.kwargs["CTAS"])
    assert torch.allclose(dev.fetch(x).double(), refs[0], rtol=tol, atol=tol), (name, config)


@pytest.mark.parametrize("lands", LANDS)
@pytest.mark.parametrize("name,n,index", [("softmax", 20001, -1), ("cross_entropy", 50257, 0),
                                          ("cross_entropy", 50257, -1)])
def test_piped_rows_masked_with_stretches_of_minus_inf(name, n, index, lands):
    """Logits masked with -inf over long stretches: segments and CTAs of a cluster that hold -inf alone add
    nothing (they took exp(-inf + inf) = NaN before)."""
    config = piped_configs(name, n)[index]
    rows = ring_rows(config) + 3
    x = torch.randn(rows, n) * 3
    x[0::3, :n * 3 // 4] = -float("inf")
    x[1::3, n // 4:] = -float("inf")
    x[2::3, n // 10:n - n // 20] = -float("inf")
    simulate_rows(name, x.to(BF16), config, lands)


def test_held_rows_found_by_the_random_sweep():
    """Cases a random sweep of every mapping on the simulator found: three warpgroups summing across through a
    12-byte buffer, the last in shared memory, which LLVM reads as 16 bytes (the allocation is now whole 16-byte
    chunks; past its end the simulator faults), and layernorm of float32 rows far from 0."""
    config = [c for c in rms.rmsnorm_mapping(22733, None, 4, (4,))
              if c.kwargs["WGS"] == 3 and c.kwargs["PERSIST"] == 1 and c.kwargs["PARTS"] == (8192,)][0]
    simulate_rows("rmsnorm", torch.randn(3, 22733) * 3, config, "late")
    config = [c for c in ln.layernorm_mapping(2399, None, 4, (4, 4))
              if c.kwargs["ROWS"] == 2 and c.kwargs["PERSIST"] == 4 and not c.kwargs["OCC"]][0]
    simulate_rows("layernorm", torch.randn(4, 2399) * 10 - 50, config, "late")


def test_the_rows_sweep_runs_random_cases(capsys):
    """tools/rows_sweep.py: random kernels, lengths, mappings and landings on the simulator (a few, seeded)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import rows_sweep
    assert rows_sweep.main(["--seed", "3", "--count", "4"]) == 0
    assert capsys.readouterr().out.count(" ok\n") == 4
