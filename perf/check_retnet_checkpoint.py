"""A flash-linear-attention RetNet checkpoint in leettriton's RetNetForCausalLM: names, logits, greedy tokens.

    python perf/check_retnet_checkpoint.py [--device cuda|cpu] [--out DIR] [--methods auto,lightning_attention]
        [--new-tokens 16] [--prompt-length 128] [--fla-autotune]

Builds fla's ``RetNetForCausalLM`` from a small random configuration (norm weights drawn away from 1, so
a norm applied to the wrong axis shows), saves it with ``save_pretrained``, loads the folder into
``leettriton.models.RetNetForCausalLM`` with ``from_pretrained`` (no missing and no unexpected key) and,
separately, fla's ``state_dict`` with ``load_state_dict(strict=True)``; then compares, for each dtype
(float32; on CUDA also bfloat16) and each of our methods, the logits of a prompt (relative Frobenius
error against fla's) and the tokens of greedy ``generate()``.  Needs ``flash-linear-attention`` and
``fla-core`` importable (``--fla PATH`` adds a folder holding the unpacked wheels to ``sys.path``).

Without a GPU everything runs on the CPU: our kernels and fla's in Triton's interpreter, on a tiny
configuration (prompts of 12 tokens: fla's chunked kernels, used above 64 tokens, fail in the interpreter).
Writes ``perf/results/<gpu>/check_retnet_checkpoint.json`` after each section, so a run cut off
keeps what it finished.

Where the time goes.  Nothing here re-tunes as the sequence grows during ``generate()``.  Recording
Triton's autotune key at every launch of the CPU run: each autotuned kernel, fla's (rotary, layer norm,
gated norm, swiglu, fused recurrent) and ours (chunk walk, vanilla, causal_dot_product, segment state,
decode step), meets one key per dtype (two for fla's layer norm and fused recurrent kernels: two norm
widths, prefill and decode), fla's over 26–65 launches each.  No key holds the length: fla marks T
``do_not_specialize`` and keys on sizes and flags (its chunked kernels too: BT, H, K, V), ours never key
on n (docs/design.md §5.3).  What costs minutes on a fresh GPU is each kernel's first call in each dtype:
its autotuner compiles and times every config that survives pruning.  fla's lists hold up to 48
(``chunk_fwd_kernel_h``), 30 (swiglu), 15 (rotary) and 9 (each norm) configs, some 115 per dtype; ours,
where the heuristic file pins none, 29 (float32) and 46 (bfloat16) at r = 64, d = 128 on the H100
family: about 300 compiles over the two dtypes, against a greedy loop of a few seconds.  (These counts are
from the CPU; the earlier GPU run was cut off at 230 s after the parameter names.)  So, unless told
otherwise:

- ``LEETTRITON_AUTOTUNE=0`` (unless set): each of our kernels runs its heuristic-file config or its
  first fitting one.  This script checks the model's numbers, not the kernels' speed; every config is
  run against the oracle by ``tests/test_configs.py``.
- fla's autotuners keep their first config only, as on the CPU (``--fla-autotune`` lets them tune):
  a tile config changes fla's result only by rounding, well inside the bounds below.
- 16 greedy tokens (``--new-tokens``), two prompts of 128 tokens (``--prompt-length``).

Each dtype's section gives the seconds of every call (the first of a dtype includes its compiles), and
the last section lists every autotuning Triton did (its autotuning listener, where the installed Triton
has one).
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
    p.add_argument("--new-tokens", type=int, default=None, help="greedy tokens to generate (default 16, CPU 6)")
    p.add_argument("--prompt-length", type=int, default=None,
                   help="tokens in each of the 2 prompts (default 128, CPU 12; above 64 fla prefills with its "
                        "chunked kernels, at 64 or less with its recurrent one)")
    p.add_argument("--fla-autotune", action="store_true",
                   help="let fla's autotuners time all their configs (default: their first config only)")
    return p.parse_args(argv)


ARGS = _arguments()
os.environ.setdefault("LEETTRITON_AUTOTUNE", "0")   # before leettriton is imported: see the docstring
if ARGS.device == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported: kernels run on the CPU
if ARGS.fla:
    sys.path.insert(0, ARGS.fla)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if ARGS.device == "cpu" or not ARGS.fla_autotune:
    import triton.runtime.autotuner as _autotuner

    _autotuner_init = _autotuner.Autotuner.__init__

    def _python_function(fn):
        """The Python function under a Triton kernel (through heuristics and JIT/interpreter wrappers)."""
        while hasattr(fn, "fn"):
            fn = fn.fn
        return fn

    def _fla_first_config_only(self, fn, arg_names, configs, *args, **kwargs):
        # fla's kernels only (ours prune their own lists per GPU family): the interpreter cannot time
        # configs, and on a GPU timing them all is what made this check take minutes (docstring)
        if getattr(_python_function(fn), "__module__", "").startswith("fla."):
            configs = configs[:1]
        _autotuner_init(self, fn, arg_names, configs, *args, **kwargs)

    _autotuner.Autotuner.__init__ = _fla_first_config_only

import time  # noqa: E402

import triton  # noqa: E402

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


class TuningLog:
    """Every autotuning Triton does in this run (fla's kernels and ours), through its autotuning listener:
    the kernel, its key, how many configs were timed and how long that took (compiles included)."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        knobs = getattr(triton, "knobs", None)
        self.available = knobs is not None and hasattr(knobs.autotuning, "listener")
        if self.available:
            knobs.autotuning.listener = self

    def __call__(self, fn, key, best_config, configs_timings, duration, cache_hit) -> None:
        inner = fn
        while hasattr(inner, "fn"):
            inner = inner.fn
        name = f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__name__', repr(fn))}"
        self.events.append({"kernel": name, "key": str(key),
                            "configs": len(configs_timings or {}), "seconds": duration or 0.0,
                            "from_disk_cache": bool(cache_hit)})

    def table(self) -> list[list]:
        per: dict[str, list] = {}
        for e in self.events:
            row = per.setdefault(e["kernel"], [e["kernel"], 0, 0, 0.0])
            row[1] += 1
            row[2] += e["configs"]
            row[3] += e["seconds"]
        return [[k, n, c, f"{t:.1f}"] for k, n, c, t in sorted(per.values(), key=lambda r: -r[3])]


def main() -> None:
    device = torch.device(ARGS.device)
    gpu = device.type == "cuda"
    started = time.perf_counter()
    tuning = TuningLog()
    rep = common.Report("check_retnet_checkpoint", "fla RetNet checkpoint in leettriton's RetNetForCausalLM",
                        sys.argv[1:], device, quick=not gpu)
    rep.note(f"LEETTRITON_AUTOTUNE={os.environ['LEETTRITON_AUTOTUNE']} (0: each of our kernels runs the heuristic "
             f"file's config or its first fitting one); fla's autotuners "
             f"{'time all their configs' if ARGS.fla_autotune and gpu else 'keep their first config only'}")
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
    rep.save(ARGS.out)   # each section is on disk as soon as it is done: a run cut off keeps what it finished

    B, n = 2, ARGS.prompt_length or (128 if gpu else 12)
    new_tokens = ARGS.new_tokens or (16 if gpu else 6)
    prompt = torch.randint(0, size["vocab_size"], (B, n), generator=torch.Generator().manual_seed(1))
    bound = {"float32": 2e-3, "bfloat16": 2e-2}   # fla computes float32 products in TF32 on GPUs
    dtypes = [torch.float32, torch.bfloat16] if gpu else [torch.float32]
    for dtype in dtypes:
        name = str(dtype).replace("torch.", "")
        fla_d = fla.to(device=device, dtype=dtype)
        ids = prompt.to(device)
        greedy = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
        seconds = {}
        with torch.no_grad():
            t0 = time.perf_counter()
            fla_logits = fla_d(ids).logits.float()
            t1 = time.perf_counter()
            fla_tokens = fla_d.generate(ids, use_cache=False, **greedy)    # fla's prefill path at every step
            t2 = time.perf_counter()
            fla_cached = fla_d.generate(ids, use_cache=True, **greedy)     # fla's own cache and recurrent kernels
            t3 = time.perf_counter()
        seconds["fla"] = (t1 - t0, t2 - t1, t3 - t2)
        fla_self = bool((fla_cached == fla_tokens).all()) if fla_cached.shape == fla_tokens.shape else False
        rep.note(f"{dtype}: fla's greedy tokens with its cache {'equal' if fla_self else 'DIFFER FROM'} its tokens "
                 f"without (first difference {first_difference(fla_cached, fla_tokens) if not fla_self else '—'})")
        ours_d = ours.to(device=device, dtype=dtype)
        rows = []
        for method in ARGS.methods.split(","):
            ours_d.set_attention_method(method)
            with torch.no_grad():
                t0 = time.perf_counter()
                logits = ours_d(ids).logits.float()
                t1 = time.perf_counter()
                tokens = ours_d.generate(ids, use_cache=True, **greedy)
                t2 = time.perf_counter()
            seconds[method] = (t1 - t0, t2 - t1)
            err = relative_error(logits, fla_logits)
            same = tokens.shape == fla_tokens.shape and bool((tokens == fla_tokens).all())
            row = {"dtype": name, "method": method, "logits_rel_err": err,
                   "greedy_equal": same, "first_token_difference": first_difference(tokens, fla_tokens),
                   "seconds_logits": t1 - t0, "seconds_generate": t2 - t1}
            row["greedy_equal_fla_cached"] = tokens.shape == fla_cached.shape and bool((tokens == fla_cached).all())
            rows.append(row)
            rep.rows.append(row)
        rep.section(f"Logits and greedy tokens against fla's model, {name}",
                    ["method", "logits ‖ours − fla‖/‖fla‖", "greedy tokens = fla's", "first difference",
                     "= fla's with its cache", "s (logits, generate)"],
                    [[r["method"], common.fmt_err(r["logits_rel_err"]), r["greedy_equal"],
                      r["first_token_difference"] or "—", r["greedy_equal_fla_cached"],
                      f"{r['seconds_logits']:.1f}, {r['seconds_generate']:.1f}"] for r in rows],
                    text=f"prompt {B} × {n} random tokens, {new_tokens} greedy tokens; ours with its cache (prefill, "
                         f"then decode_step), fla's without its cache (its prefill kernels over the whole sequence "
                         f"at every step) and, in the next-to-last column, with it.  fla: logits "
                         f"{seconds['fla'][0]:.1f} s, generate without its cache {seconds['fla'][1]:.1f} s, with "
                         f"it {seconds['fla'][2]:.1f} s (first calls in a dtype include compiling and autotuning).")
        for r in rows:
            rep.target(f"logits {r['dtype']} {r['method']}", common.fmt_err(r["logits_rel_err"]),
                       f"≤ {bound[r['dtype']]:.0e}", r["logits_rel_err"] <= bound[r["dtype"]])
        for r in rows:
            if r["dtype"] == "float32":
                rep.target(f"greedy tokens float32 {r['method']}", str(r["greedy_equal"]), "equal", r["greedy_equal"])
        rep.save(ARGS.out)

    if tuning.available:
        rep.section("Autotuning in this run", ["kernel", "keys tuned", "configs timed", "seconds"],
                    tuning.table() or [["(none)", 0, 0, "0.0"]],
                    text="Triton's autotuning listener: each new key of an autotuned kernel times every config "
                         "that survives pruning (compiling each); a key already tuned in an earlier run may come "
                         "from Triton's disk cache (fla sets cache_results).  Under the interpreter nothing is "
                         "tuned.")
        rep.meta["autotuning"] = tuning.events
    rep.note(f"the whole run took {time.perf_counter() - started:.1f} s")
    rep.finish(ARGS.out)


if __name__ == "__main__":
    main()
