"""Query temperature tuning (`query_temperature_floor`, Llama 4's `attn_temperature_tuning`):
in the blocks that do not rotate, each query is multiplied by `1 + scale * log(1 + floor((p +
1) / floor_))`. Checked against the formula in plain Python per position, at the hook point
that holds the tuned queries, in the scores they make, and through a KV cache."""

import math

import pytest
import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.components.query_temperature import QueryTemperature
from hookedattn.core.kv_cache import KeyValueCache
from hookedattn.testing.models import randomize_parameters

FLOOR, SCALE = 3, 0.4


def _tau(p: int) -> float:
    return 1 + SCALE * math.log(1 + math.floor((p + 1) / FLOOR))


def _model(**overrides) -> HookedTransformer:
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=16, n_heads=4, d_head=4, n_ctx=32, d_vocab=19, d_mlp=8,
        act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
        rotary_layers=(True, False), query_temperature_floor=FLOOR,
        query_temperature_scale=SCALE, dtype="float64", seed=0, **overrides,
    )  # fmt: skip
    return randomize_parameters(HookedTransformer(cfg), scale=0.5, seed=1)


TOKENS = torch.randint(0, 19, (2, 9), generator=torch.Generator().manual_seed(2))


def test_factor_is_the_formula_at_every_position() -> None:
    tuning = QueryTemperature(_model().cfg)
    got = tuning.factor(torch.arange(40)[None])[0]
    want = torch.tensor([_tau(p) for p in range(40)], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-15)
    assert got[1] == 1 and got[2] > 1  # the first step up at position floor_ - 1


def test_only_the_block_without_rotation_tunes_its_queries() -> None:
    model = _model()
    assert not hasattr(model.blocks[0].attn, "hook_q_tuned")
    assert hasattr(model.blocks[1].attn, "hook_q_tuned")


def test_tuned_queries_are_each_query_times_its_factor() -> None:
    _, cache = _model().run_with_cache(TOKENS)
    q, tuned = cache["blocks.1.attn.hook_q"], cache["blocks.1.attn.hook_q_tuned"]
    for p in range(TOKENS.shape[1]):
        torch.testing.assert_close(tuned[:, p], _tau(p) * q[:, p], rtol=0, atol=1e-14)


def test_scores_read_the_tuned_queries() -> None:
    model = _model()
    _, cache = model.run_with_cache(TOKENS)
    q, k = cache["blocks.1.attn.hook_q_tuned"], cache["blocks.1.attn.hook_k"]
    k = k.repeat_interleave(model.cfg.n_heads // model.cfg.n_kv_heads, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / model.cfg.attn_scale
    later = torch.arange(9)[None, :] > torch.arange(9)[:, None]
    got = cache["blocks.1.attn.hook_attn_scores"]
    torch.testing.assert_close(got[..., ~later], scores[..., ~later], rtol=0, atol=1e-12)


def test_a_hook_on_the_tuned_queries_changes_the_output() -> None:
    model = _model()
    hooks = [("blocks.1.attn.hook_q_tuned", lambda q, hook: q * 3)]
    with model.hooks(fwd_hooks=hooks):
        edited = model(TOKENS)
    assert not torch.allclose(edited, model(TOKENS))


def test_cached_steps_use_their_own_positions() -> None:
    model = _model()
    full = model(TOKENS)
    cache = KeyValueCache.empty(model.cfg, batch=TOKENS.shape[0])
    logits = [model(TOKENS[:, :4], past_kv_cache=cache)]
    for p in range(4, 9):
        logits.append(model(TOKENS[:, p : p + 1], past_kv_cache=cache))
    torch.testing.assert_close(torch.cat(logits, dim=1), full, rtol=0, atol=1e-12)


def test_every_residual_identity_holds() -> None:
    from hookedattn.testing import assert_residual_identities

    model = _model()
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    assert_residual_identities(model, cache)


def test_temperature_needs_positions_that_are_not_learned() -> None:
    with pytest.raises(ValueError, match="query_temperature_floor=4 scales the queries"):
        HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=4, d_head=4, d_vocab=5,
                                attn_only=True, query_temperature_floor=4)  # fmt: skip
