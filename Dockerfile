# syntax=docker/dockerfile:1
#
# waitroom in a container: built in a Rust image, run as a non-root user in a distroless
# image (glibc and libgcc only: no shell, no package manager).
#
#   docker build -t waitroom .
#   docker run -p 8080:8080 -v waitroom-data:/var/lib/waitroom waitroom
#
# Settings come from WAITROOM_* variables (README "Configuration"); the image sets the
# listening address, the data dir and JSON logs. The load tools (waitroom-bench,
# waitroom-scale) are in the image too.

# The newest stable Rust: some locked dependencies need a newer compiler than the crate's
# declared minimum. Pin a version (e.g. 1.95) for reproducible images.
ARG RUST_VERSION=1

FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY bench bench
COPY crates crates
# The registry and the target dir are cache mounts: a rebuild after a source change only
# compiles waitroom itself. `--locked`: exactly the dependency versions of Cargo.lock.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins \
    && mkdir -p /out/bin /out/data /out/keys \
    && cp target/release/waitroom target/release/waitroom-bench target/release/waitroom-scale /out/bin/

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/bin/ /usr/local/bin/
# Owned by the image's user (65532), so named volumes mounted here start out writable.
COPY --from=build --chown=65532:65532 /out/data /var/lib/waitroom
COPY --from=build --chown=65532:65532 /out/keys /keys
USER 65532:65532
# No demo event: its simulated crowd and booking page are for trying waitroom out, not for
# a site's visitors (`-e WAITROOM_DEMO=true` to try it).
ENV WAITROOM_LISTEN=0.0.0.0:8080 \
    WAITROOM_DATA_DIR=/var/lib/waitroom \
    WAITROOM_LOG_FORMAT=json \
    WAITROOM_DEMO=false
EXPOSE 8080
VOLUME ["/var/lib/waitroom"]
# No curl in the image: the binary asks its own /healthz, on the address the same settings
# make it listen on.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/waitroom", "healthcheck"]
# SIGTERM: in-flight requests get 5 s, under the 10 s `docker stop` waits.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/waitroom"]
CMD ["serve"]
