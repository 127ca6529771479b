"""The cloud-heavy baseline's parties compiled with the medium (sim/studies/cloud.py's
`_Compiled`, sim/radio/air.py's `gather_kernel`): the same run as the Python parties, to
the bit (figures, each party's radio and CPU seconds in the same order, the trace), on
every medium and variant, with pieces, some senders, dead cells and cramped regions; and
no Python call per hop."""

from __future__ import annotations

import pytest

from meshdl.config import ModelConfig
from meshdl.protocol.messages import HEADER_BYTES
from meshdl.protocol.spec import MeshSpec
from meshdl.sim.radio.air import AirQueue
from meshdl.sim.radio.device import device
from meshdl.sim.radio.profiles import profile
from meshdl.sim.studies import cloud

NODE = device("cortex-m4")
EDGE_DEVICE = device("pi4")
LIMIT = 1200  # bytes: the default model's PARAMS still fit; 300 values a cell do not
MEDIA = [("aggregated", "shared", "802.15.4"), ("unaggregated", "shared", "802.15.4"),
         ("unaggregated", "shared", "ble"), ("aggregated", "shared", "lora-sf7"),
         ("unaggregated", "star", "wifi"), ("aggregated", "star", "802.15.4")]


def _spec(rows: int, cols: int, **kwargs) -> MeshSpec:
    kernel = 3 if min(rows, cols) >= 3 else 1
    return MeshSpec(1, ModelConfig(rows=rows, cols=cols, kernel=kernel), **kwargs)


def _ship(spec: MeshSpec, variant: cloud.Variant, medium: str, radio: str, parties: str,
          compiled: bool = True, **kwargs) -> cloud.Shipped:
    return cloud.ship_readings(spec, profile(radio), medium, NODE, EDGE_DEVICE,
                               kwargs.pop("samples", 1), variant, kwargs.pop("seed", 3),
                               traced=True, compiled=compiled, parties=parties, **kwargs)


def _everything(shipped: cloud.Shipped) -> tuple:
    """The record, and the order of each per-party dict (== on dicts ignores it)."""
    return (shipped, list(shipped.times.tx.items()), list(shipped.times.rx.items()),
            list(shipped.cpu_s.items()))


@pytest.mark.parametrize(("variant", "medium", "radio"), MEDIA)
@pytest.mark.parametrize(("rows", "cols", "edge_at"), [(1, 1, (0, 0)), (1, 2, (0, 1)),
                                                       (4, 5, (0, 0)), (6, 7, (5, 3))])
def test_compiled_parties_ship_exactly_as_the_python_ones(variant, medium, radio, rows,
                                                          cols, edge_at) -> None:
    spec = _spec(rows, cols, edge_at=edge_at)
    senders = frozenset(cell for cell in spec.topology.cells() if sum(cell) % 3 != 1)
    for chosen in (None, senders, frozenset()):
        compiled = _ship(spec, variant, medium, radio, "compiled", senders=chosen)
        python = _ship(spec, variant, medium, radio, "python", senders=chosen)
        pure = _ship(spec, variant, medium, radio, "python", compiled=False, senders=chosen)
        assert _everything(compiled) == _everything(python) == _everything(pure)


@pytest.mark.parametrize(("variant", "medium", "radio"), MEDIA)
def test_compiled_parties_cut_pieces_and_gather_them_as_the_python_ones(variant, medium,
                                                                        radio) -> None:
    spec = _spec(4, 4, max_message_bytes=LIMIT)
    for chosen in (None, frozenset({(3, 3), (0, 2), (2, 1)})):
        compiled = _ship(spec, variant, medium, radio, "compiled", samples=300,
                         senders=chosen, header_bytes=HEADER_BYTES)
        python = _ship(spec, variant, medium, radio, "python", samples=300,
                       senders=chosen, header_bytes=HEADER_BYTES)
        assert max(sent.size for sent in compiled.trace) >= LIMIT  # cut into pieces
        assert _everything(compiled) == _everything(python)


def test_compiled_parties_go_around_dead_cells_as_the_python_ones() -> None:
    spec = _spec(5, 6, dead=frozenset({(1, 1), (2, 3), (4, 0)}))
    for variant in ("aggregated", "unaggregated"):
        compiled = _ship(spec, variant, "shared", "802.15.4", "compiled")
        python = _ship(spec, variant, "shared", "802.15.4", "python")
        assert _everything(compiled) == _everything(python)


def test_compiled_parties_in_cramped_regions_run_as_in_roomy_ones(monkeypatch) -> None:
    spec = _spec(6, 6)
    roomy = [_ship(spec, v, "shared", "802.15.4", "compiled", samples=40)
             for v in ("aggregated", "unaggregated")]

    class Cramped(AirQueue):
        def __init__(self) -> None:
            super().__init__(room=1, draws=2)

    monkeypatch.setattr(cloud, "AirQueue", Cramped)
    cramped = [_ship(spec, v, "shared", "802.15.4", "compiled", samples=40)
               for v in ("aggregated", "unaggregated")]
    assert [_everything(s) for s in cramped] == [_everything(s) for s in roomy]


def test_the_cloud_baseline_runs_no_python_per_hop(monkeypatch) -> None:
    """inference_slot's parties are compiled: no hop reaches `_Shipping._arrive`."""
    hops = []
    arrive = cloud._Shipping._arrive

    def counting(self, party, piece):
        hops.append(party)
        arrive(self, party, piece)

    monkeypatch.setattr(cloud._Shipping, "_arrive", counting)
    spec = _spec(4, 5)
    slot = cloud.inference_slot(spec, profile("802.15.4"), "shared", NODE, EDGE_DEVICE, 1,
                                "unaggregated")
    assert slot["transmissions"] > 20 and hops == []
    _ship(spec, "unaggregated", "shared", "802.15.4", "python")
    assert len(hops) == slot["transmissions"]  # the Python parties do take each hop
