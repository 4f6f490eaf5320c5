"""decode_step: not yet available."""
from __future__ import annotations


def decode_step_impl(b_t, c_t, v_t, state, log2_gamma, out) -> None:
    raise NotImplementedError("decode_step is not implemented yet")
