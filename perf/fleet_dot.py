"""An experiment for fleet_attention: the per-rank decayed cumsum by blocks on tensor cores.

    python perf/fleet_dot.py --check            # correctness against the fp64 oracle (CPU: interpreter)
    python perf/fleet_dot.py --out perf/results # GPU: configs × shapes, beside fleet_attention and
                                                # lightning_attention, measured in the same run

The library's ``fleet_attention`` computes h_k[t] = γ h_k[t−1] + c[t, k] v[t] row by row
(a chain of n dependent FMAs per rank column and value column).  Here the same h_k is
computed a block of BT rows at a time, with the relative decays of DESIGN §3:

    h_k[block] = L @ (c[:, k] ⊙ V)  +  γ^(i+1) · h_k[previous block's last row]
    L[i, j]    = γ^(i−j) for i ≥ j, else 0                     # [BT, BT] @ [BT, BV]
    o[block]  += b[:, k] ⊙ h_k[block]                           # for k = 0 .. r−1

so the chain becomes one tensor-core product per rank and block.  The carries
h_k[last row] = row k of the state S are updated once per block for every k with one more
product, S ← γ^rows S + (c ⊙ w)ᵀ V with w_j = γ^(rows−1−j), in the program's own slice of
a float32 workspace.  Each program owns whole [BT, BV] output tiles and loops over the
rank itself: no atomics, deterministic.  When batch·heads·(d / BV) cannot fill the GPU,
the sequence is cut into segments whose start states come from the library's segment
pass (``kernels/_segments.py``).

This lives here, not in ``leettriton/kernels``, until a GPU run shows whether it beats the
scan (issue: fleet_attention within 10× of the chunked method at 1 × 8192).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before Triton is imported: the kernel runs on the CPU

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import leettriton  # noqa: E402
from leettriton.api import make_problem  # noqa: E402
from leettriton.kernels._common import causal_decay, head_log2_gamma, mma, problem_args  # noqa: E402
from leettriton.kernels._segments import segment_start_states  # noqa: E402


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@triton.jit
def _decayed_cumsum(a, x, IN_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``a @ x`` on tensor cores: float16 operands for float16 inputs (their 10-bit mantissa
    is TF32's, at twice the rate); float32 operands otherwise (bfloat16 inputs at TF32, whose
    mantissa is longer than bfloat16's; float32 inputs at the caller's precision)."""
    if IN_DTYPE == tl.float16:
        return mma(a.to(tl.float16), x.to(tl.float16), DOT_PRECISION)   # a no-op cast when a is float16
    else:
        return mma(a, x, DOT_PRECISION)


@triton.jit(do_not_specialize=["N", "SEG", "NS"])
def _fleet_dot_kernel(
    b_ptr, c_ptr, v_ptr, o_ptr, lam_ptr, s0_ptr, st_ptr,
    stride_bb, stride_bh, stride_bn, stride_bk, stride_cb, stride_ch, stride_cn, stride_ck,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_ob, stride_oh, stride_on, stride_od,
    stride_s0b, stride_s0h, stride_s0k, stride_s0d, stride_stb, stride_sth, stride_stk, stride_std,
    H, N, R, D,
    HAS_DECAY: tl.constexpr, HAS_INITIAL: tl.constexpr, STORE_STATE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ws_ptr, SEG, NS,
    RP: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_s = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = (i_bh // H).to(tl.int64)
    i_h = (i_bh % H).to(tl.int64)
    t_start = i_s * SEG
    seg_rows = tl.minimum(SEG, N - t_start)
    b_ptr += i_b * stride_bb + i_h * stride_bh + t_start.to(tl.int64) * stride_bn
    c_ptr += i_b * stride_cb + i_h * stride_ch + t_start.to(tl.int64) * stride_cn
    v_ptr += i_b * stride_vb + i_h * stride_vh + t_start.to(tl.int64) * stride_vn
    o_ptr += i_b * stride_ob + i_h * stride_oh + t_start.to(tl.int64) * stride_on
    lam = head_log2_gamma(lam_ptr, i_h, HAS_DECAY)

    o_r = tl.arange(0, BT)
    o_k = tl.arange(0, RP)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < D
    m_kv = (o_k[:, None] < R) & m_v[None, :]
    # this program's [R, BV] slice of the state: the segment's start state, then each block's end state
    p_ws = ws_ptr + (i_bh * NS + i_s).to(tl.int64) * R * D
    b_l = causal_decay(lam, o_r, o_r, HAS_DECAY)                   # [BT, BT] relative decays
    if v_ptr.dtype.element_ty == tl.float16:
        b_l = b_l.to(tl.float16)                                    # cast once, not once per rank
    if HAS_DECAY:
        b_first = tl.exp2(lam * (o_r + 1).to(tl.float32))          # γ^(i+1): the carry into row i
    else:
        b_first = tl.full([BT], 1.0, tl.float32)
    for t0 in range(0, seg_rows, BT):
        o_t = t0 + o_r
        m_t = o_t < seg_rows
        b_v = tl.load(v_ptr + o_t[:, None] * stride_vn + o_v[None, :] * stride_vd,
                      mask=m_t[:, None] & m_v[None, :], other=0.0).to(tl.float32)
        acc = tl.zeros([BT, BV], dtype=tl.float32)
        for k in range(0, R):
            b_ck = tl.load(c_ptr + o_t * stride_cn + k * stride_ck, mask=m_t, other=0.0).to(tl.float32)
            b_bk = tl.load(b_ptr + o_t * stride_bn + k * stride_bk, mask=m_t, other=0.0).to(tl.float32)
            b_carry = tl.load(p_ws + k * D + o_v, mask=m_v, other=0.0)
            b_h = _decayed_cumsum(b_l, b_ck[:, None] * b_v, v_ptr.dtype.element_ty, DOT_PRECISION)
            b_h += b_first[:, None] * b_carry[None, :]
            acc += b_bk[:, None] * b_h
        tl.store(o_ptr + o_t[:, None] * stride_on + o_v[None, :] * stride_od, acc.to(o_ptr.dtype.element_ty),
                 mask=m_t[:, None] & m_v[None, :])
        # every carry at once: S ← γ^rows S + (c ⊙ w)ᵀ V
        rows = tl.minimum(BT, seg_rows - t0)
        b_c = tl.load(c_ptr + o_t[:, None] * stride_cn + o_k[None, :] * stride_ck,
                      mask=m_t[:, None] & (o_k[None, :] < R), other=0.0).to(tl.float32)     # [BT, RP]
        if HAS_DECAY:
            b_w = tl.exp2(lam * tl.maximum(rows - 1 - o_r, 0).to(tl.float32))
            b_c = b_c * b_w[:, None]
        b_s = tl.load(p_ws + o_k[:, None] * D + o_v[None, :], mask=m_kv, other=0.0)
        if HAS_DECAY:
            b_s = b_s * tl.exp2(lam * rows.to(tl.float32))
        b_s += _decayed_cumsum(tl.trans(b_c), b_v, v_ptr.dtype.element_ty, DOT_PRECISION)  # [RP, BT] @ [BT, BV]
        tl.debug_barrier()     # every thread has read the old carries
        tl.store(p_ws + o_k[:, None] * D + o_v[None, :], b_s, mask=m_kv)
        tl.debug_barrier()     # the next block reads carries other threads wrote


def fleet_dot(b, c, v, gamma=None, *, BT=64, BV=64, num_warps=4, num_stages=2, seg_len=None):
    """O of ``linear_attention(b, c, v, gamma)`` by the blockwise fleet kernel (bhnd layout, no states)."""
    p, out = make_problem(b, c, v, gamma)
    B, H, n, r, d = p.shape
    if n == 0:
        return out
    seg_len = seg_len or n
    ns = cdiv(n, seg_len)
    if ns > 1:
        ws = segment_start_states(p, seg_len)
    else:
        ws = torch.zeros((B, H, r, d), dtype=torch.float32, device=v.device)
    args = problem_args(p)
    grid = (cdiv(d, BV), ns, B * H)
    _fleet_dot_kernel[grid](**args, ws_ptr=ws, SEG=seg_len, NS=ns, RP=max(16, triton.next_power_of_2(r)),
                            BT=BT, BV=BV, num_warps=num_warps, num_stages=num_stages)
    return out


def check() -> int:
    """Agreement with the fp64 oracle on awkward shapes, with and without segments."""
    from leettriton.bench import TOLERANCES, rel_error

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = [(1, 2, 100, 33, 40, 0.9, None), (2, 3, 70, 16, 16, None, None), (1, 2, 130, 20, 24, 0.5, 48),
             (1, 1, 64, 8, 16, 0.999, 16), (1, 2, 37, 5, 7, 0.01, None)]
    bad = 0
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for B, H, n, r, d, g, seg in cases:
            gen = torch.Generator(device="cpu").manual_seed(n * r + d)
            b, c, v = (torch.randn(B, H, n, x, generator=gen).to(device=device, dtype=dtype) for x in (r, r, d))
            gamma = None if g is None else torch.full((H,), g)
            ref = leettriton.reference(b, c, v, gamma)
            out = fleet_dot(b, c, v, None if gamma is None else gamma.to(device), BT=16, BV=16, seg_len=seg)
            err = rel_error(out, ref)
            ok = err <= TOLERANCES[dtype]
            bad += not ok
            print(f"{str(dtype):15} B={B} H={H} n={n} r={r} d={d} γ={g} seg={seg}: rel err {err:.1e} "
                  f"{'ok' if ok else 'WRONG'}")
    print("all agree with the oracle" if not bad else f"{bad} cases WRONG")
    return int(bad > 0)


def bench(out_dir: str) -> None:
    from leettriton.bench import decay_gammas, environment, make_inputs, rel_error, time_ms, write_results

    shapes = [(1, 8192), (1, 2048), (16, 8192), (1, 100000)]
    configs = [dict(BT=bt, BV=bv, num_warps=w, num_stages=s) for bt in (32, 64) for bv in (32, 64, 128)
               for w in (4, 8) for s in (1, 2)]
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for batch, n in shapes:
        b, c, v = make_inputs(batch, 32, n, 128, 128, torch.float16, "cuda", seed=n)
        g = decay_gammas(32, "cuda")
        ref_rows = slice(0, 1)
        ref = leettriton.reference(b[ref_rows], c[ref_rows], v[ref_rows], g)
        base = {}
        for m in ("fleet_attention", "lightning_attention", "block_based"):
            fn = (lambda m=m: leettriton.linear_attention(b, c, v, g, method=m))
            base[m] = time_ms(fn)[0]
        best_chunked = min(base["lightning_attention"], base["block_based"])
        print(f"B={batch} n={n}: fleet_attention {base['fleet_attention']:.3f} ms, chunked {best_chunked:.3f} ms",
              flush=True)
        for cfg in configs:
            for segs in (1, 4, 16):
                programs = batch * 32 * cdiv(128, cfg["BV"]) * segs
                if segs > 1 and programs > 8 * sms:
                    continue
                seg_len = None if segs == 1 else cdiv(cdiv(n, segs), 64) * 64
                try:
                    fn = (lambda: fleet_dot(b, c, v, g, seg_len=seg_len, **cfg))
                    err = rel_error(fn()[ref_rows], ref)
                    ms = time_ms(fn, rep_ms=50)[0]
                except Exception as exc:  # noqa: BLE001  (a config that does not compile is reported)
                    print(f"  {cfg} segs={segs}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                    continue
                rows.append(dict(batch=batch, n=n, segments=segs, **cfg, ms=ms, rel_err=err,
                                 fleet_attention_ms=base["fleet_attention"], chunked_ms=best_chunked,
                                 vs_chunked=ms / best_chunked, vs_fleet=base["fleet_attention"] / ms))
                print(f"  {cfg} segs={segs}: {ms:.3f} ms ({ms / best_chunked:.1f}× chunked, "
                      f"{base['fleet_attention'] / ms:.1f}× faster than fleet_attention) err {err:.1e}", flush=True)
    meta = environment("cuda")
    meta["command"] = "python perf/fleet_dot.py " + " ".join(sys.argv[1:])
    best = {}
    for r in rows:
        k = (r["batch"], r["n"])
        if k not in best or r["ms"] < best[k]["ms"]:
            best[k] = r
    body = "\n".join(f"- B={k[0]} n={k[1]}: best {v['ms']:.3f} ms with BT={v['BT']} BV={v['BV']} "
                     f"warps={v['num_warps']} stages={v['num_stages']} segments={v['segments']}: "
                     f"{v['vs_chunked']:.1f}× the best chunked method ({v['chunked_ms']:.3f} ms), "
                     f"{v['vs_fleet']:.1f}× faster than fleet_attention ({v['fleet_attention_ms']:.3f} ms), "
                     f"rel err {v['rel_err']:.1e}" for k, v in best.items())
    path = os.path.join(out_dir, meta["device_slug"], "fleet_dot")
    write_results(rows, meta, path, title="fleet_attention by blocks on tensor cores (experiment)", body=body)
    print(body)
    print(json.dumps({"wrote": path}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="agreement with the fp64 oracle only")
    ap.add_argument("--out", default="perf/results")
    opts = ap.parse_args(argv)
    if opts.check or not torch.cuda.is_available():
        return check()
    bench(opts.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
