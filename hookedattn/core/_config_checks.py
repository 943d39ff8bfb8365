"""The checks that a `HookedTransformerConfig`'s variants fit together.

`HookedTransformerConfig.__post_init__` checks each field on its own against its spec
(`_field_specs`) and then calls `_check_variants`: the per-head inputs, the MLP, the norms,
the experts, the per-layer lists, latent and differential attention, rotary and ALiBi, in
turn, each a ValueError naming the clash and what would fit. A mixin, so that the config
keeps one class and these read its fields as `self.<field>`.
"""

from hookedattn.core._config_checks_attention import AttentionChecks
from hookedattn.core._config_checks_experts import ExpertChecks


class ConfigChecks(ExpertChecks, AttentionChecks):
    """`HookedTransformerConfig`'s checks of its variants together (module docstring); the
    experts' (`_config_checks_experts`) and the attention variants' (`_config_checks_attention`)
    in mixins of their own."""

    def _check_variants(self) -> None:
        """Check that the variants chosen fit together, in turn: the per-head inputs, the
        MLP, the norms, the experts and the per-layer lists; a ValueError names the clash."""
        if self.use_attn_in and self.use_split_qkv_input:
            raise ValueError(
                "use_attn_in and use_split_qkv_input are alternatives (one shared per-head "
                "input, or one per q/k/v); set at most one"
            )
        self._check_mlp_variants()
        self._check_norm_variants()
        if self.use_attn_in and self.n_key_value_heads not in (None, self.n_heads):
            raise ValueError(
                "use_attn_in gives every query head one input copy, which grouped keys and "
                "values cannot share; use use_split_qkv_input (one copy per key/value head)"
            )
        self._check_experts()
        self._check_layer_lists()
        self._check_llama4_variants()

    def _check_mlp_variants(self) -> None:
        """Check the MLP's variants: none asked of an attention-only model, a width for one
        with MLPs, and activations only in the MLP forms they have."""
        if self.attn_only:
            for flag in ("use_hook_mlp_in", "gated_mlp", "parallel_attn_mlp"):
                if getattr(self, flag):
                    raise ValueError(f"{flag}=True needs MLPs, but attn_only=True")
        elif self.d_mlp is None:
            raise ValueError(
                "d_mlp is required for a model with MLPs (attn_only=False); "
                "give d_mlp, e.g. 4 * d_model, or set attn_only=True"
            )
        if self.act_fn == "solu_ln" and self.has_mlp and (self.gated_mlp or self.is_moe):
            raise ValueError(
                "act_fn='solu_ln' normalises the neurons of a plain MLP; it has no gated "
                "(gated_mlp=True) or mixture-of-experts form: use another act_fn there"
            )
        if self.act_fn == "xielu" and self.has_mlp and self.is_moe:
            raise ValueError(
                "act_fn='xielu' keeps learned scalars in a dense MLP; it has no "
                "mixture-of-experts form: use another act_fn there"
            )

    def _check_sub_norms(self) -> None:
        """The sub-norms need norms, the attention's a plain one (not latent), the MLP's a
        gated dense MLP."""
        for field in ("attn_sub_norm", "mlp_sub_norm"):
            if getattr(self, field) and self.normalization_type is None:
                raise ValueError(f"{field}=True holds a norm, but normalization_type is None")
        if self.attn_sub_norm and self.kv_lora_rank is not None:
            raise ValueError("attn_sub_norm norms the heads' z of a plain attention: it needs "
                             f"kv_lora_rank=None (got {self.kv_lora_rank})")  # fmt: skip
        if self.mlp_sub_norm and (not self.gated_mlp or self.num_experts is not None):
            raise ValueError(
                "mlp_sub_norm norms a dense gated MLP's neurons: it needs gated_mlp=True and "
                f"num_experts=None (got {self.gated_mlp}, {self.num_experts})"
            )
        if self.mlp_gate_bias and (not self.gated_mlp or self.is_moe or self.mlp_sub_norm):
            raise ValueError(
                "mlp_gate_bias is the bias of a dense gated MLP's gate: it needs gated_mlp=True, "
                f"num_experts=None and mlp_sub_norm=False (got {self.gated_mlp}, "
                f"{self.num_experts}, {self.mlp_sub_norm})"
            )

    def _check_norm_variants(self) -> None:
        """Check the norms' variants: placements and embedding norms need norms, and each
        placement the block it norms."""
        if self.normalization_type is None and self.normalization_placement != "pre":
            raise ValueError(
                f"normalization_placement={self.normalization_placement!r} places norms, "
                f"but normalization_type is None (no norms)"
            )
        if self.embed_norm_before_positions and not (
            self.embed_norm and self.positional_embedding_type == "standard"
        ):
            raise ValueError(
                "embed_norm_before_positions=True norms the token embedding before learned "
                "positions are added: it needs embed_norm=True and "
                f"positional_embedding_type='standard', not {self.positional_embedding_type!r}"
            )
        self._check_embed_widths()
        flags = self.ln1_layers
        if flags is not None and (
            len(flags) != self.n_layers or not all(isinstance(f, bool) for f in flags)
        ):
            raise ValueError(
                f"ln1_layers must be {self.n_layers} booleans, one per block; got {flags}"
            )
        self._check_placement_layers()
        if self.normalization_type is None and (self.embed_norm or self.unembed_transform):
            raise ValueError(
                "embed_norm and unembed_transform each hold a norm, but normalization_type "
                "is None (no norms)"
            )
        self._check_sub_norms()
        self._check_normed_skip()
        if self.normalization_placement == "post_residual" and not self._is_sequential:
            raise ValueError(
                "normalization_placement='post_residual' norms the stream after each of a "
                "sequential block's two adds: it needs attn_only=False and "
                "parallel_attn_mlp=False"
            )

    def _check_normed_skip(self) -> None:
        """`normed_skip` (MiniMax's skips of the normed stream) on a sequential block of
        "pre" norms only; the skips' scales other than 1 only with it."""
        scales = (self.attn_skip_scale, self.mlp_skip_scale)
        if not self.normed_skip:
            if scales != (1.0, 1.0):
                raise ValueError(
                    f"attn_skip_scale={scales[0]}, mlp_skip_scale={scales[1]} scale the skips "
                    "of the normed stream: they need normed_skip=True (else 1.0)"
                )
            return
        if (
            not (self._is_sequential and self.placements == ("pre",))
            or self.normalization_type is None
        ):
            raise ValueError(
                "normed_skip carries each sublayer's normed input past it: it needs a "
                "sequential block (attn_only=False, parallel_attn_mlp=False) with norms, "
                f"placed 'pre' (got placements {self.placements})"
            )

    def _check_placement_layers(self) -> None:
        """`placement_layers`: one placement per block, each of a block that norms its
        sublayers' inputs or writes (a post-residual block norms the stream, and the model
        then has no final norm: not a per-block choice)."""
        placements = self.placement_layers
        if placements is None:
            return
        valid = ("pre", "post", "pre_and_post")
        if len(placements) != self.n_layers or any(p not in valid for p in placements):
            raise ValueError(
                f"placement_layers must be {self.n_layers} placements, one per block, each "
                f"one of {valid}; got {placements}"
            )
        if self.normalization_type is None or self.normalization_placement == "post_residual":
            raise ValueError(
                "placement_layers places each block's norms: it needs normalization_type "
                f"set (got {self.normalization_type!r}) and normalization_placement not "
                f"'post_residual' (got {self.normalization_placement!r})"
            )

    def _check_embed_widths(self) -> None:
        """Check the widths on either side of the stream: a narrower embedding needs its
        positions in the stream, a narrower unembedding the head transform that maps to it."""
        if self.d_embed is not None and self.positional_embedding_type == "shortformer":
            raise ValueError(
                f"d_embed={self.d_embed} projects the embeddings into the stream, but "
                "positional_embedding_type='shortformer' adds W_pos to the queries' and "
                "keys' d_model-wide inputs: use 'standard', 'rotary' or 'none'"
            )
        if self.d_unembed is not None and self.unembed_transform is None:
            raise ValueError(
                f"d_unembed={self.d_unembed} is the width of the head transform's output, "
                "but unembed_transform is None (no head transform): name its activation"
            )

    def _check_layer_lists(self) -> None:
        """Check the per-layer lists (the hybrid's mixers, the attention types): one entry
        per layer, and a window for local attention."""
        if self.mixers is not None and len(self.mixers.layers) != self.n_layers:
            raise ValueError(
                f"mixers.layers has {len(self.mixers.layers)} entries but n_layers="
                f"{self.n_layers}: give one sublayer kind per layer"
            )
        self._check_hybrid_layouts()
        if self.attn_types is not None:
            if self.window_size is None:
                raise ValueError("attn_types with 'local' layers needs window_size")
            if len(self.attn_types) != self.n_layers:
                raise ValueError(
                    f"attn_types has {len(self.attn_types)} entries but n_layers="
                    f"{self.n_layers}: give one 'global' or 'local' per layer"
                )

    def _check_llama4_variants(self) -> None:
        """The per-block q/k norms, the chunked window and the query temperature each need
        what they modify: q/k norms, a window, positions other than learned ones."""
        flags = self.qk_norm_layers
        if flags is not None and not self.use_qk_norm:
            raise ValueError("qk_norm_layers says which blocks norm queries and keys: it "
                             "needs use_qk_norm=True")  # fmt: skip
        if flags is not None and (
            len(flags) != self.n_layers or not all(isinstance(f, bool) for f in flags)
        ):
            raise ValueError(
                f"qk_norm_layers must be {self.n_layers} booleans, one per block; got {flags}"
            )
        if self.window_chunked and self.window_size is None:
            raise ValueError("window_chunked cuts the window into chunks: give window_size")
        temperature = self.query_temperature_floor
        if temperature is not None and self.positional_embedding_type not in ("rotary", "none"):
            raise ValueError(
                f"query_temperature_floor={temperature} scales the queries of blocks without "
                "rotary positions: it needs positional_embedding_type 'rotary' or 'none', "
                f"not {self.positional_embedding_type!r}"
            )

    def _check_layer_shapes(self) -> None:
        """The per-block attention shapes (`n_heads_layers`, `d_head_layers`,
        `n_key_value_heads_layers`, `attn_sinks_layers`): one entry per block, of a plain
        attention, each block's config valid (`attention_config`), named by its block."""
        if not self.has_layer_shapes:
            return
        for field, kind in (
            ("n_heads_layers", int),
            ("d_head_layers", int),
            ("n_key_value_heads_layers", int),
            ("attn_sinks_layers", bool),
        ):
            values = getattr(self, field)
            if values is not None and (
                len(values) != self.n_layers
                or not all(type(v) is kind and (kind is bool or v > 0) for v in values)
            ):
                raise ValueError(f"{field} must be {self.n_layers} {kind.__name__}s (positive), "
                                 f"one per block; got {values}")  # fmt: skip
        if self.attn_sinks_layers is not None and not self.use_attn_sinks:
            raise ValueError("attn_sinks_layers says which blocks have attention sinks: it "
                             "needs use_attn_sinks=True")  # fmt: skip
        refused = [f"{field}={getattr(self, field)!r}"
                   for field in ("kv_lora_rank", "differential_attention", "alibi_slopes")
                   if getattr(self, field)]  # fmt: skip
        if refused or self.positional_embedding_type == "alibi":
            raise ValueError(
                "attention shapes per block are built for plain (grouped) attention with one "
                "head count for every setting; they cannot go with "
                f"{', '.join(refused) or 'ALiBi'}"
            )
        for layer in range(self.n_layers):
            try:
                self.attention_config(layer)
            except ValueError as error:
                said = f"block {layer}'s attention (the *_layers lists): {error}"
                raise ValueError(said) from None

    def _check_hybrid_layouts(self) -> None:
        """The blocks a hybrid's layout asks for exist: blocks of one sublayer (Nemotron-H)
        and a mixer beside attention (Falcon-H1) need a sequential block; a mixer's input
        hook point (`use_hook_mixer_in`) needs a mixer in attention's place."""
        mixing = [self.layer_mixer(layer) for layer in range(self.n_layers)]
        if self.use_hook_mixer_in and all(kind in ("attention", "none") for kind in mixing):
            raise ValueError(
                "use_hook_mixer_in=True gives a mixer in attention's place an input hook "
                f"point (blocks.L.hook_mixer_in), but no block holds one (blocks: {mixing})"
            )
        if self.mixers is None:
            return
        if self.mixers.mlp_layers is not None and self.attn_only:
            raise ValueError(
                "mixers.mlp_layers says which blocks hold an MLP: it needs attn_only=False"
            )
        one_sublayer = "none" in self.mixers.layers or self.mixers.mlp_layers is not None
        if one_sublayer and not (
            self._is_sequential and self.normalization_placement != "post_residual"
        ):
            raise ValueError(
                "blocks of one sublayer (mixers.layers 'none', mixers.mlp_layers) need a "
                "sequential block with norms before or after each sublayer: attn_only=False, "
                "parallel_attn_mlp=False, normalization_placement not 'post_residual'"
            )
        if self.mixers.beside_attention is not None and not (
            self._is_sequential and self.normalization_placement == "pre"
        ):
            raise ValueError(
                "mixers.beside_attention (a mixer beside the attention, Falcon-H1's block) "
                "needs a sequential block with pre-norms: attn_only=False, "
                "parallel_attn_mlp=False, normalization_placement='pre' (got "
                f"{self.attn_only}, {self.parallel_attn_mlp}, {self.normalization_placement!r})"
            )

    def _check_rotary(self) -> None:
        if self.rotary_layers is not None:
            flags = self.rotary_layers
            if self.positional_embedding_type != "rotary":
                raise ValueError(
                    "rotary_layers is set, but positional_embedding_type is not "
                    f"'rotary' (it is {self.positional_embedding_type!r})"
                )
            if len(flags) != self.n_layers or not all(isinstance(f, bool) for f in flags):
                raise ValueError(
                    f"rotary_layers must be {self.n_layers} booleans, one per block; got {flags}"
                )
        if self.positional_embedding_type != "rotary":
            return
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.d_head:
            raise ValueError(
                f"rotary_dim must be even and in 2..d_head={self.d_head}, got {self.rotary_dim}"
            )
        if self.use_NTK_by_parts_rope and self.use_yarn_rope:
            raise ValueError("use_NTK_by_parts_rope and use_yarn_rope are alternatives")
        if self.rotary_pairs is not None and self.rotary_pairs > self.rotary_dim // 2:
            raise ValueError(
                f"rotary_pairs={self.rotary_pairs} exceeds the {self.rotary_dim // 2} pairs of "
                f"rotary_dim={self.rotary_dim}"
            )
        if self.use_NTK_by_parts_rope and not (
            self.NTK_by_parts_low_freq_factor < self.NTK_by_parts_high_freq_factor
        ):
            raise ValueError(
                f"NTK_by_parts_low_freq_factor={self.NTK_by_parts_low_freq_factor} must be "
                f"below NTK_by_parts_high_freq_factor={self.NTK_by_parts_high_freq_factor}"
            )

    def _check_local_rotary(self) -> None:
        """`rotary_dim_local`: the local blocks' own rotary (`rotary_base_local`) over that
        many of their heads' dimensions, even and within each local block's `d_head`."""
        width = self.rotary_dim_local
        if width is None:
            return
        if self.rotary_base_local is None or self.positional_embedding_type != "rotary":
            raise ValueError(
                f"rotary_dim_local={width} is the width of the local blocks' own rotary: it "
                "needs positional_embedding_type='rotary' and rotary_base_local"
            )
        for layer in range(self.n_layers):
            if self.layer_attn_type(layer) == "local":
                d_head = self.d_head if self.d_head_layers is None else self.d_head_layers[layer]
                if width % 2 or width > d_head:
                    raise ValueError(f"rotary_dim_local must be even and in 2..d_head={d_head} "
                                     f"(block {layer}), got {width}")  # fmt: skip

    def _check_resid_post_scale(self) -> None:
        """`resid_post_scale` and `d_per_layer_input` are built by the sequential block
        (attention, then an MLP, pre- or post-norms): not attention-only, parallel,
        post-residual or hybrid ones. `use_v_norm` by the attention with value heads of its
        own (not latent attention, whose values come from a shared latent)."""
        if self.use_v_norm and self.kv_lora_rank is not None:
            raise ValueError(
                f"use_v_norm norms each value head of a plain attention; latent attention "
                f"(kv_lora_rank={self.kv_lora_rank}) has none to norm"
            )
        plain = self._is_sequential and self.normalization_placement != "post_residual"
        for field in ("resid_post_scale", "d_per_layer_input"):
            if getattr(self, field) and not (plain and self.mixers is None):
                raise ValueError(
                    f"{field} is built by the sequential block: it needs attn_only=False, "
                    "parallel_attn_mlp=False, normalization_placement other than "
                    "'post_residual' and no mixers"
                )

    def _check_kv_sharing(self) -> None:
        """`n_kv_shared_layers`: fewer than every block, each shared block with an earlier
        block of its attention type to read, shaped as it (`kv_source_layer`), in a model
        of plain attention (no mixers, latent or differential attention, per-head key and
        value inputs); `d_mlp_kv_shared` only with shared blocks and dense MLPs."""
        n = self.n_kv_shared_layers
        if self.d_mlp_kv_shared is not None and (not n or self.is_moe or self.attn_only):
            raise ValueError(f"d_mlp_kv_shared={self.d_mlp_kv_shared} is the dense MLP width "
                             "of the blocks sharing keys and values: it needs "
                             "n_kv_shared_layers > 0 and dense MLPs")  # fmt: skip
        if not n:
            return
        if n >= self.n_layers:
            raise ValueError(
                f"n_kv_shared_layers={n} must be below n_layers={self.n_layers}: "
                "a shared block reads the keys and values of an earlier one"
            )
        refused = [f"{field}={getattr(self, field)!r}"
                   for field in ("mixers", "kv_lora_rank", "differential_attention",
                                 "use_split_qkv_input") if getattr(self, field)]  # fmt: skip
        if refused:
            raise ValueError(
                f"n_kv_shared_layers shares the keys and values of plain "
                f"attention; it cannot go with {', '.join(refused)}"
            )
        for layer in range(self.n_layers - n, self.n_layers):
            source = self.kv_source_layer(layer)
            if source is None:
                raise ValueError(
                    f"n_kv_shared_layers={n}: block {layer} ({self.layer_attn_type(layer)}) "
                    f"has no earlier {self.layer_attn_type(layer)} block to read keys from"
                )
            own, theirs = self.attention_config(layer), self.attention_config(source)
            shape = lambda c: (c.d_head, c.n_kv_heads, c.d_value)
            if shape(own) != shape(theirs):
                raise ValueError(
                    f"block {layer} reads block {source}'s keys and values: their (d_head, "
                    f"n_kv_heads, d_value) must agree, got {shape(own)} and {shape(theirs)}"
                )

    def _check_alibi(self) -> None:
        slopes = self.alibi_slopes
        if self.positional_embedding_type != "alibi":
            if slopes is not None:
                raise ValueError(
                    "alibi_slopes is set, but positional_embedding_type is not 'alibi' (it "
                    f"is {self.positional_embedding_type!r})"
                )
            return
        if slopes is not None and (
            len(slopes) != self.n_heads
            or not all(isinstance(s, int | float) and not isinstance(s, bool) for s in slopes)
        ):
            raise ValueError(
                f"alibi_slopes must be {self.n_heads} numbers, one per head; got {slopes}"
            )
        if self.attn_scores_soft_cap is not None:
            raise ValueError(
                "positional_embedding_type='alibi' with attn_scores_soft_cap: no model caps "
                "biased scores, and where the bias goes relative to the cap is not defined"
            )
