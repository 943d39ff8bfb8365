"""Which decoder layers of a transformers config hold a mixture of experts, the others a
dense MLP: the config field that says so, recognised against the layers a tiny twin holds.

Checkpoints say it in several ways, each read here as a flag per layer (`READERS`, most
specific first): a list of kinds per layer (`mlp_layer_types`: "dense" or a kind of
mixture), a list of the layers with experts (Llama 4's `moe_layers`), every `step`-th layer
but some listed dense ones (Qwen's `decoder_sparse_step`, `mlp_only_layers`), every
`interval`-th layer between two indices (Ernie 4.5's `moe_layer_interval`), every
`period`-th from an offset (Jamba's `expert_layer_period`, `expert_layer_offset`), dense
first layers (DeepSeek's `first_k_dense_replace` and its kin), or the dense layers listed
alone (`mlp_only_layers`). `pattern_field` picks the first reader whose flags on the twin
are the layers the twin holds; `moe_layers` reads them off the checkpoint's own config.
"""

from collections.abc import Callable
from typing import Any

Flags = tuple[bool, ...]

_DENSE_COUNTS = ("first_k_dense_replace", "num_dense_layers", "first_dense_layers",
                 "moe_layer_start_index")  # fmt: skip


def _layer_types(c: Any, n: int) -> Flags | None:
    types = getattr(c, "mlp_layer_types", None)
    return None if types is None else tuple(t != "dense" for t in types)


def _listed(c: Any, n: int) -> Flags | None:
    chosen = getattr(c, "moe_layers", None)
    return None if chosen is None else tuple(i in set(chosen) for i in range(n))


def _sparse_step(c: Any, n: int) -> Flags | None:
    step, dense = getattr(c, "decoder_sparse_step", None), getattr(c, "mlp_only_layers", None)
    if not step:
        return None
    return tuple(i not in set(dense or ()) and (i + 1) % step == 0 for i in range(n))


def _interval(c: Any, n: int) -> Flags | None:
    interval = getattr(c, "moe_layer_interval", None)
    if not interval:
        return None
    start = getattr(c, "moe_layer_start_index", None) or 0
    end = getattr(c, "moe_layer_end_index", None)
    end = n - 1 if end is None or end < 0 else end
    return tuple((i + 1) % interval == 0 and start <= i <= end for i in range(n))


def _period(c: Any, n: int) -> Flags | None:
    period = getattr(c, "expert_layer_period", None)
    if not period:
        return None
    offset = getattr(c, "expert_layer_offset", None) or 0
    return tuple(i % period == offset for i in range(n))


def _dense_first(name: str) -> Callable[[Any, int], Flags | None]:
    def read(c: Any, n: int) -> Flags | None:
        count = getattr(c, name, None)
        return None if not isinstance(count, int) else tuple(i >= count for i in range(n))

    return read


def _dense_listed(c: Any, n: int) -> Flags | None:
    dense = getattr(c, "mlp_only_layers", None)
    return None if dense is None else tuple(i not in set(dense) for i in range(n))


# (the field that names the reader, the reader: config, layer count -> a flag per layer or
# None where the config lacks the field), most specific first.
READERS: tuple[tuple[str, Callable[[Any, int], Flags | None]], ...] = (
    ("mlp_layer_types", _layer_types),
    ("moe_layers", _listed),
    ("decoder_sparse_step", _sparse_step),
    ("moe_layer_interval", _interval),
    ("expert_layer_period", _period),
    *((name, _dense_first(name)) for name in _DENSE_COUNTS),
    ("mlp_only_layers", _dense_listed),
)


def pattern_field(config: Any, held: Flags) -> str | None:
    """The field of `config` (a twin's) saying which layers hold experts: the first of
    `READERS` whose flags are `held` (the twin's layers: True where a mixture). None where
    every layer holds one and no field says so; a ValueError where some layer is dense and
    no field says which."""
    read = {name: reader(config, len(held)) for name, reader in READERS}
    found = next((name for name, flags in read.items() if flags == held), None)
    if found is not None or all(held):
        return found
    given = {name: list(flags) for name, flags in read.items() if flags is not None}
    raise ValueError(
        f"the twin's layers hold experts at {list(held)}, which no config field gives "
        f"(read: {given or 'none of ' + str([name for name, _ in READERS])})"
    )


def moe_layers(config: Any, field: str, n_layers: int) -> Flags:
    """Which of `n_layers` layers of `config` hold experts, as its `field` says
    (`pattern_field`)."""
    flags = dict(READERS)[field](config, n_layers)
    if flags is None or len(flags) != n_layers:
        raise ValueError(f"{field}={getattr(config, field, None)!r} gives no flag per layer "
                         f"for {n_layers} layers")  # fmt: skip
    return flags
