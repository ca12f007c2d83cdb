# One image for every Strata node; docker-compose.yml picks the role with its command.
FROM python:3.11-slim

# PYTHONSAFEPATH: the working dir (the data dir, holding "metadata/") never shadows a package.
ENV PYTHONUNBUFFERED=1 \
    PYTHONSAFEPATH=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/strata
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
RUN pip install . \
    && useradd --system --home-dir /var/lib/strata strata \
    && mkdir -p /etc/strata /var/lib/strata/metadata /var/lib/strata/logs-0 /var/lib/strata/logs-1 \
    && chown -R strata:strata /var/lib/strata

# Named volumes mounted on these directories start with the image's ownership, so the
# nodes can run unprivileged.
USER strata
WORKDIR /var/lib/strata
EXPOSE 9091 9092 9093 9094
CMD ["python", "-m", "broker", "--config", "/etc/strata/server.properties"]
