"""The docs' shell blocks that tests run as they stand: a fenced ```bash block right after the
mark `<!-- TEST runs the next block verbatim -->` (or `...verbatim: LABEL -->` where a page has
several), run by bash in the shell `eval "$(chexflow cluster env)"` gives."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from chexflow.envs import REPO_ROOT


def marked_block(page: str, test: str, label: str = "") -> str:
    """The block after `test`'s mark (with `label`) in docs/PAGE; the mark must be there once."""
    mark = f"<!-- {test} runs the next block verbatim{': ' + label if label else ''} -->"
    text = (REPO_ROOT / "docs" / page).read_text()
    assert text.count(mark) == 1, f"docs/{page}: expected one {mark}"
    match = re.match(r"\s*```bash\n(.*?)\n```", text.split(mark)[1], re.S)
    assert match, f"docs/{page}: no ```bash block after {mark}"
    return match.group(1)


def cluster_shell(cluster, namespace: str, **env: str) -> dict[str, str]:
    """The environment of a shell after `eval "$(chexflow cluster env)"` (KUBECONFIG, the
    cluster's kubectl first on PATH) with the project's `chexflow` on PATH, NS and `env` set."""
    path = f"{cluster.path_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    return {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "NS": namespace, "PATH": path,
            **env}
