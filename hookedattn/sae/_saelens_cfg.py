"""Reading SAELens's `cfg.json` strictly: every field that changes what the SAE computes is
honoured or refused by name, and every number is the JSON int it must be.

SAELens writes two generations of configs. Before 6.0 (and whenever `sae_lens_version` is
absent, as SAELens itself assumes): `hook_name` (or `hook_point`) at the top level, TopK's
`k` in `activation_fn_kwargs`, and `reshape_activations` implied by a `hook_z` point. From
6.0: `hook_name` under `metadata`, `k` at the top level, `reshape_activations` explicit.

What changes the computation, and what we do with it:

- `architecture`: standard, topk, jumprelu (others refused).
- `apply_b_dec_to_input`: the tied pre-bias (a bool).
- `normalize_activations`, `finetuning_scaling_factor`, `hook_head_index`, an activation
  other than ReLU for a standard SAE: refused (we do not rescale inputs at run time).
- `reshape_activations="hook_z"`: honoured, the SAE reads `[head d_head]` flattened.
- `rescale_acts_by_decoder_norm` (TopK): honoured by folding the decoder norms into the
  encoder (`fold_decoder_norms`), as SAELens's own `fold_W_dec_norm` does; the SAE then
  computes the same features and reconstruction, and saves as a plain TopK SAE.
"""

import dataclasses
from pathlib import Path
from typing import Any

from hookedattn.sae.config import DTYPES, PRE_BIASES, RESHAPES, SAEConfig

ARCHITECTURES = {"relu": "standard", "topk": "topk", "jumprelu": "jumprelu"}
_ACTIVATIONS = {v: k for k, v in ARCHITECTURES.items()}
_NO_NORMALIZATION = (None, "none", False)


@dataclasses.dataclass(frozen=True)
class ParsedConfig:
    """The SAE's config, and what loading must do beyond copying tensors: fold the decoder
    norms into the encoder (`rescale_acts_by_decoder_norm`)."""

    cfg: SAEConfig
    fold_decoder_norms: bool


def _int_field(raw: dict, field: str, where: str | Path) -> int:
    value = raw[field]
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{where}: {field} must be an int, got {value!r} (nothing is rounded)")
    return value


def _bool_field(raw: dict, field: str, where: str | Path, default: bool) -> bool:
    value = raw.get(field, default)
    if not isinstance(value, bool):
        raise ValueError(f"{where}: {field} must be true or false, got {value!r}")
    return value


def _str_field(raw: dict, field: str, where: str | Path, default: str | None) -> str | None:
    value = raw.get(field, default)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where}: {field} must be a string, got {value!r}")
    return value


def parse_config(raw: Any, where: str | Path) -> ParsedConfig:
    """Our `SAEConfig` from a `cfg.json`'s contents, refusing what we do not implement."""
    if not isinstance(raw, dict) or "d_in" not in raw or "d_sae" not in raw:
        raise ValueError(f"{where} is not an SAE config: it needs d_in and d_sae")
    metadata = raw.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ValueError(f"{where}: metadata must be an object, got {metadata!r}")
    architecture = raw.get("architecture", "standard")
    kwargs = raw.get("activation_fn_kwargs") or {}
    activation = raw.get("activation_fn", raw.get("activation_fn_str"))
    if architecture == "standard" and activation == "topk" and "k" in kwargs:
        architecture = "topk"  # before SAELens 6, TopK was a standard SAE's activation
    if architecture not in _ACTIVATIONS:
        raise ValueError(
            f"{where}: architecture {architecture!r} is not supported; supported: "
            f"{', '.join(_ACTIVATIONS)}"
        )
    _refuse_unsupported(raw, metadata, architecture, where)
    hook_name = _hook_name(raw, metadata, where)
    dtype = str(_str_field(raw, "dtype", where, "float32")).removeprefix("torch.")
    if dtype not in DTYPES:
        raise ValueError(f"{where}: dtype {dtype!r} is not one of {tuple(DTYPES)}")
    ours = raw.get("hookedattn", {})
    if not isinstance(ours, dict):
        raise ValueError(f"{where}: hookedattn must be an object, got {ours!r}")
    tied = _bool_field(raw, "apply_b_dec_to_input", where, True)
    pre_bias = ours.get("pre_bias", "tied" if tied else "none")
    if pre_bias not in PRE_BIASES or (pre_bias == "tied") != tied:
        raise ValueError(
            f"{where}: hookedattn.pre_bias={pre_bias!r} does not go with "
            f"apply_b_dec_to_input={tied} (pre_bias is one of {PRE_BIASES}; tied iff true)"
        )
    seed = ours.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ValueError(f"{where}: hookedattn.seed must be an int or null, got {seed!r}")
    cfg = SAEConfig(
        d_in=_int_field(raw, "d_in", str(where)),
        d_sae=_int_field(raw, "d_sae", str(where)),
        hook_name=hook_name,
        activation=_ACTIVATIONS[architecture],
        k=_k(raw, architecture, where),
        pre_bias=pre_bias,
        dtype=dtype,
        seed=seed,
        reshape_activations=_reshape(raw, metadata, hook_name, where),
    )
    rescale = _bool_field(raw, "rescale_acts_by_decoder_norm", where, False)
    if rescale and architecture != "topk":
        raise ValueError(
            f"{where}: rescale_acts_by_decoder_norm is a TopK option, set for a "
            f"{architecture!r} SAE"
        )
    return ParsedConfig(cfg, fold_decoder_norms=rescale)


def _hook_name(raw: dict, metadata: dict, where: str | Path) -> str:
    for source, field in ((raw, "hook_name"), (metadata, "hook_name"), (raw, "hook_point")):
        value = source.get(field)
        if value:
            if not isinstance(value, str):
                raise ValueError(f"{where}: {field} must be a hook name, got {value!r}")
            return value
    return ""


def _k(raw: dict, architecture: str, where: str | Path) -> int | None:
    if architecture != "topk":
        return None
    kwargs = raw.get("activation_fn_kwargs") or {}
    if "k" in raw:
        return _int_field(raw, "k", str(where))
    if isinstance(kwargs, dict) and "k" in kwargs:
        return _int_field(kwargs, "k", f"{where} (activation_fn_kwargs)")
    raise ValueError(f"{where}: a topk SAE needs k (at the top level or in activation_fn_kwargs)")


def _reshape(raw: dict, metadata: dict, hook_name: str, where: str | Path) -> str:
    version = raw.get("sae_lens_version") or metadata.get("sae_lens_version")
    # SAELens reads a config without a 6.x version as an older one, where an SAE at a
    # hook_z point reads the heads' z flattened.
    older = not (isinstance(version, str) and version.split(".")[0].isdigit() and
                 int(version.split(".")[0]) >= 6)  # fmt: skip
    default = "hook_z" if older and "hook_z" in hook_name else "none"
    reshape = raw.get("reshape_activations", default)
    if reshape not in RESHAPES:
        raise ValueError(
            f"{where}: reshape_activations={reshape!r} is not supported; supported: {RESHAPES}"
        )
    return reshape


def _refuse_unsupported(raw: dict, metadata: dict, architecture: str, where: str | Path) -> None:
    """The fields that would change what the SAE computes, if we ignored them."""
    if raw.get("normalize_activations") not in _NO_NORMALIZATION:
        raise ValueError(
            f"{where}: normalize_activations={raw['normalize_activations']!r} rescales inputs "
            f"at run time, which is not supported; fold the scale into the weights first"
        )
    if raw.get("finetuning_scaling_factor"):
        raise ValueError(f"{where}: finetuning_scaling_factor is not supported")
    for field in ("hook_head_index", "hook_point_head_index"):
        if raw.get(field, metadata.get(field)) is not None:
            raise ValueError(
                f"{where}: {field}={raw.get(field, metadata.get(field))!r} (an SAE of one "
                f"head's activations) is not supported"
            )
    activation = raw.get("activation_fn", raw.get("activation_fn_str"))
    allowed = {"standard": ("relu",), "topk": ("relu", "topk"), "jumprelu": ("relu", "jumprelu")}
    if activation is not None and activation not in allowed[architecture]:
        raise ValueError(
            f"{where}: activation_fn {activation!r} with architecture {architecture!r} is not "
            f"supported (a {architecture} SAE applies {' or '.join(allowed[architecture])})"
        )
