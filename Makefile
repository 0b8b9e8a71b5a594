# The project's entry points. Everything that needs root says so.
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: setup build build-release test lint fmt fuzz demo demo-up demo-dual-stack bench bench-quick soak soak-quick clean

setup:
	./scripts/setup.sh

build:
	$(CARGO) build --workspace --bins

build-release:
	$(CARGO) build --workspace --bins --release

# Unit tests, and the root tests in isolated network namespaces (they skip, saying
# so, when not root). Binaries are built first: the e2e tests run them.
# The cluster tests whose outcome depends on the pods' redirection rules run a second
# time with the agents in native nftables mode (the rule sets themselves are checked in
# the kernel for both modes by the redirection and cni-agent tests).
NFTABLES_CLUSTER_TESTS = binary(no_plaintext) \
	| test(/ambient|enrolled|fail_closed|agent_restart|ztunnel_restart|dual_stack|vip_is_resolved|install_runs_the_whole_mesh/)
test: setup build
	$(CARGO) nextest run --workspace --no-fail-fast
	NATIVE_NFTABLES=true $(CARGO) nextest run -p e2e --test cluster --test no_plaintext --test charts \
		--no-fail-fast -E '$(NFTABLES_CLUSTER_TESTS)'
	manifests/check.sh

# rustfmt, clippy (warnings are errors; the library crates also document every public
# item), and cargo-deny's license, ban and source checks (deny.toml). cargo-deny comes
# prebuilt (scripts/install-cargo-tools.sh, which scripts/setup.sh runs).
# The fuzz targets (their own cargo-fuzz crate) are formatted and linted too, on the
# stable toolchain and in the workspace's target dir, where their dependencies are
# already checked: so CI knows they still build without a sanitizer build.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --manifest-path fuzz/Cargo.toml --target-dir target --bins -- -D warnings
	$(CARGO) deny check licenses bans sources

fmt:
	$(CARGO) fmt --all

# Every cargo-fuzz target (fuzz/, one crate for all), FUZZ_SECS seconds each
# (default 60). Needs the nightly toolchain; says so and fails without it.
fuzz:
	./scripts/fuzz.sh

# The local demo mesh (needs root).
demo: setup build
	$(CARGO) run -q -p local-cluster --bin demo

# The same cluster left running until Ctrl-C, with kubectl/istioctl-lite instructions.
demo-up: setup build
	$(CARGO) run -q -p local-cluster --bin demo -- --up

# The same on a dual-stack cluster: pods and Services with IPv4 and IPv6 addresses.
demo-dual-stack: setup build
	$(CARGO) run -q -p local-cluster --bin demo -- --dual-stack

# Mesh against direct, side by side (needs root). bench-quick is the short run CI uses.
bench: setup build-release
	$(CARGO) run -q --release -p bench --bin bench

bench-quick: setup build-release
	$(CARGO) run -q --release -p bench --bin bench -- --quick

# The mesh under time (needs root): churn, traffic and faults for SOAK_MINUTES (default
# 60), sampled every 10 s into target/soak/ (samples.jsonl, summary.json, soak.png) and
# judged; fails naming each failed verdict (docs/soak.md). The release build, as
# deployed: its default load (1,200 new connections/s) is more than a debug build's
# ztunnels carry on two cores. soak-quick is the 3-minute form CI runs (debug build).
soak: setup build-release
	$(CARGO) run -q --release -p local-cluster --bin soak

soak-quick: setup build
	$(CARGO) run -q -p local-cluster --bin soak -- --quick

clean:
	$(CARGO) clean

.PHONY: image charts

# The image the charts name (ghcr.io/ambient-rs/ambient-rs:<version>), built offline
# from Debian's packages and the release binaries: an OCI layout and archive under
# target/image, and its digest (scripts/image/build.sh, docs/image.md).
image: setup
	./scripts/image/build.sh

# The charts packaged for a Helm repository or an OCI registry, with appVersion and
# the image's digest pinned (make image first): target/charts (scripts/charts.sh).
charts: image
	./scripts/charts.sh
