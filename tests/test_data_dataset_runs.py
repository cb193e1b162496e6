"""The ``dataset`` task through the command line: its config keys, ``config check``, a real run, and the docs' example.

Invariants pinned:
- the schema: ``data.task: dataset`` needs ``data.dataset.train_path``; ``eval_fraction`` with ``eval_path`` or
  ``eval_split``, ``columns.prompt`` with ``columns.messages``, an empty list of paths, a duplicated metadata column
  and ``data.dataset`` settings under another task are each an error naming the key;
- bad files, missing columns and mistyped values are refused by ``config check`` and by ``train`` (exit 2, no
  traceback, no run directory) in one message naming each key, file, column and row, every problem at once;
- ``config check`` on a dataset config imports neither torch nor transformers;
- a short real run (tiny model, 2 steps, sync) trains on a parquet file with a held-out fraction: every fate names a
  training row's uid (``{file stem}/{row}``), never a held-out one; ``--resume`` to a third step takes the same
  prompts (the loader's fingerprint of the uids matches) and ``groupwise audit`` passes;
- docs/datasets.md's example is runnable: its script writes the files, and every config it shows passes
  ``config check`` on them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from groupwise.cli.main import main
from groupwise.config import ConfigError, config_from_dict
from groupwise.data.dataset_task import DatasetTask

ROOT = Path(__file__).resolve().parents[1]
TINY = ("{source: tiny, tiny: {num_layers: 1, hidden_size: 16, num_heads: 2, intermediate_size: 16, "
        "max_position_embeddings: 32}}")


def write_config(tmp_path: Path, data: str, run: str = "max_steps: 2") -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        f"model: {TINY}\n"
        f"run: {{name: t, output_dir: {tmp_path / 'runs'}, {run}}}\n"
        "grpo: {num_prompts_per_step: 2, num_generations_per_prompt: 2, dynamic_sampling: {enabled: false}}\n"
        "generation: {max_new_tokens: 4}\n"
        "logging: {tensorboard: false, progress: false}\n"
        "eval: {at_start: false, at_end: true, num_prompts: 2}\n"
        "checkpoint: {every: 1, keep_last: 3, save_final: false}\n"
        f"data: {data}\n", encoding="utf-8")  # fmt: skip
    return path


def refused(args: list[str], capsys, *words: str) -> str:
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    for word in words:
        assert word in err, (word, err)
    return err


def config_problems(data: dict) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"model": {"source": "tiny"}, "data": data})
    return [(issue.path, issue.rule) for issue in caught.value.errors]


@pytest.mark.parametrize(("data", "key", "words"), [
    ({"task": "dataset"}, "data.dataset.train_path", "data.task 'dataset' needs data.dataset.train_path"),
    ({"task": "dataset", "dataset": {"train_path": "a.parquet", "eval_path": "b.parquet", "eval_fraction": 0.1}},
     "data.dataset.eval_fraction", "but data.dataset.eval_path names the held-out data already"),
    ({"task": "dataset", "dataset": {"train_path": "a", "eval_split": "test", "eval_fraction": 0.1}},
     "data.dataset.eval_fraction", "but data.dataset.eval_split names the held-out data already"),
    ({"task": "dataset", "dataset": {"train_path": "a", "columns": {"prompt": "q", "messages": "m"}}},
     "data.dataset.columns.messages", "plain text (columns.prompt: q) or chat turns (columns.messages), not both"),
    ({"task": "dataset", "dataset": {"train_path": []}}, "data.dataset.train_path", "must name at least one file"),
    ({"task": "dataset", "dataset": {"train_path": "a", "columns": {"metadata": ["x", "x"]}}},
     "data.dataset.columns.metadata", "distinct, non-empty column names"),
    ({"task": "dataset", "dataset": {"train_path": "a", "eval_fraction": 1.0}}, "data.dataset.eval_fraction",
     "must be < 1"),
    ({"task": "addition", "dataset": {"train_path": "a.parquet"}}, "data.dataset.train_path",
     "has no effect with data.task 'addition'"),
])  # fmt: skip
def test_the_config_keys_go_together(data, key, words):
    problems = config_problems(data)
    assert any(path == key and words in rule for path, rule in problems), problems


def test_bad_inputs_are_refused_at_check_and_by_train_all_at_once(tmp_path, capsys):
    good = tmp_path / "good.parquet"
    datasets.Dataset.from_list([{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(4)]).to_parquet(str(good))
    (tmp_path / "broken.parquet").write_text("not parquet", encoding="utf-8")
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n" + json.dumps({"prompt": "", "answer": "2"})
                    + "\n", encoding="utf-8")  # fmt: skip
    data = (f"{{task: dataset, dataset: {{train_path: [{good}, {tmp_path / 'broken.parquet'}, "
            f"{tmp_path / 'gone.csv'}], eval_path: {held}}}}}")
    config = write_config(tmp_path, data)
    words = ("data.dataset.train_path", "broken.parquet: cannot be read as parquet", "gone.csv: no such file or folder",
             "data.dataset.eval_path", "held.jsonl: 1 bad row(s) of 2",
             "column 'prompt' (columns.prompt), row 1: is empty")  # fmt: skip
    refused(["config", "check", str(config)], capsys, *words)
    refused(["train", str(config)], capsys, *words)
    assert not (tmp_path / "runs").exists()


def test_config_check_on_a_dataset_imports_no_torch(tmp_path):
    path = tmp_path / "sums.parquet"
    datasets.Dataset.from_list([{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(4)]).to_parquet(str(path))
    config = write_config(tmp_path, f"{{task: dataset, dataset: {{train_path: {path}}}}}")
    child = ("import sys; from groupwise.cli.main import main\n"
             f"assert main(['config', 'check', {str(config)!r}]) == 0\n"
             "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_short_run_trains_on_a_parquet_file_and_resumes(tmp_path, capsys):
    path = tmp_path / "sums.parquet"
    rows = [{"prompt": f"{i}+{j}=", "answer": str(i + j)} for i in range(3) for j in range(4)]
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    config = write_config(tmp_path, f"{{task: dataset, dataset: {{train_path: {path}, eval_fraction: 0.25}}}}")
    assert main(["train", str(config)]) == 0
    run = tmp_path / "runs" / "t"
    fates = [json.loads(line) for line in (run / "fates.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(fates) == 4 and all(fate["fate"] == "trained" for fate in fates)
    task = DatasetTask(str(path), eval_fraction=0.25, seed=0)
    train_uids = {p.uid for p in task.train_prompts()}
    assert len(train_uids) == 9 and {f"sums/{i}" for i in range(12)} - train_uids == {
        p.uid for p in task.eval_prompts()}
    assert {fate["prompt_uid"] for fate in fates} <= train_uids
    assert main(["train", str(config), "run.max_steps=3", "--resume"]) == 0
    fates = [json.loads(line) for line in (run / "fates.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(fates) == 6 and {fate["prompt_uid"] for fate in fates} <= train_uids
    capsys.readouterr()
    assert main(["audit", str(run)]) == 0, capsys.readouterr()


# --- docs/datasets.md ---------------------------------------------------------------------------------------------


def doc_blocks(language: str) -> list[str]:
    """The fenced ``language`` blocks of the ``dataset`` section of docs/datasets.md."""
    text = (ROOT / "docs" / "datasets.md").read_text(encoding="utf-8")
    section = text.split("## `dataset`", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def test_the_docs_example_writes_its_files_and_every_config_it_shows_passes_check(tmp_path, monkeypatch, capsys):
    script, *_ = doc_blocks("python")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").symlink_to(ROOT / "models")
    exec(compile(script, "docs/datasets.md", "exec"), {"__name__": "__main__"})
    configs = [block for block in doc_blocks("yaml") if block.startswith("model:")]
    assert len(configs) == 5
    for i, block in enumerate(configs):
        config = tmp_path / f"config_{i}.yaml"
        config.write_text(block, encoding="utf-8")
        assert main(["config", "check", str(config), f"run.output_dir={tmp_path / 'runs'}"]) == 0, (
            block, capsys.readouterr().err)
