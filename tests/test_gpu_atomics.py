"""GPU tests of atomics and semaphores on GMEM (ops/atomics.py): a cross-CTA counter whose tickets must be a
permutation, every atomic kind against torch, and a stream-K reduction whose split rows are fixed up in order
behind semaphores. The kernels are also interpreted on the CPU (tests/test_atomics.py)."""
import pytest

import mgjit

torch = pytest.importorskip("torch")
gpu = pytest.mark.gpu


@mgjit.kernel
def cross_cta_counter(count, tickets):
    """Each CTA draws a ticket: the old value of one shared counter."""
    tickets[mgjit.program_id(0)] = mgjit.atomic_add(count, 0, 1, sem="acq_rel")


@mgjit.kernel
def atomic_kinds(x, values, old, KIND: mgjit.constexpr, BLOCK: mgjit.constexpr):
    """Every CTA applies its row of `values` to all of x with one atomic kind; old gets what it replaced."""
    pid = mgjit.program_id(0)
    v = values[pid, mgjit.ds(0, BLOCK)]
    if KIND == "add":
        o = mgjit.atomic_add(x, mgjit.ds(0, BLOCK), v)
    elif KIND == "min":
        o = mgjit.atomic_min(x, mgjit.ds(0, BLOCK), v)
    elif KIND == "max":
        o = mgjit.atomic_max(x, mgjit.ds(0, BLOCK), v)
    elif KIND == "xchg":
        o = mgjit.atomic_xchg(x, mgjit.ds(0, BLOCK), v)
    else:  # cas: swap in the value where the cell still holds its initial value
        o = mgjit.atomic_cas(x, mgjit.ds(0, BLOCK), mgjit.zeros((BLOCK,), x.dtype), v)
    old[pid, mgjit.ds(0, BLOCK)] = o


@mgjit.device
def row_segment(row, begin, end, CHUNKS):
    """The chunks [first, last) of `row` that the iteration range [begin, end) covers."""
    first = mgjit.maximum(begin - row * CHUNKS, 0)
    last = mgjit.minimum(end - row * CHUNKS, CHUNKS)
    return first, last


@mgjit.kernel
def stream_k_row_sums(x, out, partials, flags, CHUNK: mgjit.constexpr):
    """out[r] = x[r].sum(), the R x CHUNKS chunks of work split evenly over the grid (stream-K): a CTA's range
    cuts rows, and a cut row's sum is fixed up by the CTA that holds its first chunk. The others store their
    partial sums (slot row + cta: the contributors of consecutive rows never collide) and signal the row's
    semaphore; the first waits for them and adds the partials in CTA order, so the sum is deterministic, then
    resets the semaphore for the next launch."""
    pid, ctas = mgjit.program_id(0), mgjit.num_programs(0)
    chunks = x.shape[1] // CHUNK
    iters = x.shape[0] * chunks
    begin, end = pid * iters // ctas, (pid + 1) * iters // ctas
    for row in range(begin // chunks, (end + chunks - 1) // chunks):
        first, last = row_segment(row, begin, end, chunks)
        acc = mgjit.zeros((CHUNK,), mgjit.float32)
        for c in range(first, last):
            acc = acc + x[row, mgjit.ds(c * CHUNK, CHUNK)]
        part = acc.sum()
        if (first == 0) & (last == chunks):
            out[row] = part
        elif first == 0:  # the row's first chunk: wait for the CTAs after this one, then add in order
            last_cta = ((row + 1) * chunks * ctas - 1) // iters  # the CTA of the row's last chunk
            mgjit.semaphore_wait(flags, row, last_cta - pid)
            for j in range(pid + 1, last_cta + 1):
                part = part + partials[row + j]
            out[row] = part
            mgjit.atomic_xchg(flags, row, 0)
        elif first < last:
            partials[row + pid] = part
            mgjit.semaphore_signal(flags, row)


def row_sums(x, ctas, chunk, launch=None):
    rows = x.shape[0]
    out = torch.full((rows,), float("nan"), device=x.device)
    partials = torch.full((rows + ctas,), float("nan"), device=x.device)
    flags = torch.zeros(rows, dtype=torch.int32, device=x.device)
    (launch or stream_k_row_sums)[(ctas,)](x, out, partials, flags, CHUNK=chunk)
    return out, flags


@gpu
def test_cross_cta_counter_hands_out_each_ticket_once():
    ctas = 5000
    count = torch.zeros(1, dtype=torch.int32, device="cuda")
    tickets = torch.full((ctas,), -1, dtype=torch.int32, device="cuda")
    cross_cta_counter[(ctas,)](count, tickets)
    assert count.item() == ctas
    assert torch.equal(tickets.sort().values.cpu(), torch.arange(ctas, dtype=torch.int32))


KINDS = [("add", torch.int32), ("add", torch.int64), ("add", torch.float32), ("add", torch.float64),
         ("add", torch.float16), ("add", torch.bfloat16), ("min", torch.int32), ("max", torch.int64),
         ("xchg", torch.float32), ("xchg", torch.int64), ("cas", torch.int32), ("cas", torch.float16)]


POISON = {"min": -12345, "max": 12345}  # an old value no CTA can have seen: unwritten olds fail the checks


def atomic_inputs(kind, dtype, ctas, block, device):
    if dtype.is_floating_point:
        values = torch.randn(ctas, block, device=device).to(dtype)
    else:
        values = torch.randint(-1000, 1000, (ctas, block), device=device, dtype=dtype)
    if kind == "cas":
        values = values.abs() + 1  # never the compare value, 0
    x = torch.zeros(block, device=device, dtype=dtype)
    old = torch.full((ctas, block), POISON.get(kind, 7777), device=device, dtype=dtype)
    return x, values, old


def check_kind(kind, x, values, old):
    """What any order of the CTAs' atomics must leave in x, and the old values they must have seen."""
    zero = torch.zeros_like(x)[None]
    if kind == "add" and x.dtype.is_floating_point:
        tol = {torch.float16: 2e-2, torch.bfloat16: 1e-1}.get(x.dtype, 1e-5)
        torch.testing.assert_close(x.double(), values.double().sum(0), rtol=tol, atol=tol * values.shape[0])
        assert (old.double().abs() <= values.double().abs().sum(0) * 1.01 + 1e-3).all()  # partial sums
    elif kind == "add":  # exact; the olds are the partial sums of some order: {old + v} + {0} = {old} + {final}
        assert torch.equal(x, values.sum(0).to(x.dtype))
        assert torch.equal(torch.cat([old + values, zero]).sort(0).values, torch.cat([old, x[None]]).sort(0).values)
    elif kind in ("min", "max"):
        fold = torch.minimum if kind == "min" else torch.maximum
        assert torch.equal(x, fold((values.min(0) if kind == "min" else values.max(0)).values, zero[0]))
        assert ((old >= x) if kind == "min" else (old <= x)).all()
    elif kind == "xchg":  # the olds and the final value are the values and the initial zero, in some order
        seen = torch.cat([old, x[None]]).double().sort(0).values
        assert torch.equal(seen, torch.cat([values, zero]).double().sort(0).values)
    else:  # cas: one CTA per element saw the 0 and swapped its value in; the others saw that value
        swapped = old == 0
        assert torch.equal(swapped.sum(0).cpu(), torch.ones(x.shape[0], dtype=torch.int64))
        assert torch.equal(x, values[swapped.int().argmax(0), torch.arange(x.shape[0], device=x.device)])
        assert torch.equal(old[~swapped].double(), x.expand_as(old)[~swapped].double())


@gpu
@pytest.mark.parametrize("kind,dtype", KINDS, ids=lambda v: str(v).removeprefix("torch."))
def test_atomic_kinds_against_torch(kind, dtype):
    x, values, old = atomic_inputs(kind, dtype, 64, 512, "cuda")
    atomic_kinds[(64,)](x, values, old, KIND=kind, BLOCK=512)
    check_kind(kind, x, values, old)


@gpu
@pytest.mark.parametrize("rows,chunks,ctas", [(7, 5, 13), (100, 8, 132), (3, 64, 100), (1000, 3, 77)])
def test_stream_k_reduction_behind_semaphores(rows, chunks, ctas):
    chunk = 256
    x = torch.randn(rows, chunks * chunk, device="cuda")
    first, flags = row_sums(x, ctas, chunk)
    torch.testing.assert_close(first, x.sum(1), rtol=1e-5, atol=1e-4)
    assert not flags.any(), "the fix-up must leave every semaphore at zero for the next launch"
    again, _ = row_sums(x, ctas, chunk)
    assert torch.equal(first, again), "the fix-up adds partials in a fixed order: results are bitwise repeatable"
