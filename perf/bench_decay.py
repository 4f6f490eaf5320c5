"""The per-token decay at Mamba-2 and simple-GLA shapes: ours against fla and mamba-ssm's SSD, one run.

The layers (heads of v H_v, heads of b and c H_k, state r, head dim d): Mamba-2-2.7B's mixer (80, 1, 128, 64),
a Nemotron-H-8B-like mixer (128, 8, 128, 64) and a simple-GLA layer (16, 16, 128, 128); batch 1 and 8,
n 2048, 8192 and 32768, float16 and bfloat16.  Every implementation gets the same tensors, in the layout
they share (``bnhd``: fla's ``[B, T, H, K]`` and mamba-ssm's ``(batch, seqlen, heads, ·)``), drawn as a
Mamba-2 layer makes them: x ~ N(0, 1), dt per token and head (log-uniform in [0.001, 0.1] for the Mamba
layers; softplus of N(0, 1) for GLA), A per head (−U(1, 16) for Mamba; −1/16 for GLA, whose decay is then
fla's ``logsigmoid / 16`` gate), B, C ~ N(0, 1) (C scaled by r^(−1/2)), one B and C per group of H_v / H_k
heads.  Ours: ``linear_attention(b, c, v, log_decay=a, layout="bnhd")`` with b = C, c = B, v = dt·x (in the
inputs' dtype) and a = A·dt (float32), b and c with H_k heads (grouped heads: not copied); fla:
``chunk_simple_gla(q=C, k=B, v, g=a, scale=1.0)``, q and k expanded to H_v heads (fla reads one q, k per
head); mamba-ssm: ``mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=256)`` (D, z, dt_bias none, no
softplus), which forms dt·x and A·dt itself.  Inputs are made outside the timed regions; ``auto (from x,
dt)`` times ours with the two products inside (what mamba-ssm's call does), for the Mamba layers.

1. Forward: ``auto``, each per-token method of ``leettriton.registry.per_token_methods()``, fla and
   mamba-ssm, each output checked against the float64 oracle (on a subset of heads
   when large); ``auto``, fla and mamba-ssm then timed again in alternating rounds, from Python
   (``rounds_ms``) and as CUDA-graph replays (``graph_ms``: the kernels alone), as
   ``perf/bench_model_shapes.py`` does; ratios take each entry's lower time of its sweep and its rounds.
2. Training step: forward, then ``torch.autograd.grad`` of every input with a random ``do`` (ours: b, c,
   v, a; fla: q, k, v, g; mamba-ssm: x, dt, A, B, C), timed together.
3. Decode: one token, batch 1, 8, 64, 256: ``decode_step(b_t, c_t, v_t, state, log_decay=a_t)`` (state
   updated in place), fla's ``fused_recurrent_simple_gla(g=…, initial_state, output_final_state=True)`` on
   one token, and mamba-ssm's ``selective_state_update`` (its Mamba-2 call: dt, A and dt_bias broadcast over
   the head dim); float32 states for all three (mamba-ssm's own cache holds it in the model's dtype by
   default).  Bytes a step must move: the state read and written, b_t, c_t (H_k heads), v_t, a_t and o_t
   once; GB/s against the copy bandwidth measured in the same run.
4. Precision: each implementation's relative error against the float64 oracle at batch 1, n 8192 per
   layer (every head and row).

Every autotuned kernel, ours and the peers', tunes at the first cell of each layer and dtype (the tuned
configs are forgotten there) and keeps its config for the cells its autotune key does not tell apart
(fla's and mamba-ssm's keys hold neither batch nor n), as in a user's process; the cells run largest
first, so each kernel tunes where the time goes (``--retune``: at every cell).  mamba-ssm is loaded from its source (``--mamba-src``, the
Triton kernels of state-spaces/mamba exported for the benchmark only, never a dependency); a peer that is
missing is named in the run's notes and its ``peers`` entry.

Targets: ``auto`` ≥ 1.5× faster than fla and faster than mamba-ssm on every forward and training cell;
``decode_step`` ≥ 90 % of the copy bandwidth from batch 64; every method of ours within the tolerance.

    python perf/bench_decay.py --models mamba2 --max-minutes 8      # one layer per call, on the GPU
    python perf/bench_decay.py --quick      # on the GPU: float16, batch 1 and 8, n 8192, decode batch 1
                                            # and 64; without one: tiny shapes, the PyTorch paths, no peers

Each cell's rows are written as soon as it is measured, so a run stopped by a time limit keeps them.
"""
from __future__ import annotations

import contextlib
import importlib
import math
import os
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from bench_auto import confirm_rounds  # noqa: E402
from bench_model_shapes import _csv, _ms  # noqa: E402

import leettriton  # noqa: E402
from leettriton import bench  # noqa: E402
from leettriton.autotune import KERNELS, is_interpreting  # noqa: E402
from leettriton.bench.failures import first_line, is_fatal  # noqa: E402
from leettriton.registry import per_token_methods  # noqa: E402

PEERS = importlib.import_module("leettriton.bench.peers")   # the module (``bench.peers`` is its function)

NAME = "bench_decay"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAMBA_SRC = os.path.join(".peers", "mamba")
SEED = 0


@dataclass(frozen=True)
class Layer:
    label: str
    heads: int          # H_v: heads of v, of the decay and of the state
    kv_heads: int       # H_k: heads of b and c (one per group)
    r: int
    d: int
    kind: str           # "mamba": dt log-uniform, A per head; "gla": fla's logsigmoid / 16 gate

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


MODELS = {
    "mamba2": Layer("Mamba-2-2.7B mixer", 80, 1, 128, 64, "mamba"),
    "nemotron": Layer("Nemotron-H-8B-like mixer", 128, 8, 128, 64, "mamba"),
    "gla": Layer("simple-GLA layer", 16, 16, 128, 128, "gla"),
}
CPU_MODELS = {  # the same three kinds at tiny widths: the script's logic off the GPU
    "mamba2": Layer("Mamba-2-2.7B mixer (tiny)", 4, 1, 16, 8, "mamba"),
    "nemotron": Layer("Nemotron-H-8B-like mixer (tiny)", 4, 2, 16, 8, "mamba"),
    "gla": Layer("simple-GLA layer (tiny)", 2, 2, 16, 16, "gla"),
}
AUTO, FROM_X_DT = "auto", "auto (from x, dt)"
FLA, MAMBA = "fla_chunk_simple_gla", "mamba_chunk_scan_combined"
DEC_OURS, DEC_FLA, DEC_MAMBA = "decode_step", "fla_fused_recurrent_simple_gla", "mamba_selective_state_update"
EXPANDED = " (b, c expanded)"
CHUNK_SIZE = 256
"""mamba-ssm's chunk size in Mamba-2 (its ``Mamba2`` layer's default)."""


class OutOfTime(Exception):
    """``--max-minutes`` has passed: what is measured so far is kept and written."""


# --------------------------------------------------------------------------- inputs

@dataclass
class Inputs:
    """One cell's tensors, ``bnhd``: mamba-ssm's (x, dt, A, B, C) and ours (b = C, c = B, v = dt·x, a = A·dt)."""

    layer: Layer
    x: torch.Tensor            # (batch, n, H_v, d), the dtype
    dt: torch.Tensor           # (batch, n, H_v) float32, > 0
    A: torch.Tensor            # (H_v,) float32, < 0
    B: torch.Tensor            # (batch, n, H_k, r): ours c
    C: torch.Tensor            # (batch, n, H_k, r): ours b
    v: torch.Tensor = field(init=False)
    a: torch.Tensor = field(init=False)

    def __post_init__(self):
        self.v = (self.x * self.dt.unsqueeze(-1)).to(self.x.dtype)
        self.a = self.A * self.dt

    def expand(self, x: torch.Tensor) -> torch.Tensor:
        """b or c with one copy per head of v (head h reads group h // (H_v / H_k)), contiguous."""
        return x.repeat_interleave(self.layer.group, dim=-2) if self.layer.group > 1 else x


def make_inputs(layer: Layer, batch: int, n: int, dtype, device, seed: int = SEED) -> Inputs:
    gen = torch.Generator(device=device).manual_seed(seed)
    H, G, r, d = layer.heads, layer.kv_heads, layer.r, layer.d

    def randn(*shape, dt=dtype):
        return torch.randn(shape, generator=gen, device=device, dtype=dt)

    x = randn(batch, n, H, d)
    if layer.kind == "mamba":   # Mamba-2's dt range at initialisation and A = −exp(A_log), A_log ~ log U(1, 16)
        u = torch.rand((batch, n, H), generator=gen, device=device)
        dt = torch.exp(math.log(1e-3) + u * (math.log(1e-1) - math.log(1e-3)))
        A = -(1 + 15 * torch.rand((H,), generator=gen, device=device))
    else:                       # a = A·dt = logsigmoid(−z) / 16: fla's simple-GLA gate
        dt = torch.nn.functional.softplus(randn(batch, n, H, dt=torch.float32))
        A = torch.full((H,), -1 / 16, device=device)
    B = randn(batch, n, G, r)
    C = randn(batch, n, G, r).mul_(r ** -0.5)
    return Inputs(layer, x, dt, A, B, C)


def oracle(inp: Inputs, max_rows: int = bench.ERR_MAX_ROWS) -> bench.Oracle:
    """The float64 oracle's output (bhnd) on :func:`leettriton.bench.error_subset`'s heads, from the exact
    dt·x (float32) and b, c expanded to their heads."""
    batch, n, H, _ = inp.x.shape
    bi, hi, scope = bench.error_subset(batch, H, n, max_rows)
    dev = inp.x.device
    bt, ht = torch.tensor(bi, device=dev), torch.tensor(hi, device=dev)
    gt = ht // inp.layer.group

    def pick(x, heads):
        return x.index_select(0, bt).index_select(2, heads)

    v = pick(inp.x, ht).float() * pick(inp.dt, ht).unsqueeze(-1)
    ref = leettriton.reference(pick(inp.C, gt).float(), pick(inp.B, gt).float(), v, layout="bnhd",
                               log_decay=pick(inp.a, ht))
    return bench.Oracle(ref.transpose(1, 2), bi, hi, scope)


def to_bhnd(o: torch.Tensor) -> torch.Tensor:
    return o.transpose(1, 2)


# --------------------------------------------------------------------------- implementations

@dataclass
class Step:
    """One implementation on one cell's inputs: its forward (a :class:`bench.Prepared`) and a training step."""

    forward: bench.Prepared
    train: Callable[[], tuple]


@dataclass
class Impl:
    label: str
    kind: str                                        # "ours" or "peer"
    make: Callable[[Inputs, Optional[torch.Tensor]], Step]
    precision: Optional[str] = None                  # float32 products (peers: TF32)


def _leaves(*xs):
    return tuple(x.detach().requires_grad_() for x in xs)


def ours(label: str, method: str, device, expanded: bool = False) -> Impl:
    """``linear_attention(b, c, v, log_decay=a, layout="bnhd", method=…)`` (off the GPU, the method's
    PyTorch twin; ``auto`` as it is); ``expanded``: b and c copied to one per head of v."""
    name = common.run_name(method, device)

    def make(inp: Inputs, do) -> Step:
        b, c = (inp.expand(x).contiguous() for x in (inp.C, inp.B)) if expanded else (inp.C, inp.B)

        def run(b, c, v, a):
            return leettriton.linear_attention(b, c, v, log_decay=a, layout="bnhd", method=name)

        def forward():
            with torch.no_grad():
                return run(b, c, inp.v, inp.a)

        leaves = _leaves(b, c, inp.v, inp.a)
        return Step(bench.Prepared(forward, to_bhnd), lambda: torch.autograd.grad(run(*leaves), leaves, do))

    return Impl(label, "ours", make)


def ours_from_x_dt() -> Impl:
    """``auto`` with v = dt·x and a = A·dt formed inside the timed call, from mamba-ssm's inputs: v by
    ``leettriton.nn.functional.scale_values`` (what the Mamba-2 layer calls: one pass each way), a in PyTorch."""
    from leettriton.nn.functional import scale_values

    def make(inp: Inputs, do) -> Step:
        def run(x, dt, A, B, C):
            v = scale_values(x, dt)
            return leettriton.linear_attention(C, B, v, log_decay=A * dt, layout="bnhd", method="auto")

        def forward():
            with torch.no_grad():
                return run(inp.x, inp.dt, inp.A, inp.B, inp.C)

        leaves = _leaves(inp.x, inp.dt, inp.A, inp.B, inp.C)
        return Step(bench.Prepared(forward, to_bhnd), lambda: torch.autograd.grad(run(*leaves), leaves, do))

    return Impl(FROM_X_DT, "ours", make)


def fla_impl() -> Impl:
    """fla's ``chunk_simple_gla(q, k, v, g=a, scale=1.0)``: q = C and k = B expanded to H_v heads."""
    def make(inp: Inputs, do) -> Step:
        from fla.ops.simple_gla import chunk_simple_gla

        q, k = (inp.expand(x).contiguous() for x in (inp.C, inp.B))
        g = inp.a.contiguous()

        def forward():
            with torch.no_grad():
                return chunk_simple_gla(q, k, inp.v, g=g, scale=1.0)[0]

        leaves = _leaves(q, k, inp.v, g)
        def train():
            return torch.autograd.grad(chunk_simple_gla(*leaves[:3], g=leaves[3], scale=1.0)[0], leaves, do)

        return Step(bench.Prepared(forward, to_bhnd), train)

    return Impl(FLA, "peer", make, precision=PEERS.PEER_PRECISION)


def mamba_impl(ssd: Callable) -> Impl:
    """mamba-ssm's ``mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=256)``."""
    def make(inp: Inputs, do) -> Step:
        def run(x, dt, A, B, C):
            return ssd(x, dt, A, B, C, CHUNK_SIZE)

        def forward():
            with torch.no_grad():
                return run(inp.x, inp.dt, inp.A, inp.B, inp.C)

        leaves = _leaves(inp.x, inp.dt, inp.A, inp.B, inp.C)
        return Step(bench.Prepared(forward, to_bhnd), lambda: torch.autograd.grad(run(*leaves), leaves, do))

    return Impl(MAMBA, "peer", make, precision=PEERS.PEER_PRECISION)


# --------------------------------------------------------------------------- peers

@dataclass
class Peers:
    """The peers found: fla's availability, mamba-ssm's two functions, and each one's line for the run."""

    fla: bool = False
    ssd: Optional[Callable] = None
    state_update: Optional[Callable] = None
    status: dict = field(default_factory=dict)     # name → "available: …" / "missing: why"


def load_mamba(src: str) -> tuple[Optional[types.SimpleNamespace], str]:
    """mamba-ssm's ``mamba_chunk_scan_combined`` and ``selective_state_update`` from the source tree ``src`` (its
    ``mamba_ssm/ops/triton`` and ``mamba_ssm/utils``), or None and why not.

    ``src`` goes on ``sys.path``; its packages are registered as empty modules first, so that
    ``mamba_ssm/__init__.py`` (which imports the CUDA extensions) never runs: only the Triton kernels load.
    """
    path = src if os.path.isabs(src) or os.path.isdir(src) else os.path.join(ROOT, src)
    path = os.path.abspath(path)
    need = os.path.join(path, "mamba_ssm", "ops", "triton", "ssd_combined.py")
    if not os.path.exists(need):
        return None, (f"no mamba_ssm/ops/triton/ssd_combined.py under {src} (export the Triton kernels of "
                      f"github.com/state-spaces/mamba there, or pass --mamba-src)")
    if path not in sys.path:
        sys.path.insert(0, path)
    for pkg in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.utils"):
        where = os.path.join(path, *pkg.split("."))
        mod = sys.modules.get(pkg)
        if mod is None or list(getattr(mod, "__path__", [])) != [where]:
            mod = types.ModuleType(pkg)
            mod.__path__ = [where]
            sys.modules[pkg] = mod
    try:
        combined = importlib.import_module("mamba_ssm.ops.triton.ssd_combined")
        update = importlib.import_module("mamba_ssm.ops.triton.selective_state_update")
    except Exception as exc:  # noqa: BLE001  (a broken export is reported, not fatal)
        return None, f"importing it from {path} failed: {type(exc).__name__}: {first_line(exc)}"
    commit = "?"
    commit_file = os.path.join(path, "COMMIT")
    if os.path.exists(commit_file):
        with open(commit_file) as f:
            commit = f.read().strip()[:12] or "?"
    return types.SimpleNamespace(ssd=combined.mamba_chunk_scan_combined,
                                 state_update=update.selective_state_update, commit=commit,
                                 path=path), ""


def find_peers(rep: common.Report, args) -> Peers:
    """fla (imported when first called) and mamba-ssm (loaded now), each named in the run, present or not."""
    peers = Peers()
    found = bench.peers(rep.device, ["fla_chunk_simple_gla", "fla_fused_recurrent_simple_gla"], rep.notes)
    peers.fla = len(found) == 2
    why = next((n.split("not available: ", 1)[1] for n in rep.notes if "fla" in n and "not available" in n),
               "not installed")
    peers.status["fla"] = f"available: fla-core {PEERS._version_of('fla-core')}" if peers.fla else f"missing: {why}"
    if args.no_mamba:
        why = "--no-mamba"
    elif rep.device.type != "cuda":
        why = "needs a CUDA device"
    else:
        got, why = load_mamba(args.mamba_src)
        if got is not None:
            peers.ssd, peers.state_update = got.ssd, got.state_update
            peers.status["mamba-ssm"] = f"available: state-spaces/mamba {got.commit}, Triton kernels from {got.path}"
            rep.notes.append(f"peer mamba-ssm: state-spaces/mamba at {got.commit} (its Triton kernels only, from "
                             f"{args.mamba_src}): {MAMBA}, selective_state_update")
    if peers.ssd is None:
        peers.status["mamba-ssm"] = f"missing: {why}"
        rep.notes.append(f"peer mamba-ssm: not available: {why}")
    for name, status in peers.status.items():
        print(f"peer {name}: {status}", flush=True)
    if not peers.fla or peers.ssd is None:
        print("!! a peer is missing: its columns are empty and its targets n/a (see the notes)", flush=True)
    rep.meta["peers"] = peers.status
    return peers


# --------------------------------------------------------------------------- grouped heads

def grouped_support() -> dict[str, Optional[str]]:
    """Whether this tree takes b and c with fewer heads than v: None for yes, else why not, for
    ``linear_attention`` and ``decode_step`` (tiny CPU calls of the PyTorch path)."""
    b = torch.randn(1, 8, 1, 4)
    v = torch.randn(1, 8, 2, 4)
    a = -torch.rand(1, 8, 2)
    why: dict[str, Optional[str]] = {}
    try:
        out = leettriton.linear_attention(b, b, v, log_decay=a, layout="bnhd", method="vanilla_torch")
        why["linear_attention"] = None if tuple(out.shape) == tuple(v.shape) else f"output of shape {tuple(out.shape)}"
    except (ValueError, TypeError, NotImplementedError, RuntimeError) as exc:
        why["linear_attention"] = first_line(exc)
    try:
        state = torch.zeros(1, 2, 4, 4)
        out, _ = leettriton.decode_step(b[:, 0], b[:, 0], v[:, 0], state, log_decay=a[:, 0])
        why["decode_step"] = None if tuple(out.shape) == (1, 2, 4) else f"output of shape {tuple(out.shape)}"
    except (ValueError, TypeError, NotImplementedError, RuntimeError) as exc:
        why["decode_step"] = first_line(exc)
    return why


# --------------------------------------------------------------------------- measuring

class Clock:
    """``--max-minutes``: :meth:`check` raises :class:`OutOfTime` once the run has taken that long."""

    def __init__(self, minutes: Optional[float]):
        self.start = time.monotonic()
        self.limit = None if minutes is None else minutes * 60

    def check(self, what: str) -> None:
        if self.limit is not None and time.monotonic() - self.start > self.limit:
            raise OutOfTime(what)

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def floor_bytes(layer: Layer, batch: int, n: int, dtype) -> int:
    """b and c (H_k heads), v and o (H_v heads) in the dtype and a (float32) once each."""
    e = torch.empty((), dtype=dtype).element_size()
    return batch * n * (2 * layer.kv_heads * layer.r * e + 2 * layer.heads * layer.d * e + layer.heads * 4)


def clear_tuned() -> None:
    """Forget every config our kernels and the peers' (fla's, mamba-ssm's Triton autotuners) have tuned."""
    import triton.runtime.autotuner as autotuner

    for kernel in KERNELS.values():
        kernel.cache.clear()
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith(("fla.", "mamba_ssm.")):
            continue
        for obj in list(vars(mod).values()):
            while not isinstance(obj, autotuner.Autotuner) and hasattr(obj, "fn"):   # through heuristics, JIT
                obj = obj.fn
            if isinstance(obj, autotuner.Autotuner):
                obj.cache.clear()


def row_of(section, model, impl_label, kind, inp_layer: Layer, dt, batch, n, m: bench.Measurement, **extra) -> dict:
    return dict(section=section, model=model, method=impl_label, kind=kind, dtype=bench.dtype_name(dt), batch=batch,
                n=n, heads=inp_layer.heads, kv_heads=inp_layer.kv_heads, r=inp_layer.r, d=inp_layer.d,
                median_ms=m.median_ms, p20_ms=m.p20_ms, p80_ms=m.p80_ms, rel_err=m.rel_err, status=m.status,
                note=m.note, **extra)


def run_cells(rep: common.Report, args, clock: Clock, model: str, layer: Layer, impls: list[Impl], dtypes, cells,
              sections, rep_ms, judged: str, trained: set) -> None:
    """The forward and training cells of one layer, largest first, every kernel tuned at the first cell of each
    dtype (every cell with ``--retune``);
    ``judged``: the entry of ours timed again in rounds beside the peers; ``trained``: the entries whose
    training step is timed."""
    device = rep.device
    budget_ms = args.budget_s * 1e3
    for dt in dtypes:
        for i, (batch, n) in enumerate(cells):
            clock.check(f"{model} {bench.dtype_name(dt)} {batch} × {n}")
            if i == 0 or args.retune:
                clear_tuned()
            inp = make_inputs(layer, batch, n, dt, device, seed=SEED + n + batch)
            floor = floor_bytes(layer, batch, n, dt) / rep.bandwidth * 1e3
            if "forward" in sections:
                check = oracle(inp, max_rows=args.err_rows)
                for impl in impls:
                    # ours is held to the tolerance (WRONG above it); a peer's error is recorded, not judged
                    tol = bench.tolerance(dt) if impl.kind == "ours" else None
                    m = bench.measure(lambda impl=impl: impl.make(inp, None).forward, check=check, tol=tol,
                                      device=device, rep_ms=rep_ms, budget_ms=budget_ms)
                    row = row_of("forward", model, impl.label, impl.kind, layer, dt, batch, n, m, floor_ms=floor,
                                 tol=tol, err_scope=check.scope)
                    rep.rows.append(row)
                    print(f"forward  {model:<9} {row['dtype']:<8} {batch} × {n:<6} {impl.label:<34} "
                          f"{common.cell(row):>9} ms  err {common.fmt_err(m.rel_err)}  {m.status} {m.note}", flush=True)
                del check
                if device.type == "cuda":
                    try:
                        forward_rounds(rep.rows, impls, inp, model, dt, batch, n, judged)
                    except Exception as exc:  # noqa: BLE001  (the sweep's times stand; a kernel fault ends the run)
                        if is_fatal(exc):
                            raise bench.DeviceFailure(first_line(exc)) from exc
                        for row in rep.rows[-len(impls):]:
                            row["rounds_note"] = f"rounds not timed: {first_line(exc)}"
                        bench.free_memory()
            if "train" in sections:
                gen = torch.Generator(device=device).manual_seed(3)
                do = torch.randn(inp.x.shape, generator=gen, device=device, dtype=dt)
                for impl in impls:
                    if impl.label not in trained:
                        continue
                    fwd = common.find(rep.rows, section="forward", model=model, method=impl.label,
                                      dtype=bench.dtype_name(dt), batch=batch, n=n)
                    m = bench.measure(lambda impl=impl: impl.make(inp, do).train, device=device, rep_ms=rep_ms,
                                      budget_ms=budget_ms)
                    row = row_of("train", model, impl.label, impl.kind, layer, dt, batch, n, m,
                                 fwd_ms=_ms(fwd) if fwd else None)
                    rep.rows.append(row)
                    print(f"train    {model:<9} {row['dtype']:<8} {batch} × {n:<6} {impl.label:<34} "
                          f"{common.cell(row):>9} ms  {m.status} {m.note}", flush=True)
                del do
            del inp
            bench.free_memory()
            rep.save(args.out)    # each cell's rows on disk: a run killed by a time limit keeps them


def forward_rounds(rows, impls, inp: Inputs, model, dt, batch, n, judged: str = AUTO) -> None:
    """``judged`` (``auto``), fla and mamba-ssm of one cell again in alternating rounds, from Python
    (``rounds_ms``) and as CUDA-graph replays (``graph_ms``; where a capture fails ``graph_note`` says why)."""
    ok = {}
    for impl in impls:
        if impl.label in (judged, FLA, MAMBA):
            row = common.find(rows, section="forward", model=model, method=impl.label, dtype=bench.dtype_name(dt),
                              batch=batch, n=n)
            if row and row["status"] == "ok" and row["median_ms"]:
                ok[impl.label] = (impl, row)
    if len(ok) < 2:
        return
    calls = {label: impl.make(inp, None).forward for label, (impl, _) in ok.items()}
    for label, ms in confirm_rounds(calls).items():
        ok[label][1]["rounds_ms"] = ms
    graphs = {}
    for label, fn in calls.items():
        try:
            graphs[label] = bench.graph_replay(fn)
        except RuntimeError as exc:
            ok[label][1]["graph_note"] = f"capture failed: {type(exc).__name__}: {str(exc)[:200]}"
    if len(graphs) >= 2:
        for label, ms in confirm_rounds(graphs).items():
            ok[label][1]["graph_ms"] = ms
    del calls, graphs
    torch.cuda.empty_cache()


def ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    return None if not num or not den else num / den


def fmt_x(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:.2f}×"


def cell_tables(rep: common.Report, model: str, layer: Layer, impls: list[Impl], dtypes, cells, sections,
                peers: Peers, judged: str) -> None:
    """The forward and training tables of one layer and their targets (``judged``: the entry of ours held to
    them, ``auto`` or, where the tree refuses grouped heads, ``auto`` on expanded b, c)."""
    gpu = rep.device.type == "cuda"
    labels = [i.label for i in impls]
    ours_methods = [i.label for i in impls if i.kind == "ours" and not i.label.startswith(AUTO)]
    shape = f"H_v {layer.heads}, H_k {layer.kv_heads}, r = {layer.r}, d = {layer.d}"
    missing = {FLA: "fla missing" if not peers.fla else None,
               MAMBA: "mamba-ssm missing" if peers.ssd is None else None}
    for dt in dtypes:
        dname = bench.dtype_name(dt)
        if "forward" in sections:
            body, speed = [], {FLA: [], MAMBA: []}
            for batch, n in sorted(cells):
                get = {x: common.find(rep.rows, section="forward", model=model, method=x, dtype=dname, batch=batch, n=n)
                       for x in labels}
                t = {x: _ms(get[x]) for x in labels}
                g = {x: (get[x] or {}).get("graph_ms") for x in labels}
                for peer in (FLA, MAMBA):
                    s = ratio(t.get(peer), t.get(judged))
                    if s is not None:
                        speed[peer].append(s)
                timed = [x for x in ours_methods if t[x]]
                best = min(timed, key=lambda x: t[x]) if timed else None
                floor = next((r["floor_ms"] for r in get.values() if r), None)
                errs = " / ".join(common.fmt_err((get.get(x) or {}).get("rel_err")) for x in (judged, FLA, MAMBA))
                body.append([f"{batch} × {n}", *(common.cell(get[x]) for x in labels), common.fmt_ms(floor),
                             fmt_x(ratio(t.get(FLA), t.get(judged))), fmt_x(ratio(t.get(MAMBA), t.get(judged))),
                             fmt_x(ratio(g.get(FLA), g.get(judged))), fmt_x(ratio(g.get(MAMBA), g.get(judged))),
                             fmt_x(ratio(t.get(judged), floor)), best or "—",
                             errs])
            for peer, goal, limit, strict in ((FLA, "≥ 1.5×", 1.5, False), (MAMBA, "> 1× (ahead)", 1.0, True)):
                got = speed[peer]
                rep.target(f"{judged} forward vs {peer}, {layer.label} {dname} (worst cell)",
                           missing[peer] or ("—" if not got else f"{min(got):.2f}× (best {max(got):.2f}×)"), goal,
                           None if not got or not gpu else (min(got) > limit if strict else min(got) >= limit))
            rep.section(f"{layer.label}, forward, {dname}: {shape}, per-token decay",
                        ["batch × n", *labels, "floor ms", f"fla / {judged}", f"mamba / {judged}",
                         f"fla / {judged}, kernels", f"mamba / {judged}, kernels", f"{judged} × floor",
                         "fastest method of ours", f"rel err {judged} / fla / mamba"], body,
                        f"Median ms of one call (do_bench; p20/p80 in the JSON rows). The ratios take each entry's "
                        f"lower time of the sweep and of five alternating rounds of {judged}, fla and mamba-ssm "
                        f"('rounds_ms'), calls from Python; ', kernels': the same calls captured in CUDA graphs, "
                        f"the replays timed in rounds ('graph_ms'). '> 1×': ours is faster. fla reads q, k "
                        f"expanded to H_v heads; mamba-ssm forms dt·x and A·dt in its call, which "
                        f"'{FROM_X_DT}' times for ours. Floor: b, c (H_k heads), v, a and o once at the copy "
                        f"bandwidth. Errors against the float64 oracle on the rows' err_scope: ours held to the "
                        f"dtype's tolerance, the peers' shown.")
        if "train" in sections:
            body, speed = [], {FLA: [], MAMBA: []}
            tl = [x for x in labels if common.find(rep.rows, section="train", model=model, method=x, dtype=dname)]
            for batch, n in sorted(cells):
                get = {x: common.find(rep.rows, section="train", model=model, method=x, dtype=dname, batch=batch, n=n)
                       for x in tl}
                t = {x: (get[x] or {}).get("median_ms") if (get[x] or {}).get("status") == "ok" else None for x in tl}
                for peer in (FLA, MAMBA):
                    s = ratio(t.get(peer), t.get(judged))
                    if s is not None:
                        speed[peer].append(s)
                jr = get.get(judged)
                body.append([f"{batch} × {n}", *(common.cell(get[x]) for x in tl),
                             fmt_x(ratio(t.get(FLA), t.get(judged))), fmt_x(ratio(t.get(MAMBA), t.get(judged))),
                             fmt_x(ratio(t.get(judged), (jr or {}).get("fwd_ms")))])
            for peer, goal, limit, strict in ((FLA, "≥ 1.5×", 1.5, False), (MAMBA, "> 1× (ahead)", 1.0, True)):
                got = speed[peer]
                rep.target(f"{judged} training step vs {peer}, {layer.label} {dname} (worst cell)",
                           missing[peer] or ("—" if not got else f"{min(got):.2f}× (best {max(got):.2f}×)"), goal,
                           None if not got or not gpu else (min(got) > limit if strict else min(got) >= limit))
            rep.section(f"{layer.label}, training step, {dname}: {shape}, per-token decay",
                        ["batch × n", *tl, f"fla / {judged}", f"mamba / {judged}", f"{judged} step / forward"], body,
                        "Median ms of one training step: the forward, then torch.autograd.grad of every input "
                        "(ours: b, c, v, a; fla: q, k, v, g; mamba-ssm and 'auto (from x, dt)': x, dt, A, B, C) "
                        "with a random do, timed together (do_bench). '> 1×': ours is faster.")


# --------------------------------------------------------------------------- decode

def decode_bytes(layer: Layer, batch: int, dtype) -> int:
    """One step's bytes: the float32 state read and written; b_t, c_t (H_k heads), v_t, o_t; a_t (float32)."""
    e = torch.empty((), dtype=dtype).element_size()
    H, r, d = layer.heads, layer.r, layer.d
    return batch * (2 * H * r * d * 4 + 2 * layer.kv_heads * r * e + 2 * H * d * e + H * 4)


def run_decode(rep: common.Report, args, clock: Clock, model: str, layer: Layer, dtypes, batches, peers: Peers,
               grouped: Optional[str], rep_ms) -> None:
    device = rep.device
    budget_ms = args.budget_s * 1e3
    label = DEC_OURS + ("" if grouped is None or layer.group == 1 else EXPANDED)
    body = []
    for dt in dtypes:
        for batch in batches:
            clock.check(f"decode {model} {bench.dtype_name(dt)} B={batch}")
            inp = make_inputs(layer, batch, 1, dt, device, seed=SEED + batch)
            x, dtt, B_t, C_t = inp.x[:, 0], inp.dt[:, 0], inp.B[:, 0], inp.C[:, 0]
            v_t, a_t = inp.v[:, 0], inp.a[:, 0]
            gen = torch.Generator(device=device).manual_seed(7)
            state0 = torch.randn(batch, layer.heads, layer.r, layer.d, generator=gen, device=device)
            b64, c64 = (inp.expand(z).double() for z in (C_t, B_t))
            new = torch.exp(a_t.double())[..., None, None] * state0.double() + \
                c64.unsqueeze(-1) * (x.double() * dtt.double().unsqueeze(-1)).unsqueeze(-2)
            check = bench.Oracle(torch.einsum("bhr,bhrd->bhd", b64, new), list(range(batch)),
                                 list(range(layer.heads)), "all")
            del b64, c64, new
            nbytes = decode_bytes(layer, batch, dt)
            floor = nbytes / rep.bandwidth * 1e3

            def ours_step():
                bt, ct = (inp.expand(z).contiguous() for z in (C_t, B_t)) if label != DEC_OURS else (C_t, B_t)
                st = state0.clone()
                return lambda: leettriton.decode_step(bt, ct, v_t, st, log_decay=a_t)[0]

            calls = {label: ours_step}
            if peers.fla:
                def fla_step():
                    from fla.ops.simple_gla import fused_recurrent_simple_gla

                    q, k = (inp.expand(z).unsqueeze(1).contiguous() for z in (C_t, B_t))   # [B, 1, H_v, K]
                    vv, g, st = v_t.unsqueeze(1).contiguous(), a_t.unsqueeze(1).contiguous(), state0.clone()
                    return bench.Prepared(lambda: fused_recurrent_simple_gla(q, k, vv, g=g, scale=1.0, initial_state=st,
                                                                             output_final_state=True),
                                          lambda res: res[0].squeeze(1))
                calls[DEC_FLA] = fla_step
            if peers.state_update is not None:
                def mamba_step():
                    H, d, r = layer.heads, layer.d, layer.r
                    st = state0.transpose(-1, -2).contiguous()                             # (B, H, d, r)
                    dt_e = dtt.unsqueeze(-1).expand(batch, H, d)                           # Mamba2.step's broadcasts
                    A_e = inp.A.view(H, 1, 1).expand(H, d, r)
                    zero = torch.zeros(H, device=device).unsqueeze(-1).expand(H, d)        # D and dt_bias: its
                    xc, Bc, Cc = x.contiguous(), B_t.contiguous(), C_t.contiguous()     # launch needs both
                    return lambda: peers.state_update(st, xc, dt_e, A_e, Bc, Cc, D=zero, dt_bias=zero,
                                                      dt_softplus=False)
                calls[DEC_MAMBA] = mamba_step
            got = {}
            for name, prepare in calls.items():
                tol = bench.tolerance(dt) if name == label else None       # a peer's error: recorded, not judged
                m = bench.measure(prepare, check=check, tol=tol, device=device, rep_ms=rep_ms, budget_ms=budget_ms)
                bw = None if m.median_ms is None else nbytes / (m.median_ms * 1e-3)
                row = row_of("decode", model, name, "ours" if name == label else "peer", layer, dt, batch, 1, m,
                             floor_ms=floor, bytes=nbytes, bandwidth_gbs=None if bw is None else bw / 1e9,
                             bandwidth_frac=None if bw is None else bw / rep.bandwidth)
                rep.rows.append(row)
                got[name] = row
                print(f"decode   {model:<9} {row['dtype']:<8} B={batch:<4} {name:<34} {common.cell(row):>9} ms  "
                      f"{'' if bw is None else f'{bw / 1e9:7.0f} GB/s ({bw / rep.bandwidth:5.1%} of copy)'}  "
                      f"err {common.fmt_err(m.rel_err)}  {m.status} {m.note}", flush=True)
            mine = got[label]
            frac = mine["bandwidth_frac"]

            def pct(row):
                return "—" if not row or row["bandwidth_frac"] is None else f"{row['bandwidth_frac']:.0%}"

            body.append([bench.dtype_name(dt), batch, common.cell(mine),
                         "—" if frac is None else f"{mine['bandwidth_gbs']:.0f} GB/s ({frac:.0%})",
                         common.fmt_err(mine["rel_err"]), common.cell(got.get(DEC_FLA)), pct(got.get(DEC_FLA)),
                         common.cell(got.get(DEC_MAMBA)), pct(got.get(DEC_MAMBA)),
                         fmt_x(ratio(_ms(got.get(DEC_FLA)), _ms(mine))),
                         fmt_x(ratio(_ms(got.get(DEC_MAMBA)), _ms(mine))),
                         common.fmt_ms(floor)])
            if batch >= 64 or device.type != "cuda":
                rep.target(f"{label} {layer.label} {bench.dtype_name(dt)} B={batch}: bandwidth vs copy",
                           "—" if frac is None else f"{frac:.0%}", "≥ 90% (batch ≥ 64)",
                           None if frac is None or device.type != "cuda" else frac >= 0.9)
            del inp, state0, check, calls
            bench.free_memory()
            rep.save(args.out)
    rep.section(f"{layer.label}, decode: one token, H_v {layer.heads}, H_k {layer.kv_heads}, r = {layer.r}, "
                f"d = {layer.d}, per-token decay",
                ["dtype", "batch", "ours ms", "ours bandwidth (% of copy)", "ours rel err", "fla ms", "fla % of copy",
                 "mamba ms", "mamba % of copy", "fla / ours", "mamba / ours", "floor ms"], body,
                f"Bytes per step: 2·B·H_v·r·d·4 (float32 state read + written) + B·H_k·2r·e (b_t, c_t) + "
                f"B·H_v·2d·e (v_t, o_t) + B·H_v·4 (a_t); copy bandwidth {rep.bandwidth / 1e9:.0f} GB/s measured "
                f"in this run. fla: fused_recurrent_simple_gla on one token (q, k expanded to H_v heads) with "
                f"initial_state and output_final_state=True (it writes a new state; ours and mamba-ssm's update "
                f"theirs in place). mamba-ssm: selective_state_update with its state as (B, H, d, r), float32.")


# --------------------------------------------------------------------------- precision

def run_precision(rep: common.Report, args, clock: Clock, model: str, layer: Layer, impls: list[Impl], dtypes,
                  batch: int, n: int) -> None:
    device = rep.device
    body, labels = [], [i.label for i in impls]
    for dt in dtypes:
        clock.check(f"precision {model} {bench.dtype_name(dt)}")
        inp = make_inputs(layer, batch, n, dt, device, seed=11)
        check = oracle(inp)
        line = [bench.dtype_name(dt)]
        for impl in impls:
            tol = bench.tolerance(dt, impl.precision if dt == torch.float32 else None)
            m = bench.measure(lambda impl=impl: impl.make(inp, None).forward, check=check, tol=tol, device=device,
                              timed=False)
            rep.rows.append(row_of("precision", model, impl.label, impl.kind, layer, dt, batch, n, m, tol=tol,
                                   err_scope=check.scope))
            line.append(m.status if m.rel_err is None else
                        f"{common.fmt_err(m.rel_err)} {'ok' if m.status == 'ok' else 'FAIL'}")
            print(f"precision {model:<9} {bench.dtype_name(dt):<8} {impl.label:<34} err {common.fmt_err(m.rel_err)} "
                  f"(tol {tol:.0e}) {m.status} {m.note}", flush=True)
            if impl.kind == "ours":
                rep.target(f"precision {impl.label}, {layer.label} {bench.dtype_name(dt)} {batch} × {n}",
                           common.fmt_err(m.rel_err) if m.rel_err is not None else m.status, f"≤ {tol:.0e}",
                           False if m.status in ("WRONG", "error") else (None if m.rel_err is None else True))
        body.append(line)
        del inp, check
        bench.free_memory()
    rep.section(f"{layer.label}, precision at {batch} × {n}: relative error vs the float64 oracle",
                ["dtype", *labels], body,
                "‖out − oracle‖ / ‖oracle‖ over every head and row; the oracle takes dt·x exactly (float32) "
                "and b, c expanded to their heads. Tolerances: float16 2e-3, bfloat16 1e-2 (the peers' float32 goes "
                "through TF32, judged at 2e-3).")


# --------------------------------------------------------------------------- main

@contextlib.contextmanager
def pytorch_paths(device):
    """Off the GPU, ours runs its PyTorch paths, as on CPU tensors outside the interpreter, even where
    ``TRITON_INTERPRET`` is set (the tests set it): the per-token kernels in the interpreter take seconds a
    call, and this run checks the script's logic, not the kernels (the test suite does)."""
    if torch.device(device).type == "cuda" or not is_interpreting():
        yield
        return
    before = os.environ["TRITON_INTERPRET"]
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        yield
    finally:
        os.environ["TRITON_INTERPRET"] = before


SECTIONS = ("forward", "train", "decode", "precision")


def main(argv=None) -> common.Report:
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--dtypes", default="float16,bfloat16", help="comma-separated: float16, bfloat16, float32")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--seqlens", default="2048,8192,32768")
    p.add_argument("--decode-batches", default="1,8,64,256")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    p.add_argument("--methods", help="comma-separated per-token methods of ours besides auto (default: every one "
                   "of leettriton.registry.per_token_methods() with a kernel; 'none' for auto alone)")
    p.add_argument("--train-methods", default="", help="per-token methods of ours timed in the training step "
                   f"besides auto (default none; the peers and '{FROM_X_DT}' always are)")
    p.add_argument("--precision-shape", default="1x8192", help="BATCHxN of the precision section")
    p.add_argument("--expand-groups", action="store_true", help="also time auto with b, c copied to one per head "
                   f"of v (rows labelled '{AUTO}{EXPANDED}')")
    p.add_argument("--retune", action="store_true", help="every autotuned kernel, ours and the peers', tunes again "
                   "at every cell (by default at the first, largest cell of each layer and dtype)")
    p.add_argument("--mamba-src", default=MAMBA_SRC, help="a folder holding mamba-ssm's mamba_ssm/ops/triton and "
                   f"mamba_ssm/utils (default {MAMBA_SRC}, relative to the repository)")
    p.add_argument("--no-mamba", action="store_true", help="leave mamba-ssm out (recorded as missing)")
    p.add_argument("--err-rows", type=int, default=1 << 19, help="most (batch, head, position) rows of the oracle "
                   "in a speed cell (default 2^19; the precision section checks every row)")
    p.add_argument("--max-minutes", type=float, help="stop starting cells after this many minutes (what is "
                   "measured is written; the run's notes say what was left)")
    args = p.parse_args(argv)
    device = common.device_of(args)
    models = _csv(args.models, str, "models", MODELS)
    dtypes = [getattr(torch, x) for x in _csv(args.dtypes, str, "dtypes", {"float16", "bfloat16", "float32"})]
    batches = _csv(args.batches, int, "batches")
    seqlens = _csv(args.seqlens, int, "seqlens")
    decode_batches = _csv(args.decode_batches, int, "decode-batches")
    sections = _csv(args.sections, str, "sections", set(SECTIONS))
    try:
        pb, pn = (int(x) for x in args.precision_shape.split("x"))
    except ValueError:
        p.error(f"--precision-shape takes BATCHxN such as 1x8192, got {args.precision_shape!r}")
    kernels = [m for m in per_token_methods() if m != AUTO and not m.endswith("_torch")]
    args.train_methods = [] if not args.train_methods else _csv(args.train_methods, str, "train-methods", set(kernels))
    if args.methods is None:
        methods = kernels
    elif args.methods == "none":
        methods = []
    else:
        methods = [m for m in _csv(args.methods, str, "methods", set(kernels)) if m != AUTO]
    if min(batches + seqlens + decode_batches + [pb, pn]) < 1:
        p.error("batches, sequence lengths and the precision shape must be positive")
    if device.type == "cuda":
        layers = MODELS
        if args.quick:
            dtypes, batches, seqlens, decode_batches = dtypes[:1], [1, 8], [8192], [1, 64]
    else:   # the PyTorch paths on tiny shapes: the script's logic, not a measurement
        layers = CPU_MODELS
        dtypes, batches, seqlens, decode_batches, pb, pn = dtypes[:1], [1, 2], [64], [1, 4], 1, 96
    cells = sorted(((b, n) for b in batches for n in seqlens), key=lambda c: -c[0] * c[1])   # largest first
    rep = common.Report(NAME, "Per-token decay vs fla and mamba-ssm", common.cli_argv(argv), device, args.quick)
    rep_ms = args.rep_ms or (50 if args.quick else 100)
    clock = Clock(args.max_minutes)
    peers = find_peers(rep, args)
    rep.meta["per_token_methods"] = list(methods)
    failed = None
    try:
        with pytorch_paths(device):
            grouped = grouped_support()
            rep.meta["grouped_heads"] = {k: "supported" if v is None else f"refused: {v}" for k, v in grouped.items()}
            for what, why in grouped.items():
                if why is not None:
                    rep.note(f"this tree's {what} refuses b, c with fewer heads than v ({why}): ours runs on b, c "
                             f"expanded to one per head of v at the grouped layers, labelled '{EXPANDED.strip()}'")
            for model in models:
                try:
                    run_layer(rep, args, clock, model, layers[model], methods, peers, grouped, dtypes, cells,
                              sections, decode_batches, (pb, pn), rep_ms)
                except OutOfTime as exc:
                    rep.note(f"stopped at the time limit (--max-minutes {args.max_minutes:g}) before {exc}: the "
                             f"cells after it, and the layers after {model}, were not measured")
                    rep.meta["cut_short"] = str(exc)
                    break
    except bench.DeviceFailure as exc:
        rep.rows.extend(exc.rows)
        failed = common.stopped(rep, exc)
    rep.meta["elapsed_s"] = round(clock.elapsed(), 1)
    rep.finish(args.out)
    if failed:
        raise SystemExit(1)
    return rep


def implementations(layer: Layer, methods, peers: Peers, device, expand_ours: bool, expand_groups: bool) -> list[Impl]:
    """Ours (``auto`` first, then each per-token method), then the peers found.  ``expand_ours``: the tree
    refuses grouped b, c, so ours runs on expanded copies (labelled so); ``expand_groups``: ``auto`` on
    expanded copies beside it, for comparison."""
    suffix = EXPANDED if expand_ours else ""
    impls = [ours(AUTO + suffix, AUTO, device, expanded=expand_ours)]
    impls += [ours(m + suffix, m, device, expanded=expand_ours) for m in methods]
    if expand_groups and layer.group > 1 and not expand_ours:
        impls.append(ours(AUTO + EXPANDED, AUTO, device, expanded=True))
    if layer.kind == "mamba" and not expand_ours:
        impls.append(ours_from_x_dt())
    if peers.fla:
        impls.append(fla_impl())
    if peers.ssd is not None:
        impls.append(mamba_impl(peers.ssd))
    return impls


def run_layer(rep: common.Report, args, clock: Clock, model: str, layer: Layer, methods, peers: Peers, grouped,
              dtypes, cells, sections, decode_batches, precision_shape, rep_ms) -> None:
    """One layer's sections in turn, each written as soon as it is measured; at ``--max-minutes``
    (:class:`OutOfTime`) the tables of what was measured are made before it goes on up."""
    expand_ours = layer.group > 1 and grouped["linear_attention"] is not None
    judged = AUTO + (EXPANDED if expand_ours else "")
    impls = implementations(layer, methods, peers, rep.device, expand_ours, args.expand_groups)
    suffix = EXPANDED if expand_ours else ""
    trained = {judged, FROM_X_DT, FLA, MAMBA, AUTO + EXPANDED} | {m + suffix for m in args.train_methods}
    if {"forward", "train"} & set(sections):
        try:
            run_cells(rep, args, clock, model, layer, impls, dtypes, cells, sections, rep_ms, judged, trained)
        finally:
            cell_tables(rep, model, layer, impls, dtypes, cells, sections, peers, judged)
            rep.save(args.out)
    if "decode" in sections:
        try:
            run_decode(rep, args, clock, model, layer, dtypes, decode_batches, peers, grouped["decode_step"], rep_ms)
        finally:
            rep.save(args.out)
    if "precision" in sections:
        run_precision(rep, args, clock, model, layer, impls, dtypes, *precision_shape)
        rep.save(args.out)


if __name__ == "__main__":
    main()
