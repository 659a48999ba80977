"""The gallery: every example in `examples/` runs in its `--short` mode and shows what it claims."""

import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

import eqopt

ROOT = pathlib.Path(__file__).parent.parent


def run_example(name, tmp_path, *extra):
    """Runs `examples/<name>.py --short`; returns its stdout and the plot's path."""
    out = tmp_path / f"{name}.png"
    env = dict(os.environ, MPLBACKEND="Agg")
    # This checkout's eqopt, whatever is installed.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env.pop("XLA_FLAGS", None)
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / f"{name}.py"), "--short"]
        + ["--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout, out


def number(pattern, text):
    match = re.search(pattern, text)
    assert match is not None, f"{pattern!r} not in:\n{text}"
    return float(match.group(1))


def assert_plot(path):
    assert path.exists() and path.stat().st_size > 10_000, path


def test_lr_sweep_vmap(tmp_path):
    stdout, plot = run_example("lr_sweep_vmap", tmp_path)
    # One trace for all learning rates: the sweep is one compiled program.
    assert "traced train_chunk 1 time(s) for 8 learning rates" in stdout, stdout
    assert "learning_rate=f32[8]" in stdout, stdout
    finals = [float(v) for v in re.findall(r"^\s+\S+e[-+]\d+\s+(\S+)$", stdout, re.M)]
    assert len(finals) == 8, stdout
    best = number(r"best learning rate: (\S+)", stdout)
    assert 1e-3 <= best <= 1e-1, stdout
    assert min(finals) < 0.02 and max(finals) > 5 * min(finals), stdout
    assert_plot(plot)


def test_meta_learning_lr(tmp_path):
    stdout, plot = run_example("meta_learning_lr", tmp_path)
    # The hypergradient says "increase the learning rate" at the start...
    assert number(r"learning_rate: ([-+0-9.e]+)", stdout) < 0, stdout
    # ...and following it raises the learning rate and lowers the held-out loss.
    learned = number(r"learned learning rate: (\S+)", stdout)
    assert 3e-3 < learned < 5e-2, stdout
    before, after = re.search(r"new tasks: (\S+) -> (\S+)", stdout).groups()
    assert float(after) < 0.8 * float(before), stdout
    assert_plot(plot)


def test_accumulation_and_freezing(tmp_path):
    stdout, plot = run_example("accumulation_and_freezing", tmp_path)
    assert "Adam moments kept for the frozen layer: None" in stdout, stdout
    assert "updates made by MultiSteps: 25" in stdout, stdout
    assert number(r"two trained models: (\S+)", stdout) < 1e-5, stdout
    assert "frozen layer unchanged: True" in stdout, stdout
    changes = re.search(r"weight change per layer: (.*)", stdout).group(1)
    first, *rest = (float(c) for c in changes.split(","))
    assert first == 0 and all(c > 0 for c in rest), stdout
    assert_plot(plot)


def test_checkpointing(tmp_path):
    stdout, plot = run_example("checkpointing", tmp_path)
    assert "equinox: restored the checkpoint of step 20" in stdout, stdout
    assert "equinox: final model and optimiser state bit-identical: True" in stdout
    assert "equinox: losses after the restart identical: True" in stdout
    if "orbax" in stdout:
        assert "orbax keeps the checkpoints of steps [10, 20]" in stdout, stdout
        assert "orbax: final model and optimiser state bit-identical: True" in stdout
    assert "False" not in stdout, stdout
    assert_plot(plot)


def test_sharding(tmp_path):
    stdout, plot = run_example("sharding", tmp_path)
    assert stdout.startswith("8 devices"), stdout
    table = re.search(r"^\.layers\[1\]\.weight .*$", stdout, re.M).group(0)
    assert table.count("P(None, 'model')") == 3, stdout  # param, mu, nu
    assert "every moment has its parameter's sharding: True" in stdout, stdout
    assert "one step matches the unsharded step: True" in stdout, stdout
    assert "parameters kept their shardings: True" in stdout, stdout
    assert "still has its parameter's sharding: True" in stdout, stdout
    final, first = re.search(r"final loss: (\S+) \(first (\S+)\)", stdout).groups()
    assert float(final) < 0.5 * float(first), stdout
    assert_plot(plot)


@pytest.mark.skipif(
    not hasattr(eqopt, "lbfgs"), reason="eqopt.lbfgs is not in this checkout yet"
)
def test_lbfgs_fitting(tmp_path):
    stdout, plot = run_example("lbfgs_fitting", tmp_path)
    fit = re.search(r"L-BFGS fit: +(.*)", stdout).group(1)
    values = dict(item.rsplit(" ", 1) for item in fit.split(", "))
    assert abs(float(values["frequency"]) - 3.0) < 0.05, stdout
    assert abs(float(values["decay"]) - 0.3) < 0.05, stdout
    assert number(r"L-BFGS final loss: (\S+)", stdout) < 0.011, stdout
    assert number(r"L-BFGS within 0.1% of the best loss: after (\d+)", stdout) < 30
    assert_plot(plot)


def test_optimizer_zoo(tmp_path):
    stdout, plot = run_example("optimizer_zoo", tmp_path)
    rows = {
        match.group(1).strip(): [float(v) for v in match.group(2).split()]
        for match in re.finditer(
            r"^(AdamW \(A/A\)|AdamW|Muon|NorMuon|MARS-AdamW|cautious AdamW|Adam-mini"
            r"|SOAP|Shampoo|Kron)\s+((?:\S+\s+){4}\S+)$",
            stdout,
            re.M,
        )
    }
    expected = {"AdamW", "AdamW (A/A)", "Muon", "NorMuon", "SOAP", "Shampoo", "Kron"}
    expected |= {"MARS-AdamW", "cautious AdamW", "Adam-mini"}
    assert expected == set(rows), stdout
    for name, (final, held_out, _, _, time_ratio) in rows.items():
        # Below the uniform guess over 95 characters (ln 95 = 4.554), and finite:
        # in 12 steps Kron, whose preconditioner starts at the identity, reaches 4.53.
        uniform = math.log(95)
        assert 0 < final < uniform and 0 < held_out < uniform, (name, stdout)
        assert time_ratio > 0, (name, stdout)
    state = {name: values[3] for name, values in rows.items()}  # relative to AdamW
    assert state["AdamW (A/A)"] == 1.0 and state["cautious AdamW"] == 1.0, stdout
    assert state["Adam-mini"] < 0.55, stdout  # one second moment per block
    assert state["MARS-AdamW"] == 1.5, stdout  # the last gradient is kept too
    assert state["Muon"] < 1.0 and state["NorMuon"] < 1.0, stdout
    # Kronecker factors on top of the moments: two moments for SOAP, three
    # (momentum, grafting momentum and second moment) for Shampoo, one for Kron.
    assert state["SOAP"] > 2.0 and state["Shampoo"] > 3.0, stdout
    assert state["Kron"] > 1.0, stdout
    assert_plot(plot)


def test_frontier_optimizers(tmp_path):
    stdout, plot = run_example("frontier_optimizers", tmp_path)
    tau = number(r"QK-clip threshold tau = (\S+)", stdout)
    rows = {
        match.group(1): [float(v) for v in match.group(2).split()]
        for match in re.finditer(
            r"^(Muon|MuonClip)\s+((?:\S+\s+){5}\S+)$", stdout, re.M
        )
    }
    assert set(rows) == {"Muon", "MuonClip"}, stdout
    uniform = math.log(95)  # the uniform guess over 95 characters: below it, learned
    for name, (final, held_out, state, time_ratio, _, _) in rows.items():
        assert 0 < final < uniform and 0 < held_out < uniform, (name, stdout)
        assert state == 1.0 and time_ratio > 0, (name, stdout)
    muon, clip = rows["Muon"], rows["MuonClip"]
    # Without the clip the largest logit runs past tau; with it, it is pulled back
    # to tau at every step (within one step's growth: the clip scales by the
    # logits of the step's own forward pass).
    assert muon[4] > 1.5 * tau and muon[5] > 1.5 * tau, stdout
    assert clip[4] < muon[4] and clip[5] <= 1.3 * tau, stdout
    assert abs(clip[0] - muon[0]) < 0.1, stdout  # the clip barely moves the loss
    assert_plot(plot)


def test_fine_tuning(tmp_path):
    stdout, plot = run_example("fine_tuning", tmp_path)
    assert number(r"pretrained: task A accuracy (\S+)", stdout) > 0.9, stdout
    # The report: the head at the last layer (5 = 4 blocks + 1) with 10x the base
    # rate after the warm-up, no weight decay on norms and biases, the embeddings
    # at layer 0.
    assert "3 groups, 136,068 parameters, at step 25" in stdout, stdout
    assert re.search(
        r"^head +5 +260 +x10 +0\.01 +x1 +0\.05 +head\.weight$", stdout, re.M
    )
    assert re.search(
        r"^no_decay +1-5 +2,944 +x0\.316\.\.x1 +\S+ +x0 +0 +blocks\[0-3\]\.norm1\.weight$",
        stdout,
        re.M,
    )
    assert "                norm.bias" in stdout, stdout
    assert re.search(
        r"^default +0-4 +132,864 +x0\.237\.\.x0\.75 +\S+ +x1 +0\.05 +embedding\.weight$",
        stdout,
        re.M,
    )
    rates = dict(re.findall(r"(\w+\.layer\d\.learning_rate) ([0-9.e-]+)", stdout))
    expected = {"head.layer5": 1e-2, "default.layer4": 7.5e-4}
    expected |= {"default.layer1": 1e-3 * 0.75**4, "default.layer0": 1e-3 * 0.75**5}
    for key, value in expected.items():
        assert math.isclose(float(rates[f"{key}.learning_rate"]), value, rel_tol=2e-3)
    # The table: every run, accuracies between 0 and 1.
    rows = {
        (name, float(rate)): (float(accuracy), float(kept))
        for name, rate, accuracy, kept in re.findall(
            r"^\| (global rate|param groups|head only|no pretraining) \| (\S+) \| "
            r"(\S+) ± \S+ \| (\S+) \|$",
            stdout,
            re.M,
        )
    }
    assert set(rows) == {
        ("global rate", 1e-3),
        ("global rate", 1e-2),
        ("param groups", 1e-3),
        ("head only", 1e-2),
        ("no pretraining", 1e-3),
    }, stdout
    assert all(0 <= a <= 1 and 0 <= k <= 1 for a, k in rows.values()), stdout
    # What the page says: the groups beat one global rate, at the same base rate
    # and at the head's rate; the frozen backbone keeps task A exactly.
    groups = rows[("param groups", 1e-3)][0]
    assert groups > rows[("global rate", 1e-3)][0] + 0.1, stdout
    assert groups > rows[("global rate", 1e-2)][0] + 0.1, stdout
    pretrained = number(r"pretrained: task A accuracy (\S+)", stdout)
    assert rows[("head only", 1e-2)][1] == pretrained, stdout
    assert number(r"best param groups: (\S+)", stdout) == groups, stdout
    assert_plot(plot)
    # The page shows the report as the script prints it (after the warm-up it is the
    # same in both modes), and the full run's table as its output has it.
    page = (ROOT / "docs" / "examples" / "fine_tuning.md").read_text()
    shown = page.split("one line per group and layer):\n\n```text\n")[1].split("```")[0]
    printed = stdout.split("3 groups,", 1)[1].split("rates after the warm-up")[0]
    assert shown == "3 groups," + printed, stdout
    output = (ROOT / "docs" / "examples" / "fine_tuning.txt").read_text()
    table = [line for line in output.splitlines() if line.startswith("| ")]
    assert len(table) == 13 and all(line in page for line in table), table


def test_scanned_blocks(tmp_path):
    stdout, plot = run_example("scanned_blocks", tmp_path)
    # The same optimiser on the scanned stack and on the list: the same losses.
    assert number(r"largest loss difference, scanned vs list: (\S+)", stdout) < 1e-5
    # The report shows the stack as its layers, each with its layer-decay rate.
    assert "blocks[0-3].attention.query_proj.weight" in stdout, stdout
    assert "blocks[0-3].norm1.weight" in stdout, stdout
    assert_plot(plot)
