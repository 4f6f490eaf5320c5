"""An experiment, not part of the library: perf/profile_auto.py with block_based's look-back walk at another ρ
(``LOOKBACK_RHO``, in 256ths), or off.  Needs perf/experiments/lookback_walk.patch applied
(perf/results/h200/walk_lookback.log).

    python perf/experiments/lookback_rho.py 84 --dtypes float16 --shapes 1x8x8192x256x512 --label rho84
    python perf/experiments/lookback_rho.py off ...     # the state pass and the walk, as before the look-back walk
"""
import os
import runpy
import sys

from leettriton.methods.block_based import space

rho = sys.argv.pop(1)
space.LOOKBACK_RHO = None if rho == "off" else int(rho)
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "profile_auto.py"), run_name="__main__")
