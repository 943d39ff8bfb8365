"""Suite-wide settings. Imports nothing from hookedattn or analysis: jaxtyping's import hook
instruments those packages only if they are first imported after pytest has configured it.
"""

import torch

# The suite runs thousands of tiny forwards, where a second intra-op thread costs more in
# synchronisation than it gains (and, on a shared 2-core machine, far more).
torch.set_num_threads(1)
