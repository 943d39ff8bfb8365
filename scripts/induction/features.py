"""The induction report's feature section: the shipped SAE's features on repeated text.

On the report's repeated random bytes (`<bos>`, a segment, the segment again), the shipped
SAE at `blocks.1.hook_resid_pre` is spliced with its error term (the model's output does
not change), the final stream is decomposed with `decompose_resid(granularity="features")`
and attributed to the logit of the correct next token (`direct_logit_attribution`). The
contributions sum to the logits exactly; the section states the largest error. The
features with the largest mean direct attribution on the second copy are listed, each
with the contexts of a small `ActivationStore` of the training text where it fires most.

These are direct effects: what a feature at the input of layer 1 writes straight to the
logits. What layer 1's heads read from it (the induction head's copying) is `L1_attn`'s
share, shown beside the features'.

    section = feature_section(model, repeated_tokens(), PERIOD)   # markdown
    insert_section(report_path, section)
"""

import dataclasses
import tempfile
from pathlib import Path

import torch
from jaxtyping import Int
from torch import Tensor

from analysis import decompose_resid, direct_logit_attribution
from hookedattn import HookedTransformer
from hookedattn.sae import SparseAutoencoder, load_pretrained_sae
from hookedattn.sae.shipped import pretrained_sae_record
from hookedattn.store import ActivationStore, collect_activations

MODEL, POINT = "bytes-attn-only-2l", "blocks.1.hook_resid_pre"
STORE_TOKENS = 32768  # training text for the top contexts: 256 contexts of 128
N_FEATURES, N_CONTEXTS, CONTEXT_CHARS = 5, 3, 32


@dataclasses.dataclass(frozen=True)
class TopFeature:
    """One feature: its mean direct attribution on the second copy, how often it fires
    there, and its top contexts in the store as `(text up to the token, activation)`."""

    feature: int
    attribution: float
    firing: float
    contexts: tuple[tuple[str, float], ...]


@dataclasses.dataclass(frozen=True)
class FeatureResults:
    """The section's measurements (module docstring)."""

    features: tuple[TopFeature, ...]
    groups: dict[str, float]  # mean attribution of: all features, the SAE's bias and error, ...
    logit: float  # the mean logit they add up to
    max_error: float  # the largest |sum of contributions - logit|
    n_active: int  # features active somewhere on the second copy
    store_tokens: int


def measure(
    model: HookedTransformer, sae: SparseAutoencoder, tokens: Int[Tensor, "batch pos"], period: int
) -> FeatureResults:
    """Attribute the second copy's next-token logits to the SAE's features (module docstring)."""
    with torch.no_grad(), model.saes([sae]):
        logits, cache = model.run_with_cache(tokens)
    decomposition = decompose_resid(model, cache, None, granularity="features", sae=sae)
    # Position p predicts token p + 1; the last position's target is unused.
    targets = torch.cat([tokens[:, 1:], tokens[:, -1:]], dim=1)
    dla = direct_logit_attribution(model, cache, decomposition, targets)
    second = slice(period + 1, 2 * period)  # the current and the next token both repeat
    contributions = dla.contributions[:, :, second]
    actual = logits.gather(-1, targets[..., None])[..., 0][:, second]
    mean = contributions.mean((1, 2))
    is_feature = torch.tensor([label.startswith("F") for label in dla.labels])
    groups = {"all features": float(mean[is_feature].sum())}
    groups |= {label: float(mean[i]) for i, label in enumerate(dla.labels) if not is_feature[i]}
    acts = cache[f"{POINT}.sae.hook_acts"][:, second]
    order = [int(i) for i in mean.masked_fill(~is_feature, -torch.inf).argsort(descending=True)]
    top = [int(dla.labels[i][1:]) for i in order[:N_FEATURES]]
    contexts = _top_contexts(model, sae, top)
    features = tuple(
        TopFeature(f, float(mean[i]), float((acts[..., f] > 0).float().mean()), contexts[f])
        for f, i in zip(top, order, strict=False)
    )
    return FeatureResults(
        features=features,
        groups=groups,
        logit=float(actual.mean()),
        max_error=float((contributions.sum(0) - actual).abs().max()),
        n_active=int((acts > 0).flatten(0, 1).any(0).sum()),
        store_tokens=STORE_TOKENS,
    )


def _top_contexts(
    model: HookedTransformer, sae: SparseAutoencoder, features: list[int]
) -> dict[int, tuple[tuple[str, float], ...]]:
    """Each feature's `N_CONTEXTS` strongest activations in a store of training text."""
    with tempfile.TemporaryDirectory() as folder:
        collect_activations(model, None, names=[POINT], out=folder, context=128,
                            n_tokens=STORE_TOKENS, batch_size=32, progress=False)  # fmt: skip
        store = ActivationStore(folder, model=model)
        with torch.no_grad():
            acts = sae.encode(store.rows(POINT, slice(0, len(store))).float())[:, features]
        out = {}
        for column, feature in enumerate(features):
            values, rows = acts[:, column].topk(N_CONTEXTS)
            out[feature] = tuple(
                (_context_text(model, store, int(row)), float(value))
                for value, row in zip(values, rows, strict=True)
                if value > 0
            )
    return out


def _context_text(model: HookedTransformer, store: ActivationStore, row: int) -> str:
    """The text of the row's context up to its token, the token marked `[[...]]`."""
    position = int(store.origin(row).position)
    tokens = store.origin(slice(row - position, row + 1)).token
    before = model.to_string(tokens[:-1])[-CONTEXT_CHARS:]
    return f"{_visible(before)}[[{_visible(model.to_string(tokens[-1:]))}]]"


def _visible(text: str) -> str:
    """Text for a Markdown code span: newlines and tabs shown, backticks kept out."""
    return text.replace("\n", "⏎").replace("\t", "⇥").replace("`", "'")


def feature_section(model: HookedTransformer, tokens: Int[Tensor, "batch pos"], period: int) -> str:
    """The section's Markdown; if the shipped SAE was trained on other weights, a note
    saying so and how to retrain it, instead of numbers read against the wrong model."""
    try:
        sae = load_pretrained_sae(MODEL, POINT, model=model)
    except ValueError as error:
        return f"## Features at the input of layer 1\n\nNot measured: {error}."
    return _markdown(measure(model, sae, tokens, period), sae)


def _markdown(r: FeatureResults, sae: SparseAutoencoder) -> str:
    record = pretrained_sae_record(MODEL, POINT)["results"]
    rows = "\n".join(
        f"| F{f.feature} | {f.attribution:+.3f} | {f.firing:.0%} | "
        + "<br>".join(f"`{text}` {value:.2f}" for text, value in f.contexts)
        + " |"
        for f in r.features
    )
    others = ", ".join(f"{label} {value:+.3f}" for label, value in r.groups.items())
    return (
        f"## Features at the input of layer 1\n\n"
        f"The shipped TopK SAE (k={sae.cfg.k}, {sae.cfg.d_sae} features; held-out FVE "
        f"{float(record['fraction of variance explained']):.3f}, CE loss recovered "
        f"{float(record['CE loss recovered vs zero-ablation']):.3f} against zero-ablation) "
        f"spliced at `{POINT}` with its error term, on the repeated random bytes above. "
        f"The final stream is decomposed into each active feature's write, the SAE's "
        f"decoder bias and error term, and layer 1's attention "
        f'(`decompose_resid(granularity="features")`), and attributed to the logit of the '
        f"correct next token on the second copy, through the final norm at its recorded "
        f"scale. These are direct effects only: the induction head's copying is in "
        f"`L1_attn`. Mean over the second copy's predictions (logit {r.logit:.3f}; the "
        f"terms add up to it to {r.max_error:.1e} at worst): {others}. "
        f"{r.n_active} features fire somewhere on the second copy.\n\n"
        f"The {len(r.features)} features of largest mean direct attribution, with where "
        f"they fire most in {r.store_tokens:,} tokens of training text (an "
        f"`ActivationStore`; the marked byte is the one the feature fires on):\n\n"
        f"| feature | mean attribution | active on the second copy | top contexts (activation) |\n"
        f"|---|---|---|---|\n{rows}"
    )


def insert_section(report: Path, section: str) -> None:
    """Put the section into `report` before its *Thresholds* section (at the end if it
    has none)."""
    text = report.read_text()
    marker = "\n\n## Thresholds"
    at = text.find(marker)
    if at < 0:
        report.write_text(text.rstrip("\n") + "\n\n" + section + "\n")
    else:
        report.write_text(text[:at] + "\n\n" + section + text[at:])
