"""Configs of the tree verification step (kernels/tree.py ``_decode_tree_kernel``).

A program owns a [R, BV] column slice of one head's states and walks the k draft tokens in order, each
token's slice in [BK, BV] tiles read from its parent's state and written as its own: the k-token step's
tiles (kernels/decode_space.py ``TOKENS``: BK all of r on the GPU, 8 to 32 state elements per thread),
tuned apart under its own name.  The interpreter's config is the k-token step's, so a chain of parents
computes exactly what ``decode_tokens`` computes without them.
"""
from __future__ import annotations

import dataclasses

from .decode_space import TOKENS

TREE = dataclasses.replace(TOKENS, name="decode.tree")
"""``decode_tokens(..., parents=...)``: the k-token step's space under its own name."""
