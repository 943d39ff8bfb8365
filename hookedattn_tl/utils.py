"""TransformerLens's `utils`: hook-name shorthand, `Slice`, masks, the loss, `test_prompt`.

`get_act_name` here accepts every shorthand TransformerLens 3.x accepts (`"k6"`,
`"scale4ln1"`, layer types `"a"`/`"m"`/`"attn"`, aliases `key`/`query`/`value`) and
returns the same strings; `hookedattn.core.names` is the stricter core version, which rejects
a layer type where none is needed.
"""

import re
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from hookedattn.core import names as _names
from hookedattn.core.loss import lm_cross_entropy_loss
from hookedattn_tl._activations import gelu_fast, gelu_new, solu

# The regular expression TransformerLens uses: a word, then the layer, then the layer type.
_COMPACT = re.compile(r"([a-z_]+?)(\d+)([a-z]?.*)")
_LAYER_TYPE_ALIASES = {
    "a": "attn",
    "m": "mlp",
    "b": "",
    "block": "",
    "blocks": "",
    "attention": "attn",
}
_NAME_ALIASES = {
    "attn": "pattern",
    "attn_logits": "attn_scores",
    "key": "k",
    "query": "q",
    "value": "v",
    "mlp_pre": "pre",
    "mlp_mid": "mid",
    "mlp_post": "post",
}
_ATTN_NAMES = ("k", "v", "q", "z", "rot_k", "rot_q", "result", "pattern", "attn_scores")
_MLP_NAMES = ("pre", "post", "mid", "pre_linear")
_NORM_NAMES = ("scale", "normalized")


def get_act_name(name: str, layer: int | str | None = None, layer_type: str | None = None) -> str:
    """A full hook name from TransformerLens shorthand, exactly as TransformerLens spells it.

    `get_act_name("k", 6, "a")`, `get_act_name("k6")` and `get_act_name("key", 6)` are all
    `"blocks.6.attn.hook_k"`; `get_act_name("scale4ln1")` is `"blocks.4.ln1.hook_scale"`;
    `get_act_name("scale")` is `"ln_final.hook_scale"`; a full name comes back unchanged.
    """
    if not isinstance(name, str):
        raise TypeError(f"an activation name is a str, got {type(name).__name__}")
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    compact = _COMPACT.fullmatch(name)
    if compact is not None and compact.group(1) in (*_names.short_names(), *_NAME_ALIASES):
        name, layer, layer_type = compact.group(1), compact.group(2), compact.group(3) or None
    name = _NAME_ALIASES.get(name, name)
    if name in _ATTN_NAMES:
        layer_type = "attn"
    elif name in _MLP_NAMES:
        layer_type = "mlp"
    elif layer_type in _LAYER_TYPE_ALIASES:
        layer_type = _LAYER_TYPE_ALIASES[layer_type]
    if isinstance(layer, int) and layer < 0:
        raise ValueError(
            f"get_act_name needs a non-negative layer, got {layer}; the cache resolves "
            f"negative layers (cache[{name!r}, {layer}]) because it knows how many there are"
        )
    full = "" if layer is None else f"blocks.{layer}."
    full += f"{layer_type}." if layer_type else ""
    full += f"hook_{name}"
    if name in _NORM_NAMES and layer is None:
        full = f"ln_final.{full}"
    return full


# numpy arrays are accepted too; numpy is imported only where an array is made (torch
# does not need numpy, so neither does importing this package).
SliceInput = int | tuple | list | slice | Tensor | None


class Slice:
    """TransformerLens's `Slice`: an index along one axis that may drop that axis.

    `Slice(None)` keeps everything; `Slice(3)` takes index 3 and drops the axis;
    `Slice((1, 5))` is `1:5`, `Slice((1, 5, 2))` is `1:5:2` (a tuple is `slice(*t)`, as in
    TransformerLens, so `(k,)` is `:k`); a list, tensor or array takes those indices.
    """

    def __init__(self, input_slice: "SliceInput | Slice" = None) -> None:
        if isinstance(input_slice, Slice):
            self.slice, self.mode = input_slice.slice, input_slice.mode
        elif isinstance(input_slice, tuple):
            self.slice, self.mode = slice(*input_slice), "slice"
        elif isinstance(input_slice, bool):
            raise ValueError(
                f"a Slice takes an int, tuple, slice, list or tensor, not {input_slice}"
            )
        elif isinstance(input_slice, int):
            self.slice, self.mode = input_slice, "int"
        elif isinstance(input_slice, slice):
            self.slice, self.mode = input_slice, "slice"
        elif isinstance(input_slice, list | Tensor) or _is_array(input_slice):
            self.slice, self.mode = to_numpy(input_slice), "array"
        elif input_slice is None:
            self.slice, self.mode = slice(None), "identity"
        else:
            raise ValueError(
                f"invalid input_slice {input_slice!r}: a Slice takes None, an int, a tuple "
                f"(start, stop[, step]), a slice, a list, an array or a tensor of indices"
            )

    def apply(self, tensor: Tensor, dim: int = 0) -> Tensor:
        """`tensor` indexed along axis `dim` (negative axes count from the end)."""
        index: list[Any] = [slice(None)] * tensor.ndim
        index[dim] = torch.as_tensor(self.slice) if self.mode == "array" else self.slice
        return tensor[tuple(index)]

    def indices(self, max_ctx: int | None = None) -> Any:
        """The indices this slice takes from an axis of size `max_ctx` (a numpy array)."""
        import numpy as np

        if self.mode == "int":
            return np.array([self.slice], dtype=np.int64)
        if max_ctx is None:
            raise ValueError("max_ctx must be given for a Slice that is not an int")
        return np.arange(max_ctx, dtype=np.int64)[self.slice]

    @classmethod
    def unwrap(cls, slice_input: "SliceInput | Slice") -> "Slice":
        """A `Slice` of `slice_input`; an int becomes a one-element list (keeps the axis)."""
        if isinstance(slice_input, Slice):
            return slice_input
        if isinstance(slice_input, int) and not isinstance(slice_input, bool):
            slice_input = [slice_input]
        return cls(slice_input)

    def __repr__(self) -> str:
        return f"Slice: {self.slice} Mode: {self.mode} "


def _is_array(x: object) -> bool:
    return type(x).__module__ == "numpy" and type(x).__name__ == "ndarray"


def to_numpy(tensor: Any) -> Any:
    """A numpy array of a tensor (detached, on the CPU; bfloat16 as float32), list or number."""
    import numpy as np

    if isinstance(tensor, np.ndarray):
        return tensor
    if isinstance(tensor, list | tuple):
        return np.array(tensor)
    if isinstance(tensor, Tensor):
        tensor = tensor.detach().cpu()
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    if isinstance(tensor, int | float | bool | str):
        return np.array(tensor)
    raise ValueError(f"to_numpy takes a tensor, array, list or number, got {type(tensor).__name__}")


def get_corner(tensor: Tensor, n: int = 3) -> Tensor:
    """The top-left corner of a tensor: its first `n` entries along every axis."""
    return tensor[tuple(slice(n) for _ in range(tensor.ndim))]


def transpose(tensor: Float[Tensor, "... a b"]) -> Float[Tensor, "... b a"]:
    """Swap the last two axes."""
    return tensor.transpose(-1, -2)


def remove_batch_dim(tensor: Float[Tensor, "..."]) -> Float[Tensor, "..."]:
    """Drop a leading batch axis of size one; any other tensor comes back unchanged."""
    return tensor[0] if tensor.shape[0] == 1 else tensor


def get_attention_mask(
    tokenizer: Any, tokens: Int[Tensor, "batch pos"], prepend_bos: bool
) -> Int[Tensor, "batch pos"]:
    """1 for real tokens, 0 for padding, read off the tokens (TransformerLens's rule).

    Trailing pad tokens are padding for a right-padding tokenizer, leading ones for a
    left-padding one; with left padding and BOS sharing the pad id, the BOS right before
    each prompt is kept. A tokenizer without `padding_side` pads on the right.
    """
    mask = torch.ones_like(tokens)
    if tokenizer is None:
        return mask
    pad = tokenizer.pad_token_id
    if pad is None:
        return mask
    real = tokens.ne(pad).long()
    if getattr(tokenizer, "padding_side", "right") == "right":
        padding = real.flip(-1).cumsum(-1).flip(-1) == 0
        mask[padding] = 0
        return mask
    padding = real.cumsum(-1) == 0
    mask[padding] = 0
    if prepend_bos and tokenizer.bos_token_id == pad:
        bos_at = padding.sum(-1) - 1
        rows = torch.arange(mask.shape[0], device=mask.device)
        mask[rows, bos_at.clamp(min=0)] = 1
    return mask


def test_prompt(
    prompt: str,
    answer: str | list[str],
    model: Any,
    prepend_space_to_answer: bool = True,
    print_details: bool = True,
    prepend_bos: bool | None = None,
    top_k: int = 10,
) -> None:
    """Print how the model ranks `answer` after `prompt` (TransformerLens's `test_prompt`,
    line for line the same printout).

    One answer may span several tokens, each ranked at its position; several answers are
    compared as next tokens only (their first tokens). For each answer token: its rank,
    logit and probability, then (with `print_details`) the `top_k` tokens the model prefers
    there; last, the ranks of the answer tokens.
    """
    answers = [answer] if isinstance(answer, str) else list(answer)
    several = len(answers) > 1
    if prepend_space_to_answer:
        answers = [a if a.startswith(" ") else " " + a for a in answers]
    prompt_tokens = model.to_tokens(prompt, prepend_bos=prepend_bos)
    answer_tokens = model.to_tokens(answers, prepend_bos=False)
    if several:
        answer_tokens = answer_tokens[:, :1]
    tokens = torch.cat([prompt_tokens.repeat(answer_tokens.shape[0], 1), answer_tokens], dim=1)
    answer_strs = [model.to_str_tokens(a, prepend_bos=False) for a in answers]
    n_prompt = prompt_tokens.shape[1]
    if print_details:
        print("Tokenized prompt:", model.to_str_tokens(prompt, prepend_bos=prepend_bos))
        if several:
            print("Tokenized answers:", answer_strs)
        else:
            print("Tokenized answer:", answer_strs[0])
    with torch.no_grad():
        logits = model(tokens)
    probs = logits.softmax(dim=-1)
    ranks = []
    for index in range(n_prompt, n_prompt + (1 if several else len(answer_strs[0]))):
        targets, strs = tokens[:, index], [a[index - n_prompt] for a in answer_strs]
        row_probs = probs[:, index - 1]
        order = row_probs.argsort(dim=-1, descending=True, stable=True)
        rank_of = order.argsort(dim=-1)[range(len(strs)), targets].tolist()
        ranks.append(list(zip(strs, rank_of, strict=True)))
        if not print_details:
            continue
        lines = [
            f"Rank: {rank_of[i]: <8} Logit: {float(logits[i, index - 1, targets[i]]):5.2f} "
            f"Prob: {float(row_probs[i, targets[i]]):6.2%} Token: |{strs[i]}|"
            for i in range(len(strs))
        ]
        print(f"Performance on answer token{'s' if several else ''}:\n" + "\n".join(lines))
        for k in range(top_k):
            top = order[0, k]
            print(
                f"Top {k}th token. Logit: {float(logits[0, index - 1, top]):5.2f} "
                f"Prob: {float(row_probs[0, top]):6.2%} Token: |{model.to_string(top)}|"
            )
    print(f"Ranks of the answer tokens: {[r[0] for r in ranks] if not several else ranks}")


# pytest would collect `test_prompt` from a test module that imports it by name.
test_prompt.__test__ = False  # type: ignore[attr-defined]

__all__ = [
    "Slice",
    "SliceInput",
    "gelu_fast",
    "gelu_new",
    "get_act_name",
    "get_attention_mask",
    "get_corner",
    "lm_cross_entropy_loss",
    "remove_batch_dim",
    "solu",
    "test_prompt",
    "to_numpy",
    "transpose",
]
