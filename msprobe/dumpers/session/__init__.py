"""The framework-neutral dump session (see ``_session.py`` for what each module owns)."""
from msprobe.dumpers.session._documents import PendingStats, StackTable, StatsFetchError
from msprobe.dumpers.session._failures import StorageFailureWarning
from msprobe.dumpers.session._journal import JOURNAL_RESERVE
from msprobe.dumpers.session._session import DumpSession

__all__ = ["DumpSession", "JOURNAL_RESERVE", "PendingStats", "StackTable", "StatsFetchError", "StorageFailureWarning"]
