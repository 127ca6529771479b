# The meshdl edge as a container image (deploy/compose.yaml builds it from the repository
# root): `docker build -f deploy/edge.Dockerfile -t meshdl .`; the entrypoint is `meshdl`.
FROM python:3.11-slim

WORKDIR /opt/meshdl
COPY pyproject.toml README.md ./
COPY meshdl meshdl
COPY nodes nodes
COPY edge edge
COPY sim sim
RUN pip install --no-cache-dir . \
    && useradd --system --home-dir /var/lib/meshdl --shell /usr/sbin/nologin meshdl \
    && install -d -o meshdl -g meshdl -m 0700 /var/lib/meshdl

USER meshdl
WORKDIR /var/lib/meshdl
ENV PYTHONUNBUFFERED=1 \
    NUMBA_CACHE_DIR=/var/lib/meshdl/numba-cache
ENTRYPOINT ["meshdl"]
CMD ["--help"]
