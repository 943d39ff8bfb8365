"""Activation and attribution patching on every family's block shape, against references.

Activation patching of one head is checked against one hooked forward that makes the same
replacement by hand; attribution patching against the first-order formula computed with
autograd directly: `metric(corrupted) + sum (clean - corrupted) * d metric / d activation`.
"""

import pytest
import torch
from helpers.families import FAMILIES, TOKENS, family_model

from analysis import activation_patch, attribution_patch, available_kinds
from analysis.patching._components import component_grid
from analysis.patching._reference import reference_sweep
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import random_tiny_model

TOL = tolerance(torch.float64).as_kwargs()
CORRUPTED = torch.randint(0, 23, TOKENS.shape, generator=torch.Generator().manual_seed(7))
LAYER, HEAD = 1, 3


def _metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 3] - logits[:, -1, 5]


def _head_patched(model, kind: str, head: int) -> torch.Tensor:
    """The corrupted run's metric with one head's `kind` activation taken from the clean run."""
    name = f"blocks.{LAYER}.attn.hook_{kind}"
    with torch.no_grad():
        _, clean = model.run_with_cache(TOKENS, names_filter=name)

    def patch(x, hook):
        x = x.clone()
        x[:, :, head] = clean[name][:, :, head]
        return x

    with torch.no_grad(), model.hooks(fwd_hooks=[(name, patch)]):
        return _metric(model(CORRUPTED))


@pytest.mark.parametrize("name", FAMILIES)
def test_activation_patching_one_heads_output_is_one_hooked_forward(name):
    model = family_model(name)
    result = activation_patch(
        model, "z", clean_tokens=TOKENS, corrupted_tokens=CORRUPTED, metric=_metric
    )
    assert result.per_prompt.shape == (2, model.cfg.n_heads, 2)
    torch.testing.assert_close(result.per_prompt[LAYER, HEAD], _head_patched(model, "z", HEAD))


QK_NORM_KINDS = ("q_norm_normalized", "q_norm_out", "k_norm_normalized", "k_norm_out")


# Qwen 3 (a norm per head), OLMo 2 (one over all heads), and a q/k norm without rotation,
# where the KV cache holds the key norm's output itself.
@pytest.mark.parametrize(
    ("name", "overrides"),
    [("qwen3", {}), ("olmo2", {}), ("qwen3", dict(positional_embedding_type="standard"))],
)
def test_query_and_key_norms_are_patched_as_one_forward_per_patch(name, overrides):
    model = family_model(name, **overrides)
    assert set(QK_NORM_KINDS) <= set(available_kinds(model))
    with torch.no_grad():
        _, clean = model.run_with_cache(TOKENS)
    assert clean["k_norm_out", 1] is clean["blocks.1.attn.k_norm.hook_out"]  # the short names
    for kind, by_pos in zip(QK_NORM_KINDS, (True, False, False, True), strict=True):
        # One variant a pass (memory_budget=1): each from its own position, after the
        # unpatched keys and values before it, which the model's KV cache must hold.
        result = activation_patch(
            model, kind, clean_tokens=TOKENS, corrupted_tokens=CORRUPTED, metric=_metric,
            by_pos=by_pos, memory_budget=1,
        )  # fmt: skip
        components = component_grid(model, kind, TOKENS.shape[1], by_pos).components
        expected = reference_sweep(model, CORRUPTED, clean, components, _metric)
        actual = result.per_prompt.reshape(-1, TOKENS.shape[0])
        torch.testing.assert_close(actual, expected, **TOL, msg=f"{kind} by_pos={by_pos}")


def test_a_model_without_query_and_key_norms_says_so():
    with pytest.raises(ValueError, match=r"no 'k_norm_out' \(it has no query/key norms"):
        activation_patch(
            family_model("llama"), "k_norm_out", clean_tokens=TOKENS, corrupted_tokens=CORRUPTED,
            metric=_metric,
        )  # fmt: skip


@pytest.mark.parametrize("name", FAMILIES)
def test_attribution_patching_is_the_first_order_change(name):
    model = family_model(name)
    results = attribution_patch(
        model, "z", clean_tokens=TOKENS, corrupted_tokens=CORRUPTED, metric=_metric
    )
    hook = f"blocks.{LAYER}.attn.hook_z"
    with torch.no_grad():
        _, clean = model.run_with_cache(TOKENS, names_filter=hook)
    kept = {}

    def keep(z, hook):
        z.retain_grad()
        kept["z"] = z
        return z

    with model.hooks(fwd_hooks=[(hook, keep)]):
        corrupted_metric = _metric(model(CORRUPTED))
    corrupted_metric.sum().backward()
    z = kept["z"]
    change = ((clean[hook] - z.detach()) * z.grad).sum(dim=(1, 3))  # [batch head]
    expected = corrupted_metric.detach()[:, None] + change
    torch.testing.assert_close(results["z"].per_prompt[LAYER], expected.T, **TOL)


# DeepSeek V3's latent attention: values (8 wide) narrower than queries and keys (12).
LATENT = dict(n_heads=4, d_head=12, d_head_v=8, kv_lora_rank=16, q_lora_rank=20, rotary_dim=4,
              normalization_type="RMS", positional_embedding_type="rotary", gated_mlp=True,
              act_fn="silu", d_vocab=23)  # fmt: skip


# DeepSeek V3.2's lightning indexer: what it reads of earlier keys is not in a KV cache
# built from the cached activations, so every pass runs from the first position.
INDEXER = dict(index_topk=3, index_n_heads=4, index_head_dim=8)


@pytest.mark.parametrize("indexer", [{}, INDEXER], ids=["plain", "indexer"])
@pytest.mark.parametrize("kind", ["z", "v", "k"])
def test_latent_attention_with_narrower_values_is_patched_as_one_forward_per_patch(kind, indexer):
    # The sweep's cost model builds a KV cache of the model's own widths; one variant a pass
    # (memory_budget=1) runs each from its own position, after the unpatched keys and values.
    model = random_tiny_model(dtype=torch.float64, **LATENT, **indexer)
    with torch.no_grad():
        _, clean = model.run_with_cache(TOKENS)
    for budget in (None, 1):
        result = activation_patch(
            model, kind, clean_tokens=TOKENS, corrupted_tokens=CORRUPTED, metric=_metric,
            by_pos=True, memory_budget=budget,
        )  # fmt: skip
        components = component_grid(model, kind, TOKENS.shape[1], True).components
        expected = reference_sweep(model, CORRUPTED, clean, components, _metric)
        actual = result.per_prompt.reshape(-1, TOKENS.shape[0])
        torch.testing.assert_close(actual, expected, **TOL, msg=f"{kind} budget={budget}")
