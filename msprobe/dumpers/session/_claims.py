"""A dump session's claim on its rank directories (``run_dir_policy``), and the steps an
earlier run left in ``dump_path`` for the same rank directory."""
from __future__ import annotations

import logging
import warnings
from typing import Callable, Optional

from msprobe.backends import claim_run_dir
from msprobe.dumpers.config import DumpConfig
from msprobe.dumpers.session._failures import FailureLog
from msprobe.dumpers.session._storage import SessionStorage
from msprobe.errors import StoragePermissionError
from msprobe.format.layout import STEP_DIR_RE, step_ranges

__all__ = ["RunDirClaims"]

log = logging.getLogger("msprobe.dump")


class RunDirClaims:
    """The steps this run claimed and wrote, and those an earlier run had written."""

    def __init__(self, config: DumpConfig, storage: SessionStorage, failures: FailureLog) -> None:
        self.config = config
        self.storage = storage
        self.failures = failures
        self._claimed: Optional[int] = None
        self._earlier_steps: Optional[set] = None  # steps of this rank dir in dump_path before the run (claim())
        self.steps_written: set = set()

    def claim(self, step: int, rank: Callable[[], Optional[int]], rank_dir: Callable[[], str]) -> None:
        """Before writing step ``step``: with ``run_dir_policy: "refuse"``, a rank directory that
        already holds another run's dump is an error instead of being overwritten (msprobe
        overwrites).

        The directory is claimed atomically: by the exclusive creation of its claim marker
        (``O_EXCL``/``link`` locally, a conditional put ``If-None-Match: *`` on object stores),
        so of several runs starting together exactly one gets it.

        At the run's first claim, the steps that ``dump_path`` already holds for this rank
        directory are noted (``"clear"``: removed); at the end those this run did not write are
        named in one warning (readers would mix them with this run). ``rank`` and ``rank_dir``
        are asked only when the directory is claimed (the rank is resolved no earlier)."""
        if self._claimed == step or getattr(self.config, "online", None) is not None:
            return  # (online_run_ut sends packets: dump_path, and its storage_options, are not written)
        if self._earlier_steps is None:
            self._earlier_steps = self._steps_held(rank_dir())
            if self.config.run_dir_policy == "clear" and self._earlier_steps:
                self._clear_steps(self._earlier_steps, rank_dir())
                self._earlier_steps = set()
        if self.config.run_dir_policy != "refuse":
            self.steps_written.add(step)
            self._claimed = step
            return

        prefix = f"step{step}/{rank_dir()}"
        store = self.storage.store
        try:
            claim_run_dir(store, prefix, "refuse", retry_policy=self.storage.policy(),
                          info={"step": step, "rank": rank()})
        except StoragePermissionError as exc:
            if "already holds another run" not in str(exc):
                raise
            raise StoragePermissionError(
                f"{store.url.rstrip('/')}/{prefix} already holds a dump of another run; "
                "choose another dump_path or set run_dir_policy to 'overwrite' (or 'clear')") from None
        self.steps_written.add(step)
        self._claimed = step

    def _steps_held(self, rank_dir: str) -> set:
        """The steps of ``dump_path`` that hold this process's rank directory (an earlier run's)."""
        store = self.storage.store
        try:
            steps = [int(match.group("step")) for match in map(STEP_DIR_RE.match,
                                                                (name.rstrip("/") for name in store.list_dir("")))
                     if match]
            return {step for step in steps
                    if rank_dir in {name.rstrip("/") for name in store.list_dir(f"step{step}")}}
        except Exception as exc:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
            self.failures.note("listing", exc)
            return set()

    def _clear_steps(self, steps: set, rank_dir: str) -> None:
        """``run_dir_policy: "clear"``: remove this rank directory from each step of ``steps``."""
        store = self.storage.store
        for step in sorted(steps):
            prefix = f"step{step}/{rank_dir}"
            try:
                store.delete_prefix(prefix)  # a file system: the step's folder too, when no other rank is in it
            except Exception as exc:  # noqa: BLE001 - never crash training for the dump: the failure is counted and logged
                self.failures.note("clearing", exc, key=prefix)
        log.info("msprobe: run_dir_policy 'clear': removed %s of step(s) %s of an earlier run from %s",
                 rank_dir, step_ranges(sorted(steps)), store.url)

    def stale_steps(self) -> list:
        """The steps ``dump_path`` held for this rank directory before this run and that this run
        has not written (an earlier, longer run's): readers mix them with this run's."""
        return sorted((self._earlier_steps or set()) - self.steps_written)

    def warn_stale_steps(self, rank_dir: Callable[[], str]) -> None:
        stale = self.stale_steps()
        if not stale or not self.steps_written:  # (a run that wrote nothing mixes nothing)
            return
        warnings.warn(
            f"msprobe: {self.storage.store.url.rstrip('/')} still holds step(s) {step_ranges(stale)} of an earlier "
            f"run in {rank_dir()}/ beside this run's step(s) {step_ranges(sorted(self.steps_written))}: readers mix the "
            f"two runs; remove them, or dump with run_dir_policy 'clear' (removes them at start) or 'refuse'",
            RuntimeWarning, stacklevel=2)
