"""A benchmark stopped on its own (``kill PID``) stops the train jobs it is waiting for."""

import os
import signal
import subprocess
import sys
import textwrap
import time


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_to_the_benchmark_stops_its_running_jobs(tmp_path):
    """Two jobs waited for in pool threads, as bench quality runs its rows; SIGTERM to the benchmark's process
    alone: both jobs end, the third, queued, never starts, and the benchmark exits 143 and says so."""
    job = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
    script = textwrap.dedent(f"""
        import os, sys
        from concurrent.futures import ThreadPoolExecutor
        from benchmarks import runner

        def one(i):
            runner._run_job([sys.executable, "-c", {job!r}, rf"{tmp_path}/job{{i}}"], 300, dict(os.environ))

        with runner.stop_jobs_with_me(), ThreadPoolExecutor(2) as pool:
            list(pool.map(one, range(3)))
    """)
    bench = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    pids = tmp_path / "job0", tmp_path / "job1"
    deadline = time.monotonic() + 60
    while not all(p.exists() and p.read_text() for p in pids):
        if time.monotonic() > deadline or bench.poll() is not None:
            bench.kill()
            raise AssertionError(f"the jobs did not start: {bench.communicate()[1]}")
        time.sleep(0.05)
    jobs = [int(p.read_text()) for p in pids]
    bench.send_signal(signal.SIGTERM)
    _, err = bench.communicate(timeout=60)
    try:
        assert bench.returncode == 128 + signal.SIGTERM, err
        assert "stopped its 2 running train job(s) too" in err
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in jobs) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in jobs)
        assert not (tmp_path / "job2").exists()
    finally:
        for pid in jobs:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
