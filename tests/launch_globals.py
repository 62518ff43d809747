"""A kernel that reads a global and a helper, for tests that redefine them (loaded fresh by each test)."""
import mgjit

OFFSET = 1


@mgjit.device
def bump(v, scale=1.0):
    return v * scale + OFFSET


@mgjit.kernel
def shifted(x, out, BLOCK: mgjit.constexpr):
    out[mgjit.ds(0, BLOCK)] = bump(x[mgjit.ds(0, BLOCK)])
