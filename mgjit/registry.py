"""Rules keyed by IR op class: layout inference and lowering each keep one registry (in their pass drivers),
and each op family module registers its ops' rules beside the op classes."""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

R = TypeVar("R", bound=Callable)


class RuleRegistry(Generic[R]):
    def __init__(self, what: str):
        self.what = what
        self._rules: dict[type, R] = {}

    def rule(self, *op_types: type) -> Callable[[R], R]:
        """Decorator: `@infer.rule(Binary, Compare)` makes the function the rule for those ops."""
        def register(fn: R) -> R:
            for t in op_types:
                if t in self._rules:
                    raise ValueError(f"{self.what}: {t.__name__} already has the rule {self._rules[t].__name__}")
                self._rules[t] = fn
            return fn
        return register

    def get(self, op_type: type) -> R | None:
        return self._rules.get(op_type)
