"""Run under `torchrun --nproc_per_node 2` by tests/parallel/test_gradient_methods.py: every
gradient method, and SAE and transcoder training on a store the model collected, on a
tensor-parallel model against the one-process model it was split from, on each rank.

Each rank builds the same seeded one-process model (the reference, in this process), splits
a copy over the two ranks, runs both, and writes `<out>/rank<r>.json`: for every case
(model and dtype) and method, the largest absolute difference from the reference
(`abs_<method>`) and that divided by `max(1, max|reference|)` (`<method>`), or a boolean.
"""

import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

torch.set_num_threads(1)

from analysis import (  # noqa: E402
    attribution_graph,
    attribution_patch,
    decompose_resid,
    direct_logit_attribution,
    edge_attribution,
    edge_patching,
    head_source_contributions,
    head_values,
    logit_lens,
    qk_attribution,
    stacked_head_results,
)
from analysis.attribution_graphs import graph_qk_attribution  # noqa: E402
from analysis.patching.engine import metric_gradients  # noqa: E402
from analysis.patching.feature_patching import feature_attribution_patch  # noqa: E402
from hookedattn.core import parallel  # noqa: E402
from hookedattn.core.mixer_config import MixerConfig  # noqa: E402
from hookedattn.sae import (  # noqa: E402
    SAEConfig,
    SparseAutoencoder,
    Transcoder,
    TranscoderConfig,
)
from hookedattn.sae.training import train_sae  # noqa: E402
from hookedattn.sae.transcoder_training import train_transcoder  # noqa: E402
from hookedattn.store import ActivationStore, collect_activations  # noqa: E402
from hookedattn.testing import random_tiny_model, random_tokens  # noqa: E402
from hookedattn.training import train  # noqa: E402

MODELS = {
    # LayerNorm, learned positions; a vocabulary of 33 is cut 17 + 16.
    "gpt2_like": dict(d_vocab=33, act_fn="gelu"),
    # RMSNorm, rotary, grouped keys and values (4 query heads, 2 key/value heads), SwiGLU.
    "llama_like": dict(
        n_key_value_heads=2, normalization_type="RMS", positional_embedding_type="rotary",
        gated_mlp=True, act_fn="silu",
    ),
}  # fmt: skip
DTYPES = {"float64": torch.float64, "float32": torch.float32}


def compare(out: dict, method: str, got: torch.Tensor, expected: torch.Tensor) -> None:
    """Record `got` against `expected`: absolute and relative largest differences."""
    if got.shape != expected.shape:
        out[method] = out[f"abs_{method}"] = float("inf")
        return
    diff = float((got.double() - expected.double()).abs().max())
    out[f"abs_{method}"] = max(diff, out.get(f"abs_{method}", 0.0))
    relative = diff / max(1.0, float(expected.abs().max()))
    out[method] = max(relative, out.get(method, 0.0))


def transcoders(cfg, dtype: str) -> list[Transcoder]:
    generator = torch.Generator().manual_seed(11)
    out = []
    for layer in range(cfg.n_layers):
        tc = Transcoder(TranscoderConfig(
            cfg.d_model, 48, cfg.d_model, f"blocks.{layer}.ln2.hook_out",
            f"blocks.{layer}.hook_mlp_out", "relu", dtype=dtype))  # fmt: skip
        with torch.no_grad():
            for p in tc.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
        out.append(tc)
    return out


def patching_inputs(cfg) -> tuple[torch.Tensor, Any, dict]:
    """The clean tokens, the metric, and the keywords of a patching call (a corrupted
    copy of the tokens, one token changed)."""
    tokens = random_tokens(cfg.d_vocab, batch=2, pos=7, seed=3)
    corrupted = tokens.clone()
    corrupted[:, 2] = (tokens[:, 2] + 5) % cfg.d_vocab
    metric = lambda logits: logits[:, -1, 1] - logits[:, -1, 0]
    return tokens, metric, dict(clean_tokens=tokens, corrupted_tokens=corrupted, metric=metric)


def gradient_methods(ref, model, dtype: str) -> dict:
    cfg, out = ref.cfg, {}
    tokens, metric, kwargs = patching_inputs(cfg)

    # The metric's gradient at every sharded hook point (heads, neurons) and at the stream.
    names = [p.name for p in parallel.sharded_hook_points(model)]
    names += [f"blocks.{layer}.hook_resid_mid" for layer in range(cfg.n_layers)]
    got = metric_gradients(model, names, lambda: metric(model(tokens)))
    expected = metric_gradients(ref, names, lambda: metric(ref(tokens)))
    out["gradient_names"] = sorted(got.gradients) == sorted(expected.gradients)
    out["sharded_points"] = sum(".attn." in n or ".mlp." in n for n in expected.gradients)
    for name, gradient in expected.gradients.items():
        compare(out, "metric_gradients", got.gradients[name], gradient)

    expected = attribution_patch(ref, None, **kwargs)
    got = attribution_patch(model, None, **kwargs)
    out["attribution_kinds"] = sorted(got) == sorted(expected) and len(expected) > 5
    for kind in expected:
        compare(out, "attribution_patch", got[kind].per_prompt, expected[kind].per_prompt)

    for method in ("eap", "eap-ig"):
        expected = edge_attribution(ref, method=method, **kwargs).per_prompt
        got = edge_attribution(model, method=method, **kwargs).per_prompt
        compare(out, method, got, expected)

    sae = SparseAutoencoder(SAEConfig(d_in=cfg.d_mlp, d_sae=24, hook_name="blocks.1.mlp.hook_post",
                                      dtype=dtype))  # fmt: skip
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    got, expected = (feature_attribution_patch(m, sae, **kwargs) for m in (model, ref))
    out["feature_attribution_features"] = got.labels == expected.labels
    compare(out, "feature_attribution_patch", got.per_prompt, expected.per_prompt)

    tset = transcoders(cfg, dtype)
    expected_graph = attribution_graph(ref, tset, tokens[0], top_k=3)
    got_graph = attribution_graph(model, tset, tokens[0], top_k=3)
    out["graph_nodes"] = torch.equal(got_graph.features, expected_graph.features) and torch.equal(
        got_graph.logit_tokens, expected_graph.logit_tokens
    )
    compare(out, "attribution_graph", got_graph.adjacency, expected_graph.adjacency)
    compare(out, "attribution_graph", got_graph.bias, expected_graph.bias)

    # QK attributions read W_Q, W_K of a head on the other rank (head 3, key/value head 1).
    (_, mine), (_, theirs) = (m.run_with_cache(tokens) for m in (model, ref))
    got, expected = qk_attribution(model, mine, 1, 3, 5, 2), qk_attribution(ref, theirs, 1, 3, 5, 2)
    out["qk_labels"] = got.query_labels == expected.query_labels
    compare(out, "qk_attribution", got.terms, expected.terms)
    got = graph_qk_attribution(model, tset, got_graph, 1, 3, 2)
    expected = graph_qk_attribution(ref, tset, expected_graph, 1, 3, 2)
    out["qk_labels"] &= got.key_labels == expected.key_labels
    compare(out, "qk_attribution", got.terms, expected.terms)
    return out


def weight_readers(ref, model) -> dict:
    """What reads a layer's weights with whole activations, exact edge patching included
    (EAP's reference): each on the split model against the one-process model."""
    cfg, out = ref.cfg, {}
    tokens = random_tokens(cfg.d_vocab, batch=2, pos=7, seed=3)
    corrupted = tokens.clone()
    corrupted[:, 2] = (tokens[:, 2] + 5) % cfg.d_vocab
    metric = lambda logits: logits[:, -1, 1] - logits[:, -1, 0]
    kwargs = dict(clean_tokens=tokens, corrupted_tokens=corrupted, metric=metric)
    compare(out, "edge_patching", edge_patching(model, **kwargs).per_prompt,
            edge_patching(ref, **kwargs).per_prompt)  # fmt: skip
    without_v = lambda name: not name.endswith(("hook_v", "hook_result"))
    (_, mine), (_, theirs) = (
        m.run_with_cache(tokens, names_filter=without_v) for m in (model, ref)
    )
    answers = torch.tensor([cfg.d_vocab - 1, 2])  # the last token lives on rank 1
    for m, cache, key in ((model, mine, "got"), (ref, theirs, "expected")):
        out[key] = {
            "dla": direct_logit_attribution(
                m, cache, decompose_resid(m, cache), answers[:, None]).contributions,
            "logit_lens": logit_lens(m, cache).logits,
            "head_values": head_values(m, cache, 1),
            "stacked_head_results": stacked_head_results(m, cache),
            "head_source_contributions": head_source_contributions(m, cache, 1, -1).contributions,
        }  # fmt: skip
    for name, expected in out.pop("expected").items():
        compare(out, name, out["got"][name], expected)
    del out["got"]
    try:
        train(model, None, None)
        out["train_refused"] = "train ran"
    except ValueError as error:
        out["train_refused"] = str(error)
    return out


def training(ref, model, out_dir: Path) -> dict:
    """Collect a store with each model, then one step of SAE and transcoder training on each."""
    cfg, out = ref.cfg, {}
    tokens = random_tokens(cfg.d_vocab, batch=8, pos=cfg.n_ctx, seed=5)
    names = ["blocks.1.mlp.hook_post", "blocks.1.ln2.hook_out", "blocks.1.hook_mlp_out"]
    stores = {}
    for label, m in (("split", model), ("one", ref)):
        folder = out_dir / f"store_{label}"
        collect_activations(m, tokens, names=names, out=folder, batch_size=4, progress=False)
        stores[label] = ActivationStore(folder, model=m)
    one, split = stores["one"], stores["split"]
    out["store_same_weights_hash"] = (
        one.manifest["model"]["weights_sha256"] == split.manifest["model"]["weights_sha256"]
    )
    for name in names:
        compare(out, "store_rows", split.rows(name, slice(0, len(split))),
                one.rows(name, slice(0, len(one))))  # fmt: skip
    args = dict(d_sae=24, l1=1.0, steps=1, batch_size=16, progress=False)
    got, expected = (train_sae(s, "blocks.1.mlp.hook_post", **args) for s in (split, one))
    for p, q in zip(got.parameters(), expected.parameters(), strict=True):
        compare(out, "sae_step", p, q)
    got, expected = (train_transcoder(s, 1, **args) for s in (split, one))
    for p, q in zip(got.parameters(), expected.parameters(), strict=True):
        compare(out, "transcoder_step", p, q)
    return out


# Beyond dense models, in float64: a mixture of experts (each expert's neurons split) and a
# hybrid (a gated delta net and a Mamba-2 mixer, each split by heads).
BEYOND_DENSE = {
    "moe": random_tiny_model(
        n_key_value_heads=2, normalization_type="RMS", positional_embedding_type="rotary",
        gated_mlp=True, act_fn="silu", num_experts=6, experts_per_token=2, d_mlp=8,
    ),
    "hybrid": random_tiny_model(
        n_layers=4, normalization_type="RMS", positional_embedding_type="rotary",
        gated_mlp=True, act_fn="silu", mixers=MixerConfig(
            layers=("attention", "gated_delta", "attention", "mamba2"), d_conv=3,
            n_ssm_heads=4, d_ssm_head=6, d_state=5, n_ssm_groups=2),
    ),
}  # fmt: skip


def beyond_dense(ref, model) -> dict:
    """The gradient methods (EAP and EAP-IG among them), exact edge patching and QK
    attributions on a split mixture of experts or hybrid, against the one-process model;
    the residual decomposition by expert or by head; on the mixture, an attribution
    graph."""
    cfg, out = ref.cfg, {}
    tokens, metric, kwargs = patching_inputs(cfg)
    names = [p.name for p in parallel.sharded_hook_points(model)]
    got = metric_gradients(model, names, lambda: metric(model(tokens)))
    expected = metric_gradients(ref, names, lambda: metric(ref(tokens)))
    for name, gradient in expected.gradients.items():
        compare(out, "metric_gradients", got.gradients[name], gradient)
    got, expected = (attribution_patch(m, None, **kwargs) for m in (model, ref))
    for kind in expected:
        compare(out, "attribution_patch", got[kind].per_prompt, expected[kind].per_prompt)
    for method in ("eap", "eap-ig"):
        got, expected = (edge_attribution(m, method=method, **kwargs).per_prompt
                         for m in (model, ref))  # fmt: skip
        compare(out, method, got, expected)
    got, expected = (edge_patching(m, **kwargs).per_prompt for m in (model, ref))
    compare(out, "edge_patching", got, expected)
    granularity = "expert" if cfg.is_moe else "head"
    (_, mine), (_, theirs) = (m.run_with_cache(tokens) for m in (model, ref))
    # Head 3 (on rank 1) of the last block with attention: its query-key terms.
    layer = cfg.attention_layers[-1]
    got = qk_attribution(model, mine, layer, 3, 5, 2)
    expected = qk_attribution(ref, theirs, layer, 3, 5, 2)
    out["qk_labels"] = got.query_labels == expected.query_labels
    compare(out, "qk_attribution", got.terms, expected.terms)
    if cfg.mixers is None:  # a graph freezes attention head by head: refused for hybrids
        out |= _graphs(ref, model, tokens)
    got = decompose_resid(model, mine, None, granularity=granularity)
    expected = decompose_resid(ref, theirs, None, granularity=granularity)
    compare(out, "decompose_resid", got.components, expected.components)
    out["labels"] = got.labels == expected.labels and len(names) > 0
    return out


def _graphs(ref, model, tokens) -> dict:
    """An attribution graph (transcoders in place of the mixtures of experts) and a QK
    attribution on it, split and in one process."""
    out, tset = {}, transcoders(ref.cfg, "float64")
    got, expected = (attribution_graph(m, tset, tokens[0], top_k=3) for m in (model, ref))
    out["graph_nodes"] = torch.equal(got.features, expected.features)
    compare(out, "attribution_graph", got.adjacency, expected.adjacency)
    got, expected = (graph_qk_attribution(m, tset, g, 1, 3, 2)
                     for m, g in ((model, got), (ref, expected)))  # fmt: skip
    out["graph_qk_labels"] = got.key_labels == expected.key_labels
    compare(out, "graph_qk_attribution", got.terms, expected.terms)
    return out


def parameter_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def main(out_dir: str) -> None:
    group = parallel.tensor_parallel_group(2)
    results = {}
    for model_name, fields in MODELS.items():
        for dtype_name, dtype in DTYPES.items():
            start = time.perf_counter()
            ref = random_tiny_model(dtype=dtype, **fields)
            model = parallel.tensor_parallel(copy.deepcopy(ref), group)
            case = gradient_methods(ref, model, dtype_name)
            if dtype is torch.float64:
                case |= weight_readers(ref, model)
            ratio = parameter_bytes(model) / parameter_bytes(ref)
            assert ratio <= 0.6, (model_name, dtype_name, ratio)
            case["parameter_bytes_ratio"] = ratio
            if dtype is torch.float32:
                folder = Path(out_dir) / model_name  # the same folder on every rank
                case |= training(ref, model, folder)
            case["seconds"] = time.perf_counter() - start
            results[f"{model_name} {dtype_name}"] = case
    (Path(out_dir) / f"rank{group.rank}.json").write_text(json.dumps(results, indent=1))
    beyond = {name: beyond_dense(ref, parallel.tensor_parallel(copy.deepcopy(ref), group))
              for name, ref in BEYOND_DENSE.items()}  # fmt: skip
    (Path(out_dir) / f"beyond{group.rank}.json").write_text(json.dumps(beyond, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
