"""TransformerLens's toy-model variants: shortformer positions and SoLU-LN MLPs.

Against a forward written out here in dense torch products (float64, one matrix per
projection, heads split by `view`), which shares nothing with the model's code: the logits
and the hook values the variants add or move (`hook_pos_embed`, `mlp.hook_mid`,
`mlp.ln.hook_normalized`, `mlp.hook_post`). Then what processing refuses, skips and
preserves for them, the positions a KV cache decodes at, and the facade's surface.
tests/tl/test_tl_toy_variants.py holds the same models against TransformerLens 3.5.1.
"""

import logging
import math

import pytest
import torch
from torch.testing import assert_close

import hookedattn_tl
from hookedattn import (
    HookedTransformer,
    HookedTransformerConfig,
    KeyValueCache,
    center_writing_weights,
    fold_layer_norm,
    process_weights,
)
from hookedattn.core.components.mlp import solu
from hookedattn.core.parallel import check_tp_size
from hookedattn.testing import (
    ReferenceTransformer,
    assert_residual_identities,
    random_tokens,
    randomize_parameters,
)
from hookedattn_tl._pretrained import shortformer_processing

EXACT = dict(rtol=1e-10, atol=1e-10)
EPS = 1e-5  # TransformerLens's LayerNorm epsilon
SIZES = dict(n_layers=2, d_model=16, d_head=4, n_heads=4, d_mlp=32, d_vocab=50, n_ctx=16)
SHORTFORMER = dict(positional_embedding_type="shortformer")
SOLU = dict(act_fn="solu_ln")

# name -> config changes, each a TransformerLens toy model's shape (solu-*l, attn-only-*l).
VARIANTS = {
    "solu_shortformer": dict(**SOLU, **SHORTFORMER),
    "solu_standard": dict(**SOLU),
    "attn_only_shortformer": dict(attn_only=True, **SHORTFORMER),
    "solu_shortformer_rms": dict(**SOLU, **SHORTFORMER, normalization_type="RMS"),
    "shortformer_split_inputs": dict(act_fn="gelu", **SHORTFORMER, use_split_qkv_input=True),
    "shortformer_attn_in": dict(act_fn="gelu", **SHORTFORMER, use_attn_in=True),
    "shortformer_grouped": dict(act_fn="gelu", **SHORTFORMER, n_key_value_heads=2),
}
TOKENS = random_tokens(SIZES["d_vocab"], 3, 11, seed=5)


def toy_model(name: str, **changes: object) -> HookedTransformer:
    """A float64 model of variant `name`, every weight, bias and gain random (seeded)."""
    fields = {"normalization_type": "LN", **SIZES, **VARIANTS[name], **changes}
    cfg = HookedTransformerConfig(**fields, dtype="float64", seed=0)
    return randomize_parameters(HookedTransformer(cfg), scale=0.3, seed=1)


# ------------------------------------------------------------ the written-out reference
def _layer_norm(x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None, rms: bool):
    """`(normalized, out)` of a LayerNorm (an RMSNorm with `rms`) over the last axis."""
    centred = x if rms else x - x.mean(-1, keepdim=True)
    normalized = centred / (centred.pow(2).mean(-1, keepdim=True) + EPS).sqrt()
    out = normalized if w is None else normalized * w
    return normalized, out if b is None else out + b


def _heads(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`x @ W + b` with the heads' weights side by side `[d_model, heads * d_head]`, split
    back to `[batch head pos d_head]`."""
    n_heads, d_model, d_head = W.shape
    flat = W.permute(1, 0, 2).reshape(d_model, n_heads * d_head)
    y = x @ flat + b.reshape(-1)
    return y.view(*x.shape[:2], n_heads, d_head).transpose(1, 2)


def reference(model: HookedTransformer, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """The logits and the variants' hook values, written out from the state dict."""
    cfg = model.cfg
    w = {name: t.detach().to(torch.float64) for name, t in model.state_dict().items()}
    rms = cfg.normalization_type == "RMS"
    batch, n = tokens.shape
    pos_embed = w["pos_embed.W_pos"][:n].expand(batch, n, cfg.d_model)
    shortformer = cfg.positional_embedding_type == "shortformer"
    resid = w["embed.W_E"][tokens] + (0.0 if shortformer else pos_embed)
    out = {"hook_pos_embed": pos_embed}
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    group = cfg.n_heads // cfg.n_kv_heads
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}."
        _, x = _layer_norm(resid, w.get(p + "ln1.w"), w.get(p + "ln1.b"), rms)
        qk_in = x + pos_embed if shortformer else x  # the values read x alone
        kv = "attn._" if p + "attn._W_K" in w else "attn."
        q = _heads(qk_in, w[p + "attn.W_Q"], w[p + "attn.b_Q"])
        k = _heads(qk_in, w[p + kv + "W_K"], w[p + kv + "b_K"]).repeat_interleave(group, 1)
        v = _heads(x, w[p + kv + "W_V"], w[p + kv + "b_V"]).repeat_interleave(group, 1)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(cfg.d_head)).masked_fill(future, -math.inf)
        z = scores.softmax(-1) @ v  # [batch head pos d_head]
        z = z.transpose(1, 2).reshape(batch, n, -1)
        resid = resid + z @ w[p + "attn.W_O"].reshape(-1, cfg.d_model) + w[p + "attn.b_O"]
        if cfg.attn_only:
            continue
        _, x = _layer_norm(resid, w.get(p + "ln2.w"), w.get(p + "ln2.b"), rms)
        pre = x @ w[p + "mlp.W_in"] + w[p + "mlp.b_in"]
        if cfg.act_fn == "solu_ln":
            mid = pre * torch.softmax(pre, dim=-1)
            # A LayerNorm over the neurons, whatever the model's own norms are.
            normalized, post = _layer_norm(mid, w.get(p + "mlp.ln.w"), w.get(p + "mlp.ln.b"), False)
            out[p + "mlp.hook_mid"], out[p + "mlp.ln.hook_normalized"] = mid, normalized
        else:
            post = torch.nn.functional.gelu(pre)
        out[p + "mlp.hook_post"] = post
        resid = resid + post @ w[p + "mlp.W_out"] + w[p + "mlp.b_out"]
    _, x = _layer_norm(resid, w.get("ln_final.w"), w.get("ln_final.b"), rms)
    out["logits"] = x @ w["unembed.W_U"] + w["unembed.b_U"]
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_the_model_is_the_written_out_forward(name):
    model = toy_model(name)
    expected = reference(model, TOKENS)
    logits, cache = model.run_with_cache(TOKENS)
    assert_close(logits, expected.pop("logits"), **EXACT)
    for hook, value in expected.items():
        assert_close(cache[hook], value, **EXACT, msg=hook)
    assert_close(model(TOKENS), logits, **EXACT)  # the fused kernels where nothing listens


@pytest.mark.parametrize("name", VARIANTS)
def test_every_residual_identity_holds(name):
    model = toy_model(name)
    _, cache = model.run_with_cache(TOKENS)
    check = assert_residual_identities(model, cache)
    if "shortformer" in name and "split" not in name:  # q, k read ln1's output + positions
        assert any("hook_pos_embed) @ W_Q" in s for s in check.checked)
    if name.startswith("solu"):
        assert any("hook_mid == act_fn" in s for s in check.checked)
        assert any("mlp.ln.hook_normalized ==" in s for s in check.checked)


def test_a_shortformer_keeps_the_positions_out_of_the_stream():
    model = toy_model("solu_shortformer")
    _, cache = model.run_with_cache(TOKENS)
    assert torch.equal(cache["blocks.0.hook_resid_pre"], cache["hook_embed"])
    assert_close(cache["hook_pos_embed"][0], model.W_pos[: TOKENS.shape[1]], **EXACT)


def test_a_solu_ln_mlp_has_transformer_lens_names():
    model = toy_model("solu_shortformer")
    names = set(model.state_dict())
    assert {"pos_embed.W_pos", "blocks.1.mlp.ln.w", "blocks.1.mlp.ln.b"} <= names
    hooks = set(model.hook_dict)
    for hook in ("hook_mid", "ln.hook_scale", "ln.hook_normalized", "hook_post"):
        assert f"blocks.0.mlp.{hook}" in hooks
    order = [h for h in model.hook_dict if h.startswith("blocks.0.mlp.")]
    assert order.index("blocks.0.mlp.hook_mid") < order.index("blocks.0.mlp.ln.hook_scale")
    assert order.index("blocks.0.mlp.ln.hook_normalized") < order.index("blocks.0.mlp.hook_post")


def test_solu_is_x_times_its_softmax_over_the_neurons():
    x = torch.randn(2, 3, 7, dtype=torch.float64)
    assert_close(solu(x), x * torch.exp(x) / torch.exp(x).sum(-1, keepdim=True), **EXACT)


@pytest.mark.parametrize(
    "changes, field",
    [(dict(gated_mlp=True), "gated_mlp"), (dict(num_experts=4, experts_per_token=2), "mixture")],
)
def test_solu_ln_is_refused_where_there_is_no_plain_mlp(changes, field):
    with pytest.raises(ValueError, match=f"solu_ln.*{field}"):
        HookedTransformerConfig(**SIZES, act_fn="solu_ln", **changes)


def test_a_solu_ln_mlp_is_not_split_over_ranks_naming_why():
    cfg = toy_model("solu_standard").cfg
    with pytest.raises(ValueError, match="tp_size=2.*solu_ln.*every neuron.*device_map"):
        check_tp_size(cfg, 2)
    assert check_tp_size(toy_model("solu_shortformer", act_fn="gelu").cfg, 2) == 2


def test_the_reference_forward_refuses_the_variants_it_does_not_write_out():
    for name, field in (("solu_standard", "act_fn='solu_ln'"), ("attn_only_shortformer", "short")):
        with pytest.raises(NotImplementedError, match=field):
            ReferenceTransformer(toy_model(name))


# ------------------------------------------------------------------------- processing
def log_probs(model: HookedTransformer) -> torch.Tensor:
    return model(TOKENS).log_softmax(-1)


@pytest.mark.parametrize("name", ["solu_shortformer", "attn_only_shortformer"])
def test_folding_and_centring_refuse_a_shortformer_naming_why(name):
    model = toy_model(name)
    with pytest.raises(ValueError, match="shortformer.*ln1"):
        fold_layer_norm(model)
    with pytest.raises(ValueError, match="center_writing_weights.*shortformer.*W_pos"):
        center_writing_weights(model)


@pytest.mark.parametrize("name", ["solu_shortformer", "attn_only_shortformer"])
def test_process_weights_skips_what_a_shortformer_cannot_take(name):
    model = toy_model(name)
    processed = process_weights(model)
    assert processed.cfg.normalization_type == "LN"
    for kept in ("embed.W_E", "pos_embed.W_pos", "blocks.0.ln1.w", "blocks.0.attn.W_O"):
        assert torch.equal(processed.state_dict()[kept], model.state_dict()[kept]), kept
    assert_close(log_probs(processed), log_probs(model), **EXACT)
    # As TransformerLens's from_pretrained processes it: only the value biases move.
    as_tl = process_weights(model, fold_ln=False, center_writing_weights=False,
                            center_unembed=False)  # fmt: skip
    assert_close(as_tl(TOKENS), model(TOKENS), **EXACT)


@pytest.mark.parametrize("norm", ["LN", "RMS"])
def test_folding_a_solu_ln_mlp_preserves_the_logits(norm):
    model = toy_model("solu_standard", normalization_type=norm)
    folded = fold_layer_norm(model)
    assert folded.cfg.normalization_type == f"{norm}Pre"
    assert not any(".mlp.ln." in name for name in folded.state_dict())
    assert_close(folded(TOKENS), model(TOKENS), **EXACT)
    _, cache = model.run_with_cache(TOKENS)
    _, folded_cache = folded.run_with_cache(TOKENS)
    for hook in ("blocks.1.mlp.hook_mid", "blocks.1.mlp.ln.hook_normalized"):
        assert_close(folded_cache[hook], cache[hook], **EXACT)
    W_out = folded.blocks[0].mlp.W_out
    assert_close(W_out.mean(0), torch.zeros_like(W_out[0]), **EXACT)  # centred over neurons
    processed = process_weights(model)
    assert_close(log_probs(processed), log_probs(model), **EXACT)
    assert_residual_identities(processed, processed.run_with_cache(TOKENS)[1])


def test_the_facade_turns_off_what_transformer_lens_turns_off(caplog):
    shortformer = toy_model("solu_shortformer").cfg
    with caplog.at_level(logging.WARNING):
        assert shortformer_processing(shortformer, True, True, True) == (False, False, False)
    assert caplog.text.count("for a shortformer model") == 3
    assert shortformer_processing(toy_model("solu_standard").cfg, True, False, True) == (
        True,
        False,
        True,
    )


# ------------------------------------------------------------------ KV cache, padding
@pytest.mark.parametrize("name", ["solu_shortformer", "attn_only_shortformer"])
def test_decoding_with_a_kv_cache_reads_each_tokens_own_position(name):
    model = toy_model(name)
    full = model(TOKENS)
    cache = KeyValueCache.empty(model.cfg, TOKENS.shape[0])
    steps = [model(TOKENS[:, :4], past_kv_cache=cache)]
    steps += [model(TOKENS[:, i : i + 1], past_kv_cache=cache) for i in range(4, TOKENS.shape[1])]
    assert_close(torch.cat(steps, dim=1), full, **EXACT)


def test_generation_with_a_kv_cache_is_the_full_forward():
    model = toy_model("solu_shortformer")
    prompt = TOKENS[:, :5]
    out = model.generate(prompt, 6, stop_at_eos=False, return_cache=True)
    without = model.generate(prompt, 6, stop_at_eos=False, use_past_kv_cache=False)
    assert torch.equal(out.tokens, without)
    logits, expected = model.run_with_cache(out.tokens)
    assert torch.equal(out.tokens[:, 5:], logits[:, 4:-1].argmax(-1))  # greedy, step by step
    for hook in ("hook_pos_embed", "blocks.1.attn.hook_q", "blocks.1.mlp.hook_post"):
        assert_close(out.cache[hook], expected[hook], **EXACT, msg=hook)


def test_a_left_padded_row_is_that_row_alone():
    model = toy_model("solu_shortformer")
    row = TOKENS[0, :7]
    padded = torch.cat([torch.zeros(3, dtype=torch.long), row])[None]
    mask = (torch.arange(10) >= 3).long()[None]
    assert_close(model(padded, attention_mask=mask)[:, 3:], model(row[None]), **EXACT)


# ------------------------------------------------------------------------- the facade
def tl_model(**changes: object) -> hookedattn_tl.HookedTransformer:
    config = dict(SIZES, normalization_type="LN", **SOLU, **SHORTFORMER, dtype="float64")
    return hookedattn_tl.HookedTransformer({**config, **changes})


def test_the_facade_builds_transformer_lens_toy_configs_and_runs_them():
    model = tl_model()
    core = HookedTransformer(model.cfg)
    core.load_state_dict(model.state_dict())
    assert_close(model(TOKENS), core(TOKENS), **EXACT)


def test_input_to_embed_returns_the_shortformer_positions_for_start_at_layer():
    model = tl_model()
    resid, tokens, pos_embed, _ = model.input_to_embed(TOKENS)
    assert torch.equal(resid, model.W_E[TOKENS])
    assert_close(pos_embed[1], model.W_pos[: TOKENS.shape[1]], **EXACT)
    again = model(resid, start_at_layer=0, shortformer_pos_embed=pos_embed, tokens=tokens)
    assert_close(again, model(TOKENS), **EXACT)
    shifted = model(resid, start_at_layer=0, shortformer_pos_embed=torch.zeros_like(pos_embed))
    assert not torch.allclose(shifted, model(TOKENS))
    with pytest.raises(ValueError, match="start_at_layer"):
        model(TOKENS, shortformer_pos_embed=pos_embed)
    standard = tl_model(positional_embedding_type="standard")
    assert standard.input_to_embed(TOKENS)[2] is None
    with pytest.raises(ValueError, match="'standard'"):
        standard(resid, start_at_layer=0, shortformer_pos_embed=pos_embed)


def test_the_facades_decomposition_leaves_the_positions_out_of_the_stream():
    model = tl_model()
    _, cache = model.run_with_cache(TOKENS)
    stack, labels = cache.get_full_resid_decomposition(expand_neurons=False, return_labels=True)
    assert "pos_embed" not in labels
    assert_close(stack.sum(0), cache["blocks.1.hook_resid_post"], **EXACT)


def test_w_e_pos_is_refused_for_a_shortformer_naming_why():
    with pytest.raises(ValueError, match="shortformer.*W_E.*W_pos"):
        toy_model("attn_only_shortformer").W_E_pos
