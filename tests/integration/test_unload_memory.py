"""Memory comes back after unload (issue 39): distinct ONNX models (weights
of their own) and Python models loaded, used and unloaded three times over
the repository API. After every unload the server's open fds and its
processes (the Python zygote and workers) are back to what they were before
the first load, and its RSS is within a generous bound of what the first
unload left (ONNX Runtime's code and arenas stay mapped once loaded). The
exact figures at 100 + 10 models: bench/bench_unload_memory.py,
docs/performance.md."""
import os
import sys

from conftest import BUILD, ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_unload_memory as bench  # noqa: E402

SANITIZE = bool(os.environ.get("NEREID_SANITIZE"))


def test_load_unload_cycles_give_back_memory_fds_and_processes():
    rows = bench.run(BUILD, n_onnx=6 if SANITIZE else 16, n_python=2 if SANITIZE else 3,
                     cycles=3, report=lambda *row: None)
    before = rows[0]
    assert before[3] == 0, rows  # no worker before any Python model
    unloaded = [r for r in rows if r[0].endswith("unloaded")]
    loaded = [r for r in rows if r[0].endswith("loaded") and r not in unloaded]
    assert len(unloaded) == 3 and all(r[3] > 0 for r in loaded), rows
    for label, _, fds, procs in unloaded:
        assert fds == before[2], (label, rows)
        assert procs == before[3], (label, rows)
    if not SANITIZE:  # ASan's allocator keeps freed memory in quarantine
        bound = unloaded[0][1] + 48 * bench.MIB
        for label, rss, _, _ in unloaded[1:]:
            assert rss <= bound, (label, [(r[0], r[1] / bench.MIB) for r in rows])
