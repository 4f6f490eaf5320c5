"""flash-linear-attention's Mamba2 and SimpleGatedLinearAttention layers against leettriton.nn's, on fla's weights.

    python perf/check_fla_layers.py [--device cuda|cpu] [--fla PATH] [--out DIR] [--methods auto]
        [--batch 2] [--n 512] [--decode-steps 4] [--fla-autotune]
    python perf/check_fla_layers.py --device cpu --quick      # our layers only, no fla: a check of the logic

For each layer configuration (on a GPU: Mamba-2 with hidden 2048, 64 heads of dim 64, state 128 and 1 or 8
groups; simple GLA with hidden 2048 and 16 heads, and with 4 key/value heads), builds fla's layer with its
1-D parameters drawn away from their initial values (norm weights, D, biases: a weight applied to the
wrong axis shows), loads its ``state_dict`` into ours with ``load_state_dict(strict=True)``, then for
float32 and bfloat16 compares a prefill of ``--n`` tokens with fla's cache and ours, and ``--decode-steps``
one-token steps after it (the relative Frobenius error ‖ours − fla‖ / ‖fla‖ and the largest absolute
error).  Needs ``flash-linear-attention`` and ``fla-core`` importable (``--fla PATH`` puts a folder holding
the unpacked wheels first on ``sys.path``) and ``transformers`` (fla's cache).

Mamba-2's groups.  Head h reads B and C of group h // (heads / groups) in mamba-ssm's kernels, in fla's
one-token step and in ours.  fla's PyTorch prefill (what fla runs when mamba-ssm is not installed) reads
group h mod groups instead, so with more than one group its prefill disagrees with its own decoding.  So
each Mamba-2 configuration is also run through fla one token at a time from a zero state (its decode
path); the targets compare against that run where fla's prefill is the PyTorch one and groups > 1, and
against fla's prefill everywhere else.  Both errors are in the table.

Bounds: float32 2e-3 (fla's GLA kernels may multiply float32 in TF32 on a GPU), bfloat16 2e-2.  The
script exits with status 1 if any target fails.  Without a GPU, ``--device cpu`` runs fla's and our
kernels in Triton's interpreter on tiny layers (prompts of at most 64 tokens: fla's chunked GLA kernels
do not run in the interpreter); ``--quick`` runs our layers alone (no fla): their names against fla's
list, and prefill plus one-token steps against one prefill.  Writes ``perf/results/<gpu>/check_fla_layers.json``.
"""
from __future__ import annotations

import os
import sys
import time

if __name__ == "__main__":   # before triton and leettriton are imported (the test imports this module after conftest)
    os.environ.setdefault("LEETTRITON_AUTOTUNE", "0")   # a check of numbers: each kernel's first fitting config
    if "cpu" in sys.argv and "--quick" not in sys.argv:   # fla's kernels and ours in the interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (perf/common.py)

from leettriton.nn import LinearAttentionCache, Mamba2, SimpleGatedLinearAttention  # noqa: E402
from leettriton.reference import tolerance  # noqa: E402

NAME = "check_fla_layers"
BOUNDS = {"float32": 2e-3, "bfloat16": 2e-2}

# Layer configurations: (label, kind, constructor arguments).  fla's Mamba2 prefills in chunks of
# ``chunk_size`` with (chunk × chunk × heads × state) temporaries in its PyTorch path: 64 keeps them small.
GPU_CONFIGS = [
    ("mamba2 g1", "mamba2", dict(hidden_size=2048, num_heads=64, head_dim=64, state_size=128, n_groups=1,
                                 chunk_size=64)),
    ("mamba2 g8", "mamba2", dict(hidden_size=2048, num_heads=64, head_dim=64, state_size=128, n_groups=8,
                                 chunk_size=64)),
    ("simple gla", "gla", dict(hidden_size=2048, num_heads=16)),
    ("simple gla kv4", "gla", dict(hidden_size=2048, num_heads=16, num_kv_heads=4)),
]
CPU_CONFIGS = [
    ("mamba2 g1", "mamba2", dict(hidden_size=16, num_heads=4, head_dim=8, state_size=8, n_groups=1, chunk_size=8)),
    ("mamba2 g2", "mamba2", dict(hidden_size=16, num_heads=4, head_dim=8, state_size=8, n_groups=2, chunk_size=8,
                                 D_has_hdim=True)),
    ("simple gla", "gla", dict(hidden_size=32, num_heads=2)),
    ("simple gla kv1", "gla", dict(hidden_size=32, num_heads=2, num_kv_heads=1, expand_v=2.0)),
]
OURS = {"mamba2": Mamba2, "gla": SimpleGatedLinearAttention}


def fla_state_dict_shapes(kind: str, config: dict) -> dict:
    """The names and shapes of fla's layer's ``state_dict`` for ``config`` (from fla 0.6.0's source:
    ``fla/layers/mamba2.py``, ``fla/layers/simple_gla.py``), for the check without fla."""
    if kind == "mamba2":
        hidden, P, N = config["hidden_size"], config.get("head_dim", 64), config.get("state_size", 128)
        G, K, inner = config.get("n_groups", 1), config.get("conv_kernel", 4), int(config.get("expand", 2) * hidden)
        H, conv_dim = inner // P, inner + 2 * G * N
        shapes = {"dt_bias": (H,), "A_log": (H,), "D": (inner if config.get("D_has_hdim") else H,),
                  "conv1d.weight": (conv_dim, 1, K), "in_proj.weight": (inner + conv_dim + H, hidden),
                  "out_proj.weight": (hidden, inner)}
        if config.get("use_conv_bias", True):
            shapes["conv1d.bias"] = (conv_dim,)
        if config.get("rmsnorm", True):
            shapes["norm.weight"] = (inner,)
        if config.get("use_bias", False):
            shapes.update({"in_proj.bias": (inner + conv_dim + H,), "out_proj.bias": (hidden,)})
        return shapes
    hidden, H = config["hidden_size"], config.get("num_heads", 4)
    Hkv, K = config.get("num_kv_heads") or H, config.get("conv_size", 4)
    key, value = round(hidden * config.get("expand_k", 1.0)), round(hidden * config.get("expand_v", 1.0))
    groups = H // Hkv
    shapes = {"q_proj.weight": (key, hidden), "k_proj.weight": (key // groups, hidden),
              "v_proj.weight": (value // groups, hidden), "g_proj.weight": (value, hidden),
              "gk_proj.weight": (H, hidden), "gk_proj.bias": (H,), "o_proj.weight": (hidden, value)}
    if config.get("use_short_conv", True):
        for name, width in (("q", key), ("k", key // groups), ("v", value // groups)):
            shapes[f"{name}_conv1d.weight"] = (width, 1, K)
            if config.get("conv_bias", False):
                shapes[f"{name}_conv1d.bias"] = (width,)
    if config.get("elementwise_affine", True):
        fused = config.get("gate_fn", "swish") == "swish" and config.get("fuse_norm", True)
        shapes[f"{'g_norm_swish_gate' if fused else 'g_norm'}.weight"] = (value // H,)
    return shapes


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def max_abs(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (out.double() - ref.double()).abs().max().item()


def perturb(layer: torch.nn.Module, seed: int) -> None:
    """Draw the 1-D parameters away from their initial values (norm weights and D from 1, biases from 0),
    keeping A_log and dt_bias (their initialisation is the model's)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if p.dim() == 1 and name not in ("A_log", "dt_bias"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)


def ours_steps(layer, x: torch.Tensor, n: int):
    """Our layer on x[:, :n] through a cache, then one token at a time: (prefill output, step outputs)."""
    cache = LinearAttentionCache()
    prefill = layer(x[:, :n], cache=cache)
    steps = [layer(x[:, t:t + 1], cache=cache) for t in range(n, x.shape[1])]
    return prefill, torch.cat(steps, 1) if steps else prefill[:, :0]


def fla_steps(layer, x: torch.Tensor, n: int, cache_class):
    """fla's layer on x[:, :n] with its cache (``use_cache=True``), then one token at a time."""
    cache = cache_class()
    prefill = layer(x[:, :n], past_key_values=cache, use_cache=True)[0]
    steps = [layer(x[:, t:t + 1], past_key_values=cache, use_cache=True)[0] for t in range(n, x.shape[1])]
    return prefill, torch.cat(steps, 1) if steps else prefill[:, :0]


def fla_mamba2_tokenwise(layer, x: torch.Tensor, n: int, cache_class):
    """fla's Mamba2 one token at a time from a zero state (its decode path, whose heads read their group as
    mamba-ssm's kernels do): (outputs of the first n tokens, outputs of the rest)."""
    B = x.shape[0]
    cache = cache_class()
    cache.update(recurrent_state=torch.zeros(B, layer.num_heads, layer.head_dim, layer.ssm_state_size,
                                             device=x.device, dtype=torch.float32),
                 conv_state=torch.zeros(B, layer.conv_dim, layer.conv_kernel_size, device=x.device, dtype=x.dtype),
                 layer_idx=layer.layer_idx, offset=0)
    out = torch.cat([layer(x[:, t:t + 1], past_key_values=cache, use_cache=True)[0] for t in range(x.shape[1])], 1)
    return out[:, :n], out[:, n:]


def check_with_fla(rep, args, device, configs, methods) -> bool:
    """Every configuration against fla's layer; returns whether every target passed."""
    if device.type == "cpu" or not args.fla_autotune:
        common.keep_first_config("fla.")   # before fla is imported: its autotuners are built at import
    from fla.layers.mamba2 import Mamba2 as FlaMamba2
    from fla.layers.mamba2 import is_fast_path_available
    from fla.layers.simple_gla import SimpleGatedLinearAttention as FlaSimpleGLA
    from fla.models.cache_utils import Cache

    fla_classes = {"mamba2": FlaMamba2, "gla": FlaSimpleGLA}
    mamba_fast = is_fast_path_available and device.type == "cuda"
    rep.note(f"fla's Mamba2 runs {'mamba-ssm kernels' if mamba_fast else 'its PyTorch path (no mamba-ssm)'}")
    gpu = device.type == "cuda"
    B, n = args.batch, args.n or (512 if gpu else 12)
    steps = args.decode_steps
    dtypes = [torch.float32, torch.bfloat16] if gpu else [torch.float32]
    ok = True
    for seed, (label, kind, config) in enumerate(configs):
        torch.manual_seed(seed)
        fla = fla_classes[kind](**config, layer_idx=0).eval()
        perturb(fla, seed)
        ours = OURS[kind](**config, layer_idx=0).eval()
        same_names = {k: tuple(v.shape) for k, v in ours.state_dict().items()} == \
            {k: tuple(v.shape) for k, v in fla.state_dict().items()}
        rep.target(f"{label}: fla's state_dict loads (strict)", "ok" if same_names else "mismatch",
                   "same names and shapes", same_names)
        ok &= same_names
        if not same_names:
            rep.note(f"{label}: ours {sorted(ours.state_dict())}, fla's {sorted(fla.state_dict())}")
            continue
        ours.load_state_dict(fla.state_dict(), strict=True)
        x = torch.randn(B, n + steps, config["hidden_size"], generator=torch.Generator().manual_seed(100 + seed))
        tokenwise = kind == "mamba2"
        target_ref = "tokenwise" if tokenwise and config.get("n_groups", 1) > 1 and not mamba_fast else "prefill"
        for dtype in dtypes:
            dname = str(dtype).replace("torch.", "")
            fla_d = fla.to(device=device, dtype=dtype)
            xd = x.to(device=device, dtype=dtype)
            t0 = time.perf_counter()
            with torch.no_grad():
                refs = {"prefill": fla_steps(fla_d, xd, n, Cache)}
                if tokenwise:
                    refs["tokenwise"] = fla_mamba2_tokenwise(fla_d, xd, n, Cache)
            fla_s = time.perf_counter() - t0
            ours_d = ours.to(device=device, dtype=dtype)
            for method in methods:
                ours_d.set_method(method)
                t0 = time.perf_counter()
                with torch.no_grad():
                    got = ours_steps(ours_d, xd, n)
                ours_s = time.perf_counter() - t0
                row = dict(layer=label, kind=kind, config=config, dtype=dname, method=method, batch=B, n=n,
                           decode_steps=steps, target_reference=target_ref, seconds_fla=fla_s, seconds_ours=ours_s)
                for ref_name, (ref_prefill, ref_steps) in refs.items():
                    row[f"prefill_rel_err_vs_fla_{ref_name}"] = relative_error(got[0], ref_prefill)
                    row[f"prefill_max_abs_vs_fla_{ref_name}"] = max_abs(got[0], ref_prefill)
                    row[f"decode_rel_err_vs_fla_{ref_name}"] = relative_error(got[1], ref_steps) if steps else 0.0
                    row[f"decode_max_abs_vs_fla_{ref_name}"] = max_abs(got[1], ref_steps) if steps else 0.0
                if tokenwise:
                    row["fla_prefill_vs_fla_tokenwise_rel_err"] = relative_error(refs["prefill"][0],
                                                                                 refs["tokenwise"][0])
                rep.rows.append(row)
                for part in ("prefill", "decode"):
                    err = row[f"{part}_rel_err_vs_fla_{target_ref}"]
                    passed = err == err and err <= BOUNDS[dname]
                    ok &= passed
                    rep.target(f"{label} {dname} {method}: {part} vs fla ({target_ref})", common.fmt_err(err),
                               f"≤ {BOUNDS[dname]:.0e}", passed)
        fla.to("cpu")
        rep.save(args.out)
    body = []
    for r in rep.rows:
        tw = r.get("prefill_rel_err_vs_fla_tokenwise")
        body.append([r["layer"], r["dtype"], r["method"], r["target_reference"],
                     common.fmt_err(r["prefill_rel_err_vs_fla_prefill"]), f"{r['prefill_max_abs_vs_fla_prefill']:.1e}",
                     common.fmt_err(r["decode_rel_err_vs_fla_prefill"]),
                     common.fmt_err(tw), common.fmt_err(r.get("decode_rel_err_vs_fla_tokenwise")),
                     common.fmt_err(r.get("fla_prefill_vs_fla_tokenwise_rel_err")),
                     f"{r['seconds_fla']:.1f}, {r['seconds_ours']:.1f}"])
    rep.section("leettriton.nn against fla's layers on fla's weights",
                ["layer", "dtype", "method", "target vs", "prefill rel err", "prefill max abs", "decode rel err",
                 "prefill rel err (fla tokenwise)", "decode rel err (fla tokenwise)", "fla prefill vs fla tokenwise",
                 "s (fla, ours)"], body,
                text=f"batch {B}, prompt {n} tokens then {steps} one-token steps through each library's cache; "
                     f"relative errors ‖ours − fla‖/‖fla‖.  'fla tokenwise': fla's Mamba2 one token at a time from "
                     f"a zero state (its decode path).  Seconds include first-call compiles.")
    return ok


def check_alone(rep, args, device, configs, methods) -> bool:
    """Without fla: our layers' names and shapes against fla's list, and prefill + steps against one prefill."""
    B, n, steps = args.batch, args.n or 12, args.decode_steps
    ok = True
    for seed, (label, kind, config) in enumerate(configs):
        torch.manual_seed(seed)
        ours = OURS[kind](**config, layer_idx=0).to(device).eval()
        perturb(ours, seed)
        names = {k: tuple(v.shape) for k, v in ours.state_dict().items()} == fla_state_dict_shapes(kind, config)
        rep.target(f"{label}: names and shapes = fla's list", "equal" if names else "differ", "equal", names)
        ok &= names
        x = torch.randn(B, n + steps, config["hidden_size"], generator=torch.Generator().manual_seed(100 + seed))
        x = x.to(device)
        for method in methods:
            ours.set_method(method)
            with torch.no_grad():
                whole = ours(x)
                prefill, step = ours_steps(ours, x, n)
            err = relative_error(torch.cat([prefill, step], 1), whole)
            rep.rows.append(dict(layer=label, kind=kind, config=config, dtype="float32", method=method, batch=B, n=n,
                                 decode_steps=steps, split_rel_err_vs_one_prefill=err))
            passed = err <= tolerance(torch.float32)   # the same arithmetic, in another order
            ok &= passed
            rep.target(f"{label} {method}: prefill + {steps} steps = one prefill", common.fmt_err(err),
                       f"≤ {tolerance(torch.float32):.0e}", passed)
    rep.section("leettriton.nn alone (no fla)", ["layer", "method", "prefill + steps vs one prefill"],
                [[r["layer"], r["method"], common.fmt_err(r["split_rel_err_vs_one_prefill"])] for r in rep.rows],
                text=f"batch {B}, {n} tokens then {steps} one-token steps through the cache, against one prefill "
                     f"of all {n + steps}.")
    return ok


def main(argv=None) -> common.Report:
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--fla", metavar="PATH", help="a folder with fla and fla-core unpacked, put first on sys.path")
    p.add_argument("--methods", default="auto", help="our prefill methods to compare (comma-separated; each must "
                   "take a per-token decay)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--n", type=int, default=None, help="prompt tokens (default 512, CPU 12)")
    p.add_argument("--decode-steps", type=int, default=4, help="one-token steps after the prompt")
    p.add_argument("--fla-autotune", action="store_true",
                   help="let fla's autotuners time all their configs (default: their first config only)")
    args = p.parse_args(argv)
    device = common.device_of(args)
    if args.fla:
        sys.path.insert(0, args.fla)
    rep = common.Report(NAME, "fla's Mamba2 and simple GLA layers in leettriton.nn", common.cli_argv(argv), device,
                        args.quick)
    methods = args.methods.split(",")
    configs = GPU_CONFIGS if device.type == "cuda" else CPU_CONFIGS
    rep.note(f"configurations: {[(label, config) for label, _, config in configs]}")
    started = time.perf_counter()
    if args.quick:
        ok = check_alone(rep, args, device, CPU_CONFIGS, methods)
    else:
        ok = check_with_fla(rep, args, device, configs, methods)
    rep.note(f"the whole run took {time.perf_counter() - started:.1f} s")
    rep.finish(args.out)
    if not ok:
        raise SystemExit(1)
    return rep


if __name__ == "__main__":
    main()
