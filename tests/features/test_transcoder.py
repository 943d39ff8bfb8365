"""Transcoders (per-layer, skip, cross-layer), their configs, and the replacement model."""

from functools import partial

import pytest
import torch

from hookedattn.sae import (
    CrossLayerTranscoder,
    CrossLayerTranscoderConfig,
    Transcoder,
    TranscoderConfig,
    evaluate_transcoders,
    replaced,
    transcoder_hook_name,
)
from hookedattn.testing import random_tiny_model, random_tokens

make_model = partial(random_tiny_model, act_fn="gelu", n_ctx=10)
TOKENS = random_tokens(32, 2, 10, seed=4)


def jiggled(module, seed: int = 3, scale: float = 0.1):
    """`module` with every parameter moved at random (nonzero biases, skip, thresholds)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator, dtype=p.dtype))
            if name.endswith("threshold"):  # a JumpReLU's thresholds are never negative
                p.abs_()
    return module


def transcoder(layer: int, activation: str = "relu", skip: bool = False, **kw) -> Transcoder:
    k = {"k": 5} if activation == "topk" else {}
    hooks = f"blocks.{layer}.ln2.hook_out", f"blocks.{layer}.hook_mlp_out"
    cfg = TranscoderConfig(16, 40, 16, *hooks, activation, skip=skip, dtype="float64", **k, **kw)
    return jiggled(Transcoder(cfg), seed=layer + 3)


def clt(activation: str = "relu") -> CrossLayerTranscoder:
    k = {"k": 5} if activation == "topk" else {}
    cfg = CrossLayerTranscoderConfig(2, 16, 40, 16, activation, dtype="float64", **k)
    return jiggled(CrossLayerTranscoder(cfg))


def act(pre, activation, threshold=None, k=5):
    """The activations written out: ReLU, JumpReLU as SAELens computes it, TopK."""
    if activation == "relu":
        return pre.clamp(min=0)
    if activation == "jumprelu":
        return pre.clamp(min=0) * (pre > threshold)
    keep = pre >= pre.topk(k, -1).values[..., -1:]
    return torch.where(keep, pre, 0.0).clamp(min=0)


def by_hand(tc: Transcoder, x):
    c = tc.cfg
    threshold = tc.activation.threshold if c.activation == "jumprelu" else None
    acts = act(x @ tc.W_enc + tc.b_enc, c.activation, threshold)
    out = acts @ tc.W_dec + tc.b_dec
    return out + x @ tc.W_skip.T if c.skip else out


@pytest.mark.parametrize("activation", ["relu", "topk", "jumprelu"])
@pytest.mark.parametrize("skip", [False, True])
def test_a_transcoder_computes_its_equation(activation, skip):
    tc = transcoder(0, activation, skip)
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(tc(x), by_hand(tc, x), rtol=1e-12, atol=1e-12)


def test_with_error_gives_back_the_target():
    tc = transcoder(0, "topk", skip=True)
    x, y = torch.randn(4, 16, dtype=torch.float64), torch.randn(4, 16, dtype=torch.float64)
    torch.testing.assert_close(tc.with_error(x, y), y, rtol=1e-12, atol=1e-12)


def test_a_feature_edited_in_place_acts_through_the_error_term():
    # SAELens's tutorials ablate with `acts[..., f] = 0; return acts`: the same tensor back.
    tc = transcoder(0)
    x, y = torch.randn(4, 16, dtype=torch.float64), torch.randn(4, 16, dtype=torch.float64)
    acts = tc.encode(x)

    def zero_first(a, hook):
        a[..., :5] = 0.0
        return a

    tc.hook_acts.add_hook(zero_first)
    edited = acts.clone()
    edited[..., :5] = 0.0
    expected = y + tc.decode(edited, x) - tc.decode(acts, x)
    torch.testing.assert_close(tc.with_error(x, y), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("activation", ["relu", "topk", "jumprelu"])
def test_a_cross_layer_transcoder_writes_every_later_layer(activation):
    c = clt(activation)
    x = torch.randn(2, 3, 7, 16, dtype=torch.float64)
    acts = []
    for layer in range(2):
        threshold = c.activations[layer].threshold if activation == "jumprelu" else None
        acts.append(act(x[layer] @ c.W_enc[layer] + c.b_enc[layer], activation, threshold))
    expected = [acts[0] @ c.W_dec[0][:, 0] + c.b_dec[0],
                acts[0] @ c.W_dec[0][:, 1] + acts[1] @ c.W_dec[1][:, 0] + c.b_dec[1]]  # fmt: skip
    torch.testing.assert_close(c(x), torch.stack(expected), rtol=1e-12, atol=1e-12)


def test_fresh_decoders_have_unit_norm():
    tc = Transcoder(TranscoderConfig(16, 40, 8))
    torch.testing.assert_close(tc.W_dec.norm(dim=-1), torch.ones(40))
    c = CrossLayerTranscoder(CrossLayerTranscoderConfig(3, 16, 40, 8))
    for layer in range(3):
        torch.testing.assert_close(c.W_dec[layer].flatten(1).norm(dim=-1), torch.ones(40))


def test_initialisation_is_seeded():
    a, b = (
        Transcoder(TranscoderConfig(16, 40, 8, seed=5)),
        Transcoder(TranscoderConfig(16, 40, 8, seed=5)),
    )
    assert torch.equal(a.W_enc, b.W_enc) and torch.equal(a.W_dec, b.W_dec)
    assert not torch.equal(a.W_enc, Transcoder(TranscoderConfig(16, 40, 8, seed=6)).W_enc)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(d_in=-16, d_sae=40, d_out=16), "d_in must be a positive int"),
        (dict(d_in=16, d_sae=True, d_out=16), "d_sae must be a positive int"),
        (dict(d_in=16, d_sae=40, d_out=0), "d_out must be a positive int"),
        (dict(d_in=16, d_sae=40, d_out=16, activation="gelu"), "activation must be one of"),
        (dict(d_in=16, d_sae=40, d_out=16, activation="topk"), "needs k"),
        (dict(d_in=16, d_sae=40, d_out=16, activation="topk", k=41), "needs k"),
        (dict(d_in=16, d_sae=40, d_out=16, k=3), "k is for activation='topk' only"),
        (dict(d_in=16, d_sae=40, d_out=16, dtype="float16"), "dtype must be one of"),
        (dict(d_in=16, d_sae=40, d_out=16, hook_name="blocks.0.ln2.hook_out",
              hook_name_out="blocks.1.hook_mlp_out"), "name different layers"),
    ],
)  # fmt: skip
def test_a_bad_config_is_refused_naming_the_field(fields, message):
    # Values of the annotated types only: under the suite's beartype checks a float for an
    # int fails before our check (as it should); files are checked before this (test_io).
    with pytest.raises(ValueError, match=message):
        TranscoderConfig(**fields)


def test_a_cross_layer_config_wants_hooks_within_a_block():
    with pytest.raises(ValueError, match="feature_input_hook is a hook name within a block"):
        CrossLayerTranscoderConfig(2, 16, 40, 16, feature_input_hook="blocks.0.ln2.hook_out")


# ---------------------------------------------------------------------- the replacement model
SETS = {
    "per_layer": lambda: [transcoder(0), transcoder(1)],
    "skip_topk": lambda: [transcoder(0, "topk", True), transcoder(1, "topk", True)],
    "jumprelu": lambda: [transcoder(0, "jumprelu"), transcoder(1, "jumprelu")],
    "cross_layer": lambda: clt("topk"),
}


@pytest.mark.parametrize("kind", SETS)
def test_the_replacement_model_is_the_model(kind):
    model = make_model()
    expected = model(TOKENS)
    with replaced(model, SETS[kind]()):
        logits = model(TOKENS)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-10)


def test_without_error_terms_each_mlp_output_is_the_prediction():
    model, tcs = make_model(), SETS["skip_topk"]()
    seen, predicted = {}, {}

    def read(x, hook):
        seen[hook.layer()] = x

    def written(y, hook):
        predicted[hook.layer()] = by_hand(tcs[hook.layer()], seen[hook.layer()])

    hooks = [(f"blocks.{i}.ln2.hook_out", read) for i in range(2)]
    hooks += [(f"blocks.{i}.hook_mlp_out", written) for i in range(2)]
    with replaced(model, tcs, use_error_term=False):
        _, cache = model.run_with_cache(TOKENS, names_filter=lambda n: n.endswith("hook_mlp_out"))
        with model.hooks(fwd_hooks=hooks):  # inside the replacement: they see its output
            model(TOKENS)
    for layer in range(2):
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_mlp_out"], predicted[layer])


def test_the_features_are_hook_points_in_the_cache():
    model, tcs = make_model(), SETS["per_layer"]()
    with replaced(model, tcs):
        _, cache = model.run_with_cache(TOKENS)
    acts = cache[transcoder_hook_name(1, "hook_acts")]
    x = cache["blocks.1.ln2.hook_out"]
    torch.testing.assert_close(acts, (x @ tcs[1].W_enc + tcs[1].b_enc).clamp(min=0))
    assert transcoder_hook_name(1, "hook_acts") not in model.hook_dict
    assert tcs[1].hook_acts.name == "hook_acts"


def test_steering_a_feature_changes_its_layer_by_exactly_its_write():
    model, tcs = make_model(), SETS["per_layer"]()
    with replaced(model, tcs):
        _, clean = model.run_with_cache(TOKENS, names_filter="blocks.0.hook_mlp_out")

        def steer(acts, hook):
            acts = acts.clone()
            acts[1, 4, 7] += 2.5
            return acts

        with model.hooks([(transcoder_hook_name(0, "hook_acts"), steer)]):
            _, steered = model.run_with_cache(TOKENS, names_filter="blocks.0.hook_mlp_out")
    change = steered["blocks.0.hook_mlp_out"] - clean["blocks.0.hook_mlp_out"]
    expected = torch.zeros_like(change)
    expected[1, 4] = 2.5 * tcs[0].W_dec[7]
    torch.testing.assert_close(change, expected, rtol=0, atol=1e-12)


def test_ablating_a_cross_layer_feature_removes_its_write_from_every_later_layer():
    model, c = make_model(), clt("relu")
    with replaced(model, c):
        _, clean = model.run_with_cache(TOKENS)
        acts = clean[transcoder_hook_name(0, "hook_acts")]
        feature = int(acts[0, 3].argmax())

        def ablate(a, hook):
            a = a.clone()
            a[0, 3, feature] = 0.0
            return a

        hooks = [(transcoder_hook_name(0, "hook_acts"), ablate)]
        hooks += [(transcoder_hook_name(1, "hook_acts"), lambda a, hook: clean[hook.name])]
        with model.hooks(hooks):  # layer 1's features held, so layer 1 moves by the write alone
            _, ablated = model.run_with_cache(TOKENS, names_filter=lambda n: "recons" in n)
    for layer in range(2):
        name = transcoder_hook_name(layer, "hook_recons")
        change = ablated[name][0, 3] - clean[name][0, 3]
        torch.testing.assert_close(change, -acts[0, 3, feature] * c.decoder(0, layer)[feature])


def test_replacing_some_layers_leaves_the_others_alone():
    model, tcs = make_model(), SETS["per_layer"]()
    _, plain = model.run_with_cache(TOKENS, names_filter="blocks.0.hook_mlp_out")
    with replaced(model, tcs, use_error_term=False, layers=[1]):
        _, cache = model.run_with_cache(TOKENS, names_filter="blocks.0.hook_mlp_out")
    torch.testing.assert_close(cache["blocks.0.hook_mlp_out"], plain["blocks.0.hook_mlp_out"])


def test_the_replacement_refuses_what_does_not_fit():
    model = make_model()
    hooks = "blocks.0.ln2.hook_out", "blocks.0.hook_mlp_out"
    single = [Transcoder(TranscoderConfig(16, 8, 16, *hooks))]
    wide = [Transcoder(TranscoderConfig(8, 8, 8, *hooks, dtype="float64"))]
    refused = [
        (single, "transcoders' weights are torch.float32"),
        (wide, "d_in=8, but the model's MLPs read d_model=16"),
        ([transcoder(0), transcoder(0)], "two transcoders for layer 0"),
    ]
    for transcoders, message in refused:
        with pytest.raises(ValueError, match=message), replaced(model, transcoders):
            pass
    with (
        replaced(model, [transcoder(0)]),
        pytest.raises(ValueError, match="already replace"),
        replaced(model, [transcoder(0)]),
    ):
        pass
    assert not any("transcoder" in name for name in model.hook_dict)


def test_a_transcoder_writing_another_width_is_refused():
    model = make_model()
    hooks = "blocks.0.ln2.hook_out", "blocks.0.hook_mlp_out"
    narrow = Transcoder(TranscoderConfig(16, 8, 12, *hooks, dtype="float64"))
    with (
        pytest.raises(ValueError, match=r"write d_out=12, but .* write d_model=16"),
        replaced(model, [narrow]),
    ):
        pass


def test_a_transcoder_with_a_nan_weight_is_refused_by_name():
    model = make_model()
    tc = transcoder(0)
    with torch.no_grad():
        tc.W_dec[3, 2] = float("nan")
    with pytest.raises(ValueError, match="W_dec holds 1 value.* not finite"), replaced(model, [tc]):
        pass


@torch.no_grad()
def test_the_evaluation_measures_what_it_says():
    model, tcs = make_model(), SETS["skip_topk"]()
    result = evaluate_transcoders(model, tcs, TOKENS)
    with replaced(model, tcs):
        _, cache = model.run_with_cache(TOKENS)
    y = cache["blocks.1.hook_mlp_out"].flatten(0, 1)
    recons = by_hand(tcs[1], cache["blocks.1.ln2.hook_out"]).flatten(0, 1)
    fve = 1 - (y - recons).pow(2).sum() / (y - y.mean(0)).pow(2).sum()
    layer = result.layers[1]
    assert layer.l0 == 5.0 and layer.d_sae == 40
    assert layer.fve == pytest.approx(float(fve), abs=1e-10)
    with model.hooks([("blocks.1.hook_mlp_out", lambda a, hook: torch.zeros_like(a))]):
        assert layer.loss_zero_ablated == pytest.approx(float(model(TOKENS, return_type="loss")))
    expected = (layer.loss_zero_ablated - layer.loss_replaced) / (
        layer.loss_zero_ablated - result.loss_clean
    )
    assert layer.ce_recovered_vs_zero == pytest.approx(expected)
    assert "CE loss recovered" in str(result)
