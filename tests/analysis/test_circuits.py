"""QK/OV circuits and the model's weight views, against dense products and the forward."""

from functools import partial

import pytest
import torch
from einops import einsum
from torch.testing import assert_close

from analysis import full_ov_circuit, full_qk_circuit, ov_circuit, qk_circuit
from hookedattn import CharTokenizer, FactoredMatrix, HookedTransformer
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import tiny_model

F64 = tolerance(torch.float64).as_kwargs()


make_model = partial(
    tiny_model, d_model=12, n_heads=3, n_ctx=6, d_vocab=10, attn_only=True, normalization_type=None
)


def randomise_norms(model, seed=1):
    """Gains away from one (biases stay zero: circuits leave biases out)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".w"):
                param.copy_(1 + 0.5 * torch.randn(param.shape, generator=generator))


# ---------------------------------------------------------------- model views
def test_QK_and_OV_are_factored_per_head_products():
    model = make_model()
    assert isinstance(model.QK, FactoredMatrix) and isinstance(model.OV, FactoredMatrix)
    assert model.QK.shape == (2, 3, 12, 12) and model.QK.mdim == 4
    for layer in range(2):
        attn = model.blocks[layer].attn
        for head in range(3):
            assert_close(model.QK[layer, head].AB, attn.W_Q[head] @ attn.W_K[head].T, **F64)
            assert_close(model.OV[layer, head].AB, attn.W_V[head] @ attn.W_O[head], **F64)


def test_QK_gives_the_attention_scores():
    model = make_model()
    tokens = torch.tensor([[1, 4, 2, 7, 7]])
    _, cache = model.run_with_cache(tokens)
    resid = cache["resid_pre", 1][0]
    expected = (
        einsum(resid, model.QK[1].AB, resid, "q d_in, head d_in d_out, k d_out -> head q k")
        / model.cfg.attn_scale
    )
    scores = cache["attn_scores", 1][0]
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    assert_close(scores[:, allowed], expected[:, allowed], **F64)


def test_OV_gives_each_heads_write():
    model = make_model(use_attn_result=True)
    _, cache = model.run_with_cache(torch.tensor([[3, 1, 4, 1, 5]]))
    resid, pattern = cache["resid_pre", 0][0], cache["pattern", 0][0]
    moved = einsum(pattern, resid, "head q k, k d_model -> head q d_model")
    expected = einsum(moved, model.OV[0].AB, "head q d_in, head d_in d_out -> q head d_out")
    assert_close(cache["result", 0][0], expected, **F64)


def test_W_E_pos_stacks_token_and_position_rows():
    model = make_model()
    assert_close(model.W_E_pos, torch.cat([model.W_E, model.W_pos]))
    assert model.W_E_pos.shape == (10 + 6, 12)


def test_W_E_pos_needs_learned_positions():
    with pytest.raises(ValueError, match="rotary"):
        make_model(positional_embedding_type="rotary").W_E_pos


def test_all_head_labels_are_layer_major():
    labels = make_model().all_head_labels
    assert labels == ["L0H0", "L0H1", "L0H2", "L1H0", "L1H1", "L1H2"]


def test_tokens_to_residual_directions_follows_the_input_shape():
    model = make_model()
    W_U = model.W_U
    assert_close(model.tokens_to_residual_directions(3), W_U[:, 3])
    assert_close(model.tokens_to_residual_directions([3, 5]), W_U[:, [3, 5]].T)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    directions = model.tokens_to_residual_directions(ids)
    assert directions.shape == (2, 3, 12)
    assert_close(directions[1, 2], W_U[:, 6])
    assert model.tokens_to_residual_directions(torch.tensor([4])).shape == (1, 12)


def test_tokens_to_residual_directions_dot_the_final_stream_gives_the_logit():
    model = make_model(normalization_type="LN")
    tokens = torch.tensor([[1, 2, 3]])
    logits, cache = model.run_with_cache(tokens)
    direction = model.tokens_to_residual_directions(7)
    final = cache["ln_final.hook_out"][0, -1]
    assert_close(final @ direction + model.b_U[7], logits[0, -1, 7], **F64)


def test_tokens_to_residual_directions_reads_strings_through_the_tokenizer():
    tokenizer = CharTokenizer("abcdefg")  # a..g are ids 0..6, then <bos> <eos> <pad>
    model = HookedTransformer(make_model().cfg, tokenizer=tokenizer)
    assert_close(model.tokens_to_residual_directions("c"), model.W_U[:, 2])
    assert_close(model.tokens_to_residual_directions(["g", "a"]), model.W_U[:, [6, 0]].T)


def test_tokens_to_residual_directions_errors():
    model = make_model()
    with pytest.raises(ValueError, match="out of range"):
        model.tokens_to_residual_directions(10)
    with pytest.raises(ValueError, match="no tokenizer"):
        model.tokens_to_residual_directions("a")
    with pytest.raises(TypeError, match="integer"):
        model.tokens_to_residual_directions(torch.tensor([1.0]))


# ---------------------------------------------------------------- per-head circuits
def test_qk_and_ov_circuit_select_heads():
    model = make_model()
    assert_close(qk_circuit(model, 1, 2).AB, model.QK[1, 2].AB)
    assert_close(ov_circuit(model, 0, 1).AB, model.OV[0, 1].AB)
    assert_close(ov_circuit(model, -1, -1).AB, model.OV[1, 2].AB)
    assert qk_circuit(model, 1).shape == (3, 12, 12)
    assert ov_circuit(model).shape == (2, 3, 12, 12)


def test_circuit_arguments_are_checked():
    model = make_model()
    with pytest.raises(ValueError, match="without a layer"):
        qk_circuit(model, head=0)
    with pytest.raises(ValueError, match=r"layer must be an int in 0\.\.1"):
        ov_circuit(model, 2, 0)
    with pytest.raises(ValueError, match=r"head must be an int in 0\.\.2"):
        full_ov_circuit(model, 0, 3)


# ---------------------------------------------------------------- full circuits
def test_full_ov_circuit_is_embed_OV_unembed():
    model = make_model()
    full = full_ov_circuit(model, 1, 0)
    assert full.shape == (10, 10) and full.mdim == 4
    dense = model.W_E @ model.W_V[1, 0] @ model.W_O[1, 0] @ model.W_U
    assert_close(full.AB, dense, **F64)


def test_full_qk_circuit_is_embed_QK_embed():
    model = make_model()
    full = full_qk_circuit(model, 0, 2)
    dense = model.W_E @ model.W_Q[0, 2] @ model.W_K[0, 2].T @ model.W_E.T
    assert_close(full.AB, dense, **F64)


def test_full_circuits_of_every_head():
    model = make_model()
    full = full_ov_circuit(model)
    assert full.shape == (2, 3, 10, 10)
    assert_close(full[1, 2].AB, full_ov_circuit(model, 1, 2).AB, **F64)
    assert full_qk_circuit(model, 1).shape == (3, 10, 10)


def test_full_qk_circuit_with_positions_gives_layer_0_scores():
    # No norm, zero biases: a layer-0 score is the sum of four blocks of the circuit.
    model = make_model()
    tokens = torch.tensor([5, 0, 9, 5, 2])
    _, cache = model.run_with_cache(tokens[None])
    full = full_qk_circuit(model, 0, include_positional=True).AB  # [head 16 16]
    rows = torch.stack([tokens, 10 + torch.arange(5)])  # token row, position row
    expected = torch.zeros(3, 5, 5, dtype=torch.float64)
    for q_row in rows:
        for k_row in rows:
            expected += full[:, q_row][:, :, k_row]
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    scores = cache["attn_scores", 0][0] * model.cfg.attn_scale
    assert_close(scores[:, allowed], expected[:, allowed], **F64)


def test_full_ov_circuit_with_positions_gives_layer_0_logit_contributions():
    model = make_model(use_attn_result=True)
    tokens = torch.tensor([1, 8, 8, 3])
    _, cache = model.run_with_cache(tokens[None])
    full = full_ov_circuit(model, 0, include_positional=True).AB  # [head 16 10]
    per_source = full[:, tokens] + full[:, 10 + torch.arange(4)]  # [head k d_vocab]
    expected = einsum(cache["pattern", 0][0], per_source, "head q k, head k v -> q head v")
    assert_close(cache["result", 0][0] @ model.W_U, expected, **F64)


def frozen_scale_hooks(cache, names):
    """Hooks replacing each norm's scale by its mean in `cache`: the norm becomes linear."""

    def freeze(value):
        return lambda scale, hook: torch.full_like(scale, float(value))

    return [(name, freeze(cache[name].mean())) for name in names]


@pytest.mark.parametrize("norm", ["LN", "RMS", "LNPre"])
def test_fold_ln_scale_makes_the_qk_circuit_exact_at_that_scale(norm):
    model = make_model(normalization_type=norm, n_layers=1)
    randomise_norms(model)
    tokens = torch.tensor([[5, 0, 9, 5, 2]])
    _, cache = model.run_with_cache(tokens)
    hooks = frozen_scale_hooks(cache, ["blocks.0.ln1.hook_scale"])
    with model.hooks(fwd_hooks=hooks):
        _, frozen = model.run_with_cache(tokens)
    full = full_qk_circuit(model, 0, include_positional=True, fold_ln_scale=cache).AB
    rows = torch.stack([tokens[0], 10 + torch.arange(5)])
    expected = sum(full[:, q][:, :, k] for q in rows for k in rows)
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    scores = frozen["attn_scores", 0][0] * model.cfg.attn_scale
    assert_close(scores[:, allowed], expected[:, allowed], **F64)


@pytest.mark.parametrize("norm", ["LN", "RMS"])
def test_fold_ln_scale_makes_the_ov_circuit_exact_at_that_scale(norm):
    model = make_model(normalization_type=norm, n_layers=1, use_attn_result=True)
    randomise_norms(model)
    tokens = torch.tensor([[1, 8, 8, 3]])
    _, cache = model.run_with_cache(tokens)
    hooks = frozen_scale_hooks(cache, ["blocks.0.ln1.hook_scale", "ln_final.hook_scale"])
    with model.hooks(fwd_hooks=hooks):
        _, frozen = model.run_with_cache(tokens)
    full = full_ov_circuit(model, 0, include_positional=True, fold_ln_scale=cache).AB
    per_source = full[:, tokens[0]] + full[:, 10 + torch.arange(4)]
    expected = einsum(frozen["pattern", 0][0], per_source, "head q k, head k v -> q head v")
    # Each head's write, through ln_final with its scale frozen (the bias is not per head).
    result = frozen["result", 0][0]
    if norm == "LN":
        result = result - result.mean(-1, keepdim=True)
    through_final = result * model.ln_final.w / cache["ln_final.hook_scale"].mean()
    assert_close(through_final @ model.W_U, expected, **F64)


def test_fold_ln_scale_on_a_processed_model_divides_by_the_mean_scales():
    model = make_model(normalization_type="LNPre", n_layers=1)
    with torch.no_grad():  # centred writing weights: LNPre's centring is then a no-op
        model.embed.W_E -= model.embed.W_E.mean(-1, keepdim=True)
        model.blocks[0].attn.W_O -= model.blocks[0].attn.W_O.mean(-1, keepdim=True)
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3]]))
    scales = cache["scale", 0, "ln1"].mean() * cache["scale"].mean()
    folded = full_ov_circuit(model, 0, 1, fold_ln_scale=cache).AB
    assert_close(folded, full_ov_circuit(model, 0, 1).AB / scales, **F64)


def test_fold_ln_scale_with_per_head_inputs_uses_each_heads_scale():
    model = make_model(normalization_type="LN", n_layers=1, use_attn_in=True)
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3]]))
    assert cache["scale", 0, "ln1"].shape == (1, 3, 3, 1)  # [batch pos head 1]
    every_head = full_qk_circuit(model, 0, fold_ln_scale=cache)
    assert_close(every_head[2].AB, full_qk_circuit(model, 0, 2, fold_ln_scale=cache).AB, **F64)


def test_fold_ln_scale_errors():
    model = make_model()
    _, cache = model.run_with_cache(torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="no normalisation"):
        full_ov_circuit(model, 0, 0, fold_ln_scale=cache)
    ln_model = make_model(normalization_type="LN")
    _, partial = ln_model.run_with_cache(torch.tensor([[1, 2]]), names_filter="hook_embed")
    with pytest.raises(KeyError, match="hook_scale"):
        full_qk_circuit(ln_model, 0, 0, fold_ln_scale=partial)


def test_full_circuits_at_vocabulary_scale_stay_factored():
    # 5,000 tokens: the dense circuit would be 25M entries per head; the factors are 20k.
    model = make_model(d_vocab=5000, n_layers=1, dtype=torch.float32)
    full = full_ov_circuit(model)
    assert full.A.shape == (1, 3, 5000, 4) and full.B.shape == (1, 3, 4, 5000)
    assert full.svd().U.shape == (1, 3, 5000, 4)
