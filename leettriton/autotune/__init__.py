"""Everything GPU-specific: families, config spaces, the autotune wrapper, heuristic files."""
from .configs import (KERNELS, KernelSpace, autotune, autotune_enabled, chosen_config, chosen_configs, config_dict,
                      in_family, launch, pinnable_configs, recording)
from .families import FAMILIES, Family, current_family, is_interpreting
from .heuristics import HeuristicsError

__all__ = ["FAMILIES", "Family", "current_family", "is_interpreting", "KernelSpace", "autotune",
           "autotune_enabled", "launch", "chosen_config", "chosen_configs", "config_dict", "KERNELS", "in_family",
           "pinnable_configs", "recording", "HeuristicsError"]
