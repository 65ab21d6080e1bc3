"""A webhook receiver on a free loopback port: what Alertmanager (or fiomon) posts."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import yaml

ALERTMANAGER_EXAMPLE = (
    Path(__file__).resolve().parents[1] / "deploy/alertmanager/alertmanager.example.yml"
)


class Webhook(BaseHTTPRequestHandler):
    """Records what Alertmanager posts: (path, notification)."""

    posts: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Webhook.posts.append((self.path, json.loads(body)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


def notifications(status: str) -> list[dict[str, Any]]:
    """The notifications received so far with ``status`` (``firing`` or ``resolved``)."""
    return [p for _, p in Webhook.posts if p["status"] == status]


@contextlib.contextmanager
def webhook_receiver() -> Iterator[int]:
    """A webhook receiver on a free loopback port (yields the port)."""
    Webhook.posts = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Webhook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_port)
    finally:
        server.shutdown()
        server.server_close()


def alertmanager_config(folder: Path, hook_port: int, *, group_wait: str = "1s") -> Path:
    """The shipped Alertmanager example: webhooks to ``hook_port``, short timers."""
    folder.mkdir()
    doc = yaml.safe_load(ALERTMANAGER_EXAMPLE.read_text())
    doc["route"].update(group_wait=group_wait, group_interval="1s")
    for receiver in doc["receivers"]:
        for hook in receiver["webhook_configs"]:
            hook["url"] = f"http://127.0.0.1:{hook_port}/{receiver['name']}"
    path = folder / "alertmanager.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
