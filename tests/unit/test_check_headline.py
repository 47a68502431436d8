"""The check's headline names what failed and counts the rest: GPU 3's NVLink alone once
read "FAIL on GPU(s) 0, 1, 2, 3, 4, 5, 6, 7"."""

from __future__ import annotations

from typing import Any

from slurmhealth.cli.render import check_headline


def result(status: str, *findings: tuple[int | None, str, str], gpus: int = 8) -> dict[str, Any]:
    return {
        "status": status,
        "gpus": [{"index": i} for i in range(gpus)],
        "findings": [{"gpu": g, "severity": sev, "message": msg} for g, sev, msg in findings],
    }


def test_one_failing_gpu_is_named_alone() -> None:
    text = check_headline(result("fail", (3, "fail", "NVLink 7 inactive")))
    assert text == "on GPU 3 (NVLink 7 inactive); 7 other GPUs passed"


def test_failures_first_then_warnings_counted_and_node_level_by_message() -> None:
    data = result("fail", (5, "critical", "GPU lost"), (3, "fail", "NVLink 7 inactive"),
                  (3, "fail", "NVLink 9 inactive"), (None, "fail", "mlx5_0 port 1 down"),
                  (1, "warn", "thermal margin 4 C"))  # fmt: skip
    assert check_headline(data) == (
        "on GPU 3 (NVLink 7 inactive, +1 more), GPU 5 (GPU lost), mlx5_0 port 1 down; "
        "1 warning; 5 other GPUs passed"
    )


def test_many_failing_gpus_are_cut_and_warnings_alone_named() -> None:
    many = result("fail", *((g, "fail", "row remap pending") for g in range(8)))
    assert check_headline(many) == "on GPU 0 (row remap pending), GPU 1 (row remap pending), " \
        "GPU 2 (row remap pending) and 5 more"  # fmt: skip
    warned = result("warn", (2, "warn", "thermal margin 4 C"))
    assert check_headline(warned) == "on GPU 2 (thermal margin 4 C); 7 other GPUs passed"
    assert check_headline(result("ok")) == "on 8 GPUs, all passed"
    assert check_headline(result("ok", gpus=1)) == "on 1 GPU, all passed"
