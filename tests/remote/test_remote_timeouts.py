"""Every request to a store is bounded: an endpoint that accepts connections and never
answers, or refuses them, makes a save raise ``OSError`` in bounded time —
never a hang — and nothing is committed."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import torch

from tlckpt import CheckpointManager, save_checkpoint

OPTIONS = {
    "config_kwargs": {
        "connect_timeout": 1,
        "read_timeout": 1,
        "retries": {"max_attempts": 1, "mode": "standard"},
    },
}


@pytest.fixture
def silent_endpoint():
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def _options(endpoint: str) -> dict:
    return {**OPTIONS, "client_kwargs": {"endpoint_url": endpoint}, "skip_instance_cache": True}


def test_a_silent_endpoint_fails_in_bounded_time(silent_endpoint, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    model = torch.nn.Linear(4, 4)
    started = time.monotonic()
    with pytest.raises(OSError):
        save_checkpoint(
            "s3://bucket/run/step-00000000000000000001",
            model=model,
            step=1,
            storage_options=_options(silent_endpoint),
        )
    assert time.monotonic() - started < 60


def test_a_closed_port_fails_in_bounded_time(monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens
    started = time.monotonic()
    with pytest.raises(OSError):
        CheckpointManager(
            "s3://bucket/run", storage_options=_options(f"http://127.0.0.1:{port}")
        ).save(1, model=torch.nn.Linear(4, 4))
    assert time.monotonic() - started < 60
