"""Record the kernel launches a method makes, without running them."""
from __future__ import annotations

import torch

from .configs import KERNELS
from .families import current_family


class _Recorder:
    """Stands in for kernel launches: records each kernel's named arguments instead of running it."""

    def __init__(self):
        self.calls: list[tuple[object, dict]] = []
        self._saved = {}

    def __enter__(self):
        for kernel in set(KERNELS.values()):
            self._saved[kernel] = kernel.run
            kernel.run = self._make(kernel)
            self._saved[(kernel, "fn")] = kernel.fn.run
            kernel.fn.run = self._make(kernel)
        return self

    def _make(self, kernel):
        def run(*args, grid=None, warmup=False, **kwargs):
            named = dict(zip(kernel.fn.arg_names, args))
            named.update({k: v for k, v in kwargs.items() if k in kernel.fn.arg_names})
            self.calls.append((kernel, named))
        return run

    def __exit__(self, *exc):
        for kernel in set(KERNELS.values()):
            kernel.run = self._saved[kernel]
            kernel.fn.run = self._saved[(kernel, "fn")]


def record_launches(method: str, dtype: torch.dtype, B=1, H=2, n=256, r=128, d=128, decay=True,
                    initial=True, state=True, device="meta", family=None, configs=None):
    """The (kernel, named arguments) pairs that ``method`` launches for one problem, without running them.

    On the ``meta`` device no memory is touched; the arguments carry the dtypes,
    strides and sizes a real launch of that shape would have.  ``family``: the GPU
    family whose schedule to record (default: the current device's); ``configs``:
    kernel configs pinned (space name → config), with the schedule they get.
    """
    from ..methods import Plan, builtin_methods
    from ..problem import make_problem

    b, c = (torch.empty(B, H, n, r, dtype=dtype, device=device) for _ in range(2))
    v = torch.empty(B, H, n, d, dtype=dtype, device=device)
    s0 = torch.empty(B, H, r, d, dtype=torch.float32, device=device) if initial else None
    p, _ = make_problem(b, c, v, 0.9 if decay else None, initial_state=s0, return_state=state,
                        device_types=("meta",))
    spec = builtin_methods()[method]
    plan = Plan(method, spec.launch, configs, spec.schedule(p, family or current_family(), configs))
    with _Recorder() as rec:
        plan.run(p, plan)
    return rec.calls


def record_decode(dtype: torch.dtype, B=4, H=2, r=128, d=128, decay=True, device="meta"):
    """The (kernel, named arguments) pairs of one :func:`leettriton.decode_step`, without running it."""
    from ..kernels.decode import decode_step_impl

    b_t, c_t = (torch.empty(B, H, r, dtype=dtype, device=device) for _ in range(2))
    v_t = torch.empty(B, H, d, dtype=dtype, device=device)
    state = torch.empty(B, H, r, d, dtype=torch.float32, device=device)
    gamma = torch.empty(H, dtype=torch.float32, device=device) if decay else None
    out = torch.empty_like(v_t)
    with _Recorder() as rec:
        decode_step_impl(b_t, c_t, v_t, state, gamma, out)
    return rec.calls
