"""``python -m leettriton.bench`` and the measuring tools shared by ``perf/`` and :func:`benchmark_method`."""
from .grid import *  # noqa: F401,F403
from .grid import ERR_MAX_ROWS, __all__, _plot_styles, _predicted_ms, cell_key  # noqa: F401
