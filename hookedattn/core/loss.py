"""Next-token cross-entropy, the language-modelling loss."""

import torch
from jaxtyping import Float, Int
from torch import Tensor


def lm_cross_entropy_loss(
    logits: Float[Tensor, "batch pos d_vocab_out"],
    tokens: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    per_token: bool = False,
) -> Tensor:
    """Cross-entropy of predicting `tokens[:, i + 1]` from `logits[:, i]`.

    The mean over predictions (a scalar), or with `per_token=True` each prediction's loss,
    `[batch pos-1]`. With an `attention_mask`, predictions from or of padding are left out
    of the mean (and are zero in the per-token loss); a batch whose every prediction is
    padding has a mean loss of 0. An input of one position holds no prediction, so its
    mean loss is a `ValueError`, with a mask or without (its per-token loss is empty,
    `[batch 0]`).
    """
    if not per_token and tokens.shape[1] < 2:
        raise ValueError(
            f"a next-token loss needs at least 2 positions (a token and the one after it), "
            f"got tokens of shape {tuple(tokens.shape)}; the mean over no predictions is "
            f"not defined (per_token=True gives the empty per-token loss)"
        )
    log_probs = logits[:, :-1].log_softmax(dim=-1)
    targets = tokens[:, 1:, None]
    loss = -log_probs.gather(dim=-1, index=targets)[..., 0]
    if attention_mask is None:
        return loss if per_token else loss.mean()
    real = (attention_mask[:, :-1] != 0) & (attention_mask[:, 1:] != 0)
    loss = torch.where(real, loss, torch.zeros_like(loss))
    return loss if per_token else loss.sum() / real.sum().clamp(min=1)
