"""Generation with a persistent cache: prefill (reusing the longest cached prefix), then one token at a time.

The editor sends almost the same prompt on every keystroke; :class:`Generator` keeps the last
request's cache and recomputes only the tokens after the longest prefix shared (ids and roles) with
it. Decoding is greedy at temperature 0, else temperature + top-p sampling from a seeded generator;
it stops at end-of-text, at a stop string, at ``max_new_tokens``, when ``should_cancel()`` says so
(checked between tokens), or, with ``min_token_prob``, at the first token the model is unsure of once a
word is written, cut back to where the last word or bracket ended (a completion's junk tail costs
steps and shows wrong text).

With a ``drafter`` (the workspace memory's continuation, ``glm5_lsp.memory``), a proposed run of
tokens is verified in one forward pass: the tokens are fed together, and each position's logits go
through the same processor and the same choice as a step would make; a greedy choice that equals
the proposed token accepts it (and its logits, already computed, serve the next step), the first
that differs ends the draft and the cache is cut back. Sampling accepts a proposed token with its
probability and otherwise samples from the rest (speculative sampling with a one-token proposal),
so the text is distributed as without drafts. Greedy text is the same with and without drafts.

Every forward call goes through :func:`cached_forward`, which picks the path: the lean one-token step
(``decode.decode_one``) or short-prompt prefill (``decode.prefill_dense``, which also verifies a
draft) where they compute what the general ``forward`` would, else ``forward``; the lean paths run
as ``scripted.py`` compiled them (the same operations through TorchScript; the Python ones where
scripting failed or ``scripted=False``), and a one-token step or a prompt's prefill where every key
is attended runs as ``native.c`` computes it in one call (``native.py``; ``native=False``: never).
The model's inference weights are built when the generator is made (``prepare_inference``) and
again before a generation if the weights changed since.

With ``GenerationConfig.step_stats`` the generation also hands out the model's per-step internals
(``Generation.stats``, ``stats.StepStats``: DSA's indexer and attention by key role, the MoE router,
the last hidden state's norm), one entry per step in the order the tokens were chosen.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from glm5_lsp.model import lean as decode
from glm5_lsp.model import native as c_step
from glm5_lsp.model import scripted as script
from glm5_lsp.model.glm5 import GlmMoeDsaForCausalLM
from glm5_lsp.model.kv_cache import KVCache
from glm5_lsp.model.policy import AttentionPolicy, Role, roles_tensor
from glm5_lsp.model.stats import StatsProbe, StepStats
from glm5_lsp.model.tokenizer import Tokenizer

log = logging.getLogger(__name__)

LogitsProcessor = Callable[[Sequence[int], torch.Tensor], torch.Tensor]
Drafter = Callable[[Sequence[int]], Sequence[int]]  # generated ids -> proposed next ids (may be empty)


@dataclass
class GenerationConfig:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 is greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_at_eos: bool = True
    # At a token whose probability (softmax of the processed scores) is below this, stop and cut the
    # text back to its last stopping point: where a word ended (the first word included) or a closing
    # bracket was written, never after an operator or an opener (``x =``, ``f(``). Before the first
    # word ends there is none, and generation goes on. 0 turns it off. Finish reason "unsure".
    min_token_prob: float = 0.0
    # Hand out the model's per-step internals (``Generation.stats``; ``stats.py``), at a small cost a step.
    step_stats: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if not 0 <= self.min_token_prob < 1:
            raise ValueError("min_token_prob must be in [0, 1)")


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    logprob: float  # sum of the chosen tokens' log-probabilities under the model
    finish_reason: str  # "stop" | "length" | "cancelled" | "unsure" (``min_token_prob``)
    prompt_tokens: int
    cached_tokens: int  # prompt tokens reused from the previous call
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    drafted_tokens: int = 0  # proposed by the drafter and verified
    accepted_tokens: int = 0  # of those, kept
    forward_calls: int = 0  # model calls after the prefill (steps and verifications)
    guessed_steps: int = 0  # of the steps, those run ahead for the model's likeliest token (and kept)
    crowded: bool = False  # a hand-over to the C worker found no idle core: the rest ran in this thread
    stats: StepStats | None = None  # with ``GenerationConfig.step_stats``: one entry per step


def sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> int:
    """One token id from ``logits [V]``: argmax at temperature 0, else nucleus sampling."""
    if temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < top_p  # always keeps the most likely token
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


def sample_with_draft(logits: torch.Tensor, proposed: int, temperature: float, top_p: float,
                      generator: torch.Generator | None) -> int:
    """One token id distributed as :func:`sample`'s, given a proposed one: greedy is the argmax;
    otherwise ``proposed`` is accepted with its probability, else a token is drawn from the others
    in proportion to theirs (speculative sampling when the proposal is a single token)."""
    if temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    probs = probs / probs.sum()
    if 0 <= proposed < probs.shape[-1]:
        accept = float(probs[proposed])
        if float(torch.rand(1, generator=generator)) < accept:
            return proposed
        probs = probs.clone()
        probs[proposed] = 0.0
        if float(probs.sum()) <= 0:
            return proposed
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


_WORD_CHAR = re.compile(r"\w")
_CLOSERS = ")]}"


def _stops_between(text: str, piece: str) -> bool:
    """Whether ``text`` may end a completion that ``piece`` would go on from: a word there ends
    (``piece`` does not go on with it) or a bracket was just closed, after some word was written."""
    if not text or not _WORD_CHAR.search(text):
        return False
    if text[-1] in _CLOSERS:
        return True
    return _WORD_CHAR.match(text[-1]) is not None and not _WORD_CHAR.match(piece)


def _held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters might still grow into a stop string (so are not streamed yet)."""
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                hold = max(hold, n)
                break
    return hold


def cached_forward(
    model: GlmMoeDsaForCausalLM,
    input_ids: torch.Tensor,
    cache: KVCache,
    *,
    roles: torch.Tensor | list | None = None,
    policy: AttentionPolicy | None = None,
    dense: bool = False,
    last_only: bool = False,
    lean: bool = True,
    scripted: bool = True,
    native_step: bool = True,
    probe: StatsProbe | None = None,
) -> torch.Tensor:
    """``model(input_ids, cache=cache, ...)`` on the fastest path that computes the same logits and
    cache entries: ``decode.decode_one`` for one token, ``decode.prefill_dense`` for a short prompt
    (its last position, or every position: a draft's verification), each as ``scripted.py`` compiled
    it where it could, else the general ``forward``. ``lean=False``: always the general path;
    ``scripted=False``: the lean paths in Python. ``native_step``: a one-token step, a prompt's
    prefill or a draft's verification that ``native.py`` computes (:func:`in_c`: DSA's selection
    included, no probe) runs in C, to rounding the same logits (False: never).
    ``probe``: record the per-step statistics (of the last row with ``last_only``, else of every row)."""
    step = model.prepare_step(input_ids, cache=cache, roles=roles, policy=policy, dense=dense, probe=probe)
    if lean and native_step and in_c(model, input_ids, step):
        compiled = c_step.get(model)
        if compiled is not None:
            return compiled.forward(input_ids, step, every_row=not last_only)
    if lean and decode.applies(model, input_ids, step):
        fast = script.get(model) if scripted else None
        if fast is not None:
            return script.decode_one(fast, input_ids, step)
        return decode.decode_one(model, input_ids, step)
    if lean and decode.applies_dense(model, input_ids, step):
        fast = script.get(model) if scripted else None
        if fast is not None:
            return script.prefill_dense(fast, input_ids, step, last_only=last_only)
        return decode.prefill_dense(model, input_ids, step, last_only=last_only)
    return model.forward_step(input_ids, step, last_only=last_only)


def in_c(model: GlmMoeDsaForCausalLM, input_ids: torch.Tensor, step) -> bool:
    """Whether ``native.py`` computes this call: a step, a prefill of up to ``lean.PREFILL_MAX_TOKENS``
    or a draft's verification of one sequence, with DSA's selection (forced keys included) or every
    key (no probe)."""
    return (input_ids.shape[1] <= decode.PREFILL_MAX_TOKENS and decode.lean_ok(model, input_ids, step)
            and c_step.applies(step, input_ids.shape[1]))


def spare_core() -> bool:
    """Whether a core is left beside torch's threads for the C worker: where torch's thread pool spins
    on every core, a step run ahead competes with it (2 threads on 2 cores: 0.85x as fast)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return torch.get_num_threads() < cores


OVERLAP_MIN_SECONDS = 0.0002  # a drafter faster than this runs before the step: handing the step to the C
# worker and back costs about 0.05-0.1 ms (an empty memory's drafter: 2.8% slower with the hand-over)
# A hand-over to the C worker that takes longer than this found no idle core: the woken worker took this
# thread's core (about 20 microseconds where a core is idle, 0.3-1 ms where every core is busy). Running a
# step beside the Python then only takes turns with it on the same core, and the hand-overs cost: with
# both cores busy (the background training), steps run ahead made decoding 0.75x as fast. The rest of
# the generation then runs its steps in this thread (``Generation.crowded``; BENCHMARKS.md, "Steps
# beside the Python on a busy machine").
HANDOFF_SLOW_SECONDS = 0.00025


class Generator:
    """Owns one model's cache across calls (batch size 1). Not thread-safe: callers hold a lock.

    ``lean``: take ``lean.py``'s paths where they apply (False: the general ``forward`` only; tests
    and benchmarks compare the two); ``scripted``: run them as ``scripted.py`` compiled them (built
    here, so the first request does not wait for it: about 180 ms for the first model of a process,
    the compile and TorchScript's first optimised runs; False: in Python); ``native``: a one-token
    step or a prompt's prefill where every key is attended runs in C (``native.py``; to rounding the
    same logits)."""

    def __init__(self, model: GlmMoeDsaForCausalLM, tokenizer: Tokenizer, policy: AttentionPolicy | None = None,
                 lean: bool = True, scripted: bool = True, native: bool = True) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.policy = policy
        self.lean = lean
        self.scripted = scripted
        self.native = native
        self._pending: c_step.Pending | None = None  # a prefill :meth:`prefetch` started
        self.guess_ahead = True  # run the next step ahead while the processors work (see generate)
        self.crowded = False  # this generation found no idle core for the C worker (``HANDOFF_SLOW_SECONDS``)
        param = next(model.parameters())
        self.cache = KVCache(model.config, 1, dtype=param.dtype, device=param.device)
        model.prepare_inference()
        if lean and scripted:
            script.get(model)  # built (and warmed up) now rather than in the first request
        if lean and native:
            compiled = c_step.get(model)  # (a few microseconds: it holds the weights' addresses)
            if compiled is not None:
                compiled.prepare()  # the transposed weights a prompt's prefill reads (about 50 ms), made now

    def reset(self) -> None:
        self.settle()
        self.cache.truncate(0)

    @torch.inference_mode()  # the cache's tensors were made in inference mode: written in it too
    def settle(self) -> None:
        """Finish a prefill :meth:`prefetch` started (its rows then count as cached)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.finish()

    @torch.inference_mode()
    def prefetch(self, prompt_ids: Sequence[int], roles: Sequence[int] | torch.Tensor | None = None) -> bool:
        """Start the prefill of all of ``prompt_ids`` but its last token on the C worker (``native.py``)
        and return at once: the caller's own work (the memory's and the checks' Python) runs meanwhile
        on another core, and a :meth:`generate` of the same prompt then computes only its last token.
        False where the C path does not apply (nothing started; the cache may be cut back to what the
        prompt shares with it, as :meth:`prefill` would)."""
        self.settle()
        if len(prompt_ids) < 2 or not (self.lean and self.native):
            return False
        if not self.model.inference_current():  # as in prefill: the C path reads the fused weights
            self.model.prepare_inference()
        ids, role_ids = self._prompt_tensors(prompt_ids, roles)
        ids, role_ids = ids[:, :-1], role_ids[:, :-1]
        reused = self.cache.common_prefix(ids, role_ids)
        if reused >= ids.shape[1] or c_step.get(self.model) is None:
            return False  # held already, or no C path
        self.cache.truncate(reused)
        self._pending = self._start_in_c(ids[:, reused:], role_ids[:, reused:])
        return self._pending is not None

    def _forward(self, ids: torch.Tensor, probe: StatsProbe | None, **kwargs) -> torch.Tensor:
        return cached_forward(self.model, ids, self.cache, policy=self.policy, lean=self.lean, scripted=self.scripted,
                              native_step=self.native, probe=probe, **kwargs)

    def _start_in_c(self, ids: torch.Tensor, roles: torch.Tensor | None = None,
                    every_row: bool = False) -> c_step.Pending | None:
        """``ids`` appended to the cache by the C worker (a step or a prefill, the last position's
        logits; see :meth:`prefetch`; ``every_row``: every position's, a draft's verification), or None
        where the C path does not apply (nothing started)."""
        compiled = c_step.get(self.model) if self.lean and self.native else None
        if compiled is None:
            return None
        step = self.model.prepare_step(ids, cache=self.cache, roles=roles, policy=self.policy)
        if not in_c(self.model, ids, step):
            return None
        pending = compiled.start(ids, step, every_row)
        if pending is not None and pending.handoff_seconds > HANDOFF_SLOW_SECONDS:
            self.crowded = True
        return pending

    def _prompt_tensors(self, prompt_ids: Sequence[int],
                        roles: Sequence[int] | torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``[1, T]`` ids and roles of a prompt (plain code where no roles are given), on the cache's device."""
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.cache.device)
        role_ids = roles_tensor(roles, 1, ids.shape[1])
        if role_ids is None:
            role_ids = torch.full_like(ids, int(Role.CODE))
        return ids, role_ids.to(ids.device)

    def _goes_on(self, out: list[int], proposal: list[int], text: str, config: GenerationConfig) -> bool:
        """Whether the generation goes on past ``proposal`` if it is kept: room for more tokens, and
        no stop string in its text (a one-line request's draft runs to the line's end)."""
        if len(out) + len(proposal) + 1 >= config.max_new_tokens:
            return False
        stops = [s for s in config.stop if s]
        if not stops:
            return True
        after = self.tokenizer.decode(out + proposal)
        return not any(after.find(s, max(0, len(text) - len(s) + 1)) >= 0 for s in stops)

    def _verify(self, proposal: list[int], out: list[int], drafter: Drafter | None,
                probe: StatsProbe | None) -> torch.Tensor:
        """Every row's logits ``[1, len(proposal), V]`` after the proposal's tokens. On the C worker
        where it can, while the drafter (where given: the generation goes on past the proposal) looks
        ahead past the whole proposal (its answer unused: it is asked again once the next token is
        chosen, and finds what it worked out then at hand, the memory's estimates remembered; on
        repeated structure nearly every proposal is kept)."""
        ids = torch.tensor([proposal], dtype=torch.long, device=self.cache.device)
        running = self._start_in_c(ids, every_row=True) if probe is None and drafter is not None else None
        if running is None:  # (nothing to do beside it: no hand-over to the worker)
            return self._forward(ids, probe)
        try:
            drafter(out + proposal)
        finally:
            rows = running.finish()  # (an error in the drafter goes on; the verified rows stand)
        return rows

    @torch.inference_mode()
    def prefill(self, prompt_ids: Sequence[int], roles: Sequence[int] | torch.Tensor | None = None,
                probe: StatsProbe | None = None) -> tuple[torch.Tensor, int]:
        """Bring the cache to exactly ``prompt_ids``; returns the last position's logits ``[V]`` and the reused count."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        self.settle()
        if not self.model.inference_current():  # the weights changed since (training, a new state dict)
            log.debug("model weights changed since prepare_inference(): rebuilding the inference weights")
            self.model.prepare_inference()
        ids, role_ids = self._prompt_tensors(prompt_ids, roles)
        reused = min(self.cache.common_prefix(ids, role_ids), ids.shape[1] - 1)
        self.cache.truncate(reused)
        logits = self._forward(ids[:, reused:], probe, roles=role_ids[:, reused:], last_only=True)
        return logits[0, -1], reused

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: Sequence[int],
        config: GenerationConfig | None = None,
        roles: Sequence[int] | torch.Tensor | None = None,
        logits_processor: LogitsProcessor | None = None,
        on_text: Callable[[str], None] | None = None,
        should_cancel: Callable[[], bool] | None = None,
        drafter: Drafter | None = None,
    ) -> Generation:
        config = config or GenerationConfig()
        t0 = time.perf_counter()
        probe = StatsProbe(scaling=self.model.config.routed_scaling_factor) if config.step_stats else None
        logits, reused = self.prefill(prompt_ids, roles, probe)
        self.crowded = False  # the machine's load is judged afresh for each generation
        here = (0, 0)  # the (probe block, row) the current logits came from
        draft_rows: list[tuple[int, int]] = []
        used: list[tuple[int, int]] = []  # per step, where its logits came from
        prefill_seconds = time.perf_counter() - t0
        rng = torch.Generator(device="cpu").manual_seed(config.seed) if config.seed is not None else None
        eos = self.tokenizer.eos_token_id if config.stop_at_eos else None
        out: list[int] = []
        logprobs: list[float] = []
        text = ""
        stop_point: tuple[int, str] | None = None  # (tokens, text) where an unsure stop would cut
        streamed = 0
        finish = "length"
        draft: list[int] = []  # proposed ids not yet decided, their logits after each, and the
        draft_logits: list[torch.Tensor] = []  # cache length that holds none of them
        valid = 0
        drafted = accepted = calls = guessed = 0
        kept_whole = False  # the last draft verified was kept to its end (then the drafter looks past the next)
        overlap = True  # the next step runs beside the drafter (see below)
        # While the processors (the memory, the decoding monitor: Python) work on a step's logits, the
        # C worker runs the next step for the token they most likely choose, the model's own likeliest
        # (greedy decoding, no draft pending). Kept where they chose it; otherwise dropped unread (the
        # cache's length never counted it) and the chosen token's step runs as before.
        guess_ahead = (self.guess_ahead and probe is None and logits_processor is not None and config.temperature == 0
                       and spare_core())
        guess: tuple[int, c_step.Pending] | None = None
        for _ in range(config.max_new_tokens):
            if should_cancel is not None and should_cancel():
                finish = "cancelled"
                break
            used.append(here)
            scores = logits.float()
            if guess_ahead and not self.crowded and not draft and len(out) + 1 < config.max_new_tokens:
                likeliest = int(torch.argmax(scores))
                if likeliest != eos:
                    pending = self._start_in_c(torch.tensor([[likeliest]], dtype=torch.long, device=self.cache.device))
                    guess = (likeliest, pending) if pending is not None else None
                    guess_ahead = pending is not None
            if logits_processor is not None:
                asked = time.perf_counter()
                scores = logits_processor(out, scores.clone())
                if guess is not None and time.perf_counter() - asked < OVERLAP_MIN_SECONDS:
                    guess_ahead = False  # processors this quick hide no step: the hand-over would cost
            if draft:
                token = sample_with_draft(scores.cpu(), draft[0], config.temperature, config.top_p, rng)
            else:
                token = sample(scores.cpu(), config.temperature, config.top_p, rng)
            if config.min_token_prob and float(torch.softmax(scores, dim=-1)[token]) < config.min_token_prob:
                here = _stops_between(text, self.tokenizer.decode(out + [token])[len(text):])
                cut = (len(out), text) if here else stop_point
                if cut is not None:
                    out, text = out[: cut[0]], cut[1]
                    finish = "unsure"
                    break
            logprobs.append(float(torch.log_softmax(logits.float(), dim=-1)[token]))
            if eos is not None and token == eos:
                finish = "stop"
                break
            out.append(token)
            before, text = text, self.tokenizer.decode(out)
            if config.min_token_prob and _stops_between(before, text[len(before):]):
                stop_point = (len(out) - 1, before)
            cut = min((i for i in (text.find(s) for s in config.stop if s) if i >= 0), default=-1)
            if cut >= 0:
                text = text[:cut]
                finish = "stop"
                break
            if on_text is not None:
                ready = len(text) - _held_back(text, config.stop)
                if config.min_token_prob:  # an unsure stop cuts back to the last stopping point
                    ready = min(ready, len(stop_point[1]) if stop_point is not None else 0)
                if text[:ready].endswith("\ufffd"):  # an unfinished UTF-8 sequence: wait for its rest
                    ready = text.rfind("\ufffd")
                if ready > streamed:
                    on_text(text[streamed:ready])
                    streamed = ready
            if draft and token == draft[0]:  # a proposed token kept: its logits are computed already
                draft.pop(0)
                logits = draft_logits.pop(0)
                here = draft_rows.pop(0) if draft_rows else here
                valid += 1
                accepted += 1
                kept_whole = not draft
                continue
            if draft:  # the first proposed token not kept: the cache loses the rest
                self.cache.truncate(valid)
                draft, draft_logits, draft_rows = [], [], []
                kept_whole = False
            if len(out) >= config.max_new_tokens:
                break  # no step needed for a token nobody will read
            step_ids = torch.tensor([[token]], dtype=torch.long, device=self.cache.device)
            running = None
            if guess is not None:  # the step run ahead: this token's, or one nobody reads
                if guess[0] == token:
                    running = guess[1]
                    guessed += 1
                else:
                    guess[1].drop()
                guess = None
            # The token's step on the C worker while the drafter works out its proposal (Python, beside
            # it); a proposal is then verified by a second call over its own tokens.
            # (Only while the drafter takes long enough to hide the hand-over's cost: an empty memory's
            # drafter answers at once.)
            if running is None and drafter is not None and overlap and not self.crowded and probe is None:
                running = self._start_in_c(step_ids)
            try:
                asked = time.perf_counter()
                proposal = list(drafter(out))[: config.max_new_tokens - len(out) - 1] if drafter is not None else []
                overlap = time.perf_counter() - asked >= OVERLAP_MIN_SECONDS
            except BaseException:
                if running is not None:
                    running.finish()  # the step stands (its token is the generation's); the error goes on
                raise
            calls += 1
            if running is not None:
                logits = running.finish()[0, -1]
                if proposal:
                    calls += 1
                    # Looking past the proposal pays where the drafts are being kept (repeated structure);
                    # where the last one was not, this one is likely cut short too, the look-ahead wasted.
                    ahead = kept_whole and not self.crowded and self._goes_on(out, proposal, text, config)
                    rows = self._verify(proposal, out, drafter if ahead else None, probe)
                    draft, draft_logits = proposal, list(rows[0])
                    drafted += len(proposal)
                valid = self.cache.length - len(draft)
                continue
            if proposal:
                ids = torch.tensor([[token, *proposal]], dtype=torch.long, device=self.cache.device)
                step_logits = self._forward(ids, probe)[0]
                logits = step_logits[0]
                draft, draft_logits = proposal, list(step_logits[1:])
                if probe is not None:
                    block = len(probe.blocks) - 1
                    here, draft_rows = (block, 0), [(block, j) for j in range(1, len(proposal) + 1)]
                valid = self.cache.length - len(proposal)
                drafted += len(proposal)
                continue
            logits = self._forward(step_ids, probe)[0, -1]
            if probe is not None:
                here = (len(probe.blocks) - 1, 0)
            valid = self.cache.length
        if guess is not None:  # the generation ended before the step run ahead was needed
            guess[1].drop()
        if draft:
            self.cache.truncate(valid)  # only what was kept (the rest stays right, but unasked)
        if on_text is not None and len(text) > streamed:
            on_text(text[streamed:])
        stats = probe.finish(used) if probe is not None else None
        return Generation(
            text=text,
            token_ids=out,
            logprob=sum(logprobs[: len(out)]),
            finish_reason=finish,
            prompt_tokens=len(prompt_ids),
            cached_tokens=reused,
            seconds=time.perf_counter() - t0,
            prefill_seconds=prefill_seconds,
            drafted_tokens=drafted,
            accepted_tokens=accepted,
            forward_calls=calls,
            guessed_steps=guessed,
            crowded=self.crowded,
            stats=stats,
        )
