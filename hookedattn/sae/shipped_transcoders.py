"""Transcoders shipped with the package, trained on the shipped models
(`scripts/train_transcoders.py`).

`hookedattn/sae/pretrained/<model>/transcoders/` holds per-layer transcoders, one folder
per layer in SAELens's layout (`layer_0/cfg.json`, ...); `.../clt/` a cross-layer
transcoder in circuit-tracer's layout. Each has a `training.json`: the command, the bar set
before training, and what it measured on held-out text.
"""

import json
from pathlib import Path
from typing import Any

from hookedattn.sae.cross_layer import CrossLayerTranscoder
from hookedattn.sae.transcoder import Transcoder
from hookedattn.store._manifest import weights_differ

ROOT = Path(__file__).parent / "pretrained"
KINDS = {"per_layer": "transcoders", "cross_layer": "clt"}


def list_pretrained_transcoders() -> list[tuple[str, str]]:
    """`(model name, kind)` of every shipped set; kind is `"per_layer"` or `"cross_layer"`."""
    return sorted(
        (p.parent.parent.name, kind)
        for kind, folder in KINDS.items()
        for p in ROOT.glob(f"*/{folder}/training.json")
    )


def load_pretrained_transcoders(
    model_name: str, kind: str = "per_layer", model: Any = None
) -> list[Transcoder] | CrossLayerTranscoder:
    """The shipped transcoders of `model_name`: a list (one per layer) for `"per_layer"`,
    one `CrossLayerTranscoder` for `"cross_layer"`; a `KeyError` lists the shipped ones.

    With `model`, a `ValueError` unless its weights are the ones they were trained on (the
    SHA-256 in `training.json`).
    """
    shipped = list_pretrained_transcoders()
    if (model_name, kind) not in shipped:
        listed = ", ".join(f"({m!r}, {k!r})" for m, k in shipped) or "none"
        raise KeyError(f"no shipped {kind!r} transcoders for {model_name!r}; shipped: {listed}")
    if model is not None:
        record = pretrained_transcoders_record(model_name, kind)
        trained_on = f"the shipped {kind} transcoders were trained on {model_name}"
        differ = weights_differ(model, record["model_weights_sha256"], trained_on)
        if differ is not None:
            raise ValueError(f"{differ}: retrain them ({record['command']})")
    folder = ROOT / model_name / KINDS[kind]
    if kind == "cross_layer":
        return CrossLayerTranscoder.load(folder)
    return [Transcoder.load(p) for p in sorted(folder.glob("layer_*"), key=_layer_number)]


def pretrained_transcoders_record(model_name: str, kind: str = "per_layer") -> dict:
    """The `training.json` of a shipped set: command, bar, and held-out measurements."""
    return json.loads((ROOT / model_name / KINDS[kind] / "training.json").read_text())


def _layer_number(path: Path) -> int:
    return int(path.name.removeprefix("layer_"))
