"""entrokvd's start-up line, read by whoever starts a daemon (a worker's tests, the evaluation
tools, the repository's own tests).

Once it serves, the daemon prints one line on stdout and flushes it (service/server.h,
`Server::ListeningLine`):

    entrokvd listening on HOST:PORT metrics on HOST:PORT      (or: ... metrics off)
"""
from __future__ import annotations

import dataclasses
import re
from typing import Optional

_LINE = re.compile(r"^entrokvd listening on (\S+) metrics (?:on (\S+)|off)\n", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class DaemonAddresses:
    address: str  # HOST:PORT of the gRPC service
    metrics: Optional[str]  # HOST:PORT of /metrics, None when metrics are off


def parse_listening_line(output: str) -> Optional[DaemonAddresses]:
    """The addresses of the first complete start-up line (newline included) in `output`, what
    the daemon printed so far; None while there is none."""
    match = _LINE.search(output)
    if match is None:
        return None
    return DaemonAddresses(address=match.group(1), metrics=match.group(2))
