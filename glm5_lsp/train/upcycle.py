"""Sparse upcycling: more routed experts for the same work a token.

The embedded model is small (4.2M parameters, 1.8M of them in routed experts) and has seen its
corpus seven times over: held-out perplexity stopped falling (12.597 shipped at 299.7M tokens, the
run's moving average 12.607 at 325M). A mixture of experts can hold more without costing a token
more: each token still runs ``num_experts_per_tok`` experts, whatever their number. Upcycling
(Komatsuzaki et al., 2022, "Sparse Upcycling") starts the larger mixture from the trained one: each
expert is copied ``factor`` times, the copies' weights with a little multiplicative noise so they can
part ways, their router rows the same as the original's.

Each set of copies is a routing group of its own (``n_group`` = ``factor``, ``topk_group`` 1: the
grouped routing GLM-5 and DeepSeek-V3 define): a token takes its experts from one group, the
originals or one set of copies, never an expert and its own copy. A model that already routes in
``G`` groups keeps its ``topk_group``, and copy ``k`` of its group ``g`` is group ``k * G + g`` (the
copies are laid after the originals, in their order). The upcycled model computes
exactly what the original did: a copy scores as its original does, and its selection bias
(``e_score_correction_bias``, which steers the choice only) starts below every original's choice value
(a sigmoid score is under 1: the copies' bias is the original's less the biases' spread, less 1,
less a margin), so the router still picks the originals' group. Training's load balancer
(aux-loss-free: it raises the bias of experts that get too few tokens, ``balance_rate`` a step) then
hands tokens to the copies' groups, whose experts compute what the originals do (up to their noise),
and the gradients make the groups differ. (Without the groups, a first run lost 12% of held-out
perplexity once the copies came in: a token took an expert and its copy instead of two experts.)

    python -m glm5_lsp.train.upcycle glm5_lsp/weights/glm5-code-tiny runs/upcycled-init --factor 2
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

from glm5_lsp.model.config import GlmMoeDsaConfig
from glm5_lsp.model.glm5 import GlmMoeDsaForCausalLM
from glm5_lsp.model.loading import load_model, save_model

MARGIN = 1e-3  # below the lowest choice value any original can have
NOISE = 0.01  # the copies' multiplicative noise (a standard deviation)
_EXPERT_WEIGHTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
_ROUTER_WEIGHT = "mlp.gate.weight"
_ROUTER_BIAS = "mlp.gate.e_score_correction_bias"


def upcycle(model: GlmMoeDsaForCausalLM, factor: int, *, noise: float = NOISE, margin: float = MARGIN,
            seed: int = 0) -> GlmMoeDsaForCausalLM:
    """A copy of ``model`` with ``factor`` times its routed experts, computing what it computes."""
    if factor < 1:
        raise ValueError(f"factor must be at least 1, got {factor}")
    if margin <= 0 and factor > 1:
        raise ValueError("margin must be positive: the originals must win the router's ties")
    groups = model.config.n_group
    config = GlmMoeDsaConfig.from_dict({**model.config.to_dict(),
                                        "n_routed_experts": model.config.n_routed_experts * factor,
                                        "n_group": groups * factor,
                                        "topk_group": model.config.topk_group if groups > 1 else 1})
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().float()
        if name.endswith(_EXPERT_WEIGHTS):
            copies = [tensor] + [tensor * (1 + noise * torch.randn(tensor.shape, generator=generator))
                                 for _ in range(factor - 1)]
            tensor = torch.cat(copies, dim=0)
        elif name.endswith(_ROUTER_WEIGHT):
            tensor = tensor.repeat(factor, 1)
        elif name.endswith(_ROUTER_BIAS):
            below = float(tensor.max() - tensor.min()) + 1.0 + margin  # under any original's score + bias
            tensor = torch.cat([tensor] + [tensor - below - margin * k for k in range(1, factor)])
        state[name] = tensor
    upcycled = GlmMoeDsaForCausalLM(config)
    missing, unexpected = upcycled.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"upcycling left tensors unmatched: missing {missing}, unexpected {unexpected}")
    return upcycled.to(next(model.parameters()).dtype)


def upcycle_folder(source: Path, target: Path, factor: int, *, noise: float = NOISE, seed: int = 0) -> Path:
    """The model folder ``source`` (weights, tokenizer, metrics: where training left the corpus)
    upcycled into ``target``, a folder ``glm5-lsp train --continue-from`` reads. Its gate, trained for
    the source's weights, is not copied."""
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} is not empty")
    model = load_model(source)
    upcycled = upcycle(model, factor, noise=noise, seed=seed)
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and not item.name.startswith("model") and item.name != "config.json":
            shutil.copy2(item, target / item.name)
    save_model(upcycled, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m glm5_lsp.train.upcycle", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a model folder (glm5_lsp/weights/glm5-code-tiny)")
    parser.add_argument("target", type=Path, help="an empty or new folder for the upcycled model")
    parser.add_argument("--factor", type=int, default=2, help="routed experts become this many times as many")
    parser.add_argument("--noise", type=float, default=NOISE)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        out = upcycle_folder(args.source, args.target, args.factor, noise=args.noise, seed=args.seed)
    except (OSError, ValueError) as error:
        print(f"upcycle: {error}", file=sys.stderr)
        return 1
    config = GlmMoeDsaConfig.from_pretrained(out)
    print(f"upcycle: {out} holds {config.n_routed_experts} routed experts a layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
