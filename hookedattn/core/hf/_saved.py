"""What `save_pretrained` writes for a tiny twin: the names a checkpoint of its architecture
keeps its tensors under, which may differ from the live model's (`transformers` 5 converts
some architectures' weights on load and back on save: a block renamed, experts split).

The importer by convention reads a live model by its module names and a folder by the
names found here: the twin is saved once (kept on the twin), and each live tensor is
matched to the saved tensor equal to it (the twin's weights are random, so equal values
mean the same tensor), or to the part of a saved tensor that stacks several live ones
(`name#part/parts`: the table reads that part of its rows); a live name with no saved twin
is left as it is (the table's check then names it, if a checkpoint lacks it). `renamed`
turns a family's rules into rules reading those names.
"""

import dataclasses
import itertools
import re
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from hookedattn.core.hf import _loading
from hookedattn.core.hf._joined import SEPARATOR
from hookedattn.core.hf._table import Rule


def saved(twin: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor `save_pretrained` writes for `twin`, by name (saved once per twin)."""
    tensors = getattr(twin, "_hookedattn_saved", None)
    if tensors is None:
        tensors = {}
        with tempfile.TemporaryDirectory(prefix="hookedattn-saved-") as folder:
            save_twin(twin, Path(folder))
            for path in sorted(Path(folder).glob("*.safetensors")):
                with safe_open(path, "pt") as file:
                    for name in file.keys():  # noqa: SIM118 - not iterable itself
                        tensors[name] = file.get_tensor(name)
        twin._hookedattn_saved = tensors
    return tensors


def save_twin(twin: nn.Module, folder: Path) -> None:
    """`twin.save_pretrained(folder)`, without its progress bars, on whichever process calls
    it: under torchrun `transformers` writes on rank 0 only, and each rank works out its
    own twin's files (without this, every other rank would find none)."""
    twin.should_save_on_this_rank = lambda is_main_process: True
    logging = _loading.transformers_module().utils.logging
    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        twin.save_pretrained(folder)
    finally:
        if shown:
            logging.enable_progress_bar()


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
            found[_template(name, layers)] = _saved_template(matches[0], name, layers)
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
        held = _saved_names_of(module, found, layers)
        pieces = [n for n, t in spare.items() if n.startswith(held)
                  and n.endswith(f".{kind}") and n.count(".") == name.count(".")
                  and t.dim() == tensor.dim() and t.shape[1:] == tensor.shape[1:]]  # fmt: skip
        if not 2 <= len(pieces) <= 4 or sum(spare[n].shape[0] for n in pieces) != len(tensor):
            continue
        for order in itertools.permutations(pieces):
            if torch.equal(torch.cat([spare[n] for n in order]), tensor.detach()):
                out[_template(name, layers)] = SEPARATOR.join(_template(n, layers) for n in order)
                break
    return out


def _saved_names_of(module: str, found: dict[str, str], layers: str) -> tuple[str, ...]:
    """The prefixes (`"name."`) under which `module`'s tensors are saved: its own name, and
    the names its tensors matched by value were found under (a module saved under another
    name: Bailing Hybrid's `self_attn` as `attention`)."""
    own = _template(f"{module}.", layers)
    index = re.match(rf"{re.escape(layers)}\.(\d+)\.", module)
    prefixes = {f"{module}."}
    for live, saved in found.items():
        rest = live[len(own) :]
        if live.startswith(own) and saved.endswith(f".{rest}") and "#" not in saved:
            prefix = saved[: -len(rest)]
            prefixes.add(prefix if index is None else prefix.replace("{layer}", index.group(1)))
    return tuple(sorted(prefixes))


def _template(name: str, layers: str) -> str:
    return re.sub(rf"^({re.escape(layers)})\.\d+\.", r"\1.{layer}.", name)


def _saved_template(saved: str, live: str, layers: str) -> str:
    """`saved` (the file's name of the live tensor `live`) with its layer index as
    `{layer}`: the first path component equal to `live`'s layer index, wherever the files
    keep their layers (EXAONE's `transformer.h.0.` for `model.layers.0.`)."""
    index = re.match(rf"{re.escape(layers)}\.(\d+)\.", live)
    if index is None:
        return _template(saved, layers)
    return re.sub(rf"(^|\.){index.group(1)}\.", r"\1{layer}.", saved, count=1)


@dataclasses.dataclass(frozen=True)
class Renames:
    """The files' names of live tensors (`renames`: the layer index as `{layer}`),
    looked up for a rule's name with its layer index or `{layer}` (a hybrid's rules name
    the layers that hold their sublayer)."""

    names: dict[str, str]
    layers: str  # "model.layers"

    def get(self, hf: str, default: str) -> str:
        """The saved name of `hf`, else `default`."""
        found = re.match(rf"{re.escape(self.layers)}\.(\d+)\.", hf)
        if found is None:
            return self.names.get(hf, default)
        template = f"{self.layers}.{{layer}}.{hf[found.end() :]}"
        saved = self.names.get(template)
        return default if saved is None else saved.replace("{layer}", found.group(1))


def renamed(rules: list[Rule], renames: Renames) -> list[Rule]:
    """The rules reading the files' names (`renames`); a live tensor saved as part
    `i` of several stacked (`name#i/n`) read as that piece of the saved tensor's rows, the
    pieces' sizes those of the rules that read them (a live tensor itself read in pieces,
    Lara Mini's `in_proj_qkv`, brings its pieces into the saved tensor's)."""
    pieces: dict[str, dict[int, tuple[str, ...]]] = {}
    for rule in rules:
        saved, _, part = renames.get(rule.hf or "", "").partition("#")
        if part:  # the first axis of the rule's pattern is its piece: "(head d_head)"
            first = (
                rule.pattern.split(")")[0] + ")"
                if rule.pattern[0] == "("
                else rule.pattern.split()[0]
            )
            own = rule.split or (first.strip("()"),)
            pieces.setdefault(saved, {})[int(part.split("/")[0])] = own
    out = []
    for rule in rules:
        saved, _, part = renames.get(rule.hf or "", rule.hf or "").partition("#")
        if not part:
            out.append(rule if rule.hf is None else dataclasses.replace(rule, hf=saved))
            continue
        i, n = (int(x) for x in part.split("/"))
        if rule.split_within or rule.pick is not None or len(pieces[saved]) != n:
            raise ValueError(f"{rule.hf} is saved as part {i} of {saved}, read by no rule")
        split = tuple(piece for j in range(n) for piece in pieces[saved][j])
        before = sum(len(pieces[saved][j]) for j in range(i))
        out.append(dataclasses.replace(rule, hf=saved, split=split, part=before + rule.part))
    return out
