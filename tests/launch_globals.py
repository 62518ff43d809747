"""A kernel that reads a global and a helper, for tests that redefine them (loaded fresh by each test)."""
import mgjit

OFFSET = 1


@mgjit.device
def bump(v):
    return v + OFFSET


@mgjit.kernel
def shifted(x, out, BLOCK: mgjit.constexpr):
    out[mgjit.ds(0, BLOCK)] = bump(x[mgjit.ds(0, BLOCK)])
