# syntax=docker/dockerfile:1
# podgroup-sync: build the release binary on Debian bookworm, statically linked (glibc's static
# libc), and run it on an empty base (no shell, no libc, no package manager) as a numeric non-root
# user. `make image` builds the same layout without a registry or a container engine
# (hack/image.sh); tests/node.rs checks that the two agree.
#
#   docker build -t <registry>/podgroup-sync:<version> .
#   docker buildx build --platform linux/amd64,linux/arm64 -t <registry>/podgroup-sync:<version> .

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
# Only what the build reads; Cargo.lock makes the dependency set exact (--locked).
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# The manifest names the test tiers and the benchmarks explicitly; cargo wants their files present.
COPY tests ./tests
COPY benches ./benches
# Cache mounts keep the registry and target dir between builds without putting them in a layer.
# --target keeps the static flag off build scripts and proc macros.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    triple=$(rustc -vV | sed -n 's/^host: //p') \
 && RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked --target "$triple" --bin podgroup-sync \
 && install -D -m 0755 "target/$triple/release/podgroup-sync" /out/podgroup-sync \
 && ln -s podgroup-sync /out/kubectl-podgroup_sync

# TLS is rustls with ring; the API server's CA comes from the service-account mount.
FROM scratch
# The binary and kubectl's plugin link to it (kubectl-podgroup_sync), the link kept as a link.
COPY --from=build /out/ /usr/local/bin/
# Numeric, so runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 8080 9443
ENTRYPOINT ["/usr/local/bin/podgroup-sync"]
CMD ["run"]
