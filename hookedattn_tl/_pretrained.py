"""TransformerLens's `from_pretrained` steps after the weights are read: the keyword
arguments it takes (those that choose what to fetch go to `huggingface_hub`), the weight
processing with TL's defaults and its warnings for shortformer models, every activation
written out, and the blocks placed over devices as TL places them.
"""

import logging
from typing import Any

from hookedattn.core import parallel, processing
from hookedattn.core.config import HookedTransformerConfig as _CoreConfig
from hookedattn_tl._refactor import refactor_factored_attn_matrices as refactor_attention
from hookedattn_tl.config import HookedTransformerConfig


def processed(
    model: Any,
    *,
    fold_ln: bool,
    center_writing_weights: bool,
    center_unembed: bool,
    fold_value_biases: bool,
    refactor_factored_attn_matrices: bool,
) -> Any:
    """`model` with TransformerLens's processing of loaded weights, as asked (each step
    returns a new model: `hookedattn.core.processing.process_weights`), computing every
    activation written out as TL does, and its factored attention matrices refactored if
    asked."""
    fold_ln, center_writing_weights, center_unembed = shortformer_processing(
        model.cfg, fold_ln, center_writing_weights, center_unembed
    )
    model = processing.process_weights(
        model, fold_ln=fold_ln, center_writing_weights=center_writing_weights,
        center_unembed=center_unembed, fold_value_biases=fold_value_biases,
    )  # fmt: skip
    model = written_out(model)
    if refactor_factored_attn_matrices:
        refactor_attention(model)
    return model


def place(model: Any, n_devices: int, device: str | None) -> None:
    """Blocks over the first `n_devices` devices, as TransformerLens places them (`True ==
    1`: the type is checked by `n_devices_map` before any comparison with 1)."""
    if n_devices is True or n_devices != 1:
        parallel.place(model, parallel.n_devices_map(n_devices, device))


def written_out(model: Any) -> Any:
    """The same parameters, computing every activation written out as TransformerLens does
    (`use_fused_kernels=False`, the default of this package's config)."""
    if not model.cfg.use_fused_kernels:
        return model
    cfg = HookedTransformerConfig.from_dict({**model.cfg.to_dict(), "use_fused_kernels": False})
    new = type(model)(cfg.replace(init_weights=False), tokenizer=model.tokenizer)
    new.load_state_dict(model.state_dict(), assign=True)  # the same tensors, no copy
    new.cfg = cfg
    new.train(model.training)
    return new


_HUB_OPTIONS = ("revision", "token", "cache_dir", "local_files_only")


def hub_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments TransformerLens hands to transformers that choose what to
    fetch (taken out of `kwargs`)."""
    return {name: kwargs.pop(name) for name in _HUB_OPTIONS if name in kwargs}


def shortformer_processing(
    cfg: _CoreConfig,
    fold_ln: bool,
    center_writing_weights: bool,
    center_unembed: bool,
) -> tuple[bool, bool, bool]:
    """TL's `from_pretrained` for a shortformer model: `fold_ln`, `center_writing_weights`
    and `center_unembed` turned off, each with TL's warning (`hookedattn.core.processing`
    says why the first two cannot be done; the third could, but TL leaves it)."""
    if cfg.positional_embedding_type != "shortformer":
        return fold_ln, center_writing_weights, center_unembed
    for name, asked in (
        ("fold_ln", fold_ln),
        ("center_unembed", center_unembed),
        ("center_writing_weights", center_writing_weights),
    ):
        if asked:
            logging.warning(
                "You tried to specify %s=True for a shortformer model, but this can't be "
                "done! Setting %s=False instead.",
                name,
                name,
            )
    return False, False, False


def refuse_unsupported(kwargs: dict[str, Any]) -> None:
    """A TypeError naming the keyword arguments `from_pretrained` does not take (TL's
    `first_n_layers`, `n_ctx`, `checkpoint_label`, or any unknown one)."""
    ignored = {"first_n_layers", "n_ctx", "checkpoint_label"}
    given = sorted(k for k, v in kwargs.items() if k in ignored and v is not None)
    unknown = sorted(set(kwargs) - ignored)
    if given or unknown:
        raise TypeError(
            f"from_pretrained does not support {', '.join(given + unknown)}; it takes "
            f"fold_ln, center_writing_weights, center_unembed, fold_value_biases, "
            f"checkpoint_index, checkpoint_value, hf_model, tokenizer, device, dtype, "
            f"default_prepend_bos, default_padding_side, {', '.join(_HUB_OPTIONS)}"
        )
