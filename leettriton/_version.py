"""The package version (one place: ``leettriton.__version__`` and the bench records read it)."""
__version__ = "0.2.0.dev0"
