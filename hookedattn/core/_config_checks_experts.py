"""The checks that a `HookedTransformerConfig`'s mixture of experts fits together: the
experts' sizes and routers, the blocks that hold them, Gemma 4's mixture beside a dense MLP.
A mixin of `_config_checks.ConfigChecks`, reading the config's fields as `self.<field>`.
"""


class ExpertChecks:
    """The checks of a mixture of experts (module docstring)."""

    def _check_experts(self) -> None:
        moe_fields = ("norm_topk_prob", "norm_topk_eps", "d_mlp_shared", "shared_expert_gate",
                      "swiglu_limit", "n_dense_layers", "moe_layers", "d_mlp_dense", "moe_out_norm",
                      "expert_input_weighted", "router_expert_scale", "moe_beside_mlp")  # fmt: skip
        routing = dict(router_scoring="softmax", n_expert_groups=1, topk_expert_groups=1,
                       group_score_experts=2, routed_scaling_factor=1.0,
                       sparsemixer_jitter_eps=0.01)  # fmt: skip
        if self.num_experts is None:
            if self.experts_per_token is not None:
                raise ValueError("experts_per_token needs num_experts (the experts to choose from)")
            for field in moe_fields:
                if getattr(self, field) not in (None, False, 0):
                    raise ValueError(f"{field} is a mixture-of-experts setting: give num_experts")
            for field, default in routing.items():
                if getattr(self, field) != default:
                    raise ValueError(f"{field} is a mixture-of-experts setting: give num_experts")
            return
        if self.experts_per_token is None:
            raise ValueError("num_experts needs experts_per_token (how many each token uses)")
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token={self.experts_per_token} exceeds num_experts="
                f"{self.num_experts}: a token chooses among the experts there are"
            )
        self._check_routing()
        if self.attn_only:
            raise ValueError(
                "a mixture of experts replaces a block's MLP: it needs attn_only=False"
            )
        if self.swiglu_limit is not None and not self.gated_mlp:
            raise ValueError(
                f"swiglu_limit={self.swiglu_limit} clamps a gated expert's SwiGLU: it needs "
                "gated_mlp=True (plain experts have no gate to clamp)"
            )
        if self.shared_expert_gate and self.d_mlp_shared is None:
            raise ValueError("shared_expert_gate gates a shared expert: give d_mlp_shared")
        if self.norm_topk_eps and not self.norm_topk_prob:
            raise ValueError(
                f"norm_topk_eps={self.norm_topk_eps} is added to the sum the chosen weights are "
                "renormalised by: it needs norm_topk_prob=True"
            )
        if self.moe_out_norm and (self.normalization_type is None or self.placements != ("pre",)):
            raise ValueError(
                "moe_out_norm norms the mixture's output as the blocks' ln2_post: it needs a "
                "normalization_type (one of LN, LNPre, RMS, RMSPre) and every block placed "
                f"'pre' (got {self.normalization_type!r}, placements {self.placements})"
            )
        self._check_moe_layers()
        self._check_moe_beside_mlp()

    def _check_moe_beside_mlp(self) -> None:
        """`moe_beside_mlp`: a sequential block with norms before and after its sublayers,
        the mixture in every block, gated, beside a dense MLP `d_mlp_dense` wide."""
        if not self.moe_beside_mlp:
            return
        said = {
            "normalization_placement": self.normalization_placement == "pre_and_post",
            "parallel_attn_mlp=False": not self.parallel_attn_mlp,
            "gated_mlp=True": self.gated_mlp,
            "d_mlp_dense": self.d_mlp_dense is not None,
            "experts in every block": all(map(self.layer_is_moe, range(self.n_layers))),
            "no mixers": self.mixers is None and self.placement_layers is None,
        }
        missing = [name for name, holds in said.items() if not holds]
        if missing:
            raise ValueError(
                "moe_beside_mlp builds Gemma 4's block (normalization_placement "
                f"'pre_and_post'): it needs {', '.join(missing)}"
            )

    def _check_moe_layers(self) -> None:
        """`moe_layers`: a flag per block, some block with experts, a dense width for the
        blocks without; never beside `n_dense_layers` (one place says which blocks)."""
        flags = self.moe_layers
        if flags is None:
            return
        if len(flags) != self.n_layers or not all(isinstance(f, bool) for f in flags):
            raise ValueError(
                f"moe_layers must be {self.n_layers} booleans, one per block; got {flags}"
            )
        if self.n_dense_layers:
            raise ValueError(
                f"n_dense_layers={self.n_dense_layers} and moe_layers={flags} both say which "
                "blocks hold experts: give moe_layers alone"
            )
        if not any(flags):
            raise ValueError(
                f"moe_layers={flags} has no block with experts: leave num_experts unset"
            )
        if not all(flags) and self.d_mlp_dense is None:
            raise ValueError(
                f"moe_layers={flags} keeps dense MLPs in some blocks: give d_mlp_dense"
            )

    def _check_routing(self) -> None:
        groups, best = self.n_expert_groups, self.topk_expert_groups
        if self.router_scoring != "sparsemixer" and self.sparsemixer_jitter_eps != 0.01:
            raise ValueError(
                f"sparsemixer_jitter_eps={self.sparsemixer_jitter_eps} is the sparsemixer's: "
                f"router_scoring={self.router_scoring!r} does not read it"
            )
        if self.num_experts % groups or best > groups:
            raise ValueError(
                f"n_expert_groups={groups} must divide num_experts={self.num_experts}, and "
                f"topk_expert_groups={best} be at most n_expert_groups"
            )
        if groups > 1 and self.num_experts // groups < self.group_score_experts:
            raise ValueError(
                f"n_expert_groups={groups} leaves {self.num_experts // groups} experts per "
                f"group; a group's score is the sum of its group_score_experts="
                f"{self.group_score_experts} best experts'"
            )
        if best * (self.num_experts // groups) < self.experts_per_token:
            raise ValueError(
                f"topk_expert_groups={best} groups of {self.num_experts // groups} experts "
                f"hold fewer than experts_per_token={self.experts_per_token}"
            )
        if self.n_dense_layers and self.d_mlp_dense is None:
            raise ValueError(
                "n_dense_layers keeps dense MLPs in the first blocks: give d_mlp_dense"
            )
        if self.n_dense_layers > self.n_layers:
            raise ValueError(
                f"n_dense_layers={self.n_dense_layers} exceeds n_layers={self.n_layers}"
            )
