"""The plugin inside a real vLLM CPU server: loaded in each process, and it does nothing on CPU."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.vllm

LINE = re.compile(r"gemma4-t4 turing fix: (?P<action>[\w-]+): (?P<reason>.*) \[vLLM (?P<version>\S+), "
                  r"via (?P<origin>[\w-]+), pid (?P<pid>\d+)\]")
ROUTE_LINE = re.compile(r"gemma4-t4 turing prefill: (?P<action>[\w-]+): (?P<reason>.*) \[vLLM \S+, via plugin, "
                        r"pid (?P<pid>\d+)\]")
PREFIX = re.compile(r"^\((?P<process>\w+) pid=(?P<pid>\d+)\)")


def test_plugin_loaded_in_every_vllm_process_and_chose_no_change_on_cpu(vllm_server):
    assert vllm_server.healthy()
    log = vllm_server.log_path.read_text(errors="replace").splitlines()
    found = [(PREFIX.match(line), match) for line in log if (match := LINE.search(line))]
    assert found, "the plugin logged nothing: is the package installed (pip install -e .)?"
    for _prefix, match in found:
        assert match["action"] == "no-change" and match["origin"] == "plugin", match.group(0)
        assert "platform is cpu, not CUDA" in match["reason"] and match["version"].startswith("0.32")
    pids = [match["pid"] for _prefix, match in found]
    assert len(pids) == len(set(pids)), "a process logged more than one line"
    # The API server loads plugins before it configures logging, so its line has no "(APIServer pid=N)"
    # prefix; its pid is the one vLLM's later APIServer lines carry.
    api_pids = {prefix["pid"] for prefix in map(PREFIX.match, log) if prefix and prefix["process"] == "APIServer"}
    assert api_pids & set(pids), f"no plugin line from the API server {api_pids}: {pids}"
    processes = {prefix["process"] for prefix, _match in found if prefix}
    assert "EngineCore" in processes, f"no plugin line from the EngineCore process: {found}"
    # the tensor-core prefill route: one line per process, no-change off CUDA
    route = [m for line in log if (m := ROUTE_LINE.search(line))]
    assert sorted(m["pid"] for m in route) == sorted(pids), (route, pids)
    assert all(m["action"] == "no-change" and "not CUDA" in m["reason"] for m in route)
