"""`opledger flower` asks for its password everywhere, /metrics and /healthcheck included
(Flower itself leaves those two open), against a real Flower process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from opledger.dev.processes import PrivateRedis, free_port, unconfigured_environ, wait_until
from tests.forks import ForkedProc

pytestmark = pytest.mark.system

PASSWORD = "test-only-flower"
COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def _answers(base: str) -> bool:
    try:
        httpx.get(f"{base}/healthcheck", timeout=1)
        return True
    except httpx.HTTPError:
        return False


@pytest.mark.timeout(120)
def test_every_flower_endpoint_asks_for_the_password(
    private_redis: PrivateRedis, database_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = unconfigured_environ()
    env.update(
        OPLEDGER_DATABASE_URL=database_url,
        OPLEDGER_BROKER_URL=private_redis.url,
        OPLEDGER_FLOWER_PASSWORD=PASSWORD,
        OPLEDGER_STATE_DIR=str(tmp_path),
    )
    flower = ForkedProc("flower", ["flower", "--port", str(port)], env, tmp_path / "flower.log")
    base = f"http://127.0.0.1:{port}"  # the default address: loopback
    try:
        wait_until(lambda: flower.proc.poll() is not None or _answers(base), 60, "Flower to listen")
        assert flower.proc.poll() is None, flower.output()[-3000:]
        for path in ("/metrics", "/healthcheck", "/", "/api/workers"):
            anonymous = httpx.get(f"{base}{path}", timeout=10)
            assert anonymous.status_code == 401, (path, anonymous.text[:200])
            if not path.startswith("/api/"):  # a browser is asked for the password
                assert anonymous.headers.get("WWW-Authenticate", "").startswith("Basic"), path
            wrong = httpx.get(f"{base}{path}", auth=("opledger", "wrong"), timeout=10)
            assert wrong.status_code == 401, path
        right = ("opledger", PASSWORD)
        metrics = httpx.get(f"{base}/metrics", auth=right, timeout=10)
        assert metrics.status_code == 200 and "flower_" in metrics.text
        health = httpx.get(f"{base}/healthcheck", auth=right, timeout=10)
        assert health.status_code == 200 and health.text == "OK"
        assert httpx.get(f"{base}/", auth=right, timeout=10).status_code == 200
        # docker-compose's health check logs in too
        check = yaml.safe_load(COMPOSE.read_text())["services"]["flower"]["healthcheck"]["test"]
        assert check[:3] == ["CMD", "python", "-c"]
        code = check[3].replace(":5555/", f":{port}/")
        probe = {**env, "OPLEDGER_FLOWER_USER": "opledger"}
        assert subprocess.run([sys.executable, "-c", code], env=probe).returncode == 0
        probe["OPLEDGER_FLOWER_PASSWORD"] = "wrong"
        denied = subprocess.run([sys.executable, "-c", code], env=probe, capture_output=True)
        assert denied.returncode != 0 and b"401" in denied.stderr
    finally:
        flower.kill()
