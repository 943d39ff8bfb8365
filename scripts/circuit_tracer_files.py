"""circuit-tracer 0.5 writes transcoder sets and reads ours, with its own code.

Run in circuit-tracer's environment (`.ci/circuit_tracer.sh`), which never imports hookedattn:

    python scripts/circuit_tracer_files.py IN.pt OUT.pt

IN.pt holds `{"write": [...], "read": [...], "graphs": [...]}` (each list may be empty):

- a `write` job, `{"folder", "kind", "layers", "feature_input_hook", "feature_output_hook",
  "model_name", "scan"}`: the given weights go into circuit-tracer's own modules, in its
  parameters' layout, and its `to_safetensors` writes them. `kind` "per_layer": `layers[l]`
  holds `W_enc [d_sae d_model]`, `W_dec [d_sae d_model]`, `b_enc`, `b_dec`, optional
  `W_skip [d_model d_model]` and `threshold [d_sae]` (JumpReLU), for a `SingleLayerTranscoder`
  each, in a `TranscoderSet`. `kind` "cross_layer": `layers[l]` holds `W_enc [d_sae
  d_model]`, `b_enc`, `b_dec`, `W_dec [d_sae layer_out d_model]`, optional `threshold`, for a
  `CrossLayerTranscoder`. The `config.yaml` beside them is the one circuit-tracer's cache
  keeps (`save_transcoders_to_cache`: the hub config's fields, `scan`, `revision`, dumped by
  PyYAML). Each folder is then read back by circuit-tracer's loader, to show it is its own.
- a `read` job, `{"folder", "x"}`: circuit-tracer's `load_transcoders_from_cache` reads a
  folder (ours), and OUT.pt reports what it got (`_report`): the hooks, the scan, each
  tensor in circuit-tracer's layout, the activation's kind, and its outputs on `x [layer pos
  d_model]` (each layer's MLP input).
- a `graphs` job, `{"config", "weights", "transcoders", "tokenizer", "special_token",
  "tokens", "targets"}`: a TransformerLens model of `config` (TL's names) with `weights`,
  the set in the folder `transcoders` (read as above), the tokenizer in the folder
  `tokenizer` (its `tokenizer.json`, `special_token` its BOS), and circuit-tracer's
  `attribute` of the prompt `tokens` (ids, BOS first) for the logits `targets` (ids), every
  feature kept: OUT.pt reports the graph's tensors and the model's last logits.

OUT.pt: `{"versions", "written", "read", "graphs"}`, one entry per job, in order.
"""

import importlib.metadata
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml

CPU = torch.device("cpu")


def _write(job: dict[str, Any]) -> dict[str, Any]:
    """One `write` job (module docstring): the folder circuit-tracer wrote, read back."""
    folder = Path(job["folder"])
    layers = job["layers"]
    if job["kind"] == "per_layer":
        module = _transcoder_set(layers, job)
        kind = "transcoder_set"
    else:
        module = _cross_layer(layers, job)
        kind = "cross_layer_transcoder"
    module.to_safetensors(str(folder))
    config = {
        "model_name": job["model_name"],
        "model_kind": kind,
        "feature_input_hook": job["feature_input_hook"],
        "feature_output_hook": job["feature_output_hook"],
        "revision": None,
        "scan": job["scan"],
    }
    with open(folder / "config.yaml", "w") as f:
        yaml.dump(config, f)
    return _report(folder, job.get("x"))


def _transcoder_set(layers: list[dict], job: dict[str, Any]) -> Any:
    from circuit_tracer.transcoder import SingleLayerTranscoder, TranscoderSet
    from circuit_tracer.transcoder.activation_functions import JumpReLU

    transcoders = {}
    for layer, t in enumerate(layers):
        d_sae, d_model = t["W_enc"].shape
        jump = "threshold" in t
        activation = JumpReLU(t["threshold"].clone(), 0.1) if jump else F.relu
        tc = SingleLayerTranscoder(d_model, d_sae, activation, layer, "W_skip" in t,
                                   device=CPU, dtype=torch.float32)  # fmt: skip
        with torch.no_grad():
            for name in ("W_enc", "W_dec", "b_enc", "b_dec", "W_skip"):
                if name in t:
                    getattr(tc, name).copy_(t[name])
        transcoders[layer] = tc
    hooks = job["feature_input_hook"], job["feature_output_hook"]
    return TranscoderSet(transcoders, *hooks, scan=job["scan"])


def _cross_layer(layers: list[dict], job: dict[str, Any]) -> Any:
    from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder

    n = len(layers)
    d_sae, d_model = layers[0]["W_enc"].shape
    jump = "threshold" in layers[0]
    clt = CrossLayerTranscoder(
        n, d_sae, d_model, "jump_relu" if jump else "relu", lazy_decoder=False,
        feature_input_hook=job["feature_input_hook"],
        feature_output_hook=job["feature_output_hook"], scan=job["scan"], device=CPU,
        dtype=torch.float32,
    )  # fmt: skip
    with torch.no_grad():
        for layer, t in enumerate(layers):
            clt.W_enc[layer].copy_(t["W_enc"])
            clt.b_enc[layer].copy_(t["b_enc"])
            clt.b_dec[layer].copy_(t["b_dec"])
            clt.W_dec[layer].copy_(t["W_dec"])
            if jump:
                clt.activation_function.threshold[layer, 0].copy_(t["threshold"])
    return clt


def _load(folder: Path) -> tuple[Any, dict]:
    """circuit-tracer's own loader of a local folder (its cache's: a `config.yaml` with
    `model_kind`, and the layer files), every weight in memory."""
    from circuit_tracer.utils.caching import load_transcoders_from_cache

    return load_transcoders_from_cache(
        folder.name, cache_dir=folder.parent, device=CPU, dtype=torch.float32,
        lazy_encoder=False, lazy_decoder=False,
    )  # fmt: skip


def _report(folder: Path, x: torch.Tensor | None) -> dict[str, Any]:
    """What circuit-tracer's loader got from `folder` (module docstring)."""
    from circuit_tracer.transcoder.activation_functions import JumpReLU

    loaded, config = _load(folder)
    out: dict[str, Any] = {
        "config": config,
        "type": type(loaded).__name__,
        "feature_input_hook": loaded.feature_input_hook,
        "feature_output_hook": loaded.feature_output_hook,
        "scan": loaded.scan,
        "layers": [],
    }
    jump = isinstance(loaded.activation_function if out["type"] == "CrossLayerTranscoder"
                      else loaded[0].activation_function, JumpReLU)  # fmt: skip
    out["activation"] = "jumprelu" if jump else "relu"
    with torch.no_grad():
        if out["type"] == "CrossLayerTranscoder":
            for layer in range(loaded.n_layers):
                t = {"W_enc": loaded.W_enc[layer], "b_enc": loaded.b_enc[layer],
                     "b_dec": loaded.b_dec[layer], "W_dec": loaded.W_dec[layer]}  # fmt: skip
                if jump:
                    t["threshold"] = loaded.activation_function.threshold[layer, 0]
                out["layers"].append({k: v.detach().clone() for k, v in t.items()})
            if x is not None:
                out["outputs"] = loaded(x)
            return out
        for tc in loaded:
            t = {n: getattr(tc, n) for n in ("W_enc", "W_dec", "b_enc", "b_dec")}
            if tc.W_skip is not None:
                t["W_skip"] = tc.W_skip
            if jump:
                t["threshold"] = tc.activation_function.threshold
            out["layers"].append({k: v.detach().clone() for k, v in t.items()})
        if x is not None:
            out["outputs"] = torch.stack([tc(x[layer]) for layer, tc in enumerate(loaded)])
    return out


def _graph(job: dict[str, Any]) -> dict[str, Any]:
    """circuit-tracer's attribution graph of one prompt (module docstring)."""
    from circuit_tracer import attribute
    from circuit_tracer.replacement_model.replacement_model_transformerlens import (
        TransformerLensReplacementModel,
    )
    from transformer_lens import HookedTransformerConfig
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    transcoders, _ = _load(Path(job["transcoders"]))
    # Its tokenizer.json, saved again by this transformers (the folder's config names a class
    # of transformers 5's), for TransformerLens reloads it by its path.
    special, folder = job["special_token"], Path(job["tokenizer"])
    PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        bos_token=special, eos_token=special, pad_token=special,
    ).save_pretrained(folder.with_name(folder.name + "_4"))  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(folder.with_name(folder.name + "_4"))
    cfg = HookedTransformerConfig(**job["config"])
    model = TransformerLensReplacementModel.from_config(cfg, transcoders, tokenizer=tokenizer)
    # from_config wraps each MLP (`ReplacementMLP.old_mlp`) and the unembedding
    wrapped = {k.replace(".mlp.", ".mlp.old_mlp.").replace("unembed.", "unembed.old_unembed."): v
               for k, v in job["weights"].items()}  # fmt: skip
    missing, unexpected = model.load_state_dict(wrapped, strict=False)
    buffers = ("IGNORE", "mask", "rotary_sin", "rotary_cos")  # the model's own, not weights
    missing = [k for k in missing if not (k.startswith("transcoders.") or k.endswith(buffers))]
    if unexpected or missing:
        raise SystemExit(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    model.eval()
    graph = attribute(torch.tensor(job["tokens"]), model, batch_size=64,
                      attribution_targets=torch.tensor(job["targets"]))  # fmt: skip
    return {
        "input_tokens": graph.input_tokens.cpu(),
        "input_string": graph.input_string,
        "active_features": graph.active_features.cpu(),
        "activation_values": graph.activation_values.cpu(),
        "selected_features": graph.selected_features.cpu(),
        "logit_tokens": torch.tensor([t.vocab_idx for t in graph.logit_targets]),
        "logit_probabilities": graph.logit_probabilities.cpu(),
        "adjacency_matrix": graph.adjacency_matrix.cpu(),
        "scan": graph.scan,
        "logits": model(torch.tensor(job["tokens"])[None])[0, -1].detach(),
    }


def main(source: str, target: str) -> None:
    given = torch.load(source, weights_only=False)
    packages = ("circuit-tracer", "torch", "transformer-lens", "transformers")
    versions = {p: importlib.metadata.version(p) for p in packages}
    out = {
        "versions": versions,
        "written": [_write(job) for job in given.get("write", [])],
        "read": [_report(Path(job["folder"]), job.get("x")) for job in given.get("read", [])],
        "graphs": [_graph(job) for job in given.get("graphs", [])],
    }
    torch.save(out, target)


if __name__ == "__main__":
    main(*sys.argv[1:])
