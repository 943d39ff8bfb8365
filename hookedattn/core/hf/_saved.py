"""What `save_pretrained` writes for a tiny twin: the names a checkpoint of its architecture
keeps its tensors under, which may differ from the live model's (`transformers` 5 converts
some architectures' weights on load and back on save: a block renamed, experts split).

The importer by convention reads a live model by its module names and a folder by the
names found here: the twin is saved once (kept on the twin), and each live tensor is
matched to the saved tensor equal to it (the twin's weights are random, so equal values
mean the same tensor); a live name with no saved twin is left as it is (the table's check
then names it, if a checkpoint lacks it).
"""

import re
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from hookedattn.core.hf import _loading


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
    return tuple(sorted(found.items()))


def _template(name: str, layers: str) -> str:
    return re.sub(rf"^({re.escape(layers)})\.\d+\.", r"\1.{layer}.", name)
