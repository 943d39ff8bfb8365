"""How well transcoders stand in for a model's MLPs, layer by layer and all together.

`evaluate_transcoders` runs the model on `tokens` and measures, at each layer `L` the set
covers:

- L0: features active per token, on average; dead features (never active on these tokens)
  and dense ones (active on more than `dense_above` of them);
- FVE: the fraction of the MLP output's variance explained by the prediction, `1 - |y -
  recons|^2 / |y - mean(y)|^2` (inputs as the model computes them: error terms kept);
- the next-token loss with layer L's MLP replaced by its transcoder without an error term
  (the other MLPs as they are), and with that MLP zero-ablated and mean-ablated (the mean
  over these tokens): "CE loss recovered" is `(L_ablated - L_replaced) / (L_ablated -
  L_clean)`, 1 when the transcoder costs nothing, 0 when it is as bad as no MLP there.

And the same loss for every covered MLP replaced at once (no error terms: the model of
the transcoders alone), against all of them ablated.
"""

import dataclasses
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from hookedattn.sae.replacement import replaced, transcoder_hook_name
from hookedattn.sae.transcoder_set import TranscoderSet


def _recovered(ablated: float, replaced_loss: float, clean: float) -> float:
    return (ablated - replaced_loss) / (ablated - clean) if ablated != clean else float("nan")


@dataclasses.dataclass(frozen=True)
class LayerEvaluation:
    """One layer's measurements (module docstring)."""

    layer: int
    l0: float
    fve: float
    dead: int
    dense: int
    d_sae: int
    loss_replaced: float
    loss_zero_ablated: float
    loss_mean_ablated: float
    loss_clean: float

    @property
    def ce_recovered_vs_zero(self) -> float:
        """Loss recovered against zero-ablation of this MLP."""
        return _recovered(self.loss_zero_ablated, self.loss_replaced, self.loss_clean)

    @property
    def ce_recovered_vs_mean(self) -> float:
        """Loss recovered against mean-ablation of this MLP."""
        return _recovered(self.loss_mean_ablated, self.loss_replaced, self.loss_clean)

    def rows(self) -> list[tuple[str, str]]:
        """The table's rows: (measure, value as text)."""
        return [
            ("L0 (active features per token)", f"{self.l0:.2f}"),
            ("fraction of variance explained", f"{self.fve:.4f}"),
            ("dead features", f"{self.dead} of {self.d_sae}"),
            ("dense features", f"{self.dense} of {self.d_sae}"),
            ("loss, this MLP replaced (no error term)", f"{self.loss_replaced:.4f}"),
            ("loss, this MLP zero-ablated", f"{self.loss_zero_ablated:.4f}"),
            ("loss, this MLP mean-ablated", f"{self.loss_mean_ablated:.4f}"),
            ("CE loss recovered vs zero-ablation", f"{self.ce_recovered_vs_zero:.4f}"),
            ("CE loss recovered vs mean-ablation", f"{self.ce_recovered_vs_mean:.4f}"),
        ]


@dataclasses.dataclass(frozen=True)
class TranscoderEvaluation:
    """Every layer's `LayerEvaluation`, and the losses with all the MLPs replaced at once;
    `str()` is a table."""

    n_tokens: int
    layers: tuple[LayerEvaluation, ...]
    loss_clean: float
    loss_all_replaced: float
    loss_all_zero_ablated: float
    loss_all_mean_ablated: float

    @property
    def ce_recovered_all_vs_mean(self) -> float:
        """Loss recovered with every MLP replaced, against all of them mean-ablated."""
        return _recovered(self.loss_all_mean_ablated, self.loss_all_replaced, self.loss_clean)

    @property
    def ce_recovered_all_vs_zero(self) -> float:
        """Loss recovered with every MLP replaced, against all of them zero-ablated."""
        return _recovered(self.loss_all_zero_ablated, self.loss_all_replaced, self.loss_clean)

    def rows(self) -> list[tuple[str, str]]:
        """The whole-model rows: (measure, value as text)."""
        return [
            ("tokens", f"{self.n_tokens:,}"),
            ("loss, clean", f"{self.loss_clean:.4f}"),
            ("loss, every MLP replaced (no error terms)", f"{self.loss_all_replaced:.4f}"),
            ("loss, every MLP zero-ablated", f"{self.loss_all_zero_ablated:.4f}"),
            ("loss, every MLP mean-ablated", f"{self.loss_all_mean_ablated:.4f}"),
            ("CE loss recovered, all, vs zero-ablation", f"{self.ce_recovered_all_vs_zero:.4f}"),
            ("CE loss recovered, all, vs mean-ablation", f"{self.ce_recovered_all_vs_mean:.4f}"),
        ]

    def __str__(self) -> str:
        lines = ["transcoders"]
        for name, value in self.rows():
            lines.append(f"  {name:<44}  {value}")
        for layer in self.layers:
            lines.append(f"layer {layer.layer}")
            lines += [f"  {name:<44}  {value}" for name, value in layer.rows()]
        return "\n".join(lines)


@torch.no_grad()
def evaluate_transcoders(
    model: Any, transcoders: Any, tokens: Int[Tensor, "batch pos"], dense_above: float = 0.1
) -> TranscoderEvaluation:
    """Measure the transcoders against `model`'s MLPs on `tokens` (module docstring)."""
    tset = TranscoderSet(transcoders)
    loss_clean = float(model(tokens, return_type="loss"))
    wanted = [transcoder_hook_name(layer, h) for layer in tset.layers
              for h in ("hook_acts", "hook_recons", "hook_out")]  # fmt: skip
    with replaced(model, tset):
        _, cache = model.run_with_cache(tokens, return_type=None, names_filter=wanted)
    means = {
        layer: cache[transcoder_hook_name(layer, "hook_out")].mean((0, 1)) for layer in tset.layers
    }
    layers = []
    for layer in tset.layers:
        acts, recons, y = (cache[transcoder_hook_name(layer, h)].flatten(0, 1)
                           for h in ("hook_acts", "hook_recons", "hook_out"))  # fmt: skip
        frequency = (acts > 0).float().mean(0)
        fve = 1 - float((y - recons).pow(2).sum() / (y - y.mean(0)).pow(2).sum())
        with replaced(model, tset, use_error_term=False, layers=[layer]):
            loss_replaced = float(model(tokens, return_type="loss"))
        layers.append(LayerEvaluation(
            layer, float((acts > 0).sum(-1).float().mean()), fve, int((frequency == 0).sum()),
            int((frequency > dense_above).sum()), tset.d_sae(layer), loss_replaced,
            _ablated_loss(model, tset, tokens, [layer], None),
            _ablated_loss(model, tset, tokens, [layer], means), loss_clean,
        ))  # fmt: skip
    with replaced(model, tset, use_error_term=False):
        loss_all = float(model(tokens, return_type="loss"))
    return TranscoderEvaluation(
        int(tokens.numel()), tuple(layers), loss_clean, loss_all,
        _ablated_loss(model, tset, tokens, list(tset.layers), None),
        _ablated_loss(model, tset, tokens, list(tset.layers), means),
    )  # fmt: skip


def _ablated_loss(model: Any, tset: TranscoderSet, tokens: Tensor, layers: list[int],
                  means: dict[int, Tensor] | None) -> float:  # fmt: skip
    """The loss with the MLP outputs of `layers` zeroed (`means` None) or set to their mean."""

    def ablate(layer: int):
        if means is None:
            return lambda y, hook: torch.zeros_like(y)
        return lambda y, hook: means[layer].expand_as(y).clone()

    hooks = [(tset.output_hook(layer), ablate(layer)) for layer in layers]
    with model.hooks(fwd_hooks=hooks):
        return float(model(tokens, return_type="loss"))
