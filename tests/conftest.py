import os

import pytest


def _has_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Each test session compiles into its own cache directory unless the caller set one."""
    if "MGJIT_TEST_CACHE_DIR" in os.environ:
        monkeypatch.setenv("MGJIT_CACHE_DIR", os.environ["MGJIT_TEST_CACHE_DIR"])
    elif not os.environ.get("MGJIT_CACHE_DIR"):
        monkeypatch.setenv("MGJIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "mgjit-cache"))


@pytest.fixture
def poison_empty(monkeypatch):
    """torch.empty fills floating-point tensors with NaN for the test: a wrapper's output that some element of is
    never written shows it. Empty tensors are left as they are: torch has no fill for some dtypes (float4), and
    mgjit's C launcher makes one of each dtype when it first loads (a failed fill sent every later launch of the
    process through the Python path)."""
    import torch
    empty = torch.empty

    def nan_empty(*shape, **kw):
        out = empty(*shape, **kw)
        return out.fill_(float("nan")) if out.is_floating_point() and out.numel() else out
    monkeypatch.setattr(torch, "empty", nan_empty)
