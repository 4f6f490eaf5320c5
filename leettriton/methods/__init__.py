"""The built-in methods, one package each (docs/design.md §3).

:func:`builtin_methods` is the table the registry is filled from; importing this
package registers nothing.
"""
from __future__ import annotations

from .spec import Method, Plan

__all__ = ["Method", "Plan", "builtin_methods", "BUILTIN_METHODS"]

BUILTIN_METHODS = ("vanilla", "causal_dot_product", "block_based", "recursion", "lightning_attention",
                   "fleet_attention")
"""The six methods of the LeetDecoding paper, in its order."""


def builtin_methods() -> dict[str, Method]:
    """Name → :class:`Method` of every built-in method."""
    from . import block_based, causal_dot_product, fleet_attention, lightning_attention, recursion, vanilla

    modules = dict(vanilla=vanilla, causal_dot_product=causal_dot_product, block_based=block_based,
                   recursion=recursion, lightning_attention=lightning_attention, fleet_attention=fleet_attention)
    return {name: modules[name].METHOD for name in BUILTIN_METHODS}
