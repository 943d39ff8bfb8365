"""`SparseAutoencoder.from_pretrained(release, sae_id)`: one released SAE's files, fetched
from the hub (that SAE's only) and read in their format.

- `saelens`: the SAE's folder, `cfg.json` + `sae_weights.safetensors` (and our
  `hookedattn_weights.safetensors` where we wrote the folder), read by
  `hookedattn.sae._io` after the release's `config_overrides` are applied to the config, as
  SAELens applies them. A config with `normalize_activations="expected_average_only_in"`
  and a `norm_scaling_factor` in the registry has the factor folded into the weights, as
  SAELens's `fold_activation_norm_scaling_factor` folds it (`W_enc * s`, `W_dec / s`,
  `b_dec / s`): the SAE then reads the model's own activations.
- `gemma_scope`, `gemma_scope_2`: `params.npz`, `params.safetensors`
  (`hookedattn.sae.releases._gemma_scope`).

Other formats in SAELens's registry are listed but refused, with the SAELens call that
converts them to its folder layout.
"""

from typing import Any

import torch

from hookedattn.core.hub import HubOptions, snapshot
from hookedattn.sae import _io
from hookedattn.sae.releases import _gemma_scope, _shared
from hookedattn.sae.releases._registry import LOADABLE, ReleasedSAE, lookup

_SAELENS_FILES = (_io.CFG_FILE, _io.WEIGHTS_FILE)
_NORMALIZED = ("expected_average_only_in", True)


def load(cls: type, release: str, sae_id: str, options: HubOptions, device: Any, dtype: Any) -> Any:
    """The SAE `sae_id` of `release` (a `cls`), fetched with `options`, then placed."""
    _shared.torch_dtype(dtype)  # a bad dtype is refused before anything is fetched
    entry = lookup(release, sae_id)
    _check_loadable(entry)
    if entry.format == "saelens":
        wanted, required = [*_SAELENS_FILES, _io.EXTRA_FILE], list(_SAELENS_FILES)
    else:
        wanted = required = [_gemma_scope.FILES[entry.format]]
    files = {name: _shared.in_repo(entry.repo_id, entry.path, name) for name in wanted}
    folder = snapshot(entry.repo_id, [_shared.literal(f) for f in files.values()], options)
    what = f"SAE {sae_id!r} of {release!r}"
    _shared.require(folder, [files[n] for n in required], entry.repo_id, options, what)
    sae_folder = (folder / files[required[0]]).parent
    if entry.format == "saelens":
        sae = _saelens(cls, sae_folder, entry)
    else:
        sae = _gemma_scope.load(cls, sae_folder, entry.format, entry.hook)
    return _shared.place(sae, device, dtype)


def _check_loadable(entry: ReleasedSAE) -> None:
    if entry.kind != "sae":
        raise ValueError(
            f"release {entry.release!r} holds transcoders ({entry.format} files), not SAEs: "
            f"circuit-tracer's transcoder sets load with TranscoderSet.from_pretrained (e.g. "
            f"'gemma' for Gemma Scope's)"
        )
    if entry.format not in LOADABLE:
        raise ValueError(
            f"release {entry.release!r} is in {entry.format!r} files (SAELens's "
            f"{entry.format} loader), which are not read here (read: {', '.join(LOADABLE)}). "
            f"SAELens converts it to its folder layout: sae_lens.SAE.from_pretrained("
            f"{entry.release!r}, {entry.sae_id!r}).save_model('folder'), then "
            f"SparseAutoencoder.load('folder')"
        )


def _saelens(cls: type, folder: Any, entry: ReleasedSAE) -> Any:
    raw = _io.read_config(folder)
    if not isinstance(raw, dict):
        raise ValueError(f"{folder / _io.CFG_FILE} must hold a JSON object")
    raw = {**raw, **entry.config_overrides}
    scale = None
    if raw.get("normalize_activations") in _NORMALIZED and entry.norm_scaling_factor:
        scale = float(entry.norm_scaling_factor)
        raw["normalize_activations"] = "none"
    sae = _io.load_with_config(cls, folder, raw)
    if scale is not None:
        _fold_input_scale(sae, scale)
    return sae


@torch.no_grad()
def _fold_input_scale(sae: Any, scale: float) -> None:
    """An SAE that reads `x * scale` and writes its reconstruction `/ scale` as one that
    reads and writes `x`: the encoder times `scale`, decoder and biases it subtracts or
    adds in input units over `scale` (the pre-activations are unchanged)."""
    sae.W_enc.mul_(scale)
    sae.W_dec.div_(scale)
    sae.b_dec.div_(scale)
    if sae.cfg.pre_bias == "untied":
        sae.pre_bias.b_pre.div_(scale)
