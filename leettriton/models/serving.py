"""A continuous-batching generator on the models' serving entry points (docs/design.md §13.5).

Requests arrive with prompts of any length; the generator keeps one float32 state pool per layer with a
fixed number of slots.  Each :meth:`ContinuousBatchingGenerator.step` admits waiting requests into free
slots, decodes every running request in one slotted step (one :func:`leettriton.decode_step` per layer),
packs the newly admitted prompts into one packed prefill (one :func:`leettriton.linear_attention_varlen`
per layer), samples one token for every one of those rows in one call, and frees the slots of the requests
that finished.

Run as a command, it serves a synthetic stream of requests on a model with random weights and prints the
throughput and the latencies::

    python -m leettriton.models.serving --model retnet --requests 256 --rate 32 --out results

``--out DIR`` writes the result under ``DIR/<family>/`` (the GPU family it ran on, ``cpu`` on a CPU), so a
run never lands among another GPU's results; ``--json PATH`` names the file itself.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
import sys
import time
from typing import Callable, Hashable, Optional, Sequence

import torch

from .. import registry
from ..api import VARLEN_NATIVE
from ..autotune.families import FAMILIES, current_family

__all__ = ["ContinuousBatchingGenerator", "Completion", "StepStats", "sample_tokens", "counter_uniforms", "main"]


# ---------------------------------------------------------------------------------------------- sampling

_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x · constant) mod 2³² for int64 ``x`` in [0, 2³²), without overflowing int64 (16-bit halves)."""
    low, high = x & 0xFFFF, x >> 16
    return (low * constant + (((high * constant) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche mix (MurmurHash3's finaliser) of int64 ``x`` in [0, 2³²)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def counter_uniforms(seeds: torch.Tensor, counters: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniform numbers in (0, 1), float32 ``(rows, vocab_size)``: entry (i, j) is a hash of
    (``seeds[i]``, ``counters[i]``, j) only, computed with integer tensor ops on the seeds' device.

    ``seeds`` and ``counters`` are int64 ``(rows,)``, non-negative.  A row's numbers do not depend on the
    other rows, on the batch size or on the device: a request's sampling noise is a function of its seed
    and its token index alone (docs/design.md §13.5).

    Example::

        >>> u = counter_uniforms(torch.tensor([7]), torch.tensor([0]), 32000)   # (1, 32000)
    """
    seeds, counters = seeds.to(torch.int64), counters.to(torch.int64)
    h = _mix32((seeds & _MASK32) ^ 0x5BD1E995)
    h = _mix32(h ^ ((seeds >> 32) & _MASK32))
    h = _mix32(h ^ (counters & _MASK32))
    h = _mix32(h ^ ((counters >> 32) & _MASK32))
    columns = _mix32(_mul32(torch.arange(vocab_size, device=seeds.device, dtype=torch.int64) + 1, 0x9E3779B1))
    bits = _mix32(h[:, None] ^ columns[None, :])
    return ((bits >> 8).to(torch.float32) + 0.5) * 2.0 ** -24    # 24 bits: exact in float32, never 0 or 1


def sample_tokens(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, seeds: torch.Tensor,
                  counters: torch.Tensor) -> torch.Tensor:
    """One token per row of ``logits`` ``(rows, vocab)``: greedy where ``temperature`` is 0, else a sample of
    softmax(logits / temperature) restricted to the ``top_k`` largest logits (0: all).

    Sampling is the Gumbel-max trick with the noise of :func:`counter_uniforms`: token = argmax(logits / T +
    g), g = −log(−log u).  So a row's token depends only on its logits, temperature, top-k, seed and counter,
    never on the other rows.  Logits tied at the k-th largest value are all kept.

    Args:
        logits: ``(rows, vocab)``, any float dtype (computed in float32).
        temperature: float ``(rows,)``, ≥ 0; top_k: integer ``(rows,)``, ≥ 0.
        seeds, counters: int64 ``(rows,)`` (the request's seed, the index of the token being sampled).

    Returns:
        int64 ``(rows,)`` on the logits' device.
    """
    logits = logits.float()
    greedy = logits.argmax(-1)
    rows, vocab = logits.shape
    if rows == 0:
        return greedy
    temperature = temperature.to(device=logits.device, dtype=torch.float32)
    top_k = top_k.to(device=logits.device, dtype=torch.int64)
    scaled = logits / temperature.clamp_min(torch.finfo(torch.float32).tiny)[:, None]
    kept = top_k.clamp(0, vocab)
    kth = scaled.sort(dim=-1, descending=True).values.gather(1, (kept.clamp_min(1) - 1)[:, None])   # [rows, 1]
    threshold = torch.where(kept[:, None] > 0, kth, torch.full_like(kth, -math.inf))
    scaled = scaled.masked_fill(scaled < threshold, -math.inf)
    gumbel = -torch.log(-torch.log(counter_uniforms(seeds.to(logits.device), counters.to(logits.device), vocab)))
    sampled = (scaled + gumbel).argmax(-1)
    return torch.where(temperature > 0, sampled, greedy)


# ---------------------------------------------------------------------------------------------- requests


@dataclasses.dataclass
class Completion:
    """A finished request: its generated ``tokens`` (the stop token included when it ended the request),
    ``finish_reason`` (``"stop"`` or ``"length"``) and its times (the generator's clock, seconds)."""

    request_id: Hashable
    prompt_length: int
    tokens: list
    finish_reason: str
    arrival: float
    first_token_time: float
    finish_time: float

    @property
    def time_to_first_token(self) -> float:
        """Seconds from arrival to the first generated token."""
        return self.first_token_time - self.arrival

    @property
    def latency(self) -> float:
        """Seconds from arrival to the last generated token."""
        return self.finish_time - self.arrival


@dataclasses.dataclass
class StepStats:
    """What one :meth:`ContinuousBatchingGenerator.step` did: rows decoded (padding excluded), sequences and
    tokens prefilled, and the seconds of its decode and prefill phases (CUDA events on a GPU) and of the
    whole step (host clock, the sampled tokens read back)."""

    decode_rows: int
    prefill_sequences: int
    prefill_tokens: int
    decode_s: float
    prefill_s: float
    step_s: float


@dataclasses.dataclass
class _Request:
    request_id: Hashable
    prompt: list
    max_new_tokens: int
    stop_token: Optional[int]
    temperature: float
    top_k: int
    seed: int
    arrival: float
    prompt_ids: Optional[torch.Tensor] = None   # the prompt as a host int64 tensor, made once at submission
    slot: int = -1
    tokens: list = dataclasses.field(default_factory=list)
    first_token_time: float = 0.0


class _PhaseTimer:
    """Marks on the device's timeline (CUDA events: no sync) or the host clock (CPU: work is synchronous)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start, end) -> float:   # after the step's sync
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start


def _available_bytes(device: torch.device) -> Optional[int]:
    """Free memory of ``device`` (CUDA: free device memory; CPU: available physical memory), or None."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _positive_int(name: str, value, allow_none: bool = False) -> None:
    if allow_none and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int{' or None' if allow_none else ''}, got {value!r}")


# ---------------------------------------------------------------------------------------------- the generator


class ContinuousBatchingGenerator:
    """Serve many requests on one model at once, each request's recurrent state in a slot of per-layer pools.

    Each :meth:`step` (docs/design.md §13.5):

    1. admits waiting requests, first come first served, into free slots while the prompts admitted in this
       step fit ``max_prefill_tokens`` (a prompt longer than the budget is admitted alone);
    2. decodes every request that was running before this step: one slotted decode per layer over all of them
       (:meth:`~LinearAttentionGenerationMixin.decode_slotted`), the batch padded with slot −1 rows up to a
       power of two (at most ``slots``), so only a few decode shapes occur;
    3. prefills the admitted prompts packed into one sequence stream, each from a zero state
       (``has_initial_state`` false, so a reused slot's stale state is never read), its final state written
       to its slot (:meth:`~LinearAttentionGenerationMixin.prefill_packed`);
    4. samples one token for each of those rows in one call (:func:`sample_tokens`), reads the tokens back
       (the step's one device sync), and retires the requests that produced their stop token or
       ``max_new_tokens`` tokens, whose slots are free for the next step.

    So every active request gains exactly one token per step, the first one from its prefill.

    Args:
        model: a :class:`~leettriton.models.RetNetForCausalLM` or :class:`~leettriton.models.TransNormerForCausalLM`
            (anything with ``make_state_pools``, ``prefill_packed`` and ``decode_slotted``), in eval mode.
        slots: the number of requests that run at once (one state slot per request, per layer).
        max_prefill_tokens: the most prompt tokens one step prefills (None: no limit).
        prefill_method: the packed prefill's method (None: each layer's own method, which must then have a
            packed path: ``"auto"``, ``"lightning_attention"``, ``"block_based"`` or a ``"<method>_torch"``).
        clock: the clock of the completions' times (default :func:`time.perf_counter`).

    Example::

        >>> gen = ContinuousBatchingGenerator(model, slots=32)
        >>> gen.submit([1, 50, 7], max_new_tokens=16, stop_token=2)
        >>> gen.submit(prompt_ids, max_new_tokens=64, temperature=0.8, top_k=40, seed=1234)
        >>> while not gen.idle:
        ...     for done in gen.step():
        ...         print(done.request_id, done.tokens)
    """

    def __init__(self, model, *, slots: int, max_prefill_tokens: Optional[int] = None,
                 prefill_method: Optional[str] = None, clock: Callable[[], float] = time.perf_counter) -> None:
        missing = [name for name in ("make_state_pools", "prefill_packed", "decode_slotted", "attention_layers")
                   if not callable(getattr(model, name, None))]
        if missing:
            raise TypeError(f"model must have the serving entry points make_state_pools, prefill_packed and "
                            f"decode_slotted (leettriton.models' causal LMs); {type(model).__name__} lacks "
                            f"{', '.join(missing)}")
        _positive_int("slots", slots)
        _positive_int("max_prefill_tokens", max_prefill_tokens, allow_none=True)
        for layer in model.attention_layers():
            name = registry.canonical_method(layer.method if prefill_method is None else prefill_method)
            if name not in ("auto",) + VARLEN_NATIVE and registry.torch_method(name) is None:
                raise ValueError(f"the packed prefill needs a method with a packed path ('auto', "
                                 f"{', '.join(repr(m) for m in VARLEN_NATIVE)} or a '<method>_torch' twin); layer "
                                 f"{layer.layer_idx} would run {name!r}: pass prefill_method=...")
        self.model = model
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.config.vocab_size)
        state_bytes = 4 * sum(h * r * d for h, r, d in model.cache_owner()[1])
        need, free = slots * state_bytes, _available_bytes(self.device)
        if free is not None and need > free:
            raise ValueError(f"slots={slots} need {need / 2 ** 30:.2f} GiB of state pools ({state_bytes} bytes per "
                             f"slot over {len(model.cache_owner()[1])} layers), but {self.device} has only "
                             f"{free / 2 ** 30:.2f} GiB free: use fewer slots")
        self.slots = slots
        self.max_prefill_tokens = max_prefill_tokens
        self.prefill_method = prefill_method
        self.clock = clock
        self.pools = model.make_state_pools(slots, self.device)
        self.free_slots = list(range(slots - 1, -1, -1))   # a stack: slot 0 is handed out first
        self.waiting: collections.deque = collections.deque()
        self.running: list = []
        self.stats: list = []
        self._ids: set = set()
        self._next_id = 0
        self._timer = _PhaseTimer(self.device)

    @property
    def idle(self) -> bool:
        """True when no request waits or runs."""
        return not self.waiting and not self.running

    def submit(self, prompt: Sequence[int], max_new_tokens: int, *, stop_token: Optional[int] = None,
               temperature: float = 0.0, top_k: int = 0, seed: Optional[int] = None,
               request_id: Optional[Hashable] = None, arrival: Optional[float] = None) -> Hashable:
        """Queue a request; returns its id.

        Args:
            prompt: token ids (a non-empty sequence of ints in [0, vocab_size), or a 1-D integer tensor).
            max_new_tokens: how many tokens to generate at most (≥ 1).
            stop_token: a token id that ends the request (it is the last of its tokens), or None.
            temperature: 0 for greedy, else the sampling temperature; top_k: sample among the k largest
                logits (0: all).
            seed: the sampling seed (a non-negative int below 2⁶³); None: the request's number in this
                generator (0, 1, ...).  Tokens depend on the seed and the token index only, never on the
                batch (docs/design.md §13.5).
            request_id: any hashable id not used before (default: the request's number).
            arrival: its arrival time on the generator's clock (default: now), for the latencies.
        """
        if isinstance(prompt, torch.Tensor):
            if prompt.dim() != 1 or prompt.is_floating_point():
                raise ValueError(f"prompt must be a 1-D integer tensor or a sequence of ints, got a tensor of "
                                 f"shape {tuple(prompt.shape)} and dtype {prompt.dtype}")
            prompt = prompt.tolist()
        prompt = list(prompt)
        if not prompt:
            raise ValueError("prompt must hold at least one token, got an empty prompt")
        bad = [t for t in prompt if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt tokens must be ints in [0, vocab_size={self.vocab_size}), got {bad[0]!r}")
        _positive_int("max_new_tokens", max_new_tokens)
        if stop_token is not None and (not isinstance(stop_token, int) or isinstance(stop_token, bool)
                                       or not 0 <= stop_token < self.vocab_size):
            raise ValueError(f"stop_token must be None or an int in [0, vocab_size={self.vocab_size}), got "
                             f"{stop_token!r}")
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not temperature >= 0 \
                or math.isinf(temperature):
            raise ValueError(f"temperature must be a finite number ≥ 0 (0: greedy), got {temperature!r}")
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
            raise ValueError(f"top_k must be an int ≥ 0 (0: no restriction), got {top_k!r}")
        number = self._next_id
        seed = number if seed is None else seed
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2 ** 63:
            raise ValueError(f"seed must be an int in [0, 2**63), got {seed!r}")
        request_id = number if request_id is None else request_id
        if not isinstance(request_id, Hashable):
            raise TypeError(f"request_id must be hashable, got {type(request_id).__name__}")
        if arrival is not None and (not isinstance(arrival, (int, float)) or isinstance(arrival, bool)
                                    or not math.isfinite(arrival)):
            raise ValueError(f"arrival must be None or a finite time on the generator's clock, got {arrival!r}")
        if request_id in self._ids:
            raise ValueError(f"request_id {request_id!r} is already in use")
        self._ids.add(request_id)
        self._next_id += 1
        self.waiting.append(_Request(request_id, prompt, max_new_tokens, stop_token, float(temperature), top_k, seed,
                                     self.clock() if arrival is None else arrival,
                                     torch.tensor(prompt, dtype=torch.int64)))
        return request_id

    def step(self) -> list:
        """Admit, decode, prefill, sample and retire once (see the class); returns the requests finished in
        this step as :class:`Completion`\\ s, and appends a :class:`StepStats` to ``stats``."""
        started = time.perf_counter()
        admitted, budget = [], 0
        while self.waiting and self.free_slots:
            n = len(self.waiting[0].prompt)
            if admitted and self.max_prefill_tokens is not None and budget + n > self.max_prefill_tokens:
                break
            request = self.waiting.popleft()
            request.slot = self.free_slots.pop()
            admitted.append(request)
            budget += n
        decoding = self.running
        if not decoding and not admitted:
            return []
        marks = [self._timer.mark()]
        logits = []
        if decoding:
            logits.append(self._decode(decoding))
        marks.append(self._timer.mark())
        if admitted:
            logits.append(self._prefill(admitted))
        marks.append(self._timer.mark())
        rows = decoding + admitted
        tokens = self._sample(torch.cat(logits) if len(logits) > 1 else logits[0], rows).tolist()   # the sync
        now = self.clock()
        finished, running = [], []
        for request, token in zip(rows, tokens):
            if not request.tokens:
                request.first_token_time = now
            request.tokens.append(token)
            if token == request.stop_token or len(request.tokens) >= request.max_new_tokens:
                self.free_slots.append(request.slot)
                self._ids.discard(request.request_id)
                finished.append(Completion(request.request_id, len(request.prompt), request.tokens,
                                           "stop" if token == request.stop_token else "length", request.arrival,
                                           request.first_token_time, now))
            else:
                running.append(request)
        self.running = running
        self.stats.append(StepStats(len(decoding), len(admitted), budget, self._timer.seconds(marks[0], marks[1]),
                                    self._timer.seconds(marks[1], marks[2]), time.perf_counter() - started))
        return finished

    def run(self) -> list:
        """Step until every submitted request has finished; returns their completions in order of finishing."""
        done = []
        while not self.idle:
            done.extend(self.step())
        return done

    def _decode(self, decoding: list) -> torch.Tensor:
        """Logits ``(len(decoding), vocab)`` of one slotted decode of the running requests' newest tokens."""
        rows = len(decoding)
        padded = min(self.slots, 1 << (rows - 1).bit_length())
        table = torch.zeros((3, padded), dtype=torch.int64)
        table[2].fill_(-1)                                   # padding rows: slot −1, token 0 at position 0
        table[0, :rows] = torch.tensor([r.tokens[-1] for r in decoding])
        table[1, :rows] = torch.tensor([len(r.prompt) + len(r.tokens) - 1 for r in decoding])
        table[2, :rows] = torch.tensor([r.slot for r in decoding])
        table = table.to(self.device, non_blocking=True)
        logits = self.model.decode_slotted(table[0], table[1], self.pools, table[2], check_slots=False)
        return logits[:rows]

    def _prefill(self, admitted: list) -> torch.Tensor:
        """Logits ``(len(admitted), vocab)`` of the last prompt token of each admitted request, all prompts in
        one packed prefill from zero states."""
        lengths = torch.tensor([len(r.prompt) for r in admitted], dtype=torch.int64)
        cu = torch.zeros(len(admitted) + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=cu[1:])
        total = int(cu[-1])
        positions = torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(cu[:-1], lengths)
        ids = torch.cat([r.prompt_ids for r in admitted])
        slots = torch.tensor([r.slot for r in admitted], dtype=torch.int64)
        ids, positions, cu, slots = (x.to(self.device, non_blocking=True) for x in (ids, positions, cu, slots))
        fresh = torch.zeros(len(admitted), dtype=torch.bool, device=self.device)
        return self.model.prefill_packed(ids, cu, positions, self.pools, slots, fresh, method=self.prefill_method,
                                         check_indices=False)

    def _sample(self, logits: torch.Tensor, rows: list) -> torch.Tensor:
        if all(r.temperature == 0 for r in rows):
            return logits.float().argmax(-1)
        params = torch.tensor([[r.top_k, r.seed, len(r.tokens)] for r in rows], dtype=torch.int64)
        params = params.to(self.device, non_blocking=True)
        temperature = torch.tensor([r.temperature for r in rows], dtype=torch.float32).to(self.device)
        return sample_tokens(logits, temperature, params[:, 0], params[:, 1], params[:, 2])


# ---------------------------------------------------------------------------------------------- the command


def _model(kind: str, gpu: bool, dtype: torch.dtype, device: torch.device, method: str):
    """A model with random weights: two layers of RetNet-1.3B / TransNormerLLM-7B on a GPU, tiny on CPU."""
    from .retnet import RetNetConfig, RetNetForCausalLM
    from .transnormer import TransNormerConfig, TransNormerForCausalLM
    if kind == "retnet":
        config = (RetNetConfig(hidden_size=2048, num_heads=8, expand_k=1.0, expand_v=2.0, num_hidden_layers=2,
                               vocab_size=32000, attention_method=method) if gpu else
                  RetNetConfig(hidden_size=32, num_heads=2, expand_k=0.5, expand_v=1.0, num_hidden_layers=2,
                               vocab_size=64, intermediate_size=48, attention_method=method))
        cls = RetNetForCausalLM
    else:
        config = (TransNormerConfig(hidden_size=4096, num_heads=32, hidden_dim=4096, glu_dim=11008,
                                    num_hidden_layers=2, vocab_size=64000, attention_method=method) if gpu else
                  TransNormerConfig(hidden_size=32, num_heads=2, num_hidden_layers=2, vocab_size=64, glu_dim=48,
                                    linear_use_lrpe_list=[1, 0], attention_method=method))
        cls = TransNormerForCausalLM
    torch.manual_seed(0)
    return cls(config).to(device=device, dtype=dtype).eval(), config


def _percentile(values: list, q: float) -> Optional[float]:
    """The q-th percentile (linear interpolation between order statistics), or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _stream(args, vocab: int) -> tuple[list, list]:
    """The synthetic requests: prompts of uniform random lengths and tokens, arrival offsets (Poisson at
    ``rate`` per second, or all at 0), from ``args.seed``."""
    g = torch.Generator().manual_seed(args.seed)
    lengths = torch.randint(args.prompt_min, args.prompt_max + 1, (args.requests,), generator=g).tolist()
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
    if args.rate > 0:
        gaps = torch.empty(args.requests, dtype=torch.float64).exponential_(args.rate, generator=g)
        arrivals = torch.cumsum(gaps, 0).tolist()
    else:
        arrivals = [0.0] * args.requests
    return prompts, arrivals


def serve_stream(generator: ContinuousBatchingGenerator, prompts: list, arrivals: list, *, new_tokens: int,
                 temperature: float = 0.0, top_k: int = 0, stop_token: Optional[int] = None) -> tuple[list, float]:
    """Feed ``prompts`` to ``generator`` at ``arrivals`` (seconds from now, non-decreasing) and step until all
    finished; returns (completions, wall seconds)."""
    start = generator.clock()
    done, i = [], 0
    while i < len(prompts) or not generator.idle:
        now = generator.clock() - start
        while i < len(prompts) and arrivals[i] <= now:
            generator.submit(prompts[i], new_tokens, stop_token=stop_token, temperature=temperature, top_k=top_k,
                             request_id=("r", i), arrival=start + arrivals[i])
            i += 1
        if generator.idle:
            time.sleep(max(0.0, arrivals[i] - (generator.clock() - start)))
            continue
        done.extend(generator.step())
    return done, generator.clock() - start


def _summary(done: list, wall: float, stats: list) -> dict:
    generated = sum(len(c.tokens) for c in done)
    prompt = sum(c.prompt_length for c in done)
    prefill_s = sum(s.prefill_s for s in stats)
    decode_s = sum(s.decode_s for s in stats)
    decoded = sum(s.decode_rows for s in stats)
    ttft = [c.time_to_first_token for c in done]
    e2e = [c.latency for c in done]
    steps_with_decode = [s.decode_rows for s in stats if s.decode_rows]
    return {
        "requests": len(done), "generated_tokens": generated, "prompt_tokens": prompt, "wall_s": wall,
        "steps": len(stats),
        "generated_tokens_per_s": generated / wall if wall > 0 else None,
        "prompt_tokens_per_s": prompt / wall if wall > 0 else None,
        "prefill_phase_s": prefill_s, "prefill_tokens_per_s": prompt / prefill_s if prefill_s > 0 else None,
        "decode_phase_s": decode_s, "decode_tokens_per_s": decoded / decode_s if decode_s > 0 else None,
        "mean_decode_batch": sum(steps_with_decode) / len(steps_with_decode) if steps_with_decode else 0.0,
        "ttft_p50_ms": 1e3 * _percentile(ttft, 50), "ttft_p99_ms": 1e3 * _percentile(ttft, 99),
        "e2e_p50_ms": 1e3 * _percentile(e2e, 50), "e2e_p99_ms": 1e3 * _percentile(e2e, 99),
    }


def _markdown(result: dict) -> str:
    env, s, a = result["environment"], result["summary"], result["arguments"]
    arrivals = "all at once" if a["rate"] <= 0 else f"Poisson at {a['rate']:g} per second"

    def fmt(x, digits=1):
        return "—" if x is None else f"{x:,.{digits}f}"

    return "\n".join([
        f"# Continuous-batching generator: {a['model']} ({result['model_config']})",
        "",
        f"`{result['command']}`",
        "",
        f"{env['device']}, torch {env['torch']}, triton {env['triton']}, leettriton {env['git_sha']}, {env['date']}",
        "",
        f"{a['requests']} requests, prompts {a['prompt_min']}–{a['prompt_max']} tokens, {a['new_tokens']} new tokens "
        f"each, arrivals {arrivals}, "
        f"{a['slots']} slots, max prefill tokens {a['max_prefill_tokens']}, {a['dtype']}, temperature "
        f"{a['temperature']}, top-k {a['top_k']}.",
        "",
        "| generated tok/s | prompt tok/s (wall) | prefill tok/s (prefill phases) | decode tok/s (decode phases) "
        "| TTFT p50 / p99 ms | end-to-end p50 / p99 ms | steps | mean decode batch | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {fmt(s['generated_tokens_per_s'])} | {fmt(s['prompt_tokens_per_s'])} | {fmt(s['prefill_tokens_per_s'])} "
        f"| {fmt(s['decode_tokens_per_s'])} | {fmt(s['ttft_p50_ms'])} / {fmt(s['ttft_p99_ms'])} "
        f"| {fmt(s['e2e_p50_ms'])} / {fmt(s['e2e_p99_ms'])} | {s['steps']} | {fmt(s['mean_decode_batch'])} "
        f"| {fmt(s['wall_s'], 2)} |",
        "",
    ])


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """The command: serve a synthetic stream on a model with random weights; print throughput and latencies."""
    p = argparse.ArgumentParser(prog="python -m leettriton.models.serving", description=main.__doc__)
    p.add_argument("--model", choices=("retnet", "transnormer"), default="retnet")
    p.add_argument("--requests", type=int, default=None, help="requests in the stream (GPU 256, CPU 12)")
    p.add_argument("--rate", type=float, default=0.0, help="arrivals per second, Poisson; 0: all at once (default)")
    p.add_argument("--prompt-min", type=int, default=None, help="shortest prompt (GPU 128, CPU 1)")
    p.add_argument("--prompt-max", type=int, default=None, help="longest prompt (GPU 2048, CPU 24)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens generated per request (GPU 128, CPU 8)")
    p.add_argument("--slots", type=int, default=None, help="requests running at once (GPU 64, CPU 4)")
    p.add_argument("--max-prefill-tokens", type=int, default=None, help="prompt tokens per step (GPU 16384, "
                   "CPU none)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                   help="model dtype (GPU float16, CPU float32); the states are float32")
    p.add_argument("--method", default="auto", help="the packed prefill's method (default auto)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--seed", type=int, default=0, help="the stream's seed (lengths, tokens, arrivals)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up stream (compiles, autotuning)")
    p.add_argument("--out", metavar="DIR", help="results root: write DIR/<family>/serving_<model>[_<dtype>].json "
                   "and its .md, <family> being the GPU family this runs on (cpu on a CPU)")
    p.add_argument("--json", metavar="PATH", help="write the result to PATH and a Markdown table to PATH's .md "
                   "(refused in a folder named after another GPU family)")
    args = p.parse_args(argv)
    if args.out and args.json:
        raise SystemExit("give --out DIR (the file is named for you) or --json PATH, not both")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = device.type == "cuda"
    defaults = dict(requests=(256, 12), prompt_min=(128, 1), prompt_max=(2048, 24), new_tokens=(128, 8),
                    slots=(64, 4), max_prefill_tokens=(16384, None), dtype=("float16", "float32"))
    for name, (on_gpu, on_cpu) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, on_gpu if gpu else on_cpu)
    for name in ("requests", "prompt_min", "new_tokens", "slots"):
        _positive_int(f"--{name.replace('_', '-')}", getattr(args, name))
    if args.prompt_max < args.prompt_min:
        raise SystemExit(f"--prompt-max ({args.prompt_max}) must be at least --prompt-min ({args.prompt_min})")
    if args.rate < 0:
        raise SystemExit(f"--rate must be ≥ 0, got {args.rate}")
    path = _result_path(args, current_family(device).name, default_dtype=defaults["dtype"][0 if gpu else 1])
    dtype = getattr(torch, args.dtype)
    model, config = _model(args.model, gpu, dtype, device, args.method)
    options = dict(slots=args.slots, max_prefill_tokens=args.max_prefill_tokens)
    sampling = dict(temperature=args.temperature, top_k=args.top_k)
    prompts, arrivals = _stream(args, config.vocab_size)
    if not args.no_warmup:   # the shortest and longest prompts, a full decode batch: compiles and autotunes
        warm = ContinuousBatchingGenerator(model, **options)
        short, long = min(prompts, key=len), max(prompts, key=len)
        serve_stream(warm, [short, long] * max(1, args.slots // 2), [0.0] * (2 * max(1, args.slots // 2)),
                     new_tokens=min(args.new_tokens, 4), **sampling)
        del warm
    generator = ContinuousBatchingGenerator(model, **options)
    done, wall = serve_stream(generator, prompts, arrivals, new_tokens=args.new_tokens, **sampling)
    from ..bench.environment import environment
    result = {
        "environment": environment(device),
        "command": "python -m leettriton.models.serving " + " ".join(sys.argv[1:] if argv is None else argv),
        "arguments": vars(args),
        "model_config": ("RetNet-1.3B (2 layers)" if args.model == "retnet" else "TransNormerLLM-7B (2 layers)")
        if gpu else f"tiny {args.model}",
        "summary": _summary(done, wall, generator.stats),
        "requests": [{"id": c.request_id[1], "prompt_length": c.prompt_length, "generated": len(c.tokens),
                      "ttft_ms": 1e3 * c.time_to_first_token, "e2e_ms": 1e3 * c.latency} for c in done],
    }
    table = _markdown(result)
    print(table)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.splitext(path)[0] + ".md", "w") as f:
            f.write(table)
        print(f"wrote {path} and {os.path.splitext(path)[0] + '.md'}")
    return result


def _result_path(args, family: str, *, default_dtype: str) -> Optional[str]:
    """Where the command writes its result: ``--out DIR`` → ``DIR/<family>/serving_<model>[_<dtype>].json`` (the
    dtype named when it is not the device's default), ``--json PATH`` → PATH, else nowhere.  A ``--json`` path
    in a folder named after a GPU family other than ``family`` (``results/h100/`` on an H200 or a CPU) is
    refused before anything runs: results of one GPU never land among another's."""
    if args.out:
        suffix = "" if args.dtype == default_dtype else f"_{args.dtype}"
        return os.path.join(args.out, family, f"serving_{args.model}{suffix}.json")
    if args.json:
        folder = os.path.basename(os.path.dirname(os.path.abspath(args.json)))
        named = folder.split("-x")[0]   # a multi-GPU host's folder: h200-x4
        if named in FAMILIES and named != family:
            raise SystemExit(f"--json {args.json}: that folder holds {named}'s results, but this runs on {family}; "
                             f"use --out DIR (it writes DIR/{family}/) or another path")
    return args.json


if __name__ == "__main__":
    main()
