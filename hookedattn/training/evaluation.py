"""What training measures every few steps, on data no training batch contains."""

import dataclasses

import torch
from jaxtyping import Float
from torch import Tensor

from hookedattn.core.loss import lm_cross_entropy_loss
from hookedattn.core.model import HookedTransformer
from hookedattn.training.config import TrainConfig
from hookedattn.training.corpus import ByteCorpus, heldout_windows, repeated_random_tokens

_EVAL_SEED_OFFSET = 7_919  # eval data comes from its own stream, never a training batch's


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Losses (nats per token) at one step, on data no training batch contains.

    `heldout_loss`: held-out stdlib files. `icl_score`: held-out loss late in the context
    minus early in it (Olsson et al. 2022's in-context-learning score: negative when the
    context helps). `repeat_first`/`repeat_second`: loss on the first and second copy of a
    repeated random sequence (ln 256 = 5.55 for a model that cannot use the repeat).
    `induction`: on the second copy, the largest mean attention of any head to the token
    after the earlier copy of the query token (the prefix-matching score of Olsson et al.;
    NaN when a run did not record it, 0 for a model without attention), so that a run's
    history shows when induction heads form beside when the second copy's loss drops.
    """

    step: int
    heldout_loss: float
    icl_score: float
    repeat_first: float
    repeat_second: float
    induction: float = float("nan")

    def __repr__(self) -> str:
        return (
            f"step {self.step}: held-out {self.heldout_loss:.3f}, late-early "
            f"{self.icl_score:+.3f}, repeat {self.repeat_first:.2f} -> {self.repeat_second:.2f}, "
            f"induction {self.induction:.2f}"
        )


@torch.no_grad()
def evaluate(
    model: HookedTransformer, corpus: ByteCorpus, cfg: TrainConfig, step: int
) -> Evaluation:
    """Held-out loss, in-context-learning score and repeated-sequence losses at `step`."""
    n_ctx = model.cfg.n_ctx
    text = heldout_windows(corpus.heldout, cfg.eval_seqs, n_ctx)
    per_token = model(text, return_type="loss", loss_per_token=True).mean(0)
    early, late = per_token[n_ctx // 16 : 3 * n_ctx // 16], per_token[3 * n_ctx // 4 :]
    generator = torch.Generator().manual_seed(cfg.seed + _EVAL_SEED_OFFSET)
    half = (n_ctx - 1) // 2
    repeated = repeated_random_tokens(cfg.eval_seqs, 2 * half + 1, half, generator)
    # Prediction i is of token i + 1; the second copy's tokens are half + 1 .. 2 * half.
    logits, cache = model.run_with_cache(repeated, names_filter=lambda n: "hook_pattern" in n)
    repeat_loss = lm_cross_entropy_loss(logits, repeated, per_token=True).mean(0)
    return Evaluation(
        step=step,
        heldout_loss=per_token.mean().item(),
        icl_score=(late.mean() - early.mean()).item(),
        repeat_first=repeat_loss[1:half].mean().item(),
        repeat_second=repeat_loss[half:].mean().item(),
        induction=_best_induction_score(list(cache.values()), half),
    )


def _best_induction_score(
    patterns: list[Float[Tensor, "batch head query key"]], period: int
) -> float:
    """The largest mean attention, over heads, from each second-copy token to the one after
    its earlier copy (`period - 1` back); the first-copy queries have no earlier copy."""
    best = 0.0
    for pattern in patterns:
        queries = torch.arange(period + 1, pattern.shape[-2])
        on_target = pattern[:, :, queries, queries - period + 1]
        best = max(best, on_target.mean(dim=(0, 2)).max().item())
    return best
