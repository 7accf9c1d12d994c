# The opledger image: one image for migrate, worker, beat, flower and the sandbox.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY opledger ./opledger
RUN pip install . && useradd --create-home --uid 10001 opledger
USER opledger
WORKDIR /home/opledger

ENTRYPOINT ["opledger"]
CMD ["--help"]
