"""A mixture of experts at expert granularity: which tokens each expert saw, what each wrote.

A cache keeps each expert's activations as rows, one per token routed to it, in `(batch,
pos, slot)` order: the order of `(hook_expert_indices == e).nonzero()`. `expert_rows` puts
the positions back beside them. What an expert writes into the stream at a position is its
output there times the router's weight, and nothing where the token did not choose it:

    mlp_out[b, p] = sum_e write_e[b, p] (+ the shared expert's),
    write_e[b, p] = g[b, p, slot] * out_e(row of (b, p))   if (b, p) chose e at `slot`

`expert_writes` materialises every `write_e`, `[expert batch pos d_model]` (dense, for
analysis: the decomposition's terms); summed over experts with the shared expert's output
they are the MLP's output exactly. Behind a norm after the MLP (`ln2_post`) each is passed
through it at the divisor the forward recorded (`analysis.normalization.through_norm`).

`expert_usage` counts routing over a whole activation store: each expert's load and how
often two experts serve the same token.
"""

import dataclasses

import torch
from jaxtyping import Float, Int
from torch import Tensor

from analysis._naming import expert_label
from analysis._reading import activation
from analysis.tables import Table
from hookedattn.core import kernels
from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer
from hookedattn.store import ActivationStore


def _moe(model: HookedTransformer, layer: int) -> torch.nn.Module:
    n_layers = model.cfg.n_layers
    if not model.cfg.is_moe:
        raise ValueError(
            "this model's MLPs are dense (num_experts is None): it has no experts to analyse"
        )
    if not isinstance(layer, int) or isinstance(layer, bool) or not -n_layers <= layer < n_layers:
        raise ValueError(f"layer must be an int in 0..{n_layers - 1} (or negative), got {layer!r}")
    if not model.cfg.layer_is_moe(layer % n_layers):
        raise ValueError(
            f"block {layer % n_layers}'s MLP is dense (the first n_dense_layers="
            f"{model.cfg.n_dense_layers} blocks are): its experts start at block "
            f"{model.cfg.n_dense_layers}"
        )
    return model.blocks[layer % n_layers].mlp


@dataclasses.dataclass(frozen=True)
class ExpertRows:
    """The tokens one expert saw: for row r, its prompt `batch[r]`, position `pos[r]`,
    the slot of the token's choices it filled `slot[r]`, the router's weight `weight[r]`;
    `inputs` and `outputs` (`hook_in`, `hook_out`: the expert's output before the weight)
    where the cache has them, else None."""

    layer: int
    expert: int
    batch: Int[Tensor, " row"]
    pos: Int[Tensor, " row"]
    slot: Int[Tensor, " row"]
    weight: Float[Tensor, " row"]
    inputs: Float[Tensor, "row d_model"] | None
    outputs: Float[Tensor, "row d_model"] | None

    def __len__(self) -> int:
        return len(self.batch)


def expert_rows(
    model: HookedTransformer, cache: ActivationCache, layer: int, expert: int
) -> ExpertRows:
    """Which tokens `expert` of block `layer` was routed, in the order of its cached rows.

    Needs `hook_expert_indices` and `hook_expert_weights` of the block in the cache; reads
    the expert's `hook_in` and `hook_out` rows where they are there, and checks that their
    number is the number of tokens routed to it (a `ValueError` otherwise: rows and routing
    from different runs).
    """
    moe = _moe(model, layer)
    if not isinstance(expert, int) or not 0 <= expert < moe.num_experts:
        raise ValueError(f"expert must be in 0..{moe.num_experts - 1}, got {expert!r}")
    layer %= model.cfg.n_layers
    mlp = f"blocks.{layer}.mlp"
    indices = activation(cache, f"{mlp}.hook_expert_indices")
    weights = activation(cache, f"{mlp}.hook_expert_weights")
    batch, pos, slot = (indices == expert).nonzero(as_tuple=True)
    found = {}
    for part in ("in", "out"):
        name = f"{mlp}.experts.{expert}.hook_{part}"
        found[part] = cache.get(name)
        if found[part] is not None and found[part].shape[0] != len(batch):
            raise ValueError(
                f"{name} holds {found[part].shape[0]} rows but {len(batch)} tokens were routed "
                f"to expert {expert} by the cached hook_expert_indices: not one forward's"
            )
    return ExpertRows(
        layer, expert, batch, pos, slot, weights[batch, pos, slot], found["in"], found["out"]
    )


def expert_writes(
    model: HookedTransformer, cache: ActivationCache, layer: int
) -> Float[Tensor, "expert batch pos d_model"]:
    """What each expert of block `layer` writes at every position (zero where it was not
    chosen): `weight * hook_out` at its tokens (`hook_out` itself where the weight scaled
    the expert's input, `expert_input_weighted`: Llama 4). With the shared expert's output
    (`hook_shared_out`) they sum to the MoE's output exactly (beside a dense MLP, Gemma
    4's `moe_beside_mlp`: the mixture's output before its norm `ln2_moe_post`, not
    `hook_mlp_out`). Needs the routing and every expert's `hook_out` in the cache."""
    moe = _moe(model, layer)
    indices = activation(cache, f"blocks.{layer % model.cfg.n_layers}.mlp.hook_expert_indices")
    weights = activation(cache, f"blocks.{layer % model.cfg.n_layers}.mlp.hook_expert_weights")
    out = weights.new_zeros(moe.num_experts, *indices.shape[:2], model.cfg.d_model)
    on_input = model.cfg.expert_input_weighted
    for e in range(moe.num_experts):
        rows = expert_rows(model, cache, layer, e)
        if rows.outputs is None:
            raise KeyError(
                f"expert_writes needs every expert's hook_out: blocks.{layer}.mlp.experts.{e}."
                f"hook_out is not in the cache (was a names_filter used?)"
            )
        weight = torch.ones_like(rows.weight) if on_input else rows.weight
        out[e, rows.batch, rows.pos] = weight[:, None] * rows.outputs.to(out.dtype)
    return out


# ---------------------------------------------------------------- usage over a store
@dataclasses.dataclass(frozen=True)
class ExpertUsage:
    """Routing counted over tokens: `counts[e]` tokens chose expert e, `pairs[e, f]` chose
    both e and f (`pairs[e, e] == counts[e]`), of `n_tokens` tokens choosing
    `experts_per_token` each."""

    layer: int
    counts: Int[Tensor, " expert"]
    pairs: Int[Tensor, "expert expert"]
    n_tokens: int
    experts_per_token: int

    def load(self) -> Float[Tensor, " expert"]:
        """Each expert's share of all choices (sums to one; uniform is `1 / num_experts`)."""
        return self.counts.double() / (self.n_tokens * self.experts_per_token)

    def coactivation(self) -> Float[Tensor, "expert expert"]:
        """The fraction of tokens that chose both experts (the diagonal: chose that one)."""
        return self.pairs.double() / self.n_tokens

    def to_table(self) -> Table:
        """Each expert's tokens and load, most loaded first."""
        load = self.load()
        order = load.argsort(descending=True).tolist()
        rows = tuple(
            (expert_label(self.layer, e), int(self.counts[e]), float(load[e])) for e in order
        )
        title = f"expert load in block {self.layer} over {self.n_tokens:,} tokens"
        return Table(("expert", "tokens", "load"), rows, title)


def usage_of_choices(indices: Int[Tensor, "token k"], num_experts: int, layer: int) -> ExpertUsage:
    """`ExpertUsage` of one set of choices (a row per token)."""
    chosen = torch.zeros(indices.shape[0], num_experts, dtype=torch.long)
    chosen.scatter_(1, indices.long().cpu(), 1)
    pairs = chosen.T @ chosen
    return ExpertUsage(layer, pairs.diagonal().clone(), pairs, indices.shape[0], indices.shape[1])


def expert_usage(
    model: HookedTransformer, store: ActivationStore, layer: int, batch_size: int = 65536
) -> ExpertUsage:
    """Expert load and co-activation of block `layer` over every token of `store`.

    Reads the store's `blocks.{layer}.mlp.hook_router_logits` (a store holds float rows;
    the logits are what routing is computed from) and chooses as the model's router does
    (softmax over the experts, the `experts_per_token` largest), batch by batch: memory is
    one batch. The store must have been written by `model`.
    """
    moe = _moe(model, layer)
    layer %= model.cfg.n_layers
    store.check_model(model)
    name = f"blocks.{layer}.mlp.hook_router_logits"
    if name not in store.names:
        raise KeyError(
            f"expert_usage reads {name}; the store holds {store.names}: collect it "
            f"(collect_activations(model, ..., names=[{name!r}]))"
        )
    pairs = torch.zeros(moe.num_experts, moe.num_experts, dtype=torch.long)
    n_tokens = 0
    for logits in store.batches(name, batch_size):
        probs = kernels.router_probabilities(logits)
        indices = probs.topk(moe.experts_per_token, dim=-1).indices
        pairs += usage_of_choices(indices, moe.num_experts, layer).pairs
        n_tokens += indices.shape[0]
    return ExpertUsage(layer, pairs.diagonal().clone(), pairs, n_tokens, moe.experts_per_token)


def shared_write(
    model: HookedTransformer, cache: ActivationCache, layer: int
) -> Float[Tensor, "batch pos d_model"] | None:
    """The shared expert's output of block `layer` (`hook_shared_out`), None without one."""
    moe = _moe(model, layer)
    if not hasattr(moe, "hook_shared_out"):
        return None
    return activation(cache, f"blocks.{layer % model.cfg.n_layers}.mlp.hook_shared_out")
