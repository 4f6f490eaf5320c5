"""One module per method: the ``@triton.jit`` kernel(s), then the launcher."""
