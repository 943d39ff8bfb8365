"""The lightning indexer (`components.indexer`, `index_topk`): on tiny random float64 latent
attention models, its scores against a brute-force loop of the paper's formula, the keys each
query reads against the brute-force top-k, the attention over them against a loop, its hook
points, blocks without an indexer, the KV cache (the indexer's keys cached too), the residual
identities, weight processing, and the refusals.

`index_topk=3` over 9 positions: from the fourth query on, every query drops keys. With 4
index heads no query of these models has two keys tied at its third place (`_no_tie`), so
the choice is one set whatever breaks ties; ties (a ReLU zeroing every head's score of two
keys) are chosen as `torch.topk` chooses (`test_tied_keys_...`).
"""

import math

import pytest
import torch

from hookedattn import HookedTransformer, HookedTransformerConfig, KeyValueCache
from hookedattn.core.processing import fold_layer_norm
from hookedattn.testing import assert_residual_identities, randomize_parameters

INDEXED = dict(
    n_layers=2, d_model=32, n_ctx=64, d_vocab=50, n_heads=4, d_head=12, d_head_v=8,
    kv_lora_rank=16, q_lora_rank=20, rotary_dim=4, positional_embedding_type="rotary",
    rotary_base=100.0, normalization_type="RMS", act_fn="silu", gated_mlp=True, d_mlp=16,
    index_topk=3, index_n_heads=4, index_head_dim=8, index_norm_eps=1e-3, seed=0,
    dtype="float64",
)  # fmt: skip
VARIANTS = {"query_latent": {}, "plain_query": dict(q_lora_rank=None)}
TOKENS = torch.tensor([[3, 17, 42, 8, 8, 29, 11, 5, 40], [9, 1, 12, 12, 33, 7, 2, 48, 4]])
N = TOKENS.shape[1]


def indexed_model(**changes) -> HookedTransformer:
    model = HookedTransformer(HookedTransformerConfig(**{**INDEXED, **changes}))
    return randomize_parameters(model, seed=3)


@pytest.fixture(scope="module", params=list(VARIANTS))
def model(request) -> HookedTransformer:
    return indexed_model(**VARIANTS[request.param])


@pytest.fixture(scope="module")
def cache(model):
    with torch.no_grad():
        return model.run_with_cache(TOKENS)[1]


# ---------------------------------------------------------------- brute force
def _rotated_first(x: torch.Tensor, position: int, d_rope: int, base: float) -> torch.Tensor:
    """`x` with its first `d_rope` dimensions rotated pair by pair, `(i, i + d_rope / 2)` by
    `position * base ** (-2i / d_rope)` (angles in float32, as the rotary computes them)."""
    half, out = d_rope // 2, x.clone()
    f32 = lambda value: torch.tensor(value, dtype=torch.float32)
    for i in range(half):
        angle = f32(position) / f32(base) ** f32(2 * i / d_rope)
        c, s = float(angle.cos()), float(angle.sin())
        out[i], out[i + half] = x[i] * c - x[i + half] * s, x[i + half] * c + x[i] * s
    return out


def brute_force_index_scores(indexer, cfg, x: torch.Tensor, q_in: torch.Tensor) -> torch.Tensor:
    """`s[t, u] = sum_i w[t, i] relu(q_I[t, i] . k_I[u] / sqrt(d_index))` for one sequence,
    key by key and head by head, in float64; -inf after the query."""
    d, rot = cfg.index_head_dim, (cfg.rotary_dim, cfg.rotary_base)
    keys = []
    for u in range(N):
        raw = x[u] @ indexer.W_IK
        normed = (raw - raw.mean()) / torch.sqrt(raw.var(unbiased=False) + cfg.index_norm_eps)
        keys.append(_rotated_first(normed * indexer.k_norm.w + indexer.k_norm.b, u, *rot))
    scores = torch.full((N, N), -math.inf, dtype=torch.float64)
    for t in range(N):
        weights = x[t] @ indexer.W_IW / math.sqrt(cfg.index_n_heads)
        queries = [_rotated_first(q_in[t] @ W, t, *rot) for W in indexer.W_IQ]
        for u in range(t + 1):
            total = 0.0
            for i, q in enumerate(queries):
                total += weights[i] * max(float(q @ keys[u]) / math.sqrt(d), 0.0)
            scores[t, u] = total
    return scores


def _query_input(model, cache, layer: int) -> torch.Tensor:
    if model.cfg.q_lora_rank is None:
        return cache[f"blocks.{layer}.ln1.hook_out"]
    return cache[f"blocks.{layer}.attn.hook_q_latent"]


def test_index_scores_equal_a_brute_force_loop(model, cache):
    """To float32's rounding: the indexer scores in float32, as transformers does."""
    for layer, block in enumerate(model.blocks):
        x, q_in = cache[f"blocks.{layer}.ln1.hook_out"], _query_input(model, cache, layer)
        got = cache[f"blocks.{layer}.attn.indexer.hook_index_scores"]
        assert got.dtype == torch.float32
        for row in range(TOKENS.shape[0]):
            with torch.no_grad():
                want = brute_force_index_scores(block.attn.indexer, model.cfg, x[row], q_in[row])
            torch.testing.assert_close(got[row].double(), want, rtol=1e-5, atol=1e-5)


def _no_tie(scores: torch.Tensor) -> bool:
    """Whether no query's third and fourth best scores are equal (so its top 3 is one set)."""
    for t in range(3, N):
        best = scores[:, t, : t + 1].sort(dim=-1, descending=True).values
        if bool((best[:, 2] == best[:, 3]).any()):
            return False
    return True


def test_each_query_reads_the_top_k_keys_of_its_scores(model, cache):
    for layer in range(model.cfg.n_layers):
        scores = cache[f"blocks.{layer}.attn.indexer.hook_index_scores"]
        assert _no_tie(scores), layer
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        for row in range(TOKENS.shape[0]):
            for t in range(N):
                chosen = set(scores[row, t, : t + 1].topk(min(3, t + 1)).indices.tolist())
                for h in range(model.cfg.n_heads):
                    read = set(pattern[row, h, t].nonzero().flatten().tolist())
                    assert read == chosen, (layer, row, t, h)


def test_the_attention_is_a_softmax_over_the_chosen_keys_only(model, cache):
    """Each head's `z` from its rotated queries and keys, by a loop over the chosen keys."""
    cfg = model.cfg
    for layer in range(cfg.n_layers):
        a = f"blocks.{layer}.attn"
        q, k, v = cache[f"{a}.hook_rot_q"], cache[f"{a}.hook_rot_k"], cache[f"{a}.hook_v"]
        scores = cache[f"{a}.indexer.hook_index_scores"]
        for row in range(TOKENS.shape[0]):
            for t in range(N):
                chosen = scores[row, t, : t + 1].topk(min(3, t + 1)).indices.tolist()
                for h in range(cfg.n_heads):
                    logits = torch.stack([q[row, t, h] @ k[row, u, h] for u in chosen])
                    weights = torch.softmax(logits / cfg.attn_scale, dim=0)
                    z = sum(w * v[row, u, h] for w, u in zip(weights, chosen, strict=True))
                    got = cache[f"{a}.hook_z"][row, t, h]
                    torch.testing.assert_close(got, z, rtol=0, atol=1e-12)


def test_the_indexer_hook_points_have_the_documented_shapes(model, cache):
    batch, i = TOKENS.shape[0], "blocks.1.attn.indexer"
    shapes = {
        "hook_index_q": (batch, N, 4, 8), "hook_index_k": (batch, N, 8),
        "hook_index_weights": (batch, N, 4), "hook_index_scores": (batch, N, N),
    }  # fmt: skip
    for name, shape in shapes.items():
        assert tuple(cache[f"{i}.{name}"].shape) == shape, name


def test_an_edit_of_the_index_scores_changes_the_keys_read(model):
    """The scores at `hook_scores` are what the choice reads: making key 0 the best makes
    every query read it."""

    def favour_the_first_key(scores, hook):
        return scores.index_fill(-1, torch.tensor([0]), 1e9)

    hooks = [("blocks.0.attn.indexer.hook_index_scores", favour_the_first_key)]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        _, cache = model.run_with_cache(TOKENS)
    assert bool((cache["blocks.0.attn.hook_pattern"][..., 0] > 0).all())


def test_tied_keys_are_chosen_as_torch_topk_chooses():
    """With 3 index heads, query 7 of block 0 has three keys whose every head's score the
    ReLU zeroes, tied for two places: chosen as `torch.topk` over the query's whole row
    (later keys -inf) chooses, as transformers calls it."""
    model = indexed_model(index_n_heads=3, q_lora_rank=None)
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    scores = cache["blocks.0.attn.indexer.hook_index_scores"]
    assert not _no_tie(scores)
    chosen = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, scores.topk(3).indices, True)
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    assert torch.equal(cache["blocks.0.attn.hook_pattern"][:, 0] > 0, chosen & causal)


def test_a_block_without_an_indexer_reads_every_earlier_key():
    model = indexed_model(indexer_layers=(False, True))
    assert not hasattr(model.blocks[0].attn, "indexer") and hasattr(model.blocks[1].attn, "indexer")
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    assert torch.equal(cache["blocks.0.attn.hook_pattern"] > 0, causal.expand(2, 4, N, N))
    assert not torch.equal(cache["blocks.1.attn.hook_pattern"] > 0, causal.expand(2, 4, N, N))


def test_a_top_k_as_long_as_the_sequence_chooses_nothing_away():
    selecting, plain = indexed_model(index_topk=N), indexed_model(index_topk=None)
    plain.load_state_dict({k: v for k, v in selecting.state_dict().items() if ".indexer." not in k})
    with torch.no_grad():
        torch.testing.assert_close(selecting(TOKENS), plain(TOKENS), rtol=0, atol=1e-12)


def test_leaving_the_choice_out_moves_the_logits(model):
    plain = HookedTransformer(model.cfg.replace(index_topk=None))
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if ".indexer." not in k})
    with torch.no_grad():
        assert float((plain(TOKENS) - model(TOKENS)).abs().max()) > 1e-3


def test_left_padding_changes_no_real_token(model):
    """Padding keys score -inf, never chosen: a left-padded prompt's logits are its own."""
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), TOKENS[1:]], dim=1)
    mask = torch.cat([torch.zeros(1, 3), torch.ones(1, N)], dim=1).long()
    with torch.no_grad():
        alone = model(TOKENS[1:])
        got = model(padded, attention_mask=mask)[:, 3:]
    torch.testing.assert_close(got, alone, rtol=0, atol=1e-12)


def test_one_token_at_a_time_with_the_kv_cache_equals_the_whole_forward(model):
    """Each step's indexer scores the keys it cached in earlier steps."""
    with torch.no_grad():
        full = model(TOKENS)
        cache = KeyValueCache.empty(model.cfg, batch=TOKENS.shape[0])
        steps = [model(TOKENS[:, :4], past_kv_cache=cache)]
        steps += [model(TOKENS[:, p : p + 1], past_kv_cache=cache) for p in range(4, N)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-12)


def test_a_frozen_cache_and_its_copies_are_read_with_their_indexer_keys(model):
    """Frozen, the cache (the indexer's keys too) is read and left as it is; a frozen copy
    (what a block on another device reads) carries the indexer's keys."""
    cache = KeyValueCache.empty(model.cfg, batch=TOKENS.shape[0])
    with torch.no_grad():
        model(TOKENS[:, :4], past_kv_cache=cache)
        cache.freeze()
        step = model(TOKENS[:, 4:5], past_kv_cache=cache)
        again = model(TOKENS[:, 4:5], past_kv_cache=cache)
        entries = [entry.frozen_copy("cpu") for entry in cache.entries]
        copies = KeyValueCache(entries, cache.previous_attention_mask, frozen=True)
        copied = model(TOKENS[:, 4:5], past_kv_cache=copies)
        full = model(TOKENS[:, :5])[:, 4:]
    torch.testing.assert_close(step, full, rtol=0, atol=1e-12)
    assert torch.equal(step, again) and torch.equal(step, copied)


def test_generation_with_and_without_the_kv_cache_agree(model):
    kwargs = dict(max_new_tokens=6, do_sample=False, stop_at_eos=False)
    with_cache = model.generate(TOKENS[:, :3], **kwargs)
    without = model.generate(TOKENS[:, :3], use_past_kv_cache=False, **kwargs)
    assert torch.equal(with_cache, without)


def test_the_cache_over_a_generation_is_run_with_cache_of_its_tokens(model):
    """The indexer's scores of each step (a row over the keys so far) join as one forward's
    (to float32's rounding: they are float32 sums in another order)."""
    out = model.generate(TOKENS[:, :4], 5, stop_at_eos=False, return_cache=True)
    _, expected = model.run_with_cache(out.tokens)
    assert sorted(out.cache) == sorted(expected)
    for name in expected:  # masked scores are -inf in both
        atol = 1e-5 if expected[name].dtype == torch.float32 else 1e-10
        torch.testing.assert_close(out.cache[name], expected[name], rtol=0, atol=atol, msg=name)


def test_the_indexer_names_expand_and_have_their_axes():
    from hookedattn.core import names

    name = names.get_act_name("index_scores", 1)
    assert name == "blocks.1.attn.indexer.hook_index_scores"
    assert names.axis_names(name) == ("batch", "query_pos", "key_pos")
    assert names.axis_names("blocks.0.attn.indexer.hook_index_q")[2:] == ("index_head", "d_index")
    assert names.axis_names("blocks.0.attn.indexer.k_norm.hook_out") == ("batch", "pos", "d_index")


def test_a_cache_holding_no_indexer_keys_is_refused(model):
    plain = HookedTransformer(model.cfg.replace(index_topk=None))
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if ".indexer." not in k})
    cache = KeyValueCache.empty(model.cfg, batch=TOKENS.shape[0])
    with torch.no_grad():
        plain(TOKENS[:, :4], past_kv_cache=cache)
        with pytest.raises(ValueError, match="holds 4 positions but no indexer keys"):
            model(TOKENS[:, 4:5], past_kv_cache=cache)


def test_every_residual_identity_holds(model, cache):
    assert not assert_residual_identities(model, cache).skipped


def test_folding_the_norms_keeps_the_logits(model):
    """ln1's gain folds into the indexer's reads of the stream too."""
    folded = fold_layer_norm(model)
    with torch.no_grad():
        torch.testing.assert_close(folded(TOKENS), model(TOKENS), rtol=0, atol=1e-10)


def test_a_saved_model_loads_with_its_indexers(tmp_path):
    model = indexed_model(indexer_layers=(True, False))
    model.save(tmp_path)
    loaded = HookedTransformer.load(tmp_path)
    assert loaded.cfg == model.cfg
    with torch.no_grad():
        assert torch.equal(loaded(TOKENS), model(TOKENS))


def test_an_attribution_graph_refuses_the_indexer(model):
    """Its frozen patterns are made again from queries and keys alone, without the choice."""
    from analysis.attribution_graphs import attribution_graph
    from hookedattn.sae import Transcoder, TranscoderConfig

    tcs = [
        Transcoder(TranscoderConfig(32, 8, 32, f"blocks.{layer}.ln2.hook_out",
                                    f"blocks.{layer}.hook_mlp_out", "relu", dtype="float64"))
        for layer in range(2)
    ]  # fmt: skip
    with pytest.raises(ValueError, match="lightning indexer's choice of keys"):
        attribution_graph(model, tcs, TOKENS[0])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(kv_lora_rank=None, q_lora_rank=None, d_head_v=None), "selects keys for latent"),
        (dict(index_head_dim=2), "index_head_dim=2 must be at least rotary_dim=4"),
        (dict(indexer_layers=(True,)), "indexer_layers must be 2 booleans"),
        (dict(index_topk=None, indexer_layers=(True, True)), "give index_topk"),
    ],
    ids=["not_latent", "narrow", "layers", "layers_without_topk"],
)
def test_the_config_refuses_an_indexer_it_cannot_build(changes, message):
    with pytest.raises(ValueError, match=message):
        HookedTransformerConfig(**{**INDEXED, **changes})
