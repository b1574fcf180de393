# syntax=docker/dockerfile:1
# vipwatch container image. Build: `docker build -t vipwatch .` (BuildKit, the default builder).
# Needs no network beyond the crate registry: Swagger UI assets are vendored, migrations are embedded.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The cache mounts keep downloaded crates and compiled dependencies between builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin vipwatch \
 && cp target/release/vipwatch /usr/local/bin/vipwatch

FROM debian:bookworm-slim
# ca-certificates: the system roots that https webhooks and the Kubernetes API are verified against.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/vipwatch --shell /usr/sbin/nologin vipwatch \
 && mkdir -p /var/lib/vipwatch \
 && chown 10001:10001 /var/lib/vipwatch
COPY --from=build /usr/local/bin/vipwatch /usr/local/bin/vipwatch
# The default configuration (database on the volume, API on 0.0.0.0:8080); mount your own file over
# it, or override single keys with VIPWATCH_<TABLE>__<KEY> variables.
COPY deploy/docker/vipwatch.toml /etc/vipwatch/vipwatch.toml
ENV VIPWATCH_CONFIG=/etc/vipwatch/vipwatch.toml
USER 10001
# Relative paths (such as `vipwatch demo`'s directory) land on the volume.
WORKDIR /var/lib/vipwatch
VOLUME ["/var/lib/vipwatch"]
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 CMD ["/usr/local/bin/vipwatch", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/vipwatch"]
CMD ["serve"]
