"""What one piece of a tiny twin computes, found by calling it (`_anatomy`'s probes).

    norms        called on an input as small as an epsilon (so that a wrong one shows):
                 RMSNorm with gain `w`, Gemma's `1 + w` or none; LayerNorm with or without
                 bias, Nemotron's `1 + w`, or without parameters; the epsilon the module
                 keeps, else the first that matches of the config's and the usual ones
    activations  called on [-6, 6] against ours (`components.mlp.ACTIVATIONS`)
    scalars      the one number a tensor is a multiple of another by, and the config field
                 a number is a function of (`Scale`: so that it carries over from the
                 twin's sizes to the checkpoint's)

Each answers with our name for what it found, or a ValueError naming the piece.
"""

import dataclasses
import itertools
import math
from typing import Any

import torch
from torch import Tensor, nn

from hookedattn.core.components.mlp import ACTIVATIONS
from hookedattn.core.components.xielu import XIELU

# Ours, for norms: RMSNorm `x / rms(x) * w`, Gemma's `* (1 + w)`, without parameters
# (nanochat); LayerNorm, Nemotron's with `1 + w`, without parameters (OLMo 1).
NORM_KINDS = ("rms", "rms_one_plus", "rms_bare", "layer", "layer_one_plus", "layer_bare")
# Epsilons tried on a norm that keeps none as an attribute (after the config's own).
USUAL_EPSILONS = (1e-5, 1e-6)
CONFIG_EPSILONS = ("rms_norm_eps", "layer_norm_eps", "norm_eps", "layer_norm_epsilon")
ACTIVATION_NAMES = ("act_fn", "act", "activation_fn", "activation", "gelu_impl")
_EPSILONS = ("variance_epsilon", "eps", "epsilon")


@dataclasses.dataclass(frozen=True)
class Scale:
    """A scalar the twin showed, as a function of the config: `kind` of config field
    `field` ("one": 1; "value": the field; "inverse": 1 / it; "sqrt", "rsqrt": its square
    root and the inverse of that; `field` "d_head" is the attention's head width), or of
    two fields `field` "a/b" ("ratio": a / b; "over_sqrt": a / sqrt(b): MiniCPM's
    `scale_depth / sqrt(num_hidden_layers)`); "sqrt_bfloat16": the square root rounded to
    bfloat16 (`bfloat16_normalizer`)."""

    kind: str = "one"
    field: str = ""

    def of(self, hf_config: Any, d_head: int) -> float:
        """The scalar for `hf_config`."""
        if self.kind == "one":
            return 1.0
        if self.kind in ("ratio", "over_sqrt"):  # two fields: "a/b"
            a, b = (float(getattr(hf_config, f)) for f in self.field.split("/"))
            return a / b if self.kind == "ratio" else a / math.sqrt(b)
        x = float(d_head if self.field == "d_head" else getattr(hf_config, self.field))
        if self.kind == "sqrt_bfloat16":
            return float(torch.tensor(math.sqrt(x), dtype=torch.bfloat16))
        return {"value": x, "inverse": 1 / x, "sqrt": math.sqrt(x), "rsqrt": x**-0.5}[self.kind]


def bfloat16_normalizer(scale: Scale, hf_config: Any) -> Scale:
    """RecurrentGemma's embedding scale, `sqrt(hidden_size)` held as a bfloat16 buffer
    whatever the model's dtype (50.5, not 50.596, at 2,560 wide). Its twin, cast to float32
    and 64 wide, shows an exact 8 either way, so the rounding is known here by model type."""
    if scale.kind == "sqrt" and getattr(hf_config, "model_type", None) == "recurrent_gemma":
        return Scale("sqrt_bfloat16", scale.field)
    return scale


def explain(value: float, config: Any, what: str, d_head: int | None = None) -> Scale:
    """The config field (or the head width `d_head`) that `value` is a function of, as
    measured on a twin of `config` (the first reading of `explain_all`: one field before
    two); a ValueError naming `what` if none is."""
    readings = explain_all(value, config, d_head)
    if not readings:
        raise ValueError(f"the {what} {value:.6g} is no config field's function")
    return readings[0]


def explain_all(value: float, config: Any, d_head: int | None = None) -> list[Scale]:
    """Every reading of `value` as a function of `config`'s fields (module docstring of
    `_scalars`: more than one may fit a twin): 1 alone; else one field's value, inverse,
    square root or its inverse (the head width first), then two fields' ratio or one over
    the other's square root."""
    if math.isclose(value, 1.0, rel_tol=1e-6):
        return [Scale()]
    fields = {k: float(v) for k, v in config.to_dict().items()
              if isinstance(v, int | float) and not isinstance(v, bool) and v > 0}  # fmt: skip
    singles = [("d_head", float(d_head))] if d_head else []
    singles += list(fields.items())
    readings = [
        Scale(kind, field)
        for field, x in singles
        for kind, f in (("value", x), ("inverse", 1 / x), ("sqrt", math.sqrt(x)),
                        ("rsqrt", x**-0.5))
        if math.isclose(value, f, rel_tol=1e-5)
    ]  # fmt: skip
    readings += [
        Scale(kind, f"{a}/{b}")
        for (a, x), (b, y) in itertools.permutations(fields.items(), 2)  # MiniCPM's muP
        for kind, f in (("ratio", x / y), ("over_sqrt", x / math.sqrt(y)))
        if math.isclose(value, f, rel_tol=1e-5)
    ]
    return readings


def ratio(got: Tensor, base: Tensor, what: str) -> float:
    """The one scalar `s` with `got = s * base`; a ValueError naming `what` if none."""
    got, base = got.double(), base.double()
    s = float((got * base).sum() / (base * base).sum())
    if not torch.allclose(got, s * base, rtol=1e-4, atol=1e-7 * float(base.abs().max())):
        raise ValueError(f"{what} is no scalar multiple of what it is made from")
    return s


def norm_kind(modules: list[nn.Module], epsilons: tuple[float, ...]) -> tuple[str, bool, float]:
    """The one kind, bias and epsilon of every norm in `modules`, by calling each (with
    `epsilons` tried where a norm keeps none as an attribute)."""
    found = {one_norm(m, epsilons) for m in modules}
    if len(found) != 1:
        raise ValueError(f"norms of different kinds or epsilons: {sorted(found)}")
    return found.pop()


def one_norm(module: nn.Module, epsilons: tuple[float, ...]) -> tuple[str, bool, float]:
    """What one norm computes: its kind, whether it has a bias, its epsilon. The input is
    as small as an epsilon, so that a wrong one shows."""
    kept = next((float(getattr(module, a)) for a in _EPSILONS if hasattr(module, a)), None)
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    shape = getattr(module, "normalized_shape", None) or (8,)
    width = weight.shape[-1] if weight is not None else int(shape[-1])
    x = 1e-2 * (torch.randn(3, width, generator=torch.Generator().manual_seed(2)) + 0.5)
    with torch.no_grad():
        got = module(x).double()
    x = x.double()
    w = weight.double() if weight is not None else None
    b = bias.double() if bias is not None else 0.0
    for eps in (kept,) if kept is not None else epsilons:
        rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        layer = nn.functional.layer_norm(x, (width,), eps=eps)
        candidates = {
            "rms": (rms * w) if w is not None else None,
            "rms_one_plus": (rms * (1 + w)) if w is not None else None,
            "rms_bare": rms if w is None and bias is None else None,
            "layer": (layer * w + b) if w is not None else None,
            "layer_one_plus": (layer * (1 + w) + b) if w is not None else None,
            "layer_bare": layer if w is None and bias is None else None,
        }
        for kind, expected in candidates.items():
            if expected is not None and torch.allclose(got, expected, rtol=1e-5, atol=1e-6):
                return kind, bias is not None, float(eps)
    raise ValueError(
        f"{type(module).__name__} computes no norm we know (epsilons tried: "
        f"{(kept,) if kept is not None else epsilons})"
    )


def activation(mlp: nn.Module) -> str:
    """Our name for the MLP's activation, by calling it on a range of values."""
    act = next((getattr(mlp, a) for a in ACTIVATION_NAMES
                if callable(getattr(mlp, a, None))), None)  # fmt: skip
    if act is None:
        return _activation_by_calls(mlp)
    x = torch.linspace(-6, 6, 241)
    if isinstance(act, nn.Module) and dict(act.state_dict()).keys() >= _XIELU_SCALARS:
        return _xielu(act, x)
    with torch.no_grad():
        got = act(x)
    for name, ours in ACTIVATIONS.items():
        if name != "solu_ln" and torch.allclose(got, ours(x), rtol=1e-6, atol=1e-6):
            return name
    raise ValueError(f"the activation {type(act).__name__} is none of ours: {sorted(ACTIVATIONS)}")


_XIELU_SCALARS = {"alpha_p", "alpha_n", "beta", "eps"}


def _xielu(act: nn.Module, x: Tensor) -> str:
    """ "xielu" where a module keeping xIELU's scalars computes ours with them."""
    scalars = act.state_dict()
    ours = XIELU(x.dtype)
    with torch.no_grad():
        for name in _XIELU_SCALARS:
            getattr(ours, name).copy_(scalars[name].reshape(getattr(ours, name).shape))
        if torch.allclose(act(x), ours(x), rtol=1e-6, atol=1e-6):
            return "xielu"
    raise ValueError(f"the activation {type(act).__name__} keeps xIELU's scalars but is not "
                     "xIELU")  # fmt: skip


def _activation_by_calls(mlp: nn.Module) -> str:
    """The activation of an MLP that calls it as a function (LFM2's `F.silu`), found by
    calling the MLP: the output map's input is `act(gate) * up` (or `act(pre)`) of the
    maps that read the MLP's input."""
    maps = {n: m for n, m in mlp.named_children() if isinstance(m, nn.Linear)}
    if not maps:
        raise ValueError(f"{type(mlp).__name__} has no activation we can find")
    seen: dict[str, tuple[Tensor, Tensor]] = {}

    def record(name: str) -> Any:
        return lambda module, args, out: seen.__setitem__(name, (args[0], out))

    handles = [m.register_forward_hook(record(n)) for n, m in maps.items()]
    width = next(m.in_features for m in maps.values())
    x = 3 * torch.randn(64, width, generator=torch.Generator().manual_seed(3))
    try:
        with torch.no_grad():
            mlp(x)
    finally:
        for handle in handles:
            handle.remove()
    reads = [n for n in maps if n in seen and seen[n][0] is x]
    down = [n for n in maps if n in seen and n not in reads]
    if len(down) != 1 or len(reads) not in (1, 2):
        raise ValueError(f"{type(mlp).__name__} has no activation we can find")
    hidden = seen[down[0]][0].double()
    orders = [(reads[0], None)] if len(reads) == 1 else [tuple(reads), tuple(reversed(reads))]
    for name, ours in ACTIVATIONS.items():
        for gate, up in orders:
            expected = ours(seen[gate][1].double())
            if up is not None:
                expected = expected * seen[up][1].double()
            if name != "solu_ln" and torch.allclose(hidden, expected, rtol=1e-5, atol=1e-6):
                return name
    raise ValueError(
        f"{type(mlp).__name__} computes an activation none of ours: {sorted(ACTIVATIONS)}"
    )
