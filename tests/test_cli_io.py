"""The CLI's output files, input files, Ctrl-C, strict options and defaults (issue 12 A, B, E; issue 19 help texts).

Bad input goes through the real ``specdec`` CLI in a subprocess: exit code 2 (130 for Ctrl-C), exactly one
``error: ...`` line on stderr, no traceback, no output file and no stray temporary file. ``--model`` points at
a missing path in the output-path cases, so the output check is seen to come before any model work.
``python tests/test_cli_io.py`` prints the table of cases and their messages (docs/guarantees.md).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from test_validation import save_tiny_dir

# (id, what is wrong, arguments, substring the one error line must contain); ``{x}`` names a file of ``files``.
GEN = ["generate", "--prompt-file", "{prompt}", "--max-new-tokens", "2", "--model", "{model}", "--device", "cpu"]
NOMODEL = ["--model", "{nowhere}/model"]  # the error must be the output path's, not "no such model"
CASES = [
    # A. output files, each checked before any model work
    ("out-fifo", "--output-json is a FIFO", [*GEN, *NOMODEL, "--output-json", "{fifo}"], "is a FIFO"),
    ("out-symlink", "--output-json is a symbolic link", [*GEN, *NOMODEL, "--output-json", "{link}"], "symbolic link"),
    ("out-dir", "--output-json is an existing directory", [*GEN, *NOMODEL, "--output-json", "{root}"], "is a directory"),
    ("out-parent-file", "--output-json's parent is a file", [*GEN, *NOMODEL, "--output-json", "{prompt}/o.json"],
     "is a file, not a directory"),
    ("out-readonly-dir", "--output-json in a read-only directory", [*GEN, *NOMODEL, "--output-json", "{rodir}/o.json"],
     "not writable"),
    ("bench-out-file", "bench --output-dir is a file",
     ["bench", *NOMODEL, "--device", "cpu", "--output-dir", "{prompt}"], "not a directory"),
    ("tune-out-file", "tune --output-dir is a file",
     ["tune", *NOMODEL, "--device", "cpu", "--output-dir", "{prompt}"], "not a directory"),
    ("srh-out-parent", "profile-srh --output's parent is a file",
     ["profile-srh", *NOMODEL, "--device", "cpu", "--output", "{prompt}/srh.json"], "is a file, not a directory"),
    ("fidelity-out-dir", "fidelity --output-json is a directory",
     ["fidelity", *NOMODEL, "--device", "cpu", "--output-json", "{root}"], "is a directory"),
    ("fidelity-same", "fidelity --output-json and --output-md the same file",
     ["fidelity", *NOMODEL, "--device", "cpu", "--output-json", "{out}", "--output-md", "{out}"], "name the same file"),
    # B. bad input
    ("oom", "a batch that cannot fit in memory", [*GEN, "--output-json", "{out}", "--batch-size", "1000000000"],
     "out of memory: batch 1000000000 × context 12"),
    ("seed-big", "a seed out of range", [*GEN, "--output-json", "{out}", "--temperature", "1", "--seed",
                                         "100000000000000000000000"], "--seed must be less than or equal to 18446744073709551615 (got 1000"),
    ("config-latin1", "a --config file that is not UTF-8", [*GEN, "--output-json", "{out}", "--config", "{cfg_latin1}"],
     "not valid utf-8"),
    ("demo-methods", "demo --methods ,", ["demo", "--methods", ",", *NOMODEL], "names no method"),
    ("bench-methods", "bench --methods ,", ["bench", "--methods", ",", *NOMODEL, "--output-dir", "{root}/b"],
     "names no method"),
    ("temperature-inf", "--temperature inf", [*GEN, "--output-json", "{out}", "--temperature", "inf"],
     "--temperature must be a finite number"),
    ("top-p-nan", "--top-p nan", [*GEN, "--output-json", "{out}", "--top-p", "nan"], "--top-p must be a finite number"),
    ("config-nan", "a NaN in --config", [*GEN, "--output-json", "{out}", "--config", "{cfg_nan}"], "finite number"),
    ("tune-sparsities-inf", "tune --sparsities with inf",
     ["tune", *NOMODEL, "--device", "cpu", "--output-dir", "{root}/t", "--sparsities", "0.1,inf"], "finite numbers"),
    ("prompt-fifo", "--prompt-file is a FIFO (would block)", [*GEN, "--output-json", "{out}", "--prompt-file", "{fifo}"],
     "is a FIFO"),
    ("prompt-nul", "--prompt-file with NUL bytes", [*GEN, "--output-json", "{out}", "--prompt-file", "{nul}"],
     "NUL byte"),
    ("prompt-latin1", "--prompt-file not UTF-8", [*GEN, "--output-json", "{out}", "--prompt-file", "{latin1}"],
     "--encoding latin-1"),
    ("encoding-unknown", "unknown --encoding", [*GEN, "--output-json", "{out}", "--encoding", "nope"],
     "unknown encoding"),
    ("demo-context-0", "demo --context-tokens 0", ["demo", "--context-tokens", "0"], "'--context-tokens'"),
    ("config-sampling", "a 'sampling' section in --config", [*GEN, "--output-json", "{out}", "--config", "{cfg_sampling}"],
     "'sampling' section"),
    ("config-bool", "a boolean as a number in --config", [*GEN, "--output-json", "{out}", "--config", "{cfg_bool}"],
     "not a boolean"),
    ("sinks-context", "sinks + recent beyond the context", [*GEN, "--output-json", "{out}", "--config", "{cfg_sinks}"],
     "exceed the context"),
    ("sinks-budget", "sinks + recent beyond the budget", [*GEN, "--output-json", "{out}", "--config", "{cfg_sinks_b}"],
     "exceed the budget"),
    ("threads-0", "--threads 0", ["--threads", "0", *GEN, "--output-json", "{out}"], "'--threads'"),
]


def make_files(root: Path) -> dict[str, str]:
    f = {"root": str(root), "nowhere": str(root / "nowhere"), "out": str(root / "sub" / "o.json")}
    f["model"] = str(save_tiny_dir(root / "tiny", max_position_embeddings=4096))
    (root / "prompt.txt").write_text(" ".join(f"w{i % 90 + 1}" for i in range(12)))
    f["prompt"] = str(root / "prompt.txt")
    os.mkfifo(root / "fifo")
    f["fifo"] = str(root / "fifo")
    (root / "target.json").write_text("{}")
    os.symlink(root / "target.json", root / "link.json")
    f["link"] = str(root / "link.json")
    (root / "ro").mkdir()
    os.chmod(root / "ro", 0o555)
    f["rodir"] = str(root / "ro")
    (root / "nul.txt").write_bytes(b"w1 w2\x00w3")
    f["nul"] = str(root / "nul.txt")
    (root / "latin1.txt").write_bytes("w1 w2 café w3".encode("latin-1"))
    f["latin1"] = str(root / "latin1.txt")
    (root / "cfg_latin1.json").write_bytes('{"method": "magicdec", "x": "café"}'.encode("latin-1"))
    cfgs = {"cfg_nan": '{"budget_ratio": NaN}', "cfg_sampling": '{"sampling": {"temperature": 1.0}}',
            "cfg_bool": '{"gamma": true}', "cfg_sinks": '{"sinks": 100000}',
            "cfg_sinks_b": '{"budget": 10, "sinks": 8, "recent": 8}'}
    for k, t in cfgs.items():
        (root / f"{k}.json").write_text(t)
    for k in [*cfgs, "cfg_latin1"]:
        f[k] = str(root / f"{k}.json")
    return f


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return make_files(tmp_path_factory.mktemp("cliio"))


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    e["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    return e


def cli(args: list[str], files: dict[str, str] | None = None, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run ``specdec ARGS`` in a subprocess (placeholders filled from ``files``)."""
    args = [a.format(**files) for a in args] if files else args
    return subprocess.run([sys.executable, "-m", "specdec.cli", *args], capture_output=True, text=True, env=env(),
                          timeout=timeout, **kw)


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip() and "Warning" not in ln and "warn(" not in ln]


def strays(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_error_line(files, case):
    _, _, args, expect = case
    if os.geteuid() == 0 and case[0] == "out-readonly-dir":
        pytest.skip("root may write a read-only directory")
    out = Path(files["out"])
    proc = cli(args, files)
    lines = error_lines(proc.stderr)
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert expect in lines[0], lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not out.exists() and not out.parent.exists(), "nothing may be written on failure"
    assert not strays(Path(files["root"]))
    assert Path(files["link"]).is_symlink() and stat.S_ISFIFO(os.lstat(files["fifo"]).st_mode)


def test_device_target_refused_without_writing():
    """/dev/null is refused by the preflight check (checked in-process: a defect must not replace it as root)."""
    from specdec.errors import SpecdecError
    from specdec.outputs import check_output

    with pytest.raises(SpecdecError, match="is a device"):
        check_output("/dev/null", "--output-json")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_writes_are_atomic_unique_and_leave_nothing_behind(tmp_path, monkeypatch):
    from specdec.outputs import write_text

    target = tmp_path / "o.json"
    (tmp_path / "o.json.tmp").mkdir()  # the fixed temp name every writer used to share
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            for j in range(30):
                write_text(target, json.dumps({"writer": i, "j": j, "pad": "x" * 5000}))
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert json.loads(target.read_text())["j"] == 29
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.json", "o.json.tmp"]
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o666 & ~_umask()

    def broken_replace(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(KeyboardInterrupt):
        write_text(tmp_path / "p.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.json", "o.json.tmp"]


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def test_generate_writes_json_and_prompt_encoding_option(files, tmp_path):
    """A good run writes its JSON (no stray file); --encoding reads a latin-1 prompt; speed options recorded."""
    out = tmp_path / "deep" / "o.json"
    proc = cli([*GEN, "--output-json", str(out), "--prompt-file", "{latin1}", "--encoding", "latin-1"], files)
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(out.read_text())
    assert payload["speed"]["backend"] == "reference" and payload["speed"]["compile"] is False
    assert [p.name for p in out.parent.iterdir()] == ["o.json"]


def test_threads_follow_affinity_and_threads_option(files, tmp_path):
    """Without --threads the count is the CPUs this process may use; --threads overrides it."""
    out = tmp_path / "o.json"
    e = env()
    e.pop("OMP_NUM_THREADS", None)
    e.pop("MKL_NUM_THREADS", None)

    def run(*extra: str) -> int:
        args = [a.format(**files) for a in [*extra, *GEN, "--output-json", str(out)]]
        proc = subprocess.run([sys.executable, "-m", "specdec.cli", *args], capture_output=True, text=True, env=e,
                              timeout=300, preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
        assert proc.returncode == 0, proc.stderr
        return json.loads(out.read_text())["speed"]["threads"]

    assert run() == 1
    assert run("--threads", "3") == 3


def test_choose_threads(monkeypatch):
    from specdec import threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert threads.choose_threads(None) == 3
    assert threads.choose_threads(5) == 5
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.choose_threads(None) == 2


HOOK = """
import sys, time
import specdec.models as M, specdec.engine as E
phase = sys.argv.pop(1)
orig_load, orig_gen = M.SpecdecModel.from_pretrained.__func__, E.SpeculativeEngine.generate
def mark(name):
    print("PHASE " + name, file=sys.stderr, flush=True)
    time.sleep(120)
def load(cls, *a, **k):
    if phase == "load":
        mark("load")
    return orig_load(cls, *a, **k)
def gen(self, *a, **k):
    if phase == "generate":
        mark("generate")
    return orig_gen(self, *a, **k)
M.SpecdecModel.from_pretrained = classmethod(load)
E.SpeculativeEngine.generate = gen
from specdec.cli import main
sys.argv[0] = "specdec"
main()
"""


@pytest.mark.parametrize("phase", ["load", "generate"])
def test_ctrl_c_is_one_line_exit_130_and_no_file(files, tmp_path, phase):
    """SIGINT while the model loads / while generating: "interrupted", exit 130, no output file, no temp file."""
    out = tmp_path / "o.json"
    args = [a.format(**files) for a in [*GEN, "--output-json", str(out)]]
    # the child gets SIGINT's default disposition, as in a terminal: a runner that starts the suite in the
    # background (`cmd &` in a script) leaves SIGINT ignored, and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, "-c", HOOK, phase, *args], stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env(), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = proc.stderr.readline()
        while first and not first.startswith("PHASE"):
            first = proc.stderr.readline()
        assert first.strip() == f"PHASE {phase}", first
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert error_lines(err) == ["error: interrupted."], err
    assert not out.exists() and not strays(tmp_path)


def test_bench_writes_to_a_folder_in_the_current_directory(files, tmp_path):
    proc = cli(["bench", "--model", "{model}", "--device", "cpu", "--methods", "dense", "--contexts", "16",
                "--max-new-tokens", "2", "--documents", "stdlib:argparse"], files, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    written = sorted(p.name for p in (tmp_path / "bench_out").iterdir())
    assert written == ["bench.json", "bench.md"]
    assert f"wrote {Path('bench_out') / 'bench.json'} and {Path('bench_out') / 'bench.md'}" in proc.stdout


# --- CUDA defaults: device detection replaced, no GPU needed --------------------------------------
class Stop(Exception):
    pass


@pytest.fixture()
def fake_cuda(monkeypatch):
    """Pretend a CUDA GPU is there; capture what generate/bench would load instead of loading it."""
    import specdec.bench
    import specdec.cli
    import specdec.fastpath

    seen: dict = {}
    monkeypatch.setattr(specdec.fastpath, "cuda_available", lambda: True)

    def load(model, dtype, device, backend, cuda_graphs=False, compile=False, fuse=False, **_):
        seen.update(dtype=dtype, backend=backend, cuda_graphs=cuda_graphs, compile=compile, fuse=fuse)
        raise Stop

    def bench(**kw):
        seen.update({k: kw[k] for k in ("dtype", "backend", "cuda_graphs", "compile", "fuse", "warmup")})
        raise Stop

    monkeypatch.setattr(specdec.cli, "load_model", load)
    monkeypatch.setattr(specdec.bench, "run_bench", bench)
    return seen


FAST = dict(backend="triton", dtype="bfloat16", cuda_graphs=True, compile=True, fuse=True)


@pytest.mark.parametrize("extra, expect", [
    ([], FAST),
    (["--no-cuda-graphs"], {**FAST, "cuda_graphs": False}),
    (["--no-compile", "--no-fuse"], {**FAST, "compile": False, "fuse": False}),
    (["--dtype", "float32"], {**FAST, "dtype": "float32"}),
    (["--backend", "torch"], dict(backend="torch", dtype="float32", cuda_graphs=False, compile=False, fuse=False)),
    (["--device", "cpu"], dict(backend="reference", dtype="float32", cuda_graphs=False, compile=False, fuse=False)),
], ids=["fast", "no-graphs", "no-compile-fuse", "dtype", "other-backend", "cpu"])
@pytest.mark.parametrize("command", ["generate", "bench"])
def test_cuda_defaults_to_the_fast_path(fake_cuda, files, tmp_path, command, extra, expect):
    from typer.testing import CliRunner

    from specdec.cli import app

    if command == "generate":
        args = ["generate", "--prompt-file", files["prompt"], "--max-new-tokens", "2", "--output-json",
                str(tmp_path / "o.json"), *extra]
    else:
        args = ["bench", "--output-dir", str(tmp_path / "b"), *extra]
    res = CliRunner().invoke(app, args)
    assert isinstance(res.exception, Stop), (res.exception, res.stderr)
    assert {k: fake_cuda[k] for k in expect} == expect
    if command == "bench":
        assert fake_cuda["warmup"] == (expect["cuda_graphs"] or expect["compile"])


# --- issue 19: every option documented -------------------------------------------------------------
def test_every_cli_option_has_a_help_text():
    """Walk the Typer app: every command and every option (the app's own included) has a help text."""
    import typer

    from specdec.cli import app

    root = typer.main.get_command(app)
    missing = []

    def walk(cmd, path: str) -> None:  # noqa: ANN001 - a click command (typer's vendored click in typer >= 0.20)
        for p in cmd.params:
            if p.param_type_name == "option" and not (p.help or "").strip():
                missing.append(f"{path} {p.opts[0]}")
        if not (cmd.help or "").strip():
            missing.append(f"{path} (command)")
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(root, "specdec")
    assert len(getattr(root, "commands", {})) >= 7
    assert sum(len(c.params) for c in root.commands.values()) > 90  # the walk sees every option
    assert not missing, f"options without help: {', '.join(missing)}"


def markdown_table() -> str:
    """The table of docs/guarantees.md (cases above, run through the CLI)."""
    import tempfile

    f = make_files(Path(tempfile.mkdtemp(prefix="cliio")))
    rows = ["| bad input | exit | message (stderr) |", "|---|---|---|"]
    for cid, what, args, _ in CASES:
        if cid == "out-readonly-dir" and os.geteuid() == 0:
            continue  # root may write anywhere
        proc = cli(args, f)
        msg = " ".join(error_lines(proc.stderr)).replace(f["root"] + "/", "").replace(f["root"], ".")
        msg = msg.replace("python -m specdec.cli", "specdec").replace("|", "\\|")
        rows.append(f"| {what} | {proc.returncode} | `` {msg} `` |")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).parent))
    print(markdown_table())


def test_demo_picks_the_longest_context_and_reports_speedup_next_to_tau(files):
    """On the CPU the demo runs at the longest context the model allows and says whether speculation paid."""
    from specdec.demo import DOC_OFFSET, default_backend, longest_context

    assert longest_context(8192, 10**6, 48, 4) == 8192 - 48 - 5
    assert longest_context(8192, DOC_OFFSET + 1000, 48, 4) == 1000
    assert default_backend("cpu") in ("numba", "torch") and default_backend("cuda") == "triton"
    e = {**env(), "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "specdec.cli", "demo", "--model", files["model"], "--device", "cpu",
                           "--max-new-tokens", "6", "--backend", "reference"], capture_output=True, text=True, env=e,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"{4096 - 6 - 5} tokens of pydoc_data.topics (the longest this model allows)" in out, out
    header = next(ln for ln in out.splitlines() if "method" in ln and "τ" in ln)
    assert header.index("τ") < header.index("speedup vs dense") < header.index("tokens/s"), header
    assert ("speculation pays here: magicdec" in out) != ("no speedup on this device" in out), out


def test_an_allocation_failure_is_one_line(capsys):
    """An allocation that fails past the precheck (CPU allocator message) is the same one line, exit 2."""
    import typer

    from specdec.cli import friendly

    @friendly
    def run(batch_size: int, context_tokens: int) -> None:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)")

    with pytest.raises(typer.Exit) as exc:
        run(batch_size=4096, context_tokens=8000)
    assert exc.value.exit_code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: out of memory: batch 4096 × context 8000 did not fit"), err
    assert "lower --batch-size or --context-tokens" in err[0]
