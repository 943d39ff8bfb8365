"""Assertions for test suites that pin down facts about a model, and the pytest plugin.

    from hookedattn.testing import assert_residual_identities, assert_no_hooks

    _, cache = model.run_with_cache(tokens)
    assert_residual_identities(model, cache)   # every residual-stream identity holds
    assert_no_hooks(model)                     # nothing left attached by the test

Tiny seeded models and tokens to test with: `tiny_model(**config_fields)`,
`random_tiny_model(...)` (every parameter random, so no forgotten bias or gain hides) and
`random_tokens(d_vocab, batch, pos, seed)`. A `transformers` model run in float64 with no
step rounded to float32 (its RMSNorms and softmaxes cast to float32 otherwise), to hold a
float64 import to 1e-12: `with float64_throughout(): hf_model.double()(tokens)`. An
independent, written-out forward to hold a model to: `reference_forward(model, tokens)`,
i.e. `ReferenceTransformer(model)(tokens)`.
The constants both take from published sources rather than the model's config (the
attention scale, the norms' epsilon, the rotary base): `published_constants(d_head)`, in
`hookedattn.testing.published` with the source of each.

Every helper fails with an `AssertionError` that says which activation or component, at
which position, the largest error and the tolerance it broke. Tolerances by dtype come
from `hookedattn.core.tolerances` (re-exported here). Nothing here imports pytest; the fixtures
live in the top-level module `pytest_hookedattn`, which pytest loads by itself once
hookedattn is installed, and which imports nothing heavy until a fixture is used (see its
docstring; `hookedattn.testing.pytest_plugin` is the same plugin under the package's name).
"""

from hookedattn.core.float64 import float64_throughout
from hookedattn.core.tolerances import TOLERANCES, Tolerance, tolerance
from hookedattn.testing.caches import assert_close_cache
from hookedattn.testing.decomposition import DecompositionLike, assert_decomposes
from hookedattn.testing.hooks import assert_no_hooks, describe_handles
from hookedattn.testing.identities import IdentityCheck, assert_residual_identities
from hookedattn.testing.models import (
    TINY_CONFIG,
    random_tiny_model,
    random_tokens,
    randomize_parameters,
    tiny_model,
)
from hookedattn.testing.published import (
    Constants,
    attention_scale,
    checkpoint_constants,
    gelu_tanh,
    published_constants,
)
from hookedattn.testing.reference import ReferenceTransformer, reference_forward

__all__ = [
    "TINY_CONFIG",
    "TOLERANCES",
    "Constants",
    "DecompositionLike",
    "IdentityCheck",
    "ReferenceTransformer",
    "Tolerance",
    "assert_close_cache",
    "assert_decomposes",
    "assert_no_hooks",
    "assert_residual_identities",
    "attention_scale",
    "checkpoint_constants",
    "describe_handles",
    "float64_throughout",
    "gelu_tanh",
    "published_constants",
    "random_tiny_model",
    "random_tokens",
    "randomize_parameters",
    "reference_forward",
    "tiny_model",
    "tolerance",
]
