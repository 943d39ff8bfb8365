"""What each block of a model holds, as its config says: the one place that answers each
per-layer question (a mixture of experts or an MLP, which mixer, which norms and where,
rotation, q/k norms, an indexer, the attention window, the heads' shapes, whose keys and
values a block reads).

`LayerQueries` is a base of `HookedTransformerConfig`; it reads only the config's fields,
so every component and importer asks here rather than reading a per-layer list itself.
"""

from typing import Any


class LayerQueries:
    """The per-block questions of a `HookedTransformerConfig` (a base class: it holds no
    fields of its own, and reads the config's)."""

    def layer_is_moe(self, layer: int) -> bool:
        """Whether block `layer`'s MLP is a mixture of experts: its flag in `moe_layers`, or
        past the `n_dense_layers` dense first ones; the one place that decides."""
        if not self.is_moe:
            return False
        if self.moe_layers is not None:
            return self.moe_layers[layer]
        return layer >= self.n_dense_layers

    def layer_has_mlp(self, layer: int) -> bool:
        """Whether block `layer` holds an MLP (`has_mlp`, and a hybrid's `mlp_layers`)."""
        return self.has_mlp and (self.mixers is None or self.mixers.holds_mlp(layer))

    def layer_mixer(self, layer: int) -> str:
        """The sublayer that mixes positions in block `layer`: "attention", or another
        kind of `mixer_config.MIXER_KINDS` in a hybrid model (`mixers`)."""
        return "attention" if self.mixers is None else self.mixers.layers[layer]

    @property
    def attention_layers(self) -> list[int]:
        """The blocks whose sublayer is attention (every block, but in a hybrid model)."""
        return [layer for layer in range(self.n_layers) if self.layer_mixer(layer) == "attention"]

    def require_attention(self, what: str, layers: Any = None) -> None:
        """A ValueError naming the blocks (of `layers`; None: all) whose sublayer is not
        attention, for `what`, which needs heads there."""
        layers = range(self.n_layers) if layers is None else layers
        others = {layer: self.layer_mixer(layer) for layer in layers}
        others = {layer: kind for layer, kind in others.items() if kind != "attention"}
        if others:
            raise ValueError(
                f"{what} needs attention heads, but in this hybrid model blocks "
                f"{sorted(others)} hold {sorted(set(others.values()))} in attention's place "
                f"(a mixer's write is blocks.L.hook_attn_out, its internals blocks.L.mixer.*; "
                f"'none': the block mixes no positions, an MLP alone)"
            )

    def layer_norms_attn_input(self, layer: int) -> bool:
        """Whether block `layer` has its pre-norm `ln1` (`ln1_layers`) where the placement
        puts one."""
        return self.ln1_layers is None or self.ln1_layers[layer]

    def layer_placement(self, layer: int) -> str:
        """Where block `layer`'s norms sit: its `placement_layers` entry, else
        `normalization_placement`."""
        if self.placement_layers is None:
            return self.normalization_placement
        return self.placement_layers[layer]

    @property
    def placements(self) -> tuple[str, ...]:
        """The blocks' norm placements, each once, in block order (`layer_placement`)."""
        if self.placement_layers is None:
            return (self.normalization_placement,)
        return tuple(dict.fromkeys(self.placement_layers))

    def layer_rotates(self, layer: int) -> bool:
        """Whether block `layer` rotates its queries and keys (`rotary_layers`)."""
        if self.positional_embedding_type != "rotary":
            return False
        return self.rotary_layers is None or self.rotary_layers[layer]

    def layer_norms_qk(self, layer: int) -> bool:
        """Whether block `layer` norms its queries and keys (`use_qk_norm`,
        `qk_norm_layers`)."""
        if not self.use_qk_norm:
            return False
        return self.qk_norm_layers is None or self.qk_norm_layers[layer]

    def layer_indexes(self, layer: int) -> bool:
        """Whether block `layer` selects its keys by a lightning indexer (`index_topk`,
        `indexer_layers`)."""
        if self.index_topk is None:
            return False
        return self.indexer_layers is None or self.indexer_layers[layer]

    def kv_source_layer(self, layer: int) -> int | None:
        """The block whose keys and values block `layer` reads (`n_kv_shared_layers`: the
        last block of its attention type before the shared ones), or None where it computes
        its own; the one place that decides."""
        first = self.n_layers - self.n_kv_shared_layers
        if layer < first:
            return None
        kind = self.layer_attn_type(layer)
        earlier = [i for i in range(first) if self.layer_attn_type(i) == kind]
        return earlier[-1] if earlier else None

    def layer_stores_kv(self, layer: int) -> bool:
        """Whether a later block reads block `layer`'s keys and values (`kv_source_layer`)."""
        first = self.n_layers - self.n_kv_shared_layers
        return any(self.kv_source_layer(i) == layer for i in range(first, self.n_layers))

    def layer_tunes_queries(self, layer: int) -> bool:
        """Whether block `layer` scales its queries by position (`query_temperature_floor`:
        the blocks that do not rotate)."""
        return self.query_temperature_floor is not None and not self.layer_rotates(layer)

    @property
    def has_layer_shapes(self) -> bool:
        """Whether some block's attention is shaped otherwise than the config's `n_heads`,
        `d_head`, `n_key_value_heads`, `use_attn_sinks` say (the `*_layers` lists)."""
        lists = (self.n_heads_layers, self.d_head_layers, self.n_key_value_heads_layers,
                 self.attn_sinks_layers)  # fmt: skip
        return any(values is not None for values in lists)

    def attention_config(self, layer: int) -> "LayerQueries":
        """The config block `layer`'s attention is built from: this one, with the block's
        entries of `n_heads_layers`, `d_head_layers`, `n_key_value_heads_layers` and
        `attn_sinks_layers` as its own `n_heads`, `d_head`, `n_key_value_heads` and
        `use_attn_sinks`, and in a local block `rotary_dim_local` as its `rotary_dim`; the
        one place that decides a block's attention shape. Itself where nothing differs."""
        local_rotary = self.rotary_dim_local is not None and self.layer_attn_type(layer) == "local"
        if not self.has_layer_shapes and not local_rotary:
            return self
        pick = lambda values, default: default if values is None else values[layer]
        return self.replace(
            n_heads=pick(self.n_heads_layers, self.n_heads),
            d_head=pick(self.d_head_layers, self.d_head),
            n_key_value_heads=pick(self.n_key_value_heads_layers, self.n_kv_heads),
            use_attn_sinks=self.use_attn_sinks and pick(self.attn_sinks_layers, True),
            rotary_dim=self.rotary_dim_local if local_rotary else self.rotary_dim,
            rotary_dim_local=None,
            n_heads_layers=None,
            d_head_layers=None,
            n_key_value_heads_layers=None,
            attn_sinks_layers=None,
        )

    def require_one_attention_shape(
        self, what: str, key_value: bool = False, layers: Any = None
    ) -> None:
        """A ValueError naming each block's heads, for `what`, which reads the query heads
        (and, `key_value`, key/value heads) of `layers` (None: every block) as one
        `[layer head ...]` shape, where they differ (`attention_config`: `n_heads_layers`,
        ...)."""
        if not self.has_layer_shapes:
            return
        layers = range(self.n_layers) if layers is None else layers
        configs = {layer: self.attention_config(layer) for layer in layers}
        shapes = {
            layer: (c.n_heads, c.d_head) + ((c.n_kv_heads,) if key_value else ())
            for layer, c in configs.items()
        }
        if len(set(shapes.values())) > 1:
            names = "n_heads, d_head" + (", n_key_value_heads" if key_value else "")
            said = ", ".join(f"block {layer}: {shape}" for layer, shape in shapes.items())
            raise ValueError(
                f"{what} reads every block's heads as one [layer head ...] shape, but this "
                f"model's blocks differ ({names}: {said}); read each block's own "
                f"(model.blocks[L].attn, the cache's per-block hook points)"
            )

    def layer_attn_type(self, layer: int) -> str:
        """ "local" (windowed) or "global" attention in block `layer`."""
        if self.window_size is None:
            return "global"
        return "local" if self.attn_types is None else self.attn_types[layer]
