"""The TypedDicts that describe JSON records stay in step with the dataclasses they are written from."""

import dataclasses

import pytest

from gemma4_t4 import cpuattn, server, torchfix
from gemma4_t4.server import ServerConfig


def _keys(typed_dict: type) -> set[str]:
    return set(typed_dict.__annotations__)


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize(
    ("record", "source", "extra"),
    [
        (server.ServerConfigRecord, ServerConfig, set()),
        (cpuattn.ChoiceRecord, cpuattn.Choice, set()),
        (cpuattn.ProbeResultRecord, cpuattn.ProbeResult, set()),
        (torchfix.TorchFixRecord, torchfix.TorchFixPlan, {"command_line"}),
        (torchfix.TorchFactsRecord, torchfix.TorchFacts, set()),
    ],
)
def test_a_record_names_every_field_it_is_written_from(record, source, extra):
    assert _keys(record) == _fields(source) | extra


def test_the_masked_config_has_the_record_s_keys():
    masked = server._masked_config(
        ServerConfig(model="m", api_key="secret-value", extra_args=["--hf-token", "k12345"])
    )
    assert set(masked) == _keys(server.ServerConfigRecord)
    assert masked["api_key"] == "***" and masked["extra_args"] == ["--hf-token", "***"]
