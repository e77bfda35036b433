# syntax=docker/dockerfile:1
# One small non-root image per binary, from one Dockerfile:
#
#   docker build --build-arg BIN=vynil-scanner -t vynil-scanner .
#
# BIN is one of: vynil-catalog vynil-scanner vynil-purger vynil-lifecycle vynil-gateway vynilctl vynil
# (vynil-lifecycle is also the reaper image: `vynil-lifecycle reap`). The release profile
# (Cargo.toml) uses thin LTO, one codegen unit and stripped symbols to keep binaries small.
ARG RUST_VERSION=1.89

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
ARG BIN
WORKDIR /src
COPY . .
# protox compiles the protos: no protoc is needed (or used).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    test -n "${BIN}" && PROTOC=/bin/false cargo build --release --locked --bin "${BIN}" \
    && cp "target/release/${BIN}" /app

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /app /usr/local/bin/app
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/app"]
