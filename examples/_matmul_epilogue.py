"""The matmul epilogue's activations, applied to the f32 accumulator on the way out: one definition for the
wgmma kernel (examples/matmul_hopper.py) and the decode GEMV (examples/_matmul_gemv.py); and the epilogue in torch
for products of an empty dimension, which launch nothing (`empty_product`)."""
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


def empty_product(m: int, n: int, out_dtype, scale, bias, activation, device):
    """act(a @ b * scale + bias) where M, N or K is 0, as torch's a @ b gives it, without a launch (its grid or
    its K loop would be empty, its TMA descriptors of no bytes): an empty c, or for K of 0 the epilogue of a zero
    accumulator (gelu in its exact, erf form, as `activate`)."""
    import torch
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"matmul: bias must be of shape ({n},), got {tuple(bias.shape)}")
    if scale is not None and scale.numel() != 1:
        raise ValueError(f"matmul: scale must hold one element, got shape {tuple(scale.shape)}")
    acc = torch.zeros(m, n, dtype=torch.float32, device=device)
    if scale is not None:
        acc = acc * scale.float().reshape(())
    if bias is not None:
        acc = acc + bias.float()
    if activation == "relu":
        acc = acc.clamp_min(0.0)
    elif activation == "gelu":
        acc = torch.nn.functional.gelu(acc)
    return acc.to(out_dtype)
