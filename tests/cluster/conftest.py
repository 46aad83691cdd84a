from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.sim import SimNetwork
from tests.cluster.test_simulation import form_cluster


@pytest.fixture
def make_cluster():
    """Form simulated clusters; their shared-memory stores are closed after the test."""
    nets: list[SimNetwork] = []

    def make(**options: Any) -> SimNetwork:
        net = form_cluster(**options)
        nets.append(net)
        return net

    yield make
    for net in nets:
        net.close()
