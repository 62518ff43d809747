"""Any op at any depth of runtime loops and ifs: GMEM windows, masks built from arange, tensor sizes,
reductions and stores, placed in sibling and nested regions, compile to PTX for sm_90a (a value computed in one
region and reused in another, such as a cached thread index or tensor size, used to fail MLIR's dominance
check with an internal error naming only the kernel's def line)."""
import importlib.util
import itertools
import textwrap

import pytest

import mgjit

torch = pytest.importorskip("torch")

# A statement that uses everything that could be cached: a window load at a runtime start, an arange mask
# against a runtime size, a reduction, and a store.
USE = ("v = mgjit.where(mgjit.arange(B) < x.shape[0] - {i}, x[mgjit.ds({i}, B)], 0.0)\n"
       "acc = acc + v\n"
       "out[mgjit.ds({i}, B)] = v + v.max()\n")

REGIONS = {
    "top": ("", []),
    "loop": ("for i1 in range(n):", ["i1"]),
    "if": ("if n > 3:", []),
    "else": ("if n > 3:\n    acc = acc * 2.0\nelse:", []),
    "loop_in_if": ("if n > 1:\n    for i2 in range(n):", ["i2"]),
    "if_in_loop": ("for i3 in range(n):\n    if i3 % 2 == 0:", ["i3"]),
    "loop_in_loop": ("for i4 in range(n):\n    for i5 in range(i4):", ["i4", "i5"]),
}


def region(kind: str, body: str) -> str:
    header, indices = REGIONS[kind]
    index = indices[-1] if indices else "0"
    text = body.format(i=index)
    if not header:
        return text
    depth = header.count("\n") + 1
    return header + "\n" + textwrap.indent(text, "    " * depth)


def kernel_source(first: str, second: str) -> str:
    return ("import mgjit\n\n\n@mgjit.kernel\ndef k(x, out, n, B: mgjit.constexpr):\n"
            "    acc = mgjit.zeros((B,), mgjit.float32)\n"
            + textwrap.indent(region(first, USE) + "\n" + region(second, USE), "    ")
            + "\n    out[mgjit.ds(0, B)] = acc\n")


PAIRS = [p for p in itertools.product(REGIONS, repeat=2) if p != ("top", "top")]


@pytest.mark.parametrize("first,second", PAIRS, ids=lambda p: p if isinstance(p, str) else None)
def test_ops_in_any_pair_of_regions_compile(tmp_path, first, second):
    path = tmp_path / f"nest_{first}_{second}.py"
    path.write_text(kernel_source(first, second))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = torch.zeros(4096)
    c = module.k.compile(x, x, 5, B=256, target="sm_90a")
    assert ".entry k(" in c.ptx and c.spills == 0


@mgjit.kernel
def tuple_through_if(x, out, flag):
    v = x[mgjit.ds(0, 128)]
    pair = (v, v.sum(), 2.0)
    if flag > 0:
        w = x[mgjit.ds(128, 128)]
        pair = (w * 3.0, w.max(), 2.0)
    out[mgjit.ds(0, 128)] = pair[0] + pair[1] * pair[2]


@mgjit.kernel
def tuple_shrinks_in_if(x, out, flag):
    pair = (x[mgjit.ds(0, 128)], 1.0)
    if flag > 0:
        pair = (x[mgjit.ds(0, 128)],)
    out[mgjit.ds(0, 128)] = pair[0]


@pytest.mark.parametrize("flag", [0, 1])
def test_a_tuple_reassigned_in_a_runtime_if(flag):
    """A tuple of arrays and scalars leaves a runtime `if` leaf by leaf (the leaves both branches share stay
    constants), and compiles for sm_90a."""
    x = torch.randn(256)
    out = torch.full((128,), float("nan"))
    tuple_through_if.interpret[(1,)](x, out, flag)
    v, w = x[:128], x[128:]
    want = w * 3 + w.max() * 2 if flag else v + v.sum() * 2
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert "scf.if" in tuple_through_if.compile(x, out, flag, target="sm_90a").mlir


def test_a_tuple_that_changes_length_in_a_runtime_if_is_refused():
    x = torch.randn(128)
    with pytest.raises(mgjit.CompileError, match=r"`pair` is a tuple of 1 after one branch of a runtime `if` and "
                                                 r"a tuple of 2 after the other"):
        tuple_shrinks_in_if.compile(x, x, 1, target="sm_90a")
