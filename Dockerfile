# syntax=docker/dockerfile:1
# One image for every ambient-rs binary: istiod-lite (the control plane), ztunnel,
# waypoint, cni-agent, istio-cni (the CNI plugin the agent copies to each node) and
# istioctl-lite.
# The Helm charts in manifests/charts run it as ghcr.io/ambient-rs/ambient-rs:<appVersion>.
#
# For builders with a registry. `make image` builds the same layout without one (and
# reproducibly): both assemble the root with scripts/image/rootfs.sh, whose
# scripts/image/contents.sh lists the binaries and Debian packages; e2e/tests/image.rs
# keeps this file's crates and binaries equal to that list. See docs/image.md.
#
#   docker build -t ghcr.io/ambient-rs/ambient-rs:dev .

ARG RUST_IMAGE=rust:1-bookworm
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src
# cargo needs every workspace member to resolve the workspace, so the whole context
# (see .dockerignore) is copied; the cache mounts below keep rebuilds incremental.
COPY . .
# --locked: build exactly Cargo.lock. The target dir is a cache mount (it stays out of
# the image), so the binaries are copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bins \
        -p cni-agent -p cni-plugin -p istioctl-lite -p istiod-lite -p waypoint -p ztunnel \
 && mkdir -p /out \
 && cp target/release/cni-agent target/release/istio-cni target/release/istioctl-lite \
       target/release/istiod-lite target/release/waypoint target/release/ztunnel /out/

# The root filesystem, as `make image` assembles it: Debian bookworm's packages the
# binaries load or spawn (iptables with both backends, ipset, ca-certificates, netbase,
# libc6, libgcc-s1), unpacked without a shell or a package manager, and the binaries.
FROM ${BASE_IMAGE} AS rootfs
# binutils: strip (the binaries' debug line tables stay out of the image).
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends binutils \
 && rm -rf /var/lib/apt/lists/*
COPY scripts/image/ /image/
COPY --from=build /out/ /bin-release/
ARG SOURCE_DATE_EPOCH=0
RUN SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH} /image/rootfs.sh /rootfs /bin-release /tmp/apt

FROM scratch
COPY --from=rootfs /rootfs/ /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="ambient-rs" \
      org.opencontainers.image.description="Istio ambient mode in Rust: istiod-lite, ztunnel, waypoint, cni-agent, istio-cni, istioctl-lite" \
      org.opencontainers.image.source="https://github.com/ambient-rs/ambient-rs" \
      org.opencontainers.image.url="https://github.com/ambient-rs/ambient-rs" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="ambient-rs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# The charts run the agent and ztunnel as root with a few capabilities and istiod-lite
# as uid 1337 (see their securityContext); the image itself does not pick a binary.
CMD ["ztunnel", "--help"]
