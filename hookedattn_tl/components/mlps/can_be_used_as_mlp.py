"""TransformerLens's `CanBeUsedAsMLP`: what every MLP shares (the config, `d_mlp`, the
activation by TL's name, and for the `*_ln` activations a norm after it)."""

from typing import Any

from torch import nn

from hookedattn_tl._activations import SUPPORTED_ACTIVATIONS
from hookedattn_tl.config import HookedTransformerConfig
from hookedattn_tl.hook_points import HookPoint


class CanBeUsedAsMLP(nn.Module):
    """The base of TL's MLPs: `cfg` (a config or a dict), `d_mlp`, `select_activation_function`."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.cfg = HookedTransformerConfig.unwrap(cfg)
        if self.cfg.d_mlp is None:
            raise ValueError("an MLP needs cfg.d_mlp (the number of neurons)")
        self.d_mlp = self.cfg.d_mlp
        self.act_fn: Any = None
        self.ln: nn.Module | None = None

    def select_activation_function(self) -> None:
        """Set `act_fn` from `cfg.act_fn`; a `*_ln` activation also gets `hook_mid` and a
        norm over the neurons (`ln`: LayerNorm for an "LN" config, else LayerNormPre, as
        TL builds it and as `hookedattn.core.components.mlp.NeuronNormMLP` does)."""
        from hookedattn_tl.components.norms import LayerNorm, LayerNormPre

        name = self.cfg.act_fn
        if name not in SUPPORTED_ACTIVATIONS:
            raise ValueError(
                f"act_fn={name!r} is not one of TL's activations {sorted(SUPPORTED_ACTIVATIONS)}"
            )
        self.act_fn = SUPPORTED_ACTIVATIONS[name]
        if self.cfg.is_layer_norm_activation():
            self.hook_mid = HookPoint()  # [batch pos d_mlp], before the norm
            norm = LayerNorm if self.cfg.normalization_type == "LN" else LayerNormPre
            self.ln = norm(self.cfg, self.d_mlp)


__all__ = ["CanBeUsedAsMLP"]
