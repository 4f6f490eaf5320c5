"""``python -m leettriton.bench [options]``: see :mod:`leettriton.bench.cli`."""
from .grid import main

main()
