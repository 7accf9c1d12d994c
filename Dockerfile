# The opledger image: one image for migrate, worker, beat, flower and the sandbox.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY opledger ./opledger
# The sandbox providers are an extra; an image for production builds without them:
#   docker build --build-arg EXTRAS= .
ARG EXTRAS=sandbox
RUN pip install ".${EXTRAS:+[$EXTRAS]}" && useradd --create-home --uid 10001 opledger
USER opledger
WORKDIR /home/opledger

ENTRYPOINT ["opledger"]
CMD ["--help"]
