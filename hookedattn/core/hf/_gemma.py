"""Gemma's constants as HF computes them: the `1 + w` norm gain (in float32, or float64 for
a float64 model: "Float64 means float64" in the design page), the embedding's `sqrt(d_model)`
normaliser rounded as HF rounds it, and the local layers' own rotary. Gemma 2 and 3 are
imported by convention (`_convention`, which reads `one_plus`); Gemma 4's written family
(`_gemma4`) reads the rest.
"""

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


def one_plus(w: Tensor) -> Tensor:
    """Gemma's gain `1 + w`, computed in float32 as `Gemma2RMSNorm` computes it (in float64
    for a float64 model, which computes in float64 throughout)."""
    return 1.0 + (w if w.dtype == torch.float64 else w.float())


def embedding_normaliser(
    hf_config: Any,
    dtype: torch.dtype,
    hf_model: Any = None,
    width: int | None = None,
    module: Any = None,
) -> Tensor:
    """`sqrt(d_model)` as HF multiplies by it: the model's own constant when there is one;
    else as `from_pretrained` builds it, a tensor of the default dtype (float32, or float64
    for a float64 model) cast to the weights' dtype. `width` and `module`: another
    embedding's (Gemma 4's per-layer inputs: `sqrt` of their width, their module's)."""
    if module is None and hf_model is not None:
        module = hf_model.model.embed_tokens
    if module is not None:
        return module.embed_scale.to(dtype)
    built = torch.float64 if dtype == torch.float64 else torch.float32
    width = hf_config.hidden_size if width is None else width
    return torch.tensor(width**0.5, dtype=built).to(dtype)


def scaled(normaliser: Tensor) -> Callable[[Tensor], Tensor]:
    """The adjustment that multiplies `W_E` by the embedding's normaliser (Gemma 2, 3)."""

    def scale(W_E: Tensor) -> Tensor:
        return W_E * normaliser.to(W_E.device)

    return scale


def local_rotary(rope: dict[str, Any]) -> dict[str, Any]:
    """The fields of the rotary of Gemma's local (sliding-window) layers, from its entry of
    `rope_parameters`: a base and a linear scaling, no other kind."""
    rope_type = rope.get("rope_type", "default")
    if rope_type not in ("default", "linear"):
        raise ValueError(
            f"the local layers' rope_type {rope_type!r} cannot be imported; supported for "
            f"them: default, linear"
        )
    factor = float(rope["factor"]) if rope_type == "linear" else 1.0
    return dict(rotary_base_local=float(rope["rope_theta"]), rotary_scaling_factor_local=factor)
