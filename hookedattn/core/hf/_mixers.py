"""A hybrid checkpoint's mixers: the sublayers that take attention's place in some of its
layers, recognised on its tiny twin (`_anatomy`), and their weight table (`_convention`).

    which layers    each twin layer holds attention or a mixer (a child that is neither
                    attention, MLP nor norm); the config field that lists the layers' kinds
                    (`layer_types`, `layers_block_type`) is read as value -> kind off the
                    twin, so that it carries over to the checkpoint's own layers
    which kind      by the child's parts: a depthwise `nn.Conv1d` between `in_proj` and
                    `out_proj` with `in_proj` 3 x d_model wide and nothing else: the gated
                    short convolution (LFM2); the same with `A_log`, `D`, `dt_bias` and a
                    gated norm: the Mamba-2 mixer (Bamba, Granite 4 hybrids, Mamba 2);
                    with `x_proj`, `dt_proj` and a two-dimensional `A_log`: the Mamba-1
                    mixer (Mamba, Falcon Mamba, Jamba: `_mamba1`); q/k/v, gate, `a`, `b`
                    projections with `A_log`, `dt_bias`: the gated delta net (Qwen3-Next,
                    Qwen3.5, OLMo Hybrid: `_gated_delta`); `linear_x`, `linear_y`, a
                    `conv_1d` and an `rg_lru`: Griffin's recurrent block (RecurrentGemma:
                    `_rg_lru`); q/k/v projections, a `forget_gate` of two low-rank maps,
                    `b_proj` and a low-rank output gate (or both gates full maps):
                    Kimi Delta Attention (Kimi Linear, Bailing Hybrid: `_kimi_delta`);
                    anything else is a ValueError naming its parts
    its settings    each a config field, found by name among those that hold the value the
                    twin's module shows (the convolution's width, the heads, the state, the
                    groups, the gated norm's epsilon), and the biases by their presence

What the convention derives is checked like everything else: `_verify` compares the import
with `transformers` on the twin, layer by layer.
"""

import dataclasses
import math
from typing import Any

from torch import nn

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _gated_delta, _kimi_delta, _mamba1, _rg_lru
from hookedattn.core.hf._probes import CONFIG_EPSILONS
from hookedattn.core.hf._table import Rule, zeros
from hookedattn.core.mixer_config import MixerConfig

_PATTERN_FIELDS = ("layer_types", "layers_block_type", "block_types")
# Our setting -> the config fields that may hold it, the likelier first.
_SETTING_FIELDS = {
    "d_conv": ("conv_L_cache", "mamba_d_conv", "conv_kernel", "d_conv"),
    "n_ssm_heads": ("mamba_n_heads", "mamba_num_heads", "num_heads"),
    "d_ssm_head": ("mamba_d_head", "mamba_head_dim", "head_dim"),
    "d_state": ("mamba_d_state", "ssm_state_size", "state_size"),
    "n_ssm_groups": ("mamba_n_groups", "n_groups", "mamba_ngroups"),
    "ssm_norm_eps": CONFIG_EPSILONS,
}
_SHORT_CONV_PARTS = {"conv", "in_proj", "out_proj"}
_MAMBA2_PARTS = {"conv1d", "in_proj", "out_proj", "norm", "act"}
_MAMBA2_OWN = {"A_log", "D", "dt_bias"}


@dataclasses.dataclass(frozen=True)
class Mixers:
    """What `recognise` found: the mixer's kind and its name in a layer, the config field
    that lists the layers' kinds and what each of its values means, and where each setting
    is read from (`settings`: our setting -> config field; `flags`: the biases)."""

    kind: str  # "short_conv", "mamba2", "mamba", "gated_delta", "rg_lru" or "kimi_delta"
    name: str  # the layer's child: "conv", "mamba", "mixer"
    pattern_field: str  # "layer_types"
    pattern: tuple[tuple[str, str], ...]  # (the field's value, "attention" or the kind)
    settings: tuple[tuple[str, str], ...]
    flags: tuple[tuple[str, bool], ...]
    dt_limit_field: str | None  # "time_step_limit": the step's clamp
    norm_gains: bool = False  # Mamba-1's B, C, dt norms: learned gains (Jamba), or ones
    layout: str = ""  # a gated delta net's projections (`_gated_delta`)
    fixed: tuple[tuple[str, float], ...] = ()  # settings the module fixes, not its config

    def config(self, hf_config: Any) -> MixerConfig:
        """Our `MixerConfig` for a checkpoint of this structure."""
        meaning = dict(self.pattern)
        values = list(getattr(hf_config, self.pattern_field))
        unknown = sorted({str(v) for v in values} - set(meaning))
        if unknown:
            raise ValueError(
                f"{self.pattern_field} holds {unknown}, kinds of layer its tiny twin did not "
                f"show (it showed {sorted(meaning)})"
            )
        limits = (0.0, math.inf)
        if self.dt_limit_field is not None:
            limits = tuple(float(x) for x in getattr(hf_config, self.dt_limit_field))
        settings = {ours: _field(hf_config, field) for ours, field in self.settings}
        return MixerConfig(
            layers=tuple(meaning[str(v)] for v in values),
            dt_min=limits[0],
            dt_max=limits[1],
            **settings,
            **dict(self.flags),
            **dict(self.fixed),
        )

    def rules(self, layers: str, cfg: HookedTransformerConfig, write: float) -> list[Rule]:
        """The mixers' rules, for the layers that hold one (`layers`: "model.layers"), the
        scalar the layer multiplies their write by (`write`) folded into `W_out`, `b_out`."""
        at, ours = f"{layers}.{{layer}}.{self.name}", "blocks.{layer}.mixer"
        found = self._kind_rules(at, ours)
        if write != 1.0:
            found = [_times(rule, write) if rule.ours.endswith(("W_out", "b_out")) else rule
                     for rule in found]  # fmt: skip
        chosen = [i for i in range(cfg.n_layers) if cfg.layer_mixer(i) == self.kind]
        return [
            dataclasses.replace(rule, ours=rule.ours.replace("{layer}", str(i)),
                                hf=None if rule.hf is None else rule.hf.replace("{layer}", str(i)))
            for rule in found for i in chosen
        ]  # fmt: skip

    def _kind_rules(self, at: str, ours: str) -> list[Rule]:
        """The rules of one mixer of this kind, at `at` in the checkpoint, `ours` in ours."""
        flags = dict(self.flags)
        if self.kind == "gated_delta":
            return _gated_delta.rules(at, ours, self.layout, flags["conv_bias"])
        if self.kind == "rg_lru":
            return _rg_lru.rules(at, ours)
        if self.kind == "kimi_delta":
            return _kimi_delta.rules(at, ours, flags["kda_full_rank_gates"])
        bias = flags["proj_bias"], flags["conv_bias"]
        if self.kind == "mamba":
            return _mamba_rules(at, ours, *bias, flags["bcdt_norm"], self.norm_gains)
        return (_short_conv_rules if self.kind == "short_conv" else _mamba2_rules)(at, ours, *bias)


def _field(hf_config: Any, field: str) -> Any:
    """A config field's value; `a*b`: the product of two fields' (`expand*hidden_size`);
    `a/b`: their exact quotient (`_rg_lru`)."""
    if "/" in field:
        return _rg_lru.field_value(hf_config, field)
    value = 1
    for name in field.split("*"):
        value = value * getattr(hf_config, name)
    return value


def _times(rule: Rule, factor: float) -> Rule:
    if rule.hf is None:  # zeros stay zeros
        return rule
    return dataclasses.replace(rule, adjust=lambda t: t * factor)


def _input_rules(
    at: str, ours: str, names: tuple[str, ...], pieces: tuple[str, ...], bias: bool
) -> list[Rule]:
    """Our `W_{name}`, `b_{name}` from the pieces of `in_proj` (its rows one after another,
    each `pieces[i]` wide)."""
    rules = []
    for part, (name, axis) in enumerate(zip(names, pieces, strict=True)):
        where = dict(split=pieces, part=part)
        weight = f"{axis} d_model -> d_model {axis}"
        rules.append(Rule(f"{ours}.W_{name}", f"{at}.in_proj.weight", weight, **where))
        rules.append(
            Rule(f"{ours}.b_{name}", f"{at}.in_proj.bias", f"{axis} -> {axis}", **where)
            if bias
            else zeros(f"{ours}.b_{name}", axis)
        )
    return rules


def _output_rules(at: str, ours: str, axis: str, bias: bool) -> list[Rule]:
    """Our `W_out`, `b_out` from `out_proj`."""
    return [
        Rule(f"{ours}.W_out", f"{at}.out_proj.weight", f"d_model {axis} -> {axis} d_model"),
        Rule(f"{ours}.b_out", f"{at}.out_proj.bias", "d_model -> d_model")
        if bias
        else zeros(f"{ours}.b_out", "d_model"),
    ]


def _conv_rules(conv: str, ours: str, axis: str, bias: bool) -> list[Rule]:
    """Our `W_conv`, `b_conv` from a depthwise `nn.Conv1d` (`[channel 1 d_conv]`)."""
    return [
        Rule(f"{ours}.W_conv", f"{conv}.weight", f"{axis} one d_conv -> {axis} (one d_conv)"),
        Rule(f"{ours}.b_conv", f"{conv}.bias", f"{axis} -> {axis}")
        if bias
        else zeros(f"{ours}.b_conv", axis),
    ]


def _short_conv_rules(at: str, ours: str, proj_bias: bool, conv_bias: bool) -> list[Rule]:
    """`in_proj` rows are `[b; c; h]`, each `channel` (= d_model) wide."""
    return [
        *_input_rules(at, ours, ("B", "C", "X"), ("channel",) * 3, proj_bias),
        *_conv_rules(f"{at}.conv", ours, "channel", conv_bias),
        *_output_rules(at, ours, "channel", proj_bias),
    ]


def _mamba2_rules(at: str, ours: str, proj_bias: bool, conv_bias: bool) -> list[Rule]:
    """`in_proj` rows are `[z; xBC; dt]`; the convolution reads `xBC`."""
    per_head = [Rule(f"{ours}.{n}", f"{at}.{n}", "ssm_head -> ssm_head")
                for n in ("dt_bias", "A_log", "D")]  # fmt: skip
    return [
        *_input_rules(at, ours, ("z", "xBC", "dt"), ("d_inner", "d_xbc", "ssm_head"), proj_bias),
        *_conv_rules(f"{at}.conv1d", ours, "d_xbc", conv_bias),
        *per_head,
        Rule(f"{ours}.w_norm", f"{at}.norm.weight", "d_inner -> d_inner"),
        *_output_rules(at, ours, "d_inner", proj_bias),
    ]


def _mamba_rules(
    at: str, ours: str, proj_bias: bool, conv_bias: bool, norms: bool, gains: bool
) -> list[Rule]:
    """`in_proj` rows are `[xs; z]`; the convolution reads `xs` (`_mamba1` for the rest)."""
    return [
        *_input_rules(at, ours, ("xs", "z"), ("d_inner", "d_inner"), proj_bias),
        *_conv_rules(f"{at}.conv1d", ours, "d_inner", conv_bias),
        *_mamba1.ssm_rules(at, ours, norms, gains),
        *_output_rules(at, ours, "d_inner", proj_bias),
    ]


def mixer_child(children: dict[str, nn.Module], known: tuple[str, ...]) -> str | None:
    """The name of a layer's child that is a mixer (neither one of `known`, attention, MLP,
    norm nor dropout, and holding a convolution); None if there is none."""
    found = [
        n for n, m in children.items()
        if n not in known and any(isinstance(c, nn.Conv1d) for c in m.modules())
    ]  # fmt: skip
    if len(found) > 1:
        raise ValueError(
            f"a decoder layer holds {len(found)} pieces with a convolution ({found}); one "
            f"mixer in attention's place is recognised"
        )
    return found[0] if found else None


def is_mixer(module: nn.Module) -> bool:
    """Whether `module` is a mixer whatever its name: one recognised by parts that no
    attention has (Kimi Delta Attention, named `self_attn` in Kimi Linear and Bailing
    Hybrid)."""
    return _kimi_delta.is_kimi_delta(module)


def kind_of(module: nn.Module, d_model: int) -> str:
    """ "short_conv", "mamba2", "mamba", "gated_delta", "rg_lru" or "kimi_delta", by the
    module's parts (module docstring)."""
    parts = {n for n, _ in module.named_children()}
    own = {n for n, _ in module.named_parameters(recurse=False)}
    if parts == _SHORT_CONV_PARTS and not own and module.in_proj.out_features == 3 * d_model:
        return "short_conv"
    if parts <= _MAMBA2_PARTS and _SHORT_CONV_PARTS - {"conv"} <= parts and own == _MAMBA2_OWN:
        return "mamba2"
    if _mamba1.is_mamba1(module):
        return "mamba"
    if _gated_delta.layout_of(module) is not None:
        return "gated_delta"
    if _rg_lru.is_rg_lru(module):
        return "rg_lru"
    if _kimi_delta.is_kimi_delta(module):
        return "kimi_delta"
    raise ValueError(
        f"a mixer {type(module).__name__} of parts {sorted(parts)} and parameters "
        f"{sorted(own)}: neither a gated short convolution, a Mamba-1 or Mamba-2 mixer, a "
        f"gated delta net, Griffin's recurrent block nor Kimi Delta Attention"
    )


def recognise(
    layers: list[nn.Module], config: Any, attention: list[str | None], mixers: list[str | None]
) -> Mixers | None:
    """The mixers of a twin whose layer `i` holds the attention `attention[i]` or the mixer
    `mixers[i]` (names, or None); None where every layer holds attention."""
    named = [m for m in mixers if m is not None]
    if not named:
        return None
    if any((a is None) == (m is None) for a, m in zip(attention, mixers, strict=True)):
        raise ValueError("a decoder layer holds both attention and a mixer, or neither")
    if len(set(named)) != 1:
        raise ValueError(f"the mixers have different names in different layers: {set(named)}")
    name = named[0]
    modules = [layer.get_submodule(name) for layer, m in zip(layers, mixers, strict=True) if m]
    kinds = {kind_of(m, config.hidden_size) for m in modules}
    if len(kinds) != 1:
        raise ValueError(f"mixers of different kinds in one model: {sorted(kinds)}")
    kind = kinds.pop()
    per_layer = ["attention" if m is None else kind for m in mixers]
    field, pattern = _pattern(config, per_layer)
    module = modules[0]
    if kind == "gated_delta":
        found = _gated_delta.read(module, config)
        return Mixers(kind, name, field, pattern, found.settings, found.flags, None,
                      layout=found.layout, fixed=found.fixed)  # fmt: skip
    if kind == "rg_lru":
        return Mixers(kind, name, field, pattern, *_rg_lru.read(module, config), None)
    if kind == "kimi_delta":
        return Mixers(kind, name, field, pattern, *_kimi_delta.read(module, config), None)
    settings, flags = _settings(kind, module, config)
    limit = "time_step_limit" if kind == "mamba2" and hasattr(config, "time_step_limit") else None
    gains = kind == "mamba" and _mamba1.norm_flags(module)[1]
    return Mixers(kind, name, field, pattern, settings, flags, limit, gains)


def _pattern(config: Any, per_layer: list[str]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The config field listing the layers' kinds, and what each of its values means."""
    for field in _PATTERN_FIELDS:
        values = getattr(config, field, None)
        if not isinstance(values, list | tuple) or len(values) != len(per_layer):
            continue
        meaning: dict[str, str] = {}
        if all(meaning.setdefault(str(v), k) == k for v, k in zip(values, per_layer, strict=True)):
            return field, tuple(sorted(meaning.items()))
    raise ValueError(
        f"no config field lists the layers' kinds (attention or mixer per layer: {per_layer}); "
        f"looked at {_PATTERN_FIELDS}"
    )


def _settings(
    kind: str, module: nn.Module, config: Any
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, bool], ...]]:
    """Each setting's config field (the first by name that holds what the module shows)."""
    conv = module.conv if kind == "short_conv" else module.conv1d
    if kind == "mamba":
        return _mamba1_settings(module, config)
    shown: dict[str, Any] = {"d_conv": conv.kernel_size[0]}
    if kind == "mamba2":
        heads = module.A_log.shape[0]
        d_inner = module.out_proj.in_features
        d_xbc = conv.in_channels
        groups = next(
            (g for g in range(1, heads + 1) if heads % g == 0 and (d_xbc - d_inner) % (2 * g) == 0
             and d_inner // _group_size(module, d_inner) == g),
            None,
        )  # fmt: skip
        if groups is None:
            raise ValueError("the Mamba-2 mixer's groups could not be told from its widths")
        shown |= dict(
            n_ssm_heads=heads,
            d_ssm_head=d_inner // heads,
            d_state=(d_xbc - d_inner) // (2 * groups),
            n_ssm_groups=groups,
            ssm_norm_eps=float(module.norm.variance_epsilon),
        )
    flags = (("conv_bias", conv.bias is not None), ("proj_bias", module.in_proj.bias is not None))
    return _fields_holding(shown, config, _SETTING_FIELDS), flags


def _mamba1_settings(
    module: nn.Module, config: Any
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, bool], ...]]:
    """A Mamba-1 mixer's settings (`_mamba1`) and its flags, the norms' among them."""
    settings = _fields_holding(_mamba1.shown(module), config, _mamba1.SETTING_FIELDS)
    flags = (
        ("conv_bias", module.conv1d.bias is not None),
        ("proj_bias", module.in_proj.bias is not None),
        ("bcdt_norm", _mamba1.norm_flags(module)[0]),
    )
    return settings, flags


def _fields_holding(
    shown: dict[str, Any], config: Any, candidates: dict[str, tuple[str, ...]]
) -> tuple[tuple[str, str], ...]:
    """For each setting, the first of its `candidates` config fields that holds its value."""
    settings = []
    for ours, value in shown.items():
        field = next((f for f in candidates[ours]
                      if _has(config, f) and _field(config, f) == value), None)  # fmt: skip
        if field is None:
            raise ValueError(
                f"no config field holds the mixer's {ours}={value} (looked at {candidates[ours]})"
            )
        settings.append((ours, field))
    return tuple(settings)


def _has(config: Any, field: str) -> bool:
    """Whether every field of `field` (`a*b`) is set to a number."""
    values = [getattr(config, name, None) for name in field.split("*")]
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def _group_size(module: nn.Module, d_inner: int) -> int:
    """The channels over which the gated norm normalises (all of them where it keeps none)."""
    return int(getattr(module.norm, "group_size", d_inner))


def from_json(fields: dict[str, Any]) -> Mixers:
    """A `Mixers` as the memo stored it (`dataclasses.asdict`: lists for tuples)."""
    pairs = ("pattern", "settings", "flags", "fixed")
    return Mixers(**{k: tuple(tuple(p) for p in v) if k in pairs else v for k, v in fields.items()})
