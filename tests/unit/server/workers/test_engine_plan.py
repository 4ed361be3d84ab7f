"""How many engines a server runs and each one's settings: ``--engines``, ``--devices``, the CPU's cores."""

from __future__ import annotations

import pytest

import server.workers.engine_plan as engine_plan
from server.settings import Settings
from server.workers.default_count import DeviceProbeError
from server.workers.engine_plan import engine_plans, num_engines, visible_gpus


def settings(**values: object) -> Settings:
    return Settings(preset="tiny", **values)


@pytest.fixture
def cpus(monkeypatch: pytest.MonkeyPatch):
    """``cpus(n)``: the plan sees ``n`` usable CPUs (affinity and cgroup quota are read by ``usable_cpus``)."""
    def set_cpus(count: int) -> None:
        monkeypatch.setattr(engine_plan, "usable_cpus", lambda: count)
    return set_cpus


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    """``gpus(n)``: the child-process probe answers ``n`` GPUs, and counts how often it was asked."""
    asked: list[int] = []

    def set_gpus(count: int) -> list[int]:
        def probe() -> int:
            asked.append(count)
            return count
        monkeypatch.setattr(engine_plan, "visible_gpus", probe)
        return asked
    return set_gpus


@pytest.mark.parametrize(("values", "expected"), [
    ({}, 1),
    ({"engines": 3}, 3),
    ({"engines": 1, "device": "cuda"}, 1),
    ({"devices": ["cuda:0", "cuda:1"]}, 2),
    ({"devices": "cuda:0,cuda:2,cuda:5"}, 3),   # the flag's or the environment's form
    ({"devices": ["cpu"], "engines": 1}, 1),      # an --engines beside them must agree (tests/unit/server/test_settings_error.py)
    ({"engines": "auto", "device": "cpu"}, 1),   # one on the CPU: no probe
])
def test_the_count_follows_engines_or_the_devices_listed(values, expected, gpus):
    asked = gpus(8)
    assert num_engines(settings(**values)) == expected
    assert asked == []  # only --engines auto off the CPU asks torch


@pytest.mark.parametrize(("visible", "expected"), [(4, 4), (1, 1), (0, 1)])
def test_engines_auto_on_cuda_is_one_per_visible_gpu_and_at_least_one(visible, expected, gpus):
    asked = gpus(visible)
    assert num_engines(settings(engines="auto", device="cuda")) == expected
    assert asked == [visible]


def test_the_probe_asks_torch_in_a_child_process():
    """This machine's torch in a child: a count (0 without a GPU), the same as torch here says."""
    import torch

    assert visible_gpus() == torch.cuda.device_count()


def test_a_probe_that_fails_names_the_flags_to_pass(monkeypatch):
    monkeypatch.setattr(engine_plan, "GPU_COUNT_PROBE", "raise SystemExit(3)")
    with pytest.raises(DeviceProbeError, match="--engines N or --devices"):
        visible_gpus()
    monkeypatch.setattr(engine_plan, "GPU_COUNT_PROBE", "print('no number')")
    with pytest.raises(DeviceProbeError):
        visible_gpus()


@pytest.mark.parametrize(("num_cpus", "count", "threads"), [(8, 2, 4), (2, 2, 1), (3, 2, 1), (1, 4, 1), (16, 3, 5)])
def test_cpu_engines_divide_the_cores_among_them(num_cpus, count, threads, cpus):
    cpus(num_cpus)
    plans = engine_plans(settings(engines=count, device="cpu"))
    assert [plan.index for plan in plans] == list(range(count))
    assert [plan.settings.compute_threads for plan in plans] == [threads] * count
    assert all(plan.settings.engines == count and plan.settings.devices is None for plan in plans)
    assert all(plan.settings.device == "cpu" and plan.environment == {} for plan in plans)


def test_compute_threads_set_are_each_engines_and_one_engine_keeps_the_default(cpus):
    cpus(8)
    assert [plan.settings.compute_threads for plan in engine_plans(settings(engines=2, device="cpu",
                                                                             compute_threads=3))] == [3, 3]
    (alone,) = engine_plans(settings(engines=1, device="cpu"))
    assert alone.settings.compute_threads is None  # one engine: the runtime's own default, as before
    assert alone.environment == {}


def test_an_unresolved_device_auto_divides_the_cores_as_the_cpu_does(cpus):
    cpus(4)
    plans = engine_plans(settings(engines=2))  # device auto
    assert [plan.settings.compute_threads for plan in plans] == [2, 2]


def test_each_listed_gpu_is_the_only_one_its_engine_sees(cpus):
    cpus(8)
    plans = engine_plans(settings(devices="cuda:0,cuda:3"))
    assert [plan.environment for plan in plans] == [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "3"}]
    assert all(plan.settings.device == "cuda" for plan in plans)  # device 0 of what it sees
    assert all(plan.settings.compute_threads is None for plan in plans)  # the cores are not divided for a GPU
    assert all(plan.settings.engines == 2 and plan.settings.devices is None for plan in plans)


def test_a_cpu_listed_beside_a_gpu_gets_the_cores_share_and_no_gpu(cpus):
    cpus(8)
    cpu_plan, gpu_plan = engine_plans(settings(devices=["cpu", "cuda:1"]))
    assert cpu_plan.settings.device == "cpu" and cpu_plan.environment == {}
    assert cpu_plan.settings.compute_threads == 4
    assert gpu_plan.settings.device == "cuda" and gpu_plan.environment == {"CUDA_VISIBLE_DEVICES": "1"}
    assert gpu_plan.settings.compute_threads is None


def test_engines_auto_on_cuda_gives_each_engine_its_own_gpu(cpus, gpus):
    cpus(8)
    gpus(3)
    plans = engine_plans(settings(engines="auto", device="cuda"))
    assert [plan.environment for plan in plans] == [{"CUDA_VISIBLE_DEVICES": str(index)} for index in range(3)]
    assert all(plan.settings.engines == 3 and plan.settings.compute_threads is None for plan in plans)


def test_several_engines_on_one_named_cuda_device_share_it(cpus):
    """``--device cuda --engines 2``: both on the GPU the process sees, neither told to hide the other."""
    cpus(8)
    plans = engine_plans(settings(engines=2, device="cuda"))
    assert [plan.environment for plan in plans] == [{}, {}]
    assert all(plan.settings.device == "cuda" and plan.settings.compute_threads is None for plan in plans)


def test_a_count_given_is_planned_without_asking_again(gpus, cpus):
    cpus(4)
    asked = gpus(2)
    plans = engine_plans(settings(engines="auto", device="cuda"), count=2)
    assert len(plans) == 2 and asked == []


@pytest.mark.parametrize(("values", "field"), [
    ({"engines": 0}, "engines"), ({"engines": 65}, "engines"),
    ({"devices": "cuda:x"}, "devices"), ({"devices": "gpu0"}, "devices"), ({"devices": ","}, "devices"),
])
def test_bad_counts_and_devices_are_refused_naming_the_field(values, field):
    with pytest.raises(ValueError, match=field):
        settings(**values)
