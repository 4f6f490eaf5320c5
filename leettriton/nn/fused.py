"""The layers' elementwise work in one pass each: RMS norm (with an optional gate), rotary, LRPE, SwiGLU.

docs/design.md §12.5.

Each op reads its inputs once, computes in float32 and writes one output in the inputs' dtype (or the
dtype asked for), reading strided views as they come (the last dimension must be contiguous; anything
else is copied first).  Each has a PyTorch twin with the same arithmetic (``*_torch``): it is the CPU
path and the tests' reference.  The Triton kernel runs where the package runs its kernels: CUDA tensors,
or CPU tensors under the interpreter (``TRITON_INTERPRET=1``); float16, bfloat16 and float32 only (any
other dtype takes the PyTorch path).

Autograd: every op is differentiable.  The kernels' forward is a ``torch.autograd.Function`` whose
backward is the PyTorch twin's gradient (recomputed from the saved inputs), except rotary's, whose
backward is the same kernel rotating the other way (a rotation's transpose).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..autotune.families import is_interpreting
from ..ops import is_compiling

__all__ = ["rms_norm_gate", "rms_norm_gate_torch", "rotary", "rotary_torch", "lrpe", "lrpe_torch", "swiglu",
           "swiglu_torch", "GATE_ACTS", "uses_kernels"]

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_MAX_WIDTH = 32768            # one row in one program's registers
GATE_ACTS = (None, "swish", "identity")
"""The gates :func:`rms_norm_gate` fuses: none, y · swish(g), y · g."""


def uses_kernels(*tensors: Optional[torch.Tensor]) -> bool:
    """True when the fused ops run their Triton kernel on these tensors (CUDA, or CPU under the interpreter).

    Never while ``torch.compile`` traces: there the PyTorch twins' arithmetic joins the graph, for the compiler to
    fuse with the work around it (docs/design.md §4.6)."""
    if is_compiling():
        return False
    present = [t for t in tensors if t is not None]
    if not present or any(t.dtype not in _KERNEL_DTYPES for t in present):
        return False
    if all(t.device.type == "cuda" for t in present):
        return True
    return is_interpreting() and all(t.device.type == "cpu" for t in present)


def _rows(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x`` as ``(rows, width)`` with a contiguous last dimension: a view where the strides allow, else a copy."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    try:
        return x.view(-1, width)
    except RuntimeError:
        return x.reshape(-1, width).contiguous()


def _recomputed_grads(fn, inputs, grad_out):
    """Gradients of ``fn(*inputs)`` for the inputs that need them, recomputed in PyTorch (the ops' backward)."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(need) if t is not None else None
                  for t, need in zip(inputs, [t is not None and t.requires_grad for t in inputs])]
        wanted = [t for t in leaves if t is not None and t.requires_grad]
        out = fn(*leaves)
        grads = iter(torch.autograd.grad(out, wanted, grad_out)) if wanted else iter(())
    return [next(grads) if t is not None and t.requires_grad else None for t in leaves]


# ----------------------------------------------------------------------------- RMS norm × gate

def _check_norm(x, weight, gate, gate_act):
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"rms_norm_gate: x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    if weight is not None and tuple(weight.shape) != (x.shape[-1],):
        raise ValueError(f"rms_norm_gate: weight must have shape ({x.shape[-1]},) (x's last dimension), got "
                         f"{tuple(weight.shape)}")
    if gate_act not in GATE_ACTS:
        raise ValueError(f"rms_norm_gate: gate_act must be one of {GATE_ACTS}, got {gate_act!r}")
    if (gate is None) != (gate_act is None):
        raise ValueError("rms_norm_gate: give gate and gate_act together (or neither)")
    if gate is not None and gate.shape != x.shape:
        raise ValueError(f"rms_norm_gate: gate must have x's shape {tuple(x.shape)}, got {tuple(gate.shape)}")


def rms_norm_gate_torch(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float,
                        gate: Optional[torch.Tensor] = None, gate_act: Optional[str] = None,
                        out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The PyTorch twin of :func:`rms_norm_gate`: the same arithmetic, in float32."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    if gate is not None:
        gf = gate.float()
        y = y * (F.silu(gf) if gate_act == "swish" else gf)
    return y.to(x.dtype if out_dtype is None else out_dtype)


@triton.jit(do_not_specialize=["rows"])
def _rms_norm_gate_kernel(x_ptr, gate_ptr, weight_ptr, out_ptr, rows, width, x_row_stride, gate_row_stride,
                          out_row_stride, eps, HAS_WEIGHT: tl.constexpr, GATE: tl.constexpr,
                          BLOCK_ROWS: tl.constexpr, BLOCK_WIDTH: tl.constexpr):
    """out = x / rms(x) (· weight) (· act(gate)) over rows of ``width``; GATE: 0 none, 1 swish, 2 identity."""
    i_row = tl.program_id(0)
    o_row = (i_row * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)
    o_col = tl.arange(0, BLOCK_WIDTH)
    m_tile = (o_row < rows)[:, None] & (o_col < width)[None, :]
    b_x = tl.load(x_ptr + o_row[:, None] * x_row_stride + o_col[None, :], mask=m_tile, other=0.).to(tl.float32)
    b_mean_square = tl.sum(b_x * b_x, 1) / width                                   # [BLOCK_ROWS]
    b_y = b_x * tl.rsqrt(b_mean_square + eps)[:, None]                       # [BLOCK_ROWS, BLOCK_WIDTH]
    if HAS_WEIGHT:
        b_w = tl.load(weight_ptr + o_col, mask=o_col < width, other=0.).to(tl.float32)
        b_y = b_y * b_w[None, :]
    if GATE != 0:
        b_g = tl.load(gate_ptr + o_row[:, None] * gate_row_stride + o_col[None, :], mask=m_tile,
                      other=0.).to(tl.float32)
        if GATE == 1:
            b_g = b_g * tl.sigmoid(b_g)
        b_y = b_y * b_g
    tl.store(out_ptr + o_row[:, None] * out_row_stride + o_col[None, :], b_y.to(out_ptr.dtype.element_ty),
             mask=m_tile)


def _rms_norm_gate_launch(x, weight, gate, eps, gate_act, out_dtype):
    width = x.shape[-1]
    x2 = _rows(x, width)
    g2 = _rows(gate, width) if gate is not None else x2
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    rows = x2.shape[0]
    if rows == 0:
        return out
    block_width = triton.next_power_of_2(width)
    block_rows = max(1, min(triton.next_power_of_2(rows), 4096 // block_width))
    _rms_norm_gate_kernel[(triton.cdiv(rows, block_rows),)](
        x2, g2, weight.contiguous() if weight is not None else x2, out, rows, width, x2.stride(0), g2.stride(0),
        width, eps, HAS_WEIGHT=weight is not None, GATE=GATE_ACTS.index(gate_act) if gate_act is not None else 0,
        BLOCK_ROWS=block_rows, BLOCK_WIDTH=block_width, num_warps=8 if block_rows * block_width >= 4096 else 4)
    return out


class _RmsNormGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, gate, eps, gate_act, out_dtype):
        ctx.save_for_backward(x, weight, gate)
        ctx.eps, ctx.gate_act, ctx.out_dtype = eps, gate_act, out_dtype
        return _rms_norm_gate_launch(x, weight, gate, eps, gate_act, out_dtype)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, gate = ctx.saved_tensors
        grads = _recomputed_grads(
            lambda x, w, g: rms_norm_gate_torch(x, w, ctx.eps, g, ctx.gate_act, ctx.out_dtype),
            [x, weight, gate], grad_out)
        return grads[0], grads[1], grads[2], None, None, None


def rms_norm_gate(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, gate: Optional[torch.Tensor] = None,
                  gate_act: Optional[str] = None, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """x / rms(x) over the last dimension, times ``weight`` (if given), times ``act(gate)`` (if given), in float32,
    written once in ``out_dtype`` (default x's dtype).

    Args:
        x: ``(..., width)``, any strides.
        weight: ``(width,)`` or None.
        eps: added to the mean square.
        gate: x's shape, or None; ``gate_act``: ``"swish"`` (y · g · sigmoid(g)) or ``"identity"`` (y · g), given
            with ``gate``.
        out_dtype: the output's dtype (None: x's).

    The RetNet blocks' norms (no gate), its retention output (per-head norm with weight × swish of the output
    gate) and TransNormer's SRMSNorm × u gate are all this op.  Example::

        >>> y = rms_norm_gate(o, g_norm.weight, 1e-6, gate=g, gate_act="swish")   # o, g (B, n, H, d) float16
    """
    _check_norm(x, weight, gate, gate_act)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if x.numel() == 0 or x.shape[-1] > _MAX_WIDTH or out_dtype not in _KERNEL_DTYPES \
            or not uses_kernels(x, weight, gate):
        return rms_norm_gate_torch(x, weight, eps, gate, gate_act, out_dtype)
    return _RmsNormGate.apply(x, weight, gate, float(eps), gate_act, out_dtype)


# ----------------------------------------------------------------------------- rotary

def rotary_torch(x: torch.Tensor, inv_freq: torch.Tensor, positions: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The PyTorch twin of :func:`rotary`: float32 angles position × inv_freq, the two halves rotated, × scale.

    ``x`` ``(B, n, H, dim)`` with ``positions`` ``(n,)`` or ``(1,)``, or ``(tokens, H, dim)`` with ``(tokens,)`` or
    ``(1,)``."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq.float()[None]          # [n or 1, dim/2]
    shape = (1, -1, 1, freqs.shape[-1]) if x.dim() == 4 else (-1, 1, freqs.shape[-1])
    cos, sin = torch.cos(freqs).view(shape), torch.sin(freqs).view(shape)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    xf = x.float()
    half = x.shape[-1] // 2
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


@triton.jit
def _row_positions(positions_ptr, o_row, i_token, m_row, offset, POSITIONS: tl.constexpr):
    """Each row's position as float32: 0 the token's index + offset, 1 ``positions[token]``, 2 ``positions[0]``
    for every row (rotary and LRPE alike)."""
    if POSITIONS == 0:
        b_pos = (i_token + offset).to(tl.float32)
    elif POSITIONS == 1:
        b_pos = tl.load(positions_ptr + i_token, mask=m_row, other=0).to(tl.float32)
    else:
        b_pos = tl.load(positions_ptr + o_row * 0, mask=m_row, other=0).to(tl.float32)
    return b_pos


@triton.jit(do_not_specialize=["rows", "seq_len", "offset", "x_batch_stride", "out_batch_stride"])
def _rotary_kernel(x_ptr, out_ptr, inv_freq_ptr, positions_ptr, rows, seq_len, offset, scale,
                   x_batch_stride, x_token_stride, x_head_stride, out_batch_stride, out_token_stride,
                   out_head_stride, HALF: tl.constexpr, POSITIONS: tl.constexpr, INVERSE: tl.constexpr,
                   BLOCK_ROWS: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """One head of BLOCK_ROWS (batch, token) rows: [x1, x2] ↦ scale · [x1 cos − x2 sin, x2 cos + x1 sin].

    POSITIONS: 0 the token's index + offset, 1 ``positions[token]``, 2 ``positions[0]`` for every row.
    INVERSE rotates by −angle (the backward)."""
    i_row, i_head = tl.program_id(0), tl.program_id(1)
    o_row = i_row * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    o_col = tl.arange(0, BLOCK_HALF)
    m_row = o_row < rows
    m_tile = m_row[:, None] & (o_col < HALF)[None, :]
    i_batch, i_token = (o_row // seq_len).to(tl.int64), (o_row % seq_len).to(tl.int64)
    b_pos = _row_positions(positions_ptr, o_row, i_token, m_row, offset, POSITIONS)
    b_inv_freq = tl.load(inv_freq_ptr + o_col, mask=o_col < HALF, other=0.)
    b_angle = b_pos[:, None] * b_inv_freq[None, :]                                 # [BLOCK_ROWS, BLOCK_HALF]
    b_cos, b_sin = tl.cos(b_angle) * scale, tl.sin(b_angle) * scale
    if INVERSE:
        b_sin = -b_sin
    p_x = x_ptr + i_batch[:, None] * x_batch_stride + i_token[:, None] * x_token_stride + i_head * x_head_stride \
        + o_col[None, :]
    b_x1 = tl.load(p_x, mask=m_tile, other=0.).to(tl.float32)
    b_x2 = tl.load(p_x + HALF, mask=m_tile, other=0.).to(tl.float32)
    p_out = out_ptr + i_batch[:, None] * out_batch_stride + i_token[:, None] * out_token_stride \
        + i_head * out_head_stride + o_col[None, :]
    tl.store(p_out, (b_x1 * b_cos - b_x2 * b_sin).to(out_ptr.dtype.element_ty), mask=m_tile)
    tl.store(p_out + HALF, (b_x2 * b_cos + b_x1 * b_sin).to(out_ptr.dtype.element_ty), mask=m_tile)


def _rotary_launch(x4, inv_freq, positions, offset, scale, mode, inverse):
    """Rotate ``x4`` ``(B, n, H, r)`` (last dimension contiguous) into a new contiguous tensor."""
    if x4.stride(-1) != 1:
        x4 = x4.contiguous()
    B, n, H, r = x4.shape
    out = torch.empty((B, n, H, r), dtype=x4.dtype, device=x4.device)
    rows = B * n
    if rows == 0 or H == 0:
        return out
    half = r // 2
    block_half = triton.next_power_of_2(half)
    block_rows = max(1, min(triton.next_power_of_2(rows), 2048 // block_half))
    _rotary_kernel[(triton.cdiv(rows, block_rows), H)](
        x4, out, inv_freq, positions if positions is not None else inv_freq, rows, n, offset, scale,
        x4.stride(0), x4.stride(1), x4.stride(2), out.stride(0), out.stride(1), out.stride(2),
        HALF=half, POSITIONS=mode, INVERSE=inverse, BLOCK_ROWS=block_rows, BLOCK_HALF=block_half, num_warps=4)
    return out


class _Rotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x4, inv_freq, positions, offset, scale, mode):
        ctx.save_for_backward(inv_freq, positions)
        ctx.offset, ctx.scale, ctx.mode = offset, scale, mode
        return _rotary_launch(x4, inv_freq, positions, offset, scale, mode, False)

    @staticmethod
    def backward(ctx, grad_out):
        inv_freq, positions = ctx.saved_tensors
        grad = _rotary_launch(grad_out, inv_freq, positions, ctx.offset, ctx.scale, ctx.mode, True)
        return grad, None, None, None, None, None


def rotary(x: torch.Tensor, inv_freq: torch.Tensor, *, offset: int = 0, positions: Optional[torch.Tensor] = None,
           scale: float = 1.0) -> torch.Tensor:
    """Rotary embedding of ``x`` (the two halves of each head rotated) times ``scale``, in one pass.

    Args:
        x: ``(batch, n, heads, dim)`` (positions ``offset … offset + n − 1``, or ``positions`` ``(n,)``) or
            ``(tokens, heads, dim)`` (``positions`` ``(tokens,)``: row i at ``positions[i]``); a one-element
            ``positions`` puts every row at that position.  Any strides (the last dimension contiguous, else
            it is copied).
        inv_freq: float32 ``(dim / 2,)``; the angles are float32 position × inv_freq, as
            :class:`~leettriton.nn.functional.RotaryTable`'s table.

    Returns a new contiguous tensor of x's shape and dtype.  Example::

        >>> b = rotary(q_proj(x).view(B, n, H, r), inv_freq, offset=0, scale=r ** -0.5)
    """
    if x.dim() not in (3, 4) or x.shape[-1] % 2 or x.shape[-1] != 2 * inv_freq.shape[-1]:
        raise ValueError(f"rotary: x must be (batch, n, heads, dim) or (tokens, heads, dim) with dim = 2 · "
                         f"len(inv_freq) = {2 * inv_freq.shape[-1]}, got shape {tuple(x.shape)}")
    x4 = x if x.dim() == 4 else x.unsqueeze(0)          # (tokens, H, dim) as one batch row of tokens
    n = x4.shape[1]
    if positions is None:
        if x.dim() != 4:
            raise ValueError("rotary: a (tokens, heads, dim) x needs positions")
    elif positions.dim() != 1 or positions.numel() not in (1, n) or positions.is_floating_point():
        raise ValueError(f"rotary: positions must be an integer tensor of shape ({n},) or (1,), got "
                         f"{positions.dtype} {tuple(positions.shape)}")
    if x.numel() == 0 or not uses_kernels(x, inv_freq) or (positions is not None and positions.device != x.device):
        if positions is None:
            positions = torch.arange(offset, offset + n, device=x.device)
        return rotary_torch(x, inv_freq, positions, scale)
    mode = 0 if positions is None else (2 if positions.numel() == 1 else 1)
    pos = positions.contiguous() if positions is not None else None
    out = _Rotary.apply(x4, inv_freq.float().contiguous(), pos, int(offset), float(scale), mode)
    return out.view(x.shape)


# ----------------------------------------------------------------------------- LRPE

def _check_positions(x4, positions):
    if positions is not None and (positions.dim() != 1 or positions.numel() not in (1, x4.shape[1])
                                  or positions.is_floating_point()):
        raise ValueError(f"positions must be an integer tensor of shape ({x4.shape[1]},) or (1,), got "
                         f"{positions.dtype} {tuple(positions.shape)}")


def lrpe_torch(x: torch.Tensor, theta: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The PyTorch twin of :func:`lrpe`: [x cos(t θ_h), x sin(t θ_h)] with float32 angles t × θ."""
    angle = positions.to(torch.float32)[:, None, None] * theta.float()[None]        # [n or 1, H, D]
    if x.dim() == 4:
        angle = angle[None]
    xf = x.float()
    return torch.cat((xf * torch.cos(angle), xf * torch.sin(angle)), dim=-1).to(x.dtype)


@triton.jit(do_not_specialize=["rows", "seq_len", "offset", "x_batch_stride", "out_batch_stride"])
def _lrpe_kernel(x_ptr, out_ptr, theta_ptr, positions_ptr, rows, seq_len, offset, x_batch_stride, x_token_stride,
                 x_head_stride, out_batch_stride, out_token_stride, out_head_stride, theta_head_stride,
                 DIM: tl.constexpr, POSITIONS: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_DIM: tl.constexpr):
    """One head of BLOCK_ROWS (batch, token) rows: x ↦ [x cos(t θ), x sin(t θ)] (positions as in rotary)."""
    i_row, i_head = tl.program_id(0), tl.program_id(1)
    o_row = i_row * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    o_col = tl.arange(0, BLOCK_DIM)
    m_row = o_row < rows
    m_tile = m_row[:, None] & (o_col < DIM)[None, :]
    i_batch, i_token = (o_row // seq_len).to(tl.int64), (o_row % seq_len).to(tl.int64)
    b_pos = _row_positions(positions_ptr, o_row, i_token, m_row, offset, POSITIONS)
    b_theta = tl.load(theta_ptr + i_head * theta_head_stride + o_col, mask=o_col < DIM, other=0.).to(tl.float32)
    b_angle = b_pos[:, None] * b_theta[None, :]                                    # [BLOCK_ROWS, BLOCK_DIM]
    b_x = tl.load(x_ptr + i_batch[:, None] * x_batch_stride + i_token[:, None] * x_token_stride
                  + i_head * x_head_stride + o_col[None, :], mask=m_tile, other=0.).to(tl.float32)
    p_out = out_ptr + i_batch[:, None] * out_batch_stride + i_token[:, None] * out_token_stride \
        + i_head * out_head_stride + o_col[None, :]
    tl.store(p_out, (b_x * tl.cos(b_angle)).to(out_ptr.dtype.element_ty), mask=m_tile)
    tl.store(p_out + DIM, (b_x * tl.sin(b_angle)).to(out_ptr.dtype.element_ty), mask=m_tile)


class _Lrpe(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x4, theta, positions, offset, mode):
        ctx.save_for_backward(x4, theta, positions)
        ctx.offset, ctx.mode = offset, mode
        if x4.stride(-1) != 1:
            x4 = x4.contiguous()
        B, n, H, D = x4.shape
        out = torch.empty((B, n, H, 2 * D), dtype=x4.dtype, device=x4.device)
        block_dim = triton.next_power_of_2(D)
        block_rows = max(1, min(triton.next_power_of_2(B * n), 2048 // block_dim))
        theta2 = theta.reshape(H, D)
        if theta2.stride(-1) != 1:
            theta2 = theta2.contiguous()
        _lrpe_kernel[(triton.cdiv(B * n, block_rows), H)](
            x4, out, theta2, positions if positions is not None else theta2, B * n, n, offset,
            x4.stride(0), x4.stride(1), x4.stride(2), out.stride(0), out.stride(1), out.stride(2), theta2.stride(0),
            DIM=D, POSITIONS=mode, BLOCK_ROWS=block_rows, BLOCK_DIM=block_dim, num_warps=4)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x4, theta, positions = ctx.saved_tensors
        if positions is None:
            positions = torch.arange(ctx.offset, ctx.offset + x4.shape[1], device=x4.device)
        grads = _recomputed_grads(lambda x, th: lrpe_torch(x, th.reshape(x.shape[2], x.shape[3]), positions),
                                  [x4, theta], grad_out)
        return grads[0], grads[1], None, None, None


def lrpe(x: torch.Tensor, theta: torch.Tensor, *, offset: int = 0,
         positions: Optional[torch.Tensor] = None) -> torch.Tensor:
    """TransNormerLLM's linearised relative position encoding, x ↦ [x cos(t θ_h), x sin(t θ_h)], in one pass.

    Args:
        x: ``(batch, n, heads, D)`` (positions ``offset … offset + n − 1``, or ``positions`` ``(n,)``) or
            ``(tokens, heads, D)`` (``positions`` ``(tokens,)``); a one-element ``positions`` puts every row at
            that position.  Any strides.
        theta: the frequencies, ``heads · D`` values (``(heads, 1, D)`` as the layer keeps them, or ``(heads, D)``).

    Returns a new contiguous ``(..., heads, 2D)`` tensor in x's dtype; the angles are float32 t × θ.
    Differentiable in x and θ.  Example::

        >>> b = lrpe(silu(q_proj(x).view(B, n, H, D)), layer.lrpe.theta, offset=0)
    """
    if x.dim() not in (3, 4) or theta.numel() != x.shape[-2] * x.shape[-1]:
        raise ValueError(f"lrpe: x must be (batch, n, heads, D) or (tokens, heads, D) with heads · D = "
                         f"theta.numel() = {theta.numel()}, got shape {tuple(x.shape)}")
    x4 = x if x.dim() == 4 else x.unsqueeze(0)
    if positions is None and x.dim() != 4:
        raise ValueError("lrpe: a (tokens, heads, D) x needs positions")
    _check_positions(x4, positions)
    theta2 = theta.reshape(x.shape[-2], x.shape[-1])
    if x.numel() == 0 or not uses_kernels(x, theta) or (positions is not None and positions.device != x.device):
        if positions is None:
            positions = torch.arange(offset, offset + x4.shape[1], device=x.device)
        return lrpe_torch(x, theta2, positions)
    mode = 0 if positions is None else (2 if positions.numel() == 1 else 1)
    out = _Lrpe.apply(x4, theta, positions.contiguous() if positions is not None else None, int(offset), mode)
    return out.view(*x.shape[:-1], 2 * x.shape[-1])


# ----------------------------------------------------------------------------- SwiGLU

def swiglu_torch(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The PyTorch twin of :func:`swiglu`: swish(gate) · up in float32, rounded once to gate's dtype."""
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


@triton.jit
def _swiglu_kernel(gate_ptr, up_ptr, out_ptr, width, gate_row_stride, up_row_stride, out_row_stride,
                   BLOCK_WIDTH: tl.constexpr):
    """out[row, cols] = gate · sigmoid(gate) · up for one row and BLOCK_WIDTH columns."""
    i_row, i_col = tl.program_id(0).to(tl.int64), tl.program_id(1)
    o_col = i_col * BLOCK_WIDTH + tl.arange(0, BLOCK_WIDTH)
    m_col = o_col < width
    b_gate = tl.load(gate_ptr + i_row * gate_row_stride + o_col, mask=m_col, other=0.).to(tl.float32)
    b_up = tl.load(up_ptr + i_row * up_row_stride + o_col, mask=m_col, other=0.).to(tl.float32)
    b_out = b_gate * tl.sigmoid(b_gate) * b_up
    tl.store(out_ptr + i_row * out_row_stride + o_col, b_out.to(out_ptr.dtype.element_ty), mask=m_col)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        width = gate.shape[-1]
        g2, u2 = _rows(gate, width), _rows(up, width)
        out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
        if g2.shape[0] and width:
            block = min(1024, triton.next_power_of_2(width))
            _swiglu_kernel[(g2.shape[0], triton.cdiv(width, block))](
                g2, u2, out, width, g2.stride(0), u2.stride(0), width, BLOCK_WIDTH=block, num_warps=4)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        gate, up = ctx.saved_tensors
        return tuple(_recomputed_grads(swiglu_torch, [gate, up], grad_out))


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """swish(gate) · up (the gated MLP's product) in one pass, float32 inside, in gate's dtype.

    ``gate`` and ``up``: the same shape and dtype, any strides.  Example::

        >>> h = down_proj(swiglu(gate_proj(x), up_proj(x)))
    """
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"swiglu: gate and up must have the same shape and dtype, got {tuple(gate.shape)} "
                         f"{gate.dtype} and {tuple(up.shape)} {up.dtype}")
    if gate.dim() == 0 or gate.numel() == 0 or not uses_kernels(gate, up):
        return swiglu_torch(gate, up)
    return _SwiGLU.apply(gate, up)
