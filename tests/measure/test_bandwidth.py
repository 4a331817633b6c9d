import pytest
from click.testing import CliRunner

from specrt.cli import main
from specrt.errors import ConfigError
from specrt.measure import bandwidth as bw

MiB = 2**20


def test_probe_arithmetic_by_hand(tmp_path):
    assert bw.gbps(2 * 10**9, 0.5) == 4.0
    with pytest.raises(ValueError):
        bw.gbps(1, 0)
    assert bw.probe_bytes(None, None) == 512 * MiB
    assert bw.probe_bytes(256 * MiB, None) == 1024 * MiB  # 4x a large last-level cache
    assert bw.probe_bytes(32 * MiB, 1024 * MiB) == 256 * MiB  # a quarter of free memory at most
    assert bw.probe_bytes(32 * MiB, None, requested=8 * MiB) == 8 * MiB
    with pytest.raises(ConfigError, match="at least"):
        bw.probe_bytes(None, None, requested=1000)
    assert [bw.parse_cache_size(x) for x in ("32768K", "1M", "512\n")] == [32 * MiB, MiB, 512]
    for i, size in enumerate(("48K", "2048K", "36864K")):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    assert bw.last_level_cache_bytes(tmp_path) == 36 * MiB
    assert bw.last_level_cache_bytes(tmp_path / "missing") is None
    (tmp_path / "meminfo").write_text("MemTotal:       32000000 kB\nMemAvailable:   20000000 kB\n")
    assert bw.available_memory(tmp_path / "meminfo") == 20000000 * 1024  # the runtime's reader
    assert bw.available_memory(tmp_path / "missing") is None
    with pytest.raises(ConfigError):
        bw.Bandwidth("given", 0.0)


def test_host_probe_on_a_tiny_array():
    r = bw.host_bandwidth(4 * MiB, repeats=2, threads=2)
    assert r.array_bytes == 4 * MiB and r.repeats == 2 and r.device == "host, 2 threads"
    # Any machine that runs the tests reads between ~100 MB/s and 10 TB/s (a cache-resident 4 MiB is fast).
    assert 0.1 < r.read_gbps < 10_000 and 0.1 < r.copy_gbps < 10_000


def test_gpu_probe_on_cuda():
    torch = pytest.importorskip("torch", reason="the GPU probe needs torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: the GPU probe is checked on machines with one")
    r = bw.cuda_bandwidth(256 * MiB, repeats=2)
    assert r.device.startswith("cuda:0") and 20 < r.read_gbps < 20_000 and 20 < r.copy_gbps < 20_000


def test_gpu_probe_without_cuda_says_why(monkeypatch):
    torch = pytest.importorskip("torch", reason="the GPU probe needs torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(bw.ProbeUnavailable, match="CUDA device"):
        bw.cuda_bandwidth()
    assert bw.on_gpu("CUDAExecutionProvider") and not bw.on_gpu("CPUExecutionProvider")


def test_doctor_bandwidth(monkeypatch):
    import specrt.check.doctor

    monkeypatch.setattr(bw, "cuda_bandwidth", lambda *a: (_ for _ in ()).throw(bw.ProbeUnavailable("no GPU here")))
    monkeypatch.setattr(specrt.check.doctor, "diagnose", lambda: specrt.check.doctor.Report("3", {}, []))
    res = CliRunner().invoke(main, ["doctor", "--bandwidth", "--bandwidth-mb", "4"])
    assert res.exit_code == 0, res.output
    assert "bandwidth     host" in res.output and "4 MiB" in res.output and "GPU: skipped, no GPU here" in res.output
    bad = CliRunner().invoke(main, ["doctor", "--bandwidth-mb", "4"])
    assert bad.exit_code == 2 and "--bandwidth-mb needs --bandwidth" in bad.output
