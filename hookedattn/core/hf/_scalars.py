"""Which config field a scalar comes from, when one twin cannot tell.

`_anatomy` measures each scalar a model multiplies by (its embedding, each sublayer's
write, the softmax, the logits) on the checkpoint's tiny twin, and `_probes.explain` names
the config field it is a function of, so that it carries over to the checkpoint's own
sizes. A twin's sizes are small round numbers, and a scalar can be more than one field's
function there: Granite's `attention_multiplier` 1/128 is also 1 / the twin's MLP width
128, and its `logits_scaling` 8 also the square root of the twin's width 64. On the
checkpoint the two readings differ (1/128 or 1/12800), and no verification on the twin
can see it.

So where the readings that fit the twin disagree on the checkpoint, a second twin is
watched: the first with each field the twin kept at the checkpoint's value (a setting,
not a size) changed (a float by half, an int doubled). A reading by a field that changed
predicts a changed scalar, one by a size predicts the same; one more twin per such setting
keeps the readings that predicted each, and the first that remains is taken. A setting no
twin runs with changed (a group count of DeepSeek's router, bound by another) confirms none
of the readings by it: they are dropped. A scalar no remaining reading fits refuses the
import, naming the readings. Readings by sizes alone (the
softmax's `1 / sqrt(d_head)` or `1 / heads` on a twin of 4 heads of 16) keep their order:
the head width first.
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from hookedattn.core.hf._probes import Scale, explain_all

# The anatomy's scalars, by field name.
SLOTS = ("embed_scale", "attn_scale", "attn_write", "mlp_write", "logit_scale")


def fields_of(scale: Scale) -> tuple[str, ...]:
    """The config fields a reading depends on (none for "one"; not the head width)."""
    return tuple(f for f in scale.field.split("/") if f and f != "d_head")


def head_width(config: Any) -> int:
    """A config's attention head width, as the scalars read it (`d_head`)."""
    heads = getattr(config, "num_attention_heads", None) or 1
    return int(getattr(config, "head_dim", None) or config.hidden_size // heads)


def disambiguated(
    anatomy: Any,
    measured: dict[str, float],
    twin_config: Any,
    hf_config: Any,
    watch: Callable[[Any], dict[str, float]],
    shapes: Callable[[Any], dict[str, tuple[int, ...]]],
) -> Any:
    """`anatomy` with each scalar read by a field that fits both twins where the readings
    that fit the first disagree on `hf_config` and one of them is a setting the twin kept
    (module docstring); readings by sizes alone keep their order (the head width first).
    `measured`: the first twin's scalars by slot; `watch(config)`: a second twin's, for a
    config like `twin_config`; `shapes(config)`: its parameters' shapes (an int field that
    changes them is a size, never changed). A ValueError names a scalar no reading fits
    twice."""
    kept = _settings(twin_config, hf_config)
    ambiguous = {}
    for slot, value in measured.items():
        d_head = head_width(twin_config) if slot == "attn_scale" else None
        # Readings the checkpoint's config cannot give (a field unset there) are dropped.
        readings = [r for r in explain_all(value, twin_config, d_head)
                    if _value(r, hf_config) is not None]  # fmt: skip
        on_checkpoint = {round(_value(r, hf_config), 9) for r in readings}
        if len(on_checkpoint) > 1 and any(set(fields_of(r)) & kept for r in readings):
            ambiguous[slot] = readings
    if not ambiguous:
        return anatomy
    involved = sorted({f for rs in ambiguous.values() for r in rs for f in fields_of(r)} & kept)
    settings = [f for f in involved if _is_setting(twin_config, f, shapes)]
    if not settings:
        return anatomy  # sizes alone: the readings keep their order
    fitting = dict(ambiguous)
    for name in settings:  # one twin per setting: readings must predict each of them
        watched = _watched_changed(twin_config, name, watch)
        if watched is None:  # no twin runs with it changed: readings by it are unconfirmed
            fitting = {slot: [r for r in readings if name not in fields_of(r)]
                       for slot, readings in fitting.items()}  # fmt: skip
            continue
        changed, second = watched
        fitting = {
            slot: [r for r in readings if _predicts(r, changed, second[slot])]
            for slot, readings in fitting.items()
        }
    chosen = {}
    for slot, readings in fitting.items():
        if not readings:
            names = ", ".join(f"{r.kind}({r.field})" for r in ambiguous[slot])
            raise ValueError(
                f"the {slot.replace('_', ' ')} {measured[slot]:.6g} is read as {names} on "
                f"one twin, and none of these fits the twins with {settings} changed"
            )
        chosen[slot] = readings[0]  # what changed with a setting, or sizes in their order
    return dataclasses.replace(anatomy, **chosen)


def undecided(measured: dict[str, float], twin_config: Any, hf_config: Any) -> list[str]:
    """The scalars (slots of `measured`) read by several fields, one of them a setting the
    twin kept, that agree on `hf_config` and so were not told apart: right for this
    checkpoint, maybe not for another of the twin's structure (a tiny MiniCPM 3's
    `dim_model_base / hidden_size` is its head count 4; a real one's is not). An anatomy
    with such a scalar is not remembered for the structure."""
    kept = _settings(twin_config, hf_config)
    slots = []
    for slot, value in measured.items():
        d_head = head_width(twin_config) if slot == "attn_scale" else None
        readings = [r for r in explain_all(value, twin_config, d_head)
                    if _value(r, hf_config) is not None]  # fmt: skip
        on_checkpoint = {round(_value(r, hf_config), 9) for r in readings}
        settings = any(set(fields_of(r)) & kept for r in readings)
        if len(set(readings)) > 1 and len(on_checkpoint) == 1 and settings:
            slots.append(slot)
    return slots


def _watched_changed(
    config: Any, name: str, watch: Callable[[Any], dict[str, float]]
) -> tuple[Any, dict[str, float]] | None:
    """A config like `config` with setting `name` changed, and the scalars of its twin:
    the setting doubled (or a float by half), else an int one larger (DeepSeek's
    `topk_group` cannot exceed `n_group`, so neither may run); None where no such twin runs."""
    value = getattr(config, name)
    tries = [lambda: _changed(config, [name])]
    if isinstance(value, int):
        tries.append(lambda: type(config).from_dict(config.to_dict() | {name: value + 1}))
    for change in tries:
        try:
            changed = change()
            return changed, watch(changed)
        except Exception:  # a setting this model (or its config) cannot take: the next change
            continue
    return None


def _changed(config: Any, names: list[str]) -> Any:
    """A copy of `config` with each of `names` changed: a float by half, an int doubled."""
    changed = type(config).from_dict(config.to_dict())
    for name in names:
        value = getattr(config, name)
        setattr(changed, name, value * 2 if isinstance(value, int) else value * 1.5)
    return changed


def _is_setting(
    config: Any, name: str, shapes: Callable[[Any], dict[str, tuple[int, ...]]]
) -> bool:
    """Whether changing field `name` leaves the twin's parameters as they are: a float
    always is taken for one; an int only if the twin built with it doubled has the same
    shapes (else it is a size: a width, a count)."""
    if isinstance(getattr(config, name), float):
        return True
    try:
        return shapes(_changed(config, [name])) == shapes(config)
    except Exception:
        return False


def _settings(twin_config: Any, hf_config: Any) -> set[str]:
    """The numeric fields the twin kept at the checkpoint's value: settings, not sizes."""
    fields = twin_config.to_dict()
    return {
        name for name, value in fields.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        and getattr(hf_config, name, None) == value
    }  # fmt: skip


def _value(reading: Scale, config: Any) -> float | None:
    """`reading` of `config`; None where a field it reads is not a number there."""
    try:
        return reading.of(config, head_width(config))
    except (TypeError, ValueError, AttributeError, ZeroDivisionError):
        return None


def _predicts(reading: Scale, config: Any, value: float) -> bool:
    """Whether `reading` of `config` gives `value`."""
    got = _value(reading, config)
    return got is not None and math.isclose(got, value, rel_tol=1e-5)
