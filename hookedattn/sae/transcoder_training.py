"""Training transcoders on pairs of points of an `ActivationStore`: each MLP's input and output.

    store = ActivationStore(collect_activations(model, None, names=[
        "blocks.0.ln2.hook_out", "blocks.0.hook_mlp_out", ...], out="acts/").path)
    tc = train_transcoder(store, 0, d_sae=1024, k=16, steps=2000)        # one layer
    tc = train_transcoder(store, 0, d_sae=1024, l1=2.0, skip=True, ...)   # a skip transcoder
    clt = train_cross_layer_transcoder(store, 2, d_sae=512, k=16, ...)    # every layer at once

Rows of the same store row number come from the same token, and `store.batches` draws the
same rows for every name under one seed, so a batch of inputs and the batch of outputs
drawn with it are pairs. Inputs and outputs are normalised as for an SAE
(`hookedattn.sae.training`): centred on their mean and divided by one scalar each, the
root of the mean per-feature variance. Loss: `Σ_L |y_L - recons_L|^2` (summed over
`d_out`, averaged over rows, summed over the layers predicted) plus the variant's term
(`hookedattn.sae._transcoder_objectives`). After each Adam step every feature's decoder
(over all the layers it writes to) is renormalised to unit norm and JumpReLU thresholds
kept non-negative. Dead features (silent for `dead_window` steps) are resampled every
`resample_every` steps if asked (`hookedattn.sae._transcoder_resampling`).

At the end the normalisation is folded into the weights (`_fold`): the encoder reads the
model's activations, the decoders write the model's units, and the feature activations
stay in the units they were trained in (a feature's activation of 1 is one normalised
input scale). Everything random comes from `seed`; with one thread a run is repeatable to
the byte.
"""

import dataclasses
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from hookedattn.sae import _transcoder_objectives as _objectives
from hookedattn.sae._training_loop import TrainingStep, epochs, report
from hookedattn.sae._transcoder_resampling import resample_dead
from hookedattn.sae.cross_layer import CrossLayerTranscoder
from hookedattn.sae.transcoder import Transcoder
from hookedattn.sae.transcoder_config import CrossLayerTranscoderConfig, TranscoderConfig
from hookedattn.sae.transcoder_set import TranscoderSet

Rows = dict[int, Tensor]  # a batch per layer, [batch d]


@dataclasses.dataclass(frozen=True)
class _Settings:
    """The training arguments both kinds share."""

    steps: int
    l1: float | None
    k: int | None
    l0: float | None
    bandwidth: float
    threshold: float
    resample_every: int | None
    batch_size: int
    lr: float
    seed: int
    dead_window: int
    log_every: int
    progress: bool
    log: list | None

    @property
    def activation(self) -> str:
        """The activation the penalty arguments choose."""
        return "relu" if self.l1 is not None else "topk" if self.k is not None else "jumprelu"


def train_transcoder(
    store: Any,
    layer: int,
    *,
    d_sae: int,
    steps: int,
    l1: float | None = None,
    k: int | None = None,
    l0: float | None = None,
    skip: bool = False,
    in_name: str | None = None,
    out_name: str | None = None,
    bandwidth: float = 0.05,
    threshold: float = 0.05,
    resample_every: int | None = None,
    batch_size: int = 1024,
    lr: float = 1e-3,
    seed: int = 0,
    dead_window: int = 100,
    log_every: int = 10,
    progress: bool = True,
    log: list[TrainingStep] | None = None,
) -> Transcoder:
    """Train layer `layer`'s transcoder on `store` for `steps` Adam steps; returned in
    float32, reading and writing the model's units.

    It reads the rows `in_name` (default `blocks.{layer}.ln2.hook_out`, the MLP's input) and
    predicts `out_name` (default `blocks.{layer}.hook_mlp_out`). One of `l1` (ReLU, L1
    penalty), `k` (TopK) or `l0` (JumpReLU, L0 penalty; thresholds start at `threshold`
    and learn through a straight-through estimator of width `bandwidth`, in normalised
    units). `skip=True` trains a skip transcoder. Logging, resampling and batches as for
    `train_sae`; `log` collects a `TrainingStep` every `log_every` steps.
    """
    s = _settings(locals())
    in_name = in_name or f"blocks.{layer}.ln2.hook_out"
    out_name = out_name or f"blocks.{layer}.hook_mlp_out"
    d_in, d_out = _width(store, in_name), _width(store, out_name)
    cfg = TranscoderConfig(d_in, d_sae, d_out, in_name, out_name, s.activation, k, skip, seed=seed)
    tc = Transcoder(cfg)
    _train(TranscoderSet([tc]), {layer: in_name}, {layer: out_name}, store, s)
    return tc


def train_cross_layer_transcoder(
    store: Any,
    n_layers: int,
    *,
    d_sae: int,
    steps: int,
    l1: float | None = None,
    k: int | None = None,
    l0: float | None = None,
    feature_input_hook: str = "ln2.hook_out",
    feature_output_hook: str = "hook_mlp_out",
    bandwidth: float = 0.05,
    threshold: float = 0.05,
    resample_every: int | None = None,
    batch_size: int = 1024,
    lr: float = 1e-3,
    seed: int = 0,
    dead_window: int = 100,
    log_every: int = 10,
    progress: bool = True,
    log: list[TrainingStep] | None = None,
) -> CrossLayerTranscoder:
    """Train a cross-layer transcoder over blocks `0..n_layers-1` (`d_sae` features per
    layer) on `store`, which holds `blocks.L.<feature_input_hook>` and
    `blocks.L.<feature_output_hook>` of every layer. Arguments as for `train_transcoder`;
    the logged loss, L0 and FVE are over all layers together."""
    s = _settings(locals())
    if not isinstance(n_layers, int) or isinstance(n_layers, bool) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive int, got {n_layers!r}")
    ins = {layer: f"blocks.{layer}.{feature_input_hook}" for layer in range(n_layers)}
    outs = {layer: f"blocks.{layer}.{feature_output_hook}" for layer in range(n_layers)}
    widths_in = {_width(store, n) for n in ins.values()}
    widths_out = {_width(store, n) for n in outs.values()}
    if len(widths_in) != 1 or len(widths_out) != 1:
        raise ValueError(
            f"every layer's points must share one width, got {widths_in}, {widths_out}"
        )
    cfg = CrossLayerTranscoderConfig(
        n_layers, widths_in.pop(), d_sae, widths_out.pop(), s.activation, k,
        feature_input_hook, feature_output_hook, seed=seed,
    )  # fmt: skip
    clt = CrossLayerTranscoder(cfg)
    _train(TranscoderSet(clt), ins, outs, store, s)
    return clt


def _settings(args: dict) -> _Settings:
    fields = {f.name for f in dataclasses.fields(_Settings)}
    s = _Settings(**{name: value for name, value in args.items() if name in fields})
    given = {n: v for n, v in (("l1", s.l1), ("k", s.k), ("l0", s.l0)) if v is not None}
    if len(given) != 1:
        raise ValueError(
            f"give one of l1 (a ReLU transcoder with an L1 penalty), k (TopK) or l0 (JumpReLU "
            f"with an L0 penalty), got {given or 'none'}"
        )
    for field in ("l1", "l0", "bandwidth", "threshold", "lr"):
        value = getattr(s, field)
        if value is not None and not (isinstance(value, int | float) and value >= 0):
            raise ValueError(f"{field} must be a non-negative number, got {value!r}")
    for field in ("steps", "batch_size", "dead_window", "log_every", "d_sae"):
        value = args[field] if field == "d_sae" else getattr(s, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{field} must be a positive int, got {value!r}")
    every = s.resample_every
    if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
        raise ValueError(f"resample_every must be a positive int or None, got {every!r}")
    return s


def _width(store: Any, name: str) -> int:
    shape = store.row_shape(name)
    if len(shape) != 1:
        raise ValueError(f"a transcoder reads and writes vectors; the rows of {name} are {shape}")
    return shape[0]


@dataclasses.dataclass(frozen=True)
class _Normalisation:
    """Per name: the mean subtracted from each row and the one scale it is divided by."""

    mean: dict[int, Tensor]
    scale: dict[int, float]

    def apply(self, rows: dict[int, Tensor]) -> dict[int, Tensor]:
        """Each layer's rows, centred and scaled."""
        return {i: (x.float() - self.mean[i]) / self.scale[i] for i, x in rows.items()}


def _normalisation(store: Any, names: dict[int, str]) -> _Normalisation:
    stats = {layer: store.stats(name) for layer, name in names.items()}
    mean = {layer: st.mean.float() for layer, st in stats.items()}
    return _Normalisation(mean, {layer: float(st.var.mean().sqrt()) for layer, st in stats.items()})


def _train(
    tset: TranscoderSet, ins: dict[int, str], outs: dict[int, str], store: Any, s: _Settings
) -> None:
    """The training loop (module docstring), in place on `tset`'s modules."""
    norm_in, norm_out = _normalisation(store, ins), _normalisation(store, outs)
    objective = _objective(tset, s)
    params = [p for module in tset.modules for p in module.parameters()]
    optimizer = torch.optim.Adam(params, lr=s.lr)
    since_fired = {layer: torch.zeros(tset.d_sae(layer), dtype=torch.long) for layer in tset.layers}
    bar = tqdm(total=s.steps, disable=not s.progress, desc="transcoder", unit="step")
    names = [*ins.values(), *outs.values()]
    for step, batches in enumerate(epochs(store, names, s.batch_size, s.seed, s.steps)):
        xs = norm_in.apply(dict(zip(ins, batches[: len(ins)], strict=True)))
        ys = norm_out.apply(dict(zip(outs, batches[len(ins) :], strict=True)))
        loss, acts, preds = _step(tset, optimizer, xs, ys, objective)
        for layer in tset.layers:
            fired = acts[layer].amax(0) > 0  # activations are never negative
            since_fired[layer] = torch.where(fired, 0, since_fired[layer] + 1)
        if s.resample_every and (step + 1) % s.resample_every == 0 and step + 1 < s.steps:
            residuals = {layer: ys[layer] - preds[layer] for layer in tset.layers}
            for layer in tset.layers:
                dead = since_fired[layer] >= s.dead_window
                seed = (s.seed << 32) + (step << 8) + layer
                revived = resample_dead(tset, layer, optimizer, xs[layer], residuals, dead,
                                        seed, s.activation)  # fmt: skip
                since_fired[layer] = torch.where(revived, 0, since_fired[layer])
        if step % s.log_every == 0 or step == s.steps - 1:
            report(bar, s.log, _measure(step, s, loss, acts, ys, preds, since_fired))
        bar.update()
    bar.close()
    _fold(tset, norm_in, norm_out)


@dataclasses.dataclass(frozen=True)
class _Objective:
    activate: Any
    penalty: Any


def _objective(tset: TranscoderSet, s: _Settings) -> _Objective:
    """The activation used in training and the penalty, chosen once before the loop."""
    if s.l1 is not None:
        return _Objective(_objectives.own_activation, _objectives.L1Penalty(s.l1))
    if s.l0 is not None:
        with torch.no_grad():
            for layer in tset.layers:
                tset.activation(layer).threshold.fill_(s.threshold)
        return _Objective(_objectives.JumpReLUActivation(s.bandwidth),
                          _objectives.L0Penalty(s.l0, s.bandwidth))  # fmt: skip
    return _Objective(_objectives.own_activation, _objectives.no_penalty)


def _step(
    tset: TranscoderSet,
    optimizer: torch.optim.Optimizer,
    xs: Rows,
    ys: Rows,
    objective: _Objective,
) -> tuple[Tensor, Rows, Rows]:
    """One Adam step; the loss, each layer's activations and predictions, detached."""
    pres = {layer: tset.pre_activations(layer, xs[layer]) for layer in tset.layers}
    acts = {layer: objective.activate(tset, layer, pres[layer]) for layer in tset.layers}
    preds = {layer: tset.decode(layer, acts, xs[layer]) for layer in tset.layers}
    loss = sum((preds[layer] - ys[layer]).pow(2).sum(-1).mean() for layer in tset.layers)
    loss = loss + sum(objective.penalty(tset, i, pres[i], acts[i]) for i in tset.layers)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    _constrain(tset)
    detached = {layer: a.detach() for layer, a in acts.items()}
    return loss.detach(), detached, {layer: p.detach() for layer, p in preds.items()}


@torch.no_grad()
def _constrain(tset: TranscoderSet) -> None:
    """Unit decoders per feature (over every layer it writes to); non-negative thresholds."""
    for layer in tset.layers:
        decoders = tset.feature_decoders(layer)
        norms = decoders.flatten(1).norm(dim=-1).clamp(min=1e-12)
        decoders.div_(norms.reshape(-1, *[1] * (decoders.ndim - 1)))
        for parameter in tset.activation(layer).parameters():
            parameter.clamp_(min=0)


@torch.no_grad()
def _measure(
    step: int, s: _Settings, loss: Tensor, acts: Rows, ys: Rows, preds: Rows, since_fired: Rows
) -> TrainingStep:
    """The numbers logged after step `step`, over all the set's layers together."""
    l0 = sum(float((a > 0).sum(-1).float().mean()) for a in acts.values())
    residual = sum(float((ys[i] - preds[i]).pow(2).sum()) for i in ys)
    total = sum(float((ys[i] - ys[i].mean(0)).pow(2).sum()) for i in ys)
    dead = sum(int((f >= s.dead_window).sum()) for f in since_fired.values())
    return TrainingStep(
        step, (step + 1) * s.batch_size, float(loss), l0, 1 - residual / total, dead
    )


@torch.no_grad()
def _fold(tset: TranscoderSet, norm_in: _Normalisation, norm_out: _Normalisation) -> None:
    """Make the set read `x` and write `y` where it was trained on `(x - μx) / sx` and
    `(y - μy) / sy`: `W_enc /= sx`, `b_enc -= μx @ W_enc`, each decoder into layer L times
    `sy_L`, `W_skip *= sy / sx`, `b_dec = sy · b_dec + μy - μx @ W_skip.T`. The activations
    (and so JumpReLU thresholds) are unchanged; the prediction is `sy · recons + μy`."""
    for layer in tset.layers:
        W_enc, b_enc = tset.encoder(layer)
        W_enc.div_(norm_in.scale[layer])
        b_enc.sub_(norm_in.mean[layer] @ W_enc)
    for layer in tset.layers:
        sy, sx = norm_out.scale[layer], norm_in.scale[layer]
        for source in tset.sources(layer):
            tset.decoder(source, layer).mul_(sy)
        b_dec = tset.b_dec(layer)
        b_dec.mul_(sy).add_(norm_out.mean[layer])
        W_skip = tset.W_skip(layer)
        if W_skip is not None:
            W_skip.mul_(sy / sx)
            b_dec.sub_(norm_in.mean[layer] @ W_skip.T)
