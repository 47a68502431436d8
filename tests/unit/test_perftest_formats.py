"""perftest output in every form the tool prints: each tool's banner, the three units, the
latency tables, ``--output`` one-number runs, ``-a`` sweeps, bidirectional runs,
``--run_infinitely`` intervals and several runs in one file. Runs are printed with
perftest's own formats (:mod:`tests.unit.perftest_printf`); the real outputs quoted in
public perftest issues are in ``tests/data/perftest`` (see its SOURCES)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmhealth.baseline.model import BaselineParseError
from slurmhealth.baseline.parsers import parse
from slurmhealth.cli.baseline import baseline
from slurmhealth.cli.options import Ctx
from tests.unit import perftest_printf as pf

DATA = Path(__file__).resolve().parents[1] / "data" / "perftest"
ROWS = [(65536, 5000, 49.21e9, 49.01e9, 0.747875), (8388608, 5000, 49.44e9, 49.43e9, 0.0059)]


def got(text: str, **kw: str) -> dict[str, float]:
    return {m.metric: m.value for m in parse("perftest", text, **kw).measurements}


@pytest.mark.parametrize(
    ("verb", "kw", "tool"),
    [
        ("write", {}, "ib_write_bw"),
        ("read", {}, "ib_read_bw"),
        ("send", {}, "ib_send_bw"),
        ("atomic", {"atomic": "FETCH_AND_ADD"}, "ib_atomic_bw"),
        ("atomic", {"atomic": "CMP_AND_SWAP"}, "ib_atomic_bw"),
        ("send", {"connection": "RawEth"}, "raw_ethernet_bw"),
        ("write", {"bidir": True}, "ib_write_bw_bidir"),
        ("send", {"bidir": True}, "ib_send_bw_bidir"),
    ],
)
def test_every_bandwidth_tool_is_named_from_its_banner(
    verb: str, kw: dict[str, object], tool: str
) -> None:
    values = got(pf.bw_run(verb, ROWS, "MiB/sec", **kw))
    assert set(values) == {
        f"{tool}.bw_avg",
        f"{tool}.bw_peak",
        f"{tool}.bw_avg@65536",
        f"{tool}.bw_avg@8388608",
    }
    assert values[f"{tool}.bw_avg"] == round(49.43e9 * 8 / 1e9, 2)


def test_one_run_printed_in_mib_mb_and_gbits_stores_identical_gbps(tmp_path: Path) -> None:
    """The acceptance line: the same rates printed three ways, ingested by the real CLI,
    read back from the history: the same Gb/s, each row keeping what was printed."""
    rates = [
        (2, 1000, 10.9e6, 10.6e6, 5.3),
        (65536, 5000, 49.21e9, 49.01e9, 0.74),
        (8388608, 5000, 49.44e9, 49.43e9, 0.0059),
        (8, 224958464, 0.0, 0.06e9, 7.49),
    ]
    config = tmp_path / "c.toml"
    config.write_text(f'[paths]\ndb = "{tmp_path / "{node}.db"}"\n')
    stored: dict[str, dict[str, float]] = {}
    printed: dict[str, set[str]] = {}
    for unit in ("MiB/sec", "MB/sec", "Gb/sec"):
        out = tmp_path / f"run-{unit.replace('/', '_')}.txt"
        out.write_text(pf.bw_run("write", rates, unit))
        obj = Ctx(str(config), None, False)
        res = CliRunner().invoke(
            baseline, ["ingest", "perftest", str(out), "--node", f"n-{unit[:3]}", "--json"], obj=obj
        )
        assert res.exit_code == 0, res.output
        show = CliRunner().invoke(baseline, ["show", "--node", f"n-{unit[:3]}", "--json"], obj=obj)
        rows = _rows(json.loads(show.output))
        stored[unit] = {r["metric"]: r["value"] for r in rows}
        printed[unit] = {str(r["printed"]) for r in rows}
        assert {r["unit"] for r in rows} == {"Gb/s"}
    assert stored["MiB/sec"] == stored["MB/sec"] == stored["Gb/sec"]
    assert stored["Gb/sec"]["ib_write_bw.bw_avg@8"] == 0.48  # 6 decimals printed below 0.1
    assert all(p.endswith(" MiB/sec") for p in printed["MiB/sec"])
    assert all(p.endswith(" Gb/sec") for p in printed["Gb/sec"])


def _rows(data: object) -> list[dict[str, object]]:
    if isinstance(data, dict):
        for key in ("rows", "baselines"):
            if isinstance(data.get(key), list):
                return list(data[key])
    assert isinstance(data, list), data
    return list(data)


@pytest.mark.parametrize("unit", ["MiB/sec", "MB/sec", "Gb/sec"])
def test_per_port_qos_and_cpu_util_layouts_in_each_unit(unit: str) -> None:
    head = pf.banner("write")
    f = pf.FACTOR[unit]
    port = pf.cprintf(
        pf.REPORT_FMT_PER_PORT,
        65536,
        5000,
        49.2e9 / f,
        49.0e9 / f,
        0.74,
        24.5e9 / f,
        0.37,
        24.5e9 / f,
        0.37,
    )
    per_port = "\n".join([head, pf.RESULT_FMT_PER_PORT.format(u=unit), port])
    qos = "\n".join(
        [
            head,
            pf.RESULT_FMT_QOS.format(u=unit),
            pf.cprintf(pf.REPORT_FMT_QOS, 65536, 3, 5000, 49.2e9 / f, 49.0e9 / f, 0.74),
        ]
    )
    cpu = "\n".join(
        [
            head,
            pf.RESULT_FMT.format(u=unit) + pf.RESULT_EXT_CPU_UTIL,
            pf.bw_row(65536, 5000, 49.2e9, 49.0e9, 0.74, unit)
            + pf.cprintf(pf.REPORT_EXT_CPU_UTIL, 12.5),
        ]
    )
    for text in (per_port, qos, cpu):
        assert got(text)["ib_write_bw.bw_avg"] == 392.0, text


@pytest.mark.parametrize(
    ("verb", "kw", "tool"),
    [
        ("write", {}, "ib_write_lat"),
        ("read", {}, "ib_read_lat"),
        ("send", {}, "ib_send_lat"),
        ("atomic", {"atomic": "FETCH_AND_ADD"}, "ib_atomic_lat"),
        ("send", {"connection": "RawEth"}, "raw_ethernet_lat"),
    ],
)
def test_every_latency_tool_and_its_percentiles(
    verb: str, kw: dict[str, object], tool: str
) -> None:
    rows = [
        pf.cprintf(pf.REPORT_FMT_LAT, 2, 1000, 1.02, 5.61, 1.08, 1.10, 0.05, 1.31, 5.61),
        pf.cprintf(pf.REPORT_FMT_LAT, 4096, 1000, 2.11, 7.02, 2.19, 2.21, 0.08, 2.52, 7.02),
    ]
    text = "\n".join([pf.banner(verb, "Latency", **kw), pf.RESULT_FMT_LAT, *rows, pf.RESULT_LINE])
    r = parse("perftest", text)
    values = {m.metric: m.value for m in r.measurements}
    assert values == {
        f"{tool}.lat_typical_us": 1.08,
        f"{tool}.lat_avg_us": 1.10,
        f"{tool}.lat_p99_us": 1.31,
        f"{tool}.lat_p99_9_us": 5.61,
        f"{tool}.lat_typical_us@2": 1.08,
        f"{tool}.lat_typical_us@4096": 2.19,
    }
    assert all(not m.higher_is_better and m.unit == "us" for m in r.measurements)


def test_old_and_duration_latency_tables() -> None:
    old = "\n".join(
        [
            pf.banner("send", "Latency"),
            pf.RESULT_FMT_LAT_OLD,
            " 2       1000          0.95           4.80         1.01   ",
        ]
    )
    assert got(old) == {"ib_send_lat.lat_typical_us": 1.01, "ib_send_lat.lat_typical_us@2": 1.01}
    dur = "\n".join(
        [
            pf.banner("write", "Latency"),
            pf.RESULT_FMT_LAT_DUR,
            pf.cprintf(pf.REPORT_FMT_LAT_DUR, 2, 4801020, 1.04, 480102.00),
        ]
    )
    assert got(dur) == {"ib_write_lat.lat_avg_us": 1.04, "ib_write_lat.lat_avg_us@2": 1.04}


def test_lower_latency_is_better_in_the_comparison() -> None:
    from slurmhealth.baseline.store import higher_is_better

    assert not higher_is_better("ib_send_lat.lat_typical_us@2")
    assert not higher_is_better("ib_send_lat.lat_p99_us")
    assert higher_is_better("ib_write_bw.bw_avg@65536")


@pytest.mark.parametrize(
    ("output", "number", "unit", "metric", "value"),
    [
        ("bandwidth", 46742.180000, "MiB/sec", "ib_write_bw.bw_avg", 392.1),
        ("bandwidth", 392.100000, "Gb/sec", "ib_write_bw.bw_avg", 392.1),
        ("message_rate", 0.747875, None, "ib_write_bw.msg_rate", 0.747875),
        ("latency", 1.104000, None, "ib_write_bw.lat_avg_us", 1.1),
    ],
)
def test_output_one_number_forms(
    output: str, number: float, unit: str | None, metric: str, value: float
) -> None:
    text = pf.cprintf("%lf", number) + "\n"
    kw = {"test": "ib_write_bw", "output": output} | ({"unit": unit} if unit else {})
    assert got(text, **kw) == {metric: value}


def test_one_number_without_the_hints_is_a_one_line_error() -> None:
    with pytest.raises(BaselineParseError, match="--output") as exc:
        parse("perftest", "46742.180000\n")
    assert "\n" not in str(exc.value)
    with pytest.raises(BaselineParseError, match="name the test"):
        parse("perftest", "46742.180000\n", output="bandwidth")


def test_run_infinitely_intervals_are_averaged_and_a_cut_row_is_a_problem() -> None:
    rows = [pf.bw_row(65536, 5000, 0, bps, 0.74, "MiB/sec") for bps in (48e9, 49e9, 50e9)]
    cut = pf.bw_row(65536, 5000, 0, 50e9, 0.74, "MiB/sec").split()[:3]
    text = "\n".join(
        [
            pf.banner("write"),
            pf.RESULT_FMT.format(u="MiB/sec"),
            *rows,
            " ".join(cut),
            "",
            " User stopped traffic",
        ]
    )
    r = parse("perftest", text)
    assert {m.metric: m.value for m in r.measurements}["ib_write_bw.bw_avg"] == 392.0
    assert r.meta["intervals"] == 3 and any("3 of 5 values" in p for p in r.problems)


def test_a_script_running_two_tools_and_two_units_reads_each_table_on_its_own() -> None:
    text = pf.bw_run("write", ROWS, "Gb/sec") + pf.bw_run("read", ROWS[:1], "MiB/sec")
    values = got(text)
    assert values["ib_write_bw.bw_avg"] == round(49.43e9 * 8 / 1e9, 2)
    assert values["ib_read_bw.bw_avg"] == round(49.01e9 * 8 / 1e9, 2)


@pytest.mark.parametrize(
    "header",
    [
        " #bytes     #iterations    BW peak[GB/sec]    BW average[GB/sec]   MsgRate[Mpps]",
        " #bytes     #iterations    BW peak[MiB/sec]    BW average[Gb/sec]   MsgRate[Mpps]",
        " #bytes     #iterations    BW peak[MiB/sec]    Bandwidth[MiB/sec]",
    ],
)
def test_an_unknown_header_is_a_one_line_error_quoting_it(header: str) -> None:
    with pytest.raises(BaselineParseError, match="unreadable result table header") as exc:
        parse("perftest", pf.banner("write") + "\n" + header + "\n 65536 5000 1.0 1.0 0.1\n")
    assert "\n" not in str(exc.value) and "#bytes" in str(exc.value)


def test_real_outputs_from_public_perftest_issues() -> None:
    # linux-rdma/perftest#273: ib_write_bw --report_gbits, post list, RoCE, 8-byte messages
    r = parse("perftest", (DATA / "issue273_write_postlist_gbits.txt").read_text())
    assert {m.metric: m.value for m in r.measurements} == {
        "ib_write_bw.bw_avg": 0.48,
        "ib_write_bw.bw_avg@8": 0.48,
    }
    assert r.meta["link_type"] == "Ethernet" and r.meta["unit_printed"] == "Gb/sec"
    # linux-rdma/perftest#65: two ib_send_bw tables (MB/sec) without their banners
    for name, mb in (
        ("issue65_send_bw_mb_case1.txt", 5544.28),
        ("issue65_send_bw_mb_case2.txt", 920.13),
    ):
        values = got((DATA / name).read_text(), test="ib_send_bw")
        assert values["ib_send_bw.bw_avg"] == round(mb * 1048576 * 8 / 1e9, 2)


def test_ingest_of_a_latency_run_and_an_output_bandwidth_run_through_the_cli(
    tmp_path: Path,
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'[paths]\ndb = "{tmp_path / "{node}.db"}"\n')
    obj = Ctx(str(config), None, False)
    lat = tmp_path / "lat.txt"
    row = pf.cprintf(pf.REPORT_FMT_LAT, 2, 1000, 1.02, 5.61, 1.08, 1.10, 0.05, 1.31, 5.61)
    lat.write_text("\n".join([pf.banner("send", "Latency"), pf.RESULT_FMT_LAT, row]) + "\n")
    res = CliRunner().invoke(baseline, ["ingest", "perftest", str(lat), "--node", "n1"], obj=obj)
    assert res.exit_code == 0, res.output
    assert "ib_send_lat.lat_typical_us = 1.08 us (printed 1.08 usec)" in res.output
    one = tmp_path / "bw.txt"
    one.write_text(pf.cprintf("%lf", 392.11) + "\n")
    args = ["ingest", "perftest", str(one), "--node", "n1", "--test", "ib_write_bw",
            "--perftest-output", "bandwidth", "--perftest-unit", "Gb/sec"]  # fmt: skip
    res = CliRunner().invoke(baseline, args, obj=obj)
    assert res.exit_code == 0, res.output
    assert "ib_write_bw.bw_avg = 392.11 Gb/s (printed 392.110000 Gb/sec)" in res.output
    res = CliRunner().invoke(baseline, args[:5], obj=obj)  # the number alone: refused
    assert isinstance(res.exception, BaselineParseError), res.output  # main: exit 2, one line
    said = str(res.exception)
    assert "one number per line ('392.110000')" in said and "--perftest-output" in said, said
