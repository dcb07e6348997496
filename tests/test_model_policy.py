"""Each attention-policy knob changes the selected key sets in the documented direction."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny import tiny_model

from glm5_lsp.model import AttentionConfig, AttentionPolicy, Role
from glm5_lsp.model.glm5 import selection_mask

T = 96
TOPK = 24


@pytest.fixture(scope="module")
def model():
    return tiny_model(index_topk=TOPK)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 512, (1, T), generator=torch.Generator().manual_seed(7))


def roles_with(**spans: tuple[int, int]) -> torch.Tensor:
    roles = torch.full((1, T), int(Role.CODE))
    for name, (a, b) in spans.items():
        roles[0, a:b] = int(Role[name.upper()])
    return roles


def selected(model, ids, roles=None, **knobs) -> torch.Tensor:
    """The first layer's selected-key mask ``[T, T]`` under the given knobs (defaults otherwise)."""
    policy = AttentionPolicy.from_config(AttentionConfig(**knobs))
    with torch.no_grad():
        _, per_layer = model(ids, roles=roles, policy=policy, return_selections=True)
    return selection_mask(per_layer[0], 1, T, T, 0, ids.device)[0]


def role_hits(mask: torch.Tensor, roles: torch.Tensor, role: Role) -> int:
    return int(mask[:, roles[0] == role].sum())


def test_global_sparsity_shrinks_the_budget(model, ids) -> None:
    dense_ish = selected(model, ids, global_sparsity=0.1)
    neutral = selected(model, ids, global_sparsity=0.4)
    sparse = selected(model, ids, global_sparsity=0.7)
    assert int(neutral[-1].sum()) == TOPK  # 0.4 keeps the checkpoint's own top-k
    assert dense_ish.sum() > neutral.sum() > sparse.sum()
    assert bool((sparse <= neutral).all()) and bool((neutral <= dense_ish).all())  # nested sets


@pytest.mark.parametrize(
    ("knob", "role", "span"),
    [("api_focus", Role.API_DOC, (0, 30)), ("api_focus", Role.SNIPPET, (0, 30)), ("indent_flow", Role.INDENT, (20, 50))],
)
def test_role_knobs_pull_their_tokens_in(model, ids, knob, role, span) -> None:
    roles = roles_with(**{role.name.lower(): span})
    hits = [role_hits(selected(model, ids, roles, **{knob: v}), roles, role) for v in (0.0, 0.5, 1.0)]
    assert hits[0] < hits[1] <= hits[2], hits
    # Switching syntax awareness off removes the pull entirely.
    off = selected(model, ids, roles, syntax_aware=False, **{knob: 1.0})
    assert torch.equal(off, selected(model, ids, None, syntax_aware=False))


def test_error_context_is_forced_both_ways(model, ids) -> None:
    roles = roles_with(error_context=(10, 14))
    mask = selected(model, ids, roles, error_context=0.9)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    # As keys: in every later query's selected set.
    assert bool(mask[14:, 10:14].all())
    # As queries: they attend to every earlier key.
    assert torch.equal(mask[10:14], causal[10:14])
    # Turned off: the same tokens are dropped by sparsity for some queries.
    off = selected(model, ids, roles, error_context=0.0)
    assert not bool(off[14:, 10:14].all())


def test_error_context_window_grows_with_the_knob(model, ids) -> None:
    roles = roles_with(error_context=(40, 42))
    near = slice(30, 40)
    low = selected(model, ids, roles, error_context=0.2)[60:, near].sum()
    high = selected(model, ids, roles, error_context=1.0)[60:, near].sum()
    assert high > low


def test_forced_error_context_fast_path_matches_reference(model, ids) -> None:
    roles = roles_with(error_context=(10, 14), api_doc=(50, 60), indent=(70, 80))
    policy = AttentionPolicy.from_config()
    with torch.no_grad():
        fast = model(ids, roles=roles, policy=policy)
        ref = model(ids, roles=roles, policy=policy, reference=True)
    assert (fast - ref).abs().max().item() < 1e-4


def test_invalid_knobs_are_rejected() -> None:
    with pytest.raises(ValueError, match="global_sparsity"):
        AttentionConfig(global_sparsity=1.0)
    with pytest.raises(ValueError, match="api_focus"):
        dataclasses.replace(AttentionConfig(), api_focus=1.5)
