"""Direct logit attribution: how much each component of the final stream adds to a logit.

The logits are `ln_final(resid) @ W_U + b_U`. With the final norm's scale fixed at its
cached value, `ln_final(resid) = Σ_c w·(c - mean c)/scale + b` over the components `c` of
the stream (see `analysis.normalization`), so the logit of token `t` is

    Σ_c [w·(c - mean c)/scale] @ W_U[:, t]  +  b @ W_U[:, t]  +  b_U[t]

one term per component, plus the norm's bias (`ln_final_bias`) and `b_U`, each labelled.
The terms add up to the model's actual logit (or logit difference), not approximately.

With a soft cap on the logits (`output_logits_soft_cap`, Gemma 2: `logits = c tanh(l /
c)`), what is attributed is the logit before the cap, `l` (`unembed.hook_in @ W_U + b_U`):
the cap is not linear, and `l` is what the components sum to. The metric says so
(`"logit before the soft cap"`); the capped logit is `c tanh(total() / c)`.

More in `docs/guide/decomposition.md`.
"""

import dataclasses

import torch
from einops import einsum, reduce
from jaxtyping import Float, Int
from torch import Tensor

from analysis._reading import weight
from analysis._resid_stack import Decomposition, label_index
from analysis.normalization import apply_ln_to_stack
from analysis.tables import Table
from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer


@dataclasses.dataclass(frozen=True, repr=False)
class LogitAttribution:
    """Each component's direct contribution to a logit (or logit difference) per position.

    `contributions: [component batch pos]`, labelled as the decomposition it came from,
    plus `ln_final_bias` (LayerNorm models) and `b_U`; `total()` is the actual logit (the
    logit before the soft cap, for a model that caps its logits: see `metric`).
    """

    contributions: Float[Tensor, "component batch pos"]
    labels: tuple[str, ...]
    metric: str

    def __getitem__(self, label: str) -> Float[Tensor, "batch pos"]:
        return self.contributions[label_index(self.labels, label, "LogitAttribution")]

    def __len__(self) -> int:
        return len(self.labels)

    def total(self) -> Float[Tensor, "batch pos"]:
        """The sum over components: the model's logit (or logit difference)."""
        return reduce(self.contributions, "component batch pos -> batch pos", "sum")

    def to_table(self, batch: int = 0, pos: int = -1) -> Table:
        """Every component's contribution at one batch element and position, in order."""
        values = self.contributions[:, batch, pos].tolist()
        rows = tuple(zip(self.labels, values, strict=True))
        title = f"direct attribution to the {self.metric} at batch {batch}, pos {pos}"
        return Table(("label", "contribution"), rows, title)

    def top(self, k: int = 10, batch: int = 0, pos: int = -1) -> Table:
        """The `k` components of largest contribution (either sign) at one position."""
        table = self.to_table(batch, pos)
        rows = sorted(table.rows, key=lambda row: -abs(row[1]))[:k]
        return Table(table.columns, tuple(rows), f"top {k}: {table.title}")

    def __repr__(self) -> str:
        _, batch, pos = self.contributions.shape
        shown = ", ".join(self.labels[:4]) + (", ..." if len(self) > 4 else "")
        return (
            f"LogitAttribution to the {self.metric}: {len(self)} components × "
            f"[batch={batch} pos={pos}]: {shown}"
        )


def _token_grid(
    model: HookedTransformer, tokens: object, shape: tuple[int, int], what: str
) -> Int[Tensor, "batch pos"]:
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        tokens = torch.tensor(tokens)
    if not isinstance(tokens, Tensor) or tokens.dtype.is_floating_point:
        raise TypeError(f"{what} must be an int or an integer tensor, got {tokens!r}")
    try:
        grid = torch.broadcast_to(tokens, shape)
    except RuntimeError:
        raise ValueError(
            f"{what} of shape {tuple(tokens.shape)} does not broadcast to [batch pos] = {shape}"
        ) from None
    n_out = model.cfg.d_vocab_out
    if grid.numel() and not (int(grid.min()) >= 0 and int(grid.max()) < n_out):
        raise ValueError(f"{what} must be token ids in 0..{n_out - 1}, got {tokens.tolist()}")
    return grid.to(model.unembed.W_U.device)


def direct_logit_attribution(
    model: HookedTransformer,
    cache: ActivationCache,
    decomposition: Decomposition,
    tokens: int | Int[Tensor, "*shape"],
    incorrect_tokens: int | Int[Tensor, "*shape"] | None = None,
) -> LogitAttribution:
    """Each component's direct contribution to the logit of `tokens` at every position.

    `decomposition` is of the final stream (`decompose_resid(model, cache)`, any
    granularity: with `"features"` and an SAE spliced, each active feature, the SAE's
    `sae_b_dec` and `sae_error` get their own direct effect), as is or already through
    `apply_ln_to_stack`. `tokens` (and
    `incorrect_tokens`, for the logit difference `logit[tokens] - logit[incorrect]`) are a
    token id or ids broadcastable to `[batch pos]`, e.g. `tokens[:, 1:]` against a
    decomposition sliced to `[:, :, :-1]`. The contributions, plus `ln_final_bias` and
    `b_U`, sum to the model's logits exactly (to rounding); with a soft cap on the
    logits, to the logits before the cap (module docstring).
    """
    if model.cfg.unembed_transform is not None:
        raise ValueError(
            f"direct_logit_attribution: a head transform (unembed_transform="
            f"{model.cfg.unembed_transform!r}: dense, activation, norm) sits between the "
            f"final stream and W_U, so the logits are no linear function of the stream"
        )
    final = model.cfg.n_layers - 1
    if (decomposition.site, decomposition.layer) != ("resid_post", final):
        raise ValueError(
            f"direct logit attribution reads the final stream (blocks.{final}.hook_resid_post), "
            f"but this decomposition is of {decomposition.hook_name}"
        )
    if decomposition.normalized_by is None:
        decomposition = apply_ln_to_stack(model, cache, decomposition)
    components = decomposition.components
    shape = tuple(components.shape[1:3])
    # The model's views: a tensor-parallel model's whole vocabulary, gathered.
    W_U, b_U = weight(model.W_U, components), weight(model.b_U, components)
    grid = _token_grid(model, tokens, shape, "tokens")
    directions, bias = W_U[:, grid], b_U[grid]
    metric = "logit"
    if incorrect_tokens is not None:
        wrong = _token_grid(model, incorrect_tokens, shape, "incorrect_tokens")
        directions, bias = directions - W_U[:, wrong], bias - b_U[wrong]
        metric = "logit difference"
    if model.cfg.output_logits_soft_cap is not None:
        metric += " before the soft cap"
    contributions = einsum(
        components,
        directions,
        "component batch pos d_model, d_model batch pos -> component batch pos",
    )
    contributions = torch.cat([contributions, bias[None]])
    return LogitAttribution(contributions, (*decomposition.labels, "b_U"), metric)
