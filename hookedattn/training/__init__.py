"""Training the shipped models: the stdlib byte corpus, the trainer, checkpoints, recipes.

Application code beside the library: nothing in `hookedattn`'s model, cache or weights
depends on it. `scripts/train.py` is its command line.

- `corpus`: the Python standard library's own source as bytes, split by file name, and
  repeated random sequences (the synthetic half of each batch);
- `config`: `TrainConfig` and its learning-rate schedule;
- `trainer`: `train(model, corpus, cfg, run_dir)`, deterministic and resumable;
- `evaluation`: the losses measured every `eval_every` steps;
- `checkpoints`: checkpoint directories, written atomically and resumed from exactly;
- `presets`: the recipe of each shipped model.
"""

from hookedattn.training.checkpoints import (
    RunState,
    checkpoint_dir,
    latest_checkpoint,
    list_checkpoints,
    resume,
    save_checkpoint,
)
from hookedattn.training.config import TrainConfig, learning_rate
from hookedattn.training.corpus import (
    ByteCorpus,
    CorpusManifest,
    heldout_windows,
    is_heldout,
    load_stdlib_corpus,
    repeated_random_tokens,
    stdlib_root,
    text_windows,
)
from hookedattn.training.evaluation import Evaluation, evaluate
from hookedattn.training.presets import PRESETS, Preset
from hookedattn.training.trainer import TrainResult, make_optimizer, train, training_batch

__all__ = [
    "PRESETS",
    "ByteCorpus",
    "CorpusManifest",
    "Evaluation",
    "Preset",
    "RunState",
    "TrainConfig",
    "TrainResult",
    "checkpoint_dir",
    "evaluate",
    "heldout_windows",
    "is_heldout",
    "latest_checkpoint",
    "learning_rate",
    "list_checkpoints",
    "load_stdlib_corpus",
    "make_optimizer",
    "repeated_random_tokens",
    "resume",
    "save_checkpoint",
    "stdlib_root",
    "text_windows",
    "train",
    "training_batch",
]
