"""Steering vectors: a direction added to one hook point's activation, at chosen layers and
positions, with a scale, while the model runs or writes.

    v = SteeringVector.from_difference_of_means(model, happy, sad, "resid_pre", layer=1)
    with model.hooks(fwd_hooks=v.hooks(scale=4.0, positions="generated")):
        text = model.generate("I feel", 20)
    sweep = steering_sweep(model, v, tokens, scales=[0, 2, 4, 8], metric=my_metric)
    v.save("happy.safetensors"); v = SteeringVector.load("happy.safetensors")

A vector is made from two sets of prompts (the difference of their mean activations: Turner
et al. 2023, "Activation Addition"; Panickssery et al. 2023, "contrastive activation
addition"), from one pair of prompts position by position (ActAdd: row `i` is added at
position `i`), from an SAE's decoder direction for one feature, or given. It carries where
it came from: the model's weights hash (`hookedattn.store.weights_sha256`), the hook point,
the prompts and the method; `save` writes it into the safetensors header.

Positions are those of the sequence: `"all"`, `"prompt"` and `"generated"` (told apart by
`hookedattn.generation_position()` during `generate`; in any other forward every position
is a prompt position), or a list of positions. The hooks are plain forward hooks, so a
steered `generate` runs the hooked decode step, and a steered `run_with_hooks` over the
generated tokens gives the generation's logits exactly.
"""

import dataclasses
import json
import math
import numbers
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from einops import einsum
from jaxtyping import Float, Shaped
from torch import Tensor

from hookedattn import generation_position
from hookedattn.core import names
from hookedattn.store import weights_sha256

Positions = str | Sequence[int]
_METADATA_KEY = "hookedattn.steering"
_FORMAT = 1


def _scale(scale: Any) -> float:
    """`scale` as a float: a real number (a 0-d tensor too), finite (a `ValueError`
    otherwise: a NaN scale makes every later logit NaN)."""
    if isinstance(scale, Tensor) and scale.numel() == 1 and not scale.is_complex():
        scale = scale.item()
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number, got {scale!r}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    return float(scale)


@dataclasses.dataclass(frozen=True)
class SteeringVector:
    """A direction at a hook point: `vector` has the activation's shape at one position
    (`[d_model]` for the residual stream, `[head d_head]` for `z`), or with `aligned` one
    such row per position, `[pos ...]`, added at the sequence's first positions (ActAdd).

    `site` is a short hook name with its `layer` (`"resid_pre"`, 3), so that `hooks(...,
    layers=)` can move it to other blocks; or a full hook name with `layer=None`.
    `provenance` records how it was made (JSON-able: method, prompts, model hash).
    """

    vector: Shaped[Tensor, "..."]
    site: str
    layer: int | None = None
    aligned: bool = False
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        name = _full_name(self.site, self.layer)  # checks the site and layer
        if names.pos_axis(name) != 1:
            raise ValueError(
                f"{name} is [batch head query_pos key_pos]: steer an activation with one "
                f"position axis after the batch (resid_*, attn_out, z, mlp_out, ...)"
            )
        if self.aligned and self.vector.ndim < 2:
            raise ValueError(f"an aligned vector is [pos ...], got {tuple(self.vector.shape)}")
        if not isinstance(self.vector, Tensor) or not self.vector.is_floating_point():
            kind = self.vector.dtype if isinstance(self.vector, Tensor) else type(self.vector)
            raise TypeError(
                f"a steering vector is a real floating-point tensor, got {kind} (a complex "
                f"vector would lose its imaginary part when added to a real activation)"
            )
        if not bool(self.vector.isfinite().all()):
            raise ValueError(
                f"the steering vector at {name} holds {int((~self.vector.isfinite()).sum())} "
                f"values that are not finite (NaN or inf): added to the stream they make every "
                f"later logit NaN"
            )

    @property
    def hook_name(self) -> str:
        """The full name of the hook point the vector belongs to."""
        return self.name_at(self.layer)

    def name_at(self, layer: int | None) -> str:
        """The full hook name of this vector's site in block `layer`."""
        if "." in self.site and layer is not None and layer != self.layer:
            raise ValueError(
                f"{self.site!r} is a full hook name: it cannot move to layer {layer}; give "
                f"the site as a short name with its layer (e.g. 'resid_pre', 3)"
            )
        return _full_name(self.site, layer)

    def __repr__(self) -> str:
        shape = "x".join(str(n) for n in self.vector.shape)
        how = self.provenance.get("method", "given")
        return f"SteeringVector({self.hook_name}, [{shape}], {how}, norm={self.norm():.4g})"

    def norm(self) -> float:
        """The vector's L2 norm (over every row, for an aligned one)."""
        return float(self.vector.double().norm())

    # ----------------------------------------------------------------- making one
    @classmethod
    def from_difference_of_means(
        cls,
        model: Any,
        positive: Any,
        negative: Any,
        site: str,
        layer: int | None = None,
        position: int | str = -1,
    ) -> "SteeringVector":
        """`mean(act(positive)) - mean(act(negative))` at the hook point: each prompt's
        activation at its `position` (an int: -1 is each prompt's last real token) or
        averaged over its real tokens (`"mean"`). Prompts are strings or `[batch pos]` ids."""
        hook_name = _full_name(site, layer)
        means = [_mean_activation(model, p, hook_name, position) for p in (positive, negative)]
        provenance = _provenance(model, "difference of means", hook_name, positive, negative)
        provenance["position"] = position
        return cls(means[0] - means[1], site, layer, False, provenance)

    @classmethod
    def from_prompt_pair(
        cls, model: Any, plus: str, minus: str, site: str, layer: int | None = None
    ) -> "SteeringVector":
        """ActAdd (Turner et al. 2023): `act(plus) - act(minus)` position by position, the
        shorter prompt padded at its end with spaces as the paper does. The vector is
        aligned: row `i` is added at position `i` of the steered sequence."""
        hook_name = _full_name(site, layer)
        tokens = [model.to_tokens(p)[0] for p in (plus, minus)]
        width = max(len(t) for t in tokens)
        space = model.to_single_token(" ")
        tokens = [torch.cat([t, t.new_full((width - len(t),), space)]) for t in tokens]
        _, cache = model.run_with_cache(torch.stack(tokens), names_filter=hook_name)
        acts = cache[hook_name]
        provenance = _provenance(model, "ActAdd prompt pair", hook_name, [plus], [minus])
        return cls(acts[0] - acts[1], site, layer, True, provenance)

    @classmethod
    def from_sae_feature(
        cls, sae: Any, feature: int, site: str | None = None, layer: int | None = None
    ) -> "SteeringVector":
        """The decoder direction of one SAE (or transcoder) feature, `W_dec[feature]`, at the
        hook point it writes to (`sae.cfg.hook_name`, or `site` and `layer`)."""
        if not 0 <= feature < sae.W_dec.shape[0]:
            raise ValueError(f"feature {feature} is out of range 0..{sae.W_dec.shape[0] - 1}")
        site = site or sae.cfg.hook_name
        provenance = {"method": "SAE feature", "feature": feature, "sae_hook": sae.cfg.hook_name}
        provenance["hook_name"] = _full_name(site, layer)
        return cls(sae.W_dec[feature].detach().clone(), site, layer, False, provenance)

    # ----------------------------------------------------------------- applying it
    def hooks(
        self,
        scale: Any = 1.0,  # a real number; anything else gets `_scale`'s own error
        positions: Positions = "all",
        layers: Sequence[int] | None = None,
    ) -> list[tuple[str, Callable]]:
        """Forward hooks adding `scale * vector` at the vector's hook point (or the same
        site in each of `layers`), at `positions`: for `model.hooks(fwd_hooks=...)`,
        `run_with_hooks`, or `run_with_cache` inside `model.hooks`."""
        where = [self.layer] if layers is None else list(layers)
        hook = _SteeringHook(self, _scale(scale), _position_rule(positions), positions == "all")
        return [(self.name_at(layer), hook) for layer in where]

    # ----------------------------------------------------------------- files
    def save(self, path: str | Path) -> Path:
        """Write the vector and its provenance to one safetensors file."""
        path = Path(path)
        record = {
            "format": _FORMAT,
            "site": self.site,
            "layer": self.layer,
            "aligned": self.aligned,
            "provenance": self.provenance,
        }
        metadata = {_METADATA_KEY: json.dumps(record, sort_keys=True)}
        safetensors.torch.save_file(
            {"vector": self.vector.detach().contiguous().cpu()}, str(path), metadata
        )
        return path

    @classmethod
    def load(cls, path: str | Path, model: Any = None) -> "SteeringVector":
        """A vector written by `save`; with `model`, refused unless its weights are the
        ones the vector was made from (by their hash)."""
        with safetensors.safe_open(str(path), "pt") as f:
            metadata = f.metadata() or {}
            if _METADATA_KEY not in metadata:
                raise ValueError(f"{path} holds no steering vector (no {_METADATA_KEY} record)")
            vector = f.get_tensor("vector")
        record = json.loads(metadata[_METADATA_KEY])
        out = cls(vector, record["site"], record["layer"], record["aligned"], record["provenance"])
        if model is not None:
            out.check_model(model)
        return out

    def check_model(self, model: Any) -> None:
        """Raise a `ValueError` unless `model`'s weights hash to the recorded ones."""
        recorded = self.provenance.get("model_weights_sha256")
        if recorded is None:
            raise ValueError("this steering vector records no model weights hash to check")
        actual = weights_sha256(model)
        if actual != recorded:
            raise ValueError(
                f"this steering vector was made from a model with weights sha256 "
                f"{recorded[:12]}; this model's weights hash to {actual[:12]}"
            )


def _full_name(site: str, layer: int | None) -> str:
    """The full hook name of a short `site` in block `layer`, or a full name as it is."""
    return names.get_act_name(site) if "." in site else names.get_act_name(site, layer)


def _provenance(model: Any, method: str, hook_name: str, positive: Any, negative: Any) -> dict:
    return {
        "method": method,
        "hook_name": hook_name,
        "model_weights_sha256": weights_sha256(model),
        "positive": _prompt_record(positive),
        "negative": _prompt_record(negative),
    }


def _prompt_record(prompts: Any) -> list:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, Tensor):
        return prompts.tolist()
    return list(prompts)


def _mean_activation(model: Any, prompts: Any, hook_name: str, position: int | str) -> Tensor:
    """The mean over prompts of the activation at each one's `position` (or mean)."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if isinstance(prompts, Tensor):
        tokens, mask = prompts, torch.ones_like(prompts)
    else:
        batch = model.tokenize(list(prompts))
        tokens, mask = batch.tokens, batch.attention_mask
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=hook_name)
    acts = cache[hook_name]
    mask = mask.to(acts.device)
    if position == "mean":
        weights = mask.to(acts.dtype) / mask.sum(dim=1, keepdim=True)
        per_prompt = einsum(weights, acts, "batch pos, batch pos ... -> batch ...")
    elif isinstance(position, int) and not isinstance(position, bool):
        lengths = mask.sum(dim=1)
        index = lengths - 1 if position == -1 else torch.full_like(lengths, position)
        if bool((index < 0).any() or (index >= lengths).any()):
            raise ValueError(f"position {position} is outside some prompt's real tokens")
        per_prompt = acts[torch.arange(len(index)), index]
    else:
        raise ValueError(f"position must be an int or 'mean', got {position!r}")
    return per_prompt.mean(dim=0)


def _position_rule(positions: Positions) -> Callable[[Tensor, int | None], Tensor]:
    """A function of the absolute positions of a forward (and the prompt's length, None
    outside generation) giving which of them are steered."""
    # Outside generation (`n_prompt` None) every position is a prompt position.
    if positions == "all":
        return lambda at, n_prompt: torch.ones_like(at, dtype=torch.bool)
    if positions == "prompt":
        return lambda at, n_prompt: at < n_prompt if n_prompt is not None else at >= 0
    if positions == "generated":
        return lambda at, n_prompt: at >= n_prompt if n_prompt is not None else at < 0
    if isinstance(positions, str) or not all(
        isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in positions
    ):
        raise ValueError(
            f"positions must be 'all', 'prompt', 'generated' or a list of positions >= 0, got "
            f"{positions!r}"
        )
    chosen = torch.tensor(sorted(set(positions)), dtype=torch.long)
    return lambda at, n_prompt: torch.isin(at, chosen.to(at.device))


class _SteeringHook:
    """Adds `scale * vector` at the chosen positions of the activation it is called with."""

    def __init__(
        self, steering: SteeringVector, scale: float, rule: Callable, everywhere: bool
    ) -> None:
        self.steering, self.scale, self.rule = steering, scale, rule
        self.everywhere = everywhere and not steering.aligned  # one vector at every position
        self.__name__ = f"steering {steering.hook_name} x{scale:g}"

    def __call__(self, x: Float[Tensor, "batch pos ..."], hook: Any) -> Tensor:
        vector = self.steering.vector.to(device=x.device, dtype=x.dtype)
        shape = tuple(vector.shape[1:] if self.steering.aligned else vector.shape)
        if tuple(x.shape[2:]) != shape:
            raise ValueError(
                f"the steering vector is {shape} per position, but the activation at "
                f"{hook.name} is {tuple(x.shape)} (batch pos ...)"
            )
        if self.everywhere:
            return x + self.scale * vector
        state = generation_position()
        offset, n_prompt = (0, None) if state is None else (state.offset, state.n_prompt)
        at = torch.arange(offset, offset + x.shape[1], device=x.device)
        steered = self.rule(at, n_prompt)
        if self.steering.aligned:  # row i at position i, where the sequence has one
            steered = steered & (at < vector.shape[0])
            rows = vector[at.clamp(max=vector.shape[0] - 1)]
        else:
            rows = vector.expand(x.shape[1], *shape)
        weights = steered.to(x.dtype).reshape(-1, *[1] * len(shape))
        return x + self.scale * weights * rows


# --------------------------------------------------------------------------- sweeps


@dataclasses.dataclass(frozen=True)
class SteeringSweep:
    """A metric and the KL divergence from the unsteered model, at each scale.

    `kl[i]` is `KL(unsteered || steered)` of the next-token distributions, averaged over
    every real position of every prompt; `metric[i]` is the metric of the steered logits.
    """

    scales: Float[Tensor, " scale"]
    metric: Float[Tensor, " scale"]
    kl: Float[Tensor, " scale"]
    hook_names: tuple[str, ...]

    def __repr__(self) -> str:
        rows = [f"SteeringSweep at {', '.join(self.hook_names)}", "   scale      metric        KL"]
        for s, m, k in zip(
            self.scales.tolist(), self.metric.tolist(), self.kl.tolist(), strict=True
        ):
            rows.append(f"  {s:6.3g}  {m:10.4g}  {k:8.4g}")
        return "\n".join(rows)


def _metric_value(value: Any, scale: float) -> float:
    """A metric's value as a float: one number (a `ValueError` naming the shape otherwise)."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"the metric returned a tensor of shape {tuple(value.shape)} at scale {scale}; "
                f"a steering sweep reports one number per scale: reduce it (e.g. .mean())"
            )
        value = value.item()
    return float(value)


def steering_sweep(
    model: Any,
    steering: SteeringVector,
    tokens: Any,
    scales: Sequence[float],
    metric: Callable[[Tensor], Tensor],
    *,
    positions: Positions = "all",
    layers: Sequence[int] | None = None,
    attention_mask: Tensor | None = None,
) -> SteeringSweep:
    """Run `tokens` steered at each of `scales` (one forward each) and report `metric` of
    the logits (a function of `[batch pos d_vocab_out]` logits to a number) and the KL from
    the unsteered logits (`KL(p || q)`, `p` unsteered), averaged over real positions."""
    if isinstance(tokens, str | list) and attention_mask is None:
        batch = model.tokenize(tokens)
        tokens, attention_mask = batch.tokens, batch.attention_mask
    with torch.no_grad():
        clean = model(tokens, attention_mask=attention_mask).log_softmax(dim=-1).double()
        values, kls = [], []
        for scale in scales:
            hooks = steering.hooks(scale, positions, layers)
            logits = model.run_with_hooks(tokens, attention_mask=attention_mask, fwd_hooks=hooks)
            values.append(_metric_value(metric(logits), scale))
            steered = logits.log_softmax(dim=-1).double()
            kl = (clean.exp() * (clean - steered)).sum(dim=-1)  # batch pos
            real = torch.ones_like(kl) if attention_mask is None else attention_mask.double()
            kls.append(float((kl * real).sum() / real.sum()))
    names_used = tuple(dict.fromkeys(name for name, _ in steering.hooks(1.0, positions, layers)))
    return SteeringSweep(
        torch.tensor(list(scales), dtype=torch.float64),
        torch.tensor(values, dtype=torch.float64),
        torch.tensor(kls, dtype=torch.float64),
        names_used,
    )
