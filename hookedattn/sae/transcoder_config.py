"""The configs of the transcoders: one layer's (`TranscoderConfig`, SAELens's fields) and a
cross-layer transcoder's (`CrossLayerTranscoderConfig`, circuit-tracer's), validated on
construction."""

import dataclasses

import torch

from hookedattn.core import names as _names
from hookedattn.sae._coder_parts import check_coder_fields
from hookedattn.sae.config import DTYPES


@dataclasses.dataclass(frozen=True)
class TranscoderConfig:
    """A transcoder from `d_in` (read at `hook_name`) through `d_sae` features to `d_out`
    (written at `hook_name_out`), in SAELens's terms.

    `activation`: `"relu"`, `"topk"` (with `k`) or `"jumprelu"`, as for an SAE. `skip`:
    add the linear skip term `x @ W_skip.T` (a skip transcoder). `seed` draws the initial
    weights. The layer is read off the hook names (`blocks.L.ln2.hook_out` →
    `blocks.L.hook_mlp_out`).
    """

    d_in: int
    d_sae: int
    d_out: int
    hook_name: str = ""
    hook_name_out: str = ""
    activation: str = "relu"
    k: int | None = None
    skip: bool = False
    dtype: str = "float32"
    seed: int | None = 0

    def __post_init__(self) -> None:
        check_coder_fields(self, ("d_in", "d_sae", "d_out"))
        if not isinstance(self.skip, bool):
            raise ValueError(f"skip must be a bool, got {self.skip!r}")
        layers = {_names.layer_of(n) for n in (self.hook_name, self.hook_name_out) if n}
        if len(layers) > 1:
            raise ValueError(
                f"a transcoder reads and writes within one layer; hook_name={self.hook_name!r} "
                f"and hook_name_out={self.hook_name_out!r} name different layers"
            )

    @property
    def layer(self) -> int | None:
        """The block the transcoder belongs to, from its hook names (None if they name none)."""
        return _names.layer_of(self.hook_name_out or self.hook_name)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype of the weights, as a `torch.dtype`."""
        return DTYPES[self.dtype]


@dataclasses.dataclass(frozen=True)
class CrossLayerTranscoderConfig:
    """A cross-layer transcoder over blocks `0..n_layers-1`: `d_sae` features per layer,
    each reading `d_in` at its block's `feature_input_hook` and writing `d_out` to the
    `feature_output_hook` of its block and of every later one (circuit-tracer's names:
    hooks relative to the block, `blocks.L.<hook>`).

    `activation` and `k` as for `TranscoderConfig` (one per layer: a TopK keeps the `k`
    largest of each layer's features). No skip term: circuit-tracer's files do not keep
    one for a cross-layer transcoder.
    """

    n_layers: int
    d_in: int
    d_sae: int
    d_out: int
    activation: str = "relu"
    k: int | None = None
    feature_input_hook: str = "ln2.hook_out"
    feature_output_hook: str = "hook_mlp_out"
    dtype: str = "float32"
    seed: int | None = 0

    def __post_init__(self) -> None:
        check_coder_fields(self, ("n_layers", "d_in", "d_sae", "d_out"))
        for field in ("feature_input_hook", "feature_output_hook"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value or value.startswith("blocks."):
                raise ValueError(
                    f"{field} is a hook name within a block (e.g. 'ln2.hook_out', "
                    f"'hook_mlp_out'), got {value!r}"
                )

    def hook_name(self, layer: int) -> str:
        """The full name of the point layer `layer`'s features read."""
        return f"blocks.{layer}.{self.feature_input_hook}"

    def hook_name_out(self, layer: int) -> str:
        """The full name of the point the features write to at layer `layer`."""
        return f"blocks.{layer}.{self.feature_output_hook}"

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype of the weights, as a `torch.dtype`."""
        return DTYPES[self.dtype]
