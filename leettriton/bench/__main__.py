"""``python -m leettriton.bench [options]``: see :mod:`leettriton.bench.cli`."""
from .cli import main

main()
