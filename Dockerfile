# The tools image: fabrique's CLI, run by the plan, verify-digest, sign and write-back steps.
#   docker build --build-arg BASE_IMAGE=python:3.11-slim@sha256:… \
#     --build-arg COSIGN_IMAGE=ghcr.io/sigstore/cosign/cosign:v2.4.1@sha256:… \
#     -t registry:80/fabrique-tools:0.1.0 .
# Pin BASE_IMAGE by digest for a reproducible image (python:3.11-slim@sha256:…).
# COSIGN_IMAGE is the upstream cosign image (v2: its key-based signatures are the
# simple-signing ".sig" tags the write-back verifies); it must be pinned by digest.
ARG BASE_IMAGE=python:3.11-slim
ARG COSIGN_IMAGE=ghcr.io/sigstore/cosign/cosign:v2.4.1

FROM ${BASE_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY fabrique ./fabrique
COPY pipelines ./pipelines
COPY eventsources ./eventsources
COPY netpol ./netpol
# pyproject.toml's package-dir: fabrique.specs and fabrique.upstream are read from vendor/
COPY vendor ./vendor
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${COSIGN_IMAGE} AS cosign

FROM ${BASE_IMAGE}
ARG COSIGN_IMAGE
# cosign, pinned: refuse to build from a tag alone
RUN case "${COSIGN_IMAGE}" in *@sha256:*) ;; *) echo "COSIGN_IMAGE must be pinned by digest (…@sha256:…)" >&2; exit 1;; esac
COPY --from=cosign /ko-app/cosign /usr/local/bin/cosign
# git: the write-back's plain-git transport clones and pushes with it; ssh-keygen
# (openssh-client): git signs the write-back commits with it (writeback.signing).
RUN apt-get update \
 && apt-get install -y --no-install-recommends git openssh-client ca-certificates \
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
