"""Layout pictures: the ownership tables behind them against layouts derived by hand from the PTX ISA, the
layouts a compiled kernel records, and the pictures themselves (PNG, notebook HTML)."""
import numpy as np
import pytest
import torch

import mgjit
from mgjit import draw, dtypes, layouts
from mgjit.tmem_layouts import TMEMLayout, TMEMLayoutKind


def test_wgmma_owners_are_the_ptx_accumulator_fragment():
    """PTX ISA, wgmma D fragment (m64nNk16, f32): thread 32w + l holds d[i] at row 16w + l // 4 + 8 ((i // 2) % 2),
    column 2 (l % 4) + (i % 2) + 8 (i // 4)."""
    owners = draw.register_owners(layouts.WGMMA, (64, 32))
    r, c = np.meshgrid(np.arange(64), np.arange(32), indexing="ij")
    assert (owners.thread == 32 * (r // 16) + 4 * (r % 8) + (c % 8) // 2).all()
    assert (owners.register == 4 * (c // 8) + 2 * ((r % 16) // 8) + c % 2).all()
    assert (owners.copies == 1).all()


def test_blocked_owners_with_replicated_warps():
    """256 float32: 16-byte vectors, 32 lanes along the array, warps 0/1 and 2/3 hold the same halves."""
    owners = draw.register_owners(layouts.blocked((256,), dtypes.float32), (256,))
    e = np.arange(256)
    assert (owners.thread[0] == 32 * (e // 128) + (e % 128) // 4).all()
    assert (owners.register[0] == e % 4).all() and (owners.copies == 2).all()


def test_smem_banks_of_a_128b_swizzled_bf16_tile():
    """Row r of a (64, 64) bf16 tile is one 128-byte line: 16-byte chunk c // 8 lands at chunk (c // 8) ^ (r % 8),
    so element (r, c) is in bank 4 ((c // 8) ^ (r % 8)) + (c % 8) // 2."""
    banks = draw.smem_banks((64, 64), dtypes.bfloat16, 128)
    r, c = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    assert (banks == 4 * ((c // 8) ^ (r % 8)) + (c % 8) // 2).all()
    # The 8 rows of one chunk column (what an 8x8 matrix load reads) hit 8 different 4-bank groups.
    assert len({tuple(banks[i, 0:8:2]) for i in range(8)}) == 8


def test_smem_banks_without_swizzle_conflict_down_a_column():
    banks = draw.smem_banks((32, 32), dtypes.float32, None)
    assert (banks == np.arange(32)[None, :]).all()  # every row starts at bank 0: a column is one bank


def test_tmem_cells_of_the_three_layouts():
    r, c = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    lanes, columns = draw.tmem_cells(TMEMLayout(TMEMLayoutKind.DEFAULT, 64))
    assert (lanes == np.arange(128)[:, None]).all() and (columns == np.arange(64)[None, :]).all()
    # half-lane (1-CTA M=64): rows 16q..16q+15 in lanes 32q.., the right half of the columns 16 lanes down.
    lanes, columns = draw.tmem_cells(TMEMLayout(TMEMLayoutKind.HALF_LANE, 64))
    assert (lanes == 32 * (r // 16) + r % 16 + 16 * (c >= 32)).all() and (columns == c % 32).all()
    # m64 collective (2-CTA M=128): rows 0-31 in quarter 0 (left half) or 2 (right half), rows 32-63 in 1 or 3.
    lanes, columns = draw.tmem_cells(TMEMLayout(TMEMLayoutKind.M64_COLLECTIVE, 64))
    assert (lanes == 32 * (r // 32 + 2 * (c >= 32)) + r % 32).all() and (columns == c % 32).all()


def test_layouts_round_trip_through_json():
    for layout in (layouts.WGMMA, layouts.TCGEN05, layouts.blocked((8,), dtypes.float32),
                   layouts.blocked((64, 128), dtypes.bfloat16).reduce([1], 2)):
        assert draw.layout_from_json(draw.layout_to_json(layout)) == layout


@mgjit.kernel
def softmax_rows(x, out, BLOCK: mgjit.constexpr):
    row = mgjit.program_id(0)
    v = x[row, mgjit.ds(0, BLOCK)].astype(mgjit.float32)
    e = mgjit.exp(v - v.max())
    stage = mgjit.smem((4, BLOCK // 4), mgjit.float32)
    out[row, mgjit.ds(0, BLOCK)] = (e / e.sum()).astype(out.dtype)


def test_a_compiled_kernel_records_the_layouts_inference_chose():
    x = torch.empty(4, 512, dtype=torch.bfloat16)
    c = softmax_rows.compile(x, x, BLOCK=512, target="sm_90a")
    data = c.layouts.data
    (entry,) = [e for e in data["registers"] if e["dtype"] == "float32"]
    assert draw.layout_from_json(entry["layout"]) == layouts.spread((512,), dtypes.bfloat16)
    assert {op for op, _ in entry["values"]} >= {"cast", "unary", "binary"}
    assert data["smem"] == [{"shape": [4, 128], "dtype": "float32", "swizzle": None, "line": entry["values"][0][1] + 2}]
    assert data["tmem"] == [] and len(c.layouts) == 3


def test_a_blackwell_kernel_records_its_tmem_layout():
    from test_frontend_registry import blackwell_units
    x = torch.empty(256, 256, dtype=torch.bfloat16)
    data = blackwell_units.compile(x, x, target="sm_100a").layouts.data
    assert [(t["kind"], t["cols"], t["packing"]) for t in data["tmem"]] == [("default", 128, 1)]


def test_pictures_are_pngs_and_show_in_a_notebook(tmp_path):
    pytest.importorskip("matplotlib")
    x = torch.empty(4, 512, dtype=torch.bfloat16)
    kernel_layouts = softmax_rows.compile(x, x, BLOCK=512, target="sm_90a").layouts  # too many cells to label
    assert kernel_layouts._repr_png_().startswith(b"\x89PNG")
    page = kernel_layouts._repr_html_()
    assert page.count("<img src='data:image/png;base64,") == len(kernel_layouts) == 3
    # Up to draw.ANNOTATE_CELLS cells, each is labelled: its thread and register (and copies), or its bank.
    fig = draw.draw_register_layout(layouts.blocked((8, 32), dtypes.float32), (8, 32))
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert len(texts) == 256 and texts[:5] == ["t0\nr0\nx2", "t0\nr1\nx2", "t0\nr2\nx2", "t0\nr3\nx2", "t1\nr0\nx2"]
    banks = draw.smem_banks((8, 32), dtypes.bfloat16, 64)
    assert [t.get_text() for t in draw.draw_smem_banks((8, 32), dtypes.bfloat16, 64).axes[0].texts] == \
        [str(b) for b in banks.ravel()]
    tmem = draw.draw_tmem_layout(TMEMLayout(TMEMLayoutKind.DEFAULT, 32)).axes[0]
    assert tmem.images[0].get_array().shape == (128, 32, 4)  # one cell per element, too many to label
    path = tmp_path / "layouts.png"
    draw.KernelLayouts("k", {"registers": [], "smem": [], "tmem": [
        {"shape": [128, 32], "dtype": "float32", "kind": "default", "cols": 32, "packing": 1, "line": 3}]}).save(str(path))
    assert path.read_bytes().startswith(b"\x89PNG")
    assert draw.KernelLayouts("k", None)._repr_png_() is None
