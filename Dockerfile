# vipwatch container image (minimal; see README). Builds offline from the crate registry only:
# Swagger UI assets are vendored, no other downloads happen at build time.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin vipwatch

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/vipwatch --shell /usr/sbin/nologin vipwatch \
 && mkdir -p /var/lib/vipwatch && chown vipwatch /var/lib/vipwatch
COPY --from=build /src/target/release/vipwatch /usr/local/bin/vipwatch
USER 10001
ENV VIPWATCH_DATABASE__PATH=/var/lib/vipwatch/vipwatch.db \
    VIPWATCH_SERVER__LISTEN=0.0.0.0:8080
VOLUME ["/var/lib/vipwatch"]
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/vipwatch"]
CMD ["serve"]
