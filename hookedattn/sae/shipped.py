"""SAEs shipped with the package, trained on the shipped models (`scripts/train_sae.py`).

Each lives in `hookedattn/sae/pretrained/<model>/<hook name>/` in SAELens's layout, with a
`training.json` saying how it was made and what it measured on held-out text.
"""

import json
from pathlib import Path
from typing import Any

from hookedattn.sae import _io
from hookedattn.sae.autoencoder import SparseAutoencoder
from hookedattn.store._manifest import weights_differ

ROOT = Path(__file__).parent / "pretrained"


def list_pretrained_saes() -> list[tuple[str, str]]:
    """`(model name, hook name)` of every shipped SAE."""
    return sorted((p.parent.parent.name, p.parent.name) for p in ROOT.glob(f"*/*/{_io.CFG_FILE}"))


def load_pretrained_sae(model_name: str, hook_name: str, model: Any = None) -> SparseAutoencoder:
    """The shipped SAE of `model_name` at `hook_name`; a `KeyError` lists the shipped ones.

    With `model`, a `ValueError` unless its weights are the ones the SAE was trained on
    (the SHA-256 in `training.json`): an SAE read against other weights is not the model's
    dictionary, and its recorded measurements do not hold.
    """
    shipped = list_pretrained_saes()
    if (model_name, hook_name) not in shipped:
        listed = ", ".join(f"({m!r}, {h!r})" for m, h in shipped) or "none"
        raise KeyError(f"no shipped SAE for {model_name!r} at {hook_name!r}; shipped: {listed}")
    if model is not None:
        record = pretrained_sae_record(model_name, hook_name)
        trained_on = f"the shipped SAE at {hook_name} was trained on {model_name}"
        differ = weights_differ(model, record["model_weights_sha256"], trained_on)
        if differ is not None:
            raise ValueError(f"{differ}: retrain it ({record['command']})")
    return SparseAutoencoder.load(ROOT / model_name / hook_name)


def pretrained_sae_record(model_name: str, hook_name: str) -> dict:
    """The `training.json` of a shipped SAE: its command and held-out measurements."""
    return json.loads((ROOT / model_name / hook_name / "training.json").read_text())
