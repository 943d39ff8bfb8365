"""Which parameters read each norm's output, for `processing.fold_layer_norm` to fold the
norm into: an attention's (or latent attention's) q/k/v maps and output gate, a lightning
indexer's reads, a hybrid mixer's input maps, an MLP's (or a mixture's router, experts and
shared expert). Each is a list of `(weight, bias)` state-dict names (bias None: the reader
has none, and takes the gain only); a weight is `[... d_model out]`.
"""

from collections.abc import Mapping

from torch import Tensor

from hookedattn.core.components import kimi_delta
from hookedattn.core.config import HookedTransformerConfig


def attn_readers(
    cfg: HookedTransformerConfig, attn: str, state: Mapping[str, Tensor]
) -> list[tuple[str, str | None]]:
    """The weights (and biases) that read an attention's input: W_Q, W_K, W_V (grouped-query
    attention stores the last two as _W_K, _W_V), or latent attention's projections to its
    latents and its shared rotary key (its latents' own norms keep their gains)."""
    # The output gate reads the same input.
    gate = [(f"{attn}.W_G", f"{attn}.b_G")] if cfg.attn_gate is not None else []
    if cfg.is_latent_attention:
        query = [(f"{attn}.W_Q", None)] if cfg.q_lora_rank is None else [
            (f"{attn}.W_Q_a", f"{attn}.b_Q_a")
        ]  # fmt: skip
        return [
            *query,
            (f"{attn}.W_KV_a", f"{attn}.b_KV_a"),
            (f"{attn}.W_K_rope", f"{attn}.b_K_rope"),
            *indexer_readers(cfg, f"{attn}.indexer", state),
            *gate,
        ]
    readers: list[tuple[str, str | None]] = [(f"{attn}.W_Q", f"{attn}.b_Q")]
    for kind in "KV":
        stored = f"{attn}._" if f"{attn}._W_{kind}" in state else f"{attn}."
        readers.append((f"{stored}W_{kind}", f"{stored}b_{kind}"))
    readers += gate
    return readers


def indexer_readers(
    cfg: HookedTransformerConfig, indexer: str, state: Mapping[str, Tensor]
) -> list[tuple[str, str | None]]:
    """A lightning indexer's reads of the attention's input (`components.indexer`): its key
    and head weights, and its queries where they read the stream rather than the query
    latent; none in a block without one."""
    if f"{indexer}.W_IK" not in state:
        return []
    query = [(f"{indexer}.W_IQ", None)] if cfg.q_lora_rank is None else []
    return [*query, (f"{indexer}.W_IK", None), (f"{indexer}.W_IW", None)]


# A hybrid's mixers read the stream through affine maps only (`components.short_conv`,
# `components.mamba2`, `components.mamba`, `components.gated_delta`, `components.rg_lru`):
# the norm before them
# folds into those maps as into W_Q, W_K, W_V.
MIXER_INPUTS = {
    "short_conv": ("B", "C", "X"),
    "mamba2": ("z", "xBC", "dt"),
    "mamba": ("xs", "z"),
    "gated_delta": ("q", "k", "v", "z", "b", "a"),
    "rg_lru": ("x", "y"),
    "lightning": ("q", "k", "v", "gate"),
}


def mixer_readers(cfg: HookedTransformerConfig, layer: int) -> list[tuple[str, str | None]]:
    """The weights (and biases) by which block `layer`'s mixer reads its input (Kimi Delta
    Attention's gates by low-rank pairs or whole maps: `kimi_delta._input_maps`)."""
    mixer = f"blocks.{layer}.mixer"
    inputs = MIXER_INPUTS | {"kimi_delta": kimi_delta._input_maps(cfg.mixers)}
    return [(f"{mixer}.W_{n}", f"{mixer}.b_{n}") for kind in cfg.mixers.layer_mixers(layer)
            for n in inputs[kind]]  # fmt: skip


def mlp_readers(
    cfg: HookedTransformerConfig, mlp: str, experts: bool
) -> list[tuple[str, str | None]]:
    """The weights (and biases) that read an MLP's input: a dense MLP's, or (`experts`) a
    mixture's router, experts (stacked, `[expert d_model d_mlp]`) and shared expert; their
    gates where they are gated (`gated_mlp`)."""
    gated = cfg.gated_mlp
    if not experts:
        gate_bias = f"{mlp}.b_gate" if cfg.mlp_gate_bias else None
        return [(f"{mlp}.W_in", f"{mlp}.b_in"), *([(f"{mlp}.W_gate", gate_bias)] if gated else [])]
    readers = [(f"{mlp}.W_router", f"{mlp}.b_router"), (f"{mlp}.W_in", f"{mlp}.b_in")]
    readers += [(f"{mlp}.W_gate", f"{mlp}.b_gate")] if gated else []
    if cfg.d_mlp_shared is not None:
        shared = f"{mlp}.shared_expert"
        readers += [(f"{shared}.W_in", f"{shared}.b_in")]
        readers += [(f"{shared}.W_gate", None)] if gated else []
    if cfg.shared_expert_gate:
        readers.append((f"{mlp}.W_shared_gate", None))
    return readers
