"""`qbench moe --variant tutel`: Tutel's layer in the same run and table as qbench's, checked against the same
dense reference, its version and commit in the record; a one-line usage error where Tutel does not import.

Tutel is optional and never committed: the run test looks for it importable, or built into the git-ignored
.tutel/site of this checkout (pip install --no-build-isolation --no-deps --target .tutel/site <tutel source>),
and skips without it."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import env_without_interpreter

ROOT = Path(__file__).resolve().parent.parent
LOCAL_TUTEL = ROOT / ".tutel" / "site"
SMALL = ["--num-local-experts", "2", "--model-dim", "32", "--hidden-size", "48", "--samples", "40", "--num-steps", "2",
         "--warmup", "1", "--device", "cpu", "--dtype", "fp32"]


def _env(extra_path: Path | None):
    path = [str(ROOT)] + ([str(extra_path)] if extra_path is not None else [])
    env = env_without_interpreter(PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1")  # the flow is under test
    for key in ("RANK", "WORLD_SIZE"):
        env.pop(key, None)
    return env


def _tutel_site() -> Path | None:
    """Where Tutel imports from for a spawned command: the environment's own (None) or .tutel/site."""
    if importlib.util.find_spec("tutel") is not None:
        return None
    if (LOCAL_TUTEL / "tutel").is_dir():
        return LOCAL_TUTEL
    pytest.skip("tutel is not importable here (see the module docstring to build it into .tutel/site)")


def test_tutel_runs_beside_qbench_in_one_table_checked_and_versioned(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "qbench", "moe", "--world-size", "2", "--variant", "a2a,tutel", "--capacity-factor",
           "1.0", *SMALL, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(_tutel_site()), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    records = [r for r in records if r["params"]["timing"] == "per_step"]
    assert [r["params"]["variant"] for r in records] == ["a2a", "tutel"]
    assert all(r["status"] == "ok" for r in records), [r.get("error") for r in records]
    qbench, tutel = records
    assert tutel["params"]["tutel_version"] and len(tutel["params"]["tutel_commit"]) >= 7
    assert tutel["metrics"]["check_max_rel_error"] <= 1e-4  # fp32 against the dense reference
    assert tutel["metrics"]["step_ms"] > 0 and tutel["metrics"]["host_ms"] > 0
    same = ("world_size", "model_dim", "hidden_size", "samples", "num_local_experts", "capacity_factor", "routing")
    assert all(qbench["params"][k] == tutel["params"][k] for k in same)
    assert "tutel" in proc.stdout  # one table: the variant column


def test_without_tutel_the_variant_is_a_one_line_usage_error():
    if importlib.util.find_spec("tutel") is not None:
        pytest.skip("tutel is importable in this environment")
    cmd = [sys.executable, "-m", "qbench", "moe", "--world-size", "1", "--variant", "tutel", *SMALL]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(None), timeout=120)
    assert proc.returncode == 2 and "--variant tutel needs Tutel importable" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_the_check_takes_the_experts_tutel_itself_chose():
    """Tutel ranks softmax scores in the gate's dtype (ties in fp16 go either way), so the check records Tutel's
    own choices: here a gate that sends token t to experts t % E and (t + 1) % E, which the recorder must give."""
    site = _tutel_site()
    if site is not None:
        sys.path.insert(0, str(site))
    import torch
    from tutel import moe as tutel_moe

    from qbench.benches.moe.tutel import tutel_choices

    E, T = 4, 12
    layer = tutel_moe.moe_layer(gate_type={"type": "top", "k": 2, "capacity_factor": 0.0}, model_dim=E,
                                experts={"type": "ffn", "num_experts_per_device": E, "hidden_size_per_expert": 8,
                                         "activation_fn": torch.relu})
    with torch.no_grad():
        layer.gates[0].wg.weight.copy_(torch.eye(E))
    t = torch.arange(T)
    x = torch.zeros(T, E)
    x[t, t % E], x[t, (t + 1) % E] = 3.0, 2.0  # logits = x: top-2 are t % E, then (t + 1) % E
    with tutel_choices() as chosen:
        layer(x)
    assert len(chosen) == 1 and chosen[0].tolist() == torch.stack([t % E, (t + 1) % E], 1).tolist()
    from tutel.impls import moe_layer

    assert moe_layer.extract_critical.__name__ == "extract_critical"  # restored after the block
