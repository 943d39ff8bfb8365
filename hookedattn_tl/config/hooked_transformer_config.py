"""TransformerLens's `HookedTransformerConfig`: ours, frozen, reading TL's fields and sentinels.

The fields are `hookedattn.HookedTransformerConfig`'s, which follow TL's names, plus the TL
fields that describe a model without changing its math here (`tokenizer_name`, the
checkpoint labels, `default_prepend_bos`, ...): they are accepted and stored. TL's
sentinels read as "the default" (`d_vocab=-1` or left out: 1, for the parts that have no
vocabulary; a model refuses it), (`n_heads=-1`, `d_vocab_out=-1`, `attn_scale=-1.0`, the
soft caps at `-1.0`, `initializer_range=-1.0`), and an int given for one of our float
fields (`rotary_base=1_000_000`; TL's are `Union[float, int]`) as its float. A TL field
whose non-default value asks for something hookedattn does not compute
(`use_attn_scale=False`, `n_devices=2`, `load_in_4bit=True`, ...) is a `ValueError`
naming it.

`use_fused_kernels` defaults to False: TL computes every activation written out, so
`model(x)` equals `run_with_cache(x)[0]` bit for bit.

TL's run-time flags. TL code switches hook points on by assignment, `model.cfg.use_attn_result
= True` (likewise `use_split_qkv_input`, `use_hook_mlp_in`, `use_attn_in`,
`ungroup_grouped_query_attention`): TL's config is mutable and its blocks read the flags at
every forward, and TL's `set_use_attn_result(x)` is that assignment. Ours is frozen and the
blocks choose their hook points when they are built, so a flag takes effect only by
rebuilding them, which the model's `set_*` does. The design: a facade model keeps its own
copy of its config, bound to it (`bound_to`: a weak reference, dropped when the config is
copied or pickled), and a bound config answers an assignment to one of these flags by
calling its model's `set_<flag>(value)`: the same validation, the same rebuilt blocks
(sharing the parameters), and the config updated in place, so `model.cfg` and every
reference to it read the new value, as in TL. The alternatives were worse: a mutable
config would disagree with blocks built from its old value, a proxy around the config
would fail `isinstance` and equality, and rebuilding lazily at the next forward would leave
`hook_dict` stale in between. Every other assignment (and a flag assigned on a config that
belongs to no model, which may be shared with components built from it) raises
`FrozenInstanceError` naming the flags that may be set and `cfg.replace(...)` for the rest.
"""

import dataclasses
import weakref
from typing import Any

import torch

from hookedattn.core.config import ACT_FNS
from hookedattn.core.config import HookedTransformerConfig as _CoreConfig
from hookedattn.core.mixer_config import MixerConfig
from hookedattn_tl._activations import SUPPORTED_ACTIVATIONS

# TL fields whose value changes nothing here, with TL's defaults.
_DESCRIPTIVE = {
    "tokenizer_name": None,
    "from_checkpoint": False,
    "checkpoint_index": None,
    "checkpoint_label_type": None,
    "checkpoint_value": None,
    "default_prepend_bos": True,
    "tokenizer_prepends_bos": None,
    "trust_remote_code": False,
    "init_mode": "gpt2",
    "use_local_attn": False,
    "ungroup_grouped_query_attention": False,
    "d_vocab_known": True,
}
# TL fields whose non-default value asks for math hookedattn does not have: field -> (the
# value that is supported, why).
_UNSUPPORTED = {
    "use_attn_scale": (True, "scores are always divided by attn_scale (set attn_scale=1.0)"),
    "n_devices": (
        1,
        "a config does not place a model: pass from_pretrained(..., n_devices=N), or use "
        "hookedattn.core.parallel.place",
    ),
    "load_in_4bit": (False, "there is no 4-bit quantisation"),
    "attention_dir": ("causal", "attention is causal (no bidirectional encoder)"),
    "scale_attn_by_inverse_layer_idx": (False, "no per-layer score scaling"),
    "final_rms": (False, "the final norm is normalization_type's"),
    "post_embedding_ln": (False, "no norm after the embedding"),
    "use_hook_tokens": (False, "no hook_tokens"),
    "rotary_adjacent_pairs": (False, "rotary dims are rotated in GPT-NeoX's half-split layout"),
    "use_yarn_rope": (False, "no YaRN rotary scaling"),
    "tie_word_embeddings": (False, "W_U is its own parameter"),
}
# TL's "not set" sentinels, read as None (our "default").
_SENTINELS = {
    "n_heads": -1,
    "d_vocab_out": -1,
    "attn_scale": -1.0,
    "attn_scores_soft_cap": -1.0,
    "output_logits_soft_cap": -1.0,
}
# TL's run-time flags, each applied by the model method of the same name (module docstring).
FLAG_SETTERS = {
    flag: f"set_{flag}"
    for flag in (
        "use_attn_result",
        "use_split_qkv_input",
        "use_hook_mlp_in",
        "use_attn_in",
        "ungroup_grouped_query_attention",
    )
}


@dataclasses.dataclass(frozen=True)
class _Fields(_CoreConfig):
    use_fused_kernels: bool = False


# Our float fields; TL types them `Union[float, int]`, so an int there is read as its float.
_FLOAT_FIELDS = tuple(
    f.name for f in dataclasses.fields(_CoreConfig) if f.type in (float, float | None)
)


class HookedTransformerConfig(_Fields):
    """`hookedattn.HookedTransformerConfig` with TransformerLens's extra fields, sentinels,
    `unwrap`, `n_params` and `is_layer_norm_activation`; every activation written out by
    default (`use_fused_kernels=False`)."""

    def __init__(self, *args: Any, initializer_range: float | None = None, **fields: Any):
        # TL's descriptive fields are kept beside the dataclass fields (read as attributes),
        # so that the core's table of field specs stays the one check of the real ones.
        extras = {name: fields.pop(name, default) for name, default in _DESCRIPTIVE.items()}
        object.__setattr__(self, "_tl_extras", extras)
        for field, (supported, why) in _UNSUPPORTED.items():
            value = fields.pop(field, supported)
            if value != supported:
                raise ValueError(
                    f"{field}={value!r} is not supported by hookedattn_tl ({why}); "
                    f"leave it at {supported!r}"
                )
            extras[field] = value
        for field, sentinel in _SENTINELS.items():
            if fields.get(field) == sentinel:
                fields[field] = None
        for field in _FLOAT_FIELDS:
            value = fields.get(field)
            if isinstance(value, int) and not isinstance(value, bool):
                fields[field] = float(value)
        # TL's d_vocab=-1 (left out): "from the tokenizer". Kept as 1 for the parts that have
        # no vocabulary (a component, a cache); a model refuses such a config.
        extras["d_vocab_known"] = fields.get("d_vocab", -1) != -1 or len(args) >= 4
        if not extras["d_vocab_known"]:
            fields["d_vocab"] = 1
        if not fields.get("attn_only") and fields.get("d_mlp") is None and len(args) < 7:
            fields["d_mlp"] = 4 * fields["d_model"]  # TL's default MLP width
        if initializer_range is not None and initializer_range >= 0:
            fields.setdefault("init_range", initializer_range)
        fields.setdefault("device", "cpu")
        if fields["device"] is None:
            fields["device"] = "cpu"
        act_fn = fields.get("act_fn")
        if (act_fn in SUPPORTED_ACTIVATIONS and act_fn not in ACT_FNS) or (
            fields.get("attn_only") and act_fn is not None and act_fn not in ACT_FNS
        ):
            # TL's other activations (SoLU, ...) serve the standalone components; a model
            # refuses them when it builds its MLPs. An attention-only model has none at all.
            fields["act_fn"] = "relu"
            super().__init__(*args, **fields)
            object.__setattr__(self, "act_fn", act_fn)
            return
        super().__init__(*args, **fields)

    def __getattr__(self, name: str) -> Any:
        extras = self.__dict__.get("_tl_extras", _DESCRIPTIVE)
        if name in extras:
            return extras[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        model = self.bound_model
        if name in FLAG_SETTERS and model is not None:
            getattr(model, FLAG_SETTERS[name])(value)
            return
        flags = ", ".join(FLAG_SETTERS)
        if name in FLAG_SETTERS:
            message = (
                f"this config belongs to no model (a model keeps its own, model.cfg, which "
                f"takes the assignment); assign model.cfg.{name} = {value!r}, or build the "
                f"model from cfg.replace({name}={value!r})"
            )
        elif name in _UNSUPPORTED:
            message = (
                f"hookedattn_tl does not support {name} ({_UNSUPPORTED[name][1]}); a model's "
                f"config takes assignments to TL's run-time flags only: {flags}"
            )
        elif model is not None:
            message = (
                f"a model's config takes assignments to TL's run-time flags only ({flags}); "
                f"for {name}, build a new model from cfg.replace({name}={value!r})"
            )
        else:
            message = (
                f"a hookedattn_tl config is frozen; use cfg.replace({name}={value!r}), and "
                f"on a model's config assign only the flags {flags}"
            )
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}: {message}")

    # ------------------------------------------------------------------ a model's own config
    @property
    def bound_model(self) -> Any:
        """The model this config is bound to (module docstring), or None."""
        ref = self.__dict__.get("_model_ref")
        return None if ref is None else ref()

    def bound_to(self, model: Any) -> "HookedTransformerConfig":
        """A copy of this config bound to `model`: assignments to TL's run-time flags on
        it call `model.set_<flag>` (module docstring)."""
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy.__dict__["_tl_extras"] = dict(self.__dict__.get("_tl_extras", _DESCRIPTIVE))
        copy.__dict__["_model_ref"] = weakref.ref(model)
        return copy

    def replace(self, **changes: Any) -> "HookedTransformerConfig":
        """A copy with some fields (or TL's descriptive ones) changed, validated again; the
        descriptive fields not named are carried over."""
        extras = self.__dict__.get("_tl_extras", _DESCRIPTIVE)
        kept = {k: extras[k] for k in _DESCRIPTIVE if k != "d_vocab_known" and k in extras}
        return dataclasses.replace(self, **{**kept, **changes})

    def set_in_place(self, **values: Any) -> None:
        """Change fields of this config where it stands: for the model it is bound to,
        once the model has applied them (`set_use_attn_result` ...), so that every
        reference to `model.cfg` reads the new values. Checked as `replace` checks them."""
        if self.bound_model is None:
            raise ValueError("set_in_place is for a model's own config (bound_to); use replace")
        fields = {f.name for f in dataclasses.fields(self)}
        checked = self.replace(**{k: v for k, v in values.items() if k in fields})
        for name, value in values.items():
            if name in fields:
                self.__dict__[name] = getattr(checked, name)
            elif name in self._tl_extras:
                self._tl_extras[name] = value
            else:
                raise AttributeError(f"{type(self).__name__!r} has no field {name!r}")

    def __getstate__(self) -> dict[str, Any]:
        # A copy or a pickle belongs to no model (and a weak reference cannot be pickled).
        state = dict(self.__dict__)
        state.pop("_model_ref", None)
        return state

    @property
    def n_params(self) -> int:
        """TL's count of the hidden weights: W_Q, W_K, W_V, W_O and W_in, W_out (W_gate)
        per layer; embeddings, biases and norms left out (see `n_params_total`)."""
        attention = self.n_layers * self.d_model * self.d_head * self.n_heads * 4
        if self.attn_only:
            return attention
        return attention + self.n_layers * self.d_model * self.d_mlp * (2 + self.gated_mlp)

    @property
    def initializer_range(self) -> float:
        """TL's name for `init_range`."""
        return self.init_range

    def is_layer_norm_activation(self) -> bool:
        """Whether the activation is one of TL's `*_ln` ones (SoLU with a norm)."""
        return self.act_fn is not None and self.act_fn.endswith("_ln")

    @classmethod
    def unwrap(cls, config: "dict | _CoreConfig") -> "HookedTransformerConfig":
        """`config` itself when it is one of these, else one built from its dict."""
        if isinstance(config, cls):
            return config
        if isinstance(config, dict):
            return cls.from_dict(config)
        return cls.from_dict(config.to_dict())

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> "HookedTransformerConfig":
        """A config from a dict of fields (TL's fields and sentinels accepted; a hybrid's
        `mixers` as a `MixerConfig` or its dict)."""
        if isinstance(config_dict.get("mixers"), dict):  # `to_dict`'s form of a MixerConfig
            config_dict = config_dict | {"mixers": MixerConfig.coerce(config_dict["mixers"])}
        return cls(**config_dict)

    def set_seed_everywhere(self, seed: int) -> None:
        """Seed torch's, Python's and numpy's global generators (TL's helper)."""
        import random

        import numpy as np

        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)


TransformerLensConfig = HookedTransformerConfig


__all__ = ["HookedTransformerConfig", "TransformerLensConfig"]
