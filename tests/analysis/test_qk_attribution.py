"""QK attribution: one attention score as query-writer × key-writer terms, exact in float64.

Shapes: a GPT-2-like model (LayerNorm, learned positions) and the family shapes of
tests/helpers/families.py (llama: RMSNorm, rotary, grouped queries; neox: parallel blocks,
partial rotary; gemma2: a window and a soft cap; olmo2: q/k norm over all heads, no ln1;
qwen3: per-head q/k norm). References: a brute-force loop over every pair of writers, and
a forward with one writer removed from the stream and every norm's divisor frozen.
"""

import math

import pytest
import torch
from helpers.families import FAMILIES, TOKENS, family_run

from analysis import DecompositionError, QKAttribution, decompose_resid, qk_attribution
from analysis.tables import Table
from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.components.norm import LayerNormPre, NoNorm
from hookedattn.testing import random_tiny_model, randomize_parameters

EXACT = 1e-10
SHAPES = ("gpt2", *FAMILIES)


def _gpt2_run():
    model = random_tiny_model(n_ctx=16, d_vocab=23, d_mlp=24, normalization_type="LN")
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    return model, cache


_GPT2 = _gpt2_run()


def _run(shape):
    if shape == "gpt2":
        return _GPT2
    model, _, cache = family_run(shape)
    return model, cache


def _readable(cache, layer, head, batch):
    """Every (query, key) pair the head reads (not masked)."""
    scores = cache["attn_scores", layer][batch, head]
    return [tuple(pair) for pair in torch.isfinite(scores).nonzero().tolist()]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_terms_sum_to_every_score_of_the_last_layer(shape):
    model, cache = _run(shape)
    layer = model.cfg.n_layers - 1
    worst = 0.0
    for head in range(model.cfg.n_heads):
        for query, key in _readable(cache, layer, head, batch=1):
            attribution = qk_attribution(model, cache, layer, head, query, key, batch=1)
            worst = max(worst, abs(attribution.sum() - attribution.score))
    assert worst < EXACT


@pytest.mark.parametrize("shape", SHAPES)
def test_the_score_is_the_cached_one_before_any_cap(shape):
    model, cache = _run(shape)
    attribution = qk_attribution(model, cache, 1, 1, 7, 5)
    cached = float(cache["attn_scores", 1][0, 1, 7, 5])
    cap = model.cfg.attn_scores_soft_cap
    if cap is None:
        assert attribution.score == cached
        assert attribution.capped_score is None
    else:
        assert attribution.capped_score == cached
        assert math.tanh(attribution.score / cap) * cap == pytest.approx(cached, abs=EXACT)


def test_a_float32_model_sums_to_its_rounding():
    model = random_tiny_model(n_ctx=16, d_vocab=23, d_mlp=24, dtype=torch.float32)
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    attribution = qk_attribution(model, cache, 1, 2, 8, 3, check=True)
    assert attribution.terms.dtype == torch.float32
    assert abs(attribution.sum() - attribution.score) < 1e-5


@pytest.mark.parametrize("shape", SHAPES)
def test_check_finds_both_sides_equal_to_the_cached_queries_and_keys(shape):
    model, cache = _run(shape)
    for layer in range(model.cfg.n_layers):
        qk_attribution(model, cache, layer, -1, 6, 5, batch=1, check=True)


OTHER_SHAPES = {
    "window": dict(window_size=3),
    "per-head inputs": dict(use_attn_in=True),
    "split q/k/v inputs, grouped, rotary": dict(
        use_split_qkv_input=True, n_key_value_heads=2, positional_embedding_type="rotary"
    ),
    "attention only": dict(attn_only=True),
    "no norms": dict(normalization_type=None),
    "cached head results": dict(use_attn_result=True),
}


@pytest.mark.parametrize("extra", OTHER_SHAPES.values(), ids=OTHER_SHAPES)
def test_other_block_shapes_sum_exactly(extra):
    model = random_tiny_model(n_ctx=16, d_vocab=23, d_mlp=24, **extra)
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    for head, query, key in ((3, 8, 6), (0, 5, 5), (1, 2, 0)):
        attribution = qk_attribution(model, cache, 1, head, query, key, batch=1, check=True)
        assert abs(attribution.sum() - attribution.score) < EXACT


# ------------------------------------------------------------------ brute-force reference
def _project_by_hand(W, vector):
    """`vector @ W`, one sum per output dimension."""
    d_model, d_head = W.shape
    return [sum(float(vector[d]) * float(W[d, e]) for d in range(d_model)) for e in range(d_head)]


def _norm_by_hand(model, cache, layer, pos, batch, vector):
    ln1 = model.blocks[layer].ln1
    if isinstance(ln1, NoNorm):
        return [float(x) for x in vector]
    values = [float(x) for x in vector]
    if isinstance(ln1, LayerNormPre):
        mean = sum(values) / len(values)
        values = [x - mean for x in values]
    scale = float(cache[f"blocks.{layer}.ln1.hook_scale"][batch, pos, 0])
    return [x / scale * float(ln1.w[d]) for d, x in enumerate(values)]


def _finish_by_hand(model, cache, layer, head, side, pos, batch, vector):
    """The q/k norm at its cached divisor, then the rotation by `pos`, pair by pair."""
    attn = model.blocks[layer].attn
    kv = head // (model.cfg.n_heads // model.cfg.n_kv_heads)
    norm = attn.q_norm if side == "q" else attn.k_norm
    vector = list(vector)
    if not isinstance(norm, NoNorm):
        index = head if side == "q" else kv
        scale = cache[f"blocks.{layer}.attn.{side}_norm.hook_scale"][batch, pos]
        scale = float(scale[index if scale.shape[0] > 1 else 0, 0])
        gain = norm.w if norm.w.ndim == 1 else norm.w[index]
        vector = [x / scale * float(gain[e]) for e, x in enumerate(vector)]
    if model.cfg.layer_rotates(layer):
        rot = model.cfg.rotary_dim
        half = rot // 2
        frequencies = attn.rotary.inv_freq.float()  # the trained float32 constants
        rotated = list(vector)
        for i in range(half):
            # angles in float64, as a float64 model computes them from those constants
            angle = pos * frequencies[i].double()
            cos, sin = float(angle.cos()), float(angle.sin())
            rotated[i] = vector[i] * cos - vector[i + half] * sin
            rotated[i + half] = vector[i + half] * cos + vector[i] * sin
        vector = rotated
    return vector


@torch.no_grad()
def _reference(model, cache, layer, head, query, key, batch):
    """`terms[i, j]` one pair at a time, every step a Python loop over numbers."""
    stream = decompose_resid(model, cache, layer, "resid_pre", "head")
    attn = model.blocks[layer].attn
    ln1 = model.blocks[layer].ln1
    sides = {}
    for side, pos in (("q", query), ("k", key)):
        W = attn.W_Q[head] if side == "q" else attn.W_K[head]  # W_K: the group's key head
        vectors = []
        for component in stream.components:
            normed = _norm_by_hand(model, cache, layer, pos, batch, component[batch, pos])
            vectors.append(_project_by_hand(W, normed))
        if hasattr(ln1, "b"):
            vectors.append(_project_by_hand(W, ln1.b))
        bias = attn.b_Q[head] if side == "q" else attn.b_K[head]
        vectors.append([float(x) for x in bias])
        sides[side] = [
            _finish_by_hand(model, cache, layer, head, side, pos, batch, v) for v in vectors
        ]
    scale = float(attn.attn_scale)
    return torch.tensor(
        [
            [sum(a * b for a, b in zip(q, k, strict=True)) / scale for k in sides["k"]]
            for q in sides["q"]
        ],
        dtype=torch.float64,
    )


@pytest.mark.parametrize("shape", SHAPES)
def test_every_term_matches_a_brute_force_reference(shape):
    model, cache = _run(shape)
    for layer, head, query, key in ((1, 3, 8, 6), (1, 0, 4, 4), (0, 2, 5, 4)):
        got = qk_attribution(model, cache, layer, head, query, key, batch=1)
        want = _reference(model, cache, layer, head, query, key, batch=1)
        torch.testing.assert_close(got.terms, want, atol=EXACT, rtol=0)


# ------------------------------------------------------------------ ablation through frozen norms
def _frozen_scales(model, cache, layer):
    """Hooks that put back every divisor the score depends on, as cached."""
    names = [f"blocks.{layer}.ln1.hook_scale"]
    attn = model.blocks[layer].attn
    if not isinstance(attn.q_norm, NoNorm):
        names += [
            f"blocks.{layer}.attn.q_norm.hook_scale",
            f"blocks.{layer}.attn.k_norm.hook_scale",
        ]
    if isinstance(model.blocks[layer].ln1, NoNorm):
        names = names[1:]
    return [(name, lambda t, hook, value=cache[name]: value.clone()) for name in names]


def _uncapped_score(model, cache, layer, head, query, key):
    """The score before any cap, from the queries and keys the scores read."""
    attn = model.blocks[layer].attn
    kv = head // attn.group
    if model.cfg.layer_rotates(layer):
        q, k = cache["rot_q", layer], cache["rot_k", layer]
    elif not isinstance(attn.q_norm, NoNorm):
        q, k = cache["q_norm_out", layer], cache["k_norm_out", layer]
    else:
        q, k = cache["q", layer], cache["k", layer]
    return float(q[0, query, head] @ k[0, key, kv]) / attn.attn_scale


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("writer", ["embed", "L0H1", "L0_mlp"])
def test_removing_a_writer_moves_the_score_by_its_row_and_column(shape, writer):
    model, cache = _run(shape)
    layer, head, query, key = 1, 2, 7, 4
    attribution = qk_attribution(model, cache, layer, head, query, key)
    i = attribution.query_labels.index(writer)
    assert attribution.key_labels[i] == writer
    moved = attribution.query_totals()[i] + attribution.key_totals()[i] - attribution.terms[i, i]
    stream = decompose_resid(model, cache, layer, "resid_pre", "head")[writer]

    def without_writer(resid, hook):
        return resid - stream

    hooks = [(f"blocks.{layer}.hook_resid_pre", without_writer)]
    with model.hooks(fwd_hooks=hooks + _frozen_scales(model, cache, layer)):
        _, ablated = model.run_with_cache(TOKENS)
    before = _uncapped_score(model, cache, layer, head, query, key)
    after = _uncapped_score(model, ablated, layer, head, query, key)
    assert before - after == pytest.approx(float(moved), abs=EXACT)


# ------------------------------------------------------------------ labels, tables, refusals
def test_labels_are_the_stream_writers_then_the_biases():
    model, cache = _GPT2
    attribution = qk_attribution(model, cache, 1, 0, 5, 2)
    writers = ("embed", "pos_embed", "L0H0", "L0H1", "L0H2", "L0H3", "L0_attn_bias", "L0_mlp")
    assert attribution.query_labels == (*writers, "L1_ln1_bias", "b_Q")
    assert attribution.key_labels == (*writers, "L1_ln1_bias", "b_K")
    assert attribution.terms.shape == (10, 10)


def test_top_lists_the_largest_terms_by_magnitude_with_their_writers():
    model, cache = _GPT2
    attribution = qk_attribution(model, cache, 1, 3, 8, 1)
    top = attribution.top(4)
    assert isinstance(top, Table) and len(top) == 4
    magnitudes = [abs(v) for v in top.column("term")]
    assert magnitudes == sorted(magnitudes, reverse=True)
    assert magnitudes[0] == float(attribution.terms.abs().max())
    query_writer, key_writer, value = top.rows[0]
    assert attribution.term(query_writer, key_writer) == value


def test_totals_are_the_row_and_column_sums():
    model, cache = _GPT2
    attribution = qk_attribution(model, cache, 1, 3, 8, 1)
    keys = dict(attribution.totals("key").rows)
    assert keys["L0_mlp"] == float(attribution.terms[:, 7].sum())
    assert set(keys) == set(attribution.key_labels)
    assert len(attribution.totals("query", n=3)) == 3
    with pytest.raises(ValueError, match="side must be 'query' or 'key', got 'value'"):
        attribution.totals("value")


def test_check_refuses_weights_changed_after_the_forward():
    model = random_tiny_model(n_ctx=16, d_vocab=23, d_mlp=24, normalization_type="LN")
    _, cache = model.run_with_cache(TOKENS)
    with torch.no_grad():
        model.blocks[1].attn.W_Q.mul_(1.01)
    qk_attribution(model, cache, 1, 0, 6, 2)  # unchecked: no comparison with the cache
    with pytest.raises(DecompositionError, match="the query of L1H0 at position 6"):
        qk_attribution(model, cache, 1, 0, 6, 2, check=True)


def test_an_unknown_label_names_the_closest():
    model, cache = _GPT2
    attribution = qk_attribution(model, cache, 1, 3, 8, 1)
    with pytest.raises(KeyError, match="did you mean 'L0H1'"):
        attribution.term("L0H1", "L0H11")


def test_a_masked_key_is_refused_with_the_keys_the_query_reads():
    model, cache = _GPT2
    with pytest.raises(ValueError, match=r"does not read key 5 .*the keys it reads: \[0, 1, 2\]"):
        qk_attribution(model, cache, 1, 0, 2, 5)


def test_a_key_outside_the_window_is_refused():
    model, cache = _run("gemma2")
    assert model.cfg.layer_attn_type(0) == "local"
    with pytest.raises(ValueError, match=r"query 8 of L0H0 does not read key 5 .*\[6, 7, 8\]"):
        qk_attribution(model, cache, 0, 0, 8, 5)


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        ("layer", 2, "layer must be an int in 0..1"),
        ("head", 4, "head must be an int in 0..3"),
        ("query_pos", 9, "query_pos must be an int in 0..8"),
        ("batch", 2, "batch must be an int in 0..1"),
    ],
)
def test_an_index_out_of_range_is_named(argument, value, message):
    model, cache = _GPT2
    where = dict(layer=1, head=0, query_pos=3, key_pos=1, batch=0)
    with pytest.raises(ValueError, match=message):
        qk_attribution(model, cache, **{**where, argument: value})


def test_negative_indices_count_from_the_end():
    model, cache = _GPT2
    a = qk_attribution(model, cache, -1, -1, -1, -2, batch=-1)
    b = qk_attribution(model, cache, 1, 3, 8, 7, batch=1)
    assert (a.layer, a.head, a.query_pos, a.key_pos, a.batch) == (1, 3, 8, 7, 1)
    torch.testing.assert_close(a.terms, b.terms, atol=0, rtol=0)


def test_the_inputs_are_left_unchanged():
    model, cache = _GPT2
    before = {name: t.clone() for name, t in cache.items()}
    weights = {name: p.clone() for name, p in model.named_parameters()}
    qk_attribution(model, cache, 1, 2, 6, 3, check=True)
    assert all(torch.equal(cache[name], t) for name, t in before.items())
    assert all(torch.equal(p, weights[name]) for name, p in model.named_parameters())


def test_latent_attention_is_refused():
    cfg = HookedTransformerConfig(
        n_layers=1, d_model=16, n_ctx=8, d_vocab=11, n_heads=2, d_head=8, kv_lora_rank=8,
        rotary_dim=4, positional_embedding_type="rotary", normalization_type="RMS",
        attn_only=True, dtype="float64", seed=0,
    )  # fmt: skip
    model = randomize_parameters(HookedTransformer(cfg))
    _, cache = model.run_with_cache(TOKENS[:, :5] % 11)
    with pytest.raises(ValueError, match=r"latent attention \(kv_lora_rank=8\)"):
        qk_attribution(model, cache, 0, 0, 3, 1)


def test_a_shortformers_positions_are_a_writer_after_the_norm():
    model = random_tiny_model(positional_embedding_type="shortformer", d_vocab=23, d_mlp=24)
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    attribution = qk_attribution(model, cache, 1, 2, 8, 3, batch=1, check=True)
    assert attribution.query_labels[-3:] == ("L1_ln1_bias", "pos_embed", "b_Q")
    assert "pos_embed" not in decompose_resid(model, cache, 1).labels  # not in the stream
    assert abs(attribution.sum() - attribution.score) < EXACT


def test_repr_names_the_head_the_positions_and_the_cap():
    model, cache = _run("gemma2")
    attribution = qk_attribution(model, cache, 1, 1, 7, 5)
    assert isinstance(attribution, QKAttribution)
    assert repr(attribution).startswith("QKAttribution of L1H1, query 7 -> key 5 (batch 0)")
    assert "before the cap" in repr(attribution)
