"""What the row examples (softmax, rmsnorm, layernorm, cross_entropy) share: how a row is split into register
arrays, and the device helpers that load, reduce and store a row held that way.

A register array's dimensions are powers of two, so a row of n columns rounded up to one array wastes up to
half the work (4097 columns would compute 8192). Instead a row is held as a few arrays whose widths are the
binary digits of n rounded up to a multiple of 128 (4097 → 4096 + 128, 5000 → 4096 + 1024): at most 127 wasted
columns. The widths are a constexpr tuple PARTS; a held row is a Python tuple of (ROWS, width) arrays.
"""
import mgjit

MAX_ROW = 8192  # the widest row kept whole in registers (64 f32 per thread of one warpgroup)


def parts(n: int) -> tuple[int, ...]:
    """The widths a row of n columns is held in: one power of two below 128 columns, else the binary digits of
    n rounded up to a multiple of 128, widest first."""
    if n <= 128:
        return (1 << max(n - 1, 0).bit_length(),)
    n = -(-n // 128) * 128
    return tuple(1 << b for b in range(n.bit_length() - 1, 6, -1) if n >> b & 1)


def mapping(n: int, rows_per_program: int | None = None) -> tuple[str, dict]:
    """Which kernel and constexprs serve rows of n columns: ("rows", ROWS and PARTS) when a row fits in registers
    (about 4096 elements per program, so short rows go many to a program), else ("long", BLOCK) to stream it."""
    if n > MAX_ROW:
        return "long", {"BLOCK": 4096}
    widths = parts(n)
    rows = rows_per_program or max(1, min(512, 4096 // sum(widths)))
    return "rows", {"ROWS": rows, "PARTS": widths}


@mgjit.device
def load_row(x, rows, PARTS, fill):
    """The rows `rows` (a mgjit.ds) of x as float32 arrays, one per width of PARTS; columns past the row's end
    hold `fill`."""
    n = x.shape[1]
    held = ()
    c0 = 0
    for p in mgjit.static_range(len(PARTS)):
        v = x[rows, mgjit.ds(c0, PARTS[p])].astype(mgjit.float32)
        held = held + (mgjit.where(c0 + mgjit.arange(PARTS[p]) < n, v, fill),)
        c0 += PARTS[p]
    return held


@mgjit.device
def load_vector(w, PARTS):
    """A 1D tensor (a weight) split like a row, as float32 arrays."""
    held = ()
    c0 = 0
    for p in mgjit.static_range(len(PARTS)):
        held = held + (w[mgjit.ds(c0, PARTS[p])].astype(mgjit.float32),)
        c0 += PARTS[p]
    return held


@mgjit.device
def row_max(held):
    m = held[0].max(axis=1)
    for p in mgjit.static_range(1, len(held)):
        m = mgjit.maximum(m, held[p].max(axis=1))
    return m


@mgjit.device
def row_sum(held):
    s = held[0].sum(axis=1)
    for p in mgjit.static_range(1, len(held)):
        s = s + held[p].sum(axis=1)
    return s


@mgjit.device
def store_row(out, rows, held, PARTS):
    c0 = 0
    for p in mgjit.static_range(len(PARTS)):
        out[rows, mgjit.ds(c0, PARTS[p])] = held[p].astype(out.dtype)
        c0 += PARTS[p]
