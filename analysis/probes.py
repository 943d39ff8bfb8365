"""Linear probes with the controls that make a probe's accuracy mean something.

    data = ProbeData.from_cache(cache, "blocks.1.hook_resid_pre", labels, tokens)
    report = train_probe(data, "logistic")      # or "ridge" for a number per token
    report                                        # held-out score, baselines, selectivity
    report.probe.read(step.cache)                 # one prediction per position, any step

A probe that reads a property off the residual stream may be reading the token instead: a
linear map of a one-hot token embedding can memorise any label per token type. So every
probe is reported with two controls, each trained and scored on the same held-out split:

    random labels   the labels permuted across rows: what a probe learns from nothing
    control task    each token type given one label drawn from the label distribution
                    (Hewitt & Liang 2019, "Designing and Interpreting Probes with Control
                    Tasks"): what a probe learns by memorising tokens
    selectivity     held-out score minus the control task's

Scores are accuracy (logistic) or R^2 (ridge), on held-out rows. Rows are split by group
(the sequence they come from, where known), so that no context is on both sides.

Logistic probes are multinomial logistic regression with an L2 penalty on the weights,
fitted by L-BFGS to convergence on standardised inputs (the scaling is folded back, so the
probe reads raw activations); ridge probes are the closed-form solution. Both in float64.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from einops import rearrange
from jaxtyping import Float, Int, Shaped
from torch import Tensor

KINDS = ("logistic", "ridge")


@dataclasses.dataclass(frozen=True)
class ProbeData:
    """Rows of activations read at `hook_name` (`[row d_in]`, the per-position shape
    flattened), one label each (class ids for a logistic probe, numbers for ridge), the
    token at each row (its type, for the control task) and its group (the sequence it
    comes from, so that a split keeps sequences whole)."""

    activations: Float[Tensor, "row d_in"]
    labels: Shaped[Tensor, " row"]
    tokens: Int[Tensor, " row"]
    groups: Int[Tensor, " row"]
    hook_name: str

    def __post_init__(self) -> None:
        n = self.activations.shape[0]
        for field in ("labels", "tokens", "groups"):
            if getattr(self, field).shape[0] != n:
                raise ValueError(
                    f"{field} has {getattr(self, field).shape[0]} rows but there are {n} "
                    f"activations: give one per row"
                )

    def __repr__(self) -> str:
        rows, d_in = self.activations.shape
        return f"ProbeData({self.hook_name}, rows={rows}, d_in={d_in})"

    @classmethod
    def from_cache(
        cls,
        cache: Any,
        hook_name: str,
        labels: Shaped[Tensor, "batch pos"],
        tokens: Int[Tensor, "batch pos"],
        mask: Tensor | None = None,
    ) -> "ProbeData":
        """The positions of a cache (where `mask` is 1, every one by default) as rows, each
        sequence of the batch its own group."""
        acts = cache[hook_name]
        batch, pos = acts.shape[:2]
        keep = torch.ones(batch, pos, dtype=torch.bool) if mask is None else mask.bool()
        keep = keep.to(acts.device)
        groups = torch.arange(batch, device=acts.device)[:, None].expand(batch, pos)
        flat = rearrange(acts, "batch pos ... -> batch pos (...)")
        return cls(
            flat[keep],
            labels.to(acts.device)[keep],
            tokens.to(acts.device)[keep],
            groups[keep],
            hook_name,
        )

    @classmethod
    def from_store(
        cls,
        store: Any,
        hook_name: str,
        labels: Shaped[Tensor, " row"] | Callable[[Any], Tensor],
        rows: slice | Tensor | None = None,
    ) -> "ProbeData":
        """Rows of an `ActivationStore` (all, or `rows`), labelled by a tensor with one
        label per row, or by a function of the rows' `RowOrigin` (context, position,
        token); each context is its own group."""
        rows = slice(0, len(store)) if rows is None else rows
        origin = store.origin(rows)
        labels = labels(origin) if callable(labels) else labels
        acts = rearrange(store.rows(hook_name, rows), "row ... -> row (...)")
        return cls(acts, labels, origin.token, origin.context, hook_name)


@dataclasses.dataclass(frozen=True)
class Probe:
    """A linear read of the activation at `hook_name`: `act @ weight + bias`.

    Logistic: `[d_in n_classes]`, predicting `classes[argmax]`; ridge: `[d_in n_out]`
    (`n_out` 1 for one number per position), predicting the value itself.
    """

    kind: str
    weight: Float[Tensor, "d_in n_out"]
    bias: Float[Tensor, " n_out"]
    hook_name: str
    classes: Shaped[Tensor, " n_out"] | None = None

    def __repr__(self) -> str:
        return f"Probe({self.kind}, {self.hook_name}, {tuple(self.weight.shape)})"

    def scores(self, acts: Float[Tensor, "*rows d_in"]) -> Float[Tensor, "*rows n_out"]:
        """`acts @ weight + bias`: logits (logistic) or predicted values (ridge)."""
        return acts.to(self.weight.dtype) @ self.weight + self.bias

    def predict(self, acts: Float[Tensor, "*rows d_in"]) -> Shaped[Tensor, "*rows"]:
        """The predicted class (logistic) or value (ridge, one output) of each row."""
        out = self.scores(acts)
        if self.kind == "logistic":
            return self.classes.to(out.device)[out.argmax(dim=-1)]
        return out[..., 0] if out.shape[-1] == 1 else out

    def probabilities(self, acts: Float[Tensor, "*rows d_in"]) -> Float[Tensor, "*rows n_out"]:
        """Each class's probability (logistic probes only)."""
        if self.kind != "logistic":
            raise ValueError("probabilities are for logistic probes; a ridge probe predicts values")
        return self.scores(acts).softmax(dim=-1)

    def read(self, cache: Any) -> Shaped[Tensor, "batch pos"]:
        """The prediction at every position of a cache that holds `hook_name` (a
        generation step's `step.cache`, a `run_with_cache` cache)."""
        acts = rearrange(cache[self.hook_name], "batch pos ... -> batch pos (...)")
        return self.predict(acts)


@dataclasses.dataclass(frozen=True)
class ProbeReport:
    """A probe and its held-out score beside the controls (module docstring).

    `score` is accuracy (logistic) or R^2 (ridge) on the held-out rows, `train_score` on
    the training rows; `random_label_score` and `control_score` are the held-out scores of
    probes trained the same way on permuted labels and on the control task; `chance` is
    the held-out accuracy of always guessing the training rows' commonest label (0 R^2 for
    ridge). `selectivity = score - control_score`.
    """

    probe: Probe
    score: float
    train_score: float
    random_label_score: float
    control_score: float
    chance: float
    n_train: int
    n_test: int

    @property
    def selectivity(self) -> float:
        """Held-out score minus the control task's."""
        return self.score - self.control_score

    def __repr__(self) -> str:
        metric = "accuracy" if self.probe.kind == "logistic" else "R^2"
        return "\n".join(
            [
                f"{self.probe.kind} probe at {self.probe.hook_name} "
                f"({self.n_train} training rows, {self.n_test} held out), {metric}:",
                f"  held out      {self.score:.4f}  (train {self.train_score:.4f})",
                f"  random labels {self.random_label_score:.4f}",
                f"  control task  {self.control_score:.4f}",
                f"  chance        {self.chance:.4f}",
                f"  selectivity   {self.selectivity:.4f}",
            ]
        )


def train_probe(
    data: ProbeData,
    kind: str = "logistic",
    *,
    test_fraction: float = 0.25,
    l2: float = 1e-3,
    seed: int = 0,
) -> ProbeReport:
    """Fit a probe on a held-out split of `data` (`test_fraction` of its groups, drawn
    with `seed`) and report it with its controls, each fitted on the same split."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    generator = torch.Generator().manual_seed(seed)
    train, test = _split(data.groups.cpu(), test_fraction, generator)
    x = data.activations.detach().double().cpu()
    labels = data.labels.detach().cpu()
    _check_finite(x, labels, kind)
    fit = _fit_logistic if kind == "logistic" else _fit_ridge

    def held_out(y: Tensor) -> tuple[Probe, float, float]:
        probe = fit(x[train], y[train], l2, data.hook_name)
        return probe, _score(probe, x[test], y[test]), _score(probe, x[train], y[train])

    probe, score, train_score = held_out(labels)
    shuffled = labels[torch.randperm(len(labels), generator=generator)]
    control = _control_labels(data.tokens.cpu(), labels, generator)
    return ProbeReport(
        probe,
        score,
        train_score,
        held_out(shuffled)[1],
        held_out(control)[1],
        _chance(kind, labels[train], labels[test]),
        int(train.numel()),
        int(test.numel()),
    )


def _check_finite(x: Tensor, labels: Tensor, kind: str) -> None:
    """Refuse rows whose activations (or ridge targets) are not finite: one NaN or inf
    turns every weight NaN, and the report would read as a chance-level probe."""
    bad = ~x.isfinite().all(dim=-1)
    if kind == "ridge" and labels.is_floating_point():
        bad |= ~labels.double().isfinite().reshape(len(labels), -1).all(dim=-1)
    if bool(bad.any()):
        rows = bad.nonzero().flatten().tolist()
        raise ValueError(
            f"{len(rows)} of {len(x)} rows hold values that are not finite (NaN or inf), "
            f"first rows {rows[:8]}: a probe fitted on them is NaN throughout; drop them "
            f"(or find the hook or weight that made them)"
        )


def _split(
    groups: Int[Tensor, " row"], test_fraction: float, generator: torch.Generator
) -> tuple[Int[Tensor, " n_train"], Int[Tensor, " n_test"]]:
    """Row indices of the training and held-out sides, whole groups on each."""
    unique = groups.unique()
    if len(unique) < 2:
        raise ValueError("a held-out split needs rows from at least two groups (sequences)")
    order = unique[torch.randperm(len(unique), generator=generator)]
    n_test = min(max(1, round(test_fraction * len(unique))), len(unique) - 1)
    is_test = torch.isin(groups, order[:n_test])
    return (~is_test).nonzero()[:, 0], is_test.nonzero()[:, 0]


def _control_labels(
    tokens: Int[Tensor, " row"], labels: Tensor, generator: torch.Generator
) -> Tensor:
    """One label per token type, drawn from the labels' empirical distribution; each row
    gets its token's (Hewitt & Liang's control task)."""
    types, row_type = tokens.unique(return_inverse=True)
    drawn = torch.randint(0, len(labels), (len(types),), generator=generator)
    return labels[drawn][row_type]


def _chance(kind: str, train: Tensor, test: Tensor) -> float:
    if kind == "ridge":
        return 0.0
    values, counts = train.unique(return_counts=True)
    return float((test == values[counts.argmax()]).double().mean())


def _score(probe: Probe, x: Float[Tensor, "row d_in"], y: Tensor) -> float:
    """Accuracy (logistic) or R^2 against the mean of `y` itself (ridge)."""
    if probe.kind == "logistic":
        return float((probe.predict(x) == y).double().mean())
    target = y.double().reshape(len(y), -1)
    residual = ((probe.scores(x) - target) ** 2).sum()
    total = ((target - target.mean(dim=0)) ** 2).sum()
    return float(1 - residual / total)


def _standardised(x: Float[Tensor, "row d_in"]) -> tuple[Tensor, Tensor, Tensor]:
    mean, std = x.mean(dim=0), x.std(dim=0)
    std = torch.where(std > 0, std, torch.ones_like(std))  # a constant feature stays 0
    return (x - mean) / std, mean, std


def _fit_logistic(x: Tensor, y: Tensor, l2: float, hook_name: str) -> Probe:
    """Multinomial logistic regression: mean cross-entropy + `l2/2 |W|^2`, by L-BFGS with
    the gradient written out (`_logistic_objective`)."""
    classes, target = y.unique(return_inverse=True)
    z, mean, std = _standardised(x)
    W = torch.zeros(z.shape[1], len(classes), dtype=torch.float64)
    b = torch.zeros(len(classes), dtype=torch.float64)
    optimizer = torch.optim.LBFGS(
        [W, b], max_iter=500, tolerance_grad=1e-8, tolerance_change=1e-14,
        history_size=20, line_search_fn="strong_wolfe",
    )  # fmt: skip

    def objective() -> Tensor:
        loss, W.grad, b.grad = _logistic_objective(z, target, W, b, l2)
        return loss

    optimizer.step(objective)
    W = W / std[:, None]
    return Probe("logistic", W, b - mean @ W, hook_name, classes)


def _logistic_objective(
    z: Float[Tensor, "row d_in"], target: Int[Tensor, " row"], W: Tensor, b: Tensor, l2: float
) -> tuple[Tensor, Tensor, Tensor]:
    """What a logistic probe minimises on standardised inputs `z`, and its gradients with
    respect to `W` and `b`: `softmax(z W + b) - onehot(target)`, read back through `z`."""
    logits = z @ W + b
    loss = torch.nn.functional.cross_entropy(logits, target) + 0.5 * l2 * (W**2).sum()
    residual = logits.softmax(dim=-1)
    residual[torch.arange(len(target)), target] -= 1.0
    residual /= len(target)
    return loss, z.T @ residual + l2 * W, residual.sum(dim=0)


def _fit_ridge(x: Tensor, y: Tensor, l2: float, hook_name: str) -> Probe:
    """`min |X W + b - y|^2 + l2 |W|^2` in closed form (the intercept unpenalised)."""
    target = y.double().reshape(len(y), -1)
    x_mean, y_mean = x.mean(dim=0), target.mean(dim=0)
    xc, yc = x - x_mean, target - y_mean
    gram = xc.T @ xc + l2 * torch.eye(x.shape[1], dtype=torch.float64)
    W = torch.linalg.solve(gram, xc.T @ yc)
    return Probe("ridge", W, y_mean - x_mean @ W, hook_name)


class ProbeReadout:
    """A probe read at every forward of a generation, through a hook.

        readout = ProbeReadout(probe)
        with model.hooks(fwd_hooks=readout.hooks()):
            model.generate(prompt, 20)
        readout.values          # one [batch pos] tensor per forward: the prompt, then each token
        readout.joined()        # [batch pos] over the prompt and the generated positions read

    The hook reads the activation and returns nothing, so the generation is unchanged.
    """

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.values: list[Tensor] = []

    def hooks(self) -> list[tuple[str, Callable]]:
        """The reading hook, for `model.hooks(fwd_hooks=...)`."""
        return [(self.probe.hook_name, self._read)]

    def _read(self, x: Tensor, hook: Any) -> None:
        acts = rearrange(x.detach(), "batch pos ... -> batch pos (...)")
        self.values.append(self.probe.predict(acts))

    def joined(self) -> Shaped[Tensor, "batch pos"]:
        """Every reading side by side along positions."""
        return torch.cat(self.values, dim=1)
