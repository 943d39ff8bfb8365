"""Gradient methods on a model split over two ranks, against the same model in one process.

    torchrun --nproc_per_node 2 scripts/tp_gradient_methods.py --dtype float64

Every rank loads the shipped `bytes-gelu-2l` and splits a copy of it over the two ranks
(`parallel.tensor_parallel`: each rank keeps half of every layer's heads and neurons, and
half the vocabulary; a checkpoint too big for one device loads split, `tp_size=2`).
Attribution patching (every kind), EAP, EAP-IG and an attribution graph (with the shipped
per-layer transcoders) run on both; then each model collects an activation store (in
`--out`, rank 0 writing) and one step of SAE and of transcoder training runs on each store.
Each rank prints, per method, the largest absolute difference and the largest value (the
split model's answer is on every rank).
"""

import argparse
import copy
from pathlib import Path

import torch
from torch import Tensor

from analysis import attribution_graph, attribution_patch, edge_attribution
from hookedattn import HookedTransformer
from hookedattn.core import parallel
from hookedattn.sae import load_pretrained_transcoders
from hookedattn.sae.training import train_sae
from hookedattn.sae.transcoder_training import train_transcoder
from hookedattn.store import ActivationStore, collect_activations


def main() -> None:
    """Run each method on the split and the whole model; print the differences."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    parser.add_argument("--out", type=Path, default=Path("/tmp/hookedattn-tp-stores"))
    options = parser.parse_args()
    dtype = getattr(torch, options.dtype)
    whole = HookedTransformer.from_pretrained("bytes-gelu-2l", dtype=dtype)
    split = parallel.tensor_parallel(copy.deepcopy(whole), parallel.tensor_parallel_group(2))

    clean = whole.to_tokens(["The cat sat on the mat.", "The dog ran to the park"])
    corrupted = whole.to_tokens(["The cat sat on the rug.", "The dog ran to the yard"])
    a, e = (
        whole.to_tokens("a", prepend_bos=False)[0, 0],
        whole.to_tokens("e", prepend_bos=False)[0, 0],
    )
    metric = lambda logits: logits[:, -1, a] - logits[:, -1, e]
    runs = dict(clean_tokens=clean, corrupted_tokens=corrupted, metric=metric)

    found: dict[str, list[tuple[Tensor, Tensor]]] = {}
    kinds = attribution_patch(whole, None, **runs)
    found["attribution_patch"] = [
        (result.per_prompt, kinds[kind].per_prompt)
        for kind, result in attribution_patch(split, None, **runs).items()
    ]
    for method in ("eap", "eap-ig"):
        got = edge_attribution(split, method=method, **runs).per_prompt
        found[method] = [(got, edge_attribution(whole, method=method, **runs).per_prompt)]
    transcoders = [t.to(dtype) for t in load_pretrained_transcoders("bytes-gelu-2l")]
    got = attribution_graph(split, transcoders, clean[0], top_k=3)
    expected = attribution_graph(whole, transcoders, clean[0], top_k=3)
    found["attribution_graph"] = [(got.adjacency, expected.adjacency)]
    found |= _training_steps(whole, split, options.out)

    rank = split.tp.rank
    held = sum(p.numel() for p in split.parameters()) / sum(p.numel() for p in whole.parameters())
    print(f"rank {rank}  holds {held:.3f} of the parameters")
    for method, pairs in found.items():
        difference = max(float((a - b).abs().max()) for a, b in pairs)
        largest = max(float(b.abs().max()) for _, b in pairs)
        print(f"rank {rank}  {method:<22} max |split - one process| = {difference:.1e}"
              f"  (values up to {largest:.3f})")  # fmt: skip


def _training_steps(
    whole: HookedTransformer, split: HookedTransformer, out: Path
) -> dict[str, list[tuple[Tensor, Tensor]]]:
    """A store collected by each model (8 random contexts, the same on every rank), and one
    step of SAE and transcoder training on each: the split model's parameters against the
    one-process model's."""
    shape, generator = (8, whole.cfg.n_ctx), torch.Generator().manual_seed(5)
    tokens = torch.randint(0, whole.cfg.d_vocab, shape, generator=generator)
    names = ["blocks.1.mlp.hook_post", "blocks.1.ln2.hook_out", "blocks.1.hook_mlp_out"]
    stores = {}
    for label, model in (("split", split), ("one", whole)):
        folder = out / label
        collect_activations(model, tokens, names=names, out=folder, batch_size=2, progress=False,
                            overwrite=True)  # fmt: skip
        stores[label] = ActivationStore(folder, model=model)
    args = dict(d_sae=24, l1=1.0, steps=1, batch_size=8, progress=False)
    sae = [train_sae(stores[k], "blocks.1.mlp.hook_post", **args) for k in ("split", "one")]
    transcoder = [train_transcoder(stores[k], 1, **args) for k in ("split", "one")]
    return {
        f"{kind} step": list(zip(got.parameters(), expected.parameters(), strict=True))
        for kind, (got, expected) in (("train_sae", sae), ("train_transcoder", transcoder))
    }


if __name__ == "__main__":
    main()
