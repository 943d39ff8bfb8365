"""The sparse autoencoder module, its files (ours and SAELens's layout) and splicing."""

import json
from functools import partial

import pytest
import safetensors.torch
import torch

from hookedattn.sae import SAEConfig, SparseAutoencoder
from hookedattn.testing import tiny_model

POINT = "blocks.1.hook_resid_pre"


make_model = partial(tiny_model, n_ctx=8, d_vocab=20, act_fn="gelu", d_mlp=32)


def random_sae(activation: str = "relu", pre_bias: str = "tied", **kw) -> SparseAutoencoder:
    cfg = SAEConfig(16, 40, POINT, activation, pre_bias=pre_bias, dtype="float64", **kw)
    sae = SparseAutoencoder(cfg)
    with torch.no_grad():
        for p in sae.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    return sae


TOKENS = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(0))


def reference(sae: SparseAutoencoder, x: torch.Tensor) -> torch.Tensor:
    """The reconstruction written out by hand, per variant."""
    c = sae.cfg
    sub = {"tied": sae.b_dec, "none": 0.0}.get(c.pre_bias)
    sub = sae.pre_bias.b_pre if c.pre_bias == "untied" else sub
    pre = (x - sub) @ sae.W_enc + sae.b_enc
    if c.activation == "relu":
        acts = pre.clamp(min=0)
    elif c.activation == "jumprelu":
        acts = torch.where(pre > sae.activation.threshold, pre, 0.0).clamp(min=0)
    else:
        keep = pre >= pre.topk(c.k, -1).values[..., -1:]
        acts = torch.where(keep, pre, 0.0).clamp(min=0)
    return acts @ sae.W_dec + sae.b_dec


@pytest.mark.parametrize(
    "activation,pre_bias,kw",
    [("relu", "tied", {}), ("topk", "untied", {"k": 5}), ("jumprelu", "none", {})],
)
def test_variants_match_the_math(activation, pre_bias, kw):
    sae = random_sae(activation, pre_bias, **kw)
    x = torch.randn(3, 16, dtype=torch.float64)
    torch.testing.assert_close(sae(x), reference(sae, x))
    torch.testing.assert_close(sae.with_error(x), x, rtol=1e-12, atol=1e-12)


def test_fresh_decoder_rows_have_unit_norm():
    sae = SparseAutoencoder(SAEConfig(16, 40))
    torch.testing.assert_close(sae.W_dec.norm(dim=-1), torch.ones(40))


@pytest.mark.parametrize(
    "activation,pre_bias,kw",
    [("relu", "tied", {}), ("topk", "untied", {"k": 5}), ("jumprelu", "none", {})],
)
def test_save_load_roundtrip(tmp_path, activation, pre_bias, kw):
    sae = random_sae(activation, pre_bias, **kw)
    loaded = SparseAutoencoder.load(sae.save(tmp_path / "sae"))
    assert loaded.cfg == sae.cfg
    x = torch.randn(3, 16, dtype=torch.float64)
    torch.testing.assert_close(loaded(x), sae(x), rtol=1e-12, atol=1e-12)


def write_saelens_folder(path, tensors, cfg):
    path.mkdir()
    safetensors.torch.save_file(tensors, str(path / "sae_weights.safetensors"))
    (path / "cfg.json").write_text(json.dumps(cfg))


def test_loads_a_hand_written_saelens_jumprelu_folder(tmp_path):
    # SAELens 6's layout: architecture, d_in, d_sae, dtype, apply_b_dec_to_input,
    # normalize_activations, hook_name under metadata; W_enc [d_in d_sae], W_dec
    # [d_sae d_in], b_enc, b_dec, threshold.
    g = torch.Generator().manual_seed(3)
    t = {
        "W_enc": torch.randn(16, 24, generator=g),
        "W_dec": torch.randn(24, 16, generator=g),
        "b_enc": torch.randn(24, generator=g),
        "b_dec": torch.randn(16, generator=g),
        "threshold": torch.rand(24, generator=g),
    }
    cfg = {
        "architecture": "jumprelu", "d_in": 16, "d_sae": 24, "dtype": "float32",
        "device": "cpu", "apply_b_dec_to_input": False, "normalize_activations": "none",
        "metadata": {"hook_name": POINT, "model_name": "gpt2"},
    }  # fmt: skip
    write_saelens_folder(tmp_path / "s", t, cfg)
    sae = SparseAutoencoder.load(tmp_path / "s")
    assert (sae.cfg.hook_name, sae.cfg.activation, sae.cfg.pre_bias) == (POINT, "jumprelu", "none")
    x = torch.randn(5, 16, generator=g)
    pre = x @ t["W_enc"] + t["b_enc"]
    expected = (pre.relu() * (pre > t["threshold"])) @ t["W_dec"] + t["b_dec"]
    torch.testing.assert_close(sae(x), expected)


def test_loads_an_older_saelens_topk_folder(tmp_path):
    # Before SAELens 6: hook_name at top level, k in activation_fn_kwargs.
    g = torch.Generator().manual_seed(4)
    t = {"W_enc": torch.randn(16, 24, generator=g), "W_dec": torch.randn(24, 16, generator=g),
         "b_enc": torch.randn(24, generator=g), "b_dec": torch.randn(16, generator=g)}  # fmt: skip
    cfg = {
        "architecture": "topk", "d_in": 16, "d_sae": 24, "dtype": "torch.float32",
        "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 3},
        "apply_b_dec_to_input": True, "hook_name": POINT, "normalize_activations": None,
    }  # fmt: skip
    write_saelens_folder(tmp_path / "s", t, cfg)
    sae = SparseAutoencoder.load(tmp_path / "s")
    assert (sae.cfg.k, sae.cfg.pre_bias) == (3, "tied")
    acts = sae.encode(torch.randn(5, 16, generator=g))
    assert ((acts > 0).sum(-1) <= 3).all()


def test_a_folder_that_is_not_an_sae(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="not an SAE folder.*cfg.json"):
        SparseAutoencoder.load(tmp_path)
    write_saelens_folder(tmp_path / "g", {"W_enc": torch.zeros(2, 2)},
                         {"architecture": "gated", "d_in": 2, "d_sae": 2})  # fmt: skip
    with pytest.raises(ValueError, match="gated.*not supported"):
        SparseAutoencoder.load(tmp_path / "g")


def test_missing_tensor_and_wrong_shape_are_named(tmp_path):
    cfg = {"architecture": "standard", "d_in": 4, "d_sae": 6}
    write_saelens_folder(tmp_path / "a", {"W_enc": torch.zeros(4, 6)}, cfg)
    with pytest.raises(ValueError, match="lacks W_dec, b_dec, b_enc"):
        SparseAutoencoder.load(tmp_path / "a")
    bad = {"W_enc": torch.zeros(6, 4), "W_dec": torch.zeros(6, 4), "b_enc": torch.zeros(6),
           "b_dec": torch.zeros(4)}  # fmt: skip
    write_saelens_folder(tmp_path / "b", bad, cfg)
    with pytest.raises(ValueError, match=r"W_enc has shape \(6, 4\), expected \(4, 6\)"):
        SparseAutoencoder.load(tmp_path / "b")


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="k, an int in 1..d_sae=8"):
        SAEConfig(4, 8, activation="topk")
    with pytest.raises(ValueError, match="activation must be one of"):
        SAEConfig(4, 8, activation="gelu")


# ---------------------------------------------------------------------- splicing
def test_splice_with_error_term_leaves_the_output_unchanged():
    model, sae = make_model(), random_sae()
    clean = model(TOKENS)
    with model.saes([sae]):
        logits, cache = model.run_with_cache(TOKENS)
    torch.testing.assert_close(logits, clean, rtol=1e-10, atol=1e-10)
    acts = cache[f"{POINT}.sae.hook_acts"]
    assert acts.shape == (2, 8, 40) and (acts > 0).any()
    x = cache[f"{POINT}.sae.hook_in"]
    torch.testing.assert_close(cache[f"{POINT}.sae.hook_error"], x - sae(x))
    assert not any(".sae." in name for name in model.hook_dict)  # removed after
    assert sae.hook_acts.name == "hook_acts"


def test_splice_without_error_term_gives_the_saes_output():
    model, sae = make_model(), random_sae()
    resid = model.run_with_cache(TOKENS, names_filter=POINT)[1][POINT]
    with model.saes([sae], use_error_term=False):
        _, cache = model.run_with_cache(TOKENS, names_filter=[POINT, "blocks.1.hook_resid_mid"])
    recons = sae(resid)
    torch.testing.assert_close(cache[POINT], recons)
    expected = model(recons, start_at_layer=1)
    with model.saes([sae], use_error_term=False):
        torch.testing.assert_close(model(TOKENS), expected)


def test_ablating_a_feature_changes_the_output_by_its_write():
    model, sae = make_model(), random_sae()
    with model.saes([sae]):
        _, cache = model.run_with_cache(TOKENS, names_filter=[POINT, f"{POINT}.sae.hook_acts"])
        f = int(cache[f"{POINT}.sae.hook_acts"][0, -1].argmax())

        def ablate(acts, hook):
            acts = acts.clone()
            acts[..., f] = 0
            return acts

        with model.hooks([(f"{POINT}.sae.hook_acts", ablate)]):
            _, edited = model.run_with_cache(TOKENS, names_filter=POINT)
    write = cache[f"{POINT}.sae.hook_acts"][..., f, None] * sae.W_dec[f]
    torch.testing.assert_close(cache[POINT] - edited[POINT], write.detach())


def test_several_saes_nested_and_removed_on_error():
    model = make_model()
    a = random_sae()
    b = SparseAutoencoder(SAEConfig(32, 10, "blocks.0.mlp.hook_post", dtype="float64"))
    clean, n_points = model(TOKENS), len(model.hook_dict)
    with pytest.raises(RuntimeError, match="boom"), model.saes([a]):
        with model.saes({"blocks.0.mlp.hook_post": b}):
            logits, cache = model.run_with_cache(TOKENS)
            assert {f"{POINT}.sae.hook_acts", "blocks.0.mlp.hook_post.sae.hook_acts"} <= set(cache)
            torch.testing.assert_close(logits, clean, rtol=1e-10, atol=1e-10)
        assert "blocks.0.mlp.hook_post.sae.hook_acts" not in model.hook_dict
        assert f"{POINT}.sae.hook_acts" in model.hook_dict
        raise RuntimeError("boom")
    assert len(model.hook_dict) == n_points and not model.attached_hooks()


def test_splice_bad_input():
    model = make_model()
    with pytest.raises(ValueError, match="d_in=40.*d_model=16"):
        model.saes({POINT: SparseAutoencoder(SAEConfig(40, 8, dtype="float64"))}).__enter__()
    with pytest.raises(KeyError, match="did you mean 'blocks.1.hook_resid_pre'"):
        model.saes({"blocks.1.hook_resid_pr": random_sae()}).__enter__()
    with pytest.raises(ValueError, match="no hook_name"):
        model.saes([SparseAutoencoder(SAEConfig(16, 8, dtype="float64"))]).__enter__()
    with pytest.raises(ValueError, match="float32 but the model computes in torch.float64"):
        model.saes([SparseAutoencoder(SAEConfig(16, 8, POINT))]).__enter__()
    sae = random_sae()
    with model.saes([sae]), pytest.raises(ValueError, match="already spliced at " + POINT):
        model.saes({"blocks.0.hook_resid_pre": sae}).__enter__()
    with model.saes([sae]), pytest.raises(ValueError, match="already spliced at " + POINT):
        model.saes([random_sae()]).__enter__()  # a second SAE at the same point
    with pytest.raises(ValueError, match="already spliced at " + POINT):
        model.saes([sae, random_sae()]).__enter__()
    assert not model.attached_hooks()
