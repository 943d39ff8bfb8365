"""The identities of latent attention's reads (`components.latent_attention`): its latents
are their norms' outputs, and its queries, keys and values are linear in the latents (the
rotary key part in the normed stream)."""

import torch
from einops import einsum, repeat

from hookedattn.core import names as _names
from hookedattn.testing._identity import PRODUCTS, Get, Identity, Sides, linear, sum_of, weight

_EXPAND = "... rank, head rank d_out -> ... head d_out"


def projections(model, layer: int, source: str) -> list[Identity]:
    """`q_latent`, `kv_latent` == their norms' outputs; `q == q_latent @ W_Q` (or `source
    @ W_Q`, `source` the normed stream the attention reads); `k_rope == source @ W_K_rope +
    b_K_rope`; `k == [kv_latent @ W_K, k_rope]` per head; `v == kv_latent @ W_V`."""
    attn, prefix = model.blocks[layer].attn, f"blocks.{layer}.attn"
    act = lambda name: _names.get_act_name(name, layer)
    q_in = source
    out = []
    if model.cfg.q_lora_rank is not None:
        q_in = act("q_latent")
        out.append(sum_of(q_in, f"{prefix}.q_a_norm.hook_out"))
    out += [
        sum_of(act("kv_latent"), f"{prefix}.kv_a_norm.hook_out"),
        linear(act("q"), q_in, attn.W_Q, None, _EXPAND, "W_Q"),
        linear(act("k_rope"), source, attn.W_K_rope, attn.b_K_rope,
               "... d_model, d_model d_rope -> ... d_rope", "W_K_rope + b_K_rope"),
        _keys(act("k"), act("kv_latent"), act("k_rope"), attn.W_K),
        linear(act("v"), act("kv_latent"), attn.W_V, None, _EXPAND, "W_V"),
    ]  # fmt: skip
    return out


def _keys(k: str, latent: str, k_rope: str, W_K: torch.Tensor) -> Identity:
    """`k[..., head, :] == [latent @ W_K[head], k_rope]`: the rotary part shared by every head."""

    def sides(get: Get) -> Sides:
        c, shared = get(latent), get(k_rope)
        W = weight(W_K, c)
        heads = W.shape[0]
        nope, size = einsum(c, W, _EXPAND), einsum(c.abs(), W.abs(), _EXPAND)
        shared = repeat(shared, "... d_rope -> ... head d_rope", head=heads)
        expected = torch.cat([nope, shared], dim=-1)
        return Sides(get(k), expected, torch.cat([size, shared.abs()], dim=-1))

    statement = f"{k} == [{latent} @ W_K, {k_rope}] for every head"
    return Identity(statement, (k, latent, k_rope), _names.axis_names(k), PRODUCTS, sides)
