# kiln: `make demo` and `make test` work on a fresh Debian machine as root.
CARGO ?= cargo
LIT := /usr/lib/llvm-22/bin/lit
KILN := target/debug/kiln

.PHONY: setup build test demo bench clean

setup:
	@scripts/setup.sh

build: setup
	$(CARGO) build

# Unit and doc tests, the library-API example (a custom model, IREE vs the
# reference interpreter), then the lit suite: FileCheck on kiln's MLIR, and
# `kiln check` per op (IREE-compiled module vs the reference interpreter).
test: build
	$(CARGO) test
	$(CARGO) run --example custom_model
	$(LIT) -sv test/lit

demo: build
	@echo "== graph (examples/mlp.kiln) =="
	@cat examples/mlp.kiln
	@echo
	@echo "== StableHLO (kiln lower) =="
	@$(KILN) lower examples/mlp.kiln
	@echo
	@echo "== IREE vs reference interpreter (kiln check) =="
	@$(KILN) check examples/mlp.kiln --show

# Figures (time, peak RSS, throughput); not part of `make test`.
bench: setup
	@scripts/bench.sh

clean:
	$(CARGO) clean
