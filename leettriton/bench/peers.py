"""Other libraries' kernels timed beside ours: flash-linear-attention and lightning-attn, when installed.

Each peer is imported only when asked for (:func:`peers`, :func:`peer_decode`) and only on
CUDA; a missing or broken install is reported as a note, never an error.  The peers compute
float32 through TF32 by design, so their float32 is judged at ``tolerance(float32, "tf32")``
(:data:`PEER_PRECISION`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

import torch

from .failures import first_line
from .inputs import resolve_device

__all__ = ["Prepared", "peers", "peer_decode", "CHUNKED_PEERS", "PEER_PRECISION"]

PEER_PRECISION = "tf32"
"""The precision the peers' float32 products are done at (:func:`leettriton.reference.tolerance`)."""


@dataclass
class Prepared:
    """A zero-argument call of a method on inputs prepared once, and how to read its output as bhnd."""

    run: Callable[[], Any]
    to_bhnd: Callable[[Any], torch.Tensor] = field(default=lambda o: o)

    def __call__(self):
        return self.run()


def _fla_chunk(b, c, v, gamma) -> Prepared:
    from fla.ops.simple_gla import chunk_simple_gla

    q, k, vv = (x.transpose(1, 2).contiguous() for x in (b, c, v))        # fla wants [B, T, H, K]
    g = None if gamma is None else torch.log(gamma.double()).float().contiguous()   # ln γ per head, (H,)
    return Prepared(lambda: chunk_simple_gla(q, k, vv, g_gamma=g, scale=1.0)[0], lambda o: o.transpose(1, 2))


def _fla_recurrent(b, c, v, gamma) -> Prepared:
    from fla.ops.simple_gla import fused_recurrent_simple_gla

    q, k, vv = (x.transpose(1, 2).contiguous() for x in (b, c, v))
    g = None if gamma is None else torch.log(gamma.double()).float().contiguous()
    return Prepared(lambda: fused_recurrent_simple_gla(q, k, vv, g_gamma=g, scale=1.0)[0], lambda o: o.transpose(1, 2))


def _lightning_attn2(b, c, v, gamma) -> Prepared:
    from lightning_attn.ops.triton import lightning_attn2, lightning_attn2_no_decay

    q, k, vv = (x.contiguous() for x in (b, c, v))                       # (b, h, n, d) already
    if gamma is None:
        return Prepared(lambda: lightning_attn2_no_decay(q, k, vv))
    s = (-torch.log(gamma.double())).float().view(-1, 1, 1).contiguous()   # s = −ln γ, (h, 1, 1)
    return Prepared(lambda: lightning_attn2(q, k, vv, s))


_PEERS = {
    # name: (module to import, package, factory)
    "fla_chunk_simple_gla": ("fla.ops.simple_gla", "fla-core", _fla_chunk),
    "lightning_attn2": ("lightning_attn.ops.triton", "lightning-attn", _lightning_attn2),
    "fla_fused_recurrent_simple_gla": ("fla.ops.simple_gla", "fla-core", _fla_recurrent),
}
CHUNKED_PEERS = ("fla_chunk_simple_gla", "lightning_attn2")


def _version_of(package: str) -> str:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:  # noqa: BLE001
        return "?"


def _import_peer(module: str) -> Optional[str]:
    """None when ``module`` imports, else why not."""
    import importlib
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001  (a broken install is reported, not fatal)
        return first_line(exc)
    return None


def peers(device=None, names: Optional[Iterable[str]] = None, notes: Optional[list] = None) -> dict:
    """Installed peer implementations: name → ``factory(b, c, v, gamma) -> Prepared``.

    ``b, c, v`` are ``(batch, heads, n, ·)`` tensors, ``gamma`` a ``(heads,)`` tensor or None.
    The factory converts layouts and decays once (outside any timed region) and returns a
    zero-argument callable; ``Prepared.to_bhnd(output)`` views its output as bhnd.

    * ``fla_chunk_simple_gla``: flash-linear-attention's ``chunk_simple_gla`` with
      ``g_gamma = ln γ`` (float32, ``(H,)``), ``scale=1.0``, ``[B, T, H, K]`` inputs;
    * ``lightning_attn2``: lightning-attn's ``lightning_attn2(q, k, v, s)`` with
      ``s = −ln γ`` of shape ``(h, 1, 1)`` (``lightning_attn2_no_decay`` without decay);
    * ``fla_fused_recurrent_simple_gla``: fla's token-by-token kernel.

    The peers are Triton kernels written for CUDA: on another device the result is empty.
    Each missing peer adds a line to ``notes`` (when given) saying why.
    """
    device = resolve_device(device)
    names = list(names) if names is not None else list(_PEERS)
    found = {}
    for name in names:
        module, package, factory = _PEERS[name]
        if device.type != "cuda":
            why = "needs a CUDA device"
        else:
            why = _import_peer(module)
        if why is None:
            found[name] = factory
            if notes is not None:
                notes.append(f"peer {name}: {package} {_version_of(package)}")
        elif notes is not None:
            extra = "" if device.type != "cuda" else f" (pip install {package})"
            notes.append(f"peer {name}: not available: {why}{extra}")
    return found


def _fla_decode(b_t, c_t, v_t, state, gamma) -> Prepared:
    from fla.ops.simple_gla import fused_recurrent_simple_gla

    q, k, vv = (x.unsqueeze(1).contiguous() for x in (b_t, c_t, v_t))   # [B, 1, H, K]: one token
    g = None if gamma is None else torch.log(gamma.double()).float().contiguous()
    return Prepared(lambda: fused_recurrent_simple_gla(q, k, vv, g_gamma=g, scale=1.0, initial_state=state,
                                                       output_final_state=True),
                    lambda res: res[0].squeeze(1))


def peer_decode(device=None, notes: Optional[list] = None):
    """fla's one-token step, or None: ``factory(b_t, c_t, v_t, state, gamma) -> Prepared``.

    ``b_t, c_t``: ``(batch, heads, r)``, ``v_t``: ``(batch, heads, d)``, ``state``: float32
    ``(batch, heads, r, d)`` — fla's ``[B, H, K, V]`` state layout, so no conversion — and
    ``gamma`` ``(heads,)`` or None.  Runs ``fused_recurrent_simple_gla`` on one token with
    ``initial_state=state``, ``output_final_state=True`` (fla returns a new state; ours is
    updated in place).  ``to_bhnd`` returns o_t as ``(batch, heads, d)``.
    """
    device = resolve_device(device)
    why = "needs a CUDA device" if device.type != "cuda" else _import_peer("fla.ops.simple_gla")
    if why is not None:
        if notes is not None:
            notes.append(f"peer fla_fused_recurrent_simple_gla (decode): not available: {why}")
        return None
    if notes is not None:
        notes.append(f"peer fla_fused_recurrent_simple_gla (decode): fla-core {_version_of('fla-core')}")

    return _fla_decode
