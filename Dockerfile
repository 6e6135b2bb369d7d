# syntax=docker/dockerfile:1
# The `crpf` binary (node, demo, inspect, eval) on Debian bookworm.
#   docker build -t crpf:local .
#   docker run --rm crpf:local node --config /etc/crpf/node.toml
# docker-compose.yml builds it for the three nodes of the stack.

FROM rust:1-bookworm AS build
WORKDIR /src
# Cargo.toml names bench, example and test targets: their files must exist for the manifest to
# load, though only the binary is built. assets/ holds the font `crpf eval` embeds.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY assets ./assets
COPY benches ./benches
COPY examples ./examples
COPY tests ./tests
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin crpf \
 && install -m 0755 target/release/crpf /usr/local/bin/crpf

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home-dir /var/lib/crpf --shell /usr/sbin/nologin crpf \
 && mkdir -p /var/lib/crpf /etc/crpf/keys \
 && chown crpf:crpf /var/lib/crpf /etc/crpf/keys
COPY --from=build /usr/local/bin/crpf /usr/local/bin/crpf
COPY configs /etc/crpf/examples
USER crpf
WORKDIR /var/lib/crpf
# Default metrics port of `crpf node` (configs/cluster use 9465-9467).
EXPOSE 9464
VOLUME ["/var/lib/crpf"]
ENTRYPOINT ["crpf"]
# Without arguments: the usage. Run a node with `node --config <file>` (examples under
# /etc/crpf/examples; mount your own and override node.metrics_addr to 0.0.0.0:<port>).
CMD ["--help"]
