"""How a sublayer runs when its heads, neurons or vocabulary are split over ranks.

The equations are the components'; each rank runs them on its own slice of the weights,
and one collective joins the slices where the equation sums or concatenates over them:

    attention   q, k, v, scores, pattern, z of this rank's heads (the component's own
                code, fused kernel and all); out = sum over ranks of sum_{h here} z_h W_O[h],
                then + b_O once                                  (one all-reduce)
    MLP         pre, post of this rank's neurons; out = sum over ranks of post W_out, + b_out
                                                                 (one all-reduce)
    experts     the router whole on every rank (each token's experts the same on all);
                each expert's pre, post of this rank's neurons, its out summed over ranks
                as the MLP's                    (one all-reduce per expert run, or one for
                                                 all of them where they run grouped)
    embedding   each rank looks up the tokens of its part of the vocabulary, zeros for the
                others; the sum over ranks is the lookup itself, exactly (one all-reduce)
    unembedding logits of this rank's part of the vocabulary, concatenated (one all-gather)

A head reads only its own q, k, v, so the attention of each head is computed exactly as in
one process; a sum over ranks of partial sums is the one-process sum in another order,
which is the only difference (float32 ~1e-7, float64 ~1e-16 relative). Each class here is a
mixin put before a component's own class (`shard_*` below swap it in, as FSDP2's
`fully_shard` does) that replaces only the component's combine steps (where the stream
enters the split weights, `enter`; how their writes add up, `write`, `summed`,
`summed_heads`; how the vocabulary's parts join, `joined`), so the component's forward,
written once, runs on every rank (the embedding's `lookup`: each row where it lives, the
ranks' rows summed).
"""

import dataclasses
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.core import kernels
from hookedattn.core.components.attn_inputs import AttnInputs
from hookedattn.core.components.mlp import MLP, GatedMLP
from hookedattn.core.components.moe import MoE
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.kv_cache import KeyValueCacheEntry
from hookedattn.core.parallel._collectives import gather, replicated_input, sum_partials
from hookedattn.core.parallel._group import TensorParallelGroup
from hookedattn.core.parallel._sharding import (
    narrow_parameters,
    present,
    shard_hook_point,
    swap_class,
)
from hookedattn.core.parallel._shards import LocalSlice, local_slice
from hookedattn.core.shapes import Resid


def partial_affine(x: Tensor, W: Tensor, b: Tensor, tp: TensorParallelGroup) -> Tensor:
    """`x @ W + b` where `W`'s rows (the contracted axis) are split over the ranks: this
    rank's rows' product, the ranks' partial sums added, then the bias once."""
    return sum_partials(nn.functional.linear(x, kernels.transposed(W)), tp) + b


class HeadParallelAttention:
    """An attention sublayer holding this rank's query heads and their key/value heads:
    their writes summed over the ranks."""

    tp: TensorParallelGroup
    kv_slice: LocalSlice

    def forward(
        self,
        query_input: Tensor,
        key_input: Tensor,
        value_input: Tensor,
        context: kernels.AttentionContext,
        past_kv: KeyValueCacheEntry | None = None,
    ) -> Resid:
        if past_kv is not None:
            past_kv = self._local_past(past_kv)
        return super().forward(query_input, key_input, value_input, context, past_kv)

    def _local_past(self, entry: KeyValueCacheEntry) -> KeyValueCacheEntry:
        """A KV cache entry of this rank's key/value heads. One built from whole cached keys
        (as patching builds them, or `KeyValueCache.empty`) holds every head: it is cut to
        this rank's, in place unless frozen (a frozen one is read, never stored into)."""
        part, heads = self.kv_slice, entry.past_keys.shape[2]
        if heads == part.length:
            return entry
        if heads != part.size:
            raise ValueError(
                f"a KV cache entry of {heads} key/value heads given to attention with "
                f"{part.size} (this rank holds {part.start}..{part.stop - 1})"
            )
        keys = entry.past_keys.narrow(2, part.start, part.length)
        values = entry.past_values.narrow(2, part.start, part.length)
        if entry.frozen:
            return KeyValueCacheEntry(keys, values, frozen=True)
        entry.past_keys, entry.past_values = keys, values
        return entry

    def summed(self, z: Tensor, W_O: Tensor, b_O: Tensor) -> Resid:
        """`z @ W_O + b_O` over every rank's heads."""
        return partial_affine(z, W_O, b_O, self.tp)

    def summed_heads(self, result: Float[Tensor, "batch pos head d_model"]) -> Resid:
        """The sum of every rank's heads' results."""
        return sum_partials(super().summed_heads(result), self.tp)


class HeadParallelInputs(AttnInputs):
    """The attention's inputs on a rank: the stream enters the sharded attention here (its
    gradient is summed over the ranks), and per-head copies are made for this rank's heads."""

    def __init__(self, cfg: HookedTransformerConfig, tp: TensorParallelGroup) -> None:
        super().__init__(cfg)
        self.tp = tp
        self.n_heads = tp.slice_of(cfg.n_heads, 0).length
        self.n_kv_heads = tp.slice_of(cfg.n_kv_heads, 0).length

    def _shared(self, block: nn.Module, resid: Resid) -> tuple[Tensor, Tensor, Tensor]:
        x = replicated_input(block.ln1(resid), self.tp)
        return x, x, x

    def _per_head(self, block: nn.Module, resid: Resid) -> tuple[Tensor, Tensor, Tensor]:
        return super()._per_head(block, replicated_input(resid, self.tp))

    def _split(self, block: nn.Module, resid: Resid) -> tuple[Tensor, Tensor, Tensor]:
        return super()._split(block, replicated_input(resid, self.tp))

    def position_embedding(self, context: kernels.AttentionContext) -> Tensor:
        """A shortformer's positional embedding, entering the sharded attention as the
        stream does (backwards, its gradient summed over the ranks' heads)."""
        return replicated_input(super().position_embedding(context), self.tp)


class NeuronParallelMLP:
    """An MLP, plain or gated, holding this rank's neurons: `W_in`, `b_in` (and `W_gate`)
    columns, `W_out` rows; the stream enters them here, their writes summed over the ranks."""

    tp: TensorParallelGroup

    def enter(self, x: Resid) -> Resid:
        """The stream, entering the split neurons (backwards, the ranks' gradients summed)."""
        return replicated_input(x, self.tp)

    def write(self, post: Float[Tensor, "batch pos d_mlp"]) -> Resid:
        """`post @ W_out + b_out` over every rank's neurons."""
        return partial_affine(post, self.W_out, self.b_out, self.tp)


class NeuronParallelMoE:
    """A mixture of experts holding this rank's neurons of every expert (`W_in`, `W_gate`,
    `b_in`, `b_gate` columns, `W_out` rows of each); the router is whole on every rank, so
    every rank routes each token to the same experts, and each expert's writes are summed
    over the ranks as the dense MLP's are."""

    tp: TensorParallelGroup

    def enter(self, x: Float[Tensor, "row d_model"]) -> Float[Tensor, "row d_model"]:
        """The rows, entering the split neurons (backwards, the ranks' gradients summed)."""
        return replicated_input(x, self.tp)

    def write(self, post: Float[Tensor, "row d_mlp"], affine: Any) -> Float[Tensor, "row d_model"]:
        """`post @ W_out + b_out` over every rank's neurons: the bias added by rank 0 alone."""
        bias = self.b_out if self.tp.rank == 0 else torch.zeros_like(self.b_out)
        return sum_partials(affine(post, self.W_out, bias), self.tp)


class VocabParallelEmbed:
    """The token embedding's rows of this rank's part of the vocabulary."""

    tp: TensorParallelGroup
    vocab_slice: LocalSlice

    def lookup(self, tokens: Int[Tensor, "batch pos"]) -> Resid:
        """`W_E[tokens]`: each rank's rows of its own tokens, zeros for the others, summed."""
        part = self.vocab_slice
        elsewhere = (tokens < part.start) | (tokens >= part.stop)
        local = (tokens - part.start).clamp(0, part.length - 1)
        rows = nn.functional.embedding(local, self.W_E).masked_fill(elsewhere[..., None], 0.0)
        # Exactly one rank holds each token's row; the others add zeros.
        return sum_partials(rows, self.tp)


class VocabParallelUnembed:
    """The unembedding's columns of this rank's part of the vocabulary; the logits of
    every rank's part are gathered, so every rank returns all of them."""

    tp: TensorParallelGroup
    vocab_slice: LocalSlice

    def enter(self, x: Resid) -> Resid:
        """The stream, entering the split vocabulary (backwards, the gradients summed)."""
        return replicated_input(x, self.tp)

    def joined(self, logits: Tensor) -> Float[Tensor, "batch pos d_vocab_out"]:
        """Every rank's part of the vocabulary, concatenated."""
        return gather(logits, -1, self.vocab_slice.size, self.tp)


# ------------------------------------------------------------------ sharding in place
# Every sharded parameter: (the kind of module holding it, its name) -> (the axis cut, the
# config field of that axis's size). Parameters not listed are replicated (norm gains,
# `b_O`, `b_out`, `W_pos`). The loaders read the slices this table gives.
SHARDED: dict[tuple[str, str], tuple[int, str]] = {
    # sinks: GPT-OSS's; W_G, b_G: an output gate on each head's z (Qwen3-Next, Qwen3.5)
    # W_KV_b: latent attention's expansion of its key/value latent into each head
    **{("attn", w): (0, "n_heads") for w in ("W_Q", "b_Q", "W_O", "sinks", "W_G", "b_G", "W_KV_b")},
    **{("attn", w): (0, "n_kv_heads") for w in ("W_K", "W_V", "b_K", "b_V")},
    **{("attn", w): (0, "n_kv_heads") for w in ("_W_K", "_W_V", "_b_K", "_b_V")},
    **{("mlp", w): (1, "d_mlp") for w in ("W_in", "W_gate")},
    **{("mlp", w): (0, "d_mlp") for w in ("b_in", "b_gate", "W_out")},
    **{("shared_expert", w): (1, "d_mlp_shared") for w in ("W_in", "W_gate")},
    **{("shared_expert", w): (0, "d_mlp_shared") for w in ("b_in", "b_gate", "W_out")},
    ("embed", "W_E"): (0, "d_vocab"),
    ("unembed", "W_U"): (1, "d_vocab_out"),
    ("unembed", "b_U"): (0, "d_vocab_out"),
}


def shard_plan(
    names: list[str],
    cfg: HookedTransformerConfig,
    rank: int,
    n_ranks: int,
    sizes: dict[str, int] | None = None,
) -> dict[str, LocalSlice]:
    """Rank `rank`'s slice of each parameter among the state-dict `names` that is sharded
    over `n_ranks` ranks (`SHARDED`); the others are whole on every rank. An axis's size is
    the config's field, or `sizes`'s where it names the field (a dense block's `d_mlp`
    in a mixture-of-experts model is `d_mlp_dense`)."""
    sizes = sizes or {}
    plan = {}
    for name in names:
        module, _, leaf = name.rpartition(".")
        rule = SHARDED.get((module.rpartition(".")[2], leaf))
        if rule is not None:
            axis, field = rule
            size = sizes.get(field, getattr(cfg, field))
            plan[name] = local_slice(size, axis, rank, n_ranks)
    return plan


def _module_plan(
    module: nn.Module,
    kind: str,
    cfg: HookedTransformerConfig,
    tp: TensorParallelGroup,
    sizes: dict[str, int] | None = None,
) -> dict[str, LocalSlice]:
    names = [f"{kind}.{name}" for name in present(module)]
    plan = shard_plan(names, cfg, tp.rank, tp.size, sizes)
    return {n.split(".", 1)[1]: s for n, s in plan.items()}


def shard_attention(attn: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup) -> None:
    """Make `attn` (an `Attention`, grouped or not) hold this rank's heads, in place."""
    heads, kv = tp.slice_of(cfg.n_heads, 0), tp.slice_of(cfg.n_kv_heads, 0)
    unknown = sorted(present(attn) - {w for kind, w in SHARDED if kind == "attn"} - {"b_O"})
    if unknown:
        raise ValueError(f"no tensor-parallel rule for the attention parameters {unknown}")
    narrow_parameters(attn, _module_plan(attn, "attn", cfg, tp))
    swap_class(attn, HeadParallelAttention)
    attn.tp, attn.kv_slice = tp, dataclasses.replace(kv, axis=2)
    local = cfg.replace(
        n_heads=heads.length,
        n_key_value_heads=None if cfg.n_key_value_heads is None else kv.length,
    )
    attn.fused_qkv = kernels.FusedQKV(local)
    attn._tie_fused_weights()
    q_axis2, kv_axis2 = dataclasses.replace(heads, axis=2), dataclasses.replace(kv, axis=2)
    for point in (
        "hook_q",
        "hook_rot_q",
        "hook_q_tuned",
        "hook_attn_gate",
        "hook_z",
        "hook_result",
    ):
        shard_hook_point(attn, point, q_axis2, tp)
    for point in ("hook_k", "hook_v", "hook_rot_k"):
        shard_hook_point(attn, point, kv_axis2, tp)
    for point in ("hook_attn_scores", "hook_pattern"):
        shard_hook_point(attn, point, dataclasses.replace(heads, axis=1), tp)
    for norm, part in ((attn.q_norm, q_axis2), (attn.k_norm, kv_axis2)):
        for point in ("hook_scale", "hook_normalized", "hook_out"):
            shard_hook_point(norm, point, part, tp)


def shard_attention_inputs(
    block: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup
) -> None:
    """Make `block`'s attention inputs (and their per-head copies) this rank's, in place."""
    block.attn_inputs = HeadParallelInputs(cfg, tp)
    heads = dataclasses.replace(tp.slice_of(cfg.n_heads, 0), axis=2)
    kv = dataclasses.replace(tp.slice_of(cfg.n_kv_heads, 0), axis=2)
    for point, part in (
        ("hook_attn_in", heads),
        ("hook_q_input", heads),
        ("hook_k_input", kv),
        ("hook_v_input", kv),
    ):
        shard_hook_point(block, point, part, tp)
    if cfg.use_split_qkv_input or cfg.use_attn_in:  # `ln1` normalises the per-head copies
        for point in ("hook_scale", "hook_normalized", "hook_out"):
            shard_hook_point(block.ln1, point, heads, tp, alternatives=(kv,))


def shard_mlp(
    mlp: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup, kind: str = "mlp"
) -> None:
    """Make `mlp` (plain or gated, or a mixture of experts) hold this rank's neurons, in
    place; `kind` "shared_expert" for a mixture's shared expert (`d_mlp_shared` wide)."""
    if isinstance(mlp, MoE):
        _shard_experts(mlp, cfg, tp)
        return
    if type(mlp) not in (MLP, GatedMLP):
        raise ValueError(
            f"no tensor-parallel rule for {type(mlp).__name__}: neurons split for MLP, "
            f"GatedMLP and MoE"
        )
    # Its own width: a dense block's in a mixture-of-experts model is `d_mlp_dense`.
    width = mlp.W_in.shape[-1]
    field = "d_mlp_shared" if kind == "shared_expert" else "d_mlp"
    narrow_parameters(mlp, _module_plan(mlp, kind, cfg, tp, {field: width}))
    swap_class(mlp, NeuronParallelMLP)
    mlp.tp = tp
    for point in ("hook_pre", "hook_pre_linear", "hook_post"):
        shard_hook_point(mlp, point, tp.slice_of(width, -1), tp)


def _shard_experts(moe: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup) -> None:
    """Make a mixture of experts hold this rank's neurons of each expert (and of its shared
    expert), in place: the router, its biases and `b_out` whole (`NeuronParallelMoE`)."""
    neurons = tp.slice_of(cfg.d_mlp, 0)
    axes = {"W_in": 2, "W_gate": 2, "b_in": 1, "b_gate": 1, "W_out": 1}
    held = present(moe)
    plan = {name: dataclasses.replace(neurons, axis=axis) for name, axis in axes.items()
            if name in held}  # fmt: skip
    narrow_parameters(moe, plan)
    swap_class(moe, NeuronParallelMoE)
    moe.tp = tp
    for expert in moe.experts:
        for point in ("hook_pre", "hook_pre_linear", "hook_post"):
            shard_hook_point(expert, point, dataclasses.replace(neurons, axis=-1), tp)
    if hasattr(moe, "shared_expert"):
        shard_mlp(moe.shared_expert, cfg, tp, "shared_expert")


def shard_embed(embed: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup) -> None:
    """Make the token embedding hold this rank's part of the vocabulary, in place."""
    part = tp.slice_of(cfg.d_vocab, 0)
    narrow_parameters(embed, _module_plan(embed, "embed", cfg, tp))
    swap_class(embed, VocabParallelEmbed)
    embed.tp, embed.vocab_slice = tp, part


def shard_unembed(
    unembed: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup
) -> None:
    """Make the unembedding hold this rank's part of the output vocabulary, in place."""
    part = tp.slice_of(cfg.d_vocab_out, 0)
    narrow_parameters(unembed, _module_plan(unembed, "unembed", cfg, tp))
    swap_class(unembed, VocabParallelUnembed)
    unembed.tp, unembed.vocab_slice = tp, dataclasses.replace(part, axis=-1)
