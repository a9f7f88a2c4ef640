"""Rule files: every kind of bad file is refused at load, all problems in one message with
file and line, through the CLI (exit 2) and the loader."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_advise_support import DATA, recording, run_cli

from gpuwatch.advisor.rules import RuleFileError, load_rules
from gpuwatch.errors import FileFormatError

GOOD = """\
rules:
  - id: my-rule
    title: something
    severity: info
    when: mean(util, 30s) < 0.5
    message: util is {u:.0%}
    evidence:
      u: mean(util, 30s)
    action: do something
"""


def load_text(text: str, name: str = "mine.yaml") -> None:
    load_rules(builtin=False, files=[(name, textwrap.dedent(text))])


def problems(text: str) -> str:
    with pytest.raises(FileFormatError) as err:
        load_text(text)
    return str(err.value)


def test_builtin_rules_load_and_have_the_six_ids():
    ids = {r.id for r in load_rules().rules}
    assert {"raise-batch-size", "add-dataloader-workers", "enable-gradient-checkpointing",
            "enable-mixed-precision", "loss-scale-collapse", "gpu-idle"} <= ids


def test_a_good_user_rule_loads():
    rules = load_rules(builtin=False, files=[("mine.yaml", GOOD)]).rules
    assert [r.id for r in rules] == ["my-rule"]


def test_unknown_signal_names_file_and_line():
    msg = problems(GOOD.replace("mean(util, 30s) < 0.5", "mean(utilization, 30s) < 0.5"))
    assert "mine.yaml:5:" in msg and "unknown signal 'utilization'" in msg


def test_bad_expression_syntax():
    msg = problems(GOOD.replace("mean(util, 30s) < 0.5", "mean(util, 30s) <"))
    assert "mine.yaml:5:" in msg and "expected a value" in msg


def test_bad_severity():
    msg = problems(GOOD.replace("severity: info", "severity: urgent"))
    assert "mine.yaml:4:" in msg and "severity must be one of info, warning, critical" in msg


def test_missing_fields():
    msg = problems("rules:\n  - id: bare\n    title: t\n")
    for field in ("severity", "when", "message", "action"):
        assert f"missing {field}" in msg
    assert "mine.yaml:2:" in msg


def test_duplicate_id_in_one_file_and_against_builtin():
    twice = GOOD + GOOD.split("rules:\n", 1)[1]
    msg = problems(twice)
    assert "duplicate rule id 'my-rule'" in msg and "mine.yaml:10:" in msg
    with pytest.raises(FileFormatError) as err:
        load_rules(files=[("mine.yaml", GOOD.replace("my-rule", "gpu-idle"))])
    assert "rule id 'gpu-idle' is taken by a built-in rule (rules/training.yaml" \
        in str(err.value)


@pytest.mark.parametrize("when,needle", [
    ("open('/etc/passwd')", "function 'open' is not allowed"),
    ("util.__class__", "attribute access"),
    ("__builtins__", "names starting with '_'"),
    ("util[0] > 1", "indexing"),
    ("exec('x')", "function 'exec' is not allowed"),
])
def test_code_is_rejected_at_load(when, needle):
    msg = problems(GOOD.replace("mean(util, 30s) < 0.5", f'"{when}"'))
    assert needle in msg and "mine.yaml:5:" in msg


def test_templates_cannot_reach_attributes_or_unknown_names():
    msg = problems(GOOD.replace("util is {u:.0%}", '"util {u.__class__}"'))
    assert "plain name" in msg
    msg = problems(GOOD.replace("util is {u:.0%}", "util is {v}"))
    assert "unknown placeholder {v}" in msg


def test_without_hook_is_a_template_checked_at_load():
    rules = load_rules(builtin=False, files=[("mine.yaml", GOOD + "    without_hook: it was"
                                              " {u:.0%}[[ and {u:.1f}]]\n")]).rules
    assert rules[0].without_hook.render({"u": 0.25}) == "it was 25 % and 0.2"
    assert rules[0].without_hook.render({"u": None}) == "it was ?"
    msg = problems(GOOD + "    without_hook: the hook would add {w}\n")
    assert "mine.yaml:10:" in msg and "without_hook: unknown placeholder {w}" in msg
    msg = problems(GOOD + "    without_hook: [a, b]\n")
    assert "mine.yaml:10:" in msg and "without_hook must be text" in msg


def test_all_problems_of_a_file_in_one_message_sorted_by_line():
    bad = GOOD.replace("severity: info", "severity: loud").replace(
        "mean(util, 30s) < 0.5", "mean(utl, 30s) < 0.5").replace("title: something",
                                                                  "title: something\n    colour: red")
    msg = problems(bad)
    lines = msg.splitlines()
    assert len(lines) == 3
    assert "unknown key 'colour'" in lines[0] and "severity" in lines[1] and "utl" in lines[2]


def test_bad_values_and_structure():
    msg = problems(GOOD.replace("action: do something",
                                "action: do something\n    for: soon\n    confidence: 2\n"
                                "    arch: {min: banana}\n    scope: cluster\n"
                                "    suppressed_by: [no-such-rule]"))
    assert "for: expected a duration" in msg
    assert "confidence must be between 0 and 1" in msg
    assert "expected a compute capability" in msg
    assert "scope must be gpu or host" in msg
    msg = problems(GOOD.replace("action: do something",
                                "action: do something\n    suppressed_by: [no-such-rule]"))
    assert "suppressed_by names unknown rule 'no-such-rule'" in msg


def test_train_share_is_a_fraction_read_with_phase_train_only():
    rules = load_rules(builtin=False, files=[("mine.yaml", GOOD.replace(
        "severity: info", "severity: info\n    phase: train\n    train_share: 0"))]).rules
    assert rules[0].train_share == 0.0
    assert load_rules(builtin=False, files=[("mine.yaml", GOOD.replace(
        "severity: info", "severity: info\n    phase: train"))]).rules[0].train_share is None
    msg = problems(GOOD.replace("severity: info", "severity: info\n    train_share: 0.2"))
    assert "mine.yaml:5:" in msg and "train_share is read with phase: train only" in msg
    for bad, said in (("1.5", "a number 1.5"), ("half", "text 'half'"), ("true", "a boolean")):
        msg = problems(GOOD.replace(
            "severity: info", f"severity: info\n    phase: train\n    train_share: {bad}"))
        assert "mine.yaml:6:" in msg and "train_share must be a number from 0 to 1" in msg \
            and said in msg, msg


def test_whole_run_is_true_or_false():
    rules = load_rules(builtin=False, files=[("mine.yaml", GOOD.replace(
        "severity: info", "severity: info\n    whole_run: true"))]).rules
    assert rules[0].whole_run is True
    assert load_rules(builtin=False, files=[("mine.yaml", GOOD)]).rules[0].whole_run is False
    for bad, said in (("yes please", "text 'yes please'"), ("1", "a number 1")):
        msg = problems(GOOD.replace("severity: info", f"severity: info\n    whole_run: {bad}"))
        assert "mine.yaml:5:" in msg and "whole_run must be true or false" in msg \
            and said in msg, msg


def test_host_rule_cannot_read_gpu_signals():
    msg = problems(GOOD.replace("severity: info", "severity: info\n    scope: host"))
    assert "a host rule cannot read per-GPU signals (util)" in msg


def test_suppression_cycle():
    a = GOOD.replace("action: do something", "action: x\n    suppressed_by: [other]")
    b = a.split("rules:\n", 1)[1].replace("my-rule", "other").replace("[other]", "[my-rule]")
    msg = problems(a + b)
    assert "goes round in a circle" in msg


def test_not_yaml_and_yaml_tags_are_refused():
    msg = problems("rules:\n  - id: x\n   bad: [\n")
    assert "not valid YAML" in msg
    msg = problems("rules:\n  - !!python/object/apply:os.system ['echo hi']\n")
    assert "mine.yaml:2: YAML tag 'tag:yaml.org,2002:python/object/apply:os.system' is not " \
        "allowed" in msg


def test_problems_in_several_files_are_all_reported(tmp_path: Path):
    (tmp_path / "a.yaml").write_text(GOOD.replace("severity: info", "severity: meh"))
    (tmp_path / "b.yaml").write_text(GOOD.replace("my-rule", "rule-b").replace(
        "mean(util, 30s)", "mean(nope, 30s)"))
    with pytest.raises(RuleFileError) as err:
        load_rules([str(tmp_path)], builtin=False)
    msg = str(err.value)
    assert f"{tmp_path / 'a.yaml'}:4:" in msg and f"{tmp_path / 'b.yaml'}:5:" in msg


def test_cli_exits_2_with_the_message(tmp_path: Path):
    (tmp_path / "bad.yaml").write_text(GOOD.replace("mean(util, 30s)", "mean(utl, 30s)"))
    proc = run_cli("advise", "--replay", str(DATA / "tuned.jsonl"), "--rules-dir", str(tmp_path))
    assert proc.returncode == 2
    assert f"{tmp_path / 'bad.yaml'}:5:" in proc.stderr and "did you mean util" in proc.stderr
    assert proc.stdout == ""


def test_cli_user_rules_dir_adds_rules(tmp_path: Path):
    (tmp_path / "mine.yaml").write_text(GOOD.replace("mean(util, 30s) < 0.5",
                                                     "mean(util, 15s) > 0.9"))
    proc = run_cli("advise", "--replay", str(DATA / "tuned.jsonl"), "--rules-dir", str(tmp_path),
                   "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert "my-rule" in proc.stdout


def test_cli_missing_rules_dir(tmp_path: Path):
    proc = run_cli("advise", "--replay", str(DATA / "tuned.jsonl"), "--rules-dir",
                   str(tmp_path / "nope"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def _shape(value: object) -> object:
    """A read file with every line number the loader keeps beside each value."""
    if isinstance(value, dict):
        return ("map", getattr(value, "line", None),
                [(k, value.key_lines[k], value.value_lines[k], _shape(v))
                 for k, v in value.items()])
    if isinstance(value, list):
        return ("list", getattr(value, "line", None), value.item_lines,
                [_shape(v) for v in value])
    return (type(value).__name__, value)


ODD_YAML = """\
rules:   # a comment
  - id: "quoted"
    title: 'single'
    when: >
      mean(util, 30s)
      < 0.5
    message: |
      two
        lines
    tags: [a, b, {c: 1}]
    n: 1.5e3
    t: yes
    none: ~
    date: 2026-11-26
"""


@pytest.mark.parametrize("name", ["builtin", "good", "odd"])
def test_libyaml_reads_rule_files_as_the_python_parser_does(name):
    """Rule files are read by libyaml where PyYAML has it (a fifth of a second less at every
    start); the values, the lines they sit on and what they are refused for stay those
    of the pure-Python parser."""
    from gpuwatch.advisor import rules

    if rules._FAST_LOADER is None:
        pytest.skip("PyYAML built without libyaml")
    if name == "builtin":
        root = Path(rules.__file__).resolve().parents[2] / "rules"
        texts = [p.read_text() for p in sorted(root.glob("*.yaml"))]
        assert len(texts) >= 4
    else:
        texts = [GOOD if name == "good" else ODD_YAML]
    for text in texts:
        fast, fast_problems = rules._read_yaml("f.yaml", text)
        slow, slow_problems = rules._read_yaml_slowly(text)
        assert _shape(fast) == _shape(slow)
        assert fast_problems == slow_problems


@pytest.mark.parametrize("text", ["rules: [a, b\n", "a: 1\n---\nb: 2\n", "a: *x\n",
                                  "a: !!python/object:os.system x\n", "a: \x07\n",
                                  "{a: 1, a: 2}\n"])
def test_a_file_libyaml_refuses_is_told_in_the_python_parsers_words(text):
    from gpuwatch.advisor import rules

    assert rules._read_yaml("f.yaml", text) == rules._read_yaml_slowly(text)


def test_a_count_agrees_with_its_noun():
    """No built-in rule writes "error(s)" or "sample(s)": a count's noun is chosen by the
    count (values such as ``ifelse(n == 1, "graph", "graphs")``), singular and plural as
    the recordings read."""
    rules_dir = Path(__file__).resolve().parents[1] / "rules"
    for path in sorted(rules_dir.glob("*.yaml")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert "(s)" not in line, f"{path.name}:{n}: {line.strip()}"
    said = {name: " ".join(run_cli("advise", "--replay", str(recording(name))).stdout.split())
            for name in ("fw_generate", "fw_infer_loop", "fw_lightning_predict")}
    assert "generate() calls so far, 1 sequence each" in said["fw_generate"]
    assert "generate() calls so far, 1 sequences" not in said["fw_generate"]
    assert "no generate() call), 8 samples each" in said["fw_infer_loop"]
    assert "its 4 DataLoader workers keep their cores 90 % busy" in said["fw_lightning_predict"]
