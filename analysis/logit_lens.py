"""The logit lens: read the residual stream at every layer as if it were the final one.

Each stream goes through the final norm (and a head transform, BERT's, where the model
has one) and the unembedding. The norm's scale is
recomputed for each layer's own stream. TransformerLens's `accumulated_resid(...,
apply_ln=True)` divides every layer's stream by the scale cached for the final stream
instead; since a stream's size grows with depth, that shrinks early layers' logits by the
ratio of the two scales, which changes their probabilities and, once the norm's bias and
`b_U` are added, even which token ranks first. The last entry is the model's own logits.
"""

import dataclasses
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from analysis._reading import weight
from analysis._resid_stack import label_index
from analysis.decomposition import accumulated_resid
from analysis.normalization import NormSite, normalize, normalize_by
from analysis.tables import Table
from hookedattn.core.cache import ActivationCache
from hookedattn.core.components.mlp import ACTIVATIONS
from hookedattn.core.model import HookedTransformer

_ORDINALS = ("1st", "2nd", "3rd")


def _token_name(token: int, tokenizer: Any) -> str:
    if tokenizer is None:
        return str(token)
    str_token = getattr(tokenizer, "str_token", None)  # hookedattn's tokenizers
    return repr(str_token(token) if str_token is not None else tokenizer.decode([token]))


@dataclasses.dataclass(frozen=True, repr=False)
class LogitLens:
    """Logits read off the residual stream at each point: `[layer batch pos d_vocab_out]`.

    `labels` name the points (`L0_resid_pre`, ..., `final`), as in `accumulated_resid`;
    `lens["L1_resid_pre"]` is one point's logits. `tokenizer` (the model's, if it has
    one) turns token ids into strings in `top`.
    """

    logits: Float[Tensor, "layer batch pos d_vocab_out"]
    labels: tuple[str, ...]
    tokenizer: Any = dataclasses.field(default=None, compare=False)

    def __getitem__(self, label: str) -> Float[Tensor, "batch pos d_vocab_out"]:
        return self.logits[label_index(self.labels, label, "LogitLens")]

    def __len__(self) -> int:
        return len(self.labels)

    def top_tokens(self, k: int = 5) -> Int[Tensor, "layer batch pos k"]:
        """The `k` highest-logit tokens at every point and position, best first."""
        return self.logits.topk(k, dim=-1).indices

    def logprobs(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "layer batch pos"]:
        """The log-probability each point gives to `tokens` (e.g. the next tokens)."""
        logprobs = self.logits.log_softmax(dim=-1)
        index = torch.broadcast_to(tokens.to(self.logits.device), logprobs.shape[1:3])
        return logprobs.gather(-1, index[None, ..., None].expand(len(self), -1, -1, 1))[..., 0]

    def top(self, k: int = 5, batch: int = 0, pos: int = -1, tokenizer: Any = None) -> Table:
        """Per point, the `k` top tokens at one position, with their logits.

        Tokens are shown as strings by `tokenizer` (default: the model's, kept from
        `logit_lens`), or as ids when there is none.
        """
        tokenizer = self.tokenizer if tokenizer is None else tokenizer
        values, indices = self.logits[:, batch, pos].topk(k, dim=-1)
        rows = tuple(
            (
                label,
                *(
                    f"{_token_name(int(t), tokenizer)} ({float(v):.2f})"
                    for t, v in zip(indices[i], values[i], strict=True)
                ),
            )
            for i, label in enumerate(self.labels)
        )
        columns = ("stream", *(_ORDINALS[i] if i < 3 else f"{i + 1}th" for i in range(k)))
        return Table(columns, rows, f"logit lens at batch {batch}, pos {pos}")

    def __repr__(self) -> str:
        _, batch, pos, vocab = self.logits.shape
        return (
            f"LogitLens: {len(self)} points ({self.labels[0]} .. {self.labels[-1]}) × "
            f"[batch={batch} pos={pos} d_vocab_out={vocab}]"
        )


def logit_lens(
    model: HookedTransformer, cache: ActivationCache, *, incl_mid: bool = False
) -> LogitLens:
    """Logits from the residual stream at every block boundary (and mid-block if asked).

    Each stream of `accumulated_resid` is normalised by `ln_final` with its own scale,
    recomputed from that stream (not the final layer's cached scale), then unembedded,
    soft-capped like the model's logits where it caps them (`output_logits_soft_cap`), so
    that the last entry is the model's own logits.
    """
    streams = accumulated_resid(model, cache, incl_mid=incl_mid)
    normalized = _through_head(model, normalize(model, NormSite("ln_final"), streams.components))
    # The model's views: a tensor-parallel model's whole vocabulary, gathered.
    logits = normalized @ weight(model.W_U, normalized) + weight(model.b_U, normalized)
    cap = model.cfg.output_logits_soft_cap
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap  # the order of SoftCap's own arithmetic
    return LogitLens(logits, streams.labels, getattr(model, "tokenizer", None))


def _through_head(
    model: HookedTransformer, x: Float[Tensor, "layer batch pos d_model"]
) -> Float[Tensor, "layer batch pos d_unembed"]:
    """The head transform before the unembedding, where the model has one (BERT's: dense,
    activation, norm, its scale recomputed per stream), without firing its hook points;
    `d_unembed` is `d_model` but behind a head to another width (ELECTRA's)."""
    act_fn = model.cfg.unembed_transform
    if act_fn is None:
        return x
    head = model.unembed_transform
    hidden = x @ weight(head.W_dense, x) + weight(head.b_dense, x)
    return normalize_by(head.ln_unembed, ACTIVATIONS[act_fn](hidden))
