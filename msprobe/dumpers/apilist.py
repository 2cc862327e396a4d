"""The editable API lists (``support_wrap_ops.yaml``) shared by the framework dumpers."""
from __future__ import annotations

__all__ = ["load_api_list"]


def load_api_list(path: str) -> dict:
    """Parse the YAML subset we ship (``key:`` then ``  - name`` lines); no PyYAML needed."""
    out: dict = {}
    key = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            s = line.split("#", 1)[0].rstrip()
            if not s:
                continue
            if not s.startswith(" ") and s.endswith(":") or s.endswith(": []"):
                key = s.split(":", 1)[0].strip()
                out[key] = []
            elif s.lstrip().startswith("- ") and key is not None:
                out[key].append(s.lstrip()[2:].strip())
    return out
