"""The residual decomposition summing to the last stream: the check shared by the tests of
each mixer's hybrid (tests/core) and of the imports (tests/hf, through `helpers.twins`)."""

import torch


def assert_decomposition_sums_in(model, cache, granularities: tuple[str, ...]) -> dict:
    """`decompose_resid` of `model`'s `cache` at each granularity sums to the last stream
    (float64: to 1e-10); returns each granularity's decomposition."""
    from analysis import decompose_resid

    final = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    decompositions = {}
    for granularity in granularities:
        decomposition = decompose_resid(model, cache, granularity=granularity)
        torch.testing.assert_close(decomposition.components.sum(0), final, rtol=0, atol=1e-10)
        decompositions[granularity] = decomposition
    return decompositions
