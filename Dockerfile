# syntax=docker/dockerfile:1
#
# webhook-ingest: one image for every role, chosen by the command.
#   docker build -t webhook-ingest:latest .
#   docker run --rm webhook-ingest:latest worker --concurrency 256 --metrics-port 9100
#
# The builder stage turns the project and all its dependencies into wheels;
# the final stage installs only those wheels: no compiler, no sources, no cache.

FROM python:3.11-slim AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only for a dependency without a binary wheel on this platform; never in the final image.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src

# Dependencies first, from pyproject.toml alone, so a code change reuses this layer.
COPY pyproject.toml ./
# With the `otel` extra: tracing is then a matter of OTEL_* variables (docs/operations.md, "Tracing").
RUN python -c "import tomllib; project = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(project['dependencies'] + project['optional-dependencies']['otel']))" \
        > requirements.txt \
    && pip wheel --wheel-dir /wheels -r requirements.txt

COPY README.md ./
COPY shared ./shared
COPY ingress ./ingress
COPY workers ./workers
COPY webhook_ingest ./webhook_ingest
RUN pip wheel --no-deps --wheel-dir /wheels .


FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed numeric uid, so Kubernetes' runAsNonRoot can check it (deploy/kubernetes uses 10001).
RUN groupadd --system --gid 10001 webhooks \
    && useradd --system --uid 10001 --gid webhooks --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin webhooks

# The wheels are bind-mounted for this one step, so they are not a layer of the image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels 'webhook-ingest[otel]'

USER 10001:10001
WORKDIR /tmp

# 8080: ingress (webhooks, /healthz, /readyz, /metrics); 9100: worker --metrics-port.
EXPOSE 8080 9100

ENTRYPOINT ["webhook-ingest"]
CMD ["--help"]
