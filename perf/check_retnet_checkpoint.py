"""A flash-linear-attention RetNet checkpoint in leettriton's RetNetForCausalLM: names, logits, greedy tokens.

    python perf/check_retnet_checkpoint.py [--device cuda|cpu] [--out DIR] [--methods auto,lightning_attention]

Builds fla's ``RetNetForCausalLM`` from a small random configuration (norm weights drawn away from 1, so
a norm applied to the wrong axis shows), saves it with ``save_pretrained``, loads the folder into
``leettriton.models.RetNetForCausalLM`` with ``from_pretrained`` (no missing and no unexpected key) and,
separately, fla's ``state_dict`` with ``load_state_dict(strict=True)``; then compares, for each dtype
(float32; on CUDA also bfloat16) and each of our methods, the logits of a prompt (relative Frobenius
error against fla's) and the tokens of greedy ``generate()``.  Needs ``flash-linear-attention`` and
``fla-core`` importable (``--fla PATH`` adds a folder holding the unpacked wheels to ``sys.path``).

Without a GPU everything runs on the CPU: our kernels and fla's in Triton's interpreter (fla's autotuners
limited to their first config, as the interpreter cannot time configs), on a tiny configuration.
Writes ``perf/results/<gpu>/check_retnet_checkpoint.{json,md}``.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

HAS_GPU = torch.cuda.is_available()


def _arguments(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if HAS_GPU else "cpu")
    p.add_argument("--out", metavar="DIR", help="results root (default perf/results)")
    p.add_argument("--fla", metavar="PATH", help="a folder with fla and fla-core unpacked, put first on sys.path")
    p.add_argument("--methods", default="auto,lightning_attention,block_based,causal_dot_product",
                   help="our methods to compare (comma-separated)")
    p.add_argument("--new-tokens", type=int, default=None, help="greedy tokens to generate (default 32, CPU 6)")
    return p.parse_args(argv)


ARGS = _arguments()
if ARGS.device == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU
if ARGS.fla:
    sys.path.insert(0, ARGS.fla)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if ARGS.device == "cpu":
    import triton.runtime.autotuner as _autotuner

    _autotuner_init = _autotuner.Autotuner.__init__

    def _first_config_only(self, fn, arg_names, configs, *args, **kwargs):   # the interpreter cannot time configs
        _autotuner_init(self, fn, arg_names, configs[:1], *args, **kwargs)

    _autotuner.Autotuner.__init__ = _first_config_only

import common  # noqa: E402  (perf/common.py)
from fla.models import RetNetConfig as FlaRetNetConfig  # noqa: E402
from fla.models import RetNetForCausalLM as FlaRetNetForCausalLM  # noqa: E402

from leettriton.models import RetNetForCausalLM  # noqa: E402


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def first_difference(a: torch.Tensor, b: torch.Tensor):
    diff = (a != b).nonzero()
    return None if len(diff) == 0 else tuple(int(i) for i in diff[0])


def main() -> None:
    device = torch.device(ARGS.device)
    gpu = device.type == "cuda"
    rep = common.Report("check_retnet_checkpoint", "fla RetNet checkpoint in leettriton's RetNetForCausalLM",
                        sys.argv[1:], device, quick=not gpu)
    torch.manual_seed(0)
    size = dict(hidden_size=256, num_heads=4, num_hidden_layers=2, vocab_size=1000) if gpu else \
        dict(hidden_size=32, num_heads=2, num_hidden_layers=2, vocab_size=64, intermediate_size=48, expand_k=0.5,
             expand_v=1.0)
    fla_config = FlaRetNetConfig(**size, initializer_range=0.1)
    fla = FlaRetNetForCausalLM(fla_config).eval()
    with torch.no_grad():
        for name, p in fla.named_parameters():
            if p.dim() == 1:   # norm weights: not all ones
                p.uniform_(0.5, 1.5)
    folder = tempfile.mkdtemp(prefix="fla-retnet-")
    fla.save_pretrained(folder)
    rep.note(f"fla configuration: {size}; heads r = {fla.model.layers[0].attn.head_k_dim}, "
             f"d = {fla.model.layers[0].attn.head_v_dim}; saved to {folder}")

    ours, info = RetNetForCausalLM.from_pretrained(folder, output_loading_info=True)
    missing, unexpected = info.get("missing_keys", []), info.get("unexpected_keys", [])
    strict = RetNetForCausalLM(ours.config)
    strict_result = strict.load_state_dict(fla.state_dict(), strict=True)
    names_ok = not missing and not unexpected and not strict_result.missing_keys and not strict_result.unexpected_keys
    rep.section("Parameter names", ["check", "result"], [
        ["from_pretrained: missing keys", missing or "none"], ["from_pretrained: unexpected keys", unexpected or "none"],
        ["load_state_dict(strict=True)", "ok"], ["tensors", len(fla.state_dict())]])
    rep.target("fla checkpoint loads by name", "no missing or unexpected key" if names_ok else "mismatch",
               "strict", names_ok)

    B, n = (2, 128) if gpu else (2, 12)
    new_tokens = ARGS.new_tokens or (32 if gpu else 6)
    prompt = torch.randint(0, size["vocab_size"], (B, n), generator=torch.Generator().manual_seed(1))
    rows = []
    dtypes = [torch.float32, torch.bfloat16] if gpu else [torch.float32]
    for dtype in dtypes:
        fla_d = fla.to(device=device, dtype=dtype)
        ids = prompt.to(device)
        with torch.no_grad():
            fla_logits = fla_d(ids).logits.float()
            greedy = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
            fla_tokens = fla_d.generate(ids, use_cache=False, **greedy)    # fla's prefill path at every step
            fla_cached = fla_d.generate(ids, use_cache=True, **greedy)     # fla's own cache and recurrent kernels
        fla_self = bool((fla_cached == fla_tokens).all()) if fla_cached.shape == fla_tokens.shape else False
        rep.note(f"{dtype}: fla's greedy tokens with its cache {'equal' if fla_self else 'DIFFER FROM'} its tokens "
                 f"without (first difference {first_difference(fla_cached, fla_tokens) if not fla_self else '—'})")
        ours_d = ours.to(device=device, dtype=dtype)
        for method in ARGS.methods.split(","):
            ours_d.set_attention_method(method)
            with torch.no_grad():
                logits = ours_d(ids).logits.float()
                tokens = ours_d.generate(ids, use_cache=True, **greedy)
            err = relative_error(logits, fla_logits)
            same = tokens.shape == fla_tokens.shape and bool((tokens == fla_tokens).all())
            row = {"dtype": str(dtype).replace("torch.", ""), "method": method, "logits_rel_err": err,
                   "greedy_equal": same, "first_token_difference": first_difference(tokens, fla_tokens)}
            row["greedy_equal_fla_cached"] = tokens.shape == fla_cached.shape and bool((tokens == fla_cached).all())
            rows.append(row)
            rep.rows.append(row)
    rep.section("Logits and greedy tokens against fla's model", ["dtype", "method", "logits ‖ours − fla‖/‖fla‖",
                                                                 "greedy tokens = fla's", "first difference",
                                                                 "= fla's with its cache"],
                [[r["dtype"], r["method"], common.fmt_err(r["logits_rel_err"]), r["greedy_equal"],
                  r["first_token_difference"] or "—", r["greedy_equal_fla_cached"]] for r in rows],
                text=f"prompt {B} × {n} random tokens, {new_tokens} greedy tokens; ours with its cache (prefill, "
                     f"then decode_step), fla's without its cache (its prefill kernels over the whole sequence at "
                     f"every step) and, in the last column, with it.")
    bound = {"float32": 2e-3, "bfloat16": 2e-2}   # fla computes float32 products in TF32 on GPUs
    for r in rows:
        rep.target(f"logits {r['dtype']} {r['method']}", common.fmt_err(r["logits_rel_err"]),
                   f"≤ {bound[r['dtype']]:.0e}", r["logits_rel_err"] <= bound[r["dtype"]])
    for r in rows:
        if r["dtype"] == "float32":
            rep.target(f"greedy tokens float32 {r['method']}", str(r["greedy_equal"]), "equal", r["greedy_equal"])
    rep.finish(ARGS.out)


if __name__ == "__main__":
    main()
