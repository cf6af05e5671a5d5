# Nereid — top-level entry points. See README.md.
#   make          build only (build/nereid, build/backends/)
#   make run      install dependencies, build, serve examples/models
#   make test     install dependencies, build, run every test
#   make test-asan  the whole suite again under ASan+UBSan (build-asan/)
#   make test-tsan  the C unit tests under ThreadSanitizer (build-tsan/)
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS ?= $(shell nproc)
PY ?= /usr/bin/python3
CMAKE_FLAGS ?=

.PHONY: all build setup run test test-asan test-tsan test-exhaustive unit integration fuzz bench format clean models

all: build

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

setup:
	@bash scripts/setup.sh

models:
	@$(PY) scripts/make_models.py examples/models

run: setup build models
	$(BUILD)/nereid --model-repository=examples/models

unit: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

integration: build models
	NEREID_BUILD=$(BUILD) $(PY) -m pytest -q tests/integration

test: setup build models
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	NEREID_BUILD=$(BUILD) $(PY) -m pytest -q tests/integration

# Slow exhaustive checks, not part of test: every float32 bit pattern through
# the JSON number printer and parser (a few minutes).
test-exhaustive: setup build
	@for t in $(BUILD)/exhaustive/*; do echo "== $$t"; $$t || exit 1; done

test-asan: setup models
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DNEREID_SANITIZE=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp ctest --output-on-failure -j $(JOBS)
	NEREID_BUILD=$(ASAN_BUILD) NEREID_SANITIZE=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp $(PY) -m pytest -q tests/integration

# ThreadSanitizer: the C unit tests (the threaded core: schedulers, batchers,
# lifecycle, gRPC queues). tests/tsan.supp lists only uninstrumented libraries.
TSAN_ENV = TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=1 second_deadlock_stack=1"
test-tsan: setup models
	@cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNEREID_TSAN=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS)
	cd $(TSAN_BUILD) && $(TSAN_ENV) ctest --output-on-failure -j $(JOBS)

fuzz: setup
	@cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DNEREID_FUZZ=ON >/dev/null
	@cmake --build build-fuzz -j $(JOBS)
	@for f in build-fuzz/fuzz/fuzz_*; do echo "== $$f"; $$f -max_total_time=$${FUZZ_SECONDS:-60} -rss_limit_mb=2048 fuzz/corpus/$$(basename $$f) 2>&1 | tail -3; done

bench: setup build models
	@for b in $(BUILD)/bench/bench_*; do echo "== $$b"; $$b || exit 1; done

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cc' '*.cpp')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) build-fuzz
