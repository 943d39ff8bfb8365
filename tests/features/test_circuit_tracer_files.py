"""Our transcoder files are circuit-tracer 0.5's, both ways, and our attribution graphs take
its conventions on request (issue 44).

The end-to-end checks run real circuit-tracer 0.5.0 in an environment of its own
(`.ci/circuit_tracer.sh` builds it and links it at `~/.cache/hookedattn/circuit_tracer-0.5/`;
`HOOKEDATTN_CIRCUIT_TRACER_PYTHON` names another interpreter), as one subprocess running
`scripts/circuit_tracer_files.py`: circuit-tracer writes sets with its own `to_safetensors`
and reads ours with its own loader, and draws the graph of a prompt on the same random
Llama and transcoders as ours. Without it they skip, saying how to build it; under CI they
fail instead. The other tests need nothing but this checkout.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
import safetensors.torch
import torch
from helpers.tl_reference import require_peer_python, save_demo_tokenizer

import hookedattn_tl
from analysis.attribution_graphs import attribution_graph, graph_json, save_graph_json
from hookedattn.sae import (
    CrossLayerTranscoder,
    CrossLayerTranscoderConfig,
    Transcoder,
    TranscoderConfig,
    load_transcoder_set,
    save_transcoder_set,
)
from hookedattn.testing import random_tiny_model, random_tokens

ROOT = Path(__file__).resolve().parents[2]
VERSION = "0.5.0"
G = torch.Generator().manual_seed(44)


def rand(*shape):
    return torch.randn(*shape, generator=G)


# ---------------------------------------------------------------------- weights, both layouts
def their_layer(d_model, d_sae, jumprelu, skip=True):
    """One `SingleLayerTranscoder`'s parameters, in circuit-tracer's layout."""
    t = {"W_enc": rand(d_sae, d_model) / d_model**0.5, "W_dec": rand(d_sae, d_model) / d_sae**0.5,
         "b_enc": rand(d_sae) * 0.1, "b_dec": rand(d_model) * 0.1}  # fmt: skip
    if skip:
        t["W_skip"] = rand(d_model, d_model) * 0.1
    if jumprelu:
        t["threshold"] = rand(d_sae).abs() * 0.3
    return t


def their_clt_layer(layer, n, d_model, d_sae, jumprelu):
    t = {"W_enc": rand(d_sae, d_model), "b_enc": rand(d_sae) * 0.1, "b_dec": rand(d_model),
         "W_dec": rand(d_sae, n - layer, d_model)}  # fmt: skip
    return t | ({"threshold": rand(d_sae).abs() * 0.3} if jumprelu else {})


def their_math(t, x):
    """`SingleLayerTranscoder.forward`, written out: its JumpReLU passes `pre > threshold`."""
    pre = x @ t["W_enc"].T + t["b_enc"]
    acts = pre * (pre > t["threshold"]) if "threshold" in t else torch.relu(pre)
    return acts @ t["W_dec"] + t["b_dec"] + (x @ t["W_skip"].T if "W_skip" in t else 0)


def their_clt_math(layers, x):
    """`CrossLayerTranscoder.forward`, written out: layer `i`'s `W_dec[:, j]` writes to `i + j`."""
    acts = []
    for i, t in enumerate(layers):
        pre = x[i] @ t["W_enc"].T + t["b_enc"]
        acts.append(pre * (pre > t["threshold"]) if "threshold" in t else torch.relu(pre))
    return torch.stack([t["b_dec"] + sum(acts[i] @ layers[i]["W_dec"][:, out - i]
                                         for i in range(out + 1))
                        for out, t in enumerate(layers)])  # fmt: skip


def our_set(d_model, d_sae, activation, skip=True, reads="ln2.hook_out", dtype="float32"):
    tcs = []
    for layer in range(2):
        hooks = f"blocks.{layer}.{reads}", f"blocks.{layer}.hook_mlp_out"
        cfg = TranscoderConfig(d_model, d_sae, d_model, *hooks, activation, skip=skip, dtype=dtype)
        tc = Transcoder(cfg)
        with torch.no_grad():
            for name, p in tc.named_parameters():
                p.copy_(rand(*p.shape).abs() * 0.3 if name.endswith("threshold") else
                        rand(*p.shape) * 0.3)  # fmt: skip
        tcs.append(tc)
    return tcs


def our_clt(activation):
    clt = CrossLayerTranscoder(CrossLayerTranscoderConfig(3, 8, 24, 8, activation, seed=1))
    with torch.no_grad():
        for name, p in clt.named_parameters():
            p.copy_(rand(*p.shape).abs() if "threshold" in name else rand(*p.shape))
    return clt


# ---------------------------------------------------------------------- fast: the files
def test_the_config_marks_the_layout_and_a_square_decoder_is_read_by_it(tmp_path):
    """The same square weights, written in circuit-tracer 0.5's layout (`model_kind`,
    `W_dec [d_sae d_out]`) and in its first (no `model_kind`, `W_dec [d_out d_sae]`), read
    as the same transcoder: the config tells them apart, not the shape."""
    tcs = our_set(8, 8, "jumprelu")
    new = save_transcoder_set(tcs, tmp_path / "new", "tiny")
    config = json.loads((new / "config.yaml").read_text())
    assert config["model_kind"] == "transcoder_set"
    assert (config["feature_input_hook"], config["feature_output_hook"]) == (
        "mlp.hook_in", "hook_mlp_out"
    )  # fmt: skip
    old = tmp_path / "old"
    old.mkdir()
    entries = []
    for layer in range(2):
        t = safetensors.torch.load_file(str(new / f"layer_{layer}.safetensors"))
        t["W_dec"] = t["W_dec"].T.contiguous()
        safetensors.torch.save_file(t, str(old / f"layer_{layer}.safetensors"))
        entries.append(
            {"id": f"l{layer}", "layer": layer, "filepath": f"layer_{layer}.safetensors"}
        )
    first = {"model_name": "tiny", "feature_input_hook": "ln2.hook_out",
             "feature_output_hook": "hook_mlp_out", "transcoders": entries}  # fmt: skip
    (old / "config.yaml").write_text(json.dumps(first))
    x = rand(5, 8)
    for folder in (new, old):
        for ours, back in zip(tcs, load_transcoder_set(folder), strict=True):
            assert back.cfg.activation == "jumprelu" and back.cfg.skip
            assert torch.equal(back.W_dec, ours.W_dec)
            torch.testing.assert_close(back(x), ours(x), rtol=0, atol=0)


def test_a_negative_threshold_is_written_as_zero_the_same_function(tmp_path):
    (tc,) = our_set(8, 24, "jumprelu")[:1]
    with torch.no_grad():
        tc.activation.threshold[:5] = -0.5
    (back,) = load_transcoder_set(save_transcoder_set([tc], tmp_path, "tiny"))
    assert float(back.activation.threshold.detach().min()) == 0.0
    x = rand(50, 8)
    torch.testing.assert_close(back(x), tc(x), rtol=0, atol=0)


def test_a_cross_layer_folder_says_its_kind_and_circuit_tracers_hooks(tmp_path):
    clt = our_clt("jumprelu")
    folder = clt.save(tmp_path / "clt", "tiny")
    config = json.loads((folder / "config.yaml").read_text())
    assert config["model_kind"] == "cross_layer_transcoder"
    assert config["feature_input_hook"] == "mlp.hook_in"
    back = CrossLayerTranscoder.load(folder)
    assert back.cfg.feature_input_hook == "ln2.hook_out"
    config["model_kind"] = "transcoder_set"
    (folder / "config.yaml").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="model_kind 'transcoder_set' is not a cross-layer"):
        CrossLayerTranscoder.load(folder)


# ---------------------------------------------------------------------- fast: the graphs
def llama_like():
    return random_tiny_model(act_fn="silu", gated_mlp=True, normalization_type="RMS",
                             positional_embedding_type="rotary", rotary_dim=4, n_ctx=12,
                             n_key_value_heads=2, d_model=16)  # fmt: skip


def test_circuit_tracers_llama_hook_names_are_ours_and_make_a_graph(tmp_path):
    """circuit-tracer's Llama sets read `mlp.hook_in` and write `mlp.hook_out` (its
    `ReplacementMLP`'s hooks): our MLP input `ln2.hook_out` and output `hook_mlp_out`."""
    model = llama_like()
    folder = save_transcoder_set(our_set(16, 24, "relu", dtype="float64"), tmp_path / "set", "t")
    config = json.loads((folder / "config.yaml").read_text())
    config |= {"feature_input_hook": "mlp.hook_in", "feature_output_hook": "mlp.hook_out"}
    (folder / "config.yaml").write_text(json.dumps(config))
    tcs = load_transcoder_set(folder)
    assert [(tc.cfg.hook_name, tc.cfg.hook_name_out) for tc in tcs] == [
        (f"blocks.{i}.ln2.hook_out", f"blocks.{i}.hook_mlp_out") for i in range(2)
    ]
    graph = attribution_graph(model, tcs, random_tokens(model.cfg.d_vocab, 1, 6, seed=1)[0])
    assert graph.n_features > 0


@pytest.fixture(scope="module")
def graphs():
    model = llama_like()
    tcs = our_set(16, 24, "jumprelu", dtype="float64")
    tokens = random_tokens(model.cfg.d_vocab, 1, 7, seed=2)[0]
    plain = attribution_graph(model, tcs, tokens, top_k=3)
    theirs = attribution_graph(model, tcs, tokens, top_k=3, demean_logits=True,
                               drop_first_position=True)  # fmt: skip
    return model, tcs, tokens, plain, theirs


def test_by_default_the_graph_explains_the_raw_logits_at_every_position(graphs):
    model, _, tokens, plain, _ = graphs
    assert not plain.demeaned_logits and not plain.dropped_first_position
    assert bool((plain.features[:, 1] == 0).any())  # features at position 0 are nodes
    logits = model(tokens[None])[0, -1]
    rows = [plain.logit_node(i) for i in range(3)]
    total = plain.adjacency[rows].sum(-1) + plain.bias[rows]
    torch.testing.assert_close(total, logits[plain.logit_tokens], rtol=0, atol=1e-10)


def test_circuit_tracers_conventions_demean_the_logits_and_drop_position_0(graphs):
    model, _, tokens, plain, theirs = graphs
    assert theirs.demeaned_logits and theirs.dropped_first_position
    assert torch.equal(theirs.logit_tokens, plain.logit_tokens)
    assert not bool((theirs.features[:, 1] == 0).any())
    assert torch.equal(theirs.features, plain.features[plain.features[:, 1] > 0])
    for layer in range(theirs.n_layers):  # the error nodes at position 0 write nothing
        assert not bool(theirs.adjacency[:, theirs.error_node(layer, 0)].any())
    logits = model(tokens[None])[0, -1]
    rows = [theirs.logit_node(i) for i in range(3)]
    total = theirs.adjacency[rows].sum(-1) + theirs.bias[rows]  # what was dropped: in bias
    torch.testing.assert_close(total, (logits - logits.mean())[theirs.logit_tokens], rtol=0,
                               atol=1e-10)  # fmt: skip
    for node in range(theirs.n_features):  # a feature's pre-activation, still exact
        target = plain.feature_node(*theirs.features[node].tolist())
        torch.testing.assert_close(theirs.adjacency[node].sum() + theirs.bias[node],
                                   plain.adjacency[target].sum() + plain.bias[target],
                                   rtol=0, atol=1e-10)  # fmt: skip


def test_the_json_has_the_prompt_as_text_and_a_scan_name(tmp_path, graphs):
    model = llama_tl(_tokenizer(tmp_path))
    tcs = our_set(16, 24, "relu")
    ids = model.tokenizer("When John and Mary went")["input_ids"]
    graph = attribution_graph(model, tcs, torch.tensor(ids), top_k=2)
    doc = graph_json(graph)
    assert doc["metadata"]["prompt"] == "When John and Mary went"
    assert doc["metadata"]["scan"] == "custom/plt-24"  # {model_name}/{kind}-{d_sae}
    assert graph_json(graph, scan="llama-3-131k-relu")["metadata"]["scan"] == "llama-3-131k-relu"
    _, _, _, _, theirs = graphs
    assert graph_json(theirs)["metadata"]["hookedattn"]["dropped_first_position"] is True


def test_saved_graphs_are_indexed_for_circuit_tracers_server(tmp_path, graphs):
    _, _, _, plain, theirs = graphs
    first = save_graph_json(plain, tmp_path / "data", slug="plain")
    second = save_graph_json(theirs, tmp_path / "data" / "theirs.json")
    save_graph_json(plain, tmp_path / "data", slug="plain")  # saved again: one entry
    assert (first.name, second.name) == ("plain.json", "theirs.json")
    index = json.loads((tmp_path / "data" / "graph-metadata.json").read_text())
    assert [g["slug"] for g in index["graphs"]] == ["theirs", "plain"]
    fields = {
        "slug",
        "scan",
        "transcoder_list",
        "prompt_tokens",
        "prompt",
        "node_threshold",
        "schema_version",
    }  # circuit_tracer.frontend.graph_models.Metadata
    assert all(set(g) == fields for g in index["graphs"])
    assert json.loads(second.read_text())["metadata"]["slug"] == "theirs"
    with pytest.raises(ValueError, match="slug 'other' cannot be saved as theirs.json"):
        save_graph_json(plain, second, slug="other")


# ---------------------------------------------------------------------- against circuit-tracer
LLAMA = dict(n_layers=2, d_model=16, n_heads=4, d_head=4, n_key_value_heads=2, d_mlp=32,
             n_ctx=16, act_fn="silu", normalization_type="RMS", gated_mlp=True,
             positional_embedding_type="rotary", rotary_dim=4,
             original_architecture="LlamaForCausalLM")  # fmt: skip


def _tokenizer(folder: Path):
    """A small byte-level BPE tokenizer (`helpers.tl_reference`), saved in `folder`."""
    AutoTokenizer = pytest.importorskip("transformers").AutoTokenizer

    return AutoTokenizer.from_pretrained(save_demo_tokenizer(folder / "tokenizer"))


def llama_tl(tokenizer) -> hookedattn_tl.HookedTransformer:
    """Our model of the config `LLAMA`, through TransformerLens's API (its names)."""
    cfg = hookedattn_tl.HookedTransformerConfig(**LLAMA, d_vocab=len(tokenizer))
    return hookedattn_tl.HookedTransformer(cfg, tokenizer=tokenizer)


def ct_python() -> Path:
    """circuit-tracer's interpreter; skips the test without one (fails it under CI)."""
    return require_peer_python(
        f"circuit-tracer {VERSION}", "circuit_tracer-0.5", "circuit_tracer.sh",
        "HOOKEDATTN_CIRCUIT_TRACER_PYTHON",
    )  # fmt: skip


def llama_weights(model: hookedattn_tl.HookedTransformer) -> dict[str, torch.Tensor]:
    """Random weights for `model`, in TransformerLens's names: no biases (Llama has none),
    gains near 1."""
    weights = {}
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        weights[name] = (torch.zeros(p.shape) if leaf.lstrip("_").startswith("b_")
                         else rand(*p.shape) * 0.3 + (leaf == "w"))  # fmt: skip
    return weights


@pytest.fixture(scope="module")
def ct(tmp_path_factory):
    """One run of scripts/circuit_tracer_files.py: what we gave it, and what it answered."""
    python = ct_python()
    folder = tmp_path_factory.mktemp("circuit_tracer")
    tokenizer = _tokenizer(folder)
    x = rand(3, 5, 8)
    writes = {
        "relu, d_sae != d_model": [their_layer(8, 24, False) for _ in range(2)],
        "jumprelu, square": [their_layer(8, 8, True) for _ in range(2)],
        "cross-layer relu": [their_clt_layer(i, 3, 8, 24, False) for i in range(3)],
        "cross-layer jumprelu": [their_clt_layer(i, 3, 8, 24, True) for i in range(3)],
    }
    ours = {
        "relu, skip, d_sae != d_model": our_set(8, 24, "relu"),
        "jumprelu, square": our_set(8, 8, "jumprelu", skip=False),
        "cross-layer relu": our_clt("relu"),
        "cross-layer jumprelu": our_clt("jumprelu"),
    }
    for i, written in enumerate(ours.values()):
        target = folder / f"ours_{i}"
        if isinstance(written, CrossLayerTranscoder):
            written.save(target, "tiny")
        else:
            save_transcoder_set(written, target, "tiny", scan="tiny-scan")
    model = llama_tl(tokenizer)
    weights = llama_weights(model)
    model.load_state_dict(weights, strict=False)
    graph_set = our_set(16, 24, "jumprelu", reads="ln2.hook_out")
    save_transcoder_set(graph_set, folder / "graph_set", "tiny", scan="tiny-scan")
    tokens = [tokenizer.bos_token_id, *tokenizer("When John and Mary went to")["input_ids"]]
    targets = model(torch.tensor(tokens)[None])[0, -1].topk(3).indices.tolist()
    given = {
        "write": [
            {"folder": str(folder / f"theirs_{i}"), "layers": layers, "x": x,
             "kind": "cross_layer" if name.startswith("cross") else "per_layer",
             "feature_input_hook": "mlp.hook_in", "feature_output_hook": "mlp.hook_out",
             "model_name": "meta-llama/Llama-3.2-1B", "scan": f"scan-{i}"}
            for i, (name, layers) in enumerate(writes.items())
        ],
        "read": [{"folder": str(folder / f"ours_{i}"), "x": x} for i in range(len(ours))],
        "graphs": [{"config": {**LLAMA, "d_vocab": len(tokenizer)}, "weights": weights,
                    "transcoders": str(folder / "graph_set"), "tokens": tokens,
                    "tokenizer": str(folder / "tokenizer"), "targets": targets,
                    "special_token": tokenizer.bos_token}],
    }  # fmt: skip
    torch.save(given, folder / "in.pt")
    command = [str(python), str(ROOT / "scripts" / "circuit_tracer_files.py"),
               str(folder / "in.pt"), str(folder / "out.pt")]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("PYTHONPATH", None)  # circuit-tracer's environment imports its own packages only
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    answer = torch.load(folder / "out.pt", weights_only=False)
    return {"folder": folder, "x": x, "writes": writes, "ours": ours, "answer": answer,
            "model": model, "graph_set": graph_set, "tokens": tokens,
            "targets": targets}  # fmt: skip


@pytest.mark.slow
def test_the_reference_is_circuit_tracer_0_5(ct):
    assert ct["answer"]["versions"]["circuit-tracer"] == VERSION


@pytest.mark.slow
@pytest.mark.parametrize("i", range(4), ids=["relu", "jumprelu square", "clt relu", "clt jump"])
def test_our_reader_gets_the_weights_circuit_tracer_wrote(ct, i):
    name, layers = list(ct["writes"].items())[i]
    folder, x = ct["folder"] / f"theirs_{i}", ct["x"]
    written = ct["answer"]["written"][i]  # circuit-tracer's own loader on its own folder
    assert written["config"]["model_kind"] in ("transcoder_set", "cross_layer_transcoder")
    if name.startswith("cross"):
        clt = CrossLayerTranscoder.load(folder)
        assert clt.cfg.activation == ("jumprelu" if "jump" in name else "relu")
        assert (clt.cfg.feature_input_hook, clt.cfg.feature_output_hook) == (
            "ln2.hook_out", "hook_mlp_out"
        )  # fmt: skip
        for layer, t in enumerate(layers):
            assert torch.equal(clt.W_enc[layer], t["W_enc"].T)
            assert torch.equal(clt.W_dec[layer], t["W_dec"])
            assert torch.equal(clt.b_enc[layer], t["b_enc"])
            assert torch.equal(clt.b_dec[layer], t["b_dec"])
            if "threshold" in t:
                assert torch.equal(clt.activations[layer].threshold, t["threshold"])
        torch.testing.assert_close(clt(x), their_clt_math(layers, x))
        torch.testing.assert_close(clt(x), written["outputs"])
        return
    tcs = load_transcoder_set(folder)
    for layer, (tc, t) in enumerate(zip(tcs, layers, strict=True)):
        assert tc.cfg.hook_name == f"blocks.{layer}.ln2.hook_out"
        assert tc.cfg.activation == ("jumprelu" if "threshold" in t else "relu")
        assert torch.equal(tc.W_enc, t["W_enc"].T) and torch.equal(tc.W_dec, t["W_dec"])
        assert torch.equal(tc.b_enc, t["b_enc"]) and torch.equal(tc.b_dec, t["b_dec"])
        assert torch.equal(tc.W_skip, t["W_skip"])
        if "threshold" in t:
            assert torch.equal(tc.activation.threshold, t["threshold"])
        torch.testing.assert_close(tc(x[layer]), their_math(t, x[layer]))
        torch.testing.assert_close(tc(x[layer]), written["outputs"][layer])


@pytest.mark.slow
@pytest.mark.parametrize("i", range(4), ids=["relu", "jumprelu square", "clt relu", "clt jump"])
def test_circuit_tracers_reader_gets_the_weights_we_wrote(ct, i):
    ours = list(ct["ours"].values())[i]
    got, x = ct["answer"]["read"][i], ct["x"]
    assert got["feature_input_hook"] == "mlp.hook_in"
    assert got["feature_output_hook"] == "hook_mlp_out"
    if isinstance(ours, CrossLayerTranscoder):
        assert got["type"] == "CrossLayerTranscoder" and got["activation"] == ours.cfg.activation
        for layer, t in enumerate(got["layers"]):
            assert torch.equal(t["W_enc"], ours.W_enc[layer].T)
            assert torch.equal(t["W_dec"], ours.W_dec[layer])
            assert torch.equal(t["b_enc"], ours.b_enc[layer])
            assert torch.equal(t["b_dec"], ours.b_dec[layer])
            if "threshold" in t:
                assert torch.equal(t["threshold"], ours.activations[layer].threshold)
        torch.testing.assert_close(got["outputs"], ours(x))
        return
    assert got["type"] == "TranscoderSet" and got["scan"] == "tiny-scan"
    assert got["activation"] == ours[0].cfg.activation
    for layer, (t, tc) in enumerate(zip(got["layers"], ours, strict=True)):
        assert torch.equal(t["W_enc"], tc.W_enc.T) and torch.equal(t["W_dec"], tc.W_dec)
        assert torch.equal(t["b_enc"], tc.b_enc) and torch.equal(t["b_dec"], tc.b_dec)
        assert ("W_skip" in t) == tc.cfg.skip
        if tc.cfg.skip:
            assert torch.equal(t["W_skip"], tc.W_skip)
        if "threshold" in t:
            assert torch.equal(t["threshold"], tc.activation.threshold)
        torch.testing.assert_close(got["outputs"][layer], tc(x[layer]))


@pytest.mark.slow
def test_our_graph_with_its_conventions_is_circuit_tracers(ct):
    """The same random Llama (TransformerLens's names, float32) and transcoders: our graph
    with `demean_logits` and `drop_first_position` is circuit-tracer's `attribute`, node for
    node and edge for edge."""
    (theirs,) = ct["answer"]["graphs"]
    model, tokens = ct["model"], torch.tensor(ct["tokens"])
    torch.testing.assert_close(model(tokens[None])[0, -1], theirs["logits"])
    graph = attribution_graph(model, ct["graph_set"], tokens, logits=ct["targets"],
                              demean_logits=True, drop_first_position=True)  # fmt: skip
    assert graph.prompt == theirs["input_string"]
    assert torch.equal(graph.logit_tokens, theirs["logit_tokens"])
    torch.testing.assert_close(graph.logit_probabilities, theirs["logit_probabilities"])
    selected = theirs["active_features"][theirs["selected_features"]]
    assert torch.equal(graph.features, selected)
    torch.testing.assert_close(
        graph.activations, theirs["activation_values"][theirs["selected_features"]]
    )
    assert graph.adjacency.shape == theirs["adjacency_matrix"].shape
    difference = (graph.adjacency - theirs["adjacency_matrix"]).abs().max()
    print(
        f"largest edge difference {float(difference):.3g} of edges up to "
        f"{float(graph.adjacency.abs().max()):.3g}; {int((graph.adjacency != 0).sum())} edges"
    )
    assert float(difference) < 1e-5, float(difference)
