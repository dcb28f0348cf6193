# syntax=docker/dockerfile:1
#
# vmss-capacity-controller container image: a multi-stage build producing a small, non-root image.
#
#   docker build -t vmss-capacity-controller:dev .
#   docker buildx build --platform linux/amd64,linux/arm64 -t <registry>/vmss-capacity-controller:<tag> --push .
#
# Runtime base: gcr.io/distroless/cc-debian12:nonroot, not distroless/static. The binary is built
# for the default target (x86_64/aarch64-unknown-linux-gnu), which links glibc and libgcc_s
# dynamically (Rust's std and unwinding); distroless/static has neither, and the binary would not
# start. The alternative, a static musl build on distroless/static, was not chosen: musl's
# allocator is markedly slower under tokio's multi-threaded runtime, `ring` (rustls' crypto) needs
# a musl C toolchain in the builder, and the size gain is a few MB. distroless/cc carries glibc,
# libgcc, CA certificates and tzdata, no shell and no package manager; `:nonroot` runs as uid
# 65532, which the Kubernetes manifests also require (runAsNonRoot, runAsUser 65532).
# TLS roots: reqwest's rustls-tls uses the bundled webpki roots; an extra CA comes from
# azure.caBundleFile.

ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${RUST_IMAGE} AS builder
WORKDIR /src

# The image builds without the `emulator` feature (`--no-default-features`): no demo, no fake
# Azure or Kubernetes server in production, and fewer dependencies.
#
# 1. Dependencies only, cached as long as Cargo.toml and Cargo.lock do not change: build against
#    stub sources. Every target path the manifest names gets an empty stub, so explicit [[bin]],
#    [[bench]] or [[test]] entries do not break this step.
#    The workspace's other members (the emulator, the VM size table) are loaded with their
#    manifests and stubs too; only the size table is compiled into the image.
COPY Cargo.toml Cargo.lock ./
COPY crates/emulator/Cargo.toml crates/emulator/
COPY crates/vm-sizes/Cargo.toml crates/vm-sizes/
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    set -eu; \
    mkdir -p src crates/emulator/src crates/vm-sizes/src; echo 'fn main() {}' > src/main.rs; : > src/lib.rs; \
    : > crates/emulator/src/lib.rs; : > crates/vm-sizes/src/lib.rs; \
    for p in $(sed -n 's/^path *= *"\(.*\.rs\)"/\1/p' Cargo.toml); do \
      [ -f "$p" ] || { mkdir -p "$(dirname "$p")"; echo 'fn main() {}' > "$p"; }; \
    done; \
    for b in $(sed -n '/^\[\[bench\]\]/,/^\[/s/^name *= *"\(.*\)"/\1/p' Cargo.toml); do \
      [ -f "benches/$b.rs" ] || { mkdir -p benches; echo 'fn main() {}' > "benches/$b.rs"; }; \
    done; \
    cargo build --locked --release --no-default-features; \
    rm -rf src crates/vm-sizes/src

# 2. The real sources. `touch` makes cargo rebuild the crate, not trust the stubs' timestamps.
# Only src/ and the VM size table are needed for the binary; bench/test stubs and the emulator's
# stub from step 1 stay to satisfy the manifests.
COPY src ./src
COPY crates/vm-sizes/src ./crates/vm-sizes/src
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    set -eu; \
    touch src/main.rs src/lib.rs crates/vm-sizes/src/lib.rs; \
    cargo build --locked --release --no-default-features --bin vmss-capacity-controller; \
    cp target/release/vmss-capacity-controller /vmss-capacity-controller; \
    /vmss-capacity-controller --help >/dev/null

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="vmss-capacity-controller" \
      org.opencontainers.image.description="A cluster autoscaler for Azure scale sets and AKS agent pools whose every write is ETag-guarded (If-Match)" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /vmss-capacity-controller /usr/local/bin/vmss-capacity-controller
USER 65532:65532
EXPOSE 8085
ENTRYPOINT ["/usr/local/bin/vmss-capacity-controller"]
CMD ["run", "--config", "/etc/vmss-capacity-controller/config.yaml"]
