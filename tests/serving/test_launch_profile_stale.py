"""Why a T4 launch ignores the stored tune profiles: the explanation names the real difference of the
profile closest to this host (this GPU's profile from another vLLM), never that of another GPU's
profile that merely sorts first on disk."""

from __future__ import annotations

from gemma4_t4.foundation.atomic import atomic_write_json
from gemma4_t4.serving import launch_profile

MODEL = "google/gemma-4-E2B-it-qat-w4a16-ct"
GPU = "Tesla T4"


def _store(key: launch_profile.ProfileKey) -> None:
    profile = launch_profile.LaunchProfile(
        key=key,
        measured_on="2026-12-01",
        cells=[],
        choices=[],
        prefill=launch_profile.PrefillChoice(route_on=False, verdict_path="/nonexistent", why="none"),
        drafter="off",
    )
    atomic_write_json(launch_profile.profile_path(key), profile.model_dump(mode="json"))


def test_a_stale_profile_of_this_gpu_is_explained_by_its_vllm_not_by_an_l4_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path / "cache"))
    here = launch_profile.host_key(MODEL, gpu_name=lambda: GPU)
    assert here is not None
    # an L4 profile with this host's versions ("nvidia-l4-..." sorts before "tesla-t4-...") and a T4
    # profile measured with another vLLM: the T4 one is the stale one to explain
    _store(here.model_copy(update={"gpu": "NVIDIA L4"}))
    _store(here.model_copy(update={"vllm": "0.29.9"}))
    names = sorted(p.name for p in launch_profile.profile_dir().glob("*.json"))
    assert names[0].startswith("nvidia-l4")

    choice = launch_profile.launch_choice(MODEL, gpu_name=lambda: GPU)

    assert choice.draft == "off"
    assert f"measured with another vllm 0.29.9 (here {here.vllm})" in choice.reason
    assert "NVIDIA L4" not in choice.reason


def test_only_another_gpus_profile_is_explained_by_its_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA4_T4_CACHE_DIR", str(tmp_path / "cache"))
    here = launch_profile.host_key(MODEL, gpu_name=lambda: GPU)
    assert here is not None
    _store(here.model_copy(update={"gpu": "NVIDIA L4"}))

    choice = launch_profile.launch_choice(MODEL, gpu_name=lambda: GPU)

    assert f"measured with another gpu NVIDIA L4 (here {GPU})" in choice.reason
