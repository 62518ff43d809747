"""Layout pictures: which thread and register hold each element of a register array, which bank each element of
an SMEM tile hits, and which TMEM lane and column each element of a tensor-memory reference lives in.

Each picture is drawn from an ownership table computed here (`register_owners`, `smem_banks`, `tmem_cells`),
which the tests check against layouts derived by hand from the PTX ISA. `CompiledKernel.layouts` draws the
layouts inference chose for a compiled kernel, from its metadata (`kernel_layouts`, recorded at compile time so
that a cached kernel draws too): in a notebook it shows inline (`_repr_html_`, `_repr_png_`), elsewhere
`.save("layouts.png")` writes a file. matplotlib is imported on the first drawing, never by `import mgjit`.
"""
from __future__ import annotations

import base64
import dataclasses
import html
import io
import math
from typing import Any, Sequence

import numpy as np

from . import dtypes, tiles
from .layouts import THREADS_PER_WARPGROUP, Dim, Replicated, TiledLayout, Tiling
from .tmem_layouts import ScaleLayout, TMEMLayout, TMEMLayoutKind

BANKS = 32
BANK_BYTES = 4
ANNOTATE_CELLS = 256  # cells up to which a picture writes each cell's numbers (text is slow to render)


# ---------------------------------------------------------------------------------------------- ownership tables

def _as_2d(shape: Sequence[int]) -> tuple[int, int]:
    """Arrays of any rank are drawn as (rows, last dimension), rows counting every leading dimension."""
    shape = tuple(shape)
    return (math.prod(shape[:-1]) if len(shape) > 1 else 1), shape[-1]


@dataclasses.dataclass(frozen=True)
class RegisterOwners:
    """For each element (as a (rows, cols) grid): the first thread that holds it, its register there (the
    element's position among the thread's elements, in register then vector order) and how many threads hold
    a copy (more than one where the layout is Replicated)."""

    thread: np.ndarray
    register: np.ndarray
    copies: np.ndarray


def register_owners(layout: TiledLayout, shape: Sequence[int]) -> RegisterOwners:
    shape = tuple(shape)
    layout.check_shape(shape)
    rows, cols = _as_2d(shape)
    # An element's index is linear in its tiled index: the part that comes from the thread plus the part that
    # comes from the register and vector slot (thread 0 contributes nothing).
    first = tuple(0 for _ in layout.registers_shape(shape))
    by_thread = np.array([layout.element_index(shape, t, first, 0) for t in range(THREADS_PER_WARPGROUP)])
    by_register = np.array([layout.element_index(shape, 0, reg, k) for reg in layout.registers(shape)
                            for k in range(layout.vector_length)])
    index = by_thread[:, None, :] + by_register[None, :, :]  # (thread, register, dimension)
    flat = np.ravel_multi_index(tuple(np.moveaxis(index, -1, 0)), shape)
    row, col = np.divmod(flat, cols)
    thread = np.full((rows, cols), -1, dtype=np.int64)
    register = np.full((rows, cols), -1, dtype=np.int64)
    for t in reversed(range(THREADS_PER_WARPGROUP)):  # the lowest thread holding an element is written last
        thread[row[t], col[t]] = t
        register[row[t], col[t]] = np.arange(len(by_register))
    copies = np.zeros((rows, cols), dtype=np.int64)
    np.add.at(copies, (row.ravel(), col.ravel()), 1)
    return RegisterOwners(thread, register, copies)


def smem_banks(shape: Sequence[int], dtype: dtypes.DType, swizzle: int | None) -> np.ndarray:
    """The shared-memory bank of each element of a tile (rows, cols), stored as tiles.Tile stores it."""
    tile = tiles.Tile(tuple(shape), dtype.storage_bits, swizzle)
    rows, cols = _as_2d(shape)
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return (tile.offset(r, c) // BANK_BYTES) % BANKS


def tmem_cells(layout: TMEMLayout) -> tuple[np.ndarray, np.ndarray]:
    """The TMEM lane and column (from the reference's first) of each element of a reference."""
    lanes = np.zeros(layout.shape, dtype=np.int64)
    columns = np.zeros(layout.shape, dtype=np.int64)
    for row in range(layout.rows):
        for col in range(layout.cols):
            lanes[row, col], columns[row, col], _ = layout.lane_and_column(row, col)
    return lanes, columns


# ---------------------------------------------------------------------------------------------- layouts as JSON

def _dim_json(d: Dim) -> Any:
    return {"replicated": d.times} if isinstance(d, Replicated) else d


def _dim_from_json(d: Any) -> Dim:
    return Replicated(d["replicated"]) if isinstance(d, dict) else d


def layout_to_json(layout: TiledLayout) -> dict:
    return {"tiles": [list(t) for t in layout.tiling.tiles], "warp_dims": [_dim_json(d) for d in layout.warp_dims],
            "lane_dims": [_dim_json(d) for d in layout.lane_dims], "vector_dim": layout.vector_dim}


def layout_from_json(data: dict) -> TiledLayout:
    return TiledLayout(Tiling(tuple(tuple(t) for t in data["tiles"])),
                       tuple(_dim_from_json(d) for d in data["warp_dims"]),
                       tuple(_dim_from_json(d) for d in data["lane_dims"]), data["vector_dim"])


def kernel_layouts(kernel) -> dict:
    """What inference chose, as JSON metadata: each distinct register layout with the values (op, line) that
    have it, each SMEM buffer and each TMEM reference."""
    from . import ir, ops
    registers: dict[tuple, dict] = {}
    smem, tmem = [], []
    for op in kernel.walk():
        line = op.loc.line if op.loc else 0
        if isinstance(op, ops.SmemAlloc):
            t = op.result.type
            smem.append({"shape": list(t.shape), "dtype": t.dtype.name, "swizzle": t.swizzle, "line": line})
        elif isinstance(op, ops.TmemAlloc):
            t = op.result.type
            tl = ops.tmem_layout(t)
            if isinstance(tl, ScaleLayout):  # block scales (tcgen05.cp's chunks): listed, not drawn
                tmem.append({"shape": list(t.shape), "dtype": t.dtype.name, "kind": "scales", "cols": tl.columns,
                             "line": line})
                continue
            tmem.append({"shape": list(t.shape), "dtype": t.dtype.name, "kind": tl.kind.value, "cols": tl.cols,
                         "packing": tl.packing, "line": line})
        for v in op.results:
            if isinstance(v.type, ir.ArrayType) and isinstance(v.layout, TiledLayout):
                key = (v.layout, v.type.shape, v.dtype.name)
                entry = registers.setdefault(key, {"layout": layout_to_json(v.layout), "shape": list(v.type.shape),
                                                   "dtype": v.dtype.name, "values": []})
                entry["values"].append([op.name, line])
    return {"registers": list(registers.values()), "smem": smem, "tmem": tmem}


# ---------------------------------------------------------------------------------------------- pictures

def _scattered(n: int, count: int) -> np.ndarray:
    """A color index per value 0..count-1 that puts neighbours far apart on a cyclic color map."""
    step = next(s for s in range(int(count * 0.38), count) if math.gcd(s, count) == 1)
    return (np.arange(n) * step) % count / count


def _grid(ax, values: np.ndarray, colors: np.ndarray, labels: np.ndarray | None, title: str) -> None:
    import matplotlib
    cmap = matplotlib.colormaps["hsv"]
    rgb = cmap(colors)
    rgb[..., :3] = 0.35 + 0.65 * rgb[..., :3]  # pastel, so that black text reads on every cell
    ax.imshow(rgb, interpolation="nearest", aspect="auto")
    rows, cols = values.shape
    if labels is not None and rows * cols <= ANNOTATE_CELLS:
        size = max(3.0, min(8.0, 240 / max(rows, cols)))
        for (r, c), text in np.ndenumerate(labels):
            ax.text(c, r, text, ha="center", va="center", fontsize=size)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("column")
    ax.set_ylabel("row")


def draw_register_layout(layout: TiledLayout, shape: Sequence[int], ax=None, title: str | None = None):
    """Each element colored by the thread that holds it, labelled t<thread>.r<register> where it fits."""
    owners = register_owners(layout, shape)
    labels = np.vectorize(lambda t, r, n: f"t{t}\nr{r}" + (f"\nx{n}" if n > 1 else ""))(
        owners.thread, owners.register, owners.copies)
    fig, ax = _axes(ax, owners.thread.shape)
    replicated = int(owners.copies.max())
    note = f", each element in {replicated} threads" if replicated > 1 else ""
    _grid(ax, owners.thread, _scattered(THREADS_PER_WARPGROUP, THREADS_PER_WARPGROUP)[owners.thread], labels,
          title or f"registers {tuple(shape)}: thread t, register r{note}")
    return fig


def draw_smem_banks(shape: Sequence[int], dtype: dtypes.DType, swizzle: int | None, ax=None,
                    title: str | None = None):
    """Each element colored and labelled by its bank (32 banks of 4 bytes)."""
    banks = smem_banks(shape, dtype, swizzle)
    fig, ax = _axes(ax, banks.shape)
    _grid(ax, banks, _scattered(BANKS, BANKS)[banks], banks.astype(str),
          title or f"SMEM {dtype.name}{list(shape)}, swizzle {swizzle or 'none'}: bank")
    return fig


def draw_tmem_layout(layout: TMEMLayout, ax=None, title: str | None = None):
    """Each element colored by its TMEM lane, labelled lane:column where it fits."""
    lanes, columns = tmem_cells(layout)
    labels = np.vectorize(lambda lane, col: f"{lane}:{col}")(lanes, columns)
    fig, ax = _axes(ax, lanes.shape)
    _grid(ax, lanes, _scattered(128, 128)[lanes], labels,
          title or f"TMEM {layout.kind.value} {layout.rows}x{layout.cols}, packing {layout.packing}: lane:column")
    return fig


def _axes(ax, cells: tuple[int, int]):
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure
    rows, cols = cells
    scale = 0.45 if rows * cols <= ANNOTATE_CELLS else 0.05
    fig = Figure(figsize=(min(16.0, max(4.0, cols * scale + 1.5)), min(16.0, max(3.0, rows * scale + 1.2))))
    return fig, fig.add_subplot()


def png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


class KernelLayouts:
    """The layouts of one compiled kernel, drawable: `c.layouts` in a notebook shows a table with a picture per
    layout; `.save(path)` writes them as one PNG; `.figures()` gives them as matplotlib Figures."""

    def __init__(self, name: str, data: dict | None):
        self.name = name
        self.data = data or {"registers": [], "smem": [], "tmem": []}

    def __len__(self) -> int:
        return sum(len(v) for v in self.data.values())

    def pictures(self) -> list[tuple[str, Any]]:
        """(caption, a function drawing it on given axes) for each layout."""
        out = []
        for entry in self.data["registers"]:
            layout, shape = layout_from_json(entry["layout"]), tuple(entry["shape"])
            where = ", ".join(f"{op} (line {line})" for op, line in entry["values"][:6])
            more = f" and {len(entry['values']) - 6} more" if len(entry["values"]) > 6 else ""
            out.append((f"{entry['dtype']}{list(shape)} in {layout!r}: {where}{more}",
                        lambda ax, layout=layout, shape=shape: draw_register_layout(layout, shape, ax)))
        for entry in self.data["smem"]:
            dtype = dtypes.BY_NAME[entry["dtype"]]
            out.append((f"mgjit.smem at line {entry['line']}",
                        lambda ax, e=entry, d=dtype: draw_smem_banks(e["shape"][-2:] if len(e["shape"]) > 1
                                                                     else e["shape"], d, e["swizzle"], ax)))
        for entry in self.data["tmem"]:
            if entry["kind"] == "scales":
                continue
            layout = TMEMLayout(TMEMLayoutKind(entry["kind"]), entry["cols"], entry["packing"])
            out.append((f"mgjit.tmem at line {entry['line']}", lambda ax, layout=layout: draw_tmem_layout(layout, ax)))
        return out

    def figures(self) -> list:
        from matplotlib.figure import Figure
        figs = []
        for caption, draw in self.pictures():
            fig = Figure(figsize=(9, 6))
            draw(fig.add_subplot())
            fig.suptitle(caption, fontsize=8)
            figs.append(fig)
        return figs

    def figure(self):
        """Every layout on one Figure, one row each."""
        from matplotlib.figure import Figure
        pictures = self.pictures()
        fig = Figure(figsize=(10, 5 * max(len(pictures), 1)))
        for i, (caption, draw) in enumerate(pictures):
            ax = fig.add_subplot(max(len(pictures), 1), 1, i + 1)
            draw(ax)
            ax.set_title(caption + "\n" + ax.get_title(), fontsize=8)
        fig.subplots_adjust(hspace=0.4)
        return fig

    def save(self, path: str) -> None:
        self.figure().savefig(path, dpi=100, bbox_inches="tight")

    def _repr_png_(self) -> bytes | None:
        return png(self.figure()) if len(self) else None

    def _repr_html_(self) -> str:
        rows = []
        for fig, (caption, _) in zip(self.figures(), self.pictures()):
            data = base64.b64encode(png(fig)).decode()
            rows.append(f"<tr><td>{html.escape(caption)}</td><td><img src='data:image/png;base64,{data}'/></td></tr>")
        return f"<table><caption>{html.escape(self.name)}: layouts</caption>{''.join(rows)}</table>"

    def __repr__(self) -> str:
        return (f"KernelLayouts({self.name}: {len(self.data['registers'])} register layouts, "
                f"{len(self.data['smem'])} SMEM buffers, {len(self.data['tmem'])} TMEM references)")
