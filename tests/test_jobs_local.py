"""The local job backend: real subprocesses in the trainer/control environments, horovodrun
(MPI tensor operations by default) for several ranks, failure with the log tail, time limit,
interruption, a killed caller."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from chexflow.envs import trainer_python, with_chexflow_importable
from chexflow.jobs import JobFailed, JobSpec, JobTimeout, run_job
from chexflow.jobs.local import LocalBackend, local_argv


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that is not ours counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.trainer
def test_two_horovod_ranks_run_under_horovodrun(tmp_path):
    code = ("import horovod.tensorflow as hvd; hvd.init(); "
            "print(f'rank={hvd.rank()} size={hvd.size()}', flush=True)")
    spec = JobSpec(name="hvd-ranks", command=["python", "-c", code], workers=2, horovod=True,
                   env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    # the local launch's default allreduce: MPI tensor operations, yielding while idle
    argv = local_argv(spec)
    flags = argv.index("-np")  # after horovodrun (chexflow.jobs.horovodrun)
    assert argv[flags:flags + 5] == ["-np", "2", "-H", "localhost:2", "--mpi"]
    out = io.StringIO()
    result = LocalBackend(stream=out, log_dir=tmp_path).run(spec)
    text = out.getvalue()
    assert text.startswith(
        "[hvd-ranks] $ HOROVOD_CPU_OPERATIONS=MPI OMPI_MCA_mpi_yield_when_idle=1 ")
    assert "rank=0 size=2" in text and "rank=1 size=2" in text
    assert all(line.startswith("[hvd-ranks] ") for line in text.splitlines() if line)
    assert "rank=1 size=2" in (tmp_path / "hvd-ranks.log").read_text()
    assert result.succeeded and result.backend == "local"


@pytest.mark.trainer
def test_quick_horovodrun_answers_the_build_checks_as_horovod_does():
    """chexflow.jobs.horovodrun reads whether Horovod has MPI and gloo from the library's own
    C functions, without importing TensorFlow: the answers of Horovod's checks (which do)."""
    env = with_chexflow_importable({**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})

    def answers(code: str) -> str:
        proc = subprocess.run([str(trainer_python()), "-c", code], capture_output=True,
                              text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.split()[-1]

    horovods = answers("from horovod.common.util import gloo_built, mpi_built; "
                       "print(f'{bool(mpi_built())},{bool(gloo_built())}')")
    ours = answers("from chexflow.jobs.horovodrun import built; print(*built(), sep=',')")
    assert ours == horovods == "True,True"  # the project's build: images/install-trainer.sh


def test_failure_raises_with_exit_status_and_log_tail():
    code = "import sys; print('loading shard 3'); sys.exit('ValueError: shard 3 is corrupt')"
    spec = JobSpec(name="fails", environment="control", command=["python", "-c", code])
    with pytest.raises(JobFailed) as err:
        run_job(spec, stream=io.StringIO())
    assert err.value.exit_code == 1
    assert "job fails: exited with status 1" in str(err.value)
    assert "ValueError: shard 3 is corrupt" in err.value.log_tail


def test_timeout_ends_the_process_group_and_says_so(tmp_path):
    pid_file = tmp_path / "child.pid"
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print("started", flush=True)
        time.sleep(60)
    """)
    spec = JobSpec(name="slow", environment="control", command=["python", "-c", code],
                   timeout_seconds=3)
    # the job would sleep 60 s, and its child too: JobTimeout is the 3 s limit enforced
    with pytest.raises(JobTimeout, match=r"job slow: timed out after \d+s \(limit 3s\)"):
        run_job(spec, stream=io.StringIO())
    time.sleep(0.5)
    assert not alive(int(pid_file.read_text()))  # the grandchild went with the group


def test_interruption_ends_the_job(tmp_path):
    """Ctrl-C on the caller (SIGINT) ends the job's processes and the caller reports it."""
    pid_file = tmp_path / "job.pid"
    script = textwrap.dedent(f"""
        from chexflow.jobs import JobSpec, run_job
        code = "import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); " \\
               "time.sleep(120)"
        try:
            run_job(JobSpec(name="long", environment="control", command=["python", "-c", code]))
        except KeyboardInterrupt:
            print("caller: interrupted", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert "caller: interrupted" in out
    time.sleep(0.5)
    assert not alive(int(pid_file.read_text()))


@pytest.mark.trainer
def test_a_killed_caller_leaves_no_horovod_rank_running(tmp_path):
    """SIGKILL on the caller of a 2-rank job: under the default `horovodrun --mpi` (a shell
    running mpirun) the reaper still ends mpirun and both ranks."""
    folder = str(tmp_path)
    code = (f"import os, time; open(os.path.join({folder!r}, f'{{os.getpid()}}.pid'), 'w')"
            ".close(); time.sleep(120)")
    script = textwrap.dedent(f"""
        from chexflow.jobs import JobSpec, run_job
        run_job(JobSpec(name="ranks", command=["python", "-c", {code!r}], workers=2,
                        horovod=True))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    ranks = [int(p.stem) for p in tmp_path.glob("*.pid")]
    try:
        assert len(ranks) == 2, ranks
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30
        while any(alive(r) for r in ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(r) for r in ranks), ranks
    finally:
        for pid in ranks:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
