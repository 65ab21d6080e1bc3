"""The shipped Mosquitto drop-in on Debian's stock broker, set up as deploy/README.md says.

Debian's own ``/etc/mosquitto/mosquitto.conf`` is copied with every path moved under a
temporary root, so its ``include_dir`` reads the shipped drop-in from ``<root>/etc/mosquitto/
conf.d/``. The shell commands of the README's step 1 run as written, except: ``apt-get`` and
``systemctl`` are left out, ``/etc/mosquitto`` moves under the root, each ``'SECRET'``
becomes a random password and the certificate is made for ``localhost``. The one change to
the drop-in itself is its listener: a free port on loopback instead of 8883. Then the broker
starts from the stock file, and the central host ("aggregator") and an agent log in over TLS
through fiomon's own client code, with the password file and CA file the README's steps 2
and 3 give them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import pytest

from fiomon.config import BrokerConfig, TlsConfig
from fiomon.mqtt import MqttSession
from tests.conftest import DEADLINE_S, free_port, until

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
log = logging.getLogger("test.deploy")
STOCK = Path("/etc/mosquitto/mosquitto.conf")
AS_ROOT = os.geteuid() == 0


def _client(broker: BrokerConfig, identifier: str) -> aiomqtt.Client:
    """fiomon's client for ``broker`` (password file, TLS), for ``async with``."""
    return MqttSession(broker, identifier=identifier, logger=log).client


def readme_step(title: str) -> list[str]:
    """The commands of the ``sh`` block under the README heading ``title``."""
    text = (DEPLOY / "README.md").read_text()
    section = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def under(root: Path, text: str) -> str:
    """``text`` with every absolute path (a word starting with ``/``) moved under ``root``."""
    return re.sub(r"(?<![\w/.-])/(?=[\w.-])", f"{root}/", text)


@pytest.fixture
def root() -> Iterator[Path]:
    """A stand-in for ``/`` that the ``mosquitto`` user can enter (it drops root).

    pytest's own temporary folders are private to their owner, so this one is made by hand.
    """
    path = Path(tempfile.mkdtemp(prefix="fiomon-broker-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _debian_layout(root: Path) -> None:
    """The folders Debian's mosquitto package (and its unit's RuntimeDirectory) provide."""
    for d in ("etc/mosquitto/conf.d", "etc/mosquitto/certs", "etc/fiomon"):
        (root / d).mkdir(parents=True)
    for d in ("var/lib/mosquitto", "var/log/mosquitto", "run/mosquitto"):
        (root / d).mkdir(parents=True)
        if AS_ROOT:
            shutil.chown(root / d, "mosquitto", "mosquitto")


def _run_step_1(root: Path, work: Path, secret: str, hosts: Sequence[str] = ()) -> None:
    """The README's broker commands, run in a copy of ``deploy/``.

    ``hosts``: the client hosts' users to create instead of the README's example names.
    """
    script = []
    example = "for h in client-01 client-02;"
    for command in readme_step("1. Broker"):
        if command.startswith(("apt-get ", "systemctl ")):
            continue  # the package is installed; the test starts the broker itself
        if command.startswith("chown ") and not AS_ROOT:
            continue  # without root Mosquitto keeps the caller's user: nothing to hand over
        line = command
        if hosts and command.startswith("for h in "):
            assert command.startswith(example), f"README step 1 changed: {command}"
            line = command.replace(example, f"for h in {' '.join(hosts)};")
        script.append(
            line.replace("/etc/mosquitto/", f"{root}/etc/mosquitto/")
            .replace("'SECRET'", f"'{secret}'")
            .replace("$(hostname -f)", "localhost")
        )
    r = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(script)],
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
        timeout=DEADLINE_S,
    )
    assert r.returncode == 0, f"deploy/README.md step 1 failed:\n{r.stderr}"


@dataclass(frozen=True)
class Broker:
    """The running broker: its port, the fiomon side's files, the secret, the log."""

    port: int
    etc_fiomon: Path
    secret: str
    log: Path
    db: Path
    proc: subprocess.Popen[bytes]


@pytest.fixture
def stock_broker(root: Path, tmp_path: Path, mosquitto_bin: str) -> Iterator[Broker]:
    """Debian's stock broker with the drop-in, set up by the README's step 1."""
    with stock_broker_running(root, tmp_path, mosquitto_bin) as broker:
        yield broker


@contextmanager
def stock_broker_running(
    root: Path, tmp_path: Path, mosquitto_bin: str, hosts: Sequence[str] = ()
) -> Iterator[Broker]:
    """Debian's stock broker with the drop-in, set up by the README's step 1, until exit.

    Args:
        root: the stand-in for ``/`` (see :func:`root`); ``<root>/etc/fiomon`` gets the
            fiomon side's ``mqtt.pass`` and ``ca.crt`` (steps 2 and 3).
        tmp_path: a private folder for the copy of ``deploy/`` and the broker's stderr.
        mosquitto_bin: the broker binary.
        hosts: client hosts' logins to create (default: the README's example names).
    """
    if not STOCK.is_file():
        pytest.fail(f"{STOCK} is missing: apt-get install mosquitto (scripts/test does)")
    stock = STOCK.read_text()
    assert re.search(r"(?m)^include_dir /etc/mosquitto/conf\.d$", stock), "Debian reads conf.d"
    assert re.search(r"(?m)^persistence_location ", stock), "and sets the persistence"
    _debian_layout(root)
    conf = root / "etc/mosquitto/mosquitto.conf"
    conf.write_text(under(root, stock))
    work = tmp_path / "deploy"
    shutil.copytree(DEPLOY, work)
    secret = secrets.token_urlsafe(12)
    _run_step_1(root, work, secret, hosts)

    drop_in = root / "etc/mosquitto/conf.d/fiomon.conf"
    assert drop_in.read_text() == (DEPLOY / "mosquitto/fiomon.conf").read_text()
    port = free_port()
    text = under(root, drop_in.read_text())
    drop_in.write_text(re.sub(r"(?m)^listener 8883$", f"listener {port} 127.0.0.1", text))
    # Steps 2 and 3: the MQTT password file and the broker's certificate as CA file.
    etc_fiomon = root / "etc/fiomon"
    (etc_fiomon / "mqtt.pass").write_text(f"{secret}\n")
    shutil.copy(work / "fiomon.crt", etc_fiomon / "ca.crt")

    log = root / "var/log/mosquitto/mosquitto.log"
    stderr = tmp_path / "mosquitto.stderr"
    with stderr.open("wb") as err:
        proc = subprocess.Popen([mosquitto_bin, "-c", str(conf)], stdout=err, stderr=err)
    try:
        # Ready once it logs "running", after opening its listeners. (Not by probing the
        # port: a bare TCP connection to a TLS listener logs an OpenSSL error.)
        deadline = time.monotonic() + DEADLINE_S
        while not (log.exists() and " running" in log.read_text()):
            if proc.poll() is not None:
                logged = log.read_text() if log.exists() else ""
                pytest.fail(f"mosquitto exited {proc.returncode}: {stderr.read_text()}{logged}")
            if time.monotonic() > deadline:
                pytest.fail(f"mosquitto did not start within {DEADLINE_S:g} s")
            time.sleep(0.05)
        yield Broker(port, etc_fiomon, secret, log, root / "var/lib/mosquitto/mosquitto.db", proc)
    finally:
        proc.terminate()
        proc.wait(DEADLINE_S)
    assert proc.returncode == 0, stderr.read_text()


async def test_drop_in_starts_debians_stock_broker_and_accepts_the_documented_logins(
    stock_broker: Broker, tmp_path: Path
) -> None:
    b = stock_broker

    def broker(user: str | None, password_file: Path | None = None) -> BrokerConfig:
        return BrokerConfig(
            host="localhost",
            port=b.port,
            tls=TlsConfig(ca_file=b.etc_fiomon / "ca.crt"),
            username=user,
            password_file=password_file or (b.etc_fiomon / "mqtt.pass"),
        )

    got: list[str] = []
    async with _client(broker("aggregator"), "fiomon-aggregator") as agg:
        await agg.subscribe("fiomon/v1/#", qos=1)
        async with _client(broker("client-01"), "fiomon-agent-client-01") as a:
            # Refused by the ACL, yet PUBACKed (Mosquitto 2.0 acks a denied QoS 1 publish).
            # Sent first: the broker keeps one publisher's order, so had it been let
            # through, it would arrive first.
            await a.publish("fiomon/v1/client-02/records", b"not mine", qos=1)
            await a.publish("fiomon/v1/client-01/records", b"mine", qos=1)
        async with asyncio.timeout(DEADLINE_S):
            async for m in agg.messages:
                got.append(m.topic.value)
                break
    assert got == ["fiomon/v1/client-01/records"]
    # An agent reads its own status topic back (another agent with its host name shows
    # there), and no other host's.
    async with _client(broker("client-01"), "fiomon-agent-client-01") as a:
        await a.subscribe("fiomon/v1/+/status", qos=1)
        await a.publish("fiomon/v1/client-01/status", b"{}", qos=1)
        async with asyncio.timeout(DEADLINE_S):
            async for m in a.messages:
                assert m.topic.value == "fiomon/v1/client-01/status"
                break
    wrong = tmp_path / "wrong.pass"
    wrong.write_text("not the password\n")
    for cfg in (broker(None), broker("client-01", wrong)):
        with pytest.raises(aiomqtt.MqttError):
            async with _client(cfg, "intruder"):
                pass  # anonymous clients and wrong passwords are refused


async def test_the_stock_persistence_stays_in_force(stock_broker: Broker) -> None:
    # The drop-in must not set what Debian's mosquitto.conf sets (a second
    # persistence_location stops the broker): the broker saves its sessions and retained
    # messages where the stock file says. SIGUSR1 asks for a save now.
    assert not stock_broker.db.exists()
    stock_broker.proc.send_signal(signal.SIGUSR1)
    await until(stock_broker.db.exists, what=f"{stock_broker.db} saved")
    assert "Error" not in stock_broker.log.read_text()


async def test_the_roots_broker_from_step_1_lets_cells_send_partials(
    stock_broker: Broker,
) -> None:
    """Section 7: the root's broker is step 1's; the cells log in as ``aggregator`` there.

    The shipped ACL must let them publish ``fiomon/v1/_partials/<cell>`` and the root (also
    ``aggregator``) read it. A denial would be PUBACKed all the same; with MQTT 5 the
    reason code says so (:meth:`~fiomon.mqtt.MqttSession.publish_checked` raises).
    """
    b = stock_broker
    login = BrokerConfig(
        host="localhost",
        port=b.port,
        tls=TlsConfig(ca_file=b.etc_fiomon / "ca.crt"),
        username="aggregator",
        password_file=b.etc_fiomon / "mqtt.pass",
    )
    got: list[tuple[str, bytes]] = []
    async with _client(login, "fiomon-root") as root:
        await root.subscribe("fiomon/v1/_partials/+", qos=1)
        cell = MqttSession(login, identifier="fiomon-cell-cell-a", logger=log, mqtt5=True)
        async with cell.client:
            await cell.publish_checked("fiomon/v1/_partials/cell-a", b"partials")
        async with asyncio.timeout(DEADLINE_S):
            async for m in root.messages:
                got.append((m.topic.value, bytes(m.payload)))
                break
    assert got == [("fiomon/v1/_partials/cell-a", b"partials")]


async def test_the_roots_broker_from_step_1_lets_the_root_acknowledge_to_the_cells(
    stock_broker: Broker,
) -> None:
    """Issue 24: the root (``aggregator``) publishes ``fiomon/v1/_partials_ack/<cell>``,
    retained; a cell (``aggregator`` too) reads it. A denial would be PUBACKed with 0x87."""
    b = stock_broker
    login = BrokerConfig(
        host="localhost",
        port=b.port,
        tls=TlsConfig(ca_file=b.etc_fiomon / "ca.crt"),
        username="aggregator",
        password_file=b.etc_fiomon / "mqtt.pass",
    )
    body = b'{"next_seq": 7, "at_ms": 1}'
    root = MqttSession(login, identifier="fiomon-root", logger=log, mqtt5=True)
    async with root.client:
        await root.publish_checked("fiomon/v1/_partials_ack/cell-a", body, retain=True)
    got: list[tuple[str, bytes, bool]] = []
    async with _client(login, "fiomon-cell-cell-a") as cell:
        await cell.subscribe("fiomon/v1/_partials_ack/cell-a", qos=1)
        async with asyncio.timeout(DEADLINE_S):
            async for m in cell.messages:
                got.append((m.topic.value, bytes(m.payload), m.retain))
                break
    assert got == [("fiomon/v1/_partials_ack/cell-a", body, True)]
