# syntax=docker/dockerfile:1
#
# lockbroker image: the broker (the entrypoint) and lockctl (for `docker
# compose exec broker lockctl ...` and the health check), built exactly as
# the Makefile builds them: static (CGO_ENABLED=0) and -trimpath.
#
#   docker build -t lockbroker .
#   docker run --rm -e CONSUL_HTTP_ADDR=consul.example:8500 -p 127.0.0.1:8700:8700 lockbroker
#
# Consul is configured by CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN and the other
# standard Consul variables; see docker-compose.yml for a complete setup.

FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# The version that `broker --version`, its start-up line and
# lockbroker_build_info report: docker build --build-arg VERSION=$(git
# describe --tags --always) --build-arg REVISION=$(git rev-parse HEAD) .
ARG VERSION=devel
ARG REVISION=
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -buildvcs=auto -ldflags "-X github.com/lockbroker/lockbroker/internal/buildinfo.version=${VERSION} -X github.com/lockbroker/lockbroker/internal/buildinfo.revision=${REVISION}" -o /out/broker ./cmd/broker && \
    CGO_ENABLED=0 go build -trimpath -buildvcs=auto -ldflags "-X github.com/lockbroker/lockbroker/internal/buildinfo.version=${VERSION} -X github.com/lockbroker/lockbroker/internal/buildinfo.revision=${REVISION}" -o /out/lockctl ./cmd/lockctl

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/broker /out/lockctl /usr/local/bin/
# Listen on every interface of the container (the broker's own default is
# loopback); publish the ports on the host's loopback only.
ENV LOCKBROKER_LISTEN=0.0.0.0:8700 LOCKBROKER_HTTP_LISTEN=0.0.0.0:8701
USER 65532:65532
# 8700: gRPC (LockService, SessionService, health, reflection).
# 8701: HTTP /metrics and /healthz.
EXPOSE 8700 8701
ENTRYPOINT ["/usr/local/bin/broker"]
