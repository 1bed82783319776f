# syntax=docker/dockerfile:1
# mlpa-aiohttp: build a virtualenv in one stage, run it from a clean slim image.
#   docker build -t mlpa-aiohttp .
#   docker run -p 8080:8080 --env-file .env mlpa-aiohttp       (.env: your copy of config/example.env)
#   docker run --env-file .env mlpa-aiohttp python -m mlpa_aiohttp migrate

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder


ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
# The pinned, hashed runtime dependencies first (a layer that changes only with the lock;
# regenerate it with `bash .ci/lock`). Every one ships wheels for this platform, so no
# compiler is needed here either.
COPY requirements.lock ./
RUN pip install --no-cache-dir --require-hashes -r requirements.lock
COPY setup.cfg pyproject.toml ./
COPY README.md ./
COPY mlpa_aiohttp ./mlpa_aiohttp
# The package itself, without resolving anything more; pip check fails the build if the
# lock lacks something setup.cfg asks for.
RUN pip install --no-cache-dir --no-deps . && pip check
# Optional: memray, for MEMRAY_ENABLED (docker-entrypoint.sh); not in the lock, so only an image
# built for profiling has it: --build-arg MEMRAY_VERSION=1.20.0 (docs/images.md).
ARG MEMRAY_VERSION=""
RUN if [ -n "$MEMRAY_VERSION" ]; then pip install --no-cache-dir "memray==${MEMRAY_VERSION}"; fi


FROM ${PYTHON_IMAGE} AS runtime

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PORT=8080

# jemalloc, which the entrypoint preloads: with glibc's malloc, pods grew to their memory limit.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libjemalloc2=5.3.* \
    && rm -rf /var/lib/apt/lists/*

# A fixed uid/gid, so Kubernetes' runAsNonRoot can verify it and volume ownership is stable.
RUN groupadd --system --gid 10001 mlpa \
    && useradd --system --uid 10001 --gid mlpa --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin mlpa

COPY --from=builder /opt/venv /opt/venv
WORKDIR /app
COPY config/gunicorn.conf.py /app/config/gunicorn.conf.py
COPY --chmod=0755 config/docker-entrypoint.sh /app/docker-entrypoint.sh

USER 10001:10001
EXPOSE 8080

# Kubernetes probes /health/liveness and /health/readiness; no HEALTHCHECK here.
# Exec form, and the entrypoint `exec`s the command: gunicorn is PID 1 and receives SIGTERM itself.
ENTRYPOINT ["/app/docker-entrypoint.sh"]
CMD ["gunicorn", "-c", "/app/config/gunicorn.conf.py", "mlpa_aiohttp.app:app_factory"]
