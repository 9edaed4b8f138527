# delayd's container image: the static delayd and delayctl binaries, CA
# certificates and a non-root user on an empty (scratch) base.
#
# Build it with `make image` (IMAGE=delayd:<version>, also tagged
# delayd:latest). make image compiles both binaries here with
# CGO_ENABLED=0 and copies them, the build machine's
# /etc/ssl/certs/ca-certificates.crt and deploy/image/{passwd,group} into
# bin/image/, the build context; nothing is compiled or pulled inside
# Docker, so the build needs no base image and no network.
#
# Ports (the defaults with a Redis; see `delayd --help`):
#   7070  gRPC API                         --listen       DELAYD_LISTEN
#   7071  HTTP edge: Connect/JSON, gRPC-Web --http-listen  DELAYD_HTTP_LISTEN
#   9070  ops: /metrics, /healthz (liveness), /readyz (readiness: 200 "ready"
#         while the replica serves, 503 and the reason while its store
#         cannot answer)                   --ops-listen   DELAYD_OPS_LISTEN
#
# Run against a Redis (auth on: the admin key from a file or secret store):
#   docker run --rm -p 7070:7070 -p 9070:9070 \
#     -e DELAYD_REDIS_URL=redis://redis:6379/0 -e DELAYD_ADMIN_KEY=... delayd
# Without DELAYD_REDIS_URL delayd runs its in-memory embedded store, which
# listens on loopback only unless told otherwise: inside a container that
# means unreachable, so a throwaway try needs
#   docker run --rm -p 7070:7070 -e DELAYD_LISTEN=:7070 -e DELAYD_OPS_LISTEN=:9070 delayd
#
# SIGTERM (docker stop, Kubernetes) shuts delayd down gracefully within
# --shutdown-timeout (default 10s) and it exits 0: give the container at
# least that long (docker stop -t, terminationGracePeriodSeconds).
FROM scratch

COPY passwd group /etc/
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY delayd delayctl /usr/local/bin/

# 65532 is "nonroot" (deploy/image/passwd); delayd writes no file.
USER 65532:65532

EXPOSE 7070 7071 9070

# delayctl ready asks the ops listener's /readyz (no shell or curl here),
# at the port of DELAYD_OPS_LISTEN (default 9070).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["/usr/local/bin/delayctl", "ready"]

ENTRYPOINT ["/usr/local/bin/delayd"]
