"""Peak memory of loading a 1-2 B-parameter mixture-of-experts checkpoint stored in bfloat16.

    python scripts/moe_loading_memory.py [--folder /tmp/moe-ckpt] [--keep]

Writes an OLMoE-shaped random checkpoint with `save_pretrained` (bfloat16, one tensor per
expert and projection, as hub checkpoints are), then, in a fresh process, imports it with
`HookedTransformer.from_hf(folder)` and reports the resident memory just before the import
(after `transformers` and the config are loaded) and the peak (`VmHWM` of /proc/self/status),
and the finished model's bytes. The figure is the growth over the model's size, (peak -
before) / size: 1.0 would be the model alone.

The peak is `VmHWM`, not `ru_maxrss`: a child's `ru_maxrss` keeps the resident size it had
between `fork` and `exec`, which is its parent's (measured here: 6.08 GB against a true
peak of 3.94 GB right after a parent that had just written the checkpoint), while `VmHWM`
belongs to the address space `exec` creates. The checkpoint is deleted afterwards unless `--keep`
(it is several GB: check `df -h` first). A measurement, not a test: run it on its own.
"""

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

# OLMoE's layout (64 experts, 8 a token, q/k norms) at 16 layers of width 1024: 1.77 B
# parameters, 3.5 GB in bfloat16.
SHAPE = dict(
    vocab_size=50304, hidden_size=1024, intermediate_size=512, num_hidden_layers=16,
    num_attention_heads=16, num_key_value_heads=16, num_experts=64, num_experts_per_tok=8,
    max_position_embeddings=4096, eos_token_id=None, pad_token_id=None,
)  # fmt: skip

LOAD = """
import json, os, pathlib, resource, sys, torch, transformers
sys.path.insert(0, sys.argv[2])
from hookedattn import HookedTransformer

def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

def high_water_mark():  # the peak resident size of this address space, in bytes
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

transformers.AutoConfig.from_pretrained(sys.argv[1])
os.sync()
for f in pathlib.Path(sys.argv[1]).glob("*.safetensors"):  # start with cold file pages
    fd = os.open(f, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
before = resident()
# Unverified: the check on a tiny twin (from_hf's verify) is no part of holding the weights.
model = HookedTransformer.from_hf(sys.argv[1], verify=False)
peak = high_water_mark()
maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
size = sum(t.nbytes for t in model.state_dict().values())
params = sum(t.numel() for t in model.state_dict().values())
print(json.dumps(dict(before=before, peak=peak, ru_maxrss=maxrss, after=resident(), size=size,
                      params=params, dtype=str(model.cfg.dtype))))
"""


def write_checkpoint(folder: Path) -> None:
    """A random OLMoE-shaped checkpoint in bfloat16, written by `save_pretrained`."""
    import transformers

    config = transformers.OlmoeConfig(**SHAPE)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # parameters made in bfloat16: no float32 copy
    try:
        with torch.device("meta"):  # nothing allocated, no slow initialisation
            hf = transformers.OlmoeForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    hf = hf.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=generator)
    hf.save_pretrained(folder)


def measure(folder: Path) -> dict:
    """The loading process's resident memory before and at its peak, and the model's size."""
    result = subprocess.run(
        [sys.executable, "-c", LOAD, str(folder), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=Path("/tmp/hookedattn-moe-checkpoint"))
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint afterwards")
    args = parser.parse_args()
    try:
        if not (args.folder / "config.json").is_file():
            write_checkpoint(args.folder)
        on_disk = sum(f.stat().st_size for f in args.folder.glob("*.safetensors"))
        m = measure(args.folder)
        growth = (m["peak"] - m["before"]) / m["size"]
        print(json.dumps(m | {"checkpoint_bytes": on_disk, "growth": growth}))
        print(
            f"{m['params'] / 1e9:.2f} B parameters, {m['dtype']}: model {m['size'] / 2**30:.2f} "
            f"GiB, checkpoint {on_disk / 2**30:.2f} GiB; resident before {m['before'] / 2**30:.2f} "
            f"GiB, peak {m['peak'] / 2**30:.2f} GiB: growth {growth:.3f} x the model's size"
        )
    finally:
        if not args.keep:
            shutil.rmtree(args.folder, ignore_errors=True)


if __name__ == "__main__":
    main()
