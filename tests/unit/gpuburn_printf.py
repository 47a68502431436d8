"""gpu-burn's progress line, printed the way gpu_burn-drv.cpp (wilicc/gpu-burn, listenClients)
prints it, so tests can render any GPU count and value without tuning text by hand."""

from __future__ import annotations

from collections.abc import Sequence


def progress_line(
    percent: float,
    iters: Sequence[int],
    gflops: Sequence[float],
    errors: Sequence[int],
    temps: Sequence[int],
    sep: str = "- ",
) -> str:
    """``printf("\\r%.1f%%  ", ...)`` and the three per-GPU fields; ``sep`` is ``"/ "``
    before version 0.8. A GPU with ``iters == -1`` is dead; a temperature of 0 prints ``--``."""
    last = len(iters) - 1
    out = f"\r{percent:.1f}%  proc'd: "
    for i, (n, g) in enumerate(zip(iters, gflops, strict=True)):
        out += f"{n} ({g:.0f} Gflop/s) " + (sep if i != last else "")
    out += "  errors: "
    for i, e in enumerate(errors):
        note = "%d "
        if iters[i] == -1:
            note += " (DIED!)"
        elif e:
            note += " (WARNING!)"
        out += note % e + (sep if i != last else "")
    out += "  temps: "
    for i, t in enumerate(temps):
        out += (f"{t} C " if t != 0 else "-- ") + (sep if i != last else "")
    return out


def verdicts(faulty: Sequence[bool]) -> str:
    """The end of a completed run: ``Tested N GPUs:`` and one verdict line per GPU."""
    lines = [
        "",
        "Killing processes with SIGTERM (soft kill)",
        "done",
        "",
        f"Tested {len(faulty)} GPUs:",
    ]
    lines += [f"\tGPU {i}: {'FAULTY' if f else 'OK'}" for i, f in enumerate(faulty)]
    return "\n".join(lines) + "\n"
