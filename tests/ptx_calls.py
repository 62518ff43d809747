"""Calls on tests/ptx_sim.py: a function the module defines (a libdevice routine LLVM keeps out of line, which
tests/ptx_program.py places after the kernel's code) runs its code with each thread's return address kept, its
.param variables held as bits. The CTA holds the state: `returns` and `depth` (each thread's return addresses),
`param_space` (the .param variables' bits), `call_sites` (each call's return variable and callee's return
parameter, by the address it returns to) and `at` (the instruction being run)."""
from __future__ import annotations

import numpy as np
from ptx_arith import SimError

MAX_CALL_DEPTH = 8  # calls a thread may have in progress


class CallOps:
    """The CTA's call.uni and a function's ret, and its .param variables (read by ld.param, written by st.param)."""

    def call(self, ops: list, run: np.ndarray) -> int:
        """call.uni (retval0), name, (param0, param1): the callee's parameters take the .param variables' bits, and
        the threads go to its code, returning after this instruction."""
        ops = list(ops)
        retval = ops.pop(0).strip("() ") if ops[0].startswith("(") else None
        name = ops[0].strip()
        if name not in self.prog.functions:
            raise SimError(f"a call of {name}, which this module does not define")
        params, returned = self.prog.functions[name]
        args = [a.strip("() ") for a in ops[1:] if a.strip("() ")]  # (param0, param1): split at its comma
        if len(args) != len(params):
            raise SimError(f"{name} takes {len(params)} parameters, called with {len(args)}")
        for arg, param in zip(args, params):
            self.set_param(param, self.param(arg), run)
        if (self.depth[run] >= MAX_CALL_DEPTH).any():
            raise SimError(f"calls nested deeper than {MAX_CALL_DEPTH}")
        self.returns[run, self.depth[run]] = self.at + 1
        self.depth[run] += 1
        self.call_sites[self.at + 1] = (retval, returned)
        return self.prog.labels[name]

    def ret(self, run: np.ndarray) -> np.ndarray:
        """ret in a function: each thread back after its call, the callee's return parameter's bits in the caller's
        return variable."""
        if not (self.depth[run] > 0).all():
            raise SimError("ret from the kernel and from a function in one step")
        self.depth[run] -= 1
        targets = np.zeros(self.threads, dtype=np.int64)
        targets[run] = self.returns[run, self.depth[run]]
        for site in set(targets[run].tolist()):
            retval, returned = self.call_sites[site]
            if retval is not None:
                self.set_param(retval, self.param(returned), run & (targets == site))
        return targets

    def param(self, name: str) -> np.ndarray:
        if name not in self.param_space:
            raise SimError(f"a read of the .param variable {name} before any write")
        return self.param_space[name]

    def set_param(self, name: str, bits: np.ndarray, mask: np.ndarray) -> None:
        """The .param variable `name` takes `bits` (per thread) in the threads of `mask`."""
        self.param_space.setdefault(name, np.zeros(self.threads, dtype=np.uint64))[mask] = bits[mask]
