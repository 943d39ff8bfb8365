"""ALiBi recognised by convention: the linear bias an attention is handed, read off a twin.

BLOOM and MPT build their bias once per forward and hand it to every layer's attention (as
`alibi=`, `position_bias=`; Falcon's, folded into the attention mask, is not read here, and
its import is refused by the verification). Whatever its name, it is a tensor
`[(batch) head, 1, key_pos]` holding `slope[h] * (key - z)` for one key `z` where every head
is 0 (BLOOM's first key, MPT's last): a tensor of that form among the attention's inputs is
ALiBi, and its slopes are read off it (`slope[h]`: the value next to that zero, which is
the slope itself, rounded as the architecture rounds it, float32).

The slopes depend on the head count (`components.alibi`), and the twin has 4 heads where
a checkpoint has its own: `checkpoint_slopes` reads them off one more twin with the
checkpoint's head count (its widths small), so that the import keeps the checkpoint's own
slopes, rounded as `transformers` rounds them (BLOOM's powers of a float32 base and MPT's
`1 / 2 ** x` differ in the last bit for most head counts). The slopes read are remembered
in the verification's memo (`_verify.remember`, section "alibi"), keyed by the checkpoint
config's structure, so that the extra twin is built once per checkpoint structure.
"""

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from hookedattn.core.hf import _loading, _tiny, _verify

_TOKENS = (1, 5)


def slopes_handed(twin: nn.Module, attention: nn.Module, n_heads: int) -> tuple[float, ...] | None:
    """The ALiBi slopes handed to `attention` when `twin` runs (module docstring); None
    where no input of it is a linear bias."""
    seen: list[tuple[Any, ...]] = []

    def record(module: nn.Module, args: tuple, kwargs: dict) -> None:
        seen.append((*args, *kwargs.values()))

    handle = attention.register_forward_pre_hook(record, with_kwargs=True)
    vocab = twin.get_input_embeddings().weight.shape[0]
    tokens = torch.randint(0, vocab, _TOKENS, generator=torch.Generator().manual_seed(4))
    try:
        with torch.no_grad():
            twin(tokens)
    finally:
        handle.remove()
    found = [s for value in seen[0][1:] if (s := _linear_bias(value, n_heads)) is not None]
    return found[0] if found else None


def _linear_bias(value: Any, n_heads: int) -> tuple[float, ...] | None:
    """The slopes of `value` if it is `slope[h] * (key - z)` for `[(batch) head 1 key]`."""
    if not isinstance(value, Tensor) or not value.is_floating_point() or value.dim() < 3:
        return None
    n_keys = value.shape[-1]
    if value.shape[-2] != 1 or n_keys < 2 or value.numel() % (n_heads * n_keys):
        return None
    rows = value.reshape(-1, n_heads, n_keys)[0].double()  # [head key]
    zeros = [z for z in range(n_keys) if bool((rows[:, z] == 0).all())]
    if len(zeros) != 1:
        return None
    z = zeros[0]
    slopes = rows[:, z + 1] if z + 1 < n_keys else -rows[:, z - 1]
    distance = torch.arange(n_keys, dtype=torch.float64) - z
    expected = slopes[:, None] * distance
    if not bool((slopes != 0).any()) or not torch.allclose(rows, expected, rtol=1e-5, atol=0):
        return None
    return tuple(float(s) for s in slopes)


def fields(hf_config: Any, architecture: str, attention: str) -> dict[str, Any]:
    """Our config's positional fields for an ALiBi checkpoint: its own slopes, as
    `transformers` rounds them (`attention`: the first layer's, by its name in the model)."""
    key = _verify.structure_key(hf_config, architecture=architecture, attention=attention)
    remembered = _verify.read_memo("alibi").get(key)
    if remembered is not None:
        slopes = tuple(float(s) for s in remembered["slopes"])
    else:
        first_attention = lambda twin: twin.get_submodule(attention)
        slopes = checkpoint_slopes(hf_config, architecture, first_attention)
        _verify.remember(key, {"slopes": list(slopes)}, section="alibi")
    return {"positional_embedding_type": "alibi", "alibi_slopes": slopes}


def checkpoint_slopes(
    hf_config: Any, architecture: str, attention_of: Callable[[nn.Module], nn.Module]
) -> tuple[float, ...]:
    """The slopes `transformers` gives a model of `hf_config`'s head count, read off a twin
    with that many heads, two dimensions each (`attention_of`: its first layer's attention)."""
    fields = _tiny.shrunk(hf_config.to_dict())
    n_heads = int(hf_config.num_attention_heads)
    for names, value in ((_tiny._HEADS, n_heads), (_tiny._WIDTHS, 2 * n_heads)):
        fields |= {name: value for name in names if name in fields}
    config = type(hf_config).from_dict(fields)
    model_class = getattr(_loading.transformers_module(), architecture)
    with torch.random.fork_rng(devices=[]):
        twin = _tiny.random_hf_model(model_class, config)
    slopes = slopes_handed(twin, attention_of(twin), n_heads)
    if slopes is None:
        raise ValueError(f"no ALiBi bias reached the attention of a {n_heads}-head twin")
    return slopes
