# kvproxy: `make demo` and `make test` set up everything they need on a fresh Debian machine
# (Python 3.11; Java 17 for the Spark audit and for Apache Kafka, the tests' reference broker).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_WORKERS ?= 2

.PHONY: setup compiler fuzzer system-deps java-deps client-deps localhost-names haproxy valgrind browser lint test demo bench \
	fuzz clean

# The compiled record scan (kvproxy/protocol/records/_skim.c) is built by the install: a change to it
# reinstalls; the compiler comes first (order-only: installing it does not force a reinstall)
# The Go client programs (tests/harness/go_clients) need Go 1.21 or later; where the machine has
# none (Debian 12 packages Go 1.19), `client-deps` takes this release from the Go module proxy
# (the golang.org/toolchain module) into the cache, and the tests use it (tests/harness/client_programs.py)
GO_TOOLCHAIN_VERSION = go1.26.8
GO_TOOLCHAIN = $(HOME)/.cache/kvproxy/go-toolchain
GO_ARCH = $(shell uname -m | sed -e 's/x86_64/amd64/' -e 's/aarch64/arm64/')

ACCEPT_SOURCES := $(wildcard kvproxy/protocol/fast_accept/*.c kvproxy/protocol/fast_accept/*.h)

$(STAMP): pyproject.toml setup.py kvproxy/protocol/records/_skim.c kvproxy/protocol/valid_utf8.h \
	$(ACCEPT_SOURCES) | compiler
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
		echo "python3 -m venv is unavailable: installing python3-venv"; \
		$(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends python3-venv && \
		$(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark,bench]'
	@touch $(STAMP)

# gcc and Python's headers, for the compiled record scan; without them the install still
# succeeds and the pure-Python scan runs (slower for small records)
compiler:
	@command -v gcc >/dev/null 2>&1 || { \
		echo "gcc is missing: installing it (and the C library headers) with apt-get"; \
		$(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends gcc libc6-dev; }
	@[ -f "$$($(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ] || { \
		echo "Python.h is missing: installing python3-dev with apt-get"; \
		$(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends python3-dev; }

# clang with libFuzzer and the sanitizers' runtimes, for the fast accept's fuzz harness
# (fuzz/accept_fuzz.c, run by tests/unit/test_fuzz_accept.py; tests only)
fuzzer:
	@{ command -v clang && ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a; } >/dev/null 2>&1 || { \
		echo "clang or libFuzzer is missing: installing clang and libclang-rt-dev with apt-get"; \
		$(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends clang libclang-rt-dev; }

system-deps:
	@command -v kcat >/dev/null 2>&1 || { \
		echo "kcat is missing: installing it with apt-get"; \
		$(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends kcat; }

# Apache Kafka for the tests: a JDK (java, javac for the Java client program) and Maven, which
# fetches Kafka's jars from Maven Central into ~/.cache/kvproxy/kafka on first use
java-deps:
	@{ command -v java && command -v javac && command -v mvn; } >/dev/null 2>&1 || { \
		echo "java, javac or mvn is missing: installing a JDK and Maven with apt-get"; \
		$(SUDO) apt-get update && \
		$(SUDO) apt-get install -y --no-install-recommends default-jdk-headless maven; }

# Go and Node for the Go and Node client programs the tests build (tests/harness/go_clients/,
# tests/harness/node_clients/): their modules come from the Go module proxy into
# ~/.cache/kvproxy/go-modules and from npm into ~/.cache/kvproxy/node-clients on first use; a Go
# older than go.mod's fetches the newer toolchain itself (Go 1.21 and later)
client-deps:
	@{ command -v node && command -v npm; } >/dev/null 2>&1 || { \
		echo "node or npm is missing: installing Node.js and npm with apt-get"; \
		$(SUDO) apt-get update && \
		$(SUDO) apt-get install -y --no-install-recommends nodejs npm ca-certificates; }
	@go_ok=no; case "$$(go env GOVERSION 2>/dev/null)" in go1.2[1-9]*|go1.[3-9][0-9]*) go_ok=yes;; esac; \
	if [ $$go_ok = no ] && [ ! -x $(GO_TOOLCHAIN)/bin/go ]; then \
		echo "Go 1.21 or later is missing: fetching $(GO_TOOLCHAIN_VERSION) from the Go module proxy" \
			"into $(GO_TOOLCHAIN)"; \
		rm -rf $(GO_TOOLCHAIN) $(GO_TOOLCHAIN).zip && mkdir -p $(GO_TOOLCHAIN) && \
		curl -fsSL -o $(GO_TOOLCHAIN).zip "https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-$(GO_TOOLCHAIN_VERSION).linux-$(GO_ARCH).zip" && \
		$(PYTHON) -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" $(GO_TOOLCHAIN).zip $(GO_TOOLCHAIN).tmp && \
		mv $(GO_TOOLCHAIN).tmp/golang.org/toolchain@*/* $(GO_TOOLCHAIN)/ && rm -rf $(GO_TOOLCHAIN).tmp $(GO_TOOLCHAIN).zip && \
		chmod +x $(GO_TOOLCHAIN)/bin/* $(GO_TOOLCHAIN)/pkg/tool/*/*; \
	fi

# glibc's myhostname NSS module, so that every name under `localhost` (RFC 6761) resolves to
# loopback without editing /etc/hosts: the SNI tests name each broker
# `broker-N.kafka.localhost`; installing the package adds `myhostname` to /etc/nsswitch.conf
localhost-names:
	@getent hosts x.kafka.localhost >/dev/null 2>&1 || { \
		echo "names under localhost do not resolve: installing libnss-myhostname with apt-get"; \
		$(SUDO) apt-get update && \
		$(SUDO) apt-get install -y --no-install-recommends libnss-myhostname; }

setup: $(STAMP) system-deps

# HAProxy in TCP mode: the floor the network benchmarks measure kvproxy against (Debian installs
# it in /usr/sbin)
haproxy:
	@{ command -v haproxy || test -x /usr/sbin/haproxy; } >/dev/null 2>&1 || { \
		echo "haproxy is missing: installing it with apt-get"; \
		$(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends haproxy; }

# Valgrind, for the instruction-count regression check (bench/instructions.py, tests only)
valgrind:
	@command -v valgrind >/dev/null 2>&1 || { \
		echo "valgrind is missing: installing it with apt-get"; \
		$(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends valgrind; }

# Headless Chromium, for the test that renders the audit's report.html (tests only), without its
# recommends (udev, upower, printer tools, Mesa, a notification daemon: a desktop's, unused
# headless with --disable-gpu, which draws with Chromium's own SwiftShader), and the font the page
# is drawn in: fonts-dejavu-core, what fontconfig gives for its system-ui, sans-serif and monospace
# (fontconfig's first choice; named, so that the test measures text in the same font everywhere)
browser:
	@{ command -v chromium && test -d /usr/share/fonts/truetype/dejavu; } >/dev/null 2>&1 || { \
		echo "chromium or its font is missing: installing them with apt-get"; \
		$(SUDO) apt-get update && \
		$(SUDO) apt-get install -y --no-install-recommends chromium fonts-dejavu-core; }

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The whole suite, then the unit tests again on the pure-Python twins of the compiled parts (a
# machine without a compiler runs them), leaving out the tests of the compiled code itself
test: lint browser java-deps client-deps localhost-names haproxy valgrind fuzzer
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup -q
	KVPROXY_NO_EXTENSIONS=1 $(BIN)/pytest -n $(PYTEST_WORKERS) -q -m "not compiled" tests/unit

demo: setup
	$(BIN)/kvproxy demo

# The fuzzers' long runs: 100,000 mutated requests through a running proxy (minutes; make test
# runs a 10,000-input slice of the same test), and the fast accept's libFuzzer harness for 10
# minutes (make test: 20 s)
fuzz: setup fuzzer
	KVPROXY_FUZZ_INPUTS=100000 $(BIN)/pytest -q tests/integration/test_fuzz_proxy.py
	KVPROXY_ACCEPT_FUZZ_SECONDS=600 $(BIN)/pytest -q tests/unit/test_fuzz_accept.py

# The eight benchmarks of docs/benchmarks.md (under 20 minutes), against Apache Kafka (Java and
# Maven for its jars) where they compare with a broker, and with HAProxy in front of it as the
# floor; figures in bench/results/latest.md
bench: setup java-deps haproxy
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info
