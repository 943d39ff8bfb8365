"""Import a HuggingFace `transformers` GPT-2 (`GPT2LMHeadModel`, any size) as a HookedTransformer.

GPT-2 stores its linear maps as `Conv1D` weights `[in out]` (row vectors, `y = x @ W + b`,
our convention already), and fuses the query, key and value maps of all heads into one
`c_attn: [d_model 3*d_model]`. Converting is splitting that matrix per head:

    c_attn.weight  [d_model (qkv head d_head)]  ->  W_Q, W_K, W_V  [head d_model d_head]
    c_proj.weight  [(head d_head) d_model]      ->  W_O            [head d_head d_model]
    lm_head.weight [d_vocab d_model]            ->  W_U            [d_model d_vocab]

Nothing here assumes random weights: the same route loads real GPT-2 weights for whoever has
them locally (`HookedTransformer.from_hf("path/to/gpt2")`). `transformers` is an optional
extra (`pip install hookedattn[hf]`), imported only inside these functions.
"""

from pathlib import Path
from typing import Any

import torch
from einops import rearrange
from torch import Tensor

from hookedattn.config import DTYPES, HookedTransformerConfig
from hookedattn.weights_io import CheckpointError, load_checked_state_dict

SUPPORTED_ARCHITECTURES = ("GPT2LMHeadModel",)
_ACT_FNS = {
    "gelu_new": "gelu_new",
    "gelu_pytorch_tanh": "gelu_new",  # the same tanh approximation, computed by torch
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
# Buffers older `transformers` versions kept in GPT-2's state dict: the causal mask, which
# we build ourselves, so they carry no weights.
_MASK_BUFFERS = (".attn.bias", ".attn.masked_bias")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            "importing a HuggingFace model needs the `transformers` package: "
            "pip install 'hookedattn[hf]'"
        ) from error
    return transformers


def from_hf(
    cls: type,
    source: Any,
    *,
    tokenizer: Any = None,
    dtype: torch.dtype | str | None = None,
    device: str | None = None,
) -> Any:
    """A `cls` (HookedTransformer) with the weights of a GPT-2 model or local directory.

    `source` is a `transformers.GPT2LMHeadModel` or a directory that
    `GPT2LMHeadModel.from_pretrained` can load (files only, nothing is downloaded); from a
    directory the tokenizer saved there (if any) is loaded too. `dtype` and `device`
    default to those of the HF model's weights.
    """
    if isinstance(source, str | Path):
        hf_model, saved_tokenizer = _load_directory(Path(source))
        tokenizer = saved_tokenizer if tokenizer is None else tokenizer
    else:
        hf_model = source
    _check_architecture(hf_model)
    weight = next(hf_model.parameters())
    cfg = gpt2_config(
        hf_model.config,
        dtype=weight.dtype if dtype is None else dtype,
        device=str(weight.device) if device is None else device,
    )
    tie = bool(getattr(hf_model.config, "tie_word_embeddings", True))
    tensors = convert_gpt2_state_dict(hf_model.state_dict(), cfg, tie_word_embeddings=tie)
    model = cls(cfg, tokenizer=tokenizer)
    load_checked_state_dict(model, tensors, source=f"converted {type(hf_model).__name__}")
    return model


def _load_directory(path: Path) -> tuple[Any, Any]:
    if not path.is_dir():
        raise FileNotFoundError(f"no model directory at {path}")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in {path}: not a HuggingFace model directory")
    transformers = _transformers()
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    _check_config_architecture(config)
    hf_model = transformers.GPT2LMHeadModel.from_pretrained(path, local_files_only=True)
    # Only where tokenizer files were saved: `AutoTokenizer` would otherwise build an empty
    # one. A directory of weights alone gives a model that works on token ids.
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        return hf_model, None
    return hf_model, transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


def _check_architecture(hf_model: Any) -> None:
    transformers = _transformers()
    if isinstance(hf_model, transformers.GPT2LMHeadModel):
        return
    if not isinstance(hf_model, torch.nn.Module) or not hasattr(hf_model, "config"):
        raise TypeError(
            f"from_hf takes a transformers model or a local directory, got "
            f"{type(hf_model).__name__}"
        )
    model_type = getattr(hf_model.config, "model_type", None)
    hint = ""
    if isinstance(hf_model, transformers.GPT2PreTrainedModel):
        hint = " (for GPT-2, pass the GPT2LMHeadModel, which has the unembedding)"
    raise ValueError(
        f"cannot import {type(hf_model).__name__} (model_type={model_type!r}): from_hf "
        f"supports {', '.join(SUPPORTED_ARCHITECTURES)}{hint}"
    )


def _check_config_architecture(config: Any) -> None:
    if getattr(config, "model_type", None) != "gpt2":
        names = getattr(config, "architectures", None) or [type(config).__name__]
        raise ValueError(
            f"cannot import {', '.join(names)} (model_type={config.model_type!r}): from_hf "
            f"supports {', '.join(SUPPORTED_ARCHITECTURES)}"
        )


def gpt2_config(
    hf_config: Any, dtype: torch.dtype | str = torch.float32, device: str = "cpu"
) -> HookedTransformerConfig:
    """Our config for a `transformers.GPT2Config`; variants we cannot express are errors."""
    if getattr(hf_config, "scale_attn_by_inverse_layer_idx", False):
        raise ValueError(
            "this GPT-2 scales attention by 1/(layer index + 1) "
            "(scale_attn_by_inverse_layer_idx=True); a HookedTransformer has one attn_scale"
        )
    if getattr(hf_config, "add_cross_attention", False):
        raise ValueError(
            "this GPT-2 has cross-attention (add_cross_attention=True): a decoder "
            "with cross-attention cannot be imported"
        )
    act = hf_config.activation_function
    if act not in _ACT_FNS:
        raise ValueError(
            f"activation_function {act!r} cannot be imported; supported: {sorted(_ACT_FNS)}"
        )
    if isinstance(dtype, torch.dtype) and dtype not in DTYPES.values():
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype}")
    d_model, n_heads = hf_config.n_embd, hf_config.n_head
    d_head = d_model // n_heads
    return HookedTransformerConfig(
        n_layers=hf_config.n_layer,
        d_model=d_model,
        n_ctx=hf_config.n_positions,
        d_vocab=hf_config.vocab_size,
        n_heads=n_heads,
        d_head=d_head,
        d_mlp=hf_config.n_inner or 4 * d_model,
        act_fn=_ACT_FNS[act],
        normalization_type="LN",
        positional_embedding_type="standard",
        eps=hf_config.layer_norm_epsilon,
        attn_scale=d_head**0.5 if hf_config.scale_attn_weights else 1.0,
        dtype=dtype,
        device=device,
        model_name=getattr(hf_config, "name_or_path", "") or "gpt2",
        original_architecture="GPT2LMHeadModel",
    )


def _expected_gpt2_shapes(cfg: HookedTransformerConfig) -> dict[str, tuple[int, ...]]:
    d, m = cfg.d_model, cfg.d_mlp
    shapes = {
        "transformer.wte.weight": (cfg.d_vocab, d),
        "transformer.wpe.weight": (cfg.n_ctx, d),
        "transformer.ln_f.weight": (d,),
        "transformer.ln_f.bias": (d,),
        "lm_head.weight": (cfg.d_vocab, d),
    }
    for i in range(cfg.n_layers):
        p = f"transformer.h.{i}"
        shapes |= {
            f"{p}.ln_1.weight": (d,),
            f"{p}.ln_1.bias": (d,),
            f"{p}.attn.c_attn.weight": (d, 3 * d),
            f"{p}.attn.c_attn.bias": (3 * d,),
            f"{p}.attn.c_proj.weight": (d, d),
            f"{p}.attn.c_proj.bias": (d,),
            f"{p}.ln_2.weight": (d,),
            f"{p}.ln_2.bias": (d,),
            f"{p}.mlp.c_fc.weight": (d, m),
            f"{p}.mlp.c_fc.bias": (m,),
            f"{p}.mlp.c_proj.weight": (m, d),
            f"{p}.mlp.c_proj.bias": (d,),
        }
    return shapes


def _check_gpt2_state_dict(
    state_dict: dict[str, Tensor], cfg: HookedTransformerConfig, tie_word_embeddings: bool
) -> None:
    expected = _expected_gpt2_shapes(cfg)
    present = {k for k in state_dict if not k.endswith(_MASK_BUFFERS)}
    if tie_word_embeddings:
        present.add("lm_head.weight")  # the unembedding is the embedding, when absent
    missing = sorted(set(expected) - present)
    extra = sorted(present - set(expected))
    wrong = [
        f"{k}: {tuple(state_dict[k].shape)} instead of {shape}"
        for k, shape in expected.items()
        if k in state_dict and tuple(state_dict[k].shape) != shape
    ]
    problems = [
        f"{label} {items}"
        for label, items in (("missing", missing), ("unexpected", extra), ("wrong shapes", wrong))
        if items
    ]
    if problems:
        raise CheckpointError(
            "the GPT-2 state dict does not match its config: " + "; ".join(problems)
        )


def convert_gpt2_state_dict(
    state_dict: dict[str, Tensor],
    cfg: HookedTransformerConfig,
    tie_word_embeddings: bool = True,
) -> dict[str, Tensor]:
    """Our state dict for a `GPT2LMHeadModel` state dict; missing, extra or misshapen HF
    tensors are a `CheckpointError` that lists them, raised before anything is converted."""
    _check_gpt2_state_dict(state_dict, cfg, tie_word_embeddings)
    sd = state_dict
    unembed = sd.get("lm_head.weight", sd["transformer.wte.weight"])
    out = {
        "embed.W_E": sd["transformer.wte.weight"],
        "pos_embed.W_pos": sd["transformer.wpe.weight"],
        "ln_final.w": sd["transformer.ln_f.weight"],
        "ln_final.b": sd["transformer.ln_f.bias"],
        "unembed.W_U": rearrange(unembed, "d_vocab d_model -> d_model d_vocab"),
        # GPT-2's lm_head has no bias.
        "unembed.b_U": torch.zeros(cfg.d_vocab_out, dtype=unembed.dtype, device=unembed.device),
    }
    for i in range(cfg.n_layers):
        out |= _convert_block(sd, f"transformer.h.{i}", f"blocks.{i}", cfg.n_heads)
    return out


def _convert_block(sd: dict[str, Tensor], hf: str, ours: str, n_heads: int) -> dict[str, Tensor]:
    W_Q, W_K, W_V = rearrange(
        sd[f"{hf}.attn.c_attn.weight"],
        "d_model (qkv head d_head) -> qkv head d_model d_head",
        qkv=3,
        head=n_heads,
    )
    b_Q, b_K, b_V = rearrange(
        sd[f"{hf}.attn.c_attn.bias"], "(qkv head d_head) -> qkv head d_head", qkv=3, head=n_heads
    )
    W_O = rearrange(
        sd[f"{hf}.attn.c_proj.weight"], "(head d_head) d_model -> head d_head d_model", head=n_heads
    )
    return {
        f"{ours}.ln1.w": sd[f"{hf}.ln_1.weight"],
        f"{ours}.ln1.b": sd[f"{hf}.ln_1.bias"],
        f"{ours}.attn.W_Q": W_Q,
        f"{ours}.attn.W_K": W_K,
        f"{ours}.attn.W_V": W_V,
        f"{ours}.attn.W_O": W_O,
        f"{ours}.attn.b_Q": b_Q,
        f"{ours}.attn.b_K": b_K,
        f"{ours}.attn.b_V": b_V,
        f"{ours}.attn.b_O": sd[f"{hf}.attn.c_proj.bias"],
        f"{ours}.ln2.w": sd[f"{hf}.ln_2.weight"],
        f"{ours}.ln2.b": sd[f"{hf}.ln_2.bias"],
        f"{ours}.mlp.W_in": sd[f"{hf}.mlp.c_fc.weight"],
        f"{ours}.mlp.b_in": sd[f"{hf}.mlp.c_fc.bias"],
        f"{ours}.mlp.W_out": sd[f"{hf}.mlp.c_proj.weight"],
        f"{ours}.mlp.b_out": sd[f"{hf}.mlp.c_proj.bias"],
    }
