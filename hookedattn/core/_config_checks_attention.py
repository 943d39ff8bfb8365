"""The checks that a `HookedTransformerConfig`'s attention variants fit together:
differential attention, routed output gates, latent attention and the lightning indexer.
A mixin of `_config_checks.ConfigChecks`, reading the config's fields as `self.<field>`.
"""


class AttentionChecks:
    """The checks of the attention variants (module docstring)."""

    def _check_differential_attention(self) -> None:
        """Differential attention pairs the query heads and splits the key/value heads in
        two halves (`components.differential_attention`); it has no sinks, gate, sub-norm,
        latent or value width of its own."""
        if not self.differential_attention:
            return
        if self.n_heads % 2 or self.n_kv_heads % 2:
            raise ValueError(
                f"differential_attention pairs the query heads and halves the key/value "
                f"heads: it needs both even (got n_heads={self.n_heads}, "
                f"n_key_value_heads={self.n_kv_heads})"
            )
        refused = [f"{field}={getattr(self, field)!r}"
                   for field in ("use_attn_sinks", "attn_gate", "attn_sub_norm", "kv_lora_rank",
                                 "d_head_v") if getattr(self, field)]  # fmt: skip
        if refused:
            raise ValueError(f"differential_attention cannot go with {', '.join(refused)}")

    def _check_routed_gate(self) -> None:
        """A routed gate (`attn_gate="routed"`) picks `attn_gate_top_k` of the query heads
        sharing each key/value head, one factor per head."""
        routed = self.attn_gate == "routed"
        if not routed and self.attn_gate_top_k is None:
            return
        if not routed:
            raise ValueError(
                f"attn_gate_top_k={self.attn_gate_top_k} is how many heads a routed gate keeps: "
                f'it needs attn_gate="routed" (got attn_gate={self.attn_gate!r})'
            )
        group = self.n_heads // self.n_kv_heads
        top_k = self.attn_gate_top_k
        if not self.attn_gate_per_head or top_k is None or not 1 <= top_k <= group:
            raise ValueError(
                f'attn_gate="routed" keeps attn_gate_top_k of the {group} query heads sharing '
                f"each key/value head, one factor per head: it needs attn_gate_per_head=True "
                f"and 1 <= attn_gate_top_k <= {group} (got attn_gate_per_head="
                f"{self.attn_gate_per_head}, attn_gate_top_k={top_k})"
            )
        if self.is_latent_attention:
            raise ValueError('attn_gate="routed" routes grouped query heads, not latent ones')

    def _check_latent_attention(self) -> None:
        if self.kv_lora_rank is None:
            if self.q_lora_rank is not None:
                raise ValueError("q_lora_rank is a latent attention setting: give kv_lora_rank")
            return
        refused = [
            f"{field}={getattr(self, field)!r}"
            for field, plain in (
                ("positional_embedding_type", "rotary"), ("n_key_value_heads", None),
                ("use_split_qkv_input", False), ("use_attn_in", False),
                ("use_qk_norm", False), ("use_attn_sinks", False),
            )
            if getattr(self, field) != plain
        ]  # fmt: skip
        if refused:
            raise ValueError(
                f"latent attention (kv_lora_rank={self.kv_lora_rank}) is built with rotary "
                f"positions, one key/value head per query head and one shared input; these "
                f"settings cannot go with it: {', '.join(refused)}"
            )
        if self.rotary_dim >= self.d_head:
            raise ValueError(
                f"rotary_dim={self.rotary_dim} must be below d_head={self.d_head}: in latent "
                f"attention the rotated part ends each query/key head, after its unrotated part"
            )

    def _check_indexer(self) -> None:
        """A lightning indexer (`index_topk`) selects keys for latent attention, its heads
        at least `rotary_dim` wide (their first `rotary_dim` dimensions rotate), and
        `indexer_layers` is one flag per block."""
        if self.index_topk is None:
            if self.indexer_layers is not None:
                raise ValueError("indexer_layers says which blocks select keys: give index_topk")
            return
        if self.kv_lora_rank is None:
            raise ValueError(
                f"index_topk={self.index_topk} selects keys for latent attention: give "
                f"kv_lora_rank (a lightning indexer beside other attention is not built)"
            )
        if self.index_head_dim is None or self.index_head_dim < self.rotary_dim:
            raise ValueError(
                f"index_head_dim={self.index_head_dim} must be at least rotary_dim="
                f"{self.rotary_dim}: the indexer rotates its heads' first rotary_dim dimensions"
            )
        flags = self.indexer_layers
        if flags is not None and (
            len(flags) != self.n_layers or not all(isinstance(f, bool) for f in flags)
        ):
            raise ValueError(
                f"indexer_layers must be {self.n_layers} booleans, one per block; got {flags}"
            )
