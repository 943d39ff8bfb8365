"""A prediction head between the final norm and the unembedding of a decoder read by
convention (ModernBERT-decoder's `lm_head`): a child of the causal LM beside its base model
and its unembedding that holds one square linear map (a bias or none), an activation and one
norm, `norm(act(dense(x)))`: our `unembed_transform` (`components.unembed_transform`).
BERT-likes' heads are read where their layers are (`_split_layers`)."""

from typing import Any

from torch import nn

from hookedattn.core.hf._roles import is_norm
from hookedattn.core.hf._split_layers import activation_between


def prediction_head(twin: nn.Module, base: nn.Module, vocab_size: int) -> dict[str, Any]:
    """The anatomy's `head_dense` (and whether it has a bias), `head_norm` and `head_act`
    for the twin's head; none where no child beside the base model and the unembedding
    holds exactly one linear map and one norm. A dense map that is not square is a
    ValueError naming it."""
    unembed = twin.get_output_embeddings()
    if base is twin:  # no base model: the pieces are the model's own
        return {}
    heads = [(name, m) for name, m in twin.named_children()
             if m is not base and m is not unembed and _dense_and_norm(m)]  # fmt: skip
    if len(heads) != 1:
        return {}
    name, head = heads[0]
    (dense,), (norm,) = _dense_and_norm(head)
    weight, bias = head.get_submodule(dense).weight, head.get_submodule(dense).bias
    if weight.shape[0] != weight.shape[1]:
        raise ValueError(
            f"the head's dense map {name}.{dense} is not square: {tuple(weight.shape)}"
        )
    dense, norm = f"{name}.{dense}", f"{name}.{norm}"
    act = activation_between(twin, vocab_size, dense, norm, within=twin)
    return {"head_dense": dense, "head_dense_bias": bias is not None, "head_norm": norm,
            "head_act": act}  # fmt: skip


def _dense_and_norm(module: nn.Module) -> tuple[list[str], list[str]] | None:
    """The names of `module`'s one linear map and one norm; None unless it holds just
    those two with parameters (and parameter-free pieces: an activation, a dropout)."""
    children = [(n, m) for n, m in module.named_children() if any(True for _ in m.parameters())]
    dense = [n for n, m in children if isinstance(m, nn.Linear)]
    norms = [n for n, m in children if is_norm(m)]
    if len(dense) != 1 or len(norms) != 1 or len(children) != 2:
        return None
    return dense, norms
