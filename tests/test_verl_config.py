"""Every override the verl engine emits, composed against verl's real Hydra config (0.9.x and 0.6.1).

verl 0.9.x is the installed package; verl 0.6.1's config files come from its released wheel on PyPI
(``pip download verl==0.6.1 --no-deps``), unpacked once into ``<repo>/.cache/verl/0.6.1``.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from bench.engines.verl import config as vc
from bench.engines.verl.overrides import fill_run_dir, overrides_of
from bench.spec.loading import load_matrix
from bench.spec.plan import make_plan

VERSIONS = [None, "0.6.1"]  # None = the installed verl (0.9.x)
ENV = {"QWEN3VL_MODEL_PATH": "/models/Qwen3-VL-8B-Instruct", "QWEN3VL_TRAIN_FILES": "/data/geo3k/train.parquet",
       "QWEN3VL_VAL_FILES": "/data/geo3k/test.parquet"}


def _full_as_verl():
    """matrix/full.yaml (all seven factors, full factorial) on the verl engine."""
    m = load_matrix("matrix/full.yaml")
    base = m.base.model_copy(update={"model": "/models/qwen3vl", "data": "/data/train.parquet"})
    return m.model_copy(update={"engine": "verl", "base": base})


def _cells(monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    out = []
    full = _full_as_verl()
    a2 = load_matrix("matrix/qwen3vl8b_a2.yaml")
    for name, matrix in (("full", full), ("qwen3vl8b_a2", a2)):
        for platform in ("npu", "cuda"):
            plan = make_plan(matrix, platform, strict=True)
            out += [(f"{name}/{platform}/{r.label}", fill_run_dir(overrides_of(r.launch.argv))) for r in plan.runs]
    return out


@pytest.mark.parametrize("version", VERSIONS, ids=["installed", "0.6.1"])
def test_every_emitted_override_composes(version, monkeypatch):
    cells = _cells(monkeypatch)
    assert len(cells) > 100  # full: 80 npu + 16 cuda runs; a2: 9 npu + cuda runs
    for label, overrides in cells:
        assert overrides[0] == "algorithm.adv_estimator=grpo"
        try:
            vc.check_overrides(overrides, version)
        except vc.VerlConfigError as exc:  # pragma: no cover - the failure message is the point
            pytest.fail(f"{label}: {exc}")


@pytest.mark.parametrize("version", VERSIONS, ids=["installed", "0.6.1"])
def test_fast_check_equals_hydra_compose(version, monkeypatch):
    """The fast path builds the very config Hydra's compose builds (one all-on NPU cell, one CUDA cell)."""
    cells = dict(_cells(monkeypatch))
    for label in ("qwen3vl8b_a2/npu/all-off", "full/cuda/rmsnorm_fused+dynamic_bsz+forward_prefetch+graph_mode"):
        overrides = cells[label]
        fast = OmegaConf.to_container(vc.fast_compose(overrides, version))
        full = vc.compose(overrides, version)
        assert fast == OmegaConf.to_container(full), label
    cfg = vc.compose(cells["qwen3vl8b_a2/npu/dynamic_bsz"], version)
    assert cfg.actor_rollout_ref.actor.use_dynamic_bsz is True
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 2 * (1024 + 2048)
    assert cfg.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == 4 * (1024 + 2048)
    assert cfg.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == 4 * (1024 + 2048)
    assert cfg.global_profiler.tool == "npu" and list(cfg.global_profiler.steps) == [6]
    assert cfg.global_profiler.save_path == "/tmp/bench-run/profile"
    npu = cfg.actor_rollout_ref.ref.profiler.tool_config.npu
    assert (list(npu.contents), npu.level, npu.analysis) == (["npu", "cpu"], "level1", True)
    assert list(cfg.trainer.logger) == ["console", "file"]


@pytest.mark.parametrize("version", VERSIONS, ids=["installed", "0.6.1"])
@pytest.mark.parametrize(
    "bad, words",
    [
        ("actor_rollout_ref.actor.no_such_key=1", "Could not override 'actor_rollout_ref.actor.no_such_key'"),
        ("actor_rollout_ref.rollout.enforce_eager=flase", "expects true/false"),
        ("data.train_batch_size=1.5", "expects an integer"),
        ("trainer.logger=[console,file", "malformed"),
        ("actor_rollout_ref.model.path=/a,b", "refuses"),  # an unquoted comma is a Hydra sweep
    ],
)
def test_unknown_or_bad_override_fails(version, bad, words):
    with pytest.raises(vc.VerlConfigError) as err:
        vc.check_overrides(["algorithm.adv_estimator=grpo", bad], version)
    assert words in str(err.value)
    assert ("verl 0.6.1" in str(err.value)) == (version == "0.6.1")


def test_release_config_is_cached_in_repo():
    pkg = vc.verl_package_dir("0.6.1")
    assert pkg == vc.DEFAULT_CACHE / "0.6.1" / "verl"
    assert pkg.is_relative_to(vc.REPO_ROOT / ".cache")
    assert (pkg / "version" / "version").read_text().strip() == "0.6.1"
    assert "verl-0.6.1" in (pkg.parent / "SOURCE").read_text()
    assert vc.config_dir("0.6.1") == pkg / "trainer" / "config"  # second call: no download (cache hit)
    assert vc.config_dir() == vc.installed_verl_dir() / "trainer" / "config"


def test_fsdp2_forward_prefetch_evidence_per_release():
    """verl 0.6.1's FSDP2 wrapper ignores forward_prefetch; the installed 0.9.x honours it (PR 6317)."""
    from bench.engines.verl.notes import fsdp2_honours_forward_prefetch

    assert fsdp2_honours_forward_prefetch(vc.read_release_file("utils/fsdp_utils.py", "0.6.1")) is False
    assert fsdp2_honours_forward_prefetch(vc.read_release_file("utils/fsdp_utils.py")) is True
    assert fsdp2_honours_forward_prefetch(None) is None


@pytest.mark.parametrize("raw", ["/data/plain.parquet", "/data/with space/x.parquet", "/d/a,b'c${HOME}.parquet"])
def test_hydra_value_round_trips_paths(raw):
    cfg = vc.fast_compose([f"actor_rollout_ref.model.path={vc.hydra_value(raw)}"])
    assert cfg.actor_rollout_ref.model.path == raw


def test_version_helpers():
    assert vc.version_at_least("0.11.0", "0.10.0") and vc.version_at_least("0.10.0rc1", "0.10.0")
    assert not vc.version_at_least("0.9.2rc1", "0.10.0") and not vc.version_at_least(None, "0.1")
    with pytest.raises(vc.VerlConfigError):
        vc.config_dir("../0.6.1")


def test_cpu_cell_profiles_the_rollout():
    """verl:cpu (0.9.x only) also profiles the rollout role: vLLM's engine in discrete mode, CPU activity,
    its traces relocated into the profile folder; the actor and ref keep their continuous traces."""
    plan = make_plan(load_matrix("matrix/verl_cpu_vl.yaml"), "cpu", strict=False)
    overrides = fill_run_dir(overrides_of(plan.runs[0].launch.argv))
    vc.check_overrides(overrides)
    cfg = vc.compose(overrides)
    rollout = cfg.actor_rollout_ref.rollout.profiler
    assert (rollout.enable, rollout.all_ranks, rollout.relocate_results) == (True, True, True)
    assert rollout.tool == "torch" and rollout.save_path == "/tmp/bench-run/profile"
    assert rollout.tool_config.torch.discrete is True and list(rollout.tool_config.torch.contents) == ["cpu"]
    actor = cfg.actor_rollout_ref.actor.profiler
    assert actor.tool_config.torch.discrete is False and actor.relocate_results is False
