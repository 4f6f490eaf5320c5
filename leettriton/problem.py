"""The bottom layer: validation, layouts and gamma handling, and the :class:`Problem` every method receives.

Nothing here imports another module of the package.  Every public entry point
validates its call here once, before any work: a bad argument raises
``TypeError``/``ValueError`` naming the argument, what was expected and what was
given (docs/design.md §1, §2).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
import os
import weakref
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

import torch

__all__ = [
    "Problem", "make_problem", "check_tensor", "check_gamma_values", "check_token_triple", "check_dims", "check_device", "resolve_gamma", "type_name",
    "to_bhnd", "new_empty", "new_like", "output_template", "requires_grad", "check_autograd", "check_constant_gamma", "MAX_DIM", "DTYPES",
    "LAYOUTS", "PRECISIONS", "check_index", "check_pool", "check_slot_values", "check_cu_seqlens_values",
    "INDEX_DTYPES", "VarlenProblem", "make_varlen_problem", "packed", "device_guards_only", "log2_gamma64",
    "index_as_read", "check_own_memory", "check_unshared", "byte_extent", "resolve_log_decay", "check_log_decay_values",
    "check_heads", "expand_heads",
]

MAX_DIM = 1024
"""Largest r and d the kernels support (non powers of two are masked)."""

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LAYOUTS = ("bhnd", "bnhd")
PRECISIONS = ("ieee", "tf32")
DEVICE_TYPES = ("cpu", "cuda")


@dataclass
class Problem:
    """One validated call, as every method implementation receives it.

    Tensors are views in ``(batch, heads, n, dim)`` order with the caller's
    strides (the ``bnhd`` layout is a transposed view, not a copy).

    Attributes:
        b, c: ``(B, H_b, n, r)``, ``(B, H_c, n, r)`` views.
        v: ``(B, H_v, n, d)`` view.  Each head count divides H, the output's (:attr:`shape`): output head h
            reads head h // (H / H_x) of each (grouped heads, docs/design.md §1.7); the public calls give b and c
            one head count.  Everything else (γ, the states, the decay, the output) is per output head.
        gamma: ``(H,)`` contiguous γ per head on the inputs' device, in the caller's
            float dtype, a view of the caller's tensor where it can be (the kernels read γ itself and compute
            λ = log2 γ in float64: docs/design.md §2), or ``None`` when there is
            no decay (γ = 1 for every head).
        initial_state: ``(B, H, r, d)`` float32 or ``None`` (zero state).
        out: ``(B, H, n, d)`` view of the output the method must fill (dtype of v).
        state: ``(B, H, r, d)`` float32 the method must fill with the final state,
            or ``None`` when the caller did not ask for it.
        precision: ``"ieee"`` or ``"tf32"``: how float32 products are done
            (16-bit inputs always use tensor cores with float32 accumulation).
        memo: None, or a dictionary shared by every call of one signature (shapes, strides, dtypes,
            devices, flags, γ's kind, method: docs/design.md §4.5), where a launcher may keep what it
            derives from those alone (its direct launches) for the next call of the signature.
        reverse: the problem runs backwards in time (docs/design.md §10.3): its row t is row n − 1 − t
            of each of b, c, v and out (the states are not rows, and are as they are).  The kernels
            address the rows so (kernels/abi.py, ``problem_args``); only a method whose ``Method``
            says ``runs_reversed`` may receive such a problem (plan.py, ``run_reversed``).
        two_part: bfloat16 inputs: the chunk walk and the segment-state kernel round each float32
            operand they form (the state before its product with b, the decayed values before the
            state update) to two bfloat16 parts, hi + lo, each a product of its own, where one
            rounding would keep 8 significant bits (docs/design.md §10.4).  The backward's calls set it;
            other kernels, and other dtypes, ignore it.
        r_piece: one piece of a wider r (kernels/pieces.py, which sets it): its masked scores are partial sums
            over its keys, and the chunk walk rounds them to 16 bits in two parts, where one rounding per
            piece would add up to more error than one of the whole score (docs/design.md §1.5).
        log_decay: the per-token decay a_t ≤ 0 (natural log), a ``(B, H, n)`` view of the caller's tensor
            with its strides (the ``bnhd`` layout's is transposed, not copied), float32 or the inputs'
            dtype, or None; with it :attr:`gamma` is None (docs/design.md §1.6).
    """

    b: torch.Tensor
    c: torch.Tensor
    v: torch.Tensor
    gamma: Optional[torch.Tensor]
    initial_state: Optional[torch.Tensor]
    out: torch.Tensor
    state: Optional[torch.Tensor]
    precision: str
    memo: Optional[dict] = field(default=None, repr=False, compare=False)
    reverse: bool = False
    two_part: bool = False
    r_piece: bool = False
    log_decay: Optional[torch.Tensor] = None

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """``(batch, heads, n, r, d)`` (read once per b, c and v: a call's stages all ask for it).  ``heads`` is
        the output's: the most of b's, c's and v's head counts, each of which divides it (grouped heads,
        docs/design.md §1.7)."""
        known = self.__dict__.get("_shape")
        if known is not None and known[0] is self.b and known[1] is self.v and known[2] is self.c:
            return known[3]
        B, H, n, r = self.b.shape
        H = max(H, self.c.shape[1], self.v.shape[1])
        shape = B, H, n, r, self.v.shape[-1]
        self.__dict__["_shape"] = (self.b, self.v, self.c, shape)
        return shape

    @property
    def groups(self) -> tuple[int, int, int]:
        """How many output heads read each head of b, c and v: ``heads // `` each one's head count (1 where the
        tensor has a head per output head; docs/design.md §1.7)."""
        H = self.shape[1]
        return tuple(H // x.shape[1] if x.shape[1] else 1 for x in (self.b, self.c, self.v))

    @property
    def grouped(self) -> bool:
        """b, c or v has fewer heads than the output (grouped heads, docs/design.md §1.7)."""
        return self.groups != (1, 1, 1)

    def repeat_launch(self, mark: tuple, extra: tuple = ()) -> bool:
        """Launch again what an earlier call of this problem's signature kept in :attr:`memo` under ``mark``
        (:meth:`keep_launch`; docs/design.md §4.5), on this call's tensors: b, c, v, out, γ, the initial and the
        final state (``out`` standing in for those absent), then ``extra``, the launcher's own.  True when it
        launched; False when nothing is kept, what is kept does not hold for this call (the caller then launches
        through its compiled launches), or the problem is reversed: its rows are addressed through other
        pointers than its tensors' (``problem_args``), so it never repeats.

        The memo's signature fixes every argument but the tensors; ``mark`` names the launcher's kernel and what
        it derives besides.  The key adds what a sub-problem sharing the memo may change (:meth:`_variant`)."""
        memo = self.memo
        if memo is None or self.reverse:
            return False
        again = memo.get(mark + self._variant())
        if again is None:
            return False
        out = self.out
        return again((self.b, self.c, self.v, out, out if self.gamma is None else self.gamma,
                      out if self.initial_state is None else self.initial_state,
                      out if self.state is None else self.state) + extra)

    def keep_launch(self, mark: tuple, launch) -> None:
        """Keep ``launch`` (what ``CompiledLaunches.launch_args`` returned: a Launch taking the tensors of
        :meth:`repeat_launch`, or None) in :attr:`memo` under ``mark`` for the next call of the signature."""
        if self.memo is not None and launch is not None and not self.reverse:
            self.memo[mark + self._variant()] = launch

    def _variant(self) -> tuple:
        """What may differ between the problems that share one signature's memo, part of every kept launch's key:
        a method derives sub-problems of other shapes from the caller's (pieces of r, with a float32 output
        buffer between them, kernels/pieces.py; blocks of batch elements and heads, methods/recursion), each
        with or without its initial and final state.  Their other strides are the caller's."""
        return (self.shape, self.out.dtype, self.out.stride(), self.initial_state is None, self.state is None,
                None if self.log_decay is None else self.log_decay.stride())

    def rows(self, start: int, stop: int) -> "Problem":
        """The sub-problem of rows [start, stop) of this problem (views, no copies; the states as they are).

        For a reversed problem those are rows [n − stop, n − start) of its tensors, still reversed."""
        n = self.b.shape[2]
        lo, hi = (n - stop, n - start) if self.reverse else (start, stop)
        ld = None if self.log_decay is None else self.log_decay[:, :, lo:hi]
        return replace(self, b=self.b[:, :, lo:hi], c=self.c[:, :, lo:hi], v=self.v[:, :, lo:hi],
                       out=self.out[:, :, lo:hi], log_decay=ld)

    @property
    def has_decay(self) -> bool:
        """A constant decay per head (γ); the per-token decay is :attr:`per_token`."""
        return self.gamma is not None

    @property
    def per_token(self) -> bool:
        """The problem has a per-token decay (:attr:`log_decay`)."""
        return self.log_decay is not None

    @property
    def log2_gamma(self) -> Optional[torch.Tensor]:
        """λ = log2 γ, float32 ``(H,)`` (computed in float64 from :attr:`gamma` at each access), or None:
        for the PyTorch paths; the kernels read :attr:`gamma` itself.  NaN for a γ outside (0, 1], as the
        kernels' λ (:func:`log2_gamma64`; docs/design.md §2.6)."""
        if self.gamma is None:
            return None
        return log2_gamma64(self.gamma).float()


@dataclass
class VarlenProblem(Problem):
    """A packed batch of variable-length sequences (docs/design.md §13.2), as the packed walk receives it.

    ``b``, ``c``, ``v``, ``out`` are ``(1, H, T, dim)`` views of the caller's ``(T, H, dim)`` tensors (no
    copies); ``initial_state`` is the state pool when some sequence starts from its slot (else None);
    ``state`` is the pool, or the ``(N, H, r, d)`` returned states, or None.

    Attributes:
        cu_seqlens: ``(N + 1,)`` int32/int64: sequence i is rows [cu_seqlens[i], cu_seqlens[i + 1]).
        slot_ids: ``(N,)`` int32/int64 pool slot of each sequence (negative: none), or None (no pool).
        has_initial: ``(N,)`` flags: sequence i starts from its slot's state, or None (every one from zero).
        pool_slots: the pool's number of slots (0 without one).
        checkpoint_every: K, a positive multiple of :data:`CHECKPOINT_ALIGN`: sequence i's state after each K-th
            of its rows is written to the pool (0: no checkpoints; docs/design.md §13.9).
        checkpoint_slots: ``(N, M)`` int32/int64, contiguous: sequence i's j-th checkpoint (its state after
            (j + 1)·K rows) goes to pool slot ``checkpoint_slots[i, j]`` (negative: not written), or None.
    """

    cu_seqlens: Optional[torch.Tensor] = None
    slot_ids: Optional[torch.Tensor] = None
    has_initial: Optional[torch.Tensor] = None
    pool_slots: int = 0
    checkpoint_every: int = 0
    checkpoint_slots: Optional[torch.Tensor] = None

    @property
    def num_seqs(self) -> int:
        return self.cu_seqlens.shape[0] - 1


# --------------------------------------------------------------------------- errors

def type_name(x) -> str:
    """How an argument is described in error messages."""
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return f"{type(x).__name__} {x!r}" if isinstance(x, (numbers.Number, str)) else type(x).__name__


def check_tensor(name: str, x, device_types=DEVICE_TYPES) -> torch.Tensor:
    """``x`` must be a float16/bfloat16/float32 tensor on a CPU or CUDA device."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type_name(x)}")
    if x.dtype not in DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got dtype {x.dtype}")
    check_device(name, x, device_types)
    return x


def check_device(name: str, x: torch.Tensor, device_types=DEVICE_TYPES) -> None:
    if x.device.type not in device_types:
        raise ValueError(f"{name} must be on a CPU or CUDA device, got a tensor on {x.device} "
                         f"(leettriton runs Triton kernels on CUDA and PyTorch code on the CPU)")


def check_token_triple(names: tuple[str, str, str], b, c, v, axes: str, lead: str):
    """Check three 3-D tensors ``(lead, heads, dim)`` read as b, c and v (decode's tokens, packed prefill's
    rows): float tensors on one device, one dtype, c shaped as b, v matching b but in its last dimension.
    ``axes`` describes the three dimensions in errors, ``lead`` what v must share with b.
    Returns ``(b, c, v)`` and the sizes ``(lead, heads, r, d)``."""
    nb, nc, nv = names
    b, c, v = check_tensor(nb, b), check_tensor(nc, c), check_tensor(nv, v)
    for name, x in ((nb, b), (nc, c), (nv, v)):
        if x.dim() != 3:
            raise ValueError(f"{name} must be 3-D {axes}, got shape {tuple(x.shape)}")
    if not (b.dtype == c.dtype == v.dtype):
        raise TypeError(f"{nb}, {nc} and {nv} must share one dtype, got {b.dtype}, {c.dtype}, {v.dtype}")
    if not (b.device == c.device == v.device):
        raise ValueError(f"{nb}, {nc} and {nv} must be on one device, got {b.device}, {c.device}, {v.device}")
    n, H, r = b.shape
    if (c.shape[0], c.shape[2]) != (n, r):
        raise ValueError(f"{nc} must have the shape of {nb} {tuple(b.shape)}, got {tuple(c.shape)}")
    if v.shape[0] != n:
        raise ValueError(f"{nv} must match {nb} in {lead}: {nb} has shape {tuple(b.shape)}, {nv} has "
                         f"shape {tuple(v.shape)}")
    H = check_heads(names, (H, c.shape[1], v.shape[1]),
                    f"{nc} must have the shape of {nb} {tuple(b.shape)}, got {tuple(c.shape)}",
                    f"{nv} must match {nb} in {lead}: {nb} has shape {tuple(b.shape)}, {nv} has shape {tuple(v.shape)}")
    return (b, c, v), (n, H, r, v.shape[-1])


def check_heads(names: tuple[str, str, str], heads: tuple[int, int, int], c_message: str, v_message: str) -> int:
    """The output's head count for b, c and v of ``heads`` heads (named ``names``): the most of them, each of
    which must divide it (grouped heads, docs/design.md §1.7: b and c with H_k heads and v with H_v, one of H_k and
    H_v a multiple of the other; b and c may even differ).  Otherwise a ValueError before any work, which starts
    with ``c_message`` where b's and c's counts do not divide one another, else with ``v_message``, and names
    every count."""
    H = max(heads)
    if all(x == H or (x > 0 and H % x == 0) for x in heads):
        return H
    hb, hc, _ = heads
    apart = not (hb == hc or (hb and hc and (hb % hc == 0 or hc % hb == 0)))
    nb, nc, nv = names
    raise ValueError(f"{c_message if apart else v_message}; grouped heads need head counts that divide one "
                     f"another ({nb} and {nc} with H_k heads, {nv} with H_v, one of H_k and H_v a multiple of the "
                     f"other), got {nb} with {heads[0]} heads, {nc} with {heads[1]} and {nv} with {heads[2]}")


def expand_heads(x: torch.Tensor, heads: int, dim: int = 1) -> torch.Tensor:
    """``x`` with each of its heads (dimension ``dim``) repeated for the output heads that read it: ``x`` itself
    when it has ``heads`` heads, else a new tensor (``repeat_interleave``, differentiable: its gradient sums
    each group).  For the PyTorch paths and the oracle (docs/design.md §1.7); the kernels read groups as they are."""
    h = x.shape[dim]
    if h == heads:
        return x
    return x.repeat_interleave(heads // h, dim=dim)


def check_dims(r: int, d: int, where: str) -> None:
    for label, size in (("r (last dim of b and c)", r), ("d (last dim of v)", d)):
        if size > MAX_DIM:
            raise NotImplementedError(
                f"{where}: {label} = {size} exceeds the supported maximum of {MAX_DIM}")
        if size < 1:
            raise ValueError(f"{where}: {label} must be at least 1, got {size}")


def check_bool(name: str, x) -> None:
    if not isinstance(x, bool):
        raise TypeError(f"{name} must be a bool, got {type_name(x)}")


def check_state(name: str, state, shape: tuple, device: torch.device, optional: bool = False) -> None:
    """A float32 state of ``shape`` on ``device`` (``optional``: None was allowed, and the message says so)."""
    if not isinstance(state, torch.Tensor):
        what = "None or a torch.Tensor" if optional else "a torch.Tensor"
        raise TypeError(f"{name} must be {what}, got {type_name(state)}")
    if state.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got dtype {state.dtype}")
    if tuple(state.shape) != shape:
        raise ValueError(f"{name} must have shape (batch, heads, r, d) = {shape}, got {tuple(state.shape)}")
    if state.device != device:
        raise ValueError(f"{name} must be on the inputs' device {device}, got {state.device}")


def requires_grad(*tensors) -> bool:
    """Whether grad mode is on and one of ``tensors`` requires grad (a gradient will be asked for)."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def check_autograd(where: str, *tensors) -> None:
    """Refuse a call of an entry point without a backward (``where``) whose inputs require grad."""
    if requires_grad(*tensors):
        raise RuntimeError(
            f"{where} computes the forward pass only: an input requires grad, but {where} has no backward. "
            f"Run under torch.no_grad() / torch.inference_mode(), or detach the inputs.")


def check_constant_gamma(gamma) -> None:
    """γ is a constant here: a gamma tensor that requires grad (with grad mode on) is refused, naming the feature
    (by the entry points without a decay gradient: decode, varlen, the oracle; linear_attention has one)."""
    if requires_grad(gamma):
        raise NotImplementedError(
            "gamma requires grad, but this entry point treats the decay γ as a constant: gradients with respect "
            "to gamma (a learnable decay) are not implemented. Pass gamma.detach() (gradients still flow to b, c, v "
            "and initial_state); linear_attention itself differentiates a learnable gamma.")


# --------------------------------------------------------------------------- gamma

class _CheckedTensors:
    """Which tensors have had their values checked, so a CUDA tensor costs one sync per version.

    Only the *check* is remembered: the kernels always read the values from the tensor
    itself, so a write that bypasses the version counter (``.data``, a NumPy
    view) can never leave a call running with old values.  For γ, a value outside (0, 1]
    written that way makes the kernels' λ NaN, and the λ of the ``_torch`` methods, of the packed and
    sequence-parallel PyTorch paths and of the backward's own terms too (:func:`log2_gamma64`), so the
    output is NaN rather than silently wrong (docs/design.md §2.6); for slot ids and sequence offsets the kernels clamp what they read
    (docs/design.md §13.3).  ``remember_unversioned``: whether a tensor without a version
    counter (an inference tensor) is remembered too (γ: yes, it is rarely rewritten; indices: no,
    a server rewrites them every step).  ``remember_cpu``: whether a CPU tensor is remembered under
    the interpreter, whose kernels and PyTorch methods guard as the GPU's do (γ: yes); outside it a CPU
    tensor feeds PyTorch code without that guard everywhere (the decode steps' PyTorch form multiplies
    by γ itself), and is checked on every call.
    """

    def __init__(self, remember_unversioned: bool = True, remember_cpu: bool = False) -> None:
        self._seen: dict[int, tuple] = {}
        self._remember_unversioned = remember_unversioned
        self._remember_cpu = remember_cpu

    @staticmethod
    def _version(g: torch.Tensor):
        try:
            return g._version
        except RuntimeError:  # inference tensors track no version
            return None

    def seen(self, g: torch.Tensor, context=None) -> bool:
        """Whether ``g`` passed a check against ``context`` (what else the check read) at its current version."""
        hit = self._seen.get(id(g))
        if hit is None or hit[0]() is not g:
            return False
        try:
            version = g._version
        except RuntimeError:  # inference tensors track no version
            version = None
        return hit[1] == version and hit[2] == g.data_ptr() and hit[3] == context

    def remember(self, g: torch.Tensor, context=None) -> None:
        if g.device.type == "cpu" and not (self._remember_cpu and _interpreting()):
            return  # checked again on every call
        version = self._version(g)
        if version is None and not self._remember_unversioned:
            return
        key = id(g)
        self._seen[key] = (weakref.ref(g, lambda _r, k=key: self._seen.pop(k, None)), version, g.data_ptr(), context)

    def check(self, g: torch.Tensor) -> None:
        """γ's values: in (0, 1], no NaN."""
        if self.seen(g) or _GUARDS_ONLY.get():
            return
        flat = g.detach().reshape(-1)
        if flat.device.type == "cpu":  # checked on every call: a few values, read in Python
            values = flat.tolist()
            good = not values or (0.0 < min(values) and max(values) <= 1.0 and not math.isnan(sum(values)))
        else:  # one device->host transfer for every check
            good = bool(((flat > 0) & (flat <= 1)).all())
        if not good:
            bad_nan, bad_low = bool(torch.isnan(flat).any()), bool((flat <= 0).any())
            what = "NaN" if bad_nan else ("≤ 0" if bad_low else "> 1")
            raise ValueError(f"gamma must hold values in (0, 1], got a value {what} in {type_name(g)}")
        self.remember(g)


_CHECKED = _CheckedTensors(remember_cpu=True)
_GUARDS_ONLY = contextvars.ContextVar("leettriton_guards_only", default=False)


@contextlib.contextmanager
def device_guards_only():
    """Within it, γ's values are not checked: the kernels' own guard stands in for the check, as in a
    compiled region (docs/design.md §4.6; the index checks have their own switches)."""
    token = _GUARDS_ONLY.set(True)
    try:
        yield
    finally:
        _GUARDS_ONLY.reset(token)


def _interpreting() -> bool:
    """Whether Triton's kernels run in the CPU interpreter (read where a check is remembered, not per call)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_FLOAT_GAMMAS: dict[tuple, torch.Tensor] = {}


def check_gamma_values(gamma: torch.Tensor) -> None:
    """γ's values in (0, 1] (no NaN), for a tensor whose shape, dtype and device passed
    :func:`resolve_gamma`: one device sync on CUDA, once per tensor version; a CPU tensor's few values are
    read on every call outside the interpreter (docs/design.md §2.6)."""
    checked = _CHECKED
    if not checked.seen(gamma):  # (a repeated call's case, without check's own frame)
        checked.check(gamma)


def log2_gamma64(gamma: torch.Tensor, device: Optional[torch.device] = None) -> torch.Tensor:
    """λ = log2 γ in float64 on ``device`` (default: γ's), NaN for every γ outside (0, 1] (NaN included).

    What the PyTorch paths compute λ with: the guard of the kernels' ``log2_float64`` (docs/design.md §2.6),
    so a γ rewritten after its check (behind its version counter) gives NaN outputs there too, never finite
    wrong ones.  A device operation: no sync."""
    g = gamma.detach().to(device=device if device is not None else gamma.device, dtype=torch.float64)
    return torch.where((g > 0) & (g <= 1), torch.log2(g), float("nan"))


def _float_gamma(g: float, heads: int, device: torch.device) -> torch.Tensor:
    """A float64 ``(heads,)`` tensor of ``g`` on ``device``, cached by value (it can never go stale)."""
    if not isinstance(heads, int):   # a symbolic size while tracing: a tensor of the trace, never cached
        return torch.full((heads,), g, dtype=torch.float64, device=device)
    key = (g, heads, device)
    hit = _FLOAT_GAMMAS.get(key)
    if hit is None:
        hit = torch.full((heads,), g, dtype=torch.float64, device=device)
        if type(hit) is torch.Tensor:   # never one made under torch.compile's fake mode: it holds no data
            if len(_FLOAT_GAMMAS) > 256:
                _FLOAT_GAMMAS.clear()
            _FLOAT_GAMMAS[key] = hit
    return hit


def resolve_gamma(gamma, heads: int, device: torch.device, layout_hint="") -> Optional[torch.Tensor]:
    """Validate ``gamma`` and return the ``(heads,)`` tensor the kernels read, or None for no decay.

    ``layout_hint`` (a str, or a function that returns one, called only for the message) is added to a
    shape error when the inputs' shapes would fit the other layout.
    """
    if gamma is None:
        return None
    if isinstance(gamma, bool) or not isinstance(gamma, (numbers.Real, torch.Tensor)):
        raise TypeError(f"gamma must be None, a float or a tensor of shape ({heads},) or ({heads}, 1), "
                        f"got {type_name(gamma)}")
    if isinstance(gamma, torch.Tensor):
        if not gamma.is_floating_point():
            raise TypeError(f"gamma must be a floating-point tensor, got dtype {gamma.dtype}")
        if tuple(gamma.shape) not in ((heads,), (heads, 1)):
            hint = layout_hint() if callable(layout_hint) else layout_hint
            raise ValueError(f"gamma must have shape ({heads},) or ({heads}, 1) (one γ per head), "
                             f"got shape {tuple(gamma.shape)}{hint}")
        if gamma.device != device:
            raise ValueError(f"gamma must be on the inputs' device {device}, got {gamma.device}")
        _CHECKED.check(gamma)
        if gamma.dim() == 1 and gamma.is_contiguous():
            return gamma  # the kernels only read it (a gamma that requires grad was refused before)
        return gamma.detach().reshape(heads).contiguous()  # a copy only for a strided gamma: made per call
    g = float(gamma)
    if math.isnan(g) or not (0.0 < g <= 1.0):
        raise ValueError(f"gamma must lie in (0, 1], got {g!r}")
    return None if g == 1.0 else _float_gamma(g, heads, device)


# --------------------------------------------------------------------------- indices (docs/design.md §13.3)

INDEX_DTYPES = (torch.int32, torch.int64)
_CHECKED_INDICES = _CheckedTensors(remember_unversioned=False, remember_cpu=True)


def check_index(name: str, x, length: Optional[int], device: torch.device, what: str) -> torch.Tensor:
    """A 1-D int32/int64 tensor on ``device`` (of ``length`` entries unless None); ``what`` says what
    its entries are, for the message."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a 1-D int32 or int64 tensor ({what}), got {type_name(x)}")
    if x.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64 ({what}), got dtype {x.dtype}")
    if x.dim() != 1 or (length is not None and x.shape[0] != length):
        want = f"({length},)" if length is not None else "1-D"
        raise ValueError(f"{name} must have shape {want} ({what}), got shape {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} must be on the inputs' device {device}, got {x.device}")
    return x


def check_pool(name: str, pool, heads: int, r: int, d: int, device: torch.device) -> None:
    """A float32 state pool ``(slots, heads, r, d)`` on ``device``."""
    if not isinstance(pool, torch.Tensor):
        raise TypeError(f"{name} must be a float32 torch.Tensor of shape (slots, heads, r, d), got {type_name(pool)}")
    if pool.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got dtype {pool.dtype}")
    if pool.dim() != 4 or tuple(pool.shape[1:]) != (heads, r, d):
        raise ValueError(f"{name} must have shape (slots, heads, r, d) = (slots, {heads}, {r}, {d}), "
                         f"got {tuple(pool.shape)}")
    if pool.device != device:
        raise ValueError(f"{name} must be on the inputs' device {device}, got {pool.device}")


def index_as_read(x):
    """An index tensor (slot ids, sequence offsets, flags) as the kernels read it: contiguous.

    The kernels read an index tensor as contiguous memory, entry i at element i from its first, so a
    strided one (``ids[::2]``, an expanded view) is copied here, once per call, and every check of its
    values then reads the copy the kernels read (docs/design.md §13.3).  A contiguous tensor is returned
    as it is (no copy, no device work); anything else (not a tensor) is returned for the checks to name.
    Every entry point calls this before it computes a repeated call's signature (docs/design.md §4.5),
    so a signature's launch is only ever repeated with contiguous indices.  A strided index tensor is
    thus a copy per call and, on CUDA, a value check (one sync) per call: pass contiguous ones."""
    if isinstance(x, torch.Tensor) and not x.is_contiguous():
        return x.contiguous()
    return x


def _overlap_reason(x: torch.Tensor) -> Optional[str]:
    """Why two elements of ``x`` may share memory, or None when its strides show they cannot (each
    stride, smallest first, at least the span of the dimensions of smaller strides)."""
    if x.is_contiguous() or x.numel() <= 1:
        return None
    span = 1
    for stride, size, dim in sorted((x.stride(i), x.shape[i], i) for i in range(x.dim()) if x.shape[i] > 1):
        if stride == 0:
            return f"dim {dim} (size {size}) has stride 0, so its {size} entries are one element (an expanded view)"
        if stride < span:
            return (f"dim {dim} (size {size}) has stride {stride}, less than the {span} elements the dimensions "
                    f"of smaller strides span, so entries may share memory")
        span += stride * (size - 1)
    return None


def check_own_memory(name: str, x: torch.Tensor) -> None:
    """``x`` is written in place (a state, a pool, an output): no two of its elements may share memory.

    An expanded or otherwise self-overlapping tensor would have one element written for several (a
    state updated once per row that shares it, or one slot's write changing every slot), so it is
    refused with a ValueError before any work (docs/design.md §13.3).  A layout whose strides cannot
    show that its elements are apart (each stride, smallest first, at least the span of the smaller
    ones: true of every contiguous, permuted, sliced or padded tensor) is refused too.  Read-only
    inputs may overlap (an expanded b, c, v or initial state is read correctly).  Depends on the
    shape and strides alone: a repeated call's signature holds them, so it runs once per signature."""
    reason = _overlap_reason(x)
    if reason is not None:
        raise ValueError(f"{name} is written in place, so its elements must not overlap in memory: got a "
                         f"{x.dtype} tensor of shape {tuple(x.shape)} with strides {tuple(x.stride())}, whose "
                         f"{reason}; pass a tensor with memory of its own per element (e.g. torch.zeros of "
                         f"that shape, or .clone())")


_tracing: Callable[[], bool] = getattr(torch.compiler, "is_compiling", lambda: False)


def byte_extent(x: torch.Tensor) -> int:
    """The bytes ``x``'s elements span from ``x.data_ptr()`` (0 for an empty tensor); depends on the shape,
    strides and dtype alone, so a repeated call keeps it with its signature."""
    if x.numel() == 0:
        return 0
    return (sum((size - 1) * stride for size, stride in zip(x.shape, x.stride())) + 1) * x.element_size()


def check_unshared(name: str, x: torch.Tensor, reads, extent: Optional[int] = None) -> None:
    """``x``, written in place, must not share memory with any tensor the call reads: ``reads`` holds
    ``(name, tensor or None)`` pairs, or ``(name, tensor or None, byte_extent)`` triples (a repeated
    call's, kept with its signature: then this reads two pointers per pair and nothing else).

    A state that is a view of the inputs (or of γ, or of the indices) would be read after some program
    wrote it (the kernels update it in place while others still read their inputs), so the answer would
    depend on the order programs run in: refused with a ValueError before any work.  The test is on
    the address ranges the tensors span, so two views interleaved in one buffer are refused too
    (docs/design.md §13.3).  Not while ``torch.compile`` traces, where addresses are not known (§4.6)."""
    if _tracing():
        return
    size = byte_extent(x) if extent is None else extent
    if not size:
        return
    lo = x.data_ptr()
    hi = lo + size
    for entry in reads:
        other = entry[1]
        if other is None:
            continue
        span = entry[2] if len(entry) > 2 else byte_extent(other)
        if not span:
            continue
        start = other.data_ptr()
        if start < hi and lo < start + span:
            raise ValueError(f"{name} is written in place, so it must not share memory with {entry[0]}, which "
                             f"the call reads: got {entry[0]} ({type_name(other)}) in memory that {name} "
                             f"({type_name(x)}) also spans; pass tensors with memory of their own")


def _capturing(x: torch.Tensor) -> bool:
    return x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def check_slot_values(name: str, slot_ids: torch.Tensor, slots: int, check: bool) -> None:
    """Slot ids below ``slots`` (negative: padding), no slot twice.  Reading them costs one device sync
    on CUDA: done once per tensor version, never while a CUDA graph is being captured, and not at all
    when ``check`` is False (docs/design.md §13.3)."""
    if not check or slot_ids.numel() == 0 or _CHECKED_INDICES.seen(slot_ids, ("slots", slots)) or _capturing(slot_ids):
        return
    ids = slot_ids.detach()
    ordered = torch.sort(ids).values
    repeated = (ordered[1:] == ordered[:-1]) & (ordered[1:] >= 0)
    # one device->host transfer for every check
    too_big, twice = torch.stack([(ids >= slots).any(), repeated.any()]).tolist()
    if too_big:
        first = int((ids >= slots).nonzero()[0])
        raise ValueError(f"{name} must be below the pool's {slots} slots (negative: padding), got "
                         f"{name}[{first}] = {int(ids[first])}")
    if twice:
        value = int(ordered[1:][repeated][0])
        raise ValueError(f"{name} must not repeat a slot within one call (two rows would update one state), "
                         f"got slot {value} more than once")
    _CHECKED_INDICES.remember(slot_ids, ("slots", slots))


def check_cu_seqlens_values(cu_seqlens: torch.Tensor, total: int, check: bool) -> None:
    """cu_seqlens[0] = 0, non-decreasing, cu_seqlens[-1] ≤ T (``total``; the rows past it are a fixed-size
    buffer's padding): one device sync on CUDA, once per tensor version, never while capturing, not at all when
    ``check`` is False."""
    if not check or _CHECKED_INDICES.seen(cu_seqlens, ("total", total)) or _capturing(cu_seqlens):
        return
    cu = cu_seqlens.detach()
    steps = cu[1:] - cu[:-1]
    first, last, decreasing = torch.stack([cu[0].long(), cu[-1].long(), (steps < 0).any().long()]).tolist()
    if first != 0:
        raise ValueError(f"cu_seqlens must start at 0, got cu_seqlens[0] = {first}")
    if decreasing:
        at = int((steps < 0).nonzero()[0])
        raise ValueError(f"cu_seqlens must be non-decreasing, got cu_seqlens[{at}] = {int(cu[at])} > "
                         f"cu_seqlens[{at + 1}] = {int(cu[at + 1])}")
    if last > total:
        raise ValueError(f"cu_seqlens must end at most at the number of packed tokens T = {total} (dim 0 of b), "
                         f"got cu_seqlens[-1] = {last}")
    _CHECKED_INDICES.remember(cu_seqlens, ("total", total))


# --------------------------------------------------------------------------- problems

def new_empty(shape, dtype, device) -> torch.Tensor:
    """Allocates every output of the package (the tests replace it to poison outputs), but for the
    repeated calls' outputs, which :func:`new_like` allocates."""
    return torch.empty(shape, dtype=dtype, device=device)


def new_like(template: torch.Tensor) -> torch.Tensor:
    """An output of a repeated call (docs/design.md §4.5): a contiguous tensor of ``template``'s shape,
    dtype and device, ``template`` from :func:`output_template` (the tests replace this too).
    ``torch.empty_like`` of one tensor costs about half of ``torch.empty`` with a shape, a dtype and a device."""
    return torch.empty_like(template)


def output_template(shape, dtype, device) -> torch.Tensor:
    """What :func:`new_like` allocates from: one element expanded to ``shape`` (``empty_like`` of an
    expanded tensor is contiguous), or, where that would not give ``torch.empty``'s strides (a shape of
    at most one element, whose expansion is dense and keeps its zero strides), a tensor of the shape."""
    expanded = torch.empty((), dtype=dtype, device=device).expand(shape)
    probe = torch.empty_like(expanded)
    if probe.stride() == torch.empty(shape, dtype=dtype, device="meta").stride():
        return expanded
    return torch.empty(shape, dtype=dtype, device=device)


def to_bhnd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """The ``(batch, heads, n, dim)`` view of a tensor in ``layout`` (a transpose, never a copy)."""
    return x if layout == "bhnd" else x.transpose(1, 2)


def _other_layout_hint(layout: str, b: torch.Tensor, gamma) -> str:
    """Why a gamma's shape may not match: the inputs were given in the other layout."""
    other = "bnhd" if layout == "bhnd" else "bhnd"
    heads_other = b.shape[2] if b.dim() == 4 else None
    if isinstance(gamma, torch.Tensor) and heads_other is not None and gamma.shape[:1] == (heads_other,):
        return (f"; it would fit heads = {heads_other}, which is dim 2 of b {tuple(b.shape)}: are the inputs "
                f"in layout '{other}'? Pass layout='{other}'")
    return ""


_FLAG_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64)


def packed(x: torch.Tensor) -> torch.Tensor:
    """The ``(1, H, T, dim)`` view of a packed ``(T, H, dim)`` tensor (a permutation, never a copy)."""
    return x.permute(1, 0, 2).unsqueeze(0)


CHECKPOINT_ALIGN = 64
"""State checkpoints fall every K rows of a sequence, K a multiple of this: every chunk length (BT) of the packed
walk's configs divides it (kernels/walk_space.py), so each checkpoint is the state at the end of a chunk
(docs/design.md §13.9)."""


def check_checkpoints(checkpoint_every, checkpoint_slots, state_pool, num_seqs: int, device) -> None:
    """The checkpoint arguments of ``linear_attention_varlen`` (docs/design.md §13.9), their metadata only: K and
    the slot table given together, K a positive multiple of :data:`CHECKPOINT_ALIGN`, the table an int32/int64
    ``(N, M)`` tensor on the inputs' device, a pool to write to."""
    if (checkpoint_every is None) != (checkpoint_slots is None):
        given, missing = (("checkpoint_every", "checkpoint_slots") if checkpoint_slots is None
                          else ("checkpoint_slots", "checkpoint_every"))
        raise ValueError(f"{given} needs {missing}: checkpoint_every (K) and checkpoint_slots (the (N, M) pool slots "
                         f"of each sequence's checkpoints) are given together, got {missing}=None")
    if checkpoint_every is None:
        return
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, (numbers.Integral, torch.SymInt)):
        raise TypeError(f"checkpoint_every must be an int (a positive multiple of {CHECKPOINT_ALIGN}), got "
                        f"{type_name(checkpoint_every)}")
    if checkpoint_every <= 0 or checkpoint_every % CHECKPOINT_ALIGN:
        raise ValueError(f"checkpoint_every must be a positive multiple of {CHECKPOINT_ALIGN} (checkpoints fall at "
                         f"the ends of the walk's chunks), got {checkpoint_every}")
    s = checkpoint_slots
    what = "sequence i's j-th checkpoint's pool slot, −1: none"
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"checkpoint_slots must be an int32 or int64 tensor ({num_seqs}, M) ({what}), got "
                        f"{type_name(s)}")
    if s.dtype not in INDEX_DTYPES:
        raise TypeError(f"checkpoint_slots must be int32 or int64 ({what}), got dtype {s.dtype}")
    if s.dim() != 2 or s.shape[0] != num_seqs:
        raise ValueError(f"checkpoint_slots must have shape ({num_seqs}, M) ({what}), got shape {tuple(s.shape)}")
    if s.device != device:
        raise ValueError(f"checkpoint_slots must be on the inputs' device {device}, got {s.device}")
    if state_pool is None:
        raise ValueError("checkpoint_slots needs a state_pool (slots, heads, r, d) to write the checkpoints to, got "
                         "state_pool=None")


def check_checkpoint_values(checkpoint_slots: torch.Tensor, slot_ids: torch.Tensor, slots: int, check: bool) -> None:
    """The checkpoint slots' values: each in [−1, ``slots``), no slot twice among the non-negative ones, none
    among ``slot_ids``' non-negative ones (each would be two writes of one state).  One device sync on CUDA,
    once per version of the table and of the slot ids, never while capturing, not at all when ``check`` is
    False: the kernel then writes only slots in [0, slots) (docs/design.md §13.9)."""
    if not check or checkpoint_slots.numel() == 0 or _capturing(checkpoint_slots):
        return
    context = ("checkpoints", slots, id(slot_ids), _CheckedTensors._version(slot_ids), slot_ids.data_ptr())
    if _CHECKED_INDICES.seen(checkpoint_slots, context):
        return
    table = checkpoint_slots.detach()
    flat = table.reshape(-1)
    ids = slot_ids.detach()
    out_of_range = (flat < -1) | (flat >= slots)
    ordered = torch.sort(flat).values
    repeated = (ordered[1:] == ordered[:-1]) & (ordered[1:] >= 0)
    shared = torch.isin(flat, ids) & (flat >= 0)
    # one device->host transfer for every check
    bad_range, twice, any_shared = torch.stack([out_of_range.any(), repeated.any(), shared.any()]).tolist()
    if bad_range:
        i, j = (int(x) for x in (table < -1).logical_or(table >= slots).nonzero()[0])
        raise ValueError(f"checkpoint_slots must hold pool slots in [-1, {slots}) (−1: no checkpoint), got "
                         f"checkpoint_slots[{i}, {j}] = {int(table[i, j])}")
    if twice:
        value = int(ordered[1:][repeated][0])
        raise ValueError(f"checkpoint_slots must not repeat a slot (two checkpoints would write one state), got "
                         f"slot {value} more than once")
    if any_shared:
        i, j = divmod(int(shared.nonzero()[0]), table.shape[1])
        k = int((ids == table[i, j]).nonzero()[0])
        raise ValueError(f"checkpoint_slots and slot_ids must not share a slot (a checkpoint and a final state would "
                         f"both write it), got checkpoint_slots[{i}, {j}] = slot_ids[{k}] = {int(ids[k])}")
    _CHECKED_INDICES.remember(checkpoint_slots, context)


def make_varlen_problem(b, c, v, cu_seqlens, gamma=None, *, state_pool=None, slot_ids=None, has_initial_state=None,
                        return_state: bool = False, precision: Optional[str] = None,
                        check_indices: bool = True, out=None, checkpoint_every=None,
                        checkpoint_slots=None) -> tuple[VarlenProblem, torch.Tensor]:
    """Validate a packed call of ``linear_attention_varlen`` and build its :class:`VarlenProblem`.

    Returns the problem and the output ``(T, H, d)`` (``out`` itself when given: a preallocated tensor of
    that shape and v's dtype, written in place, refused when its elements overlap or it shares memory with what
    the call reads or writes).  Every check runs before any launch; those that
    read index values on the device (cu_seqlens, slot ids) cost one sync each on CUDA, once per tensor
    version, and are skipped with ``check_indices=False`` (docs/design.md §13.3).  The index tensors
    (cu_seqlens, slot ids, flags) are taken as the kernel reads them, contiguous (:func:`index_as_read`),
    and the problem holds those; a pool whose elements overlap, or that shares memory with anything the
    call reads, is refused (:func:`check_own_memory`, :func:`check_unshared`).
    """
    where = "linear_attention_varlen"
    cu_seqlens, slot_ids, has_initial_state, checkpoint_slots = (
        index_as_read(x) for x in (cu_seqlens, slot_ids, has_initial_state, checkpoint_slots))
    (b, c, v), (T, H, r, d) = check_token_triple(("b", "c", "v"), b, c, v,
                                                 "(T, heads, dim): the packed tokens of every sequence",
                                                 "T and heads (T, heads, dim)")
    check_dims(r, d, where)
    device = v.device
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision must be None, 'ieee' or 'tf32', got {precision!r}")
    check_bool("return_state", return_state)
    check_bool("check_indices", check_indices)
    check_constant_gamma(gamma)
    check_autograd(where, b, c, v, state_pool)

    cu = check_index("cu_seqlens", cu_seqlens, None, device, "offsets of the packed sequences, (N + 1,) from 0 to T")
    if cu.shape[0] < 1:
        raise ValueError("cu_seqlens must hold N + 1 ≥ 1 offsets (N sequences), got an empty tensor")
    N = cu.shape[0] - 1
    if state_pool is None:
        for name, x in (("slot_ids", slot_ids), ("has_initial_state", has_initial_state)):
            if x is not None:
                raise ValueError(f"{name} needs a state_pool (slots, heads, r, d) to index, got state_pool=None")
        slots = 0
    else:
        check_pool("state_pool", state_pool, H, r, d, device)
        if slot_ids is None:
            raise ValueError(f"state_pool needs slot_ids, the ({N},) pool slot of each sequence, got slot_ids=None")
        check_index("slot_ids", slot_ids, N, device, "the state pool's slot of each sequence, < 0: none")
        slots = state_pool.shape[0]
        if has_initial_state is not None:
            if not isinstance(has_initial_state, torch.Tensor) or has_initial_state.dtype not in _FLAG_DTYPES:
                raise TypeError(f"has_initial_state must be a bool (or integer) tensor of shape ({N},), got "
                                f"{type_name(has_initial_state)}")
            if tuple(has_initial_state.shape) != (N,):
                raise ValueError(f"has_initial_state must have shape ({N},) (one flag per sequence), got "
                                 f"{tuple(has_initial_state.shape)}")
            if has_initial_state.device != device:
                raise ValueError(f"has_initial_state must be on the inputs' device {device}, got "
                                 f"{has_initial_state.device}")
    check_checkpoints(checkpoint_every, checkpoint_slots, state_pool, N, device)
    gamma_h = resolve_gamma(gamma, H, device)
    if state_pool is not None:
        check_own_memory("state_pool", state_pool)
        check_unshared("state_pool", state_pool, (("b", b), ("c", c), ("v", v), ("gamma", gamma_h),
                                                  ("cu_seqlens", cu), ("slot_ids", slot_ids),
                                                  ("has_initial_state", has_initial_state),
                                                  ("checkpoint_slots", checkpoint_slots)))
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be None or a tensor (T, heads, d) = {(T, H, d)}, got {type_name(out)}")
        if tuple(out.shape) != (T, H, d) or out.dtype != v.dtype or out.device != device:
            raise ValueError(f"out must be a {v.dtype} tensor of shape (T, heads, d) = {(T, H, d)} on {device}, "
                             f"got {type_name(out)}")
        check_own_memory("out", out)
        check_unshared("out", out, (("b", b), ("c", c), ("v", v), ("gamma", gamma_h), ("cu_seqlens", cu),
                                    ("slot_ids", slot_ids), ("has_initial_state", has_initial_state),
                                    ("state_pool", state_pool), ("checkpoint_slots", checkpoint_slots)))
    check_cu_seqlens_values(cu, T, check_indices)
    if state_pool is not None:
        check_slot_values("slot_ids", slot_ids, slots, check_indices)
    if checkpoint_slots is not None:
        check_checkpoint_values(checkpoint_slots, slot_ids, slots, check_indices)

    out = new_empty((T, H, d), v.dtype, device) if out is None else out
    if state_pool is not None:
        state = state_pool
    else:
        state = new_empty((N, H, r, d), torch.float32, device) if return_state else None
    initial = state_pool if (state_pool is not None and has_initial_state is not None) else None
    problem = VarlenProblem(packed(b), packed(c), packed(v), gamma_h, initial, packed(out), state, precision or "ieee",
                            cu_seqlens=cu, slot_ids=slot_ids, has_initial=has_initial_state if initial is not None
                            else None, pool_slots=slots, checkpoint_every=checkpoint_every or 0,
                            checkpoint_slots=checkpoint_slots)
    return problem, out


def make_problem(b, c, v, gamma=None, *, layout: str = "bhnd", initial_state=None, return_state: bool = False,
                 precision: Optional[str] = None, where: str = "linear_attention",
                 device_types: tuple[str, ...] = DEVICE_TYPES,
                 differentiable: bool = False, reverse: bool = False,
                 two_part: bool = False, log_decay=None) -> tuple[Problem, torch.Tensor]:
    """Validate a call and build its :class:`Problem`.

    ``device_types`` other than CPU and CUDA serve the package's own tools alone (the
    ``meta`` device, to record the launches of a shape without running them).
    ``differentiable=True``: the inputs may require grad, because the caller computes with
    operations autograd records (the PyTorch methods, the oracle); otherwise a call whose
    inputs require grad is refused (a kernel launched on them would return an output without a
    ``grad_fn``).  A gamma that requires grad is refused either way (docs/design.md §10).
    ``reverse=True`` builds a reversed problem (:attr:`Problem.reverse`: the backward's calls in reversed time);
    ``two_part=True`` one whose bfloat16 operands are formed in two parts (:attr:`Problem.two_part`).

    Returns the problem and the output tensor in the caller's layout (the
    problem's ``out`` is a view of it).  Raises ``TypeError``/``ValueError`` for
    bad input, naming the argument, what was expected and what was given.
    """
    # the checks of the tensors and options run once per signature: exactly what they read
    try:
        signature = (where, device_types, layout, type(b), type(c), type(v), b.shape, c.shape, v.shape, b.dtype,
                     c.dtype, v.dtype, b.device, c.device, v.device, type(return_state), return_state,
                     type(precision), precision, None if initial_state is None else
                     (type(initial_state), initial_state.shape, initial_state.dtype, initial_state.device))
        checked = signature in _CHECKED_SIGNATURES
    except (AttributeError, TypeError, RuntimeError):  # not tensors, unhashable options: the checks say what
        signature, checked = None, False
    if not checked:
        _check_options(b, c, v, layout, return_state, precision, device_types)
    check_constant_gamma(gamma)
    if not differentiable:
        check_autograd(where, b, c, v, initial_state)
    if not checked:
        _check_shapes(b, c, v, layout, initial_state, where)
        if signature is not None:
            if len(_CHECKED_SIGNATURES) >= 4096:
                _CHECKED_SIGNATURES.clear()
            _CHECKED_SIGNATURES.add(signature)

    bb, cc, vv = to_bhnd(b, layout), to_bhnd(c, layout), to_bhnd(v, layout)
    B, H, n, r = bb.shape
    H = max(H, cc.shape[1], vv.shape[1])   # the output's heads (grouped heads: docs/design.md §1.7)
    d = vv.shape[-1]
    device = v.device
    gamma_h = resolve_gamma(gamma, H, device, lambda: _other_layout_hint(layout, b, gamma))
    ld = None
    if log_decay is not None:
        ld = resolve_log_decay(log_decay, gamma, (B, H, n), v.dtype, device, layout, where)
        if not differentiable:
            check_autograd(where, log_decay)

    out_shape = (B, H, n, d) if layout == "bhnd" else (B, n, H, d)
    out_user = new_empty(out_shape, v.dtype, device)
    state = new_empty((B, H, r, d), torch.float32, device) if return_state else None
    problem = Problem(bb, cc, vv, gamma_h, initial_state, to_bhnd(out_user, layout), state, precision or "ieee",
                      reverse=reverse, two_part=two_part, log_decay=ld)
    return problem, out_user


def check_log_decay_values(log_decay: torch.Tensor) -> None:
    """A per-token decay's values ≤ 0, checked for CPU tensors outside the interpreter only (a cheap host
    reduction, on every call: nothing is remembered); elsewhere the kernels give NaN rows for a value > 0 or
    NaN, and nothing is read on the host (docs/design.md §1.6)."""
    if log_decay.device.type != "cpu" or _interpreting() or not log_decay.numel() or _GUARDS_ONLY.get():
        return
    bad = ~(log_decay.detach() <= 0)
    if bool(bad.any()):
        at = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"log_decay must be ≤ 0 (a natural-log decay per token), got log_decay{list(at)} = "
                         f"{float(log_decay.detach()[at])!r}")


def resolve_log_decay(log_decay, gamma, shape: tuple, dtype: torch.dtype, device: torch.device, layout: str = "bhnd",
                      where: str = "linear_attention", axes: Optional[str] = None) -> torch.Tensor:
    """Validate a per-token decay and return the view the kernels read (docs/design.md §1.6).

    ``shape`` is its shape in ``(batch, heads, n)`` order (the ``bnhd`` layout's tensor is ``(batch, n,
    heads)``, read through a transposed view, never a copy); float32 or ``dtype`` (the inputs'); on
    ``device``; exclusive with ``gamma``.  Its values (≤ 0) are not read on CUDA or under the interpreter
    (no device sync): a value > 0 or NaN makes the rows it decays NaN.  On the CPU outside the
    interpreter they are checked (a cheap host reduction).  ``axes`` names the dimensions in errors.
    """
    if gamma is not None:
        raise ValueError(f"{where}: give gamma or log_decay, not both (log_decay = a per-token ln γ; a constant "
                         f"decay is log_decay = ln γ for every token), got gamma={type_name(gamma)} and "
                         f"log_decay={type_name(log_decay)}")
    if not isinstance(log_decay, torch.Tensor):
        raise TypeError(f"log_decay must be None or a torch.Tensor, got {type_name(log_decay)}")
    if log_decay.dtype not in (torch.float32, dtype):
        raise TypeError(f"log_decay must be float32 or the inputs' dtype {dtype}, got dtype {log_decay.dtype}")
    want = shape if layout == "bhnd" else (shape[0], shape[2], shape[1])
    if tuple(log_decay.shape) != tuple(want):
        names = axes or ("(batch, heads, n)" if layout == "bhnd" else "(batch, n, heads)")
        where_ = f" for layout '{layout}'" if axes is None else ""
        raise ValueError(f"log_decay must have shape {names} = {tuple(want)}{where_}, got shape "
                         f"{tuple(log_decay.shape)}")
    if log_decay.device != device:
        raise ValueError(f"log_decay must be on the inputs' device {device}, got {log_decay.device}")
    check_log_decay_values(log_decay)
    return log_decay if layout == "bhnd" or len(shape) != 3 else log_decay.transpose(1, 2)


_CHECKED_SIGNATURES: set = set()


def _check_options(b, c, v, layout, return_state, precision, device_types) -> None:
    """make_problem's checks of the tensors' types, ranks, dtypes and devices and of the options."""
    b = check_tensor("b", b, device_types)
    c = check_tensor("c", c, device_types)
    v = check_tensor("v", v, device_types)
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be 'bhnd' or 'bnhd', got {layout!r}")
    dims = "(batch, heads, n, dim)" if layout == "bhnd" else "(batch, n, heads, dim)"
    for name, x in (("b", b), ("c", c), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D {dims} for layout '{layout}', got shape {tuple(x.shape)}")
    if not (b.dtype == c.dtype == v.dtype):
        raise TypeError(f"b, c and v must share one dtype, got {b.dtype}, {c.dtype}, {v.dtype}")
    if not (b.device == c.device == v.device):
        raise ValueError(f"b, c and v must be on one device, got {b.device}, {c.device}, {v.device}")
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision must be None, 'ieee' or 'tf32', got {precision!r}")
    check_bool("return_state", return_state)


def _check_shapes(b, c, v, layout, initial_state, where: str) -> None:
    """make_problem's checks of the shapes and of the initial state (after the autograd guard)."""
    dims = "(batch, heads, n, dim)" if layout == "bhnd" else "(batch, n, heads, dim)"
    bb, cc, vv = to_bhnd(b, layout), to_bhnd(c, layout), to_bhnd(v, layout)
    B, H, n, r = bb.shape
    if (cc.shape[0], cc.shape[2], cc.shape[3]) != (B, n, r):
        raise ValueError(f"c must have the shape of b {tuple(b.shape)}, got {tuple(c.shape)}")
    if (vv.shape[0], vv.shape[2]) != (B, n):
        raise ValueError(f"v must match b in batch, heads and n {dims}: b has shape {tuple(b.shape)}, "
                         f"v has shape {tuple(v.shape)}")
    H = check_heads(("b", "c", "v"), (H, cc.shape[1], vv.shape[1]),
                    f"c must have the shape of b {tuple(b.shape)}, got {tuple(c.shape)}",
                    f"v must match b in batch, heads and n {dims}: b has shape {tuple(b.shape)}, v has shape "
                    f"{tuple(v.shape)}")
    d = vv.shape[-1]
    check_dims(r, d, where)
    device = v.device

    if initial_state is not None:
        check_state("initial_state", initial_state, (B, H, r, d), device, optional=True)

