"""The kernel-parameter ABI has one home (mgjit/abi.py): the lowering's kernel signature, the Python
launcher's buffer and the C launcher's field codes all follow it."""
import re
import shutil
import struct
import subprocess
import sysconfig
from pathlib import Path

import pytest

import mgjit
from mgjit import abi, dtypes

torch = pytest.importorskip("torch")


@mgjit.kernel
def axpy(x, y, out, alpha, n, flag, BLOCK: mgjit.constexpr):
    i = mgjit.program_id(0) * BLOCK
    v = x[mgjit.ds(i, BLOCK)] * alpha + y[mgjit.ds(i, BLOCK)]
    out[mgjit.ds(i, BLOCK)] = mgjit.where(flag, v, v + n)


def test_buffer_layout_pads_each_field_to_its_alignment():
    fields = abi.kernel_fields([("tensor", dtypes.float32, 2), ("scalar", dtypes.bool_, 0),
                                ("scalar", dtypes.int64, 0)], tensormaps=1)
    assert [f.name for f in fields] == ["ptr", "i32", "i32", "i64", "i64", "i1", "i64", "tensormap"]
    layout = abi.buffer_layout(fields)
    assert layout.offsets == (0, 8, 12, 16, 24, 32, 40, 64)  # the bool pads to 40; the descriptor to 64
    assert struct.calcsize(layout.struct_format) == layout.size == 192
    codes = [struct.unpack_from("<BI", layout.c_layout, 5 * i) for i in range(len(fields))]
    assert codes == [(f.c_code, off) for f, off in zip(fields, layout.offsets)]


def test_the_kernel_signature_follows_the_table():
    x = torch.zeros(4096)
    c = axpy.compile(x, x, x, 2.0, 3, True, BLOCK=512)
    sig = re.search(r"llvm\.func @axpy\((.*?)\) attributes", c.mlir).group(1)
    types = [t.split(": ", 1)[1] for t in re.split(r", (?=%arg\d+:)", sig)]
    expected = abi.kernel_fields([(p["kind"], dtypes.BY_NAME[p["dtype"]], p["rank"]) for p in c.params], 0)
    assert types == [f.mlir for f in expected]
    assert [p["name"] for p in c.params] == ["x", "y", "out", "alpha", "n", "flag"]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler")
def test_the_c_launcher_takes_its_codes_from_the_table(tmp_path):
    include = f"-I{sysconfig.get_paths()['include']}"
    source = str(Path(mgjit.__file__).with_name("_launch.c"))
    built = subprocess.run(["gcc", "-shared", "-fPIC", include, *abi.c_defines(), source, "-o",
                            str(tmp_path / "a.so")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    bare = subprocess.run(["gcc", "-shared", "-fPIC", include, source, "-o", str(tmp_path / "b.so")],
                          capture_output=True, text=True)
    assert bare.returncode != 0 and "mgjit.abi.c_defines" in bare.stderr


def test_the_c_launchers_build_tag_covers_every_file_it_includes():
    """fastlaunch tags the built launcher with a hash of its source: a part it #includes but does not hash would
    keep an old build after an edit."""
    from mgjit import fastlaunch
    text = Path(mgjit.__file__).with_name("_launch.c").read_text()
    included = {Path(mgjit.__file__).with_name(name) for name in re.findall(r'^#include "([^"]+)"', text, re.M)}
    assert included == set(fastlaunch._PARTS) and all(p.exists() for p in included)
