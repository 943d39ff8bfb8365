"""The configuration of a `HookedTransformer`: one frozen dataclass, validated on construction.

Every architectural variant (attention-only, the kind of normalisation, the positional
scheme, the optional per-head hook points) is decided here, once; the model reads these
fields when it builds its modules and never branches on them inside `forward`.
"""

import dataclasses
import difflib
import json
import math
from typing import Any

import torch

ACT_FNS: tuple[str, ...] = ("relu", "gelu", "gelu_new", "silu")
NORMALIZATION_TYPES: tuple[str | None, ...] = (None, "LN", "LNPre", "RMS", "RMSPre")
POSITIONAL_EMBEDDING_TYPES: tuple[str, ...] = ("standard", "rotary", "none")
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def _closest(value: object, valid: tuple) -> str:
    """A hint naming the valid choices closest to `value`, for error messages."""
    names = [str(v) for v in valid]
    close = difflib.get_close_matches(str(value), names, n=2, cutoff=0.5)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    return f"valid values are {', '.join(repr(v) for v in valid)}{hint}"


@dataclasses.dataclass(frozen=True)
class HookedTransformerConfig:
    """Shape and variant of a `HookedTransformer`; field names follow TransformerLens.

    `n_heads` and `d_head` may each be left out when the other divides `d_model`; attention
    weights are stored per head (`W_Q: [head d_model d_head]`), so `d_model == n_heads *
    d_head` is not otherwise required. `d_vocab_out` defaults to `d_vocab`. `d_mlp` is
    required unless `attn_only`. `init_range` is the standard deviation of the normal
    initialisation (default `0.8 / sqrt(d_model)`, as TransformerLens). `attn_scale` divides
    the attention scores (default `sqrt(d_head)`). `seed` seeds the initialisation through a
    private generator, so the global torch RNG is left untouched.
    """

    n_layers: int
    d_model: int
    n_ctx: int
    d_vocab: int
    n_heads: int | None = None
    d_head: int | None = None
    d_mlp: int | None = None
    # Choices are plain `str` here (see ACT_FNS etc.) so that a bad value gets our error,
    # naming the closest valid choice, rather than a generic type-check failure.
    act_fn: str = "gelu"
    attn_only: bool = False
    normalization_type: str | None = "LN"
    positional_embedding_type: str = "standard"
    rotary_dim: int | None = None
    rotary_base: float = 10000.0
    d_vocab_out: int | None = None
    attn_scale: float | None = None
    eps: float = 1e-5
    use_attn_result: bool = False
    use_split_qkv_input: bool = False
    use_hook_mlp_in: bool = False
    use_attn_in: bool = False
    dtype: torch.dtype | str = torch.float32
    device: str = "cpu"
    seed: int | None = None
    init_range: float | None = None
    model_name: str = "custom"
    original_architecture: str | None = None

    def __post_init__(self) -> None:
        set_ = lambda field, value: object.__setattr__(self, field, value)
        for field in ("n_layers", "d_model", "n_ctx", "d_vocab"):
            value = getattr(self, field)
            minimum = 0 if field == "n_layers" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"{field} must be an int >= {minimum}, got {value!r}")
        if self.n_heads is None and self.d_head is None:
            raise ValueError("give n_heads or d_head (or both); got neither")
        if self.n_heads is None:
            if self.d_model % self.d_head:
                raise ValueError(
                    f"n_heads was left out, so d_model must be a multiple of d_head; "
                    f"got d_model={self.d_model}, d_head={self.d_head}"
                )
            set_("n_heads", self.d_model // self.d_head)
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"d_head was left out, so d_model must be a multiple of n_heads; "
                    f"got d_model={self.d_model}, n_heads={self.n_heads}"
                )
            set_("d_head", self.d_model // self.n_heads)
        for field in ("n_heads", "d_head"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field} must be an int >= 1, got {value!r}")
        if self.use_attn_in and self.use_split_qkv_input:
            raise ValueError(
                "use_attn_in and use_split_qkv_input are alternatives (one shared per-head "
                "input, or one per q/k/v); set at most one"
            )
        if self.attn_only:
            if self.use_hook_mlp_in:
                raise ValueError("use_hook_mlp_in=True needs MLPs, but attn_only=True")
        else:
            if self.d_mlp is None:
                raise ValueError(
                    "d_mlp is required for a model with MLPs (attn_only=False); "
                    "give d_mlp, e.g. 4 * d_model, or set attn_only=True"
                )
            if not isinstance(self.d_mlp, int) or self.d_mlp < 1:
                raise ValueError(f"d_mlp must be an int >= 1, got {self.d_mlp!r}")
        if self.act_fn not in ACT_FNS:
            raise ValueError(f"unknown act_fn {self.act_fn!r}: {_closest(self.act_fn, ACT_FNS)}")
        if self.normalization_type not in NORMALIZATION_TYPES:
            raise ValueError(
                f"unknown normalization_type {self.normalization_type!r}: "
                f"{_closest(self.normalization_type, NORMALIZATION_TYPES)}"
            )
        if self.positional_embedding_type not in POSITIONAL_EMBEDDING_TYPES:
            raise ValueError(
                f"unknown positional_embedding_type {self.positional_embedding_type!r}: "
                f"{_closest(self.positional_embedding_type, POSITIONAL_EMBEDDING_TYPES)}"
            )
        if self.positional_embedding_type == "rotary":
            if self.rotary_dim is None:
                set_("rotary_dim", self.d_head)
            if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.d_head:
                raise ValueError(
                    f"rotary_dim must be even and in 1..d_head={self.d_head}, got {self.rotary_dim}"
                )
        if self.d_vocab_out is None:
            set_("d_vocab_out", self.d_vocab)
        if isinstance(self.dtype, str):
            if self.dtype not in DTYPES:
                raise ValueError(
                    f"unknown dtype {self.dtype!r}: {_closest(self.dtype, tuple(DTYPES))}"
                )
            set_("dtype", DTYPES[self.dtype])
        if self.dtype not in DTYPES.values():
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.attn_scale is None:
            set_("attn_scale", math.sqrt(self.d_head))
        if self.init_range is None:
            set_("init_range", 0.8 / math.sqrt(self.d_model))

    @property
    def has_mlp(self) -> bool:
        """Whether each block has an MLP sublayer."""
        return not self.attn_only

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict from which `from_dict` rebuilds this config."""
        out = dataclasses.asdict(self)
        out["dtype"] = next(name for name, dt in DTYPES.items() if dt == self.dtype)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HookedTransformerConfig":
        """Rebuild a config from `to_dict` output; unknown keys are an error that names them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config fields {unknown}; known fields are {sorted(known)}")
        return cls(**data)

    def to_json(self) -> str:
        """The config as indented JSON text."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def replace(self, **changes: Any) -> "HookedTransformerConfig":
        """A copy with some fields changed, validated again."""
        return dataclasses.replace(self, **changes)
