"""A model saved and loaded again: the check shared by the tests of each mixer's hybrid
(tests/core) and of the imports that save (tests/hf)."""

import torch


def assert_saves_and_loads(model, folder, tokens: torch.Tensor):
    """`model` saved to `folder` loads with its config and exactly its logits on `tokens`;
    returns the loaded model."""
    from hookedattn import HookedTransformer

    model.save(folder)
    loaded = HookedTransformer.load(folder)
    assert loaded.cfg == model.cfg
    torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=0)
    return loaded
