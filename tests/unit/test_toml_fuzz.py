"""Fuzzing the config and scenario loaders: 10,000 mutated documents each raise only the
documented error (ConfigError, ScenarioError) or load. The documents are what ``tomllib``
returns (tables, arrays, strings, ints of any size, floats with nan/inf, dates), fed past
the TOML text parser so that ten thousand of them take a few seconds."""

from __future__ import annotations

import datetime
import random
import tomllib
import types
from pathlib import Path
from typing import Any

import pytest

from slurmhealth import config
from slurmhealth.config import ENV_KEYS, effective_items, load_config
from slurmhealth.errors import ConfigError, ScenarioError
from slurmhealth.gpu import scenario

REPO = Path(__file__).resolve().parents[2]
N = 10_000
WORDS = ["", "x", "gpu", "all", "nvlink", "7", "-1", "0", "sim", "n[1-3]", "é\x00", "a\nb"]
ODD_NUMBERS: list[Any] = [0, -1, 1, 2**63, -(2**63), 10**30, 10**400, 0.5, -0.0, 1e308, 5e-324]
ODD_NUMBERS += [float("nan"), float("inf"), float("-inf")]
ENV_TEXT = ["1", "0", "-1", "nan", "inf", "1e999", "abc", " 5 ", "0x10", "9" * 5000, "yes", "8s"]


def toml_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if roll < 0.25:
        return rng.choice(ODD_NUMBERS)
    if roll < 0.4:
        return rng.choice([rng.randint(-100, 100), rng.uniform(-10, 100)])
    if roll < 0.55:
        return rng.choice(WORDS)
    if roll < 0.6:
        return rng.choice([True, False, datetime.date(2024, 1, 1), datetime.time(1, 2)])
    if roll < 0.8 and depth < 3:
        return [toml_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 3:
        return {rng.choice(WORDS): toml_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return rng.choice(WORDS)


def _containers(doc: Any, out: list[Any]) -> list[Any]:
    if isinstance(doc, dict | list):
        out.append(doc)
        for child in doc.values() if isinstance(doc, dict) else doc:
            _containers(child, out)
    return out


def _copy(doc: Any) -> Any:
    """A deep copy of tables and arrays (copy.deepcopy is ten times slower)."""
    if isinstance(doc, dict):
        return {k: _copy(v) for k, v in doc.items()}
    return [_copy(v) for v in doc] if isinstance(doc, list) else doc


def mutate(base: dict[str, Any], rng: random.Random, keys: list[str]) -> dict[str, Any]:
    """Replace, delete or add a value somewhere in a deep copy of ``base``."""
    doc: dict[str, Any] = _copy(base)
    for _ in range(rng.randint(1, 4)):
        target = rng.choice(_containers(doc, []))
        if isinstance(target, list):
            if target and rng.random() < 0.7:
                target[rng.randrange(len(target))] = toml_value(rng)
            else:
                target.append(toml_value(rng))
        elif target and rng.random() < 0.7:
            key = rng.choice(list(target))
            if rng.random() < 0.2:
                del target[key]
            else:
                target[key] = toml_value(rng)
        else:
            target[rng.choice(keys + WORDS)] = toml_value(rng)
    return doc


def _config_bases() -> list[dict[str, Any]]:
    full: dict[str, Any] = {}
    for dotted, value, _ in effective_items(load_config(None, env={"SLURMHEALTH_CONFIG": ""})):
        section, key = dotted.split(".", 1)
        full.setdefault(section, {})[key] = value
    full.pop("checks", None)
    checks = {"disabled": ["xid"], "thermal_margin": {"warn_celsius": 3}}
    return [full, {"gpu": {"backend": "sim"}}, {"checks": checks}, {}]


def test_config_loader_fuzz(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(11)
    bases = _config_bases()
    keys = sorted(
        {k for b in bases for table in b.values() if isinstance(table, dict) for k in table}
    )
    doc: dict[str, Any] = {}
    monkeypatch.setattr(config, "read_toml", lambda path: doc)
    outcomes = {"loaded": 0, "ConfigError": 0}
    for _ in range(N):
        doc = mutate(rng.choice(bases), rng, keys)
        env = {"SLURMHEALTH_CONFIG": "fuzz.toml"}
        if rng.random() < 0.2:
            env[rng.choice(list(ENV_KEYS))] = rng.choice(ENV_TEXT)
        try:
            cfg = load_config(None, env=env)
        except ConfigError as exc:
            outcomes["ConfigError"] += 1
            assert "\n" not in str(exc), "an error of more than one line"
            continue
        outcomes["loaded"] += 1
        effective_items(cfg)  # `config show` copes with whatever loaded
        assert 0 < cfg.policy.drain_max_share <= 1
        assert 0 <= cfg.metrics.port <= 65535
        assert cfg.sidecar.interval_s >= 1
    assert min(outcomes.values()) > N // 20, outcomes  # both ways were exercised


def test_config_text_fuzz(tmp_path: Path) -> None:
    """Mangled TOML text through the real file reader (fewer: writing files is slower)."""
    rng = random.Random(12)
    text = (REPO / "deploy" / "slurm" / "README.md").read_text()
    sample = text[text.index("```toml") + 8 : text.index("```", text.index("```toml") + 8)]
    path = tmp_path / "config.toml"
    path.write_text(sample)
    assert load_config(str(path), env={}).sources  # the unmangled sample loads and sets keys
    outcomes = {"loaded": 0, "ConfigError": 0}
    for _ in range(1000):
        raw = bytearray(sample.encode())
        for _ in range(rng.randint(1, 5)):
            at = rng.randrange(len(raw))
            raw[at : at + rng.randint(0, 3)] = rng.choice([b"", b"[", b"=", b'"', b"\n", b"-1"])
        path.write_bytes(bytes(raw))
        try:
            cfg = load_config(str(path), env={})
        except ConfigError as exc:
            outcomes["ConfigError"] += 1
            assert "\n" not in str(exc) and str(path) in str(exc), str(exc)
            continue
        outcomes["loaded"] += 1
        assert cfg.sources, "a mangled file that loads still sets what it kept"
    assert min(outcomes.values()) > 50, outcomes  # both ways were exercised


def _scenario_bases() -> list[dict[str, Any]]:
    return [tomllib.loads(p.read_text()) for p in sorted((REPO / "scenarios").glob("*.toml"))]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("all_gpus = 1\n", "all_gpus"),
        ("gpus = 2\n[gpu]\n0 = 5\n", "gpu.0"),
        ("gpus = 1\n[gpu.0]\nclock_event_reasons = [[1]]\n", "gpu.0.clock_event_reasons"),
        ("[[faults]]\nset = 3\n", "faults[0].set"),
        ('[[faults]]\nrate = "x"\n', "faults[0].rate"),
        ("[[faults]]\nat = 1e999\nxid = 79\n", "faults[0].at"),
    ],
)
def test_scenario_shapes_found_by_fuzzing(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "scenario.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as err:
        scenario.load_scenario(str(path))
    assert (err.value.source, err.value.key) == (str(path), key)
    assert str(err.value).startswith(f"scenario {path}: {key}: ")


def test_scenario_loader_fuzz(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(13)
    bases = _scenario_bases()
    keys = sorted({k for b in bases for c in _containers(b, []) if isinstance(c, dict) for k in c})
    path = tmp_path / "scenario.toml"
    path.write_text("")
    doc: dict[str, Any] = {}
    fake = types.SimpleNamespace(load=lambda fh: doc, TOMLDecodeError=tomllib.TOMLDecodeError)
    monkeypatch.setattr(scenario, "tomllib", fake)
    outcomes = {"loaded": 0, "ScenarioError": 0}
    crashes: dict[str, str] = {}
    for _ in range(N):
        doc = mutate(rng.choice(bases), rng, keys)
        try:
            scenario.load_scenario(str(path))
            outcomes["loaded"] += 1
        except ScenarioError:
            outcomes["ScenarioError"] += 1
        except Exception as exc:  # collected, so one run lists every kind of crash
            crashes.setdefault(f"{type(exc).__name__}: {exc}"[:120], repr(doc)[:400])
    assert crashes == {}
    assert min(outcomes.values()) > N // 10, outcomes
