# syntax=docker/dockerfile:1
# One image for every ambient-rs binary: istiod-lite (the control plane), ztunnel,
# cni-agent, istio-cni (the CNI plugin the agent copies to each node) and istioctl-lite.
# The Helm charts in manifests/charts run it as ghcr.io/ambient-rs/ambient-rs:<appVersion>;
# manifests/README.md shows how CI builds and pushes it.
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
        -p istiod-lite -p ztunnel -p cni-agent -p cni-plugin -p istioctl-lite \
 && mkdir -p /out \
 && cp target/release/istiod-lite target/release/ztunnel target/release/cni-agent \
       target/release/istio-cni target/release/istioctl-lite /out/

FROM ${BASE_IMAGE}
# iptables (nft and legacy backends; the agent picks the one the node uses), iproute2
# (ip rule/route for the redirection) and ipset (the kubelet probe set) are run by the
# node agent inside pod network namespaces and on the host.
# Debian's stable point releases replace package versions, so pinning them would break
# rebuilds; the base image tag pins the release.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        iptables iproute2 ipset ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
LABEL org.opencontainers.image.title="ambient-rs" \
      org.opencontainers.image.description="Istio ambient mode in Rust: istiod-lite, ztunnel, cni-agent, istio-cni, istioctl-lite" \
      org.opencontainers.image.source="https://github.com/ambient-rs/ambient-rs" \
      org.opencontainers.image.licenses="Apache-2.0"
# The charts run the agent and ztunnel as root with a few capabilities and istiod-lite
# as non-root (see their securityContext); the image itself does not pick a binary.
CMD ["ztunnel", "--help"]
