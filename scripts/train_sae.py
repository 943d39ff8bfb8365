"""Train an SAE on a shipped model's activations, evaluate it on held-out text, save it.

    python scripts/train_sae.py --model bytes-attn-only-2l --point blocks.1.hook_resid_pre \
        --k 16 --d-sae 512 --steps 2000 \
        --out hookedattn/sae/pretrained/bytes-attn-only-2l/blocks.1.hook_resid_pre

Collects `--tokens` activations of the training split (the standard library's source) into
a temporary `ActivationStore`, trains with `train_sae` (one thread: the result is the same
on every run), evaluates on 64 evenly spaced windows of 128 tokens of the held-out split
(files the model never trained on), and writes the SAE with `training.json`: the command,
the settings and the evaluation table.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from hookedattn import HookedTransformer
from hookedattn.sae import evaluate_sae, train_sae
from hookedattn.store import ActivationStore, collect_activations, weights_sha256
from hookedattn.training.corpus import heldout_windows, load_stdlib_corpus


def main() -> None:
    """Parse the arguments, train, evaluate and save."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bytes-attn-only-2l")
    parser.add_argument("--point", default="blocks.1.hook_resid_pre")
    parser.add_argument("--d-sae", type=int, default=512)
    parser.add_argument("--k", type=int, default=None, help="TopK SAE with this k")
    parser.add_argument("--l1", type=float, default=None, help="ReLU SAE with this L1")
    parser.add_argument("--l0", type=float, default=None, help="JumpReLU SAE, this L0 penalty")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--resample-every", type=int, default=None, help="resample dead features")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--tokens", type=float, default=5e5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = HookedTransformer.from_pretrained(args.model)
    with tempfile.TemporaryDirectory() as acts:
        collect_activations(model, None, names=[args.point], out=acts, context=128,
                            n_tokens=args.tokens, batch_size=32, progress=False)  # fmt: skip
        store = ActivationStore(acts, model=model)
        sae = train_sae(store, args.point, d_sae=args.d_sae, steps=args.steps, k=args.k,
                        l1=args.l1, l0=args.l0, lr=args.lr, resample_every=args.resample_every,
                        batch_size=args.batch_size, seed=args.seed)  # fmt: skip
    heldout = heldout_windows(load_stdlib_corpus().heldout, 64, 128)
    result = evaluate_sae(model, sae, heldout)
    print(result)
    sae.save(args.out)
    record = {
        "command": "python scripts/train_sae.py " + " ".join(sys.argv[1:]),
        "model": args.model,
        "model_weights_sha256": weights_sha256(model),
        "evaluation": "64 evenly spaced windows of 128 tokens of the held-out split",
        "results": dict(result.rows()),
    }
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
