# The tools image: fabrique's CLI, run by the plan, verify-digest and write-back steps.
#   docker build --build-arg BASE_IMAGE=python:3.11-slim -t registry:80/fabrique-tools:0.1.0 .
# Pin BASE_IMAGE by digest for a reproducible image (python:3.11-slim@sha256:…).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY fabrique ./fabrique
COPY pipelines ./pipelines
COPY eventsources ./eventsources
COPY netpol ./netpol
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${BASE_IMAGE}
# git: the write-back's plain-git transport clones and pushes with it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends git ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 1000 fabrique \
 && useradd --uid 1000 --gid 1000 --home-dir /home/fabrique --create-home --shell /usr/sbin/nologin fabrique
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["fabrique"]
CMD ["--help"]
