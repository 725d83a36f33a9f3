"""The aarch64 build end to end under qemu-aarch64, against the x86 build of this machine.

`bash tools/arm-build.sh` cross-builds the project into target/aarch64 ({bin,lib}: spark,
spark-convert, spark-gguf, llama-completion and the plugin libggml-spark.so); tests/run.sh runs
it before pytest. Every aarch64 program runs through qemu-aarch64 (user-mode emulation), at each
QEMU CPU model of tools/arm-env.sh (ARM_QEMU_CPUS: plain NEON, + dotprod and fp16, `max`), so
every run-time choice of the Spark kernels' instruction set is exercised; an instruction a model
lacks would end the program with SIGILL. The x86 side is target/debug (SPARK_BIN_DIR).

What must hold:
- spark-convert writes the same bytes on both (f32 and q8_0), and spark-gguf validates the file;
- `spark run` greedy text of the shipped model is x86's, with the kernels' report (SPARK_STATS);
- llama-completion with the aarch64 plugin (GGML_BACKEND_PATH) gives that same greedy text, and
  SPARK_STATS=1 prints the plugin's table: every layer ran the sparse kernels at k_f/F, with the
  statistics of the aarch64 `spark run` (same kernels, same tokens);
- `spark eval` logits are within the end-to-end tolerances of docs/SPEC.md section 4 (median
  per-position error and top-1 agreement, as tests/python/integration/test_spark_eval.py judges
  them against the float64 reference) of x86's: f32 and f16 KV cache, f32 and q8_0 weights.

qemu runs floating point ~37x slower than the host: the model is the small shipped one. No
timing of these runs says anything about ARM speed.

Skipped when target/aarch64 was not built (the reason says how to build it); once built, a
missing qemu-aarch64 or x86 binary is a failure. A target/aarch64 older than the sources
compares an old build: rebuild it after changes (tests/run.sh does)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
ARM = Path(os.environ.get("SPARK_ARM_DIR", ROOT / "target" / "aarch64"))
X86_BIN = Path(os.environ.get("SPARK_BIN_DIR", ROOT / "target" / "debug"))

if not (ARM / "bin" / "spark").is_file():
    pytest.skip(f"the aarch64 build is absent ({ARM / 'bin' / 'spark'}): `bash tools/arm-build.sh` "
                f"cross-builds it (tests/run.sh does, before pytest)", allow_module_level=True)

# The upstream-tool tests' helpers (runs with failure messages, the SPARK_STATS parser), as
# tests/python/upstream/conftest.py registers them (module `upstream_helpers`), unless it did.
if "upstream_helpers" in sys.modules:
    uh = sys.modules["upstream_helpers"]
else:
    _spec = importlib.util.spec_from_file_location(
        "upstream_helpers", ROOT / "tests" / "python" / "upstream" / "upstream_helpers.py")
    uh = importlib.util.module_from_spec(_spec)
    sys.modules["upstream_helpers"] = uh
    _spec.loader.exec_module(uh)


def qemu_cpus() -> list[str]:
    """ARM_QEMU_CPUS of tools/arm-env.sh: the one list of CPU models the checks run under."""
    text = (ROOT / "tools" / "arm-env.sh").read_text()
    m = re.search(r"^ARM_QEMU_CPUS=\(([^)]*)\)", text, re.M)
    assert m, "no ARM_QEMU_CPUS=(...) line in tools/arm-env.sh"
    return m.group(1).split()


CPUS = qemu_cpus()
PROMPTS = ["ROMEO:", "JULIET.\nO Romeo, Romeo, wherefore"]
N_PREDICT = 48
# tests/python/integration/test_spark_eval.py's end-to-end criterion (docs/SPEC.md section 4:
# median per-position relative error and top-1 agreement): f32 KV cache, and the f16 cache,
# whose key rounding moves scores across the attention threshold.
MEDIAN_MAX = 5e-3
F16_MEDIAN_MAX = 2e-2
TOP1_MIN = 0.97
# The eval text: the held-out text's first 500 characters (247 tokens, inside the shipped
# model's 256-token context; -c 256 refuses more).
EVAL_CHARS = 500
TIMEOUT = 600  # qemu under a loaded 2-core machine: ggml's spinning threads make runs long


def x86(name: str) -> Path:
    path = X86_BIN / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: the x86 side of the comparison (cargo build, or set "
                    f"SPARK_BIN_DIR)", pytrace=False)
    return path


def arm(name: str) -> Path:
    path = ARM / "bin" / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: bash tools/arm-build.sh", pytrace=False)
    return path


def base_env() -> dict:
    """Ours, less what would change the runs: llama.cpp's LLAMA_ARG_* defaults, a plugin path,
    SPARK_STATS, SPARK_ISA, and qemu's variables (QEMU_LD_PREFIX would load the cross
    toolchain's libc, with which every program hangs; QEMU_CPU is set per run)."""
    drop = {"GGML_BACKEND_PATH", "SPARK_STATS", "SPARK_ISA", "QEMU_LD_PREFIX", "QEMU_CPU"}
    return {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_") and k not in drop}


def on_arm(cpu: str, program: str, *args) -> list:
    """The command line of an aarch64 program under qemu at CPU model `cpu`, written out with
    `env` so that a failure message shows it whole."""
    qemu = shutil.which("qemu-aarch64")
    if qemu is None:
        pytest.fail("qemu-aarch64 is missing: bash tools/setup.sh installs qemu-user",
                    pytrace=False)
    return ["env", f"QEMU_CPU={cpu}", qemu, arm(program), *args]


def spark_run_args(model: Path, prompt: str) -> list:
    return ["run", "-m", model, "-p", prompt, "-n", N_PREDICT, "--temp", "0", "--seed", uh.SEED,
            "-t", uh.THREADS, "--spark-stats"]


def run_text(res, prompt: str) -> str:
    """`spark run`'s stdout is the prompt, the generated text and one newline."""
    out = res.stdout
    assert out.startswith(prompt) and out.endswith("\n"), res.explain(f"unexpected stdout {out!r}")
    return out[len(prompt):-1]


def cpu_kernels(res) -> str:
    s = uh.parse_stats(res.stderr)
    assert s.cpu_kernels, res.explain("no 'spark-stats: cpu kernels <isa>' line")
    return s.cpu_kernels


def compare(logits: np.ndarray, ref: np.ndarray) -> dict:
    """Per-position relative L2 error and top-1 agreement (tests/python/integration)."""
    assert logits.shape == ref.shape, (logits.shape, ref.shape)
    assert np.isfinite(logits).all()
    ref = ref.astype(np.float64)
    rel = np.linalg.norm(logits - ref, axis=1) / np.linalg.norm(ref, axis=1)
    return {"median": float(np.median(rel)), "p90": float(np.quantile(rel, 0.9)),
            "max": float(rel.max()),
            "top1": float(np.mean(np.argmax(logits, axis=1) == np.argmax(ref, axis=1)))}


# ---------------------------------------------------------------------------------------------
# the models and the x86 side


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    """The shipped model converted by x86 spark-convert: outtype -> path."""
    d = tmp_path_factory.mktemp("arm-models")
    out = {}
    for outtype in ("f32", "q8_0"):
        out[outtype] = d / f"spark-shakespeare-{outtype}.gguf"
        uh.run([x86("spark-convert"), uh.MODEL_NPZ, out[outtype], "--outtype", outtype,
                "--quiet"], env=base_env(), timeout=TIMEOUT)
    return out


@pytest.fixture(scope="module")
def x86_texts(models) -> dict:
    """prompt -> the x86 `spark run` greedy text (f32 model)."""
    texts = {}
    for p in PROMPTS:
        res = uh.run([x86("spark"), *spark_run_args(models["f32"], p)], env=base_env())
        texts[p] = run_text(res, p)
        assert texts[p].strip(), res.explain(f"x86: no text generated for {p!r}")
    return texts


def eval_text() -> str:
    return uh.HELDOUT.read_text()[:EVAL_CHARS]


EVALS = {  # name -> (model outtype, spark eval flags, median bound)
    "f32-cache": ("f32", ["--cache-type", "f32"], MEDIAN_MAX),
    "f16-cache": ("f32", [], F16_MEDIAN_MAX),
    "q8_0-f32-cache": ("q8_0", ["--cache-type", "f32"], MEDIAN_MAX),
}


def eval_args(model: Path, out: Path, flags) -> list:
    return ["eval", "-m", model, "-p", eval_text(), "-c", "256", "-t", uh.THREADS,
            "--logits-out", out, "--quiet", *flags]


@pytest.fixture(scope="module")
def x86_logits(models, tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("x86-logits")
    out = {}
    for name, (outtype, flags, _) in EVALS.items():
        path = d / f"{name}.npy"
        uh.run([x86("spark"), *eval_args(models[outtype], path, flags)], env=base_env())
        out[name] = np.load(path)
    return out


@pytest.fixture(scope="module")
def arm_runs() -> dict:
    """(cpu, prompt) -> the aarch64 `spark run` Result, shared by the tests that need it."""
    return {}


def arm_spark_run(arm_runs, models, cpu, prompt):
    if (cpu, prompt) not in arm_runs:
        arm_runs[cpu, prompt] = uh.run(on_arm(cpu, "spark", *spark_run_args(models["f32"], prompt)),
                                       env=base_env(), timeout=TIMEOUT)
    return arm_runs[cpu, prompt]


# ---------------------------------------------------------------------------------------------
# the tests


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_spark_convert_writes_the_x86_bytes(models, tmp_path, outtype):
    out = tmp_path / f"arm-{outtype}.gguf"
    uh.run(on_arm(CPUS[0], "spark-convert", uh.MODEL_NPZ, out, "--outtype", outtype, "--quiet"),
           env=base_env(), timeout=TIMEOUT)
    want = models[outtype].read_bytes()
    got = out.read_bytes()
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                     min(len(got), len(want)))
        pytest.fail(f"aarch64 spark-convert --outtype {outtype} wrote {len(got)} bytes, x86 "
                    f"{len(want)}: they differ from byte {first} on", pytrace=False)
    res = uh.run(on_arm(CPUS[0], "spark-gguf", "validate", out), env=base_env(), timeout=TIMEOUT)
    assert re.search(r": valid \(", res.stdout), res.explain(
        f"spark-gguf validate printed {res.stdout!r}")


@pytest.mark.parametrize("cpu", CPUS)
def test_spark_run_greedy_text_is_x86s(models, x86_texts, arm_runs, cpu):
    for prompt in PROMPTS:
        res = arm_spark_run(arm_runs, models, cpu, prompt)
        text = run_text(res, prompt)
        assert text == x86_texts[prompt], res.explain(
            f"QEMU_CPU={cpu}, {prompt!r}: the aarch64 `spark run` gave\n  {text!r}\nx86 gave\n"
            f"  {x86_texts[prompt]!r}")
        isa = cpu_kernels(res)
        assert isa != "generic", res.explain(
            f"QEMU_CPU={cpu}: the kernels ran the generic (portable) table, not a NEON one")
        uh.assert_stats_table(res.stderr, uh.CFG["n_layers"], uh.TARGET_KEEP, explain=res.explain)
    print(f"\nQEMU_CPU={cpu}: cpu kernels {isa}; {PROMPTS[0]!r} -> {x86_texts[PROMPTS[0]]!r}")


@pytest.mark.parametrize("cpu", CPUS)
def test_llama_completion_with_the_plugin_gives_the_same_text(models, x86_texts, arm_runs, cpu):
    """llama-completion and `spark run` decode the same way (tests/python/upstream/
    test_completion.py), so the aarch64 llama-completion with the aarch64 plugin must give the
    x86 text, and the plugin's table the statistics of the aarch64 `spark run`."""
    plugin = ARM / "lib" / "libggml-spark.so"
    assert plugin.is_file(), f"{plugin} is missing: bash tools/arm-build.sh"
    env = dict(base_env(), GGML_BACKEND_PATH=str(plugin), SPARK_STATS="1")
    for prompt in PROMPTS:
        cmd = on_arm(cpu, "llama-completion", "-m", models["f32"], "-p", prompt, "-n", N_PREDICT,
                     "--temp", "0", "--seed", uh.SEED, "-t", uh.THREADS, "-no-cnv",
                     "--no-display-prompt", "--no-warmup")
        res = uh.run_until_complete(cmd, lambda r: r.stdout.endswith(uh.COMPLETION_END),
                                    env=env, timeout=TIMEOUT)
        text = uh.completion_text(res.stdout)
        assert text == x86_texts[prompt], res.explain(
            f"QEMU_CPU={cpu}, {prompt!r}: the aarch64 llama-completion with the plugin gave\n"
            f"  {text!r}\nx86 `spark run` gave\n  {x86_texts[prompt]!r}")
        stats = uh.assert_stats_table(res.stderr, uh.CFG["n_layers"], uh.TARGET_KEEP,
                                      explain=res.explain)
        ours = uh.parse_stats(arm_spark_run(arm_runs, models, cpu, prompt).stderr)
        assert stats.rows == ours.rows, res.explain(
            f"QEMU_CPU={cpu}, {prompt!r}: per-layer statistics differ\n llama-completion: "
            f"{stats.rows}\n spark run: {ours.rows}")
        assert stats.cpu_kernels == ours.cpu_kernels, (stats.cpu_kernels, ours.cpu_kernels)
    print(f"\nQEMU_CPU={cpu}:\n" + "\n".join(stats.lines))


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("name", list(EVALS))
def test_eval_logits_are_within_spec_tolerance_of_x86s(models, x86_logits, tmp_path, cpu, name):
    outtype, flags, median_max = EVALS[name]
    path = tmp_path / "arm.npy"
    res = uh.run(on_arm(cpu, "spark", *eval_args(models[outtype], path, flags)), env=base_env(),
                 timeout=TIMEOUT)
    got = np.load(path)
    stats = compare(got, x86_logits[name])
    print(f"\nQEMU_CPU={cpu} {name}: aarch64 vs x86 {stats}")
    assert stats["median"] <= median_max and stats["top1"] >= TOP1_MIN, res.explain(
        f"QEMU_CPU={cpu} {name}: aarch64 logits vs x86's {stats}: want median <= {median_max}, "
        f"top-1 >= {TOP1_MIN}")
