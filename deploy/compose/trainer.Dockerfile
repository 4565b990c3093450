# The example trainer of deploy/compose.yaml: CPU torch, samplecache with its client and
# s3 extras, and the example script. Build from the repository root (compose does):
#   docker build -f deploy/compose/trainer.Dockerfile -t samplecache-trainer .
# Your own trainer image needs torch and `pip install samplecache[client]` (the s3 extra
# only to upload data, as this example does).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

# Where pip gets torch: the CPU wheels (or a directory of wheels: --find-links DIR).
ARG TORCH_FROM="--index-url https://download.pytorch.org/whl/cpu"

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/trainer/bin:$PATH

# torch first, in a layer that no change of ours invalidates. TORCH_FROM holds several
# pip options: split on purpose.
# hadolint ignore=SC2086
RUN python -m venv /opt/trainer \
 && /opt/trainer/bin/pip install --no-cache-dir ${TORCH_FROM} torch==2.13.0

# Then the dependencies read from pyproject.toml (a layer rebuilt only when it changes),
# then the package itself (deploy/Dockerfile does the same).
WORKDIR /src
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
extras = [p['optional-dependencies'][e] for e in ('client', 's3')]; \
print('\n'.join(p['dependencies'] + sum(extras, [])))" > requirements.txt \
 && /opt/trainer/bin/pip install --no-cache-dir --requirement requirements.txt
COPY README.md ./
COPY client/ client/
COPY service/ service/
RUN /opt/trainer/bin/pip install --no-cache-dir --no-deps . \
 && rm -rf /src/build /src/*.egg-info

# The daemon's uid and gid: LMDB readers write their slot into lock.mdb, which the daemon
# creates as its own.
RUN groupadd --gid 10001 samplecache \
 && useradd --uid 10001 --gid samplecache --create-home --shell /usr/sbin/nologin trainer
COPY deploy/compose/example.py /opt/example.py
USER 10001:10001
WORKDIR /home/trainer
ENTRYPOINT ["python", "/opt/example.py"]
CMD ["train"]
