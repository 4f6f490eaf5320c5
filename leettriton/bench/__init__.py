"""Benchmarks: ``python -m leettriton.bench`` (:mod:`.cli`), :func:`benchmark_method` and the tools of ``perf/``.

One module per job, each importing only those below it:

* :mod:`.inputs`       dtypes, devices, :func:`decay_gammas`, :func:`make_inputs` (pure);
* :mod:`.timing`       :func:`time_ms` (do_bench on CUDA, warmed-up wall-clock medians on a CPU),
  the copy bandwidth and the memory floor;
* :mod:`.failures`     out of memory, kernel faults (:class:`DeviceFailure`), error texts;
* :mod:`.environment`  the device, versions, git SHA and date of a measurement;
* :mod:`.peers`        fla and lightning-attn, imported only when present;
* :mod:`.cell`         the fp64 oracle on a subset and :func:`measure` (one cell);
* :mod:`.report`       progress lines, tables, JSON, CSV and the plot;
* :mod:`.grid`         the grid, budgets and ``--resume`` (:func:`run_grid`);
* :mod:`.user`         :func:`benchmark_method`: a researcher's own method, checked and timed;
* :mod:`.cli`          the command line (not imported here).

The tolerances are :data:`leettriton.reference.TOLERANCES`, the tests' own.
"""
from ..reference import TOLERANCES, tolerance
from .cell import ERR_MAX_ROWS, Measurement, Oracle, error_subset, measure, oracle, rel_error
from .environment import environment, gpu_slug
from .failures import DeviceFailure
from .grid import (Entry, cell_key, default_methods, method_entry, peer_entry, prime_autotuners, resumable_rows,
                   run_grid, user_entry)
from .inputs import decay_gammas, default_device, dtype_name, make_inputs, parse_dtype
from .peers import CHUNKED_PEERS, Prepared, peer_decode, peers
from .report import ROW_FIELDS, format_tables, markdown_table, plot, read_results, write_csv, write_results
from .timing import copy_bandwidth, free_memory, graph_replay, memory_floor_ms, sync, time_ms
from .user import benchmark_method

__all__ = [
    "benchmark_method", "time_ms", "graph_replay", "copy_bandwidth", "memory_floor_ms", "environment", "make_inputs",
    "decay_gammas", "peers", "peer_decode", "rel_error", "measure", "write_results", "write_csv", "format_tables",
    "gpu_slug", "parse_dtype", "markdown_table", "dtype_name", "error_subset", "oracle", "Oracle", "Measurement",
    "Prepared", "Entry", "method_entry", "peer_entry", "user_entry", "run_grid", "default_methods", "default_device",
    "free_memory", "sync", "plot", "DeviceFailure", "TOLERANCES", "tolerance", "ROW_FIELDS", "CHUNKED_PEERS",
    "ERR_MAX_ROWS", "cell_key", "prime_autotuners", "resumable_rows", "read_results",
]
