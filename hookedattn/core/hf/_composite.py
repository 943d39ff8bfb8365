"""A composite (multimodal) checkpoint's language model: its text part, imported alone.

A composite config (Gemma 3's `Gemma3Config`, GOT-OCR 2's, ...) holds one config per part
(`text_config`, `vision_config`, `audio_config`); its model runs the vision or audio towers
only on the images or sounds it is given, and on text alone is its language model: the
decoder built from `text_config`, then the unembedding. A researcher opening such a
checkpoint for its language model gets exactly that: the text config's causal LM (its
family, by class or by convention), verified as that causal LM, with the language model's
tensors read from under the prefix the checkpoint keeps them at. The towers are left out,
and a log line names them.

    a live model   a text causal LM of `transformers` built on the meta device whose base
                   model and unembedding are the composite's own modules (no copy)
    a folder       its tensors renamed: the prefix under which the file keeps the language
                   model (`model.language_model.`, or `language_model.model.` as older
                   files have it) found by matching the text causal LM's own tensor names
"""

import copy
import dataclasses
import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from hookedattn.core.hf import _loading

_LOG = logging.getLogger(__name__)


def text_config(hf_config: Any) -> Any | None:
    """The language model's config of a composite config (naming its causal-LM class in
    `architectures`); None for a config of one part."""
    if hasattr(hf_config, "num_hidden_layers") or not hasattr(hf_config, "get_text_config"):
        return None
    text = hf_config.get_text_config(decoder=True)
    if text is hf_config or not hasattr(text, "num_hidden_layers"):
        return None
    if not getattr(text, "architectures", None):
        text = copy.copy(text)  # the composite's own sub-config stays as it was
        text.architectures = [text_architecture(text, hf_config)]
    return text


def text_architecture(text: Any, composite: Any = None) -> str:
    """The `transformers` causal-LM class of a text config: the one it names, else the one
    of its model type, else (Mllama's text model) the one of the composite's model type
    where that class is built from such a config."""
    transformers = _loading.transformers_module()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    named = [n for n in getattr(text, "architectures", None) or () if n in causal]
    name = named[0] if named else MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(text.model_type)
    outer = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(composite, "model_type", None))
    if name is None and outer and isinstance(text, getattr(transformers, outer).config_class):
        name = outer
    if name is None:
        raise ValueError(f"its language model (model_type={text.model_type!r}) has no causal "
                         "LM class in transformers: not imported")  # fmt: skip
    return name


def left_out(hf_config: Any, architecture: str) -> None:
    """Log which parts of a composite checkpoint the import leaves out."""
    parts = [p for p in getattr(hf_config, "sub_configs", None) or () if p != "text_config"]
    _LOG.warning("%s: importing its language model only; %s left out",
                 architecture, ", ".join(parts) or "its other parts")  # fmt: skip


def text_model(hf_model: Any) -> Any:
    """A live composite model's language model as its own causal LM: built on the meta
    device from the decoder's config, then given the composite's decoder and unembedding
    (shared, not copied); a ValueError if anything of it is left unfilled."""
    decoder = hf_model.get_decoder()
    text = decoder.config
    architecture = text_architecture(text, hf_model.config)
    model_class = getattr(_loading.transformers_module(), architecture)
    with torch.device("meta"):
        lm = model_class(text)
    base = next((n for n, m in lm.named_children() if type(m) is type(decoder)), None)
    if base is None:
        raise ValueError(f"{model_class.__name__} holds no {type(decoder).__name__}")
    setattr(lm, base, decoder)
    lm.set_output_embeddings(hf_model.get_output_embeddings())
    unfilled = [n for n, t in (*lm.named_parameters(), *lm.named_buffers()) if t.is_meta]
    if unfilled:
        raise ValueError(f"the language model of {type(hf_model).__name__} as "
                         f"{model_class.__name__} leaves {unfilled[:3]} unfilled")  # fmt: skip
    left_out(hf_model.config, type(hf_model).__name__)
    return lm.train(hf_model.training)


class TextTensors:
    """A composite folder's tensors (a `TensorSource`) under the names its language model's
    causal LM gives them: the language model's prefix in the files replaced by the causal
    LM's, the unembedding found wherever it is kept, every other part left out."""

    def __init__(self, source: Any, hf_config: Any) -> None:
        self._source = source
        text = text_config(hf_config)
        names = _causal_lm_names(text)
        self._stored = _renaming(names, text, source.shapes)
        # The composite ties its unembedding to the language model's embedding where its
        # text config does not say so: a file keeps the tensor once, as the embedding.
        unembed, embed = names.unembedding, names.embedding
        tied = getattr(hf_config, "tie_word_embeddings", False)
        if unembed not in self._stored and tied and not text.tie_word_embeddings:
            self._stored[unembed] = self._stored[embed]
        self.shapes = {ours: source.shapes[name] for ours, name in self._stored.items()}
        self.dtypes = {ours: source.dtypes[name] for ours, name in self._stored.items()}

    def get(self, name: str) -> Tensor:
        """The tensor the language model calls `name`."""
        return self._source.get(self._stored[name])

    def read_regions(self, name: str, regions: list[tuple[slice, ...]]) -> list[Tensor]:
        """The tensor `name` at each of `regions`, as the files' source reads them."""
        if hasattr(self._source, "read_regions"):
            return self._source.read_regions(self._stored[name], regions)
        whole = self.get(name)
        return [whole[region] for region in regions]

    def stored_dtype(self) -> torch.dtype:
        """The floating dtype most of the language model's tensors are stored in."""
        floating = [dtype for dtype in self.dtypes.values() if dtype.is_floating_point]
        return Counter(floating).most_common(1)[0][0] if floating else torch.float32


@dataclasses.dataclass(frozen=True)
class _Names:
    """A text causal LM's names: its base model's prefix, its tensors, its embedding's and
    unembedding's weights."""

    base: str
    tensors: tuple[str, ...]
    embedding: str
    unembedding: str


def _causal_lm_names(text: Any) -> _Names:
    """The names of the text causal LM of `text` (built on the meta device)."""
    model_class = getattr(_loading.transformers_module(), text_architecture(text))
    with torch.device("meta"):
        lm = model_class(text)
    modules = {id(m): n for n, m in lm.named_modules()}
    pretrained = _loading.transformers_module().PreTrainedModel
    base = next(n for n, m in lm.named_children() if isinstance(m, pretrained))
    return _Names(
        base + ".",
        tuple(lm.state_dict()),
        modules[id(lm.get_input_embeddings())] + ".weight",
        modules[id(lm.get_output_embeddings())] + ".weight",
    )


def _renaming(names: _Names, text: Any, stored: Mapping[str, Any]) -> dict[str, str]:
    """Our name -> the stored name of each of the language model's tensors: every stored
    tensor under the prefix that holds the base model's, and the others (the unembedding)
    where a stored name ends as theirs."""
    base, all_names = names.base, names.tensors
    inner = {n.removeprefix(base) for n in all_names if n.startswith(base)}
    prefix = _prefix(inner, stored)
    if prefix is None:
        raise ValueError(f"no tensors of its language model ({text.model_type}) found in "
                         "the composite checkpoint")  # fmt: skip
    renamed = {base + k.removeprefix(prefix): k for k in stored if k.startswith(prefix)}
    outer = {n for n in all_names if not n.startswith(base)}
    for name in outer:
        found = [k for k in stored if k == name or k.endswith("." + name)]
        if len(found) > 1:
            raise ValueError(f"the composite checkpoint keeps {name} more than once: {found}")
        renamed |= {name: found[0]} if found else {}
    return renamed


def _prefix(inner: set[str], stored: Iterable[str]) -> str | None:
    """The prefix under which most stored names end as one of `inner` (the base model's
    names): the language model's, since a tower's names share only some of them."""
    hits: Counter[str] = Counter()
    for key in stored:
        parts = key.split(".")
        for i in range(1, len(parts)):
            if ".".join(parts[i:]) in inner:
                hits[".".join(parts[:i]) + "."] += 1
                break
    return hits.most_common(1)[0][0] if hits else None
