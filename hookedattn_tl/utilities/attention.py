"""TransformerLens 3.x's `utilities.attention`: the per-head linear maps of attention."""

from einops import einsum
from jaxtyping import Float
from torch import Tensor


def simple_attn_linear(
    input: Float[Tensor, "batch pos d_model"],
    w: Float[Tensor, "head d_model d_head"],
    b: Float[Tensor, "head d_head"],
) -> Float[Tensor, "batch pos head d_head"]:
    """`input @ w[h] + b[h]` for every head `h`: one stream read by every head."""
    return einsum(input, w, "batch pos d_model, head d_model d_head -> batch pos head d_head") + b


def complex_attn_linear(
    input: Float[Tensor, "batch pos head d_model"],
    w: Float[Tensor, "head d_model d_head"],
    b: Float[Tensor, "head d_head"],
) -> Float[Tensor, "batch pos head d_head"]:
    """`input[:, :, h] @ w[h] + b[h]`: each head reads its own copy of the stream
    (`use_split_qkv_input`, `use_attn_in`)."""
    pattern = "batch pos head d_model, head d_model d_head -> batch pos head d_head"
    return einsum(input, w, pattern) + b


__all__ = ["complex_attn_linear", "simple_attn_linear"]
