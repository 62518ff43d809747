"""examples/notebook.ipynb, executed headlessly twice: a first session, then a "restart" (a fresh kernel
process on the same cache directory). The notebook asserts its own recompiles and cache hits; this test
checks what it printed and what landed on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="needs the test extra: pip install -e .[test]")
nbclient = pytest.importorskip("nbclient", reason="needs the test extra: pip install -e .[test]")
pytest.importorskip("ipykernel", reason="needs the test extra: pip install -e .[test]")

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "notebook.ipynb"


def execute(workdir: Path) -> list[str]:
    """Run every cell in a fresh kernel; return each code cell's printed output (a failing cell raises)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    ).execute()
    texts = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            texts.append("".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream"))
    return texts


def test_notebook_recompiles_on_change_and_hits_the_disk_after_restart(tmp_path, monkeypatch):
    import torch

    cache = tmp_path / "cache"
    monkeypatch.setenv("MGJIT_CACHE_DIR", str(cache))  # the kernel process inherits it
    monkeypatch.delenv("MGJIT_CACHE_REDIS", raising=False)

    setup, _, first, halved, shifted, undone, inspected, listing = execute(tmp_path)
    assert f"kernel cache: {cache}" in setup
    assert first.startswith("compiled in ")
    assert halved.startswith("compiled in ")  # helper redefined
    assert shifted.startswith("compiled in ")  # global changed
    assert undone.startswith("from the disk cache in ")  # both undone: the first key, from disk
    assert "--- IR (layouts inferred) ---" in inspected and "ptxas info" in inspected
    assert listing.count("scaled_relu") == 3 and "entries:   3" in listing
    assert ("ran on the GPU and matches torch" in first) == torch.cuda.is_available()
    entries = sorted(p.name for shard in cache.iterdir() if len(shard.name) == 2 for p in shard.iterdir())
    assert len(entries) == 3

    # Restart: a new kernel process finds every kernel on disk and compiles nothing.
    _, _, first, halved, shifted, undone, _, listing = execute(tmp_path)
    for text in (first, halved, shifted, undone):
        assert text.startswith("from the disk cache in "), text
    assert "entries:   3" in listing
    assert sorted(p.name for shard in cache.iterdir() if len(shard.name) == 2 for p in shard.iterdir()) == entries
