# One image for every Strata node; docker-compose.yml picks the role with its command.
# BASE_IMAGE: any Debian-like image with Python 3.11+ and its venv module. Without a registry,
# `python -m tools.docker_base` builds an equivalent one from Debian's packages (debootstrap).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# PYTHONSAFEPATH: the working dir (the data dir, holding "metadata/") never shadows a package.
# The venv comes first on PATH: `python` and the kafka-*.sh tools are the installed ones.
ENV PYTHONUNBUFFERED=1 \
    PYTHONSAFEPATH=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/strata/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

WORKDIR /opt/strata
# The dependencies first, in a layer of their own: rebuilt only when pyproject.toml changes (the
# README is a placeholder here, setuptools' find includes nothing yet). A venv, as a Debian
# system Python refuses `pip install` outside one (PEP 668).
COPY pyproject.toml ./
RUN python3 -m venv /opt/strata/venv \
    && touch README.md \
    && pip install "setuptools>=68" . \
    && pip uninstall --yes strata

# Only what `pip install .` needs (the packages listed in pyproject.toml), not .venv or ./data.
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY broker ./broker
COPY controller ./controller
COPY tools ./tools
COPY node ./node
COPY metadata ./metadata
COPY connector ./connector
COPY pyspark_strata ./pyspark_strata
COPY client ./client
RUN pip install --no-deps --no-build-isolation . \
    && rm -rf build \
    && useradd --system --home-dir /var/lib/strata strata \
    && mkdir -p /etc/strata /var/lib/strata/metadata /var/lib/strata/logs-0 /var/lib/strata/logs-1 \
    && chown -R strata:strata /var/lib/strata

# Named volumes mounted on these directories start with the image's ownership, so the
# nodes can run unprivileged.
USER strata
WORKDIR /var/lib/strata
# 29092: a broker's listener on the compose network; 9092-9094: its published EXTERNAL one;
# 9089-9091: the controllers; 9404: metrics
EXPOSE 9089 9090 9091 9092 9093 9094 9404 29092
CMD ["python", "-m", "broker", "--config", "/etc/strata/server.properties"]
