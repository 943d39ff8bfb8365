"""What `save_pretrained` writes for a tiny twin: the names a checkpoint of its architecture
keeps its tensors under, which may differ from the live model's (`transformers` 5 converts
some architectures' weights on load and back on save: a block renamed, experts split).

The importer by convention reads a live model by its module names and a folder by the
names found here: the twin is saved once (kept on the twin), and each live tensor is
matched to the saved tensor equal to it (the twin's weights are random, so equal values
mean the same tensor), or to the part of a saved tensor that stacks several live ones
(`name#part/parts`: the table reads that part of its rows); a live name with no saved twin
is left as it is (the table's check then names it, if a checkpoint lacks it).
"""

import itertools
import re
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from hookedattn.core.hf import _loading
from hookedattn.core.hf._joined import SEPARATOR


def saved(twin: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor `save_pretrained` writes for `twin`, by name (saved once per twin)."""
    tensors = getattr(twin, "_hookedattn_saved", None)
    if tensors is None:
        tensors = {}
        logging = _loading.transformers_module().utils.logging
        shown = logging.is_progress_bar_enabled()
        logging.disable_progress_bar()
        try:
            with tempfile.TemporaryDirectory(prefix="hookedattn-saved-") as folder:
                twin.save_pretrained(folder)
                for path in sorted(Path(folder).glob("*.safetensors")):
                    with safe_open(path, "pt") as file:
                        for name in file.keys():  # noqa: SIM118 - not iterable itself
                            tensors[name] = file.get_tensor(name)
        finally:
            if shown:
                logging.enable_progress_bar()
        twin._hookedattn_saved = tensors
    return tensors


def renames(twin: nn.Module, layers: str) -> tuple[tuple[str, str], ...]:
    """(live name, saved name) for each of the twin's tensors saved under another name, the
    decoder layers' index as `{layer}` (`layers`: the layer list's name, "model.layers")."""
    files = saved(twin)
    by_value = {}
    for name, tensor in files.items():
        by_value.setdefault((tuple(tensor.shape), tensor.double().sum().item()), []).append(name)
    found = {}
    for name, tensor in twin.state_dict().items():
        if name in files:
            continue
        key = (tuple(tensor.shape), tensor.detach().double().sum().item())
        matches = [n for n in by_value.get(key, []) if torch.equal(files[n], tensor.detach())]
        if len(matches) == 1:
            found[_template(name, layers)] = _template(matches[0], layers)
    found |= _fused(files, twin, found, layers)
    found |= _joined_pieces(files, twin, found, layers)
    return tuple(sorted(found.items()))


def _fused(
    files: dict[str, torch.Tensor], twin: nn.Module, found: dict[str, str], layers: str
) -> dict[str, str]:
    """Live tensors saved as one (Sarvam's q, k and v maps, `attention.query_key_value`):
    each unmatched saved tensor that is the rows of one module's unmatched live tensors of
    the same kind, stacked in their order, as (live name, "saved name#part/parts")."""
    live = {n: t.detach() for n, t in twin.state_dict().items()
            if n not in files and _template(n, layers) not in found}  # fmt: skip
    taken = set(found.values())
    groups: dict[tuple[str, str], list[str]] = {}
    for name in live:
        parent, _, kind = name.rpartition(".")
        groups.setdefault((parent.rpartition(".")[0], kind), []).append(name)
    out = {}
    for saved_name, tensor in files.items():
        if _template(saved_name, layers) in taken:
            continue
        for (_, kind), names in groups.items():
            if len(names) < 2 or not saved_name.endswith(f".{kind}"):
                continue
            parts = [live[n] for n in names]
            if tensor.shape[1:] == parts[0].shape[1:] and torch.equal(torch.cat(parts), tensor):
                for i, n in enumerate(names):
                    out[_template(n, layers)] = f"{_template(saved_name, layers)}#{i}/{len(names)}"
    return out


def _joined_pieces(
    files: dict[str, torch.Tensor], twin: nn.Module, found: dict[str, str], layers: str
) -> dict[str, str]:
    """Live tensors saved in pieces (OLMo Hybrid's convolution as `q_conv1d`, `k_conv1d`,
    `v_conv1d`: `_joined`): each unmatched live tensor whose rows are those of two to four
    unmatched saved tensors of its module and kind, in some order, as (live name, the
    pieces' names joined by `+` in that order)."""
    taken = set(found.values()) | {p.partition("#")[0] for p in found.values()}
    spare = {n: t for n, t in files.items() if _template(n, layers) not in taken}
    out = {}
    for name, tensor in twin.state_dict().items():
        if name in files or _template(name, layers) in found or tensor.dim() == 0:
            continue
        module, kind = name.rpartition(".")[0].rpartition(".")[0], name.rpartition(".")[2]
        pieces = [n for n, t in spare.items() if n.startswith(f"{module}.")
                  and n.endswith(f".{kind}") and n.count(".") == name.count(".")
                  and t.dim() == tensor.dim() and t.shape[1:] == tensor.shape[1:]]  # fmt: skip
        if not 2 <= len(pieces) <= 4 or sum(spare[n].shape[0] for n in pieces) != len(tensor):
            continue
        for order in itertools.permutations(pieces):
            if torch.equal(torch.cat([spare[n] for n in order]), tensor.detach()):
                out[_template(name, layers)] = SEPARATOR.join(_template(n, layers) for n in order)
                break
    return out


def _template(name: str, layers: str) -> str:
    return re.sub(rf"^({re.escape(layers)})\.\d+\.", r"\1.{layer}.", name)
