"""The matmul epilogue's activations, applied to the f32 accumulator on the way out: one definition for the
wgmma kernel (examples/matmul_hopper.py) and the decode GEMV (examples/_matmul_gemv.py)."""
import mgjit

ACTIVATIONS = (None, "relu", "gelu")  # what `matmul(..., activation=)` accepts


@mgjit.device
def activate(acc, ACTIVATION):
    """acc through the activation ACTIVATION names (one of ACTIVATIONS; gelu is the exact, erf form)."""
    if ACTIVATION == "relu":
        acc = mgjit.maximum(acc, 0.0)
    elif ACTIVATION == "gelu":
        acc = 0.5 * acc * (1.0 + mgjit.erf(acc * 0.7071067811865476))
    return acc
