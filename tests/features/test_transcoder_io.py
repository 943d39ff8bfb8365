"""Transcoder files: SAELens's layout and circuit-tracer's, written by us and by hand from
their published formats (field and tensor names, shapes, orientations), and refused when
wrong."""

import json

import pytest
import safetensors.torch
import torch

from hookedattn.sae import (
    CrossLayerTranscoder,
    CrossLayerTranscoderConfig,
    Transcoder,
    TranscoderConfig,
    load_transcoder_set,
    save_transcoder_set,
)

G = torch.Generator().manual_seed(0)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=G).to(dtype)


def random_transcoder(
    activation="relu", skip=False, layer=0, dtype="float32", d_out=6
) -> Transcoder:
    k = {"k": 4} if activation == "topk" else {}
    hooks = f"blocks.{layer}.ln2.hook_out", f"blocks.{layer}.hook_mlp_out"
    cfg = TranscoderConfig(8, 24, d_out, *hooks, activation, skip=skip, dtype=dtype, **k)
    tc = Transcoder(cfg)
    with torch.no_grad():
        for name, p in tc.named_parameters():
            p.copy_(rand(*p.shape).abs() if name.endswith("threshold") else rand(*p.shape))
    return tc


def saelens_folder(path, architecture, tensors, **cfg):
    """A folder as SAELens 6 writes it (`TranscoderConfig.to_dict`, `save_model`)."""
    path.mkdir()
    safetensors.torch.save_file(tensors, str(path / "sae_weights.safetensors"))
    fields = {
        "d_in": 8, "d_sae": 24, "dtype": "float32", "device": "cpu",
        "apply_b_dec_to_input": False, "normalize_activations": "none",
        "reshape_activations": "none",
        "metadata": {"sae_lens_version": "6.18.0", "sae_lens_training_version": "6.18.0",
                     "model_name": "gpt2", "hook_name": "blocks.3.ln2.hook_normalized",
                     "hook_name_out": "blocks.3.hook_mlp_out", "hook_head_index": None},
        "architecture": architecture, "d_out": 6, **cfg,
    }  # fmt: skip
    (path / "cfg.json").write_text(json.dumps(fields))
    return path


# ---------------------------------------------------------------------- SAELens's layout
@pytest.mark.parametrize(
    "activation, skip", [("relu", False), ("relu", True), ("jumprelu", False), ("topk", True)]
)
def test_our_folders_load_back_as_the_same_transcoder(tmp_path, activation, skip):
    tc = random_transcoder(activation, skip)
    back = Transcoder.load(tc.save(tmp_path / "tc"))
    assert back.cfg == tc.cfg
    for (name, p), (_, q) in zip(tc.named_parameters(), back.named_parameters(), strict=True):
        assert torch.equal(p, q), name


def test_our_cfg_json_speaks_saelens(tmp_path):
    cfg = json.loads((random_transcoder("jumprelu").save(tmp_path / "tc") / "cfg.json").read_text())
    assert cfg["architecture"] == "jumprelu_transcoder"
    assert (cfg["d_in"], cfg["d_sae"], cfg["d_out"]) == (8, 24, 6)
    assert cfg["apply_b_dec_to_input"] is False and cfg["normalize_activations"] == "none"
    assert cfg["metadata"]["hook_name"] == "blocks.0.ln2.hook_out"
    assert cfg["metadata"]["hook_name_out"] == "blocks.0.hook_mlp_out"
    weights = safetensors.torch.load_file(str(tmp_path / "tc" / "sae_weights.safetensors"))
    assert {n: tuple(t.shape) for n, t in weights.items()} == {
        "W_enc": (8, 24), "b_enc": (24,), "W_dec": (24, 6), "b_dec": (6,), "threshold": (24,)
    }  # fmt: skip


def test_a_saelens_skip_transcoder_folder_computes_saelens_math(tmp_path):
    t = {"W_enc": rand(8, 24), "b_enc": rand(24), "W_dec": rand(24, 6), "b_dec": rand(6),
         "W_skip": rand(6, 8)}  # fmt: skip
    tc = Transcoder.load(saelens_folder(tmp_path / "tc", "skip_transcoder", t))
    x = rand(5, 8)
    # SkipTranscoder.forward: relu(x @ W_enc + b_enc) @ W_dec + b_dec + x @ W_skip.T
    expected = torch.relu(x @ t["W_enc"] + t["b_enc"]) @ t["W_dec"] + t["b_dec"] + x @ t["W_skip"].T
    torch.testing.assert_close(tc(x), expected)
    assert (tc.cfg.hook_name, tc.cfg.hook_name_out) == (
        "blocks.3.ln2.hook_normalized", "blocks.3.hook_mlp_out"
    )  # fmt: skip


def test_a_saelens_jumprelu_transcoder_folder_computes_saelens_math(tmp_path):
    t = {"W_enc": rand(8, 24), "b_enc": rand(24), "W_dec": rand(24, 6), "b_dec": rand(6),
         "threshold": rand(24).abs()}  # fmt: skip
    tc = Transcoder.load(saelens_folder(tmp_path / "tc", "jumprelu_transcoder", t))
    x = rand(5, 8)
    pre = x @ t["W_enc"] + t["b_enc"]  # JumpReLUTranscoder.encode: relu(pre) * (pre > threshold)
    expected = (torch.relu(pre) * (pre > t["threshold"])) @ t["W_dec"] + t["b_dec"]
    torch.testing.assert_close(tc(x), expected)


GOOD = {"W_enc": (8, 24), "b_enc": (24,), "W_dec": (24, 6), "b_dec": (6,)}


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(d_sae=24.0), "d_sae must be a positive integer, got 24.0"),
        (dict(d_sae="24"), "d_sae must be a positive integer, got '24'"),
        (dict(d_out=True), "d_out must be a positive integer, got True"),
        (dict(d_sae=10**12), r"W_enc has shape \(8, 24\), expected \(8, 1000000000000\)"),
        (dict(dtype="float64"), "W_enc is torch.float32, but the config says torch.float64"),
        (dict(dtype="int8"), "dtype 'int8' is not one of"),
        (dict(architecture="gated_transcoder"), "architecture 'gated_transcoder' is not"),
        (dict(apply_b_dec_to_input=True), "apply_b_dec_to_input is true"),
        (dict(normalize_activations="layer_norm"), "normalize_activations='layer_norm'"),
    ],
)
def test_a_bad_saelens_config_is_refused_before_anything_is_allocated(tmp_path, change, message):
    t = {name: rand(*shape) for name, shape in GOOD.items()}
    folder = saelens_folder(tmp_path / "tc", change.pop("architecture", "transcoder"), t, **change)
    with pytest.raises(ValueError, match=message):
        Transcoder.load(folder)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused(tmp_path, bad):
    t = {name: rand(*shape) for name, shape in GOOD.items()}
    t["W_dec"][3, 2] = bad
    with pytest.raises(ValueError, match="W_dec holds 1 NaN or infinite values"):
        Transcoder.load(saelens_folder(tmp_path / "tc", "transcoder", t))


@pytest.mark.parametrize(("extra", "shape"), [("W_skip", (6, 8)), ("threshold", (24,))])
def test_a_tensor_the_config_does_not_have_is_refused_not_dropped(tmp_path, extra, shape):
    # A skip transcoder or a JumpReLU one read as plain ReLU would be silently wrong.
    t = {name: rand(*s) for name, s in GOOD.items()} | {extra: rand(*shape)}
    with pytest.raises(ValueError, match=rf"holds tensors its config does not have: \['{extra}'\]"):
        Transcoder.load(saelens_folder(tmp_path / "tc", "transcoder", t))


def test_a_missing_tensor_or_file_is_named(tmp_path):
    t = {name: rand(*shape) for name, shape in GOOD.items() if name != "b_dec"}
    with pytest.raises(ValueError, match="lacks b_dec"):
        Transcoder.load(saelens_folder(tmp_path / "tc", "transcoder", t))
    with pytest.raises(ValueError, match="lacks cfg.json, sae_weights.safetensors"):
        Transcoder.load(tmp_path / "nothing")


def test_a_topk_transcoder_is_written_under_a_name_saelens_refuses(tmp_path):
    cfg = json.loads((random_transcoder("topk").save(tmp_path / "tc") / "cfg.json").read_text())
    assert cfg["architecture"] == "topk_transcoder" and cfg["k"] == 4


# ---------------------------------------------------------------------- circuit-tracer, per layer
def circuit_tracer_layer(path, layer, d_in=8, d_sae=24, d_out=8, skip=True):
    """`layer_{L}.safetensors` as circuit-tracer's `load_relu_transcoder` reads it: encoder
    `[d_sae d_in]` and decoder `[d_out d_sae]` (both transposed on load), `W_skip [d_out d_in]`."""
    t = {"W_enc": rand(d_sae, d_in), "b_enc": rand(d_sae), "W_dec": rand(d_out, d_sae),
         "b_dec": rand(d_out), **({"W_skip": rand(d_out, d_in)} if skip else {})}  # fmt: skip
    safetensors.torch.save_file(t, str(path / f"layer_{layer}.safetensors"))
    return t


def test_a_circuit_tracer_transcoder_set_computes_its_math(tmp_path):
    tensors = [circuit_tracer_layer(tmp_path, layer) for layer in range(2)]
    (tmp_path / "config.yaml").write_text(
        "# Transcoder configuration, circuit-tracer's schema\n"
        'model_name: "gpt2"\nfeature_input_hook: "ln2.hook_out"\n'
        "feature_output_hook: 'hook_mlp_out'\n\ntranscoders:\n"
        + "".join(f'  - id: "t{i}"\n    layer: {i}\n    filepath: "layer_{i}.safetensors"\n'
                  for i in (1, 0))
    )  # fmt: skip
    pytest.importorskip("yaml")
    loaded = load_transcoder_set(tmp_path)
    x = rand(5, 8)
    for layer, (tc, t) in enumerate(zip(loaded, tensors, strict=True)):
        assert tc.cfg.hook_name == f"blocks.{layer}.ln2.hook_out"
        # SingleLayerTranscoder: relu(x @ W_enc + b_enc) @ W_dec + b_dec + x @ W_skip.T
        acts = torch.relu(x @ t["W_enc"].T + t["b_enc"])
        torch.testing.assert_close(tc(x), acts @ t["W_dec"].T + t["b_dec"] + x @ t["W_skip"].T)


@pytest.mark.parametrize("activation", ["relu", "jumprelu"])
def test_a_transcoder_set_round_trips_through_circuit_tracers_layout(tmp_path, activation):
    tcs = [random_transcoder(activation, True, layer, d_out=8) for layer in (1, 0)]
    back = load_transcoder_set(save_transcoder_set(tcs, tmp_path, "gpt2"))
    x = rand(3, 8)
    for a, b in zip(sorted(tcs, key=lambda tc: tc.cfg.layer), back, strict=True):
        assert (a.cfg.hook_name, a.cfg.hook_name_out) == (b.cfg.hook_name, b.cfg.hook_name_out)
        assert b.cfg.activation == activation
        torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "tcs, message",
    [
        ([random_transcoder("topk", d_out=8)], "hold ReLU or JumpReLU transcoders"),
        ([random_transcoder(d_out=6)], "map d_model to d_model; .* d_in=8 to d_out=6"),
        ([random_transcoder(layer=1, d_out=8)], r"per layer 0..n-1; these are for layers \[1\]"),
    ],
    ids=["topk", "d_in != d_out", "not from layer 0"],
)
def test_a_set_circuit_tracer_cannot_hold_is_not_written(tmp_path, tcs, message):
    with pytest.raises(ValueError, match=message):
        save_transcoder_set(tcs, tmp_path / "set")


@pytest.mark.parametrize(
    "filepath", ["../elsewhere/layer_0.safetensors", "/tmp/layer_0.safetensors"]
)
def test_a_set_naming_a_file_outside_its_folder_is_refused(tmp_path, filepath):
    folder = tmp_path / "set"
    folder.mkdir()
    config = {"model_name": "gpt2", "feature_input_hook": "ln2.hook_out",
              "feature_output_hook": "hook_mlp_out",
              "transcoders": [{"id": "t0", "layer": 0, "filepath": filepath}]}  # fmt: skip
    (folder / "config.yaml").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="which is not a file inside"):
        load_transcoder_set(folder)


def one_layer_set(path, tensors, hub_schema=False):
    """A folder holding `layer_0.safetensors` and its config in the first schema (entries
    with a layer and a file) or the hub's (`model_kind`, no file list)."""
    safetensors.torch.save_file(tensors, str(path / "layer_0.safetensors"))
    hooks = {"feature_input_hook": "ln2.hook_out", "feature_output_hook": "hook_mlp_out"}
    entry = {"id": "t0", "layer": 0, "filepath": "layer_0.safetensors"}
    config = {"model_kind": "transcoder_set"} if hub_schema else {"transcoders": [entry]}
    (path / "config.yaml").write_text(json.dumps({"model_name": "gpt2", **hooks, **config}))
    return path


def test_a_jumprelu_layer_in_circuit_tracers_layout_computes_its_math(tmp_path):
    """Guards: a JumpReLU layer was read as ReLU. circuit-tracer's JumpReLU passes `pre`
    where `pre > threshold`; ours `relu(pre)` there: the same for thresholds >= 0, and a
    negative one is refused."""
    t = circuit_tracer_layer(tmp_path, 0) | {"activation_function.threshold": rand(24).abs()}
    (tc,) = load_transcoder_set(one_layer_set(tmp_path, t))
    assert tc.cfg.activation == "jumprelu"
    x = rand(5, 8)
    pre = x @ t["W_enc"].T + t["b_enc"]
    acts = pre * (pre > t["activation_function.threshold"])
    torch.testing.assert_close(tc(x), acts @ t["W_dec"].T + t["b_dec"] + x @ t["W_skip"].T)
    t["activation_function.threshold"][3] = -0.5
    with pytest.raises(ValueError, match=r"threshold holds 1 negative value\(s\)"):
        load_transcoder_set(one_layer_set(tmp_path, t))
    t = circuit_tracer_layer(tmp_path, 0) | {"log_thresholds": rand(24)}
    with pytest.raises(ValueError, match=r"\['log_thresholds'\]: not circuit-tracer's JumpReLU"):
        load_transcoder_set(one_layer_set(tmp_path, t))


@pytest.mark.parametrize("d_out", [8, 24], ids=["rectangular", "square"])
def test_the_config_says_how_w_dec_is_stored(tmp_path, d_out):
    """circuit-tracer 0.5 (`model_kind: transcoder_set`, no file list: the folder's
    `layer_{L}.safetensors`) stores `W_dec [d_sae d_out]`; its first schema (no
    `model_kind`) stored `[d_out d_sae]`. The config says which, square or not; a file of
    the other schema's shape is refused, not transposed on a guess."""
    t = {"W_enc": rand(24, 8), "b_enc": rand(24), "W_dec": rand(24, d_out), "b_dec": rand(d_out)}
    (tc,) = load_transcoder_set(one_layer_set(tmp_path, t, hub_schema=True))
    x = rand(5, 8)
    torch.testing.assert_close(tc(x), torch.relu(x @ t["W_enc"].T + t["b_enc"]) @ t["W_dec"]
                               + t["b_dec"])  # fmt: skip
    if d_out == 24:  # the first schema reads the same square file transposed
        (first,) = load_transcoder_set(one_layer_set(tmp_path, t))
        torch.testing.assert_close(first.W_dec, t["W_dec"].T)
        return
    with pytest.raises(ValueError, match=r"W_dec has shape \(24, 8\); .* first schema .* "
                       r"\[d_out d_sae\] = \(8, 24\).*that is how circuit-tracer 0.5"):  # fmt: skip
        load_transcoder_set(one_layer_set(tmp_path, t))


def test_the_two_schemas_list_their_files_each_its_own_way(tmp_path):
    t = circuit_tracer_layer(tmp_path, 0)
    hooks = {"feature_input_hook": "mlp.hook_in", "feature_output_hook": "mlp.hook_out"}
    entry = {"id": "t0", "layer": 0, "filepath": "layer_0.safetensors"}
    for config, message in [
        ({"model_kind": "transcoder_set", "transcoders": [entry]}, "each transcoder is a file"),
        ({"transcoders": ["layer_0.safetensors"]}, "each transcoder is a mapping"),
        ({}, "no model_kind .* needs a non-empty list 'transcoders'"),
        ({"model_kind": "sae"}, "model_kind 'sae' is not circuit-tracer's"),
        ({"model_kind": "cross_layer_transcoder"}, "CrossLayerTranscoder.load"),
    ]:
        (tmp_path / "config.yaml").write_text(json.dumps({**hooks, **config}))
        with pytest.raises(ValueError, match=message):
            load_transcoder_set(tmp_path)
    (tmp_path / "config.yaml").write_text(json.dumps({**hooks, "transcoders": [entry]}))
    (tc,) = load_transcoder_set(tmp_path)  # circuit-tracer's hook names, read as ours
    assert (tc.cfg.hook_name, tc.cfg.hook_name_out) == ("blocks.0.ln2.hook_out",
                                                        "blocks.0.hook_mlp_out")  # fmt: skip
    torch.testing.assert_close(tc.W_dec, t["W_dec"].T)


def test_a_local_set_naming_files_on_the_hub_says_how_to_fetch_them(tmp_path):
    uri = "hf://google/gemma-scope-2b-pt-transcoders/layer_0/params.npz"
    config = {"model_kind": "transcoder_set", "feature_input_hook": "ln2.hook_out",
              "feature_output_hook": "hook_mlp_out", "transcoders": [uri]}  # fmt: skip
    (tmp_path / "config.yaml").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"a file on the hub.*TranscoderSet.from_pretrained"):
        load_transcoder_set(tmp_path)


# ---------------------------------------------------------------------- circuit-tracer, cross-layer
def clt_folder(path, n=3, d_in=8, d_sae=24, d_out=8, jumprelu=False):
    """A CLT folder as circuit-tracer's `CrossLayerTranscoder.to_safetensors` writes it."""
    path.mkdir()
    t = {}
    for i in range(n):
        enc = {
            f"W_enc_{i}": rand(d_sae, d_in),
            f"b_enc_{i}": rand(d_sae),
            f"b_dec_{i}": rand(d_out),
        }
        if jumprelu:
            enc[f"threshold_{i}"] = rand(d_sae).abs()
        dec = {f"W_dec_{i}": rand(d_sae, n - i, d_out)}
        safetensors.torch.save_file(enc, str(path / f"W_enc_{i}.safetensors"))
        safetensors.torch.save_file(dec, str(path / f"W_dec_{i}.safetensors"))
        t.update(enc | dec)
    return t


def clt_math(t, x, n, jumprelu):
    """circuit-tracer's CLT: features `einsum("lbd,lfd->lbf")`, each layer's decoders
    `W_dec_i[:, j]` writing to layer `i + j`, plus `b_dec`."""
    acts = []
    for i in range(n):
        pre = x[i] @ t[f"W_enc_{i}"].T + t[f"b_enc_{i}"]
        acts.append(pre * (pre > t[f"threshold_{i}"]) if jumprelu else torch.relu(pre))
    out = []
    for layer in range(n):
        recon = t[f"b_dec_{layer}"] + sum(
            acts[i] @ t[f"W_dec_{i}"][:, layer - i] for i in range(layer + 1)
        )
        out.append(recon)
    return torch.stack(out)


@pytest.mark.parametrize("jumprelu", [False, True])
def test_a_circuit_tracer_clt_folder_computes_its_math(tmp_path, jumprelu):
    t = clt_folder(tmp_path / "clt", jumprelu=jumprelu)
    clt = CrossLayerTranscoder.load(tmp_path / "clt")
    assert clt.cfg.activation == ("jumprelu" if jumprelu else "relu")
    assert clt.cfg.feature_input_hook == "hook_resid_mid"  # circuit-tracer's default
    x = rand(3, 5, 8)
    torch.testing.assert_close(clt(x), clt_math(t, x, 3, jumprelu))


def test_a_clt_round_trips_and_keeps_its_hooks(tmp_path):
    cfg = CrossLayerTranscoderConfig(2, 8, 24, 8, "topk", 4, dtype="float64", seed=3)
    clt = CrossLayerTranscoder(cfg)
    back = CrossLayerTranscoder.load(clt.save(tmp_path / "clt", "gpt2"))
    assert back.cfg == cfg
    x = rand(2, 3, 8, dtype=torch.float64)
    torch.testing.assert_close(back(x), clt(x), rtol=0, atol=0)


def test_a_damaged_clt_folder_is_refused(tmp_path):
    clt_folder(tmp_path / "clt")
    (tmp_path / "clt" / "W_dec_2.safetensors").unlink()
    with pytest.raises(ValueError, match="W_dec_2.safetensors does not exist"):
        CrossLayerTranscoder.load(tmp_path / "clt")
    clt_folder(tmp_path / "wrong")
    safetensors.torch.save_file(
        {"W_dec_1": rand(24, 3, 8)}, str(tmp_path / "wrong" / "W_dec_1.safetensors")
    )
    with pytest.raises(ValueError, match=r"W_dec_1 has shape \(24, 3, 8\), expected \(24, 2, 8\)"):
        CrossLayerTranscoder.load(tmp_path / "wrong")
    with pytest.raises(ValueError, match="is not a cross-layer transcoder folder"):
        CrossLayerTranscoder.load(tmp_path / "nothing")
