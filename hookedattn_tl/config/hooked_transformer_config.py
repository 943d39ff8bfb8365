"""TransformerLens's `HookedTransformerConfig`: ours, frozen, reading TL's fields and sentinels.

The fields are `hookedattn.HookedTransformerConfig`'s, which follow TL's names, plus the TL
fields that describe a model without changing its math here (`tokenizer_name`, the
checkpoint labels, `default_prepend_bos`, ...): they are accepted and stored. TL's
sentinels read as "the default" (`d_vocab=-1` or left out: 1, for the parts that have no
vocabulary; a model refuses it), (`n_heads=-1`, `d_vocab_out=-1`, `attn_scale=-1.0`, the
soft caps at `-1.0`, `initializer_range=-1.0`). A TL field whose non-default value asks
for something hookedattn does not compute (`use_attn_scale=False`, `n_devices=2`,
`load_in_4bit=True`, ...) is a `ValueError` naming it.

The config is frozen, as ours is: assigning a field raises `FrozenInstanceError` naming
what does it (`model.set_use_attn_result(True)` for the hook-point flags, `cfg.replace(...)`
and a new model for the others). `use_fused_kernels` defaults to False: TL computes every
activation written out, so `model(x)` equals `run_with_cache(x)[0]` bit for bit.
"""

import dataclasses
from typing import Any

import torch

from hookedattn.core.config import ACT_FNS
from hookedattn.core.config import HookedTransformerConfig as _CoreConfig
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
_HOOK_FLAGS = ("use_attn_result", "use_split_qkv_input", "use_hook_mlp_in", "use_attn_in")


@dataclasses.dataclass(frozen=True)
class _Fields(_CoreConfig):
    use_fused_kernels: bool = False


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
        if name in _HOOK_FLAGS:
            hint = f"model.set_{name}({value!r}), which rebuilds the blocks' hook points"
        else:
            hint = f"cfg.replace({name}={value!r}) and build a new model from it"
        raise dataclasses.FrozenInstanceError(
            f"cannot assign to field {name!r}: a hookedattn_tl config is frozen; use {hint}"
        )

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
        """A config from a dict of fields (TL's fields and sentinels accepted)."""
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
