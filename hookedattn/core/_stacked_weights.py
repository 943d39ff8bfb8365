"""The model's weights as circuits notation reads them: stacked across layers
(`model.W_Q: [layer head d_model d_head]`), the embeddings, and the circuit views.

A mixin of `HookedTransformer`: properties over its modules' parameters (never copies
that could go stale, except the stacks, which are built on each read).
"""

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from hookedattn.core import _weight_views
from hookedattn.core.factored_matrix import FactoredMatrix


def stacked_layers(tensors: list[Tensor], what: str, per_block: str) -> Tensor:
    """`tensors`, one per block, stacked into `[layer ...]`; a ValueError naming each
    block's shape where they differ (attention shapes per block: `n_heads_layers`, ...),
    pointing to `per_block` (`{layer}` in it), where each block's own can be read."""
    shapes = [tuple(t.shape) for t in tensors]
    if len(set(shapes)) > 1:
        said = ", ".join(f"block {layer}: {list(shape)}" for layer, shape in enumerate(shapes))
        raise ValueError(
            f"{what} stacks every block's, but this model's blocks differ in shape ({said}: "
            f"attention shapes per block, the config's *_layers lists); read each block's "
            f"as {per_block.format(layer='L')}"
        )
    return torch.stack(tensors)


def _across_layers(module: str, names: str) -> tuple[property, ...]:
    """A property per weight in `names` of every block's `module`, stacked over layers."""
    return tuple(
        property(
            lambda self, name=name: self._stacked(module, name),
            doc=f"Every block's `{module}.{name}`, stacked: `[layer ...]` (built on each read).",
        )
        for name in names.split()
    )


_ATTN_WEIGHTS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
_MLP_WEIGHTS = ("W_in", "b_in", "W_out", "b_out")


class StackedWeights:
    """`W_E`, `W_pos`, `W_U`, `b_U`, the per-layer weights stacked over layers, `QK`, `OV`,
    `W_E_pos`, `all_head_labels` and `tokens_to_residual_directions`.

    Stacked over layers: `W_Q`, `W_K`, `W_V` are `[layer head d_model d_head]`, `W_O`
    `[layer head d_head d_model]`, `b_Q`, `b_K`, `b_V` `[layer head d_head]`, `b_O`
    `[layer d_model]`; the MLP's `W_in` `[layer d_model d_mlp]`, `b_in` `[layer d_mlp]`,
    `W_out` `[layer d_mlp d_model]`, `b_out` `[layer d_model]`.
    """

    def _stacked(self, module: str, weight: str) -> Tensor:
        if self.cfg.n_layers == 0:
            raise ValueError(f"a model with 0 layers has no {weight}")
        if module == "mlp" and self.cfg.attn_only:
            raise ValueError(f"an attention-only model has no {weight}")
        if module == "attn":
            self.cfg.require_attention(f"the stacked {weight}")
        without = [i for i in range(self.cfg.n_layers) if not self.cfg.layer_has_mlp(i)]
        if module == "mlp" and without:
            raise ValueError(
                f"the stacked {weight} needs an MLP in every block, but in this hybrid model "
                f"blocks {without} hold none (one sublayer per block); read "
                f"blocks.L.mlp.{weight} of the blocks that have one"
            )
        first = getattr(self.blocks[0], module)
        if not hasattr(first, weight):  # latent attention has no b_Q, b_K, b_V
            raise ValueError(
                f"this model's {module} ({type(first).__name__}) has no {weight}; its "
                f"parameters are {[name for name, _ in first.named_parameters(recurse=False)]}"
            )
        return stacked_layers(
            [getattr(getattr(b, module), weight) for b in self.blocks],
            f"model.{weight}",
            f"model.blocks[{{layer}}].{module}.{weight}",
        )

    def stacked(self, weight: str, layers: Sequence[int] | None = None) -> Tensor:
        """`model.{weight}` (`W_Q` ... `b_O`, `W_in` ... `b_out`): every block's, or only
        the blocks `layers`' (in a hybrid model, those whose sublayer has heads, or an
        MLP), stacked `[layer ...]`; on a tensor-parallel model gathered (a collective)."""
        module = "mlp" if weight in _MLP_WEIGHTS else "attn"
        if weight not in _MLP_WEIGHTS + _ATTN_WEIGHTS:
            raise ValueError(
                f"no stacked weight {weight!r}; they are {_ATTN_WEIGHTS + _MLP_WEIGHTS}"
            )
        if layers is None:
            return getattr(self, weight)
        layers = list(layers)
        if module == "attn":
            self.cfg.require_attention(f"the {weight} of blocks {layers}", layers)
        return stacked_layers(
            [self.layer_weight(layer, module, weight) for layer in layers],
            f"the {weight} of blocks {layers}",
            f"model.blocks[{{layer}}].{module}.{weight}",
        )

    def head_circuits(self, kind: str, layers: Sequence[int] | None = None) -> FactoredMatrix:
        """`model.QK` or `model.OV` (`kind`): every block's heads, or only those of the
        blocks `layers` (in a hybrid model, the blocks with heads), `[layer head d_model
        d_model]`, factored."""
        circuits = {"QK": _weight_views.QK, "OV": _weight_views.OV}
        if kind not in circuits:
            raise ValueError(f"kind must be one of {list(circuits)}, got {kind!r}")
        return circuits[kind](self, layers)

    def layer_weight(self, layer: int, module: str, weight: str) -> Tensor:
        """Block `layer`'s `module` (`"attn"`, `"mlp"`) parameter `weight`, whole: on a
        tensor-parallel model, gathered from every rank (a collective), here the block's
        own tensor."""
        return getattr(getattr(self.blocks[layer], module), weight)

    def key_value_weights(self, layer: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Block `layer`'s attention `W_K, b_K, W_V, b_V` as stored, one per key/value head,
        whole (on a tensor-parallel model, gathered from every rank: a collective)."""
        return self.blocks[layer].attn.key_value_weights()

    W_E = property(lambda self: self.embed.W_E, doc="Token embedding `[d_vocab d_model]`.")
    W_U = property(lambda self: self.unembed.W_U, doc="Unembedding `[d_model d_vocab_out]`.")
    b_U = property(lambda self: self.unembed.b_U, doc="Unembedding bias `[d_vocab_out]`.")
    W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O = _across_layers("attn", " ".join(_ATTN_WEIGHTS))
    W_in, b_in, W_out, b_out = _across_layers("mlp", " ".join(_MLP_WEIGHTS))

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        """Learned positional embedding `[n_ctx d_model]`: added to the residual stream
        ("standard"), or to every layer's query and key inputs only ("shortformer")."""
        if not self.cfg.has_learned_positions:
            raise ValueError(
                f"a model with positional_embedding_type="
                f"{self.cfg.positional_embedding_type!r} has no W_pos"
            )
        return self.pos_embed.W_pos

    # Circuit views (hookedattn/core/_weight_views.py): OV = W_V @ W_O, QK = W_Q @ W_K.T.
    @property
    def QK(self) -> FactoredMatrix:
        """Every head's QK circuit `W_Q @ W_K.T`, factored: `[layer head d_model d_model]`."""
        return _weight_views.QK(self)

    @property
    def OV(self) -> FactoredMatrix:
        """Every head's OV circuit `W_V @ W_O`, factored: `[layer head d_model d_model]`."""
        return _weight_views.OV(self)

    @property
    def W_E_pos(self) -> Float[Tensor, "d_vocab_and_n_ctx d_model"]:
        """`W_E` and `W_pos` stacked: `[d_vocab + n_ctx, d_model]`."""
        return _weight_views.W_E_pos(self)

    @property
    def all_head_labels(self) -> list[str]:
        """`"L{layer}H{head}"` for every head, in `[layer head]` order."""
        return _weight_views.all_head_labels(self)

    def tokens_to_residual_directions(
        self, tokens: _weight_views.Tokens
    ) -> Float[Tensor, "*tokens d_model"]:
        """The unembedding direction `W_U[:, t]` of each token, `[*tokens d_model]`."""
        return _weight_views.tokens_to_residual_directions(self, tokens)
