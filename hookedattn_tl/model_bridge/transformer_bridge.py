"""TransformerLens 4's `TransformerBridge`: our model, booted TL 4's way, answering TL 4's names.

TL 4 deleted `HookedTransformer`; its models start as

    bridge = TransformerBridge.boot_transformers("gpt2", device=..., dtype=...)
    bridge.enable_compatibility_mode()

`TransformerBridge` here is `hookedattn_tl.HookedTransformer` (every TL 3 method, our
forward) with that entry: `boot_transformers` loads the weights unprocessed (TL 4 returns
raw HF weights), `enable_compatibility_mode` processes them as TL 3's `from_pretrained`
did (fold the norms, centre the writing weights and the unembedding, fold the value
biases), and TL 4's hook names (`blocks.0.hook_in`, `blocks.0.attn.o.hook_in`, ...) are
aliases of our hook points in hooks, `hook_dict` and cache indexing
(`hookedattn_tl.model_bridge.hook_names`). TL 3's names keep working, in both modes.
"""

import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from hookedattn_tl.HookedTransformer import HookedTransformer
from hookedattn_tl.model_bridge import hook_names

# boot_transformers arguments that place a model with accelerate's dispatcher, and the
# one of ours that does the same job.
_PLACEMENT = {
    "device_map": "device= (one device), or hookedattn_tl.HookedTransformer.from_pretrained"
    "(name, n_devices=...) to split the blocks over GPUs",
    "max_memory": "device= or from_pretrained(name, n_devices=...)",
    "offload_folder": "nothing: CPU or disk offload is not supported; load on one device",
}
# Attributes of TL 4's bridge that belong to its wrapping of a HF module tree.
_WRAPPER_ONLY = {
    "original_model": "nothing: hookedattn_tl converts the HF weights into its own modules "
    "and keeps no HF model; HookedTransformer.from_hf(hf_model) converts a live one",
    "adapter": "nothing: there are no architecture adapters; model.cfg describes the model",
}


class TransformerBridge(HookedTransformer):
    """`hookedattn_tl.HookedTransformer` with TransformerLens 4's entry and hook names.

    Build it with `TransformerBridge.boot_transformers(name_or_folder)`; every TL 3
    method works on it, and `hook_dict`, `run_with_hooks`, `run_with_cache` and the cache
    accept TL 4's names besides TL 3's.
    """

    compatibility_mode: bool = False
    _weights_processed: bool = False

    def setup(self) -> None:
        """Name the hook points (TL 3's names) and answer TL 4's names as their aliases."""
        super().setup()
        aliases = hook_names.bridge_aliases(
            self.hook_dict, self.cfg.n_layers, bool(self.cfg.gated_mlp)
        )
        self.hook_dict = hook_names.AliasedHookDict(self.hook_dict, aliases)
        self.__dict__["_tl4_of"] = hook_names.inverse(aliases)

    @property
    def hook_aliases(self) -> dict[str, str]:
        """TL 4 hook name -> the name of our hook point that sees the same tensor."""
        return dict(self.hook_dict.aliases)

    def resolve_hook_alias(self, name: str) -> str:
        """Our name for the hook name `name` (itself when it is ours); a `KeyError` saying
        what to use instead for a TL 4 name no hook point here sees."""
        message = hook_names.unavailable_message(name)
        if message is not None:
            raise KeyError(message)
        return self.hook_dict.aliases.get(name, name)

    def hook_points_for(self, names: Any) -> list:
        """Our selection (`hookedattn.core.hooked_root.HookedRootModule.hook_points_for`),
        with TL 4's names as aliases; a predicate accepts a hook point when it accepts its
        name or any of its TL 4 aliases."""
        if callable(names):
            tl4_of = self.__dict__["_tl4_of"]
            return [
                point
                for name, point in self.hook_dict.items()
                if hook_names.accepts(names, name, tl4_of.get(name, ()))
            ]
        if isinstance(names, str):
            names = [names]
        if isinstance(names, list | tuple):
            names = [self.resolve_hook_alias(n) if isinstance(n, str) else n for n in names]
        return super().hook_points_for(names)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in _WRAPPER_ONLY:
                raise AttributeError(
                    f"TransformerBridge.{name} is TransformerLens 4's; here use "
                    f"{_WRAPPER_ONLY[name]}"
                ) from None
            raise

    # ------------------------------------------------------------------ loading
    @classmethod
    def boot_transformers(
        cls,
        model_name: str,
        hf_config_overrides: dict | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.float32,
        tokenizer: Any = None,
        load_weights: bool = True,
        trust_remote_code: bool = False,
        model_class: Any = None,
        hf_model: Any = None,
        n_ctx: int | None = None,
        revision: str | None = None,
        code_revision: str | None = None,
        checkpoint_index: int | None = None,
        checkpoint_value: int | None = None,
        device_map: Any = None,
        n_devices: int | None = None,
        max_memory: Any = None,
        offload_folder: str | None = None,
    ) -> "TransformerBridge":
        """Load a model by hub name or folder, with TransformerLens 4.3's signature.

        As in TL 4 the weights are as saved (no norm folding, no centring): the logits are
        the HF model's. Call `enable_compatibility_mode()` for TL 3's processed weights.
        `model_name` is anything `hookedattn_tl.HookedTransformer.from_pretrained` takes (a
        hub id, a folder, one of TL's names). `hf_config_overrides` and `n_ctx` change the
        HF config before the weights load; `load_weights=False` builds the architecture
        with transformers' random initialisation; `hf_model=` converts a live model. Without
        `device`, the model goes to the GPU when there is one, as in TL 4.
        `trust_remote_code`, `model_class`, `code_revision` and accelerate's placement
        arguments are refused, naming what to use instead.
        """
        _refuse(trust_remote_code, model_class, code_revision, device_map, max_memory,
                offload_folder)  # fmt: skip
        overrides = _overrides(hf_config_overrides, n_ctx, revision, checkpoint_index,
                               checkpoint_value)  # fmt: skip
        if hf_model is None and (overrides or not load_weights):
            hf_model = _hf_model(model_name, overrides, load_weights, revision, dtype)
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(model_name)
        if device is None and not n_devices:  # TL 4's default: the GPU when there is one
            device = "cuda" if torch.cuda.is_available() else "cpu"
        hub = {"revision": revision} if revision is not None else {}
        unprocessed = {"fold_ln": False, "center_writing_weights": False,
                       "center_unembed": False, "fold_value_biases": False}  # fmt: skip
        return cls.from_pretrained(
            model_name, checkpoint_index=checkpoint_index, checkpoint_value=checkpoint_value,
            hf_model=hf_model, device=None if device is None else str(device),
            n_devices=n_devices or 1, tokenizer=tokenizer, dtype=dtype, **unprocessed, **hub,
        )  # fmt: skip

    # ------------------------------------------------------------------ processing
    def enable_compatibility_mode(
        self,
        disable_warnings: bool = False,
        no_processing: bool = False,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        fold_value_biases: bool = True,
        refactor_factored_attn_matrices: bool = False,
    ) -> None:
        """TL 4's switch to HookedTransformer's numerics: process the weights as TL 3's
        `from_pretrained` did (each step as asked; none with `no_processing`), in place.

        TL 4 also turns on TL 3's hook names here; they always work in this package.
        `disable_warnings` is accepted (there are no legacy-name warnings to silence).
        """
        self.compatibility_mode = True
        if not no_processing:
            self.process_weights(
                fold_ln=fold_ln,
                center_writing_weights=center_writing_weights,
                center_unembed=center_unembed,
                fold_value_biases=fold_value_biases,
                refactor_factored_attn_matrices=refactor_factored_attn_matrices,
            )

    def process_weights(
        self,
        verbose: bool = False,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        fold_value_biases: bool = True,
        refactor_factored_attn_matrices: bool = False,
    ) -> None:
        """TL 4's in-place processing (`process_weights_`, TL 3's); a second call warns and
        does nothing, as in TL 4 (folding twice would fold the same factors again)."""
        if self._weights_processed:
            logging.warning(
                "process_weights was already applied to this bridge. Skipping: boot a fresh "
                "bridge with TransformerBridge.boot_transformers(...) to process with "
                "different options."
            )
            return
        if verbose:
            print(f"Processing weights for {self.cfg.model_name}...")
        compatibility = self.compatibility_mode
        self.process_weights_(
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights,
            center_unembed=center_unembed,
            fold_value_biases=fold_value_biases,
            refactor_factored_attn_matrices=refactor_factored_attn_matrices,
        )
        self.compatibility_mode = compatibility
        self._weights_processed = True

    # ------------------------------------------------------------------ parameters
    def tl_parameters(self) -> dict[str, Tensor]:
        """Every parameter by TL's name (`"blocks.0.attn.W_Q"`, `[head d_model d_head]`)."""
        return dict(self.tl_named_parameters())

    def get_params(self) -> dict[str, Tensor]:
        """TL 4's name for `tl_parameters`."""
        return self.tl_parameters()

    def tl_named_parameters(self) -> Iterator[tuple[str, Tensor]]:
        """`(TL name, tensor)` for every parameter; ours are TL's names already."""
        return iter(self.state_dict(keep_vars=True).items())


def _refuse(
    trust_remote_code: bool,
    model_class: Any,
    code_revision: str | None,
    device_map: Any,
    max_memory: Any,
    offload_folder: str | None,
) -> None:
    """A `ValueError` naming what to use instead, for the arguments this entry lacks."""
    if trust_remote_code or code_revision is not None:
        raise ValueError(
            "trust_remote_code / code_revision: hookedattn_tl runs no model code from the "
            "hub; it converts the architectures listed by hookedattn.core.hub (see "
            "docs/guide/families.md)"
        )
    if model_class is not None:
        raise ValueError(
            f"model_class={model_class!r}: hookedattn_tl builds causal language models "
            f"only; pass hf_model=YourClass.from_pretrained(...) to convert a live one"
        )
    given = {"device_map": device_map, "max_memory": max_memory, "offload_folder": offload_folder}
    for name, value in given.items():
        if value is not None:
            raise ValueError(f"{name}={value!r} is not supported here; use {_PLACEMENT[name]}")


def _overrides(
    hf_config_overrides: dict | None,
    n_ctx: int | None,
    revision: str | None,
    checkpoint_index: int | None,
    checkpoint_value: int | None,
) -> dict:
    """The HF config's overrides for `boot_transformers` (`n_ctx` among them), after
    refusing a revision beside a checkpoint, as TL 4 does."""
    if revision is not None and (checkpoint_index is not None or checkpoint_value is not None):
        raise ValueError("Specify either revision= or checkpoint_index/checkpoint_value, not both.")
    overrides = dict(hf_config_overrides or {})
    if n_ctx is not None:
        if n_ctx <= 0:
            raise ValueError(f"n_ctx must be a positive integer, got n_ctx={n_ctx}.")
        overrides["n_ctx"] = n_ctx
    return overrides


def _hf_model(
    model_name: str, overrides: dict, load_weights: bool, revision: str | None, dtype: Any
) -> Any:
    """The HF model of `model_name` with `overrides` set on its config (`n_ctx` on the
    field the config uses for the context length), loaded or freshly initialised."""
    from transformers import AutoConfig, AutoModelForCausalLM

    options = {"revision": revision} if revision is not None else {}
    config = AutoConfig.from_pretrained(model_name, **options)
    if "n_ctx" in overrides:
        n_ctx = overrides.pop("n_ctx")
        fields = ("n_positions", "max_position_embeddings", "max_context_length", "seq_length")
        field = next((f for f in fields if hasattr(config, f)), None)
        if field is None:
            raise ValueError(
                f"Cannot apply n_ctx={n_ctx}: no recognized context-length field on the HF "
                f"config of {model_name}. Use hf_config_overrides instead."
            )
        overrides[field] = n_ctx
    config.__dict__.update(overrides)
    if not load_weights:
        return AutoModelForCausalLM.from_config(config)
    return AutoModelForCausalLM.from_pretrained(model_name, config=config, dtype=dtype, **options)


__all__ = ["TransformerBridge"]
