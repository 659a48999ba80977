"""Two local processes as one `jax.distributed` job train with ZeRO-1 Adam.

`examples/multi_process.py` runs twice, as processes 0 and 1 of one job
(coordinator on 127.0.0.1 at a free port, 4 simulated CPU devices each, gloo
collectives), and once alone with 8 devices, all three at the same time. Both
processes of the job end with the same parameters, and those are the
one-process run's. Every process is killed if the test fails or runs past its
time.
"""

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "multi_process.py"
TIMEOUT = 120  # seconds for all three processes together; they take about 30


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_processes_train_like_one(tmp_path):
    base = dict(os.environ, JAX_PLATFORMS="cpu")
    base.pop("XLA_FLAGS", None)  # the script sets the device count itself
    base["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    port = free_port()
    command = [sys.executable, str(EXAMPLE), "--steps", "10"]
    runs = {
        "process 0": (
            ["--local-devices", "4", "--save", str(tmp_path / "job.npz")],
            {"EQOPT_NUM_PROCESSES": "2", "EQOPT_PROCESS_ID": "0"},
        ),
        "process 1": (
            ["--local-devices", "4"],
            {"EQOPT_NUM_PROCESSES": "2", "EQOPT_PROCESS_ID": "1"},
        ),
        "alone": (["--save", str(tmp_path / "alone.npz")], {}),
    }
    processes = {}
    outputs = {}
    start = time.monotonic()
    try:
        for name, (arguments, env) in runs.items():
            env = dict(base, EQOPT_COORDINATOR=f"127.0.0.1:{port}", **env)
            processes[name] = subprocess.Popen(
                command + arguments,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=tmp_path,
            )
        for name, process in processes.items():
            left = max(1.0, TIMEOUT - (time.monotonic() - start))
            outputs[name] = process.communicate(timeout=left)[0]
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    print(f"three processes in {time.monotonic() - start:.1f} s")
    for name, output in outputs.items():
        print(f"--- {name} ---\n{output}")
        assert processes[name].returncode == 0, output[-3000:]
        assert "params still replicated: True" in output, output

    job = [outputs["process 0"], outputs["process 1"]]
    assert "process 0 of 2: 4 local devices, 8 in the job" in job[0], job[0]
    assert "process 1 of 2: 4 local devices, 8 in the job" in job[1], job[1]
    # Adam's state is split: each device holds an eighth of each weight's moment.
    for output in job:
        assert "(64, 32): P('data', None), (8, 32) on each device" in output, output

    def losses(output):
        return [float(v) for v in re.findall(r"loss (\S+)", output)]

    assert losses(job[0]) == losses(job[1]) and len(losses(job[0])) >= 4
    np.testing.assert_allclose(losses(job[0]), losses(outputs["alone"]), rtol=1e-6)
    with np.load(tmp_path / "job.npz") as a, np.load(tmp_path / "alone.npz") as b:
        assert len(a.files) == len(b.files) == 6
        worst = 0.0
        for key in a.files:
            difference = np.max(np.abs(a[key] - b[key])) / np.max(np.abs(b[key]))
            assert difference <= 1e-6, key
            worst = max(worst, float(difference))
    print(f"two processes against one: max relative difference {worst:.1e}")
