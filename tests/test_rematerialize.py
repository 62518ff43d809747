"""Lowering again when ptxas spills: SMEM addresses computed where they are used (Context.rematerialize), so
that LLVM cannot hoist them out of a loop to stay live beside the accumulators; wgmma descriptors are formed
inside the wgmma's asm in every lowering (the operand's base plus the step's offset), so a kernel whose
hoisted descriptors once spilled compiles clean at once. On the GPU: such kernels compute what torch does."""
import re

import pytest

import mgjit
import mgjit.lower

torch = pytest.importorskip("torch")


@mgjit.kernel
def resident_products(a, b, out, n, N: mgjit.constexpr, K: mgjit.constexpr):
    """out = n * a @ b.T, accumulated n times in a runtime loop over SMEM tiles that never change: the
    descriptors of every k-step are loop-invariant, beside two (64, N) fp32 accumulators."""
    a_s = mgjit.smem((2, 64, K), a.dtype, swizzle=128)
    b_s = mgjit.smem((N, K), b.dtype, swizzle=128)
    bar = mgjit.barrier(1, arrivals=3)
    mgjit.copy_async(a, (0, 0), a_s[0], barrier=bar[0])
    mgjit.copy_async(a, (64, 0), a_s[1], barrier=bar[0])
    mgjit.copy_async(b, (0, 0), b_s, barrier=bar[0])
    bar[0].wait()
    acc0 = mgjit.zeros((64, N), mgjit.float32)
    acc1 = mgjit.zeros((64, N), mgjit.float32)
    for _ in range(n):
        acc0 = mgjit.wgmma(acc0, a_s[0], b_s.T)
        acc1 = mgjit.wgmma(acc1, a_s[1], b_s.T)
        mgjit.wgmma_wait(0)
    out[mgjit.ds(0, 64), mgjit.ds(0, N)] = acc0
    out[mgjit.ds(64, 64), mgjit.ds(0, N)] = acc1


N, K = 224, 256  # 2 * 112 accumulator registers and 48 hoisted descriptors are more than 255
FORMED_IN_ASM = re.compile(r"add\.s64 d[ab], ")  # a descriptor formed inside a wgmma's asm


def compile_products(**kw):
    a, b = torch.empty(128, K, dtype=torch.bfloat16), torch.empty(N, K, dtype=torch.bfloat16)
    return resident_products.compile(a, b, torch.empty(128, N), 3, N=N, K=K, target="sm_90a", **kw)


def lowering(monkeypatch, tmp_path, rematerialize: bool) -> None:
    """Every lowering of this test in one mode: in a cache of its own (the key does not name the mode), with
    the kernels' memos of earlier compiles set aside."""
    lower = mgjit.lower.lower
    monkeypatch.setattr(mgjit.lower, "lower", lambda *args, **kw: lower(*args[:4], rematerialize=rematerialize))
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path))
    for kernel in (resident_products, staged_round_trips):
        monkeypatch.setattr(kernel, "_compiled", {})


def test_loop_invariant_descriptors_are_formed_in_the_asm_and_do_not_spill():
    c = compile_products()
    assert c.spills == 0, c.ptxas_report
    assert FORMED_IN_ASM.search(c.ptx)


def test_without_the_second_lowering_too(monkeypatch, tmp_path):
    """The first lowering forms them in the asm as well: nothing for LLVM to hoist (formed from addresses
    outside it, 48 descriptors stayed live beside the accumulators and ptxas spilled)."""
    lowering(monkeypatch, tmp_path, False)
    c = compile_products()
    assert c.spills == 0 and FORMED_IN_ASM.search(c.ptx)


def test_each_k_step_adds_its_offset_to_the_operands_base_descriptor():
    """A: (64, 256) bf16, K-major, 128B swizzle: a 16-column step is 32 bytes (2 in the descriptor's 16-byte
    units), a 64-column block 64 * 128 bytes (512). B: b_s (224, 256) read transposed, so K-major too, its
    column blocks 224 * 128 bytes (1792). The first step uses the base itself."""
    ptx = compile_products().ptx
    steps = re.findall(r"\{ \.reg \.pred p; (.*?)setp\.ne", ptx)
    assert len(steps) == 2 * K // 16
    offsets = [dict(re.findall(r"add\.s64 (d[ab]), %rd\d+, (\d+);", s)) for s in steps[:K // 16]]
    assert offsets[0] == {}
    assert [int(o["da"]) for o in offsets[1:]] == [512 * (k // 4) + 2 * (k % 4) for k in range(1, 16)]
    assert [int(o["db"]) for o in offsets[1:]] == [1792 * (k // 4) + 2 * (k % 4) for k in range(1, 16)]


def test_a_clean_kernel_is_lowered_once(monkeypatch):
    calls = []
    lower = mgjit.lower.lower
    monkeypatch.setattr(mgjit.lower, "lower", lambda *args, **kw: calls.append(kw) or lower(*args, **kw))
    x = torch.empty(128, 64, dtype=torch.bfloat16)
    c = resident_products.compile(x, x, torch.empty(128, 64), 3, N=64, K=64, target="sm_90a")
    assert c.spills == 0 and [kw.get("rematerialize", False) for kw in calls] == [False]


@mgjit.kernel
def staged_round_trips(x, out, out_t, n, R: mgjit.constexpr, C: mgjit.constexpr, SW: mgjit.constexpr):
    """out = x * 2**n: n times through a swizzled SMEM tile, stored from registers and read back in a runtime
    loop; out_t = the tile read transposed after it (x.T * 2**(n - 1))."""
    s = mgjit.smem((R, C), x.dtype, swizzle=SW)
    y = x[mgjit.ds(0, R), mgjit.ds(0, C)]
    for _ in range(n):
        s[...] = y
        y = s[...] * 2
    out[mgjit.ds(0, R), mgjit.ds(0, C)] = y
    out_t[mgjit.ds(0, C), mgjit.ds(0, R)] = s.T[...]


@pytest.mark.filterwarnings("ignore::mgjit.BankConflictWarning")  # of the transposed read
def test_smem_accesses_read_the_thread_index_where_they_are_used(monkeypatch, tmp_path):
    x = torch.empty(64, 64, dtype=torch.bfloat16)
    plain = staged_round_trips.compile(x, x, x, 3, R=64, C=64, SW=128, target="sm_90a").ptx
    lowering(monkeypatch, tmp_path, True)
    again = staged_round_trips.compile(x, x, x, 3, R=64, C=64, SW=128, target="sm_90a").ptx
    moves = r"^\s*mov\.b32 %r\d+, %r\d+;"
    assert not re.search(moves, plain, re.M) and re.search(moves, again, re.M)


@pytest.mark.gpu
def test_rematerialized_wgmmas_compute_the_product(monkeypatch, tmp_path):
    lowering(monkeypatch, tmp_path, True)
    a = torch.randn(128, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    out = torch.full((128, N), float("nan"), device="cuda")
    resident_products[(1,)](a, b, out, 3, N=N, K=K)
    torch.testing.assert_close(out, 3 * (a.float() @ b.float().T), rtol=1e-3, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore::mgjit.BankConflictWarning")
@pytest.mark.parametrize("swizzle", [None, 32, 64, 128])
def test_rematerialized_smem_accesses_move_the_right_elements(monkeypatch, tmp_path, swizzle):
    lowering(monkeypatch, tmp_path, True)
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    out, out_t = (torch.full((64, 64), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(2))
    staged_round_trips[(1,)](x, out, out_t, 3, R=64, C=64, SW=swizzle)
    assert torch.equal(out, x * 8) and torch.equal(out_t, x.t() * 4)
