"""`mgjit.torch_op`: a kernel's launch wrapper as a torch.library custom op, so that `torch.compile` sees one
opaque node (no graph break, fullgraph=True works), learns its outputs from declared shapes and dtypes (the
fake implementation: nothing is compiled or launched while tracing), and can differentiate through it.

    @mgjit.torch_op("mylib::rmsnorm", outputs=lambda x, w, eps=1e-6: (x.shape, x.dtype))
    def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        out = torch.empty_like(x)
        rmsnorm_kernel[(x.shape[0],)](x, w, out, eps=eps, BLOCK=...)
        return out

    model = torch.compile(model, fullgraph=True)                   # rmsnorm is one node of the graph
    model = torch.compile(model, mode="reduce-overhead")           # ... and replays in a CUDA graph

The wrapper must return new tensors (a custom op's outputs never alias its inputs) and launch on torch's
current stream (mgjit's launches do), which is what lets "reduce-overhead" capture it: its kernels must have
been launched once with the same argument types before capture (torch.compile's warm-up runs do that).
"""
from __future__ import annotations

import inspect
import typing
from typing import Any, Callable, Mapping, Sequence, TypeVar

T = TypeVar("T")


def torch_op(name: str, *, outputs: Callable[..., Any], params: Sequence[str] | Mapping[str, Any] | None = None,
             backward: Callable[..., Any] | None = None,
             setup_context: Callable[..., Any] | None = None) -> Callable[[Callable[..., Any]], Any]:
    """Register the decorated launch wrapper as the custom op `name` ("namespace::op") and return the op.

    outputs(*args, **kwargs): the op's outputs for the op's arguments, as one (shape, dtype) pair or a tuple
        of them: the fake implementation makes empty tensors of those on the first tensor argument's device.
    params: the wrapper's parameters the op takes, in the op's order (default: all of them; the others keep
        their defaults; the op passes them by name), each annotated with a type custom ops accept
        (torch.Tensor, int, float, bool, str, and those made Optional), or a dict of name -> such a type for
        a wrapper without annotations (or its spelling: "Tensor", "Optional[Tensor]").
    backward, setup_context: the autograd formula, as torch.library.register_autograd takes them.
    """
    def decorate(fn: Callable[..., Any]) -> Any:
        import torch
        signature = _signature(fn, params)
        op_schema = torch.library.infer_schema(_prototype(signature), mutates_args=())
        registered = _REGISTERED.get(name)
        if registered is not None:  # a re-run notebook cell or a module imported twice: same op, new code
            if registered.schema != op_schema:
                raise ValueError(f"torch_op: {name} is registered with schema {registered.schema}; a custom op's "
                                 f"schema cannot change in a process (new: {op_schema})")
        else:
            registered = _REGISTERED[name] = _Registered(op_schema)

            def launch(*args: Any, **kwargs: Any) -> Any:
                # By name: the op may take some of the wrapper's parameters, keyword-only ones among them.
                return registered.fn(**dict(zip(registered.names, args)), **kwargs)

            def fake(*args: Any, **kwargs: Any) -> Any:
                declared = registered.outputs(*args, **kwargs)
                device = next((a.device for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
                if _is_pair(declared):
                    return torch.empty(tuple(declared[0]), dtype=declared[1], device=device)
                return tuple(torch.empty(tuple(shape), dtype=dtype, device=device) for shape, dtype in declared)

            # Defined and implemented through torch.library.Library, not torch.library.custom_op: a call then
            # crosses into Python once, where custom_op's autograd and checking wrappers cost ~60 us (H100,
            # benchmarks/model.py), ten times a launch.
            namespace, op_name = name.split("::")
            registered.library = torch.library.Library(namespace, "FRAGMENT")
            registered.library.define(op_name + op_schema)
            registered.library.impl(op_name, launch, "CompositeExplicitAutograd")
            torch.library.register_fake(name, fake, lib=registered.library)
            registered.op = getattr(getattr(torch.ops, namespace), op_name).default
        registered.fn, registered.outputs = fn, outputs
        registered.names = list(signature.parameters)
        registered.backward, registered.setup_context = backward, setup_context
        if backward is not None and not registered.differentiable:  # once: a second would override the first
            def setup(ctx: Any, inputs: Any, output: Any) -> None:
                if registered.setup_context is not None:
                    registered.setup_context(ctx, inputs, output)

            torch.library.register_autograd(name, lambda *grads: registered.backward(*grads),
                                            setup_context=setup, lib=registered.library)
            registered.differentiable = True
        return registered.op

    return decorate


class _Registered:
    """A custom op made by torch_op: its schema, and the wrapper and output declaration it runs now."""

    def __init__(self, schema: str):
        self.schema = schema
        self.op: Any = None
        self.library: Any = None  # the torch.library.Library holding the op's registrations (alive with it)
        self.backward: Callable[..., Any] | None = None
        self.setup_context: Callable[..., Any] | None = None
        self.differentiable = False  # an autograd formula is registered (it calls self.backward)
        self.fn: Callable[..., Any] | None = None
        self.outputs: Callable[..., Any] | None = None
        self.names: list[str] = []  # the wrapper's parameters the op's arguments go to, in order


_REGISTERED: dict[str, _Registered] = {}


def outside_graph_pools(make: Callable[[], T], device: Any) -> T:
    """make() (tensors kept across calls: a workspace, a buffer), run on a thread of its own so that its
    allocations come from torch's ordinary allocator, and its work waited for. While torch.compile's CUDA graphs
    ("reduce-overhead") warm up or record, every allocation of the calling thread goes into their private pool, and
    they refuse to run once a tensor of that pool outlives the step untracked ("tensor(s) in the cudagraph pool not
    tracked as outputs"): a wrapper's first call, or an autotuner's first sweep, often falls in a warm-up. Inside a
    capture make() runs in place (the other thread could not wait for its work), and off CUDA (`device`, a
    torch.device) too."""
    import threading

    import torch
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return make()
    made: list = []

    def run() -> None:
        try:
            value = make()
            torch.cuda.current_stream(device).synchronize()
            made.append(value)
        except BaseException as e:  # handed to the caller's thread
            made.append(e)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


def _prototype(signature: inspect.Signature) -> Callable[..., Any]:
    """A function with this signature, to infer a schema from."""
    def prototype(*args: Any, **kwargs: Any) -> None:
        pass

    prototype.__signature__ = signature
    return prototype


def _signature(fn: Callable[..., Any], params: Sequence[str] | Mapping[str, Any] | None) -> inspect.Signature:
    """The op's signature: `fn`'s parameters in `params`, in that order, all positional-or-keyword (the op passes
    them by name), annotated with `params`' types or `fn`'s own annotations (resolved: they may be strings)."""
    import torch
    signature = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    if isinstance(params, Mapping):  # strings name torch's types as schemas do: "Tensor", "Optional[Tensor]"
        names = {"Tensor": torch.Tensor, "Optional": typing.Optional, "torch": torch}
        hints.update({n: eval(t, names) if isinstance(t, str) else t for n, t in params.items()})
    names = list(signature.parameters) if params is None else list(params)
    unknown = [n for n in names if n not in signature.parameters]
    if unknown:
        raise TypeError(f"torch_op: {fn.__name__} has no parameter {unknown[0]!r}")
    unannotated = [n for n in names if n not in hints]
    if unannotated:
        raise TypeError(f"torch_op: parameter {unannotated[0]!r} of {fn.__name__} needs a type annotation (or "
                        "a type in params={name: type})")
    kept = [signature.parameters[n].replace(annotation=hints[n], kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)
            for n in names]
    # One tensor, unless the wrapper says otherwise (`-> tuple[torch.Tensor, torch.Tensor]`).
    return signature.replace(parameters=kept, return_annotation=hints.get("return", torch.Tensor))


def _is_pair(declared: Any) -> bool:
    """One (shape, dtype) pair, rather than a sequence of them."""
    import torch
    return len(declared) == 2 and isinstance(declared[1], torch.dtype)
