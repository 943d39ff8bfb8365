"""The published numbers an independent check needs, each written here from its source.

    from hookedattn.testing import published_constants
    constants = published_constants(d_head=64)   # attn_scale 8.0, eps 1e-05, rotary_base 10000
    constants = published_constants(d_head=64, eps=1e-6)   # a model that sets its own eps

`ReferenceTransformer` and `assert_residual_identities` take their constants from here, never
from the model's config: were they to read `cfg.eps` or `cfg.attn_scale`, a wrong default in
`HookedTransformerConfig` would change the model and its reference alike, and no test would
fail. A model whose config holds other values (an imported checkpoint with its own epsilon,
a test that sets one) is checked against the values its caller states, written from that
model's own source.

The sources, each value written as they give it:

    attention scale  sqrt(d_head): "we scale the dot products by 1/sqrt(d_k)", Vaswani et
                     al. 2017, "Attention Is All You Need", sec. 3.2.1, eq. 1; also
                     TransformerLens 3.5.1 (`attn_scale` defaults to `np.sqrt(d_head)`)
    norm epsilon     1e-5: TransformerLens 3.5.1 `HookedTransformerConfig.eps` ("Defaults to
                     1e-5"); the same as `torch.nn.LayerNorm` and GPT-2's
                     `layer_norm_epsilon`
    rotary base      10000: Su et al. 2021, "RoFormer", sec. 3.2.2, eq. 15,
                     `theta_i = 10000^(-2(i-1)/d)`; TransformerLens 3.5.1 `rotary_base`
    GELU (tanh)      `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`: Hendrycks & Gimpel
                     2016, "Gaussian Error Linear Units", sec. 2; GPT-2's `gelu_new`
    LayerNorm        `(x - mean x) / sqrt(mean((x - mean x)^2) + eps) * w + b`: Ba et al.
                     2016, eq. 4 (the biased variance, as TransformerLens and torch)
    RMSNorm          `x / sqrt(mean(x^2) + eps) * w`: Zhang & Sennrich 2019, eq. 4
"""

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

NORM_EPS = 1e-5
ROTARY_BASE = 10000.0
# sqrt(2 / pi) and the cubic coefficient of GELU's tanh approximation.
GELU_TANH_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_TANH_CUBIC = 0.044715


def attention_scale(d_head: int) -> float:
    """What attention scores are divided by: `sqrt(d_head)` (Vaswani et al. 2017, eq. 1)."""
    return d_head**0.5


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU's tanh approximation, GPT-2's `gelu_new`, written out from Hendrycks & Gimpel."""
    inner = GELU_TANH_SQRT_2_OVER_PI * (x + GELU_TANH_CUBIC * x**3)
    return 0.5 * x * (1.0 + torch.tanh(inner))


@dataclasses.dataclass(frozen=True)
class Constants:
    """The numbers a check needs besides the weights.

    `attn_scale` divides the attention scores, `eps` is added to the norms' mean square
    before the root, `rotary_base` sets the rotary frequencies `base^(-2i / rotary_dim)`.
    `stated` names the fields the caller stated (the rest are the published values).
    """

    attn_scale: float
    eps: float
    rotary_base: float
    stated: tuple[str, ...] = ()
    source: str = "stated by the caller"  # where the stated ones come from

    def disagreements(
        self, cfg: object, fields: tuple[str, ...] = ("attn_scale", "eps", "rotary_base")
    ) -> list[str]:
        """One line for each of `fields` on which `cfg` (a `HookedTransformerConfig`) differs
        from these; the rotary base only where the model is rotary. Empty when they agree."""
        rotary = getattr(cfg, "positional_embedding_type", None) == "rotary"
        lines = []
        for field in fields:
            if field == "rotary_base" and not rotary:
                continue
            ours, theirs = getattr(self, field), float(getattr(cfg, field))
            if not math.isclose(ours, theirs, rel_tol=1e-12, abs_tol=0.0):
                source = self.source if field in self.stated else _SOURCES[field]
                lines.append(
                    f"{field}: the model's config has {theirs:g}, the check uses {ours:g} "
                    f"({source})"
                )
        return lines


_SOURCES = {
    "attn_scale": "sqrt(d_head), Vaswani et al. 2017, eq. 1",
    "eps": "TransformerLens 3.5.1's default",
    "rotary_base": "RoFormer, eq. 15",
}


def published_constants(d_head: int, **stated: float) -> Constants:
    """The published constants for heads of `d_head` dimensions, with those `stated` by the
    caller (`attn_scale=`, `eps=`, `rotary_base=`) in their place.

    State a constant only for a model that sets its own, with the value from that model's
    source (its checkpoint's config, the test that built it); an unknown name is a
    `TypeError` naming the valid ones.
    """
    if not isinstance(d_head, int) or isinstance(d_head, bool) or d_head < 1:
        raise ValueError(f"d_head must be a positive int, got {d_head!r}")
    valid = ("attn_scale", "eps", "rotary_base")
    unknown = sorted(set(stated) - set(valid))
    if unknown:
        raise TypeError(f"unknown constants {unknown}; the constants are {list(valid)}")
    published = dict(attn_scale=attention_scale(d_head), eps=NORM_EPS, rotary_base=ROTARY_BASE)
    values = {name: float(stated.get(name, published[name])) for name in valid}
    return Constants(**values, stated=tuple(name for name in valid if name in stated))


# A checkpoint's config.json names its norm epsilon in one of these fields (transformers'
# families: Llama and most others, GPT-2, GPT-NeoX and OPT, Falcon, ...).
_EPS_FIELDS = ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps", "norm_epsilon")


def checkpoint_constants(d_head: int, config: Mapping[str, Any]) -> Constants:
    """The constants a checkpoint's own config states (its `config.json`, as a dict: the
    record `HookedTransformer.from_hf` keeps in `model.checkpoint_config`), read here field
    by field, apart from the import's translation of it: the norm epsilon (`rms_norm_eps`,
    `layer_norm_epsilon`, ...), the attention scale (`sqrt(query_pre_attn_scalar)` where
    the config gives one, Gemma's; else the published `sqrt(d_head)`) and the rotary base
    (`rope_theta`, at the top or in `rope_parameters`). Fields it does not give keep their
    published values."""
    stated: dict[str, float] = {}
    eps = next((config[f] for f in _EPS_FIELDS if isinstance(config.get(f), int | float)), None)
    if eps is not None:
        stated["eps"] = float(eps)
    scalar = config.get("query_pre_attn_scalar")
    if isinstance(scalar, int | float) and not isinstance(scalar, bool):
        stated["attn_scale"] = float(scalar) ** 0.5
    rope = config.get("rope_parameters")
    theta = rope.get("rope_theta") if isinstance(rope, Mapping) else config.get("rope_theta")
    if isinstance(theta, int | float) and not isinstance(theta, bool):
        stated["rotary_base"] = float(theta)
    constants = published_constants(d_head, **stated)
    return dataclasses.replace(constants, source="from the checkpoint's config")
