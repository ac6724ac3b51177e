"""The committed stubs under client/v1 are exactly what `make proto` makes from protos/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    protos = sorted(str(p.relative_to(ROOT / "protos")) for p in (ROOT / "protos").rglob("*.proto"))
    bin_dir = str(Path(sys.executable).parent)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-Iprotos",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            f"--mypy_out={tmp_path}",
            f"--mypy_grpc_out={tmp_path}",
            *protos,
        ],
        cwd=ROOT,
        check=True,
        env={**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"]},
    )
    fresh = {p.name: p.read_bytes() for p in (tmp_path / "calor" / "v1").iterdir()}
    committed = {p.name: p.read_bytes() for p in (ROOT / "client" / "v1").glob("*_pb2*")}
    assert sorted(committed) == sorted(fresh), "run `make proto`: the set of stub files changed"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"run `make proto`: stale stubs {stale}"


def test_every_service_is_declared() -> None:
    from calor.v1 import memory_service_pb2, settings_service_pb2, trigger_service_pb2

    services = {
        s.name: sorted(m.name for m in s.methods)
        for module in (memory_service_pb2, trigger_service_pb2, settings_service_pb2)
        for s in module.DESCRIPTOR.services_by_name.values()
    }
    assert set(services) == {"MemoryService", "TriggerService", "SettingsService"}
    assert {
        "Store",
        "StoreStream",
        "Recall",
        "Inspect",
        "ListMemories",
        "Update",
        "Keystone",
        "Boost",
        "Forget",
        "Connect",
        "Share",
        "Evaluate",
        "EntityCard",
        "Dream",
        "Offer",
        "Context",
        "Identity",
        "Feedback",
        "Export",
        "Import",
        "Tune",
        "Progress",
        "ListChannels",
        "DropChannel",
    } == set(services["MemoryService"])
    assert set(services["TriggerService"]) == {
        "CreateTrigger",
        "ListTriggers",
        "DeleteTrigger",
        "TriggerHistory",
        "EvaluateTriggers",
        "Subscribe",
        "TriggerFeedback",
    }
    assert set(services["SettingsService"]) == {"GetSettings", "UpdateSettings", "ServerStatus"}
