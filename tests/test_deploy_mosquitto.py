"""The shipped Mosquitto config and ACL start on a real broker and do what they say."""

from __future__ import annotations

import asyncio
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import aiomqtt
import pytest

from tests.conftest import free_port

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "mosquitto"


def _config_for_test(tmp: Path, port: int, mosquitto_passwd: str, secret: dict[str, str]) -> Path:
    """The shipped config with a loopback port and temporary files instead of /etc paths."""
    passwd = tmp / "fiomon.passwd"
    for i, (user, pw) in enumerate(secret.items()):
        flag = ["-c"] if i == 0 else []
        subprocess.run([mosquitto_passwd, *flag, "-b", str(passwd), user, pw], check=True)
    acl = tmp / "fiomon.acl"
    shutil.copy(DEPLOY / "fiomon.acl", acl)
    text = (DEPLOY / "fiomon.conf").read_text()
    text = re.sub(r"(?m)^(certfile|keyfile) .*$", "", text)
    text = text.replace("listener 8883", f"user root\nlistener {port} 127.0.0.1")
    text = text.replace("/etc/mosquitto/fiomon.passwd", str(passwd))
    text = text.replace("/etc/mosquitto/fiomon.acl", str(acl))
    text = text.replace("/var/lib/mosquitto/", f"{tmp}/")
    text += f"log_dest file {tmp}/mosquitto.log\nlog_type all\n"
    conf = tmp / "fiomon.conf"
    conf.write_text(text)
    return conf


async def test_shipped_config_starts_and_the_acl_confines_agents(
    tmp_path: Path, mosquitto_bin: str
) -> None:
    mosquitto_passwd = shutil.which("mosquitto_passwd")
    if mosquitto_passwd is None:
        pytest.fail("mosquitto_passwd missing: apt-get install mosquitto")
    port = free_port()
    secret = {"client-07": secrets.token_hex(8), "aggregator": secrets.token_hex(8)}
    conf = _config_for_test(tmp_path, port, mosquitto_passwd, secret)
    proc = await asyncio.create_subprocess_exec(
        mosquitto_bin, "-c", str(conf), stderr=asyncio.subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            if proc.returncode is not None:
                log = (tmp_path / "mosquitto.log").read_text()
                pytest.fail(f"mosquitto refused the shipped config: {log}")
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        got: list[str] = []
        async with aiomqtt.Client(
            "127.0.0.1",
            port,
            username="aggregator",
            password=secret["aggregator"],
            identifier="agg",
        ) as agg:
            await agg.subscribe("fiomon/v1/#", qos=1)
            async with aiomqtt.Client(
                "127.0.0.1",
                port,
                username="client-07",
                password=secret["client-07"],
                identifier="a7",
            ) as agent:
                await agent.publish("fiomon/v1/client-07/records", b"mine", qos=1)
                # Refused by the ACL, yet PUBACKed (REFERENCE §4): only the reader can tell.
                await agent.publish("fiomon/v1/client-08/records", b"not mine", qos=1)
            async with asyncio.timeout(3):
                async for m in agg.messages:
                    got.append(m.topic.value)
                    break
            await asyncio.sleep(0.5)
        with pytest.raises(aiomqtt.MqttError):
            async with aiomqtt.Client("127.0.0.1", port, identifier="anon"):
                pass  # anonymous clients are refused
    finally:
        proc.terminate()
        await proc.wait()
    assert got == ["fiomon/v1/client-07/records"]
    assert "Denied PUBLISH" in (tmp_path / "mosquitto.log").read_text()
