"""Small named exceptions. The CLI turns them into one line on stderr and an exit code."""

from __future__ import annotations


class SlurmhealthError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 3


class UsageError(SlurmhealthError):
    """Bad input from the operator: flags, config, scenario files. Exit 2."""

    exit_code = 2


class ConfigError(UsageError):
    """A config file or value is wrong. The message names the file and the key."""

    def __init__(self, source: str, key: str | None, problem: str) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {problem}")


class ScenarioError(UsageError):
    """A simulated-GPU scenario file is malformed. The message names the file and the key."""

    def __init__(self, source: str, key: str | None, problem: str) -> None:
        self.source = source
        self.key = key
        where = f"{source}: {key}" if key else source
        super().__init__(f"scenario {where}: {problem}")


class GpuBackendError(SlurmhealthError):
    """NVML could not start (library missing, driver not loaded). Carries a hint."""

    def __init__(self, message: str, hint: str = "") -> None:
        self.hint = hint
        super().__init__(f"{message} ({hint})" if hint else message)


class StoreError(SlurmhealthError):
    """The history database could not be read."""


class PrometheusError(SlurmhealthError):
    """Prometheus could not answer (down, slow, refused the query, or sent no valid JSON).
    The message is one line naming the server; the report shows the source as unavailable."""


class SchemaTooNew(StoreError):
    """The history database was written by a newer slurmhealth (its ``PRAGMA user_version``
    is above every migration this one knows): refused rather than used. Exit 2."""

    exit_code = 2

    def __init__(self, path: str, found: int, known: int) -> None:
        self.path = path
        self.found = found
        self.known = known
        super().__init__(
            f"history {path} has schema version {found}, newer than this slurmhealth knows "
            f"({known}): a newer release wrote it; upgrade slurmhealth again, or restore the "
            f"backup {path}.bak-v{known} that release made (README: Upgrade and rollback)"
        )
