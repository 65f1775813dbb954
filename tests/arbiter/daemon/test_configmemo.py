# SPDX-License-Identifier: Apache-2.0
"""The run dir's record of accepted configs (arbiter/daemon/configmemo.py): a restart with the same
config skips jsonschema; any other document, or a record vgpud does not own, is checked."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
import yaml
from support.paths import ROOT
from support.vgpud_harness import Vgpud, pb

from arbiter.config import document_digest, load_config
from arbiter.daemon.configmemo import NAME, AcceptedConfigs
from arbiter.errors import ConfigError

GOOD = "placement:\n  policy: spread\nreconcile:\n  interval_s: 30\n"
BAD = "placement:\n  policy: spread\n  polcy: binpack\n"


def test_an_accepted_document_is_recorded_0600_and_found_by_the_next_start(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(GOOD)
    memo = AcceptedConfigs(tmp_path)
    load_config(config, accepted=memo)
    memo.save()
    record = tmp_path / NAME
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert record.read_text().split() == [document_digest(yaml.safe_load(GOOD))]
    assert document_digest(yaml.safe_load(GOOD)) in AcceptedConfigs(tmp_path)


def test_a_recorded_document_is_loaded_without_importing_jsonschema(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(GOOD)
    memo = AcceptedConfigs(tmp_path)
    load_config(config, accepted=memo)
    memo.save()
    probe = ("import sys; from pathlib import Path\n"
             "from arbiter.config import load_config\n"
             "from arbiter.daemon.configmemo import AcceptedConfigs\n"
             f"memo = AcceptedConfigs(Path({str(tmp_path)!r}))\n"
             f"c = load_config(Path({str(config)!r}), accepted=memo)\n"
             "print(c.placement_policy, 'jsonschema' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    assert out == ["spread", "False"]
    (tmp_path / NAME).unlink()                 # no record: the schema is checked
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    assert out == ["spread", "True"]


def test_a_changed_document_is_checked_and_a_refused_one_never_recorded(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(GOOD)
    memo = AcceptedConfigs(tmp_path)
    load_config(config, accepted=memo)
    memo.save()
    config.write_text(BAD)
    memo = AcceptedConfigs(tmp_path)
    with pytest.raises(ConfigError, match="polcy"):
        load_config(config, accepted=memo)
    memo.save()
    assert (tmp_path / NAME).read_text().split() == [document_digest(yaml.safe_load(GOOD))]


@pytest.mark.parametrize("mode", [0o666, 0o620], ids=["world-writable", "group-writable"])
def test_a_record_others_can_write_is_ignored(tmp_path, mode):
    digest = document_digest(yaml.safe_load(BAD))
    record = tmp_path / NAME
    record.write_text(digest + "\n")
    os.chmod(record, 0o600)
    assert digest in AcceptedConfigs(tmp_path)
    os.chmod(record, mode)
    assert digest not in AcceptedConfigs(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(BAD)
    with pytest.raises(ConfigError, match="polcy"):
        load_config(config, accepted=AcceptedConfigs(tmp_path))


def test_vgpud_records_its_config_and_still_refuses_a_bad_one_at_the_next_start(tmp_path,
                                                                                simgpu_env):
    v = Vgpud(tmp_path, simgpu_env, {"reconcile": {"interval_s": 30}}).start()
    try:
        assert v.stub.Health(pb.HealthRequest(), timeout=10).status == "ok"
        document = yaml.safe_load(v.config_file.read_text())
        record = v.run_dir / NAME
        assert document_digest(document) in record.read_text().split()
        assert stat.S_IMODE(record.stat().st_mode) == 0o600
        v.stop()
        v.start()                                # the same config: accepted, serving again
        assert v.stub.Health(pb.HealthRequest(), timeout=10).status == "ok"
        v.stop()
        v.config_file.write_text(yaml.safe_dump({**document, "placement": {"polcy": "spread"}}))
        p = subprocess.run(v.command(), env=v.env, cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2
        assert len(p.stderr.strip().splitlines()) == 1 and "polcy" in p.stderr, p.stderr
    finally:
        v.close()
