"""One module per method: the config space of each of its kernels, per GPU family."""
