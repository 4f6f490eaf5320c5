"""Configs of lightning_attention's chunk walk: the walk's table (kernels/walk_space.py) under this method's name,
tuned apart from the other methods' walks."""
from __future__ import annotations

from ...kernels.walk_space import walk_space

FWD = walk_space("lightning_attention.fwd")
