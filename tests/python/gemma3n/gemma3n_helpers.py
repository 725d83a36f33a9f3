"""What the Gemma 3n tests share: the upstream-tool helpers (`uh`, tests/python/upstream/
upstream_helpers.py), the synthetic-model tool and the constants of upstream's gemma3n graph."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from statistics import NormalDist

ROOT = Path(__file__).resolve().parents[3]
TOOL = ROOT / "tools" / "gemma3n-synth.py"

# The upstream-tool helpers as module `upstream_helpers`, as tests/python/upstream/conftest.py
# registers them, unless it already did.
if "upstream_helpers" in sys.modules:
    uh = sys.modules["upstream_helpers"]
else:
    _spec = importlib.util.spec_from_file_location(
        "upstream_helpers", ROOT / "tests" / "python" / "upstream" / "upstream_helpers.py")
    uh = importlib.util.module_from_spec(_spec)
    sys.modules["upstream_helpers"] = uh
    _spec.loader.exec_module(uh)

N_ALTUP, LAUREL_RANK, N_EMBD_ALTUP = 4, 64, 256      # src/llama-hparams.h
N_LAYER_SPARSE, N_LAYER_KV_FROM_START = 10, 20       # src/models/{models.h,gemma3n.cpp}
STD_MUL = 1.6448533535003662                         # f_sparsity_std_mul, models.h
# the share of a Gaussian's values above mean + STD_MUL * std: what the sparse layers keep
STD_MUL_KEEP = 1.0 - NormalDist().cdf(STD_MUL)


def synth(*args, check: bool = True) -> subprocess.CompletedProcess:
    """One run of tools/gemma3n-synth.py."""
    proc = subprocess.run([sys.executable, TOOL, *map(str, args)], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    if check:
        assert proc.returncode == 0, (f"{TOOL.name} {' '.join(map(str, args))}: exit "
                                      f"{proc.returncode}\n{proc.stderr}")
    return proc
