"""SAE training throughput: `train_sae` against a plain PyTorch loop of the same SAE.

Both read the same batches from the same `ActivationStore` (shuffled, the same seed),
normalise them the same way, compute the same loss (squared error plus L1 on decoder-norm-
weighted activations), take the same Adam step and renormalise the decoder rows. The plain
loop is what one writes by hand: four parameters and a few lines, no hook points, no
logging. Runs alternate (ours, plain, plain, ours, ...) so a slow spell on a shared
machine hits both; we report the median tokens/s of each and their ratio.

Then one forward of 32 x 128 tokens: clean, with an SAE spliced, and clean plus the SAE run
alone on the activation (the most splicing should cost).

    python scripts/bench/sae.py --tokens 65536 --steps 100 --rounds 3
"""

import argparse
import statistics
import tempfile
import time

import torch

from hookedattn import HookedTransformer
from hookedattn.sae import SAEConfig, SparseAutoencoder, train_sae
from hookedattn.store import ActivationStore, collect_activations

POINT = "blocks.1.hook_resid_pre"


def plain_loop(store, d_sae, steps, batch_size, l1, seed) -> None:
    """The same training, written out with bare tensors."""
    stats = store.stats(POINT)
    mean, scale = stats.mean.float(), float(stats.var.mean().sqrt())
    d_in = mean.shape[0]
    W = torch.randn(d_sae, d_in, generator=torch.Generator().manual_seed(seed))
    W_dec = torch.nn.Parameter(W / W.norm(dim=-1, keepdim=True))
    W_enc = torch.nn.Parameter(W_dec.detach().T.clone())
    b_enc, b_dec = torch.nn.Parameter(torch.zeros(d_sae)), torch.nn.Parameter(torch.zeros(d_in))
    opt = torch.optim.Adam([W_enc, b_enc, W_dec, b_dec], lr=1e-3)
    step, epoch = 0, 0
    while step < steps:
        for batch in store.batches(
            POINT, batch_size, shuffle=True, seed=seed + epoch, drop_last=True
        ):
            x = (batch.float() - mean) / scale
            acts = torch.relu((x - b_dec) @ W_enc + b_enc)
            loss = ((acts @ W_dec + b_dec - x) ** 2).sum(-1).mean()
            loss = loss + l1 * (acts * W_dec.norm(dim=-1)).sum(-1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                W_dec.div_(W_dec.norm(dim=-1, keepdim=True))
            step += 1
            if step == steps:
                return
        epoch += 1


def splice_cost(model, sae, tokens, rounds: int) -> dict[str, float]:
    """Median seconds of a forward: clean, with the SAE spliced, and clean plus the SAE
    run alone on the activation (what splicing should cost at most)."""
    x = model.run_with_cache(tokens, names_filter=POINT)[1][POINT]

    def clean():
        model(tokens)

    def spliced():
        with model.saes([sae]):
            model(tokens)

    def separate():
        model(tokens)
        sae.with_error(x)

    times: dict[str, list[float]] = {"clean": [], "spliced": [], "clean + SAE alone": []}
    fns = {"clean": clean, "spliced": spliced, "clean + SAE alone": separate}
    with torch.no_grad():
        for _ in range(rounds):
            for label, fn in fns.items():
                start = time.perf_counter()
                fn()
                times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) for label, t in times.items()}


def main() -> None:
    """Collect a store from the shipped 2-layer model, then time both loops."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--d-sae", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = HookedTransformer.from_pretrained("bytes-attn-only-2l")
    with tempfile.TemporaryDirectory() as out:
        collect_activations(model, None, names=[POINT], out=out, context=128,
                            n_tokens=args.tokens, batch_size=32, progress=False)  # fmt: skip
        store = ActivationStore(out)
        common = dict(d_sae=args.d_sae, steps=args.steps, batch_size=args.batch_size, seed=0)

        def ours() -> None:
            train_sae(store, POINT, l1=1.0, progress=False, **common)

        def plain() -> None:
            plain_loop(store, l1=1.0, **common)

        times: dict[str, list[float]] = {"train_sae": [], "plain loop": []}
        for round_ in range(args.rounds):
            order = [("train_sae", ours), ("plain loop", plain)]
            for label, fn in order if round_ % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                fn()
                times[label].append(time.perf_counter() - start)
    tokens = args.steps * args.batch_size
    rate = {label: tokens / statistics.median(t) for label, t in times.items()}
    print(f"d_in={model.cfg.d_model} d_sae={args.d_sae} batch={args.batch_size} "
          f"steps={args.steps} threads={args.threads} rounds={args.rounds}")  # fmt: skip
    for label, r in rate.items():
        print(f"  {label:<10}  {r:>10,.0f} tokens/s")
    print(f"  train_sae / plain loop: {rate['train_sae'] / rate['plain loop']:.2f}x the speed")
    sae = SparseAutoencoder(SAEConfig(model.cfg.d_model, args.d_sae, POINT))
    tokens = torch.randint(
        0, model.cfg.d_vocab, (32, 128), generator=torch.Generator().manual_seed(0)
    )
    cost = splice_cost(model, sae, tokens, rounds=20)
    print("forward of 32 x 128 tokens, median of 20:")
    for label, seconds in cost.items():
        print(f"  {label:<18}  {seconds * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
