"""Multi-head latent attention (`components.latent_attention`) and DeepSeek V3's router and
dense first layers, on tiny random float64 models: against a brute-force reference written
with loops and dense per-head matrices, its circuits against the scores and writes they
factor, the KV cache, the residual decomposition and identities, weight processing, saving,
and the refusals (config, `model.QK`/`model.OV`, tensor parallelism).

Every parameter is random (`randomize_parameters`: biases and norm gains too), the value
head is narrower than the query/key head, and the MLPs are a dense first block then a
sigmoid router over 8 experts in 4 groups, so that nothing neutral hides a mistake.
"""

import math

import pytest
import torch

from analysis import decompose_resid
from hookedattn import HookedTransformer, HookedTransformerConfig, KeyValueCache
from hookedattn.core import parallel
from hookedattn.core.components.latent_attention import LatentAttention
from hookedattn.core.processing import fold_layer_norm
from hookedattn.testing import assert_residual_identities, randomize_parameters

LATENT = dict(
    n_layers=3, d_model=32, n_ctx=64, d_vocab=50, n_heads=4, d_head=12, d_head_v=8,
    kv_lora_rank=16, q_lora_rank=20, rotary_dim=4, positional_embedding_type="rotary",
    rotary_base=100.0, normalization_type="RMS", act_fn="silu", gated_mlp=True, d_mlp=16,
    num_experts=8, experts_per_token=3, router_scoring="sigmoid", n_expert_groups=4,
    topk_expert_groups=2, routed_scaling_factor=2.5, norm_topk_prob=True, d_mlp_shared=16,
    n_dense_layers=1, d_mlp_dense=40, latent_norm_eps=1e-3, seed=0, dtype="float64",
)  # fmt: skip
# "unrotated": Kimi Linear's latent attention, its decoupled key part rotated in no block.
VARIANTS = {"query_latent": {}, "plain_query": dict(q_lora_rank=None),
            "unrotated": dict(rotary_layers=(False,) * 3),
            "gated": dict(attn_gate="sigmoid", attn_gate_per_head=True)}  # fmt: skip
# "gated": Bailing Hybrid's, one sigmoid factor per head on z.
TOKENS = torch.tensor([[3, 17, 42, 8, 8, 29, 11, 5, 40], [9, 1, 12, 12, 33, 7, 2, 48, 4]])


def latent_model(**changes) -> HookedTransformer:
    model = HookedTransformer(HookedTransformerConfig(**{**LATENT, **changes}))
    return randomize_parameters(model, seed=3)


@pytest.fixture(scope="module", params=list(VARIANTS))
def model(request) -> HookedTransformer:
    return latent_model(**VARIANTS[request.param])


@pytest.fixture(scope="module")
def cache(model):
    return model.run_with_cache(TOKENS)[1]


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max())


# ---------------------------------------------------------------- brute force
def _rms(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean() + eps) * gain


def _rotated(x: torch.Tensor, position: int, base: float) -> torch.Tensor:
    """`x` rotated pair by pair, `(i, i + half)` by `position * base ** (-2i / width)`; the
    frequency in float32, as the reference implementations compute it, the angle and its
    cosine in `x`'s dtype (the rotary module's docstring)."""
    half, out = x.shape[0] // 2, x.clone()
    f32 = lambda value: torch.tensor(value, dtype=torch.float32)
    for i in range(half):
        frequency = (1.0 / f32(base) ** f32(2 * i / x.shape[0])).to(x.dtype)
        angle = position * frequency
        c, s = float(angle.cos()), float(angle.sin())
        out[i], out[i + half] = x[i] * c - x[i + half] * s, x[i + half] * c + x[i] * s
    return out


def brute_force_attention(
    attn: LatentAttention, cfg, x: torch.Tensor, rotates: bool = True
) -> torch.Tensor:
    """The attention sublayer's output for one sequence `x: [pos d_model]`, token by token
    and head by head, with each head's dense matrices (the last `rotary_dim` dimensions of
    queries and keys left as they are where the block does not `rotate`)."""
    n, d_nope = x.shape[0], cfg.d_head - cfg.rotary_dim
    eps = cfg.latent_norm_eps
    _rotated_here = _rotated if rotates else lambda u, position, base: u
    q, k, v = {}, {}, {}
    for p in range(n):
        if cfg.q_lora_rank is None:
            q_in = x[p]
        else:
            q_in = _rms(x[p] @ attn.W_Q_a + attn.b_Q_a, attn.q_a_norm.w, eps)
        c_kv = _rms(x[p] @ attn.W_KV_a + attn.b_KV_a, attn.kv_a_norm.w, eps)
        k_rope = _rotated_here(x[p] @ attn.W_K_rope + attn.b_K_rope, p, cfg.rotary_base)
        for h in range(cfg.n_heads):
            W_K, W_V = attn.W_KV_b[h, :, :d_nope], attn.W_KV_b[h, :, d_nope:]
            q_h = q_in @ attn.W_Q[h]
            rope_q = _rotated_here(q_h[d_nope:], p, cfg.rotary_base)
            q[p, h] = torch.cat([q_h[:d_nope], rope_q])
            k[p, h] = torch.cat([c_kv @ W_K, k_rope])
            v[p, h] = c_kv @ W_V
    out = torch.zeros(n, cfg.d_model, dtype=x.dtype)
    for p in range(n):
        for h in range(cfg.n_heads):
            scores = torch.stack([q[p, h] @ k[j, h] / math.sqrt(cfg.d_head) for j in range(p + 1)])
            weights = torch.exp(scores - scores.max())
            weights = weights / weights.sum()
            z = sum(weights[j] * v[j, h] for j in range(p + 1))
            if cfg.attn_gate is not None:  # sigmoid of the block's own input, per head
                z = z * torch.sigmoid(x[p] @ attn.W_G[h] + attn.b_G[h])
            out[p] += z @ attn.W_O[h]
        out[p] += attn.b_O
    return out


def test_each_layer_equals_a_brute_force_reference(model, cache):
    for layer, block in enumerate(model.blocks):
        x = cache[f"blocks.{layer}.ln1.hook_out"]
        for row in range(TOKENS.shape[0]):
            with torch.no_grad():
                rotates = model.cfg.layer_rotates(layer)
                expected = brute_force_attention(block.attn, model.cfg, x[row], rotates)
            assert max_abs(cache["attn_out", layer][row], expected) <= 1e-10, (layer, row)


def test_the_hook_points_have_the_documented_shapes(model, cache):
    batch, pos = TOKENS.shape
    cfg, a = model.cfg, "blocks.1.attn"
    shapes = {
        "hook_kv_latent": (batch, pos, cfg.kv_lora_rank),
        "hook_k_rope": (batch, pos, cfg.rotary_dim),
        "hook_q": (batch, pos, 4, 12), "hook_k": (batch, pos, 4, 12),
        "hook_rot_q": (batch, pos, 4, 12), "hook_rot_k": (batch, pos, 4, 12),
        "hook_v": (batch, pos, 4, 8), "hook_z": (batch, pos, 4, 8),
        "hook_attn_scores": (batch, 4, pos, pos), "hook_pattern": (batch, 4, pos, pos),
    }  # fmt: skip
    if cfg.q_lora_rank is not None:
        shapes["hook_q_latent"] = (batch, pos, cfg.q_lora_rank)
    else:
        assert f"{a}.hook_q_latent" not in model.hook_dict
    if cfg.attn_gate is not None:
        shapes["hook_attn_gate"] = (batch, pos, 4, 1)  # one factor per head
    else:
        assert f"{a}.hook_attn_gate" not in model.hook_dict
    if not cfg.layer_rotates(1):  # nothing rotated: no rotated queries and keys to hook
        for name in ("hook_rot_q", "hook_rot_k"):
            assert f"{a}.{name}" not in model.hook_dict
            del shapes[name]
    for name, shape in shapes.items():
        assert tuple(cache[f"{a}.{name}"].shape) == shape, name


def test_every_residual_identity_holds(model, cache):
    assert not assert_residual_identities(model, cache).skipped


def test_an_edit_of_the_kv_latent_reaches_keys_and_values():
    model = latent_model()

    def zero(latent, hook):
        return torch.zeros_like(latent)

    _, cache = model.run_with_cache(TOKENS)
    with model.hooks(fwd_hooks=[("blocks.1.attn.hook_kv_latent", zero)]):
        _, edited = model.run_with_cache(TOKENS)
    d_nope = model.cfg.d_head - model.cfg.rotary_dim
    assert edited["blocks.1.attn.hook_v"].abs().max() == 0
    assert edited["blocks.1.attn.hook_k"][..., :d_nope].abs().max() == 0
    rope = edited["blocks.1.attn.hook_k"][..., d_nope:]  # the shared rotary key is not latent
    assert torch.equal(rope, cache["blocks.1.attn.hook_k"][..., d_nope:])


# ---------------------------------------------------------------- circuits
def test_the_qk_circuit_factors_the_unrotated_scores(model, cache):
    attn, d_nope = model.blocks[1].attn, model.cfg.d_head - model.cfg.rotary_dim
    QK = attn.QK
    dense = attn.W_Q[..., :d_nope] @ attn.W_KV_b[..., :d_nope].mT
    torch.testing.assert_close(QK.AB, dense, rtol=0, atol=1e-12)
    q_in = (
        cache["blocks.1.attn.hook_q_latent"]
        if model.cfg.q_lora_rank
        else cache["blocks.1.ln1.hook_out"]
    )
    c_kv = cache["blocks.1.attn.hook_kv_latent"]
    through_circuit = torch.einsum("bqi,hij,bkj->bhqk", q_in, QK.AB, c_kv)
    q, k = cache["q", 1][..., :d_nope], cache["k", 1][..., :d_nope]  # never rotated
    assert max_abs(through_circuit, torch.einsum("bqhd,bkhd->bhqk", q, k)) <= 1e-10


def test_the_two_qk_circuits_give_the_unrotated_scores(model, cache):
    # Content circuit plus rotary circuit (plus the rotary key's bias, outside both) is q . k
    # before the rotation, for every pair of positions; at position 0 the rotation is the
    # identity, so there it is the model's score itself.
    attn, d_nope = model.blocks[1].attn, model.cfg.d_head - model.cfg.rotary_dim
    x = cache["blocks.1.ln1.hook_out"]
    q_in = cache["blocks.1.attn.hook_q_latent"] if model.cfg.q_lora_rank else x
    c_kv = cache["blocks.1.attn.hook_kv_latent"]
    content = torch.einsum("bqi,hij,bkj->bhqk", q_in, attn.QK.AB, c_kv)
    rope = torch.einsum("bqi,hij,bkj->bhqk", q_in, attn.QK_rope.AB, x)
    bias = torch.einsum("bqi,hid,d->bhq", q_in, attn.W_Q[..., d_nope:], attn.b_K_rope)
    unrotated = content + rope + bias[..., None]
    q, k = cache["q", 1], cache["k", 1]
    assert max_abs(unrotated, torch.einsum("bqhd,bkhd->bhqk", q, k)) <= 1e-10
    first = cache["attn_scores", 1][..., 0, 0] * model.cfg.attn_scale
    assert max_abs(unrotated[..., 0, 0], first) <= 1e-10


def test_without_rotation_the_two_qk_circuits_are_every_score():
    # Kimi Linear's latent attention rotates nothing: the circuits give every causal score.
    model = latent_model(**VARIANTS["unrotated"])
    _, cache = model.run_with_cache(TOKENS)
    attn, d_nope = model.blocks[1].attn, model.cfg.d_head - model.cfg.rotary_dim
    x, q_in = cache["blocks.1.ln1.hook_out"], cache["blocks.1.attn.hook_q_latent"]
    content = torch.einsum("bqi,hij,bkj->bhqk", q_in, attn.QK.AB, cache["kv_latent", 1])
    rope = torch.einsum("bqi,hij,bkj->bhqk", q_in, attn.QK_rope.AB, x)
    bias = torch.einsum("bqi,hid,d->bhq", q_in, attn.W_Q[..., d_nope:], attn.b_K_rope)
    scores = (content + rope + bias[..., None]) / model.cfg.attn_scale
    causal = torch.ones(TOKENS.shape[1], TOKENS.shape[1], dtype=torch.bool).tril()
    assert max_abs(scores[..., causal], cache["attn_scores", 1][..., causal]) <= 1e-10


def test_the_ov_circuit_gives_each_heads_write(model, cache):
    attn = model.blocks[2].attn
    torch.testing.assert_close(attn.OV.AB, attn.W_V @ attn.W_O, rtol=0, atol=1e-12)
    c_kv, pattern = cache["blocks.2.attn.hook_kv_latent"], cache["pattern", 2]
    per_key = torch.einsum("bkj,hjm->bhkm", c_kv, attn.OV.AB)
    writes = torch.einsum("bhqk,bhkm->bqhm", pattern, per_key)
    if model.cfg.attn_gate is not None:  # the gate scales each head's write, outside OV
        writes = writes * cache["blocks.2.attn.hook_attn_gate"]
    z = cache["z", 2]
    assert max_abs(writes, torch.einsum("bqhd,hdm->bqhm", z, attn.W_O)) <= 1e-10


@pytest.mark.parametrize("circuit", ["QK", "OV"])
def test_the_models_stream_circuits_refuse_latent_attention(model, circuit):
    with pytest.raises(ValueError, match=rf"kv_lora_rank=16.*attn\.{circuit}"):
        getattr(model, circuit)


# ---------------------------------------------------------------- the KV cache
def test_one_token_at_a_time_with_the_kv_cache_equals_the_whole_forward(model):
    kv = KeyValueCache.empty(model.cfg, batch=TOKENS.shape[0])
    assert kv[0].past_values.shape[-1] == 8 != kv[0].past_keys.shape[-1]
    steps = [model(TOKENS[:, :4], past_kv_cache=kv)]
    steps += [model(TOKENS[:, p : p + 1], past_kv_cache=kv) for p in range(4, TOKENS.shape[1])]
    assert max_abs(torch.cat(steps, dim=1), model(TOKENS)) <= 1e-10


def test_generation_with_and_without_the_kv_cache_agree(model):
    prompt = TOKENS[:, :4]
    options = dict(max_new_tokens=6, do_sample=False, stop_at_eos=False)
    cached = model.generate(prompt, use_past_kv_cache=True, **options)
    uncached = model.generate(prompt, use_past_kv_cache=False, **options)
    assert torch.equal(cached, uncached)


def test_the_cache_over_a_generation_is_run_with_cache_of_its_tokens(model):
    # The latents, keys and values of each step, and the patterns the fused kernel left for
    # later (over the KV cache's keys), are those of one forward over the final tokens.
    # (Experts' rows are left out: a generation's cache of any mixture of experts fails to
    # join them, a bug of the core's recorder that this branch does not touch.)
    rows = lambda name: ".experts." in name
    out = model.generate(TOKENS[:, :4], 5, stop_at_eos=False, return_cache=True,
                         names_filter=lambda name: not rows(name))  # fmt: skip
    _, expected = model.run_with_cache(out.tokens, names_filter=lambda name: not rows(name))
    assert sorted(out.cache) == sorted(expected)
    for name in expected:  # masked scores are -inf in both
        torch.testing.assert_close(out.cache[name], expected[name], rtol=0, atol=1e-10, msg=name)


# ---------------------------------------------------------------- analysis and processing
@pytest.mark.parametrize("granularity", ["sublayer", "head", "expert"])
def test_the_residual_decomposition_sums_to_the_stream(model, granularity):
    _, cache = model.run_with_cache(TOKENS)
    decomposition = decompose_resid(model, cache, granularity=granularity, check=True)
    assert max_abs(decomposition.components.sum(0), cache["resid_post", 2]) <= 1e-10
    if granularity == "expert":  # the dense block stays whole; the others by expert
        assert "L0_mlp" in decomposition.labels and "L1E0" in decomposition.labels


def test_folding_the_residual_norms_keeps_the_function(model):
    folded = fold_layer_norm(model)
    assert max_abs(folded(TOKENS), model(TOKENS)) <= 1e-10
    assert folded.cfg.normalization_type == "RMSPre"


def test_a_saved_model_loads_with_its_dense_first_block(model, tmp_path):
    model.save(tmp_path)
    loaded = HookedTransformer.load(tmp_path)
    assert loaded.cfg == model.cfg
    assert max_abs(loaded(TOKENS), model(TOKENS)) == 0


# ---------------------------------------------------------------- the router
def brute_force_routing(scores, bias, groups, best_groups, k, scale, renormalise):
    """For one token: the chosen experts (a set) and their weights, by sorting."""
    choice = (scores + bias).tolist()
    size = len(choice) // groups
    group_score = [sum(sorted(choice[g * size : (g + 1) * size])[-2:]) for g in range(groups)]
    kept = sorted(range(groups), key=lambda g: -group_score[g])[:best_groups]
    candidates = [e for g in kept for e in range(g * size, (g + 1) * size)]
    chosen = sorted(candidates, key=lambda e: -choice[e])[:k]
    weights = {e: float(scores[e]) for e in chosen}
    total = sum(weights.values()) if renormalise else 1.0
    return {e: w / total * scale for e, w in weights.items()}


def test_the_group_limited_router_equals_a_brute_force_choice(model, cache):
    cfg, moe = model.cfg, model.blocks[2].mlp
    logits = cache["blocks.2.mlp.hook_router_logits"]
    indices, weights = (
        cache["blocks.2.mlp.hook_expert_indices"],
        cache["blocks.2.mlp.hook_expert_weights"],
    )
    for b in range(TOKENS.shape[0]):
        for p in range(TOKENS.shape[1]):
            expected = brute_force_routing(
                logits[b, p].sigmoid(), moe.b_router_choice, cfg.n_expert_groups,
                cfg.topk_expert_groups, cfg.experts_per_token, cfg.routed_scaling_factor, True,
            )  # fmt: skip
            got = dict(zip(indices[b, p].tolist(), weights[b, p].tolist(), strict=True))
            assert got.keys() == expected.keys(), (b, p)
            assert all(abs(got[e] - expected[e]) <= 1e-12 for e in got), (b, p)


def test_the_choice_bias_steers_the_choice_not_the_weights():
    model = latent_model()
    moe = model.blocks[1].mlp
    with torch.no_grad():
        moe.b_router_choice.zero_()
        moe.b_router_choice[5] = 100.0  # expert 5 always chosen
    _, cache = model.run_with_cache(TOKENS)
    indices = cache["blocks.1.mlp.hook_expert_indices"]
    assert (indices == 5).any(dim=-1).all()
    logits, weights = (
        cache["blocks.1.mlp.hook_router_logits"],
        cache["blocks.1.mlp.hook_expert_weights"],
    )
    chosen = logits.sigmoid().gather(-1, indices)
    expected = chosen / chosen.sum(-1, keepdim=True) * 2.5
    assert max_abs(weights, expected) <= 1e-12


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(n_key_value_heads=2), r"latent attention.*n_key_value_heads=2"),
        (dict(use_attn_in=True), r"latent attention.*use_attn_in=True"),
        (dict(rotary_dim=12), r"rotary_dim=12 must be below d_head=12"),
        (dict(kv_lora_rank=None, d_head_v=None), r"q_lora_rank is a latent attention setting"),
        (dict(group_score_experts=3), r"leaves 2 experts per group.*group_score_experts=3"),
        (dict(n_expert_groups=3), r"n_expert_groups=3 must divide num_experts=8"),
        (dict(n_dense_layers=2, d_mlp_dense=None), r"give d_mlp_dense"),
    ],
)
def test_a_config_that_cannot_be_built_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        HookedTransformerConfig(**{**LATENT, **changes})


def test_blocks_placed_over_two_device_slots_run_as_one_device(model):
    mapped = parallel.place(model.copy(), ["cpu", "cpu"])
    assert max_abs(mapped(TOKENS), model(TOKENS)) == 0
    options = dict(max_new_tokens=4, do_sample=False, stop_at_eos=False)
    assert torch.equal(mapped.generate(TOKENS, **options), model.generate(TOKENS, **options))


def test_the_stacked_weights_are_the_latent_reads_and_absent_biases_are_named(model):
    assert model.W_V.shape == (3, 4, 16, 8) and model.W_O.shape == (3, 4, 8, 32)
    with pytest.raises(ValueError, match=r"attn \(LatentAttention\) has no b_V"):
        model.b_V


def test_tensor_parallelism_splits_latent_attention_by_heads_taking_no_block_inputs(model):
    # The runs on two ranks: tests/parallel/test_tensor_parallel.py (slow).
    from hookedattn.core.parallel import _styles

    assert parallel.check_tp_size(model.cfg, 2) == 2
    plan = _styles.tensor_parallel_plan(model.cfg)
    assert {path for path in plan if path.startswith("blocks.")} == {
        *(f"blocks.{layer}.attn" for layer in range(3)),
        *(f"blocks.{layer}.mlp" for layer in range(3)),
    }  # the latents enter the heads inside the attention, not at the block's inputs
