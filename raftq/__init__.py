"""raftq: a Raft-replicated durable queue cluster.

One installed package. The repository keeps each floor of the house at its
top (``api/``, ``engine/``, ``statemachine/``, ``wire_format/``: docs/architecture.md),
and a wheel installs them under this package (pyproject.toml's package-dir);
in a checkout they are found beside this folder, so ``raftq.engine`` is the
same code in both. A checkout is told from an installed copy by the project
file beside it, which no site-packages holds.
"""

from pathlib import Path as _Path

_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "statemachine" / "__init__.py").is_file():
    __path__.append(str(_checkout))
