"""The identities of differential attention (`components.differential_attention`): each
query head's `z` mixes its key/value head's paired values, each pair's `z_diff` subtracts
its second head's `z` from its first's, and `z_normed` is that pair's norm, scaled.

The paired values are built here by indexing the cached `v` (value heads `j mod half` and
`j mod half + half` side by side), not by the component's rearrangement.
"""

import torch
from einops import einsum, rearrange
from torch import Tensor, nn

from hookedattn.core import names as _names
from hookedattn.testing._identity import PRODUCTS, TERMS, VALUE, Get, Identity, Sides, same_keys

_MIX = (
    "... kv_head group query_pos key_pos, ... key_pos kv_head d_pair "
    "-> ... query_pos kv_head group d_pair"
)


def _paired(v: Tensor) -> Tensor:
    """`[v[j mod half] | v[j mod half + half]]` for each key/value head `j`."""
    half = v.shape[-2] // 2
    first = [j % half for j in range(v.shape[-2])]
    return torch.cat([v[..., first, :], v[..., [j + half for j in first], :]], dim=-1)


def paired_mix(z: str, pattern: str, v: str, group: int) -> Identity:
    """`z == pattern @ paired(v)`, each query head reading its group's paired values."""

    def sides(get: Get) -> Sides:
        p, v_ = get(pattern), get(v)
        same_keys(v, v_.shape[-3], p.shape[-1])
        p = rearrange(p, "... (kv_head group) q k -> ... kv_head group q k", group=group)
        paired = _paired(v_)
        ungroup = "... q kv_head group d -> ... q (kv_head group) d"
        expected = rearrange(einsum(p, paired, _MIX), ungroup)
        size = rearrange(einsum(p.abs(), paired.abs(), _MIX), ungroup)
        return Sides(get(z), expected, size)

    statement = f"{z} == {pattern} @ (the paired heads of {v})"
    return Identity(statement, (z, pattern, v), _names.axis_names(z), PRODUCTS, sides)


def differential(z_diff: str, z: str, attn: nn.Module) -> Identity:
    """`z_diff[i] == z[i] - lambda z[i + n_heads / 2]`, `lambda` the layer's."""

    def sides(get: Get) -> Sides:
        z_ = get(z)
        half = z_.shape[-2] // 2
        lam = attn.lambda_full().detach().to(z_.dtype)
        first, second = z_[..., :half, :], z_[..., half:, :]
        return Sides(get(z_diff), first - lam * second, first.abs() + lam.abs() * second.abs())

    statement = f"{z_diff} == {z}[first half] - lambda {z}[second half]"
    return Identity(statement, (z_diff, z), _names.axis_names(z_diff), TERMS, sides)


def scaled(z_normed: str, normed: str, factor: float) -> Identity:
    """`z_normed == factor * normed`: the pair's norm times `1 - lambda_init`."""

    def sides(get: Get) -> Sides:
        x = get(normed) * factor
        return Sides(get(z_normed), x, x.abs())

    statement = f"{z_normed} == {factor:g} * {normed}"
    return Identity(statement, (z_normed, normed), _names.axis_names(z_normed), VALUE, sides)
