"""What `webhook-ingest run` starts by default, and how `auto` counts cores."""

from hypothesis import given
from hypothesis import strategies as st

from webhook_ingest.cli import layout


def test_several_ingress_processes_share_the_port_and_one_does_not_ask_to():
    two = layout.ingress_commands("0.0.0.0", 8080, 2)
    assert list(two) == ["ingress-1", "ingress-2"]
    assert all(argv == ["ingress", "--host", "0.0.0.0", "--port", "8080", "--reuse-port"] for argv in two.values())
    assert layout.ingress_commands("127.0.0.1", 8080, 1) == {
        "ingress-1": ["ingress", "--host", "127.0.0.1", "--port", "8080"]
    }


def test_workers_get_the_concurrency_and_consecutive_metrics_ports():
    commands = layout.worker_commands(2, 64, 9100)
    assert commands == {
        "worker-1": ["worker", "--concurrency", "64", "--metrics-port", "9100"],
        "worker-2": ["worker", "--concurrency", "64", "--metrics-port", "9101"],
    }
    assert layout.worker_commands(1, 8, None) == {"worker-1": ["worker", "--concurrency", "8"]}


def test_auto_is_one_ingress_process_per_core_up_to_the_cap(monkeypatch):
    for cores, expected in ((1, 1), (2, 2), (16, layout.MAX_AUTO_INGRESS_PROCESSES)):
        monkeypatch.setattr(layout, "available_cores", lambda cores=cores: cores)
        assert layout.ingress_processes("auto") == expected
    assert layout.ingress_processes("3") == 3


@given(st.integers(1, 10**7), st.integers(1, 10**6))
def test_a_container_cpu_limit_is_whole_cores_at_least_one(quota, period):
    import tempfile

    with tempfile.NamedTemporaryFile("w") as cpu_max:
        cpu_max.write(f"{quota} {period}\n")
        cpu_max.flush()
        cores = layout._cgroup_cpu_limit(cpu_max.name)
    assert cores >= 1 and cores - 1 < max(1, quota / period) <= cores


def test_no_cpu_limit_means_no_cap(tmp_path):
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert layout._cgroup_cpu_limit(str(tmp_path / "cpu.max")) is None
    assert layout._cgroup_cpu_limit(str(tmp_path / "missing")) is None
