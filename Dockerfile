# The opledger image: one image for migrate, worker, beat, flower, the console and the sandbox.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY opledger ./opledger
COPY examples ./examples
# The sandbox providers, the review console and traces are extras; an image for production
# builds without the sandbox:
#   docker build --build-arg EXTRAS=console,tracing .
ARG EXTRAS=sandbox,console,tracing
RUN pip install ".${EXTRAS:+[$EXTRAS]}" && useradd --create-home --uid 10001 opledger
USER opledger
WORKDIR /home/opledger

ENTRYPOINT ["opledger"]
CMD ["--help"]
