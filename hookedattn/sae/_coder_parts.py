"""What the transcoders' configs and modules share: field checks and the activation factory."""

import torch
from torch import nn

from hookedattn.sae._activations import JumpReLU, ReLU, TopK
from hookedattn.sae.config import ACTIVATIONS, DTYPES


def check_coder_fields(cfg: object, sizes: tuple[str, ...]) -> None:
    """The checks every transcoder config shares: sizes, activation, `k`, dtype, seed."""
    for field in sizes:
        value = getattr(cfg, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{field} must be a positive int, got {value!r}")
    if cfg.activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {cfg.activation!r}")
    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {cfg.dtype!r}")
    if cfg.activation == "topk":
        k = cfg.k
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= cfg.d_sae:
            raise ValueError(
                f"a topk transcoder needs k, an int in 1..d_sae={cfg.d_sae}, got {k!r}"
            )
    elif cfg.k is not None:
        raise ValueError(f"k is for activation='topk' only, not {cfg.activation!r}")
    if cfg.seed is not None and (not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool)):
        raise ValueError(f"seed must be an int or None, got {cfg.seed!r}")


def make_coder_activation(
    activation: str, k: int | None, d_sae: int, dtype: torch.dtype
) -> nn.Module:
    """The activation module `activation` names (the SAEs' own modules)."""
    if activation == "topk":
        return TopK(k)
    if activation == "jumprelu":
        return JumpReLU(d_sae, dtype)
    return ReLU()


def seeded_generator(seed: int | None) -> torch.Generator | None:
    """A CPU generator seeded by `seed`, or None (the global RNG) when it is None."""
    return None if seed is None else torch.Generator().manual_seed(seed)
