"""SAE files read strictly, and SAELens's format honoured; an SAE with a non-finite
parameter is refused when loaded and when spliced.

The SAELens folders here are written by hand from SAELens's published on-disk format
(`cfg.json` + `sae_weights.safetensors`, the 6.x field names), and each expected output is
SAELens's computation written out in the test; SAELens itself is not needed.
"""

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

from hookedattn.sae import SAEConfig, SparseAutoencoder
from hookedattn.testing import random_tiny_model

POINT = "blocks.0.hook_resid_pre"
D_IN, D_SAE = 16, 24


def tensors(seed: int = 0, **overrides) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t = {
        "W_enc": torch.randn(D_IN, D_SAE, generator=g, dtype=torch.float64),
        "W_dec": torch.randn(D_SAE, D_IN, generator=g, dtype=torch.float64),
        "b_enc": torch.randn(D_SAE, generator=g, dtype=torch.float64),
        "b_dec": torch.randn(D_IN, generator=g, dtype=torch.float64),
    }
    return {**t, **overrides}


def folder(path: Path, weights: dict, **cfg) -> Path:
    path.mkdir(parents=True)
    safetensors.torch.save_file(weights, str(path / "sae_weights.safetensors"))
    fields = {"architecture": "standard", "d_in": D_IN, "d_sae": D_SAE, "dtype": "float64",
              "apply_b_dec_to_input": True, "normalize_activations": "none",
              "metadata": {"hook_name": POINT, "sae_lens_version": "6.54.12"}}  # fmt: skip
    (path / "cfg.json").write_text(json.dumps({**fields, **cfg}))
    return path


class NeverBuilt(SparseAutoencoder):
    """An SAE class whose construction fails the test: nothing may be allocated."""

    def __init__(self, cfg):
        raise AssertionError("the SAE was built before its file was checked")


# ------------------------------------------------------------------ cfg.json numbers
@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"architecture": "topk", "k": 16.7}, r"k must be an int, got 16.7"),
        ({"architecture": "topk", "k": True}, r"k must be an int, got True"),
        ({"d_in": 64.9}, r"d_in must be an int, got 64.9"),
        ({"d_sae": "24"}, r"d_sae must be an int, got '24'"),
        ({"architecture": "topk", "activation_fn_kwargs": {"k": 2.5}}, r"k must be an int"),
        ({"apply_b_dec_to_input": "yes"}, r"apply_b_dec_to_input must be true or false"),
    ],
)
def test_cfg_json_numbers_are_never_rounded(tmp_path, fields, named):
    """Guards: k=16.7 loaded as 16, k=true as 1, d_in=64.9 as 64."""
    path = folder(tmp_path / "s", tensors(), **fields)
    with pytest.raises(ValueError, match=named):
        NeverBuilt.load(path)


# ------------------------------------------------------------------ weights
@pytest.mark.parametrize(
    ("name", "value"),
    [("W_enc", float("nan")), ("b_dec", float("inf")), ("threshold", float("nan"))],
)
def test_non_finite_weights_and_thresholds_are_refused_on_load(tmp_path, name, value):
    """Guards: NaN or inf weights and a NaN JumpReLU threshold loaded and spliced silently."""
    weights = tensors(threshold=torch.rand(D_SAE, dtype=torch.float64))
    weights[name].view(-1)[3] = value
    path = folder(tmp_path / "s", weights, architecture="jumprelu")
    with pytest.raises(ValueError, match=rf"{name} holds 1 non-finite value"):
        NeverBuilt.load(path)


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.int64])
def test_integer_and_bool_weights_are_refused_not_cast(tmp_path, dtype):
    """Guards: integer or bool weights were cast to float without a word."""
    path = folder(tmp_path / "s", tensors(W_dec=torch.ones(D_SAE, D_IN, dtype=dtype)))
    with pytest.raises(ValueError, match=rf"W_dec is {dtype}, not floating point"):
        NeverBuilt.load(path)


def test_a_huge_d_sae_with_small_weights_is_refused_before_anything_is_allocated(tmp_path):
    """Guards: d_sae=10**7 with weights for 24 built a gigabyte SAE before the shape check."""
    path = folder(tmp_path / "s", tensors(), d_sae=10**7)
    with pytest.raises(ValueError, match=r"W_enc has shape \(16, 24\), expected \(16, 10000000\)"):
        NeverBuilt.load(path)
    (tmp_path / "s" / "cfg.json").write_text(json.dumps({"d_in": 16, "d_sae": 10**12}))
    with pytest.raises(ValueError, match=r"d_sae must be an int in 1..268,435,456"):
        NeverBuilt.load(path)


def test_an_sae_too_large_for_memory_names_its_sizes():
    """Guards: the allocator's message (or an OverflowError) named no field."""
    with pytest.raises(MemoryError, match=r"d_in=268,435,456 and d_sae=268,435,456 .* GiB"):
        SparseAutoencoder(SAEConfig(1 << 28, 1 << 28))


def test_an_unexpected_tensor_is_refused(tmp_path):
    """Guards: extra tensors (another architecture's) were ignored; SAELens refuses them."""
    path = folder(tmp_path / "s", tensors(b_gate=torch.zeros(D_SAE, dtype=torch.float64)))
    with pytest.raises(ValueError, match=r"holds tensors this SAE does not have: \['b_gate'\]"):
        NeverBuilt.load(path)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"hook_head_index": 2}, r"hook_head_index=2 .* not supported"),
        ({"activation_fn": "tanh-relu"}, r"activation_fn 'tanh-relu' .* not supported"),
        ({"reshape_activations": "hook_q"}, r"reshape_activations='hook_q' is not supported"),
        ({"architecture": "jumprelu", "rescale_acts_by_decoder_norm": True}, r"a TopK option"),
    ],
)
def test_fields_that_change_the_computation_are_honoured_or_refused(tmp_path, fields, named):
    """Guards: fields SAELens applies were ignored, computing another SAE."""
    weights = tensors(threshold=torch.rand(D_SAE, dtype=torch.float64))
    if fields.get("architecture") != "jumprelu":
        weights.pop("threshold")
    with pytest.raises(ValueError, match=named):
        NeverBuilt.load(folder(tmp_path / "s", weights, **fields))


def test_splicing_an_sae_with_a_nan_weight_is_refused():
    """Guards: an SAE with NaN weights built in memory spliced without a word."""
    model = random_tiny_model()
    sae = SparseAutoencoder(SAEConfig(model.cfg.d_model, 8, POINT, dtype="float64"))
    with torch.no_grad():
        sae.b_enc[2] = float("nan")
    with pytest.raises(ValueError, match=r"1 non-finite value\(s\) in b_enc"), model.saes([sae]):
        pass


# ------------------------------------------------------------------ SAELens compatibility
def test_a_topk_sae_with_rescaled_activations_computes_what_saelens_does(tmp_path):
    """Guards: rescale_acts_by_decoder_norm=True loaded without a word and computed another
    SAE. SAELens: pre = (x - b_dec) W_enc + b_enc; acts = topk(pre * |W_dec[f]|);
    recons = (acts / |W_dec[f]|) W_dec + b_dec."""
    t = tensors(seed=1)
    path = folder(tmp_path / "s", t, architecture="topk", k=4, rescale_acts_by_decoder_norm=True)
    sae = SparseAutoencoder.load(path)
    x = torch.randn(6, D_IN, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    norms = t["W_dec"].norm(dim=-1)
    pre = ((x - t["b_dec"]) @ t["W_enc"] + t["b_enc"]) * norms
    values, index = pre.topk(4, dim=-1)
    acts = torch.zeros_like(pre).scatter(-1, index, values.relu())
    recons = (acts / norms) @ t["W_dec"] + t["b_dec"]
    torch.testing.assert_close(sae.encode(x), acts, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sae(x), recons, rtol=1e-12, atol=1e-12)


def test_an_untied_pre_bias_saves_only_saelens_tensors_in_the_saelens_file(tmp_path):
    """Guards: the weights file held b_pre, which SAELens refuses (`Unexpected key(s) in
    state_dict: "b_pre"`). The folder must mean the same SAE read SAELens's way, and the
    same SAE (b_pre included) read ours."""
    sae = SparseAutoencoder(SAEConfig(D_IN, D_SAE, POINT, pre_bias="untied", dtype="float64"))
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(5), dtype=p.dtype))
    path = sae.save(tmp_path / "s")
    stored = safetensors.torch.load_file(str(path / "sae_weights.safetensors"))
    assert sorted(stored) == ["W_dec", "W_enc", "b_dec", "b_enc"]
    cfg = json.loads((path / "cfg.json").read_text())
    assert cfg["apply_b_dec_to_input"] is False and cfg["architecture"] == "standard"
    x = torch.randn(4, D_IN, dtype=torch.float64)
    saelens = (x @ stored["W_enc"] + stored["b_enc"]).relu() @ stored["W_dec"] + stored["b_dec"]
    torch.testing.assert_close(saelens, sae(x), rtol=1e-12, atol=1e-12)
    loaded = SparseAutoencoder.load(path)
    assert loaded.cfg == sae.cfg
    torch.testing.assert_close(loaded.pre_bias.b_pre, sae.pre_bias.b_pre, rtol=0, atol=0)


@pytest.mark.parametrize("older", [False, True], ids=["saelens-6", "before-6"])
def test_a_hook_z_sae_reads_the_heads_flattened_when_spliced(tmp_path, older):
    """Guards: reshape_activations="hook_z" was ignored on load. SAELens flattens the heads'
    z `[head d_head]` into d_in, and splits its output back; before 6.0 a hook_z point
    implied it."""
    model = random_tiny_model(dtype=torch.float64)
    d_in, point = model.cfg.n_heads * model.cfg.d_head, "blocks.0.attn.hook_z"
    t = tensors(seed=3)
    t = {k: v[..., :d_in] if k in ("W_dec", "b_dec") else v for k, v in t.items()}
    t["W_enc"] = torch.randn(d_in, D_SAE, dtype=torch.float64)
    fields = {"d_in": d_in, "metadata": {"hook_name": point, "sae_lens_version": "6.54.12"}}
    if older:
        fields = {"d_in": d_in, "hook_name": point, "metadata": {}}
    else:
        fields["reshape_activations"] = "hook_z"
    sae = SparseAutoencoder.load(folder(tmp_path / "s", t, **fields))
    assert sae.cfg.reshape_activations == "hook_z"
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 5))
    _, clean = model.run_with_cache(tokens, names_filter=point)
    with model.saes([sae], use_error_term=False):
        _, spliced = model.run_with_cache(tokens, names_filter=point)
    flat = clean[point].flatten(-2)
    expected = ((flat - t["b_dec"]) @ t["W_enc"] + t["b_enc"]).relu() @ t["W_dec"] + t["b_dec"]
    torch.testing.assert_close(
        spliced[point], expected.unflatten(-1, (model.cfg.n_heads, -1)), rtol=1e-12, atol=1e-12
    )
    saved = json.loads((sae.save(tmp_path / "again") / "cfg.json").read_text())
    assert saved["reshape_activations"] == "hook_z"
