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
predicts a changed scalar, one by a size predicts the same; the second twin keeps the
readings that predicted it, the first of them in `explain_all`'s order. Readings by sizes
alone (the softmax's `1 / sqrt(d_head)` or `1 / heads` on a twin of 4 heads of 16) keep
that order: the head width first.
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
) -> Any:
    """`anatomy` with each scalar read by a field that fits both twins where the readings
    that fit the first disagree on `hf_config` and one of them is a setting the twin kept
    (module docstring); readings by sizes alone keep their order (the head width first).
    `measured`: the first twin's scalars by slot; `watch(config)`: a second twin's, for a
    config like `twin_config`. A ValueError names a scalar no reading fits twice."""
    kept = _settings(twin_config, hf_config)
    ambiguous = {}
    for slot, value in measured.items():
        d_head = head_width(twin_config) if slot == "attn_scale" else None
        readings = explain_all(value, twin_config, d_head)
        on_checkpoint = {round(r.of(hf_config, head_width(hf_config)), 9) for r in readings}
        if len(on_checkpoint) > 1 and any(set(fields_of(r)) & kept for r in readings):
            ambiguous[slot] = readings
    if not ambiguous:
        return anatomy
    changed = type(twin_config).from_dict(twin_config.to_dict())
    for name in sorted({f for rs in ambiguous.values() for r in rs for f in fields_of(r)} & kept):
        value = getattr(twin_config, name)
        setattr(changed, name, value * 2 if isinstance(value, int) else value * 1.5)
    second = watch(changed)
    chosen = {}
    for slot, readings in ambiguous.items():
        fitting = [r for r in readings
                   if math.isclose(r.of(changed, head_width(changed)), second[slot],
                                   rel_tol=1e-5)]  # fmt: skip
        if not fitting:
            names = ", ".join(f"{r.kind}({r.field})" for r in readings)
            raise ValueError(
                f"the {slot.replace('_', ' ')} {measured[slot]:.6g} fits {names} on one twin "
                f"and none of them on a second ({second[slot]:.6g})"
            )
        chosen[slot] = fitting[0]
    return dataclasses.replace(anatomy, **chosen)


def _settings(twin_config: Any, hf_config: Any) -> set[str]:
    """The numeric fields the twin kept at the checkpoint's value: settings, not sizes."""
    fields = twin_config.to_dict()
    return {
        name for name, value in fields.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        and getattr(hf_config, name, None) == value
    }  # fmt: skip
