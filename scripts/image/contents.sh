# What the ambient-rs image holds: sourced by rootfs.sh and build.sh, read by the
# Dockerfile's test (e2e/tests/image.rs), so every build lists the same.
# shellcheck shell=bash disable=SC2034

SUITE=bookworm
ARCH=amd64
ARCH_TRIPLET=x86_64-linux-gnu

# The binaries, in /usr/local/bin (the charts' `command` picks one).
BINARIES=(cni-agent istio-cni istioctl-lite istiod-lite waypoint ztunnel)

# Debian packages, and why each is there. Only what a binary loads or spawns
# (grep `Command::new` in the product crates):
#   libc6, libgcc-s1  every binary's shared libraries (readelf -d: NEEDED)
#   iptables          the node agent runs iptables-{nft,legacy}-{save,restore} and
#                     ip6tables-{nft,legacy}-{save,restore} (redirection/src/iptables.rs),
#                     both backends: it uses the one the node's kube-proxy uses
#   ipset             the agent creates, lists and destroys the probe ipsets with the
#                     ipset CLI (redirection/src/probe.rs)
#   ca-certificates   the Mozilla roots in /etc/ssl/certs, for TLS to anything outside
#                     the mesh's own CA
#   netbase           /etc/protocols and /etc/services, which iptables reads for names
# Not here: iproute2 (nothing spawns `ip`: routes and rules go over netlink), nftables
# (native nftables mode talks netlink itself; nothing spawns `nft`), a shell, dpkg, apt.
PACKAGES=(libc6 libgcc-s1 iptables ipset ca-certificates netbase)

# Dependencies of the above that are not unpacked, because only maintainer scripts
# (which do not run here) use them:
#   debconf           configuration questions (and it needs perl)
#   openssl, libssl3  ca-certificates' postinst (update-ca-certificates runs
#                     `openssl rehash`); rootfs.sh writes the bundle itself
EXCLUDED=(debconf openssl libssl3)

# The image's name under the charts' hub, and the crates `cargo build` builds for it.
IMAGE_NAME=ambient-rs
CRATES=(cni-agent cni-plugin istioctl-lite istiod-lite waypoint ztunnel)
