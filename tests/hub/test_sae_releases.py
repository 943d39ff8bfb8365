"""SAEs by SAELens's release names and circuit-tracer transcoder sets by repo id or preset,
served by the local hub (`helpers.hub`): what is fetched (only that SAE's files), what the
files mean (each written by hand in its published layout and compared with the math written
out), that the loaded SAE or set splices exactly, offline use, and the errors.

SAELens's and circuit-tracer's own code is not needed: the expected values are their
computations written out here.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
from helpers.hub import folder_files, go_offline

from hookedattn.core.hub import GatedModelError, NotCachedError
from hookedattn.sae import (
    SAEConfig,
    SparseAutoencoder,
    TranscoderSet,
    list_sae_releases,
    register_sae_release,
    register_transcoder_preset,
    replaced,
    transcoder_presets,
    unregister_sae_release,
    unregister_transcoder_preset,
)
from hookedattn.testing import random_tiny_model, random_tokens

REPO = "org/tiny-saes"
RELEASE = "tiny-res-test"
TOKENS = random_tokens(32, 2, 6, seed=3)
# A transcoder set's hooks in its config.yaml: the MLP's input and output, within a block.
HOOKS = "feature_input_hook: ln2.hook_out\nfeature_output_hook: hook_mlp_out\n"


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.fixture
def release():
    """A release registered for the test: two SAE folders of `REPO`, removed after."""
    saes = {"blocks.0.hook_resid_pre": "res/blocks.0.hook_resid_pre",
            "blocks.1.hook_resid_pre": "res/blocks.1.hook_resid_pre"}  # fmt: skip
    yield register_sae_release(RELEASE, REPO, saes, model="tiny")
    unregister_sae_release(RELEASE)


def tiny_sae(point: str, seed: int) -> SparseAutoencoder:
    sae = SparseAutoencoder(SAEConfig(16, 24, point, "topk", k=5, dtype="float64", seed=seed))
    with torch.no_grad():
        for p in sae.parameters():
            p.add_(0.1 * randn(*p.shape, seed=seed + 1))
    return sae


def serve_saes(hub, tmp_path: Path) -> dict[str, SparseAutoencoder]:
    saes = {p: tiny_sae(p, seed=i) for i, p in enumerate(["blocks.0.hook_resid_pre",
                                                          "blocks.1.hook_resid_pre"])}  # fmt: skip
    files = {"README.md": b"# tiny SAEs\n"}
    for point, sae in saes.items():
        folder = sae.save(tmp_path / point)
        files |= {f"res/{point}/{n}": b for n, b in folder_files(folder).items()}
        files[f"res/{point}/sparsity.safetensors"] = b"not read"
    hub.add_files(REPO, files)
    return saes


def spliced_by_hand(model, point: str, reconstruct) -> torch.Tensor:
    """The model's logits with the activation at `point` replaced by `reconstruct(x)`."""
    with model.hooks([(point, lambda x, hook: reconstruct(x))]):
        return model(TOKENS)


# ---------------------------------------------------------------------- the registry
def test_the_shipped_registry_holds_saelens_releases_with_their_hooks():
    jb = list_sae_releases(release="gpt2-small-res-jb")
    assert len(jb) == 13 and {e.repo_id for e in jb} == {"jbloom/GPT2-Small-SAEs-Reformatted"}
    assert [e.hook for e in jb[:2]] == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"]
    assert jb[8].neuronpedia == "gpt2-small/8-res-jb" and jb[8].format == "saelens"
    (res,) = [e for e in list_sae_releases(release="gemma-scope-2b-pt-res")
              if e.sae_id == "layer_12/width_16k/average_l0_82"]  # fmt: skip
    assert (res.format, res.hook, res.width, res.path) == (
        "gemma_scope", "blocks.12.hook_resid_post", 16384, "layer_12/width_16k/average_l0_82"
    )  # fmt: skip
    att = list_sae_releases(release="gemma-scope-2b-pt-att")[0]
    assert att.hook == f"blocks.{att.path.split('/')[0][6:]}.attn.hook_z"
    assert list_sae_releases(release="gemma-scope-2b-pt-res")[0].hook == "hook_embed"
    mlp = list_sae_releases(release="gemma-scope-2-1b-pt-mlp")[0]
    assert (mlp.format, mlp.hook) == ("gemma_scope_2", "blocks.13.hook_mlp_out")
    assert {e.kind for e in list_sae_releases(release="gemma-scope-2b-pt-transcoders")} == {
        "transcoder"
    }
    everything = list_sae_releases()
    assert len(everything) > 13_000
    assert len({(e.release, e.sae_id) for e in everything}) == len(everything)
    for e in everything:  # every SAE we would load says where it reads
        if e.format in ("gemma_scope", "gemma_scope_2") and e.kind == "sae":
            assert e.hook is not None, e


def test_searching_by_model_and_hook():
    found = list_sae_releases(model="gemma-2-2b", hook="blocks.12.hook_resid_post")
    assert found and all(e.hook == "blocks.12.hook_resid_post" for e in found)
    assert {"gemma-scope-2b-pt-res", "gemma-scope-2b-pt-res-canonical"} <= {
        e.release for e in found
    }
    # the model's name with or without its org, in any case
    assert list_sae_releases(model="GOOGLE/gemma-3-1b-pt", hook="blocks.13.hook_resid_post")
    assert list_sae_releases(model="no-such-model") == []


def release_script():
    """`scripts/sae_releases.py`, which writes releases.json, as a module."""
    import importlib.util

    script = Path(__file__).resolve().parents[2] / "scripts" / "sae_releases.py"
    spec = importlib.util.spec_from_file_location("sae_releases_script", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_shipped_registry_is_what_the_sae_lens_wheel_gives():
    """Run where an sae-lens wheel (or its pretrained_saes.yaml) has been downloaded
    (`pip download sae-lens --no-deps -d /tmp/sl`) and named by SAE_LENS_WHEEL; the tests
    download nothing."""
    import os

    source = os.environ.get("SAE_LENS_WHEEL")
    if not source:
        pytest.skip("SAE_LENS_WHEEL names no sae-lens wheel (pip download sae-lens --no-deps)")
    assert release_script().main([source, "--check"]) == 0


def test_the_conversion_of_saelens_yaml():
    """The script that writes releases.json, on a hand-written piece of SAELens's yaml."""
    yaml = pytest.importorskip("yaml")
    module = release_script()
    registry = yaml.safe_load("""
gpt2-small-res-jb:
  conversion_func: null
  links: {model: https://huggingface.co/gpt2}
  model: gpt2-small
  repo_id: jbloom/GPT2-Small-SAEs-Reformatted
  config_overrides: {model_from_pretrained_kwargs: {center_writing_weights: true}}
  saes:
  - id: blocks.0.hook_resid_pre
    path: blocks.0.hook_resid_pre
    l0: 10.0
    neuronpedia: gpt2-small/0-res-jb
    variance_explained: 0.999
gemma-scope-2b-pt-transcoders:
  conversion_func: gemma_2_transcoder
  model: gemma-2-2b
  repo_id: google/gemma-scope-2b-pt-transcoders
  saes:
  - {id: layer_0/width_16k/average_l0_76, path: layer_0/width_16k/average_l0_76, l0: 76}
mntss-clt:
  conversion_func: mntss_clt_layer_transcoder
  model: gemma-2-2b
  repo_id: mntss/clt-gemma-2-2b-2.5M
  saes:
  - {id: layer_0, path: 0, neuronpedia: gemma-2-2b/0-clt-hp, stray: ignored}
""")
    data = module.convert(registry, {"package": "sae-lens", "version": "0"})
    assert data["releases"]["gpt2-small-res-jb"] == {
        "repo_id": "jbloom/GPT2-Small-SAEs-Reformatted", "model": "gpt2-small",
        "format": "saelens", "kind": "sae",
        "config_overrides": {"model_from_pretrained_kwargs": {"center_writing_weights": True}},
        "saes": [["blocks.0.hook_resid_pre", None, "gpt2-small/0-res-jb", 10.0]],
    }  # fmt: skip
    transcoders = data["releases"]["gemma-scope-2b-pt-transcoders"]
    assert (transcoders["format"], transcoders["kind"]) == ("gemma_2_transcoder", "transcoder")
    assert transcoders["saes"] == [["layer_0/width_16k/average_l0_76", None, None, 76]]
    assert data["releases"]["mntss-clt"]["saes"] == [["layer_0", "0", "gemma-2-2b/0-clt-hp"]]
    assert json.loads(module.render(data)) == data  # one SAE a line, the same data


# ---------------------------------------------------------------------- SAELens's folders
def test_an_saelens_sae_loads_by_release_name_fetching_only_its_folder(hub, tmp_path, release):
    saes = serve_saes(hub, tmp_path)
    sae = SparseAutoencoder.from_pretrained(RELEASE, "blocks.1.hook_resid_pre")
    assert sorted(hub.fetched()) == [
        "res/blocks.1.hook_resid_pre/cfg.json",
        "res/blocks.1.hook_resid_pre/sae_weights.safetensors",
    ]
    original = saes["blocks.1.hook_resid_pre"]
    assert sae.cfg == original.cfg
    for name, p in original.state_dict().items():
        assert torch.equal(sae.state_dict()[name], p), name
    # spliced, it is the SAE: the same logits as the reconstruction written into the model
    model = random_tiny_model()
    point = "blocks.1.hook_resid_pre"
    W_enc, b_enc, W_dec, b_dec = (getattr(original, n).detach() for n in
                                  ("W_enc", "b_enc", "W_dec", "b_dec"))  # fmt: skip

    def reconstruct(x):
        pre = (x - b_dec) @ W_enc + b_enc
        keep = pre >= pre.topk(5, dim=-1).values[..., -1:]
        return torch.where(keep, pre, 0.0).clamp(min=0) @ W_dec + b_dec

    with model.saes([sae], use_error_term=False):
        logits = model(TOKENS)
    torch.testing.assert_close(
        logits, spliced_by_hand(model, point, reconstruct), rtol=0, atol=1e-12
    )


def test_a_repo_id_is_read_as_saelens_reads_it(hub, tmp_path):
    """A name that is no release but a repo id: SAELens's layout, the SAE id the folder."""
    saes = serve_saes(hub, tmp_path)
    sae = SparseAutoencoder.from_pretrained(REPO, "res/blocks.0.hook_resid_pre", dtype="float32")
    assert sae.dtype == torch.float32 and sae.cfg.dtype == "float32"
    torch.testing.assert_close(sae.W_enc, saes["blocks.0.hook_resid_pre"].W_enc.float())


def test_a_release_loads_offline_from_the_cache_without_a_request(
    hub, tmp_path, release, monkeypatch
):
    serve_saes(hub, tmp_path)
    first = SparseAutoencoder.from_pretrained(RELEASE, "blocks.0.hook_resid_pre")
    go_offline(monkeypatch)
    hub.forget_requests()
    again = SparseAutoencoder.from_pretrained(RELEASE, "blocks.0.hook_resid_pre")
    assert hub.requests == []
    torch.testing.assert_close(again.W_dec, first.W_dec, rtol=0, atol=0)
    # Another SAE of the same repo was never fetched: the cache cannot give it.
    with pytest.raises(NotCachedError, match=r"not in the hub cache.*HF_HUB_OFFLINE=1"):
        SparseAutoencoder.from_pretrained(RELEASE, "blocks.1.hook_resid_pre")


def saelens_folder_files(cfg: dict, tensors: dict[str, torch.Tensor], tmp_path: Path) -> dict:
    """`cfg.json` + `sae_weights.safetensors` as SAELens writes them."""
    safetensors.torch.save_file(tensors, str(tmp_path / "w.safetensors"))
    return {
        "cfg.json": json.dumps(cfg),
        "sae_weights.safetensors": (tmp_path / "w.safetensors").read_bytes(),
    }


def test_a_releases_norm_scaling_factor_and_config_overrides_are_applied(hub, tmp_path):
    """Two real releases: `gpt2-small-mlp-tm` normalises its inputs by a factor SAELens keeps
    in its registry (folded into the weights on load, as SAELens folds it), and
    `mistral-7b-res-wg` overrides `normalize_activations` with a run-time rescaling we refuse."""
    (tm,) = [e for e in list_sae_releases(release="gpt2-small-mlp-tm")
             if e.sae_id == "blocks.0.hook_mlp_out"]  # fmt: skip
    t = {"W_enc": randn(16, 24, seed=1), "W_dec": randn(24, 16, seed=2),
         "b_enc": randn(24, seed=3), "b_dec": randn(16, seed=4)}  # fmt: skip
    cfg = {"architecture": "standard", "d_in": 16, "d_sae": 24, "dtype": "float64",
           "hook_name": "blocks.0.hook_mlp_out", "apply_b_dec_to_input": True,
           "normalize_activations": "expected_average_only_in"}  # fmt: skip
    files = saelens_folder_files(cfg, t, tmp_path)
    hub.add_files(tm.repo_id, {f"{tm.path}/{n}": b for n, b in files.items()})
    sae = SparseAutoencoder.from_pretrained(tm.release, tm.sae_id)
    s = tm.norm_scaling_factor
    assert s == pytest.approx(1.0493, abs=1e-4)
    x = randn(3, 16, seed=5)
    # SAELens: the input times the factor, through the SAE, the output divided by it
    acts = torch.relu((x * s - t["b_dec"]) @ t["W_enc"] + t["b_enc"])
    torch.testing.assert_close(sae(x), (acts @ t["W_dec"] + t["b_dec"]) / s, rtol=0, atol=1e-12)

    (wg,) = list_sae_releases(release="mistral-7b-res-wg")[:1]
    cfg["normalize_activations"] = "none"
    files = saelens_folder_files(cfg, t, tmp_path)
    hub.add_files(wg.repo_id, {f"{wg.path}/{n}": b for n, b in files.items()})
    with pytest.raises(ValueError, match=r"normalize_activations='constant_norm_rescale'"):
        SparseAutoencoder.from_pretrained(wg.release, wg.sae_id)


# ---------------------------------------------------------------------- Gemma Scope
def gemma_scope_arrays(d_in: int, d_sae: int, seed: int) -> dict[str, np.ndarray]:
    t = {"W_enc": randn(d_in, d_sae, seed=seed), "W_dec": randn(d_sae, d_in, seed=seed + 1),
         "b_enc": randn(d_sae, seed=seed + 2), "b_dec": randn(d_in, seed=seed + 3),
         "threshold": randn(d_sae, seed=seed + 4).abs()}  # fmt: skip
    return {k: v.numpy() for k, v in t.items()}


def jumprelu_reference(arrays, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gemma Scope's JumpReLU SAE (Lieberum et al. 2024, its reference code), written out:
    `acts = relu(pre) * (pre > threshold)`, `pre = x @ W_enc + b_enc` (no pre-bias)."""
    t = {k: torch.from_numpy(v) for k, v in arrays.items()}
    pre = x @ t["W_enc"] + t["b_enc"]
    acts = torch.relu(pre) * (pre > t["threshold"])
    return acts, acts @ t["W_dec"] + t["b_dec"]


def test_a_gemma_scope_params_npz_loads_and_splices_exactly(hub, tmp_path):
    """The real release name (`gemma-scope-2b-pt-res-canonical`) and its folder, served
    by the test hub with a tiny `params.npz`."""
    (entry,) = [e for e in list_sae_releases(release="gemma-scope-2b-pt-res-canonical")
                if e.sae_id == "layer_1/width_16k/canonical"]  # fmt: skip
    arrays = gemma_scope_arrays(16, 24, seed=5)
    np.savez(tmp_path / "params.npz", **arrays)
    params = (tmp_path / "params.npz").read_bytes()
    other = "layer_0/width_16k/average_l0_105/params.npz"
    hub.add_files(entry.repo_id, {f"{entry.path}/params.npz": params, other: b"other"})
    sae = SparseAutoencoder.from_pretrained(entry.release, entry.sae_id)
    assert hub.fetched() == [f"{entry.path}/params.npz"]
    c = sae.cfg
    assert (c.hook_name, c.activation, c.pre_bias, c.d_in, c.d_sae, c.dtype) == (
        "blocks.1.hook_resid_post", "jumprelu", "none", 16, 24, "float64"
    )  # fmt: skip
    x = randn(3, 16, seed=9) * 3
    acts, recons = jumprelu_reference(arrays, x)
    assert 0 < int((acts > 0).sum()) < acts.numel()  # some features are cut by their threshold
    torch.testing.assert_close(sae.encode(x), acts, rtol=0, atol=1e-12)
    torch.testing.assert_close(sae.decode(sae.encode(x)), recons, rtol=0, atol=1e-12)
    model = random_tiny_model()
    with model.saes([sae], use_error_term=False):
        logits = model(TOKENS)
    by_hand = spliced_by_hand(model, c.hook_name, lambda x: jumprelu_reference(arrays, x)[1])
    torch.testing.assert_close(logits, by_hand, rtol=0, atol=1e-12)


def test_gemma_scope_2_and_attention_saes(hub, tmp_path):
    """Gemma Scope 2's `params.safetensors` (lower-case `w_enc`, `w_dec`), and a Gemma Scope
    attention SAE, which reads the heads' z flattened."""
    arrays = gemma_scope_arrays(16, 24, seed=7)
    stored = {("w" + k[1:] if k.startswith("W_") else k): torch.from_numpy(v)
              for k, v in arrays.items()}  # fmt: skip
    path = "mlp_out/layer_0_width_16k_l0_small"
    safetensors.torch.save_file(stored, str(tmp_path / "params.safetensors"))
    hub.add_files("org/scope-2", {f"{path}/params.safetensors":
                                  (tmp_path / "params.safetensors").read_bytes()})  # fmt: skip
    register_sae_release("tiny-scope-2", "org/scope-2", {"mlp0": path}, format="gemma_scope_2")
    try:
        sae = SparseAutoencoder.from_pretrained("tiny-scope-2", "mlp0")
    finally:
        unregister_sae_release("tiny-scope-2")
    assert sae.cfg.hook_name == "blocks.0.hook_mlp_out"
    x = randn(2, 16, seed=1) * 3
    torch.testing.assert_close(sae(x), jumprelu_reference(arrays, x)[1], rtol=0, atol=1e-12)

    (att,) = [e for e in list_sae_releases(release="gemma-scope-2b-pt-att-canonical")
              if e.sae_id == "layer_0/width_16k/canonical"]  # fmt: skip
    np.savez(tmp_path / "att.npz", **gemma_scope_arrays(16, 24, seed=8))  # 4 heads of 4
    hub.add_files(att.repo_id, {f"{att.path}/params.npz": (tmp_path / "att.npz").read_bytes()})
    sae = SparseAutoencoder.from_pretrained(att.release, att.sae_id)
    assert (sae.cfg.hook_name, sae.cfg.reshape_activations) == ("blocks.0.attn.hook_z", "hook_z")
    model = random_tiny_model()
    with model.saes([sae]):  # fits the point: [batch pos head d_head], flattened
        torch.testing.assert_close(model(TOKENS), model(TOKENS), rtol=0, atol=0)


# ---------------------------------------------------------------------- errors
def test_unknown_names_are_refused_naming_the_close_ones(release):
    with pytest.raises(
        KeyError, match=r"no SAE release 'gpt2-small-res-jv'; close: gpt2-small-res-jb"
    ):
        SparseAutoencoder.from_pretrained("gpt2-small-res-jv", "blocks.8.hook_resid_pre")
    with pytest.raises(KeyError, match=r"list_sae_releases"):
        SparseAutoencoder.from_pretrained("nothing-like-it", "x")
    with pytest.raises(
        KeyError, match=r"has no SAE 'blocks.8.hook_resid_pr'; close: blocks.8.hook_"
    ):
        SparseAutoencoder.from_pretrained("gpt2-small-res-jb", "blocks.8.hook_resid_pr")
    with pytest.raises(ValueError, match=r"'llama_scope' files.*save_model\('folder'\)"):
        SparseAutoencoder.from_pretrained("llama_scope_lxr_8x", "l0r_8x")
    with pytest.raises(ValueError, match=r"holds transcoders.*TranscoderSet.from_pretrained"):
        SparseAutoencoder.from_pretrained("gemma-scope-2b-pt-transcoders",
                                          "layer_0/width_16k/average_l0_76")  # fmt: skip
    with pytest.raises(ValueError, match=r"dtype must be one of"):
        SparseAutoencoder.from_pretrained(RELEASE, "blocks.0.hook_resid_pre", dtype="int8")
    with pytest.raises(ValueError, match=r"release 'gpt2-small-res-jb' exists"):
        register_sae_release("gpt2-small-res-jb", REPO, {"a": "b"})


def test_a_gated_repo_and_an_empty_cache_offline_are_refused_with_the_fix(
    hub, tmp_path, release, monkeypatch
):
    serve_saes(hub, tmp_path)
    hub.repo(REPO).gated = True
    with pytest.raises(GatedModelError, match=rf"{REPO} is gated: accept its licence"):
        SparseAutoencoder.from_pretrained(RELEASE, "blocks.0.hook_resid_pre")
    go_offline(monkeypatch)
    with pytest.raises(NotCachedError, match=r"not in the hub cache.*HF_HUB_OFFLINE=1"):
        SparseAutoencoder.from_pretrained(RELEASE, "blocks.0.hook_resid_pre")


def test_a_folder_the_repo_lacks_is_named(hub, tmp_path):
    serve_saes(hub, tmp_path)
    register_sae_release("tiny-missing", REPO, {"gone": "res/gone"})
    try:
        with pytest.raises(FileNotFoundError, match=r"has no res/gone/cfg.json.*revision="):
            SparseAutoencoder.from_pretrained("tiny-missing", "gone")
    finally:
        unregister_sae_release("tiny-missing")


# ---------------------------------------------------------------------- transcoder sets
def transcoder_tensors(layer: int, d: int = 16, d_sae: int = 20) -> dict[str, torch.Tensor]:
    """`layer_{L}.safetensors` as circuit-tracer (0.2 on) writes it: `W_enc [d_sae d_in]`,
    `W_dec [d_sae d_out]`, and a skip `W_skip [d_out d_in]`."""
    s = 10 * layer
    return {"W_enc": randn(d_sae, d, seed=s), "b_enc": randn(d_sae, seed=s + 1),
            "W_dec": randn(d_sae, d, seed=s + 2), "b_dec": randn(d, seed=s + 3),
            "W_skip": 0.1 * randn(d, d, seed=s + 4)}  # fmt: skip


def circuit_tracer_math(t: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """circuit-tracer's `SingleLayerTranscoder`: `relu(F.linear(x, W_enc, b_enc)) @ W_dec +
    b_dec + x @ W_skip.T` (JumpReLU where it has a threshold: `pre * (pre > threshold)`)."""
    pre = x @ t["W_enc"].T + t["b_enc"]
    threshold = t.get("activation_function.threshold", t.get("threshold"))
    acts = torch.relu(pre) if threshold is None else pre * (pre > threshold)
    out = acts @ t["W_dec"] + t["b_dec"]
    return out + x @ t["W_skip"].T if "W_skip" in t else out


def replaced_by_hand(model, tensors: list[dict], input_hook: str) -> torch.Tensor:
    """The model's logits with each MLP's output replaced by the transcoder's, computed
    from the MLP's input by `circuit_tracer_math`."""
    seen = {}

    def read(x, hook):
        seen[hook.layer()] = x

    def write(y, hook):
        return circuit_tracer_math(tensors[hook.layer()], seen[hook.layer()])

    hooks = [(f"blocks.{i}.{input_hook}", read) for i in range(len(tensors))]
    hooks += [(f"blocks.{i}.hook_mlp_out", write) for i in range(len(tensors))]
    with model.hooks(fwd_hooks=hooks):
        return model(TOKENS)


def serve_transcoder_set(hub, tmp_path: Path, repo: str) -> list[dict]:
    tensors = [transcoder_tensors(layer) for layer in range(2)]
    files = {
        "config.yaml": "model_kind: transcoder_set\nmodel_name: tiny\n" + HOOKS,
        "README.md": "# tiny transcoders\n",
        "other/layer_0.safetensors": b"not read",
    }
    for layer, t in enumerate(tensors):
        safetensors.torch.save_file(t, str(tmp_path / f"layer_{layer}.safetensors"))
        files[f"layer_{layer}.safetensors"] = (tmp_path / f"layer_{layer}.safetensors").read_bytes()
    hub.add_files(repo, files)
    return tensors


def test_a_transcoder_set_loads_by_repo_id_and_registered_preset_and_splices_exactly(
    hub, tmp_path, monkeypatch
):
    tensors = serve_transcoder_set(hub, tmp_path, "org/tiny-transcoders")
    register_transcoder_preset("tiny", "org/tiny-transcoders")
    try:
        assert transcoder_presets()["tiny"] == "org/tiny-transcoders"
        tcs = TranscoderSet.from_pretrained("tiny")
    finally:
        unregister_transcoder_preset("tiny")
    assert sorted(hub.fetched()) == ["config.yaml", "layer_0.safetensors", "layer_1.safetensors"]
    assert tcs.kind == "per_layer" and tcs.layers == (0, 1)
    assert tcs.input_hook(1) == "blocks.1.ln2.hook_out" and tcs.W_skip(0) is not None
    model = random_tiny_model()
    with replaced(model, tcs, use_error_term=False):
        logits = model(TOKENS)
    by_hand = replaced_by_hand(model, tensors, "ln2.hook_out")
    torch.testing.assert_close(logits, by_hand, rtol=0, atol=1e-12)
    with replaced(model, tcs):  # with the error terms, the model itself
        torch.testing.assert_close(model(TOKENS), random_tiny_model()(TOKENS), rtol=0, atol=1e-10)
    # By repo id, from the cache, offline: no request.
    go_offline(monkeypatch)
    hub.forget_requests()
    again = TranscoderSet.from_pretrained("org/tiny-transcoders", dtype=torch.float32)
    assert hub.requests == [] and again.dtype == torch.float32


def test_the_gemma_preset_reads_gemma_scope_transcoders_from_the_repos_its_config_names(
    hub, tmp_path
):
    """circuit-tracer's "gemma" preset: a config in `mwhanna/gemma-scope-transcoders` listing
    `hf://google/gemma-scope-2b-pt-transcoders/.../params.npz`, one JumpReLU transcoder a
    layer (`W_enc [d_in d_sae]`, `W_dec [d_sae d_out]`)."""
    google = "google/gemma-scope-2b-pt-transcoders"
    paths = [f"layer_{i}/width_16k/average_l0_{70 + i}/params.npz" for i in range(2)]
    uris = [f"hf://{google}/{p}" for p in paths]
    config = ("model_kind: transcoder_set\nmodel_name: google/gemma-2-2b\n" + HOOKS
              + "transcoders:\n" + "".join(f"  - {u}\n" for u in uris))  # fmt: skip
    hub.add_files(transcoder_presets()["gemma"], {"config.yaml": config})
    arrays = []
    files = {"layer_0/width_16k/average_l0_99/params.npz": b"another width, not read"}
    for i, path in enumerate(paths):
        a = {"W_enc": randn(16, 20, seed=i), "W_dec": randn(20, 16, seed=i + 1),
             "b_enc": randn(20, seed=i + 2), "b_dec": randn(16, seed=i + 3),
             "threshold": randn(20, seed=i + 4).abs()}  # fmt: skip
        np.savez(tmp_path / f"{i}.npz", **{k: v.numpy() for k, v in a.items()})
        files[path] = (tmp_path / f"{i}.npz").read_bytes()
        arrays.append(a)
    hub.add_files(google, files)
    tcs = TranscoderSet.from_pretrained("gemma")
    assert hub.fetched(google) == paths and hub.fetched("mwhanna/gemma-scope-transcoders") == [
        "config.yaml"
    ]
    assert tcs.activation(0).__class__.__name__ == "JumpReLU"
    # in circuit-tracer's terms: W_enc read transposed, the threshold as is
    tensors = [{**a, "W_enc": a["W_enc"].T} for a in arrays]
    model = random_tiny_model()
    with replaced(model, tcs, use_error_term=False):
        logits = model(TOKENS)
    torch.testing.assert_close(
        logits, replaced_by_hand(model, tensors, "ln2.hook_out"), rtol=0, atol=1e-12
    )


def test_a_cross_layer_transcoder_loads_by_repo_id(hub, tmp_path):
    from hookedattn.sae import CrossLayerTranscoder, CrossLayerTranscoderConfig

    clt = CrossLayerTranscoder(CrossLayerTranscoderConfig(2, 16, 20, 16, dtype="float64"))
    files = folder_files(clt.save(tmp_path / "clt", "tiny"))
    files["config.yaml"] = "model_kind: cross_layer_transcoder\nmodel_name: tiny\n" + HOOKS
    hub.add_files("org/tiny-clt", {f"sub/{n}": b for n, b in files.items()} | {"x.bin": b"no"})
    tcs = TranscoderSet.from_pretrained("org/tiny-clt/sub")
    assert tcs.kind == "cross_layer" and "x.bin" not in hub.fetched()
    x = randn(3, 16, seed=2)
    torch.testing.assert_close(tcs.source(x.expand(2, 3, 16)), clt(x.expand(2, 3, 16)))


def test_transcoder_set_names_that_cannot_be_read_are_refused(hub):
    with pytest.raises(KeyError, match=r"'gema' is neither a transcoder preset \(close: gemma\)"):
        TranscoderSet.from_pretrained("gema")
    hub.add_files("org/not-a-set", {"README.md": "nothing"})
    with pytest.raises(FileNotFoundError, match=r"has no config.yaml"):
        TranscoderSet.from_pretrained("org/not-a-set")
    hub.add_files("org/topk", {"config.yaml": "model_kind: transcoder_set\nactivation: topk\n"
                               "feature_input_hook: a\nfeature_output_hook: b\n"})  # fmt: skip
    with pytest.raises(ValueError, match=r"circuit-tracer's TopK, which keeps negative values"):
        TranscoderSet.from_pretrained("org/topk")
