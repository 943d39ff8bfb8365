"""DeepSeek V3.2 (`DeepseekV32ForCausalLM`) and GLM-MoE-DSA (`GlmMoeDsaForCausalLM`): DeepSeek
V3's latent attention and experts (`hf._deepseek`), each attention with a lightning indexer
that chooses the keys its queries read (`components.indexer`).

The indexer's HF tensors, and ours (`{a}`: `model.layers.{layer}.self_attn.indexer`):

    wq_b [(index_head d_index) q_rank]  -> W_IQ [index_head q_rank d_index]
    wk [d_index d_model]                -> W_IK [d_model d_index]
    k_norm (LayerNorm, gain and bias)   -> k_norm.w, k_norm.b
    weights_proj [index_head d_model]   -> W_IW [d_model index_head]

The indexer's heads rotate their first `qk_rope_head_dim` dimensions with the attention's
rotary: DeepSeek V3.2 as two halves (ours), GLM-MoE-DSA in interleaved pairs, which the
import reorders evens first, then odds, in `wq_b`'s heads and in `wk` and the key norm's
gain and bias alike (a LayerNorm commutes with a permutation of what it norms), as
`hf._deepseek` does for the attention's own rotated dimensions. Its LayerNorm's epsilon is
`transformers`' fixed 1e-6.

Refused: GLM-MoE-DSA's "shared" layers (`indexer_types`), which reuse an earlier layer's
choice instead of choosing their own, and any `layer_types` entry other than
"indexed_attention".
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf._deepseek import deepseek_v3_fields, deepseek_v3_table, each_layer
from hookedattn.core.hf._family import Family
from hookedattn.core.hf._llama import L
from hookedattn.core.hf._table import Rule, Table

_INDEXER_EPS = 1e-6  # transformers' `nn.LayerNorm(index_head_dim, eps=1e-6)`


def indexed_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `DeepseekV32Config` or a `GlmMoeDsaConfig`."""
    c = hf_config
    kinds = sorted(set(getattr(c, "layer_types", None) or ["indexed_attention"]))
    if kinds != ["indexed_attention"]:
        raise ValueError(
            f"layer_types holds {kinds}, which cannot be imported: every layer must be "
            f"'indexed_attention' (latent attention with a lightning indexer)"
        )
    shared = [i for i, kind in enumerate(getattr(c, "indexer_types", None) or []) if kind != "full"]
    if shared:
        raise ValueError(
            f"indexer_types marks layers {shared} {c.indexer_types[shared[0]]!r}: a layer that "
            f"reuses an earlier layer's chosen keys is not built; only 'full' layers (each "
            f"indexer choosing its own) can be imported"
        )
    return deepseek_v3_fields(c) | {
        "index_topk": int(c.index_topk),
        "index_n_heads": int(c.index_n_heads),
        "index_head_dim": int(c.index_head_dim),
        "index_norm_eps": _INDEXER_EPS,
    }


def _indexed_table(interleaved: bool) -> Callable[[Any, HookedTransformerConfig, Any], Table]:
    """DeepSeek V3's table and the indexer's rules, its rotary in interleaved pairs or not."""

    def table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
        base = deepseek_v3_table(hf_config, cfg, hf_model)
        rules = each_layer(indexer_rules(cfg, interleaved), range(cfg.n_layers))
        return dataclasses.replace(base, rules=(*base.rules, *rules), label=hf_config.model_type)

    return table


def indexer_rules(cfg: HookedTransformerConfig, interleaved: bool) -> list[Rule]:
    """The rules of block `{layer}`'s indexer, DeepSeek's names (module docstring)."""
    ours, hf = "blocks.{layer}.attn.indexer", f"{L}.self_attn.indexer"
    q_in = "q_rank" if cfg.q_lora_rank is not None else "d_model"
    rotated = _rotated_first_halves(cfg.rotary_dim) if interleaved else None
    return [
        Rule(f"{ours}.W_IQ", f"{hf}.wq_b.weight",
             f"(index_head d_index) {q_in} -> index_head {q_in} d_index", adjust=rotated),
        Rule(f"{ours}.W_IK", f"{hf}.wk.weight", "d_index d_model -> d_model d_index",
             adjust=rotated),
        Rule(f"{ours}.k_norm.w", f"{hf}.k_norm.weight", "d_index -> d_index", adjust=rotated),
        Rule(f"{ours}.k_norm.b", f"{hf}.k_norm.bias", "d_index -> d_index", adjust=rotated),
        Rule(f"{ours}.W_IW", f"{hf}.weights_proj.weight",
             "index_head d_model -> d_model index_head"),
    ]  # fmt: skip


def _rotated_first_halves(d_rope: int) -> Callable[[Tensor], Tensor]:
    """The last axis with its first `d_rope` dimensions reordered evens first, then odds:
    interleaved rotary pairs as our rotary's halves (module docstring)."""

    def reorder(tensor: Tensor) -> Tensor:
        rotated = tensor[..., :d_rope]
        return torch.cat([rotated[..., 0::2], rotated[..., 1::2], tensor[..., d_rope:]], dim=-1)

    return reorder


DEEPSEEK_V32 = Family(
    "DeepseekV32ForCausalLM", "deepseek_v32", indexed_fields, _indexed_table(False)
)
GLM_MOE_DSA = Family("GlmMoeDsaForCausalLM", "glm_moe_dsa", indexed_fields, _indexed_table(True))
