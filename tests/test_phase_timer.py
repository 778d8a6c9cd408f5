"""The engine's phase timer: host wall time on a CPU, CUDA events without synchronisation on a GPU (the event logic is
checked here with a fake event; tests/test_gpu_graphs.py checks it with real ones)."""

import time

import pytest
import torch

import specdec.engine as engine_mod
from specdec.engine import PhaseTimer


class FakeEvent:
    """Stands for ``torch.cuda.Event``: ``record`` takes a clock tick; ``done`` says whether it has completed."""

    clock = 0.0
    made: list["FakeEvent"] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.t, self.done, self.waited = None, True, False
        FakeEvent.made.append(self)

    def record(self, stream=None) -> None:
        FakeEvent.clock += 1.0
        self.t = FakeEvent.clock

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited = True

    def elapsed_time(self, end: "FakeEvent") -> float:  # milliseconds
        return (end.t - self.t) * 1000.0


@pytest.fixture
def fake_events(monkeypatch):
    FakeEvent.clock, FakeEvent.made = 0.0, []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(PhaseTimer, "_spare", {})
    t = PhaseTimer(torch.device("cpu"))
    t.events = True  # as on a GPU without sync_timing
    return t


def test_cpu_timer_takes_host_wall_time():
    t = PhaseTimer(torch.device("cpu"))
    assert not t.events and not t.sync
    with t("verify"):
        time.sleep(0.01)
    assert 0.009 <= t.seconds["verify"] < 1.0 and t.seconds["draft"] == 0.0


def test_gpu_timer_defaults_to_events_without_sync(monkeypatch):
    t = PhaseTimer(torch.device("cuda"))
    assert t.events and not t.sync
    t = PhaseTimer(torch.device("cuda"), sync=True)
    assert t.sync and not t.events


def test_events_add_each_phase_between_its_edges(fake_events):
    t = fake_events
    with t("draft"):
        FakeEvent.clock += 3.0  # the phase's GPU time: its end event 4 ticks after its start
    with t("verify"):
        pass
    with t("draft"):
        pass
    assert len(t._pending) == 3  # nothing resolved (no wait) until the seconds are read
    assert t.seconds["draft"] == pytest.approx(4.0 + 1.0) and t.seconds["verify"] == pytest.approx(1.0)
    assert not t._pending and all(e.waited for e in FakeEvent.made[1::2])
    with t("sample"):  # events read are reused: none made
        pass
    assert len(FakeEvent.made) == 6 and t.seconds["sample"] == pytest.approx(1.0)


def test_events_drain_stops_at_the_first_phase_not_completed(fake_events, monkeypatch):
    t = fake_events
    monkeypatch.setattr(PhaseTimer, "MAX_PENDING", 2)
    for _ in range(3):
        with t("verify"):
            pass
    FakeEvent.made[3].done = False  # the second phase's end event has not completed on the device
    with t("draft"):  # > MAX_PENDING waiting: the completed first one is added, no wait
        pass
    assert [p for p, _, _ in t._pending] == ["verify", "verify", "draft"]
    assert t._seconds["verify"] == pytest.approx(1.0) and not any(e.waited for e in FakeEvent.made)
    assert t.seconds["verify"] == pytest.approx(3.0) and t.seconds["draft"] == pytest.approx(1.0)


def test_engine_times_with_events_unless_asked_to_sync(monkeypatch):
    made = []

    class Spy(PhaseTimer):
        def __init__(self, device, sync=False):
            made.append(sync)
            super().__init__(device, sync)

    monkeypatch.setattr(engine_mod, "PhaseTimer", Spy)
    from conftest import make_tiny
    from specdec import PipelineConfig, build_engine

    eng = build_engine(make_tiny("llama"), PipelineConfig.make(method="magicdec", gamma=2, budget=8, sinks=2, recent=4))
    eng.generate([[3, 4, 5, 6, 7, 8, 9, 10]], max_new_tokens=3)
    eng.sync_timing = True
    eng.generate([[3, 4, 5, 6, 7, 8, 9, 10]], max_new_tokens=3)
    assert made == [False, True]


def test_events_go_on_the_models_device_stream(fake_events, monkeypatch):
    """A model on ``cuda:1`` while ``cuda:0`` is current: the events are recorded on cuda:1's current stream and kept
    among cuda:1's spares (kernels run on their tensors' device's stream, whichever device is current)."""
    streams = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: ("stream of", str(device)))
    monkeypatch.setattr(FakeEvent, "record", lambda self, stream=None: streams.append(stream) or setattr(self, "t", 0.0))
    t = PhaseTimer(torch.device("cuda:1"))
    with t("verify"):
        pass
    assert streams == [("stream of", "cuda:1")] * 2
    t.seconds
    assert len(PhaseTimer._spare[1]) == 2 and not PhaseTimer._spare.get(0)
