# syntax=docker/dockerfile:1
# podgroup-sync: build the release binary on Debian bookworm, run it on distroless (glibc and
# libgcc only, no shell, no package manager) as a numeric non-root user.
#
#   docker build -t <registry>/podgroup-sync:<version> .

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
# Only what the build reads; Cargo.lock makes the dependency set exact (--locked).
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# The manifest names the e2e test and the benchmark explicitly; cargo wants their files present.
COPY tests/e2e.rs ./tests/e2e.rs
COPY benches ./benches
# Cache mounts keep the registry and target dir between builds without putting them in a layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin podgroup-sync \
 && install -D -m 0755 target/release/podgroup-sync /out/podgroup-sync

# The binary links only glibc and libgcc_s (TLS is rustls with ring; no OpenSSL).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/podgroup-sync /usr/local/bin/podgroup-sync
# 65532 is distroless' "nonroot"; numeric, so runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/podgroup-sync"]
CMD ["run"]
