"""How good an SAE is at its point: sparsity, reconstruction, and the loss when spliced.

`evaluate_sae` runs the model on `tokens` and measures, at the SAE's hook point:

- L0: features active per token, on average; dead features (never active on these
  tokens) and dense ones (active on more than `dense_above` of them);
- FVE: the fraction of variance explained, `1 - |x - recons|^2 / |x - mean(x)|^2`;
- the next-token loss of the clean model, with the SAE spliced without its error term, and
  with the point zero-ablated and mean-ablated (the mean over these tokens); "CE loss
  recovered" is `(L_ablated - L_sae) / (L_ablated - L_clean)` against each ablation: 1
  when the SAE costs nothing, 0 when it is as bad as deleting the point.
"""

import dataclasses
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from hookedattn.sae.autoencoder import SparseAutoencoder
from hookedattn.sae.splice import sae_hook_name, spliced
from hookedattn.sae.training import fraction_of_variance_explained


@dataclasses.dataclass(frozen=True)
class SAEEvaluation:
    """An SAE's measurements at its point (module docstring); `str()` is a table."""

    hook_name: str
    n_tokens: int
    l0: float
    fve: float
    dead: int
    dense: int
    d_sae: int
    loss_clean: float
    loss_spliced: float
    loss_zero_ablated: float
    loss_mean_ablated: float

    @property
    def ce_recovered_vs_zero(self) -> float:
        """Loss recovered against zero-ablation of the point."""
        return _recovered(self.loss_zero_ablated, self.loss_spliced, self.loss_clean)

    @property
    def ce_recovered_vs_mean(self) -> float:
        """Loss recovered against mean-ablation of the point."""
        return _recovered(self.loss_mean_ablated, self.loss_spliced, self.loss_clean)

    def rows(self) -> list[tuple[str, str]]:
        """The table's rows: (measure, value as text)."""
        return [
            ("tokens", f"{self.n_tokens:,}"),
            ("L0 (active features per token)", f"{self.l0:.2f}"),
            ("fraction of variance explained", f"{self.fve:.4f}"),
            ("dead features", f"{self.dead} of {self.d_sae}"),
            ("dense features", f"{self.dense} of {self.d_sae}"),
            ("loss, clean", f"{self.loss_clean:.4f}"),
            ("loss, SAE spliced (no error term)", f"{self.loss_spliced:.4f}"),
            ("loss, zero-ablated", f"{self.loss_zero_ablated:.4f}"),
            ("loss, mean-ablated", f"{self.loss_mean_ablated:.4f}"),
            ("CE loss recovered vs zero-ablation", f"{self.ce_recovered_vs_zero:.4f}"),
            ("CE loss recovered vs mean-ablation", f"{self.ce_recovered_vs_mean:.4f}"),
        ]

    def __str__(self) -> str:
        rows = self.rows()
        width = max(len(name) for name, _ in rows)
        lines = [f"SAE at {self.hook_name}", *(f"  {n:<{width}}  {v}" for n, v in rows)]
        return "\n".join(lines)


def _recovered(ablated: float, spliced_loss: float, clean: float) -> float:
    return (ablated - spliced_loss) / (ablated - clean) if ablated != clean else float("nan")


@torch.no_grad()
def evaluate_sae(
    model: Any, sae: SparseAutoencoder, tokens: Int[Tensor, "batch pos"], dense_above: float = 0.1
) -> SAEEvaluation:
    """Measure `sae` at its hook point on `tokens` (module docstring)."""
    point = sae.cfg.hook_name
    wanted = [sae_hook_name(point, h) for h in ("hook_in", "hook_acts", "hook_recons")]
    loss_clean = float(model(tokens, return_type="loss"))
    with spliced(model, [sae], use_error_term=False):
        loss, cache = model.run_with_cache(tokens, return_type="loss", names_filter=wanted)
    x, acts, recons = (cache[name].flatten(0, -2) for name in wanted)
    frequency = (acts > 0).float().mean(0)
    mean = x.mean(0)
    with model.hooks([(point, lambda a, hook: torch.zeros_like(a))]):
        loss_zero = float(model(tokens, return_type="loss"))
    with model.hooks([(point, lambda a, hook: mean.expand_as(a).clone())]):
        loss_mean = float(model(tokens, return_type="loss"))
    return SAEEvaluation(
        hook_name=point,
        n_tokens=x.shape[0],
        l0=float((acts > 0).sum(-1).float().mean()),
        fve=fraction_of_variance_explained(x, recons),
        dead=int((frequency == 0).sum()),
        dense=int((frequency > dense_above).sum()),
        d_sae=sae.cfg.d_sae,
        loss_clean=loss_clean,
        loss_spliced=float(loss),
        loss_zero_ablated=loss_zero,
        loss_mean_ablated=loss_mean,
    )
