"""Generation: a prompt continued token by token, as an experiment one can watch and steer.

    _options    GenerationOptions (every choice, checked once) and Prompt (the ids to
                continue, checked once)
    _loop       the one loop: each step the model's own forward over the new tokens,
                with a KV cache; GenerationStep, Generated, generation_position
    _sampling   choosing the next token: greedy, sampled (per-row seeds), the frequency
                penalty as a logits step
    _stopping   when a row ends: stop tokens, stop strings, its own limit
    _recording  the activations of every step, joined into one cache
    _entry      generate and generate_steps, the entry points
    _stream     generate_stream: the output in chunks as it grows

`HookedTransformer.generate`, `generate_steps` and `generate_stream` are the functions
here; the TransformerLens facade calls them with TL's defaults. See the generation guide
(docs/guide/generation.md) for what a step records and what it costs.
"""

from hookedattn.core.generation._entry import GenerationWithCache, generate, generate_steps
from hookedattn.core.generation._loop import (
    Generated,
    GenerationPosition,
    GenerationStep,
    generation_position,
    generation_steps,
)
from hookedattn.core.generation._options import GenerationOptions, Prompt, prompt_of
from hookedattn.core.generation._sampling import (
    RowSampler,
    Sampling,
    choose_next_tokens,
    next_token_probs,
)
from hookedattn.core.generation._stopping import StopRule
from hookedattn.core.generation._stream import generate_stream

__all__ = [
    "Generated",
    "GenerationOptions",
    "GenerationPosition",
    "GenerationStep",
    "GenerationWithCache",
    "Prompt",
    "RowSampler",
    "Sampling",
    "StopRule",
    "choose_next_tokens",
    "generate",
    "generate_steps",
    "generate_stream",
    "generation_position",
    "generation_steps",
    "next_token_probs",
    "prompt_of",
]
