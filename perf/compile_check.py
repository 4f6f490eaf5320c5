"""Compile every kernel config for a GPU target on the CPU: see leettriton/autotune/compile.py."""
import sys

from leettriton.autotune.compile import main

if __name__ == "__main__":
    sys.exit(main())
