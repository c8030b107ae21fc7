"""No AWS credentials: every AWS command says so, with how to provide them, before concluding anything
from the calls that failed for that reason (``sagemaker quotas`` once said "no quota ... in any region;
fix: request an increase")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.sagemaker.aws import client_factory
from gemma4_t4.sagemaker.quotas import check_quotas

REPO = Path(__file__).resolve().parents[2]


def _no_credentials(tmp_path: Path) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    # no files, no instance metadata service: boto3 finds no credentials anywhere
    return environ | {"AWS_SHARED_CREDENTIALS_FILE": "/dev/null", "AWS_CONFIG_FILE": "/dev/null",
                      "AWS_EC2_METADATA_DISABLED": "true", "HOME": str(tmp_path),
                      "GEMMA4_T4_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}


@pytest.mark.parametrize("args", [
    ["sagemaker", "quotas"],
    ["sagemaker", "quotas", "--instance-type", "ml.g4dn.xlarge", "--region", "us-east-2"],
])
def test_quotas_without_credentials_says_credentials_are_missing(tmp_path, args):
    done = subprocess.run([sys.executable, "-m", "gemma4_t4", *args, "--json"], env=_no_credentials(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    error = json.loads(done.stdout)
    assert "no AWS credentials" in error["message"] and "aws configure" in error["fix"]
    assert "request an increase" not in done.stdout and "no quota" not in done.stdout


def test_every_client_the_factory_makes_needs_credentials(tmp_path, monkeypatch):
    for name, value in _no_credentials(tmp_path).items():
        if name.startswith("AWS_") or name == "HOME":
            monkeypatch.setenv(name, value)
    for key in [k for k in os.environ if k.startswith("AWS_") and k not in _no_credentials(tmp_path)]:
        monkeypatch.delenv(key)
    with pytest.raises(Gemma4T4Error, match="no AWS credentials") as info:
        client_factory()("sagemaker", "us-east-2")
    assert "AWS_PROFILE" in info.value.fix


def test_a_region_failing_for_credentials_ends_the_check_instead_of_reading_as_no_quota():
    from botocore.exceptions import NoCredentialsError

    class Failing:
        def get_paginator(self, name):
            raise NoCredentialsError()

    with pytest.raises(Gemma4T4Error, match="NoCredentialsError") as info:
        check_quotas(clients=lambda service, region: Failing())
    assert "aws configure" in info.value.fix
