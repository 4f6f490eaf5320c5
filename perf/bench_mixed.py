"""A serving step of MiniMax-Text-01's lightning layer: prefills and decodes of one mixed batch (docs/design.md §13.8).

The layer: 64 heads, head dim 128 (r = d = 128), a constant decay per head from MiniMax's ALiBi-like slopes,
as vLLM (``vllm/model_executor/layers/mamba/linear/minimax_linear_attn.py``, earlier
``vllm/model_executor/models/minimax_text_01.py``: ``MiniMaxText01LinearAttention._build_slope_tensor`` and its
``__init__``) and SGLang (``python/sglang/srt/layers/attention/linear/lightning_backend.py``,
``_build_slope_tensor``) compute them: for H heads, H a power of two, head h's base slope is
s_h = 2^(−8 (h + 1) / H), scaled for layer l of L by (1 − l / (L − 1) + 1e−5); the decay is γ_h = exp(−slope).
Layer 0 of MiniMax-Text-01's 80 is timed (the fastest decays, γ from exp(−2^(−1/8)) ≈ 0.40 to ≈ 0.996).

The batch, in vLLM's order (decodes first): 192 decodes (one token each, from their slots) then 64 prefills
whose lengths are drawn log-uniformly from 16 to 16 384 tokens (``bench_serving.request_lengths``, seed 0),
new requests (from zero).  bfloat16 (``--dtypes bfloat16,float16`` adds float16); the states float32 in a pool
of twice as many slots as the batch's sequences (padding included), the requests' slots a random choice.  Timed:

* ``ours, one call``: the whole batch as one ``linear_attention_varlen(..., has_initial_state=, out=,
  check_indices=False)`` call on fixed-size buffers (the decodes one-token sequences with
  ``has_initial_state``; padding tokens past the batch, padding sequences of slot −1), eagerly and replayed
  in a CUDA graph (the GPU time alone);
* ``ours, two calls``: ``leettriton.serving.vllm_forward`` on the batch's vLLM metadata: ``decode_step(...,
  slot_ids=)`` for the decodes, then ``linear_attention_varlen`` for the prefills (also replayed in a graph);
* ``vLLM-style loop``: what vLLM's MiniMax layer does (``linear_attention_prefill_and_mix``, called by
  ``_prefill_and_mix_infer``): for each new request it zeroes its slot
  (``clear_linear_attention_cache_for_new_sequences``), then for each prefill, one at a time, transposes the
  request's q, k, v to (heads, n, dim) contiguous copies, reads its slot as the initial state
  (``kv_history``), runs one batch-1 ``lightning_attention`` and copies the final state back into the slot;
  the decodes are one slotted kernel (``linear_decode_forward_triton``) and the outputs are concatenated,
  decodes first.  Replicated here with our ``linear_attention`` per request (the slot as ``initial_state``)
  and our ``decode_step``; its request bounds are host integers (vLLM reads them from device tensors, a
  sync each), so the replica is if anything faster than the original;
* ``fla cu_seqlens``: fla's ``chunk_simple_gla(..., g_gamma=ln γ, cu_seqlens=, initial_state=,
  output_final_state=True)`` on the prefills, their initial states gathered from the pool (zeroed for new
  requests) and the final states scattered back, as engines that use fla do, plus fla's
  ``fused_recurrent_simple_gla`` on the decodes (gather, step, scatter), when fla imports (autotuners on);
* ``rect same tokens``: our rectangular ``linear_attention(..., return_state=True)`` on 64 equal sequences
  holding as many tokens as the batch (the yardstick of issue 72: the one call within 1.15× of it).

Ours are checked against the float64 oracle on the shortest, a middle and the longest prefill and on three
decodes (output rows and pool slots), and the two other ways of ours against the one call (fla's difference
from the one call is reported, not judged).
Targets: ``ours, one call`` faster than the loop and than fla; within 1.15× of ``rect same tokens``.

    python perf/bench_mixed.py                             # on the GPU
    python perf/bench_mixed.py --dtypes bfloat16,float16   # both 16-bit types
    python perf/bench_mixed.py --quick                     # 16 prefills of 16-4096 tokens + 48 decodes
On a machine without CUDA the script runs tiny shapes through the PyTorch paths: a check of its logic,
not a measurement.
"""
from __future__ import annotations

import math
import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from bench_serving import request_lengths  # noqa: E402

import leettriton  # noqa: E402
from leettriton import bench, serving  # noqa: E402

NAME = "bench_mixed"
LAYER, LAYERS = 0, 80     # MiniMax-Text-01 has 80 layers; layer 0 decays fastest
METHODS = ("ours, one call", "ours, two calls", "vLLM-style loop", "fla cu_seqlens", "rect same tokens")


def minimax_gammas(heads: int, layer: int = LAYER, layers: int = LAYERS) -> list[float]:
    """γ_h = exp(−s_h · (1 − layer / (layers − 1) + 1e−5)), s_h = 2^(−8 (h + 1) / heads), heads a power of two."""
    if heads < 1 or heads & (heads - 1):
        raise ValueError(f"heads must be a power of two (MiniMax-Text-01 has 64), got {heads}")
    factor = 1 - layer / max(layers - 1, 1) + 1e-5
    return [math.exp(-(2.0 ** (-8 * (h + 1) / heads)) * factor) for h in range(heads)]


def _fla(device):
    """fla's ``(chunk_simple_gla, fused_recurrent_simple_gla)``, or None (off CUDA, or fla does not import)."""
    if torch.device(device).type != "cuda":
        return None
    try:
        from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
    except Exception:  # noqa: BLE001  (not installed, or fails to import on this machine)
        return None
    return chunk_simple_gla, fused_recurrent_simple_gla


def _time(fn, device, rep_ms, budget_s, *, warm=True):
    try:
        return bench.time_ms(fn, rep_ms=rep_ms, max_call_ms=budget_s * 1e3, device=device, warm=warm)
    except torch.cuda.OutOfMemoryError:
        bench.free_memory()
        return None


def _rel(x, ref) -> float:
    ref = ref.double()
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


class Batch:
    """The step's tensors: tokens in fixed-size buffers (decodes first, then prefills, then padding), the
    offsets, slots and flags of the one call, the vLLM metadata of the same batch, and the pool."""

    def __init__(self, lens, decodes, heads, r, d, dtype, device, pad_tokens, pad_seqs):
        self.lens, self.nd, self.np = lens, decodes, len(lens)
        self.used = decodes + sum(lens)
        self.T, self.N = self.used + pad_tokens, decodes + len(lens) + pad_seqs
        g = torch.Generator(device=device).manual_seed(1)
        self.b, self.c, self.v = (torch.zeros(self.T, heads, x, device=device, dtype=dtype) for x in (r, r, d))
        for x, w in ((self.b, r), (self.c, r), (self.v, d)):
            x[:self.used] = (torch.randn(self.used, heads, w, generator=g, device=device) / math.sqrt(w)).to(dtype)
        seq = [1] * decodes + list(lens)
        bounds = [0] + torch.tensor(seq).cumsum(0).tolist()
        self.bounds = bounds
        cu = bounds + [bounds[-1]] * pad_seqs
        self.cu = torch.tensor(cu, dtype=torch.int32, device=device)
        slots = 2 * (decodes + len(lens) + pad_seqs)
        perm = torch.randperm(slots, generator=g, device=device)[:decodes + len(lens)]
        self.slot_list = perm.tolist()
        self.slots = torch.cat([perm, torch.full((pad_seqs,), -1, device=device, dtype=perm.dtype)])
        self.flags = torch.zeros(self.N, dtype=torch.bool, device=device)
        self.flags[:decodes] = True
        self.dec_slots, self.pf_slots = perm[:decodes], perm[decodes:]
        # the decodes' slots hold states of earlier steps; the prefills' slots whatever a finished request left
        self.pool0 = torch.randn(slots, heads, r, d, generator=g, device=device) * 0.1
        self.pool = self.pool0.clone()
        self.out = torch.zeros(self.T, heads, d, device=device, dtype=dtype)
        # vLLM's LinearAttentionMetadata for the same step (vllm/v1/attention/backends/linear_attn.py)
        self.meta = SimpleNamespace(num_decodes=decodes, num_decode_tokens=decodes, num_prefills=len(lens),
                                    num_prefill_tokens=sum(lens), query_start_loc=self.cu[:decodes + len(lens) + 1],
                                    state_indices_tensor=perm,
                                    seq_lens=torch.tensor(seq, dtype=torch.int32, device=device))


def _one_call(x: Batch, gamma, method):
    def run():
        return leettriton.linear_attention_varlen(x.b, x.c, x.v, x.cu, gamma, method=method, state_pool=x.pool,
                                                  slot_ids=x.slots, has_initial_state=x.flags, check_indices=False,
                                                  out=x.out)
    return run


def _two_calls(x: Batch, gamma):
    rows = slice(0, x.used)
    out = x.out[rows]

    def run():
        return serving.vllm_forward(x.b[rows], x.c[rows], x.v[rows], x.pool, x.meta, gamma, out=out)
    return run


def _loop(x: Batch, gamma, method):
    H, d = x.v.shape[1], x.v.shape[2]

    def run():
        o_dec, _ = leettriton.decode_step(x.b[:x.nd], x.c[:x.nd], x.v[:x.nd], x.pool, gamma, slot_ids=x.dec_slots,
                                          check_slots=False)
        hidden = [o_dec.reshape(x.nd, H * d)]
        for i in range(x.np):
            x.pool[x.slot_list[x.nd + i]].zero_()      # a new request: its slot cleared first
        for i in range(x.np):
            s, e = x.bounds[x.nd + i], x.bounds[x.nd + i + 1]
            slot = x.slot_list[x.nd + i]
            one = [t[s:e].transpose(0, 1).contiguous().unsqueeze(0) for t in (x.b, x.c, x.v)]   # (1, H, n, dim)
            history = x.pool[slot].reshape(1, H, -1, d).contiguous()
            o, st = leettriton.linear_attention(*one, gamma, method=method, initial_state=history, return_state=True)
            x.pool[slot].copy_(st[0])
            hidden.append(o[0].transpose(0, 1).reshape(e - s, H * d))
        return torch.cat(hidden, dim=0).contiguous()
    return run


def _fla_step(x: Batch, gamma, fla):
    chunk, recurrent = fla
    g_fla = torch.log(gamma.double()).float()
    pf = slice(x.nd, x.used)
    q, k, v = (t[pf].unsqueeze(0) for t in (x.b, x.c, x.v))                         # [1, T, H, K]
    cu = (x.cu[x.nd:x.nd + x.np + 1] - x.nd).long()
    keep = x.flags[x.nd:x.nd + x.np].float().view(-1, 1, 1, 1)                      # 0 for a new request
    qd, kd, vd = (t[:x.nd].unsqueeze(1) for t in (x.b, x.c, x.v))                   # [B, 1, H, K]

    def run():
        h0 = x.pool[x.pf_slots].mul_(keep)
        o, ht = chunk(q, k, v, g_gamma=g_fla, scale=1.0, cu_seqlens=cu, initial_state=h0, output_final_state=True)
        x.pool.index_copy_(0, x.pf_slots, ht.float())
        od, hd = recurrent(qd, kd, vd, g_gamma=g_fla, scale=1.0, initial_state=x.pool[x.dec_slots],
                           output_final_state=True)
        x.pool.index_copy_(0, x.dec_slots, hd.float())
        return od, o
    return run


def _check(x: Batch, gamma, out, pool) -> float:
    """Largest relative error against the float64 oracle: the shortest, a middle and the longest prefill and
    three decodes, their output rows and their pool slots (from ``x.pool0``)."""
    order = sorted(range(x.np), key=lambda i: x.lens[i])
    seqs = [x.nd + order[0], x.nd + order[x.np // 2], x.nd + order[-1]] + [0, x.nd // 2, x.nd - 1]
    worst = 0.0
    for i in seqs:
        s, e = x.bounds[i], x.bounds[i + 1]
        slot = x.slot_list[i]
        one = [t[s:e].transpose(0, 1).unsqueeze(0) for t in (x.b, x.c, x.v)]
        init = x.pool0[slot:slot + 1] if i < x.nd else None
        ref, ref_state = leettriton.reference(*one, gamma, initial_state=init, return_state=True)
        worst = max(worst, _rel(out[s:e].transpose(0, 1).unsqueeze(0), ref), _rel(pool[slot:slot + 1], ref_state))
    return worst


def run(rep: common.Report, args, dtypes, lens, decodes, heads, r, d, rep_ms) -> None:
    device = rep.device
    cuda = torch.device(device).type == "cuda"
    method = "auto" if cuda else "lightning_attention_torch"   # off the GPU: the PyTorch twin, not the interpreter
    gamma = torch.tensor(minimax_gammas(heads), device=device)
    fla = _fla(device)
    if fla is None:
        rep.note("fla's chunk_simple_gla / fused_recurrent_simple_gla are not available here: their row is empty")
    if not cuda:
        rep.note("No CUDA: the CUDA-graph replays are not timed")
    T_p = sum(lens)
    body = []
    for dt in dtypes:
        x = Batch(lens, decodes, heads, r, d, dt, device, pad_tokens=256 if cuda else 5, pad_seqs=8 if cuda else 2)
        calls = {"ours, one call": _one_call(x, gamma, method), "ours, two calls": _two_calls(x, gamma),
                 "vLLM-style loop": _loop(x, gamma, method)}
        if fla is not None:
            calls["fla cu_seqlens"] = _fla_step(x, gamma, fla)

        # correctness, each from the initial pool: the one call against float64, the others against it
        x.pool.copy_(x.pool0)
        calls["ours, one call"]()
        err = _check(x, gamma, x.out, x.pool)
        want_out, want_pool = x.out[:x.used].clone(), x.pool.clone()
        agree = {}
        for label in ("ours, two calls", "vLLM-style loop"):
            x.pool.copy_(x.pool0)
            x.out.zero_()
            got = calls[label]()
            got = got.reshape(x.used, heads, d)
            agree[label] = max(_rel(got, want_out), _rel(x.pool, want_pool))
        fla_diff = None
        if "fla cu_seqlens" in calls:   # the peer on the same step, against our one call (not judged)
            x.pool.copy_(x.pool0)
            od, o = calls["fla cu_seqlens"]()
            fla_diff = max(_rel(torch.cat([od.squeeze(1), o.squeeze(0)]), want_out), _rel(x.pool, want_pool))

        # the yardstick: our rectangular call on the same number of tokens, len(lens) equal sequences
        n_same = -(-x.used // len(lens))
        rb = rc = rv = None
        try:
            rb, rc, rv = (torch.randn(len(lens), n_same, heads, w, device=device, dtype=dt) / math.sqrt(w)
                          for w in (r, r, d))
            calls["rect same tokens"] = lambda: leettriton.linear_attention(rb, rc, rv, gamma, method=method,
                                                                            layout="bnhd", return_state=True)
        except torch.cuda.OutOfMemoryError:
            bench.free_memory()
        timings, graphs = {}, {}
        for label, fn in calls.items():
            x.pool.copy_(x.pool0)
            timings[label] = _time(fn, device, rep_ms, args.budget_s)
            if cuda and label in ("ours, one call", "ours, two calls"):
                try:
                    graphs[label] = _time(bench.graph_replay(fn), device, rep_ms, args.budget_s, warm=False)
                except RuntimeError as exc:   # a call that cannot be captured: said, not fatal
                    rep.note(f"{label} ({bench.dtype_name(dt)}): no CUDA-graph replay: {str(exc).splitlines()[0]}")
        rows = {}
        for label in METHODS:
            if label not in timings:
                continue
            med, p20, p80 = timings[label] if timings[label] is not None else (None, None, None)
            graph = graphs.get(label)
            rows[label] = dict(section="mixed", method=label, dtype=bench.dtype_name(dt), median_ms=med, p20_ms=p20,
                               p80_ms=p80, graph_ms=None if graph is None else graph[0],
                               status="ok" if med is not None else "OOM", prefills=len(lens), decodes=decodes,
                               prefill_tokens=T_p, heads=heads, r=r, d=d,
                               rel_err=err if label == "ours, one call" else None,
                               rel_diff_one_call=fla_diff if label == "fla cu_seqlens" else agree.get(label))
            rep.rows.append(rows[label])
        ours = rows["ours, one call"]["median_ms"]
        ours_graph = rows["ours, one call"]["graph_ms"]

        def ratio(label, base=ours):
            other = rows.get(label, {}).get("median_ms")
            return None if other is None or base is None else other / base

        def fmt(x_):
            return "—" if x_ is None else f"{x_:.2f}×"

        body.append([bench.dtype_name(dt), T_p, max(lens)]
                    + [common.cell(rows.get(k)) for k in METHODS]
                    + [common.fmt_ms(ours_graph), common.fmt_ms(rows["ours, two calls"]["graph_ms"]),
                       fmt(ratio("vLLM-style loop")), fmt(ratio("fla cu_seqlens")), fmt(ratio("ours, two calls")),
                       fmt(ratio("rect same tokens")), common.fmt_err(err)])
        for label in ("vLLM-style loop", "fla cu_seqlens"):
            q = ratio(label)
            rep.target(f"mixed {bench.dtype_name(dt)}: {label} time / ours, one call (eager)", fmt(q),
                       "> 1× (one call faster)", None if q is None or not cuda else q > 1)
        q = ratio("ours, two calls")
        rep.target(f"mixed {bench.dtype_name(dt)}: ours, two calls / ours, one call (eager)", fmt(q),
                   "(for information)", None)
        q = ratio("rect same tokens")
        rep.target(f"mixed {bench.dtype_name(dt)}: rect same tokens / ours, one call (eager)", fmt(q),
                   "≥ 1/1.15 = 0.87×", None if q is None or not cuda else q >= 1 / 1.15)
        if fla_diff is not None:
            rep.target(f"mixed {bench.dtype_name(dt)}: fla cu_seqlens vs ours, one call (outputs, slots)",
                       common.fmt_err(fla_diff), "(for information)", None)
        tol = bench.tolerance(dt)
        worst_agree = max(agree.values())
        rep.target(f"mixed {bench.dtype_name(dt)}: one call vs float64; two calls and loop vs one call",
                   f"{common.fmt_err(err)}; {common.fmt_err(worst_agree)}", f"≤ {tol:g}",
                   err <= tol and worst_agree <= tol)
        del x, calls, rb, rc, rv
        bench.free_memory()
    rep.section(
        f"MiniMax-Text-01 lightning layer {LAYER}: {decodes} decodes + {len(lens)} prefills of "
        f"{min(lens)}-{max(lens)} tokens (log-uniform, seed 0), heads {heads}, r = {r}, d = {d}",
        ["dtype", "prefill tokens", "longest"] + [f"{m} ms" for m in METHODS]
        + ["one call graph ms", "two calls graph ms", "loop / one call", "fla / one call", "two calls / one call",
           "rect / one call", "one call rel err"], body,
        "Every way writes each request's state into its pool slot; fla gathers the initial states from the pool "
        "and scatters its final states back. rel err: the one call's output rows and slots of the shortest, a "
        "middle and the longest prefill and of three decodes against the float64 oracle. graph: the call "
        "captured once and replayed (GPU time alone).")


def _dtypes(text: str) -> list[torch.dtype]:
    return [bench.parse_dtype(t.strip()) for t in text.split(",") if t.strip()]


def main(argv=None) -> common.Report:
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--dtypes", default="bfloat16", help="comma-separated: bfloat16 (default), float16")
    args = p.parse_args(common.cli_argv(argv))
    device = common.device_of(args)
    rep = common.Report(NAME, "MiniMax-Text-01's lightning layer: a mixed batch of prefills and decodes",
                        common.cli_argv(argv), device, args.quick)
    rep_ms = args.rep_ms or (50 if args.quick else 100)
    if torch.device(device).type == "cuda":
        count, high, decodes = (16, 4096, 48) if args.quick else (64, 16384, 192)
        lens, heads, r, d = request_lengths(count, 16, high), 64, 128, 128
        dtypes = _dtypes(args.dtypes)
    else:
        lens, decodes, heads, r, d = request_lengths(4, 1, 40), 6, 2, 16, 16
        dtypes = [torch.float32]
    failed = None
    with torch.no_grad():
        try:
            run(rep, args, dtypes, lens, decodes, heads, r, d, rep_ms)
        except bench.DeviceFailure as exc:
            rep.rows.extend(exc.rows)
            failed = common.stopped(rep, exc)
    rep.finish(args.out)
    if failed:
        raise SystemExit(1)
    return rep


if __name__ == "__main__":
    main()
