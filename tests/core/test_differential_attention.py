"""Differential attention (`components.differential_attention`, DiffLlama): the sublayer
against a brute-force loop over pairs, positions and keys in float64, written from the
paper's equations; its hook points; the KV cache; the processing it allows and refuses.
Its import from `transformers` is `tests/hf/test_hf_diffllama.py`."""

import math

import pytest
import torch
from helpers.generation import greedy_with_and_without_cache

from analysis import decompose_resid
from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.processing import fold_value_biases, process_weights
from hookedattn.testing import assert_residual_identities, randomize_parameters

DIFFERENTIAL = dict(
    n_layers=3, d_model=24, n_ctx=32, d_vocab=40, n_heads=4, d_head=6, d_mlp=32,
    act_fn="silu", gated_mlp=True, normalization_type="RMS",
    positional_embedding_type="standard", differential_attention=True, seed=0,
    dtype="float64",
)  # fmt: skip
# Keys and values per query head, and two key/value heads each read by two query heads.
GROUPINGS = {"per_head": {}, "grouped": {"n_key_value_heads": 2}}
TOKENS = torch.tensor([[3, 17, 22, 8, 8, 29, 11], [9, 1, 12, 12, 33, 7, 2]])


@pytest.fixture(scope="module", params=list(GROUPINGS))
def model(request) -> HookedTransformer:
    cfg = HookedTransformerConfig(**DIFFERENTIAL, **GROUPINGS[request.param])
    return randomize_parameters(HookedTransformer(cfg), seed=5)


def brute_force_write(model: HookedTransformer, layer: int, x: torch.Tensor) -> torch.Tensor:
    """What attention `layer` writes at each position, by loops: `x` is its normed input.
    Query heads `i` and `i + H/2` both read the values of key/value heads `j` and `j +
    n_kv/2` side by side, `j` query head `i`'s key/value head."""
    attn, cfg = model.blocks[layer].attn, model.cfg
    H, n_kv, d = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    W_K, b_K, W_V, b_V = attn.key_value_weights()  # one per key/value head
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * layer)
    lam = (torch.exp((attn.lambda_q1 * attn.lambda_k1).sum())
           - torch.exp((attn.lambda_q2 * attn.lambda_k2).sum()) + lam_init)  # fmt: skip
    out = torch.zeros(x.shape[0], x.shape[1], cfg.d_model, dtype=x.dtype)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            for i in range(H // 2):
                sides = []
                for h in (i, i + H // 2):
                    kv = h // (H // n_kv)
                    q = x[b, t] @ attn.W_Q[h] + attn.b_Q[h]
                    keys = [x[b, s] @ W_K[kv] + b_K[kv] for s in range(t + 1)]
                    weights = torch.softmax(torch.stack([q @ k / math.sqrt(d) for k in keys]), 0)
                    j = kv % (n_kv // 2)
                    values = [torch.cat([x[b, s] @ W_V[j] + b_V[j],
                                         x[b, s] @ W_V[j + n_kv // 2] + b_V[j + n_kv // 2]])
                              for s in range(t + 1)]  # fmt: skip
                    sides.append(sum(w * v for w, v in zip(weights, values, strict=True)))
                diff = sides[0] - lam * sides[1]
                normed = diff / torch.sqrt((diff**2).mean() + cfg.eps)
                out[b, t] += (1 - lam_init) * normed @ attn.W_O[i]
            out[b, t] += attn.b_O
    return out


@pytest.mark.parametrize("layer", [0, 2])
def test_differential_attention_is_the_brute_force_loop(model, layer):
    _, cache = model.run_with_cache(TOKENS)
    with torch.no_grad():
        want = brute_force_write(model, layer, cache[f"blocks.{layer}.ln1.hook_out"])
    got = cache[f"blocks.{layer}.hook_attn_out"]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_the_differential_pattern_weighs_the_paired_values_into_z_diff(model):
    _, cache = model.run_with_cache(TOKENS)
    attn, cfg = model.blocks[1].attn, model.cfg
    diff = attn.differential_pattern(cache["blocks.1.attn.hook_pattern"])
    v = cache["blocks.1.attn.hook_v"]
    half = cfg.n_kv_heads // 2
    for i in range(cfg.n_heads // 2):
        j = (i // (cfg.n_heads // cfg.n_kv_heads)) % half
        paired = torch.cat([v[:, :, j], v[:, :, j + half]], dim=-1)
        want = torch.einsum("bqk,bkd->bqd", diff[:, i], paired)
        got = cache["blocks.1.attn.hook_z_diff"][:, :, i]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_residual_identities_hold(model):
    assert_residual_identities(model, model.run_with_cache(TOKENS)[1])


def test_the_residual_decomposition_by_pairs_sums_to_the_stream(model):
    _, cache = model.run_with_cache(TOKENS)
    decomposition = decompose_resid(model, cache, granularity="head", check=True)
    assert torch.allclose(decomposition.sum(), cache[decomposition.hook_name], atol=1e-12)
    assert "L0H1" in decomposition.labels and "L0H2" not in decomposition.labels  # 2 pairs


def test_generation_with_the_kv_cache_equals_recomputing(model):
    assert torch.equal(*greedy_with_and_without_cache(model, TOKENS[:1, :4]))


def test_processing_folds_the_input_norm_and_keeps_the_logits(model):
    processed = process_weights(model)
    assert processed.cfg.normalization_type == "RMSPre"
    with torch.no_grad():
        before, after = model(TOKENS).log_softmax(-1), processed(TOKENS).log_softmax(-1)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-10)


def test_value_biases_are_not_folded_through_the_pair_norm(model):
    with pytest.raises(ValueError, match="differential_attention"):
        fold_value_biases(model)


def test_tensor_parallelism_is_refused_by_name(model):
    from hookedattn.core import parallel

    with pytest.raises(ValueError, match=r"tp_size=2: this model's attention is differential"):
        parallel.check_tp_size(model.cfg, 2)


def test_ov_is_refused(model):
    with pytest.raises(ValueError, match="differential"):
        model.OV


@pytest.mark.parametrize(
    "fields", [{"n_heads": 3, "d_head": 8}, {"n_key_value_heads": 1}, {"use_attn_sinks": True}]
)
def test_config_refuses_what_differential_attention_cannot_pair_or_hold(fields):
    with pytest.raises(ValueError, match="differential_attention"):
        HookedTransformerConfig(**DIFFERENTIAL | fields)
