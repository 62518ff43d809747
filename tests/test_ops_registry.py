"""Every op family registers every rule kind for each of its ops: an op without an inference, a lowering or an
interpreter rule would only fail when a kernel first uses it."""
import inspect

import pytest

from mgjit import infer, interpret, ir, lower, ops, targets


def all_op_classes() -> list[type]:
    seen = []
    for module in (getattr(ops, name) for name in dir(ops)):
        if inspect.ismodule(module) and module.__name__.startswith("mgjit.ops."):
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, ir.Op) and cls is not ir.Op and cls.__module__ == module.__name__:
                    seen.append(cls)
    return seen


OP_CLASSES = [c for c in all_op_classes() if c.name != "?"]


def test_the_families_define_the_ops():
    names = {c.__name__ for c in OP_CLASSES}
    assert {"Binary", "Reduce", "Load", "For", "Wgmma", "Tcgen05Mma", "TmaLoad", "TmemAlloc"} <= names
    assert len(OP_CLASSES) >= 44


@pytest.mark.parametrize("cls", OP_CLASSES, ids=lambda c: c.__name__)
def test_every_op_has_its_rules(cls):
    assert infer.RULES.get(cls) is not None, f"{cls.__name__} has no layout inference rule"
    assert lower.RULES.get(cls) is not None, f"{cls.__name__} has no lowering rule"
    assert interpret.RULES.get(cls) is not None, f"{cls.__name__} has no interpreter rule"


@pytest.mark.parametrize("cls", OP_CLASSES, ids=lambda c: c.__name__)
def test_an_ops_rules_live_in_its_family_module(cls):
    """The op's whole story in one module: its rules are registered where it is defined."""
    for registry in (infer.RULES, lower.RULES, interpret.RULES):
        fn = registry.get(cls)
        assert fn.__module__ in (cls.__module__, "mgjit.infer"), (registry.what, fn.__module__)


@pytest.mark.parametrize("cls", OP_CLASSES, ids=lambda c: c.__name__)
def test_an_op_lives_in_one_family_module(cls):
    """`grep class Name` finds one definition: the op's story is in its family module."""
    assert getattr(ops, cls.__name__) is cls


@pytest.mark.parametrize("cls", OP_CLASSES, ids=lambda c: c.__name__)
def test_an_op_needs_a_known_unit(cls):
    assert cls.requires is None or cls.requires in targets.UNITS
    assert cls.requires is None or any(cls.requires in t.units for t in targets.TARGETS.values())
