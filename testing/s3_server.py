"""A local S3 endpoint for tests, fuzzing and benchmarks: moto's S3 server on 127.0.0.1
(needs ``moto[server]``, and ``s3fs`` to reach it).

:func:`local_s3` starts one (in this process's threads, or as a child process so that its
work does not share this process's GIL: the benchmarks), sets dummy credentials in the
environment for the time it runs (``AWS_ACCESS_KEY_ID``… — never real ones), creates a
bucket, and yields an :class:`S3Endpoint` whose ``storage_options`` bound every request
(timeouts, attempts). Loopback only: nothing leaves the machine.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DUMMY_CREDENTIALS", "S3Endpoint", "local_s3", "free_port"]

#: What the environment holds while an endpoint runs (moto accepts any).
DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class S3Endpoint:
    """A running local S3 endpoint.

    Attributes:
        url: ``http://127.0.0.1:<port>``.
        bucket: a bucket created on it.
        storage_options: what fsspec/s3fs needs to reach it, requests bounded.
        env: the environment variables a child process needs (credentials, endpoint).
    """

    url: str
    bucket: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def root(self, name: str) -> str:
        """``s3://<bucket>/<name>``."""
        return f"s3://{self.bucket}/{name}"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def local_s3(bucket: str = "tlckpt-test", *, child_process: bool = False) -> Iterator[S3Endpoint]:
    """A moto S3 server on 127.0.0.1 with ``bucket`` created, stopped on exit.

    Args:
        bucket: the bucket to create.
        child_process: run the server as a child process (else threads of this one).

    Raises:
        OSError: the server did not start within 30 seconds.
    """
    saved = {name: os.environ.get(name) for name in (*DUMMY_CREDENTIALS, "AWS_ENDPOINT_URL")}
    os.environ.update(DUMMY_CREDENTIALS)
    process = server = None
    try:
        if child_process:
            port = free_port()
            process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            _wait_listening(port, 30)
            host = "127.0.0.1"
        else:
            import logging

            from moto.server import ThreadedMotoServer

            # One line per request otherwise, from werkzeug's logger.
            logging.getLogger("werkzeug").setLevel(logging.WARNING)

            server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            server.start()
            host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        options = {
            "client_kwargs": {"endpoint_url": url},
            "config_kwargs": {
                "connect_timeout": 5,
                "read_timeout": 60,
                "retries": {"max_attempts": 2, "mode": "standard"},
            },
        }
        import fsspec

        fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        # moto's state is per process: an earlier server of this process made it already.
        with contextlib.suppress(FileExistsError):
            fs.mkdir(bucket)
        env = {**DUMMY_CREDENTIALS, "AWS_ENDPOINT_URL": url}
        yield S3Endpoint(url, bucket, options, env)
    finally:
        if server is not None:
            server.stop()
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
