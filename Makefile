# kiln: `make demo` and `make test` work on a fresh Debian machine as root.
CARGO ?= cargo
LIT := /usr/lib/llvm-22/bin/lit

.PHONY: setup build test demo bench clean

setup:
	@scripts/setup.sh

build: setup
	$(CARGO) build

# Cheapest first, so a failure comes early: the module import graph (one
# way, pipeline order), a lit error test per StableHLO constraint the shape
# rules name, clippy and rustdoc with warnings as errors (the whole
# workspace, every target); then the build, unit and doc tests, a front-end
# crate over the library API (a custom model, IREE vs the reference
# interpreter), and the lit suite: FileCheck on kiln's MLIR, and `kiln check`
# per op (IREE-compiled module vs the reference interpreter).
test: setup
	scripts/layers.py
	scripts/constraint_tests.py
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps
	$(CARGO) build
	$(CARGO) test
	$(CARGO) run -p mixer-frontend
	$(LIT) -sv test/lit

# SmolLM2-135M from its GGUF to a continuation through IREE.
demo: build
	@scripts/demo.sh

# Figures (time, peak RSS, throughput); not part of `make test`.
bench: setup
	@scripts/bench.sh

clean:
	$(CARGO) clean
