"""Keys describe content, never identity or location: whatever a kernel reads — a module attribute, a
container read by index, a class attribute, a namespace, a helper's default argument — is in its key by value,
every call notices when it changed, and an edited file is a new kernel only when it is imported again.

Each test makes the stale case happen and checks the kernel that runs (its IR's constants), not only its key.
"""
import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
import types

import pytest

import mgjit

torch = pytest.importorskip("torch")


def constants(compiled) -> list[str]:
    return re.findall(r"constant \{value=([^}]*)\}", compiled.ir)


def write(path, text: str):
    path.write_text(textwrap.dedent(text))
    return path


def load(path, name: str, extra_path=None):
    """Import a module from a file, the way a fresh `import` would."""
    import importlib.util
    if extra_path:
        sys.path.insert(0, str(extra_path))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        if extra_path:
            sys.path.remove(str(extra_path))


@pytest.fixture
def x():
    return torch.zeros(1024)


def compile_(kernel, x, **kw):
    return kernel.compile(x, torch.empty_like(x), BLOCK=256, target="sm_90a", **kw)


def test_module_attribute_and_module_function(tmp_path, x):
    write(tmp_path / "cfg_a.py", "S = 3.0\n")
    write(tmp_path / "ops_a.py", """\
        import mgjit

        @mgjit.device
        def act(v):
            return v * 5.0
        """)
    k = load(write(tmp_path / "kern_a.py", """\
        import mgjit
        import cfg_a as cfg
        import ops_a as ops

        @mgjit.kernel
        def kern(x, out, BLOCK: mgjit.constexpr):
            out[mgjit.ds(0, BLOCK)] = ops.act(x[mgjit.ds(0, BLOCK)]) + cfg.S
        """), "kern_a", tmp_path)
    first = compile_(k.kern, x)
    assert {"5.0", "3.0"} <= set(constants(first))
    sys.modules["cfg_a"].S = 7.0  # a notebook cell changes the setting
    second = compile_(k.kern, x)
    assert second.key != first.key and "7.0" in constants(second) and "3.0" not in constants(second)

    @mgjit.device
    def act(v):
        return v * 11.0

    sys.modules["ops_a"].act = act  # and redefines the helper the kernel calls through the module
    third = compile_(k.kern, x)
    assert third.key != second.key and "11.0" in constants(third)


SHARED = types.SimpleNamespace(scale=2.0)


class Settings:
    OFFSET = 1.5


TABLE = {"gain": 4.0}
FACTORS = [0.25, 0.5]
NESTED = ((1.0, (2.0, 3.0)), 4.0)


@dataclasses.dataclass
class Config:
    BIAS: float = 0.125


class Plain:
    def __init__(self):
        self.SHIFT = 0.0625


CONFIG = Config()
PLAIN = Plain()


@mgjit.device
def scaled(v, factor=FACTORS[1]):
    return v * factor


@mgjit.kernel
def reads_everything(x, out, BLOCK: mgjit.constexpr):
    v = x[mgjit.ds(0, BLOCK)]
    out[mgjit.ds(0, BLOCK)] = scaled(v) * SHARED.scale + Settings.OFFSET + TABLE["gain"] + FACTORS[0] \
        + NESTED[0][1][1] + CONFIG.BIAS + PLAIN.SHIFT


@pytest.mark.parametrize("change,value", [
    (lambda: setattr(SHARED, "scale", 9.0), "9.0"),  # a namespace attribute
    (lambda: setattr(Settings, "OFFSET", 8.5), "8.5"),  # a class attribute
    (lambda: TABLE.__setitem__("gain", 7.0), "7.0"),  # a dict mutated in place
    (lambda: FACTORS.__setitem__(0, 6.25), "6.25"),  # a list mutated in place
    (lambda: globals().__setitem__("NESTED", ((1.0, (2.0, 5.5)), 4.0)), "5.5"),  # a nested tuple rebound
    (lambda: setattr(scaled.fn, "__defaults__", (0.75,)), "0.75"),  # a helper's default argument
    (lambda: setattr(CONFIG, "BIAS", 0.375), "0.375"),  # a dataclass instance's field assigned in place
    (lambda: setattr(PLAIN, "SHIFT", 0.4375), "0.4375"),  # an attribute of a plain object
])
def test_every_kind_of_read_value_is_in_the_key(x, change, value):
    saved = (SHARED.scale, Settings.OFFSET, dict(TABLE), list(FACTORS), NESTED, scaled.fn.__defaults__, CONFIG.BIAS,
             PLAIN.SHIFT)
    try:
        before = compile_(reads_everything, x)
        assert value not in constants(before)
        change()
        after = compile_(reads_everything, x)
        assert after.key != before.key and value in constants(after)
    finally:
        SHARED.scale, Settings.OFFSET = saved[0], saved[1]
        TABLE.clear()
        TABLE.update(saved[2])
        FACTORS[:] = saved[3]
        globals()["NESTED"] = saved[4]
        scaled.fn.__defaults__ = saved[5]
        CONFIG.BIAS, PLAIN.SHIFT = saved[6], saved[7]


def test_a_launch_notices_the_change_too():
    """The dispatcher's fast path checks, on every call, that what the kernel read is unchanged."""
    reads_everything.source_key()
    assert not reads_everything._deps_changed()
    TABLE["gain"] = 3.0
    try:
        assert reads_everything._deps_changed()
    finally:
        TABLE["gain"] = 4.0
    assert not reads_everything._deps_changed()


CHILD = '''\
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
import kern_b
x = torch.zeros(1024)
c = kern_b.kern.compile(x, torch.empty_like(x), BLOCK=256, target="sm_90a")
print(json.dumps({"key": c.key, "from_cache": c.from_cache, "ir": c.ir}))
'''


def child(tmp_path, cache) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MGJIT_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_an_edited_settings_file_is_a_new_kernel_in_a_new_process(tmp_path):
    cache = tmp_path / "cache"
    write(tmp_path / "cfg_b.py", "S = 3.0\nTABLE = {'k': 10.0}\n")
    write(tmp_path / "kern_b.py", """\
        import mgjit
        import cfg_b

        @mgjit.kernel
        def kern(x, out, BLOCK: mgjit.constexpr):
            out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, BLOCK)] * cfg_b.S + cfg_b.TABLE["k"]
        """)
    first = child(tmp_path, cache)
    write(tmp_path / "cfg_b.py", "S = 3.0\nTABLE = {'k': 20.0}\n")
    second = child(tmp_path, cache)
    assert second["key"] != first["key"] and not second["from_cache"]
    assert "value=20.0" in second["ir"] and "value=10.0" not in second["ir"]
    write(tmp_path / "cfg_b.py", "S = 3.0\nTABLE = {'k': 10.0}\n")
    third = child(tmp_path, cache)
    assert third["key"] == first["key"] and third["from_cache"] and "value=10.0" in third["ir"]


def test_the_source_is_read_once_when_the_kernel_is_defined(tmp_path, x):
    """A running job whose file is edited (or switched by git) keeps compiling the text it imported, under
    that text's key; the edit is a new kernel only once the file is imported again."""
    path = write(tmp_path / "kern_c.py", """\
        import mgjit

        @mgjit.kernel
        def kern(x, out, BLOCK: mgjit.constexpr):
            out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, BLOCK)] + 1.0
        """)
    module = load(path, "kern_c")
    write(path, """\
        import mgjit
        # two lines more, so that the old line numbers now point elsewhere


        @mgjit.kernel
        def kern(x, out, BLOCK: mgjit.constexpr):
            out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, BLOCK)] * 2.0
        """)
    old = compile_(module.kern, x)
    assert "1.0" in constants(old) and "kind=mul" not in old.ir
    fresh = compile_(load(path, "kern_c").kern, x)
    assert fresh.key != old.key and "2.0" in constants(fresh)


@mgjit.device
def double(v):
    return v * 2.0


@mgjit.kernel
def apply(x, out, FN: mgjit.constexpr, BLOCK: mgjit.constexpr):
    out[mgjit.ds(0, BLOCK)] = FN(x[mgjit.ds(0, BLOCK)])


def test_a_device_function_constexpr_is_keyed_by_its_source(tmp_path):
    """Not by its address: the key is the same in every process (no recompile each time)."""
    code = textwrap.dedent(f'''\
        import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})
        import torch, test_cache_keys as t
        x = torch.zeros(1024)
        print(t.apply.compile(x, torch.empty_like(x), FN=t.double, BLOCK=256, target="sm_90a").key)
        ''')
    env = {**os.environ, "MGJIT_CACHE_DIR": str(tmp_path / "cache")}
    keys = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           timeout=300).stdout.strip() for _ in range(2)}
    assert len(keys) == 1 and re.fullmatch(r"[0-9a-f]{64}", keys.pop())


class Opaque:
    """An object whose repr is its address: it has no content mgjit can describe."""

    def __init__(self, value):
        self.value = value


OPAQUE = Opaque(2.0)


@mgjit.kernel
def reads_opaque(x, out, BLOCK: mgjit.constexpr, FLAG: mgjit.constexpr):
    out[mgjit.ds(0, BLOCK)] = x[mgjit.ds(0, BLOCK)] * (2.0 if FLAG is OPAQUE else 3.0)


def test_an_object_read_whole_is_checked_for_assignments(x):
    """An object described by identity (memory-only) is still compared with its attributes on every call."""
    first = compile_(reads_opaque, x, FLAG=OPAQUE)
    assert not reads_opaque._deps_changed()
    OPAQUE.value = 5.0
    try:
        assert reads_opaque._deps_changed()
    finally:
        OPAQUE.value = 2.0
    assert compile_(reads_opaque, x, FLAG=OPAQUE).ir == first.ir


def test_a_value_without_content_keeps_the_kernel_out_of_the_disk_cache(x):
    from mgjit.cache import default_store
    before = {e.key for e in default_store().entries()}
    c = compile_(reads_opaque, x, FLAG=OPAQUE)
    assert "2.0" in constants(c)
    assert c.key not in {e.key for e in default_store().entries()} - before  # never written to disk
    assert reads_opaque.compile(x, torch.empty_like(x), BLOCK=256, FLAG=OPAQUE, target="sm_90a") is c
