"""The layers a `HookedTransformer` is built from, one concept per file.

Each variant is its own small module, chosen when the model is built (`make_block`,
`make_attention`: full, grouped, latent or differential; `make_mixer`: a hybrid's short convolution,
Mamba-2 or gated delta net in attention's place; `make_mlp` or `MoE`, `make_norm`,
`make_embed_norm`, `make_embed_projection`, `make_final_norm`, `make_unembed_transform`,
`make_soft_cap`), so that every forward stays the equation it implements.
"""

from hookedattn.core.components.alibi import ALiBi, alibi_slopes
from hookedattn.core.components.attention import Attention, GroupedQueryAttention
from hookedattn.core.components.attention_gate import make_gate, routed_gate
from hookedattn.core.components.attn_inputs import AttnInputs
from hookedattn.core.components.block import (
    AttnOnlyBlock,
    Block,
    MLPOnlyBlock,
    NormedSkipBlock,
    ParallelBlock,
    ParallelMixerBlock,
    PerLayerInputBlock,
    PostResidualBlock,
    make_attention,
    make_block,
    make_mixer,
)
from hookedattn.core.components.causal_conv import (
    causal_conv,
    causal_conv_continued,
    real_positions,
)
from hookedattn.core.components.decay import segment_log_decay
from hookedattn.core.components.differential_attention import (
    DifferentialAttention,
    GroupedDifferentialAttention,
    lambda_init,
    make_differential_attention,
    paired_values,
)
from hookedattn.core.components.embed import Embed, PosEmbed, Unembed, affine, affine_params
from hookedattn.core.components.embed_projection import (
    EmbedProjection,
    NoProjection,
    make_embed_projection,
)
from hookedattn.core.components.gated_delta import (
    GatedDeltaNet,
    delta_chunk,
    delta_mixing,
    delta_rule,
)
from hookedattn.core.components.indexer import Indexer
from hookedattn.core.components.kimi_delta import KimiDeltaAttention, kimi_delta_scan
from hookedattn.core.components.latent_attention import LatentAttention
from hookedattn.core.components.lightning import LightningAttention, decayed_causal_pattern
from hookedattn.core.components.mamba import MambaMixer, selective_scan
from hookedattn.core.components.mamba2 import Mamba2Mixer, ssd_chunk, ssd_mixing, ssd_rule
from hookedattn.core.components.mlp import (
    MLP,
    GatedMLP,
    NeuronNormMLP,
    SubNormGatedMLP,
    gelu_new,
    glu,
    make_mlp,
    relu2,
    solu,
)
from hookedattn.core.components.moe import ExpertHooks, MoE
from hookedattn.core.components.norm import (
    LayerNorm,
    LayerNormPre,
    NoNorm,
    RMSNorm,
    RMSNormPre,
    make_embed_norm,
    make_final_norm,
    make_ln1,
    make_ln2_post,
    make_norm,
    make_placed_norm,
    mean_square,
    rms_normalized,
)
from hookedattn.core.components.per_layer_input import PerLayerInput, PerLayerInputs
from hookedattn.core.components.query_temperature import QueryTemperature
from hookedattn.core.components.resid_scale import ResidScale
from hookedattn.core.components.rg_lru import RGLRUMixer, linear_recurrence
from hookedattn.core.components.rotary import Rotary, rotary_attention_factor, rotary_frequencies
from hookedattn.core.components.shared_kv_attention import SharedKVAttention
from hookedattn.core.components.short_conv import ShortConv
from hookedattn.core.components.soft_cap import SoftCap, make_soft_cap
from hookedattn.core.components.sparsemixer import sparsemixer_weights
from hookedattn.core.components.unembed_transform import (
    NoTransform,
    UnembedTransform,
    make_unembed_transform,
)
from hookedattn.core.components.xielu import XIELU

__all__ = [
    "MLP",
    "XIELU",
    "ALiBi",
    "Attention",
    "AttnInputs",
    "AttnOnlyBlock",
    "Block",
    "DifferentialAttention",
    "Embed",
    "EmbedProjection",
    "ExpertHooks",
    "GatedDeltaNet",
    "GatedMLP",
    "GroupedDifferentialAttention",
    "GroupedQueryAttention",
    "Indexer",
    "KimiDeltaAttention",
    "LatentAttention",
    "LayerNorm",
    "LayerNormPre",
    "LightningAttention",
    "MLPOnlyBlock",
    "Mamba2Mixer",
    "MambaMixer",
    "MoE",
    "NeuronNormMLP",
    "NoNorm",
    "NoProjection",
    "NoTransform",
    "NormedSkipBlock",
    "ParallelBlock",
    "ParallelMixerBlock",
    "PerLayerInput",
    "PerLayerInputBlock",
    "PerLayerInputs",
    "PosEmbed",
    "PostResidualBlock",
    "QueryTemperature",
    "RGLRUMixer",
    "RMSNorm",
    "RMSNormPre",
    "ResidScale",
    "Rotary",
    "SharedKVAttention",
    "ShortConv",
    "SoftCap",
    "SubNormGatedMLP",
    "Unembed",
    "UnembedTransform",
    "affine",
    "affine_params",
    "alibi_slopes",
    "causal_conv",
    "causal_conv_continued",
    "decayed_causal_pattern",
    "delta_chunk",
    "delta_mixing",
    "delta_rule",
    "gelu_new",
    "glu",
    "kimi_delta_scan",
    "lambda_init",
    "linear_recurrence",
    "make_attention",
    "make_block",
    "make_differential_attention",
    "make_embed_norm",
    "make_embed_projection",
    "make_final_norm",
    "make_gate",
    "make_ln1",
    "make_ln2_post",
    "make_mixer",
    "make_mlp",
    "make_norm",
    "make_placed_norm",
    "make_soft_cap",
    "make_unembed_transform",
    "mean_square",
    "paired_values",
    "real_positions",
    "relu2",
    "rms_normalized",
    "rotary_attention_factor",
    "rotary_frequencies",
    "routed_gate",
    "segment_log_decay",
    "selective_scan",
    "solu",
    "sparsemixer_weights",
    "ssd_chunk",
    "ssd_mixing",
    "ssd_rule",
]
