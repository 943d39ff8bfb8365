"""The recipes of the shipped models: a model config and a `TrainConfig` for each.

`python scripts/train.py --preset NAME --ship` trains one from scratch and writes it into
the package (`hookedattn/pretrained/NAME/`); the shipped `config.json` records the preset,
so `tests/shipped/test_pretrained.py` can check that every shipped model is what its recipe makes.

All models read bytes (`ByteTokenizer`, 259 ids with `<bos>`, `<eos>`, `<pad>`), have a
context of 128 tokens, a 64-wide residual stream, per layer 8 heads of width 16, and layer
norms (as TransformerLens's attn-only models; `process_weights` folds them for circuit
analysis). Without norms the same recipe trains, but its attention stays soft: the
residual stream is small at initialisation, so are the attention scores, and in 1,500
steps no previous-token head formed. Half of each batch is repeated random bytes: with a
quarter, no induction head formed in 3,000 steps; with half, it forms near step 1,300.

With norms, the two-layer model's previous-token information runs through several soft
layer-0 heads (the best puts 0.32 of its attention one back). Trials without norms, all
other settings as here: an initialisation scale of 0.02 or 0.05 formed no previous-token
head (every layer-0 score at the uniform 0.03) by step 1,250 and 1,500; a scale of 0.3
starts with a loss near 120 nats (without norms, the logits of random weights that large
are huge) and formed none by step 750. Without norms at the default scale (0.1) and a
learning rate of 1e-2 (warmup 200 steps), induction forms between steps 1,250 and 1,600,
with one layer-0 head taking the lead as the previous-token head (0.91 of its attention
one back at step 4,000), but with the default weight decay (0.01) that head's
K-composition into the induction head stays at 0.23, below 2/sqrt(d_model) = 0.25.

Weight decay removes the directions of a matrix that the loss does not use, which is what
a composition score (a normalised Frobenius norm) counts against a pair of heads. All else
as above, with weight decay 0.1 induction forms between steps 1,400 and 1,850, one layer-0
head puts 0.93 of its attention one back, and its K-composition into the induction head is
0.265 at step 2,000 and 0.253 at step 4,000 (a second layer-0 head takes a growing share);
with 0.3 the scores of the weights rise fast (0.58 for one pair at step 1,550) but no
induction head formed by step 3,300. Weight decay 0.1 is the recipe of
`bytes-attn-only-2l`; its checkpoints every 50 steps through the change time it.
"""

import dataclasses

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.training.config import TrainConfig
from hookedattn.training.corpus import VOCAB_SIZE


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named recipe: what to build, how to train it, which checkpoints to ship."""

    name: str
    description: str
    model: HookedTransformerConfig
    train: TrainConfig
    shipped_checkpoints: tuple[int, ...] = ()

    def __repr__(self) -> str:
        return f"Preset({self.name!r}: {self.description})"


def _model(name: str, n_layers: int, d_mlp: int | None = None) -> HookedTransformerConfig:
    return HookedTransformerConfig(
        n_layers=n_layers,
        d_model=64,
        n_heads=8,
        d_head=16,
        n_ctx=128,
        d_vocab=VOCAB_SIZE,
        d_mlp=d_mlp,
        attn_only=d_mlp is None,
        act_fn="gelu",
        normalization_type="LN",
        seed=0,
        model_name=name,
    )


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "bytes-attn-only-0l",
            "0 layers: logits from the current token alone, a bigram model",
            _model("bytes-attn-only-0l", 0),
            # Text only: a bigram model of the text is what it is meant to become.
            TrainConfig(steps=1000, synthetic_fraction=0.0),
        ),
        Preset(
            "bytes-attn-only-1l",
            "1 attention-only layer: skip-trigrams and copying, no induction",
            _model("bytes-attn-only-1l", 1),
            TrainConfig(),
        ),
        Preset(
            "bytes-attn-only-2l",
            "2 attention-only layers: an induction circuit (previous-token + induction head)",
            # No norms, a higher learning rate and weight decay: see the module docstring.
            # Evaluated often, and checkpoints every 50 steps through the change.
            _model("bytes-attn-only-2l", 2).replace(normalization_type=None),
            TrainConfig(
                eval_every=25, lr=1e-2, warmup_steps=200, weight_decay=0.1, checkpoint_every=50
            ),
            shipped_checkpoints=tuple(range(1350, 1901, 50)),
        ),
        Preset(
            "bytes-gelu-2l",
            "2 layers with GELU MLPs (d_mlp 256)",
            _model("bytes-gelu-2l", 2, d_mlp=256),
            TrainConfig(),
        ),
    )
}
